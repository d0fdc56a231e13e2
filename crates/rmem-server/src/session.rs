//! Sessions: a client's pages, kept apart from the connections that carry its requests.
//!
//! A session is named by the client (a random 128-bit [`SessionId`]) and lives while its
//! lease is renewed: every request on an attached connection renews it (an idle client pings).
//! A connection that drops leaves the session and its pages in place, so a client that
//! reconnects within the lease finds them; [`Sessions::reap`] frees the pages of a session
//! whose lease ran out (a client killed, or cut off for longer than the lease). Any number of
//! connections may attach one session; an exclusive attach fences the others (their requests
//! are refused from then on), which is how a reconnecting client makes sure that nothing still
//! buffered on its dropped connection lands after what it re-sends.
//!
//! Lock order: the table, then a session. Capacity is one counter for the whole server.

use crate::slab::PageSlots;
use rmem_proto::SessionId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One session's pages and lease.
#[derive(Debug)]
pub struct Pages {
    pub slots: PageSlots,
    pub page_size: usize,
    /// Last renewal of the lease.
    renewed: Instant,
    lease: Duration,
    /// Bumped by an exclusive attach; a connection attached at an older epoch is fenced.
    epoch: u64,
    /// Expired or ended: no longer in the table, holds nothing.
    gone: bool,
    /// Most pages held at once, for the verbose disconnect line.
    pub pages_max: usize,
    connections: usize,
}

#[derive(Debug)]
pub struct Session {
    pub id: SessionId,
    pages: Mutex<Pages>,
}

/// Why a request of an attached connection cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("session {0}'s lease expired or it was ended: its pages are gone")]
    Gone(SessionId),
    #[error("session {0} was attached exclusively by another connection")]
    Fenced(SessionId),
}

/// A connection's hold on a session.
#[derive(Debug)]
pub struct Attachment {
    pub session: Arc<Session>,
    epoch: u64,
}

impl Attachment {
    /// The session's pages, lease renewed, unless it is gone or this connection was fenced.
    pub fn lock(&self) -> Result<MutexGuard<'_, Pages>, Refusal> {
        let mut p = lock(&self.session.pages);
        if p.gone {
            return Err(Refusal::Gone(self.session.id));
        }
        if p.epoch != self.epoch {
            return Err(Refusal::Fenced(self.session.id));
        }
        p.renewed = Instant::now();
        Ok(p)
    }

    /// Detach (the connection closed): the session stays until its lease ends. Returns
    /// (pages held now, most pages held).
    pub fn detach(self) -> (usize, usize) {
        let mut p = lock(&self.session.pages);
        p.connections -= 1;
        (p.slots.len(), p.pages_max)
    }
}

/// What [`Sessions::attach`] found.
pub struct Attached {
    pub attachment: Attachment,
    pub existed: bool,
    pub lease: Duration,
    pub session_bytes: u64,
}

/// A session as `rmem status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: SessionId,
    pub used_bytes: u64,
    /// Time since the lease was last renewed.
    pub lease_age: Duration,
    pub lease: Duration,
    pub connections: usize,
}

/// Every session of a server, and the bytes they hold together.
#[derive(Debug, Default)]
pub struct Sessions {
    table: Mutex<HashMap<SessionId, Arc<Session>>>,
    pub used_bytes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A connection thread that panicked leaves consistent data (every update is one step).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sessions {
    /// Attach to `id`, creating it with `lease` and `page_size` if it does not exist. A
    /// session's page size is fixed at creation.
    pub fn attach(
        &self,
        id: SessionId,
        page_size: usize,
        lease: Duration,
        exclusive: bool,
    ) -> Result<Attached, String> {
        let mut table = lock(&self.table);
        let mut existed = true;
        let session = table
            .entry(id)
            .or_insert_with(|| {
                existed = false;
                Arc::new(Session {
                    id,
                    pages: Mutex::new(Pages {
                        slots: PageSlots::new(page_size),
                        page_size,
                        renewed: Instant::now(),
                        lease,
                        epoch: 0,
                        gone: false,
                        pages_max: 0,
                        connections: 0,
                    }),
                })
            })
            .clone();
        let mut p = lock(&session.pages);
        if p.page_size != page_size {
            return Err(format!(
                "session {id} has pages of {} bytes, this connection {page_size}",
                p.page_size
            ));
        }
        if exclusive {
            p.epoch += 1;
        }
        p.connections += 1;
        p.renewed = Instant::now();
        p.lease = lease;
        let epoch = p.epoch;
        let session_bytes = (p.slots.len() * p.page_size) as u64;
        drop(p);
        Ok(Attached {
            attachment: Attachment { session, epoch },
            existed,
            lease,
            session_bytes,
        })
    }

    /// Free the session's pages now and forget it. Returns the bytes freed.
    pub fn end(&self, a: &Attachment) -> u64 {
        let mut table = lock(&self.table);
        let mut p = lock(&a.session.pages);
        if p.gone {
            return 0;
        }
        table.remove(&a.session.id);
        self.forget(&mut p)
    }

    fn forget(&self, p: &mut Pages) -> u64 {
        let bytes = (p.slots.len() * p.page_size) as u64;
        p.slots = PageSlots::new(p.page_size);
        p.gone = true;
        self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
        bytes
    }

    /// Free every session whose lease ran out at `now`: (id, bytes freed) of each.
    pub fn reap(&self, now: Instant) -> Vec<(SessionId, u64)> {
        let mut table = lock(&self.table);
        let mut reaped = Vec::new();
        table.retain(|id, s| {
            let mut p = lock(&s.pages);
            if now.saturating_duration_since(p.renewed) <= p.lease {
                return true;
            }
            reaped.push((*id, self.forget(&mut p)));
            false
        });
        reaped
    }

    /// Every session, largest first.
    pub fn list(&self, now: Instant) -> Vec<SessionInfo> {
        let table = lock(&self.table);
        let mut v: Vec<SessionInfo> = table
            .values()
            .map(|s| {
                let p = lock(&s.pages);
                SessionInfo {
                    id: s.id,
                    used_bytes: (p.slots.len() * p.page_size) as u64,
                    lease_age: now.saturating_duration_since(p.renewed),
                    lease: p.lease,
                    connections: p.connections,
                }
            })
            .collect();
        v.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.id.cmp(&b.id)));
        v
    }

    /// Reserve capacity for `bytes` more; false (and nothing reserved) past `capacity`.
    pub fn reserve(&self, bytes: u64, capacity: u64) -> bool {
        self.used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u + bytes <= capacity).then_some(u + bytes)
            })
            .is_ok()
    }

    pub fn release(&self, bytes: u64) {
        self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

impl Pages {
    /// Store `data` (whole pages) from `key` on, within `capacity` for the whole server;
    /// false if it would not fit (nothing stored).
    pub fn store(&mut self, sessions: &Sessions, capacity: u64, key: u64, data: &[u8]) -> bool {
        let ps = self.page_size;
        let new = (0..(data.len() / ps) as u64)
            .filter(|i| !self.slots.contains(key.wrapping_add(*i)))
            .count();
        if !sessions.reserve((new * ps) as u64, capacity) {
            return false;
        }
        for (i, chunk) in data.chunks(ps).enumerate() {
            self.slots.put(key.wrapping_add(i as u64), chunk);
        }
        self.pages_max = self.pages_max.max(self.slots.len());
        true
    }

    /// Forget these pages: how many were held.
    pub fn free(&mut self, sessions: &Sessions, keys: &[rmem_proto::PageKey]) -> usize {
        let removed = keys.iter().filter(|k| self.slots.remove(k.0)).count();
        sessions.release((removed * self.page_size) as u64);
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_expires_unless_renewed_and_fencing_refuses_the_old_attachment() {
        let s = Sessions::default();
        let lease = Duration::from_millis(100);
        let a = s.attach(SessionId(1), 4096, lease, false).unwrap();
        assert!(!a.existed);
        assert!(a
            .attachment
            .lock()
            .unwrap()
            .store(&s, 1 << 20, 5, &[1; 4096]));
        assert_eq!(s.used_bytes.load(Ordering::Relaxed), 4096);
        let b = s.attach(SessionId(1), 4096, lease, false).unwrap();
        assert!(b.existed && b.session_bytes == 4096);
        assert!(s.attach(SessionId(1), 8192, lease, false).is_err());
        // Both see the page; an exclusive attach fences both.
        assert!(b.attachment.lock().unwrap().slots.contains(5));
        let c = s.attach(SessionId(1), 4096, lease, true).unwrap();
        assert!(matches!(a.attachment.lock(), Err(Refusal::Fenced(_))));
        assert!(matches!(b.attachment.lock(), Err(Refusal::Fenced(_))));
        assert!(c.attachment.lock().is_ok());
        let t = Instant::now();
        assert!(s.reap(t).is_empty());
        assert_eq!(s.list(t)[0].connections, 3);
        assert_eq!(s.reap(t + 2 * lease), vec![(SessionId(1), 4096)]);
        assert_eq!(s.used_bytes.load(Ordering::Relaxed), 0);
        assert!(matches!(c.attachment.lock(), Err(Refusal::Gone(_))));
        assert!(s.list(t).is_empty());
    }
}
