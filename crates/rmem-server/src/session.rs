//! Sessions: a client's pages, kept apart from the connections that carry its requests.
//!
//! A session is named by the client (a random 128-bit [`SessionId`]) and lives while a
//! connection is attached to it, and for its lease after the last one closes: every request
//! renews the lease (an idle client pings). A connection that drops leaves the session and its
//! pages in place, so a client that reconnects within the lease finds them;
//! [`Sessions::reap`] frees the pages of a session with no connection whose lease ran out (a
//! client killed, or cut off for longer than the keepalive and the lease). Any number of
//! connections may attach one session; an exclusive attach fences the others (their requests
//! are refused from then on), which is how a reconnecting client makes sure that nothing still
//! buffered on its dropped connection lands after what it re-sends.
//!
//! **Snapshots** (a `fork()` child's memory). [`Sessions::snapshot`] makes a new session that
//! reads what the attached one holds at that point of its connection's requests, in constant
//! time: nothing is copied. A session, its snapshots, theirs, and so on form a [`Family`]:
//! one arena of reference-counted page slots and one lock. A snapshot's index names only what
//! differs from the session it was taken from (its parent); any other key reads through the
//! parent. Before a session changes a key (a write or a free), each of its snapshots that does
//! not name that key yet is given the page the key had (a second reference to its slot, or a
//! tombstone where it had none), so a snapshot always reads what was there when it was taken,
//! and a write to a slot that someone else also names takes a new slot (copy-on-write).
//! Ending a session gives each of its snapshots what it read through it, and they then read
//! through its parent. Capacity counts slots, so shared pages count once.
//!
//! Lock order: the table, then a family. Capacity is one counter for the whole server.
//!
//! **On disk** ([`Sessions::on_disk`]): every family's arena keeps its pages in the server's
//! [`DiskStore`]; nothing else changes. A persisted store's pages come back as sessions
//! ([`Sessions::restore`]) with a fresh lease: a client that reconnects within it finds them,
//! otherwise the reaper frees them as for any session whose lease ran out.

use crate::disk::{DiskStore, Restored, SlotOwner};
use crate::slab::{Arena, Entry, Index};
use rmem_proto::SessionId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One session of a family: its own pages, where it reads the rest, and its lease.
#[derive(Debug)]
struct Member {
    own: Index,
    /// The session this one is a snapshot of (it reads through it what it does not name).
    parent: Option<SessionId>,
    /// Snapshots taken of this session.
    children: Vec<SessionId>,
    /// Last renewal of the lease.
    renewed: Instant,
    lease: Duration,
    /// Bumped by an exclusive attach; a connection attached at an older epoch is fenced.
    epoch: u64,
    /// Most pages held at once, for the verbose disconnect line.
    pages_max: usize,
    connections: usize,
}

impl Member {
    fn new(parent: Option<SessionId>, lease: Duration) -> Member {
        Member {
            own: Index::new(),
            parent,
            children: Vec::new(),
            renewed: Instant::now(),
            lease,
            epoch: 0,
            pages_max: 0,
            connections: 0,
        }
    }
}

/// Sessions that share pages: a session and every snapshot taken from it (and from those).
#[derive(Debug)]
pub struct Family {
    arena: Arena,
    members: HashMap<SessionId, Member>,
    /// Members ended by a request (their client's EndSession, or their parent's EndSnapshot
    /// when the fork child they served exited or exec'd) while connections were still
    /// attached to them: how many. Those connections' late requests are refused as
    /// [`Refusal::Ended`], not as a lost session; each leaves the count as it closes.
    ended: HashMap<SessionId, usize>,
}

impl Family {
    fn member(&self, id: SessionId) -> &Member {
        self.members.get(&id).expect("a live member")
    }

    /// The slot `id` reads for `key`: its own entry, else what its parent reads.
    fn resolve(&self, mut id: SessionId, key: u64) -> Option<u32> {
        loop {
            let m = self.member(id);
            match m.own.get(key) {
                Some(Entry::Slot(s)) => return Some(s),
                Some(Entry::Gone) => return None,
                None => id = m.parent?,
            }
        }
    }

    /// `id` is about to change `key`: each of its snapshots that does not name `key` keeps
    /// what it reads now.
    fn preserve(&mut self, id: SessionId, key: u64) {
        if self.member(id).children.is_empty() {
            return;
        }
        let view = self.resolve(id, key);
        let Family { arena, members, .. } = self;
        let children = members[&id].children.clone();
        for c in children {
            let own = &mut members.get_mut(&c).expect("a live snapshot").own;
            if own.get(key).is_some() {
                continue;
            }
            match view {
                Some(slot) => {
                    arena.share(slot);
                    own.set(key, Entry::Slot(slot));
                }
                None => {
                    own.set(key, Entry::Gone);
                }
            }
        }
    }

    /// Remove `id`: its snapshots get what they read through it and read through its parent
    /// from now on; its slots are released. Returns the bytes freed.
    fn end(&mut self, id: SessionId) -> u64 {
        let ps = self.arena.page_size() as u64;
        let m = self.members.remove(&id).expect("a live member");
        if self.members.is_empty() {
            let bytes = self.arena.len() as u64 * ps;
            self.arena.clear();
            return bytes;
        }
        if let Some(p) = m.parent {
            let siblings = &mut self.members.get_mut(&p).expect("a live parent").children;
            siblings.retain(|&c| c != id);
            siblings.extend_from_slice(&m.children);
        }
        for &c in &m.children {
            let child = self.members.get_mut(&c).expect("a live snapshot");
            child.parent = m.parent;
            for (key, entry) in m.own.entries() {
                if child.own.get(key).is_some() {
                    continue;
                }
                match entry {
                    Entry::Slot(s) => {
                        self.arena.share(s);
                        child.own.set(key, entry);
                    }
                    // Without a parent nothing is there to hide.
                    Entry::Gone if m.parent.is_some() => {
                        child.own.set(key, entry);
                    }
                    Entry::Gone => {}
                }
            }
        }
        let mut freed = 0;
        for (_, entry) in m.own.entries() {
            if let Entry::Slot(s) = entry {
                if self.arena.release(s) {
                    freed += ps;
                }
            }
        }
        freed
    }
}

#[derive(Debug)]
pub struct Session {
    pub id: SessionId,
    family: Arc<Mutex<Family>>,
}

/// Why a request of an attached connection cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("session {0}'s lease expired: its pages are gone")]
    Gone(SessionId),
    /// Ended by its client or its parent (orderly: nothing was lost that anyone wants).
    #[error("session {0} was ended (by its client, or by its parent when its fork child exited or exec'd)")]
    Ended(SessionId),
    #[error("session {0} was attached exclusively by another connection")]
    Fenced(SessionId),
    #[error("snapshot {0} does not exist (its parent did not take it within {1} ms, or it ended)")]
    NoSnapshot(SessionId, u64),
}

/// A connection's hold on a session.
#[derive(Debug)]
pub struct Attachment {
    pub session: Arc<Session>,
    epoch: u64,
}

/// The pages of an attached session, its family locked.
pub struct Pages<'a> {
    family: MutexGuard<'a, Family>,
    id: SessionId,
}

impl Attachment {
    /// The session's pages, lease renewed, unless it is gone or this connection was fenced.
    pub fn lock(&self) -> Result<Pages<'_>, Refusal> {
        let mut family = lock(&self.session.family);
        let id = self.session.id;
        let Some(m) = family.members.get_mut(&id) else {
            return Err(if family.ended.contains_key(&id) {
                Refusal::Ended(id)
            } else {
                Refusal::Gone(id)
            });
        };
        if m.epoch != self.epoch {
            return Err(Refusal::Fenced(id));
        }
        m.renewed = Instant::now();
        Ok(Pages { family, id })
    }

    /// Detach (the connection closed): the session stays until its lease ends. Returns
    /// (pages held now, most pages held), or `None` if the session has ended.
    pub fn detach(self) -> Option<(usize, usize)> {
        let mut family = lock(&self.session.family);
        let id = self.session.id;
        let Some(m) = family.members.get_mut(&id) else {
            if let Some(open) = family.ended.get_mut(&id) {
                *open -= 1;
                if *open == 0 {
                    family.ended.remove(&id);
                }
            }
            return None;
        };
        m.connections -= 1;
        // The lease runs from the last connection's close: a session held open by a client
        // that sent nothing for a long time (stopped, in a debugger) gets its full lease to
        // reconnect after a dropped link, as an active one does.
        m.renewed = Instant::now();
        Some((m.own.slots(), m.pages_max))
    }
}

/// What [`Sessions::attach`] found.
pub struct Attached {
    pub attachment: Attachment,
    pub existed: bool,
    /// The session outlives this server process (a persisted disk store).
    pub persists: bool,
    pub lease: Duration,
    pub session_bytes: u64,
}

/// A session as `rmem status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: SessionId,
    /// Bytes of the pages it holds itself (a snapshot's pages shared with its parent are
    /// counted there).
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
    /// Signalled when a snapshot is created, for attaches that wait for one.
    created: Condvar,
    pub used_bytes: AtomicU64,
    /// Where pages are kept: RAM when none.
    disk: Option<Arc<DiskStore>>,
    /// The most bytes the server lends now (`rmem server --reclaim-below`): below the
    /// capacity while its node is short of memory. New pages past it are refused as past the
    /// capacity; pages already held may still be overwritten.
    pub lend_limit: LendLimit,
}

/// Why [`Pages::store`] stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum StoreRefusal {
    #[error("full")]
    Full,
    /// The disk store failed, or no memory could be mapped for a new slab.
    #[error("{0}")]
    Io(#[source] std::io::Error),
}

/// [`Sessions::lend_limit`]: no limit (`u64::MAX`) unless set.
#[derive(Debug)]
pub struct LendLimit(AtomicU64);

impl Default for LendLimit {
    fn default() -> Self {
        LendLimit(AtomicU64::new(u64::MAX))
    }
}

impl LendLimit {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    pub fn set(&self, bytes: u64) {
        self.0.store(bytes, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A connection thread that panicked leaves consistent data (every update is one step).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How an attach finds its session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// Create it if it does not exist.
    Create,
    /// A snapshot another connection creates: wait up to this long for it, never create it.
    Snapshot(Duration),
    /// Another server reading the session for its owner (`ATTACH_PEEK`): never create it,
    /// keep its lease, fence nobody.
    Peek,
}

impl Sessions {
    /// Sessions whose pages are kept in `store`.
    pub fn on_disk(store: Arc<DiskStore>) -> Sessions {
        Sessions {
            disk: Some(store),
            ..Sessions::default()
        }
    }

    pub fn disk(&self) -> Option<&Arc<DiskStore>> {
        self.disk.as_ref()
    }

    /// A new session with no pages, alone in its family.
    fn root(&self, id: SessionId, page_size: usize, lease: Duration) -> Arc<Session> {
        let arena = match &self.disk {
            Some(store) => Arena::on_disk(page_size, store.clone()),
            None => Arena::new(page_size),
        };
        let mut members = HashMap::new();
        members.insert(id, Member::new(None, lease));
        Arc::new(Session {
            id,
            family: Arc::new(Mutex::new(Family {
                arena,
                members,
                ended: HashMap::new(),
            })),
        })
    }

    /// Sessions again from the pages a persisted store found when it was reopened, each with
    /// `lease` from now: (sessions, pages) restored.
    pub fn restore(&self, pages: &[Restored], lease: Duration) -> (usize, usize) {
        let store = self.disk.clone().expect("restore on a disk-backed server");
        let mut table = lock(&self.table);
        let mut restored = 0;
        for p in pages {
            let session = table
                .entry(p.session)
                .or_insert_with(|| self.root(p.session, p.unit_len as usize, lease));
            let mut family = lock(&session.family);
            let ps = family.arena.page_size();
            let m = &family.members[&p.session];
            if ps != p.unit_len as usize || m.own.get(p.key).is_some() {
                // Units of another size under one session, or a key twice: not from this
                // server's writes; dropped rather than guessed.
                drop(family);
                store.free(p.at, p.unit_len);
                continue;
            }
            let slot = family.arena.adopt(p.at);
            let m = family.members.get_mut(&p.session).expect("made above");
            m.own.set(p.key, Entry::Slot(slot));
            m.pages_max = m.own.slots();
            self.used_bytes.fetch_add(ps as u64, Ordering::Relaxed);
            restored += 1;
        }
        (table.len(), restored)
    }

    /// Attach to `id`, creating it with `lease` and `page_size` if it does not exist (or
    /// waiting for it: [`AttachMode::Snapshot`]). A session's page size is fixed at creation.
    pub fn attach(
        &self,
        id: SessionId,
        page_size: usize,
        lease: Duration,
        exclusive: bool,
        mode: AttachMode,
    ) -> Result<Attached, String> {
        let mut table = lock(&self.table);
        let mut existed = true;
        if let AttachMode::Snapshot(wait) = mode {
            let deadline = Instant::now() + wait;
            while !table.contains_key(&id) {
                let now = Instant::now();
                if now >= deadline {
                    return Err(Refusal::NoSnapshot(id, wait.as_millis() as u64).to_string());
                }
                table = self
                    .created
                    .wait_timeout(table, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        if mode == AttachMode::Peek && !table.contains_key(&id) {
            return Err(Refusal::Gone(id).to_string());
        }
        let session = table
            .entry(id)
            .or_insert_with(|| {
                existed = false;
                self.root(id, page_size, lease)
            })
            .clone();
        let mut family = lock(&session.family);
        if family.arena.page_size() != page_size {
            return Err(format!(
                "session {id} has pages of {} bytes, this connection {page_size}",
                family.arena.page_size()
            ));
        }
        let m = family.members.get_mut(&id).expect("a session in the table");
        if exclusive && mode != AttachMode::Peek {
            m.epoch += 1;
        }
        m.connections += 1;
        m.renewed = Instant::now();
        if mode != AttachMode::Peek {
            m.lease = lease;
        }
        let lease = m.lease;
        let epoch = m.epoch;
        let session_bytes = (m.own.slots() * page_size) as u64;
        drop(family);
        Ok(Attached {
            attachment: Attachment { session, epoch },
            existed,
            persists: self.disk.as_ref().is_some_and(|d| d.persist()),
            lease,
            session_bytes,
        })
    }

    /// Take `snapshot` of the attached session (see the module doc). Ok(false) when it exists
    /// already as a snapshot of this session (a re-sent request).
    pub fn snapshot(&self, a: &Attachment, snapshot: SessionId) -> Result<bool, String> {
        let mut table = lock(&self.table);
        if let Some(s) = table.get(&snapshot) {
            let ours = Arc::ptr_eq(&s.family, &a.session.family)
                && lock(&s.family)
                    .members
                    .get(&snapshot)
                    .is_some_and(|m| m.parent == Some(a.session.id));
            return if ours {
                Ok(false)
            } else {
                Err(format!(
                    "session {snapshot} exists and is not a snapshot of {}",
                    a.session.id
                ))
            };
        }
        let mut family = lock(&a.session.family);
        let Some(m) = family.members.get_mut(&a.session.id) else {
            return Err(Refusal::Gone(a.session.id).to_string());
        };
        m.children.push(snapshot);
        let lease = m.lease;
        family
            .members
            .insert(snapshot, Member::new(Some(a.session.id), lease));
        drop(family);
        table.insert(
            snapshot,
            Arc::new(Session {
                id: snapshot,
                family: a.session.family.clone(),
            }),
        );
        self.created.notify_all();
        Ok(true)
    }

    /// End `snapshot`, a session of the attached session's family (not itself): its pages are
    /// freed. Returns the bytes freed (0 if it was gone already).
    pub fn end_snapshot(&self, a: &Attachment, snapshot: SessionId) -> Result<u64, String> {
        if snapshot == a.session.id {
            return Err("a session cannot end itself as a snapshot (EndSession)".into());
        }
        let mut table = lock(&self.table);
        let Some(s) = table.get(&snapshot) else {
            return Ok(0);
        };
        if !Arc::ptr_eq(&s.family, &a.session.family) {
            return Err(format!(
                "session {snapshot} is not a snapshot of {}",
                a.session.id
            ));
        }
        let s = table.remove(&snapshot).expect("just found");
        let mut family = lock(&s.family);
        Ok(self.forget_ended(&mut family, snapshot))
    }

    /// Free the attached session's pages now and forget it. Returns the bytes freed.
    pub fn end(&self, a: &Attachment) -> (u64, usize) {
        let mut table = lock(&self.table);
        let mut family = lock(&a.session.family);
        let Some(m) = family.members.get(&a.session.id) else {
            return (0, 0);
        };
        let held_max = m.pages_max;
        table.remove(&a.session.id);
        (self.forget_ended(&mut family, a.session.id), held_max)
    }

    /// Forget `id`, ended by a request: connections still attached to it are told so.
    fn forget_ended(&self, family: &mut Family, id: SessionId) -> u64 {
        let open = family.member(id).connections;
        if open > 0 {
            family.ended.insert(id, open);
        }
        self.forget(family, id)
    }

    fn forget(&self, family: &mut Family, id: SessionId) -> u64 {
        let bytes = family.end(id);
        self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
        bytes
    }

    /// Free every session whose lease ran out at `now`: (id, bytes freed) of each. A session
    /// with a connection still open is kept whatever its lease: its client is alive, only
    /// silent (a program stopped by SIGSTOP, Ctrl-Z, a batch scheduler's suspend or a
    /// debugger sends no heartbeat, yet its kernel keeps its connections and answers TCP
    /// keepalive). A connection whose peer's host is gone or cut off is closed by the
    /// keepalive and the user timeout (`Connection::serve`), and the lease then runs.
    pub fn reap(&self, now: Instant) -> Vec<(SessionId, u64)> {
        let mut table = lock(&self.table);
        let mut reaped = Vec::new();
        table.retain(|id, s| {
            let mut family = lock(&s.family);
            let m = family.member(*id);
            if m.connections > 0 || now.saturating_duration_since(m.renewed) <= m.lease {
                return true;
            }
            reaped.push((*id, self.forget(&mut family, *id)));
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
                let family = lock(&s.family);
                let m = family.member(s.id);
                SessionInfo {
                    id: s.id,
                    used_bytes: (m.own.slots() * family.arena.page_size()) as u64,
                    lease_age: now.saturating_duration_since(m.renewed),
                    lease: m.lease,
                    connections: m.connections,
                }
            })
            .collect();
        v.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.id.cmp(&b.id)));
        v
    }

    /// Reserve capacity for `bytes` more; false (and nothing reserved) past `capacity` or the
    /// lend limit. Nothing more (an overwrite) is always granted.
    pub fn reserve(&self, bytes: u64, capacity: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        let capacity = capacity.min(self.lend_limit.get());
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

impl Pages<'_> {
    pub fn page_size(&self) -> usize {
        self.family.arena.page_size()
    }

    /// Append `key`'s page as this session reads it to `out`: Ok(false) if it has none. An
    /// error (a disk-backed server's read failed or did not verify) leaves `out` as it was.
    pub fn read(&self, key: u64, out: &mut Vec<u8>) -> std::io::Result<bool> {
        let Some(slot) = self.family.resolve(self.id, key) else {
            return Ok(false);
        };
        self.family.arena.read(slot, out)?;
        Ok(true)
    }

    /// Append `len` bytes at `offset` of `key`'s page to `out` (within the page): Ok(false),
    /// and nothing appended, if this session has no such page.
    pub fn read_range(
        &self,
        key: u64,
        offset: usize,
        len: usize,
        out: &mut Vec<u8>,
    ) -> std::io::Result<bool> {
        let Some(slot) = self.family.resolve(self.id, key) else {
            return Ok(false);
        };
        self.family.arena.read_range(slot, offset, len, out)?;
        Ok(true)
    }

    pub fn contains(&self, key: u64) -> bool {
        self.family.resolve(self.id, key).is_some()
    }

    /// Store `data` (whole pages) from `key` on, within `capacity` for the whole server. If
    /// they would not fit, nothing is stored; if the disk store fails or no memory can be
    /// mapped for a new slab, none of these keys is held any more (never a wrong page: the
    /// client places them elsewhere).
    pub fn store(
        &mut self,
        sessions: &Sessions,
        capacity: u64,
        key: u64,
        data: &[u8],
    ) -> Result<(), StoreRefusal> {
        let ps = self.page_size();
        let keys = (0..(data.len() / ps) as u64).map(|i| key.wrapping_add(i));
        for k in keys.clone() {
            self.family.preserve(self.id, k);
        }
        // A key writes in place only into a slot of its own that nobody else names.
        let family = &mut *self.family;
        let own = &family.members[&self.id].own;
        let in_place =
            |k: u64| matches!(own.get(k), Some(Entry::Slot(s)) if family.arena.refs(s) == 1);
        let new = keys.clone().filter(|&k| !in_place(k)).count();
        if !sessions.reserve((new * ps) as u64, capacity) {
            return Err(StoreRefusal::Full);
        }
        let Family { arena, members, .. } = family;
        let m = members.get_mut(&self.id).expect("a live member");
        let snapshot = m.parent.is_some();
        let mut allocated = 0;
        let mut failed = None;
        for (k, chunk) in keys.clone().zip(data.chunks(ps)) {
            let owner = SlotOwner {
                session: self.id,
                key: k,
                snapshot,
            };
            let written = match m.own.get(k) {
                Some(Entry::Slot(s)) if arena.refs(s) == 1 => arena.write(s, chunk, owner),
                old => arena.alloc(chunk, owner).map(|s| {
                    allocated += 1;
                    m.own.set(k, Entry::Slot(s));
                    if let Some(Entry::Slot(shared)) = old {
                        // Still named by a snapshot: never the last reference.
                        assert!(!arena.release(shared));
                    }
                }),
            };
            if let Err(e) = written {
                failed = Some(e);
                break;
            }
        }
        m.pages_max = m.pages_max.max(m.own.slots());
        let Some(e) = failed else {
            return Ok(());
        };
        // Give back what was reserved and not taken, then drop every key of the request:
        // some hold the new page, one maybe nothing valid, none may answer a read now.
        sessions.release(((new - allocated) * ps) as u64);
        let keys: Vec<rmem_proto::PageKey> = keys.map(rmem_proto::PageKey).collect();
        self.free(sessions, &keys);
        Err(StoreRefusal::Io(e))
    }

    /// Store `data` at `offset` of page `key`, the rest of the page as it was (zeros for a
    /// page this session does not read yet), refused as [`Pages::store`] refuses. The page is
    /// patched in place when only this session names it; otherwise (new, or shared with a
    /// snapshot) patched in a copy and stored whole, so snapshots keep what they read
    /// (copy-on-write) exactly as for a whole-page write. Only the client's bytes crossed the
    /// network either way.
    pub fn store_range(
        &mut self,
        sessions: &Sessions,
        capacity: u64,
        key: u64,
        offset: usize,
        data: &[u8],
    ) -> Result<(), StoreRefusal> {
        let ps = self.page_size();
        assert!(offset + data.len() <= ps, "range checked by the caller");
        self.family.preserve(self.id, key);
        let Family { arena, members, .. } = &mut *self.family;
        let m = &members[&self.id];
        if let Some(Entry::Slot(s)) = m.own.get(key) {
            if arena.refs(s) == 1 {
                // Its own page that no snapshot names: patched in place, no capacity taken.
                let owner = SlotOwner {
                    session: self.id,
                    key,
                    snapshot: m.parent.is_some(),
                };
                if let Err(e) = arena.write_at(s, offset, data, owner) {
                    // The slot holds no valid page now: the key goes, as for a failed store.
                    self.free(sessions, &[rmem_proto::PageKey(key)]);
                    return Err(StoreRefusal::Io(e));
                }
                return Ok(());
            }
        }
        let mut page = Vec::with_capacity(ps);
        if !self.read(key, &mut page).map_err(StoreRefusal::Io)? {
            page.resize(ps, 0);
        }
        rmem_copy::copy(&mut page[offset..offset + data.len()], data);
        self.store(sessions, capacity, key, &page)
    }

    /// Forget these pages: how many this session held itself.
    pub fn free(&mut self, sessions: &Sessions, keys: &[rmem_proto::PageKey]) -> usize {
        let ps = self.page_size() as u64;
        let (mut removed, mut freed) = (0, 0);
        for k in keys {
            self.family.preserve(self.id, k.0);
            let parent = self.family.member(self.id).parent;
            // Where a session read through still has the key, a tombstone hides it.
            let hidden = parent.is_some_and(|p| self.family.resolve(p, k.0).is_some());
            let Family { arena, members, .. } = &mut *self.family;
            let own = &mut members.get_mut(&self.id).expect("a live member").own;
            let old = if hidden {
                own.set(k.0, Entry::Gone)
            } else {
                own.remove(k.0)
            };
            if let Some(Entry::Slot(s)) = old {
                removed += 1;
                if arena.release(s) {
                    freed += ps;
                }
            }
        }
        sessions.release(freed);
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmem_proto::PageKey;

    const PS: usize = 4096;
    const CAP: u64 = 1 << 30;

    fn page(v: u8) -> Vec<u8> {
        vec![v; PS]
    }

    fn attach(s: &Sessions, id: u128, mode: AttachMode) -> Attachment {
        s.attach(SessionId(id), PS, Duration::from_secs(30), false, mode)
            .unwrap()
            .attachment
    }

    fn read(a: &Attachment, key: u64) -> Option<u8> {
        let mut out = Vec::new();
        a.lock()
            .unwrap()
            .read(key, &mut out)
            .unwrap()
            .then(|| out[0])
    }

    fn write(s: &Sessions, a: &Attachment, key: u64, v: u8) {
        a.lock().unwrap().store(s, CAP, key, &page(v)).unwrap();
    }

    fn used_pages(s: &Sessions) -> u64 {
        s.used_bytes.load(Ordering::Relaxed) / PS as u64
    }

    #[test]
    fn the_lend_limit_refuses_new_bytes_not_overwrites() {
        let s = Sessions::default();
        assert!(s.reserve(8192, CAP));
        s.lend_limit.set(12288);
        assert!(s.reserve(4096, CAP), "up to the limit");
        assert!(!s.reserve(4096, CAP), "past it");
        s.lend_limit.set(0);
        assert!(s.reserve(0, CAP), "an overwrite takes nothing more");
        assert!(!s.reserve(4096, CAP));
        assert_eq!(s.used_bytes.load(Ordering::Relaxed), 12288);
        s.lend_limit.set(u64::MAX);
        assert!(s.reserve(4096, CAP));
    }

    #[test]
    fn a_lease_expires_unless_renewed_and_fencing_refuses_the_old_attachment() {
        let s = Sessions::default();
        let lease = Duration::from_millis(100);
        let a = s
            .attach(SessionId(1), 4096, lease, false, AttachMode::Create)
            .unwrap();
        assert!(!a.existed);
        a.attachment
            .lock()
            .unwrap()
            .store(&s, 1 << 20, 5, &[1; 4096])
            .unwrap();
        assert_eq!(s.used_bytes.load(Ordering::Relaxed), 4096);
        let b = s
            .attach(SessionId(1), 4096, lease, false, AttachMode::Create)
            .unwrap();
        assert!(b.existed && b.session_bytes == 4096);
        assert!(s
            .attach(SessionId(1), 8192, lease, false, AttachMode::Create)
            .is_err());
        // Both see the page; an exclusive attach fences both.
        assert!(b.attachment.lock().unwrap().contains(5));
        let c = s
            .attach(SessionId(1), 4096, lease, true, AttachMode::Create)
            .unwrap();
        assert!(matches!(a.attachment.lock(), Err(Refusal::Fenced(_))));
        assert!(matches!(b.attachment.lock(), Err(Refusal::Fenced(_))));
        assert!(c.attachment.lock().is_ok());
        let t = Instant::now();
        assert!(s.reap(t).is_empty());
        assert_eq!(s.list(t)[0].connections, 3);
        // Attached, it outlives any lease (its client is silent, not gone).
        assert!(s.reap(t + 100 * lease).is_empty());
        let _ = (a.attachment.detach(), b.attachment.detach());
        assert!(s.reap(t + 100 * lease).is_empty(), "one connection left");
        let gone = c.attachment.session.clone();
        assert!(c.attachment.detach().is_some());
        let t = Instant::now();
        assert!(s.reap(t).is_empty(), "the lease runs from the last close");
        assert_eq!(s.reap(t + 2 * lease), vec![(SessionId(1), 4096)]);
        assert_eq!(s.used_bytes.load(Ordering::Relaxed), 0);
        assert!(!lock(&gone.family).members.contains_key(&SessionId(1)));
        assert!(s.list(t).is_empty());
    }

    #[test]
    fn a_snapshot_reads_what_was_there_when_it_was_taken_and_writes_are_private() {
        let s = Sessions::default();
        let p = attach(&s, 1, AttachMode::Create);
        write(&s, &p, 1, 10);
        write(&s, &p, 2, 20);
        assert!(s.snapshot(&p, SessionId(2)).unwrap());
        assert!(!s.snapshot(&p, SessionId(2)).unwrap(), "a re-sent snapshot");
        let c = attach(&s, 2, AttachMode::Snapshot(Duration::ZERO));
        assert_eq!(used_pages(&s), 2, "nothing copied");
        // The parent changes every key; the snapshot still reads the old pages.
        write(&s, &p, 1, 11);
        write(&s, &p, 3, 30);
        p.lock().unwrap().free(&s, &[PageKey(2)]);
        assert_eq!(
            (read(&c, 1), read(&c, 2), read(&c, 3)),
            (Some(10), Some(20), None)
        );
        assert_eq!(
            (read(&p, 1), read(&p, 2), read(&p, 3)),
            (Some(11), None, Some(30))
        );
        // The snapshot's own writes and frees do not reach the parent.
        write(&s, &c, 1, 12);
        write(&s, &c, 4, 40);
        c.lock().unwrap().free(&s, &[PageKey(3)]);
        assert_eq!((read(&c, 1), read(&c, 4)), (Some(12), Some(40)));
        assert_eq!(
            (read(&p, 1), read(&p, 3), read(&p, 4)),
            (Some(11), Some(30), None)
        );
        // Slots in use: p:1(11) 3(30); c:1(12) 2(20) 4(40). Key 1's 10 was freed on c's write.
        assert_eq!(used_pages(&s), 5);
        // Ending the snapshot frees what only it held.
        assert_eq!(s.end_snapshot(&p, SessionId(2)).unwrap(), 3 * PS as u64);
        assert_eq!(used_pages(&s), 2);
        assert_eq!(s.end_snapshot(&p, SessionId(2)).unwrap(), 0, "gone already");
        // Its connection, still attached, is told that it was ended, not that it was lost;
        // once that connection closes, nothing of the snapshot is remembered.
        assert!(matches!(c.lock(), Err(Refusal::Ended(_))));
        assert_eq!(c.detach(), None);
        assert!(lock(&p.session.family).ended.is_empty());
    }

    /// A session whose lease ran out while no connection held it is lost, not ended: a
    /// connection that peeks at it is told so.
    #[test]
    fn a_session_reaped_at_its_lease_is_gone_and_one_ended_is_ended() {
        let s = Sessions::default();
        let a = attach(&s, 7, AttachMode::Create);
        assert!(a.detach().is_some());
        let later = Instant::now() + Duration::from_secs(3600);
        assert_eq!(s.reap(later).len(), 1);
        let peek = s.attach(
            SessionId(7),
            PS,
            Duration::from_secs(1),
            false,
            AttachMode::Peek,
        );
        assert!(peek.err().unwrap().contains("lease expired"));
        // Ended by its client: a second connection still attached is told it was ended.
        let b = attach(&s, 8, AttachMode::Create);
        let b2 = attach(&s, 8, AttachMode::Create);
        let family = b.session.family.clone();
        s.end(&b);
        assert!(matches!(b2.lock(), Err(Refusal::Ended(_))));
        assert_eq!(b.detach(), None);
        assert_eq!(lock(&family).ended.get(&SessionId(8)), Some(&1));
        assert_eq!(b2.detach(), None);
        assert!(lock(&family).ended.is_empty());
    }

    /// A fork child ended by its parent (it exited) while it was ending its own child's
    /// snapshot: its connection is told it was ended, and that snapshot can still be ended
    /// through it, so its pages are freed now rather than when its lease runs out.
    #[test]
    fn an_ended_session_still_ends_its_own_snapshot() {
        let s = Sessions::default();
        let p = attach(&s, 1, AttachMode::Create);
        write(&s, &p, 1, 10);
        assert!(s.snapshot(&p, SessionId(2)).unwrap());
        let c = attach(&s, 2, AttachMode::Snapshot(Duration::ZERO));
        assert!(s.snapshot(&c, SessionId(3)).unwrap());
        let g = attach(&s, 3, AttachMode::Snapshot(Duration::ZERO));
        write(&s, &g, 2, 20);
        s.end_snapshot(&p, SessionId(2)).unwrap();
        assert!(matches!(c.lock(), Err(Refusal::Ended(_))));
        assert_eq!(s.end_snapshot(&c, SessionId(3)).unwrap(), PS as u64);
        assert!(matches!(g.lock(), Err(Refusal::Ended(_))));
        assert_eq!(used_pages(&s), 1, "the parent's page alone");
    }

    #[test]
    fn a_range_write_creates_a_zeroed_page_patches_in_place_and_copies_a_shared_one() {
        range_writes(Sessions::default());
    }

    #[test]
    fn range_writes_on_disk_read_patch_and_write_whole_slots() {
        let d = crate::disk::tests::dir();
        range_writes(on_disk(&d.join("ranges"), false).0);
    }

    fn range_writes(s: Sessions) {
        let p = attach(&s, 1, AttachMode::Create);
        let range = |a: &Attachment, key, off: usize, v: u8, n: usize, cap| {
            a.lock()
                .unwrap()
                .store_range(&s, cap, key, off, &vec![v; n])
                .is_ok()
        };
        // The range as read_range gives it (after what `out` held), checked against the
        // whole page's read.
        let bytes = |a: &Attachment, key, off: usize, n: usize| {
            let mut page = Vec::new();
            let found = a.lock().unwrap().read(key, &mut page).unwrap();
            let mut range = vec![0xEE; 3];
            let in_range = a
                .lock()
                .unwrap()
                .read_range(key, off, n, &mut range)
                .unwrap();
            assert_eq!(found, in_range);
            assert_eq!(range[..3], [0xEE; 3]);
            assert_eq!(range.len(), 3 + if found { n } else { 0 });
            found.then(|| {
                assert_eq!(range[3..], page[off..off + n]);
                page[off..off + n].to_vec()
            })
        };
        // A new page: zeros around the range, one page of capacity.
        assert!(range(&p, 7, 100, 9, 3, CAP));
        assert_eq!(bytes(&p, 7, 99, 5), Some(vec![0, 9, 9, 9, 0]));
        assert_eq!(used_pages(&s), 1);
        // In place: no capacity, even with none left.
        assert!(range(&p, 7, 0, 5, 2, PS as u64));
        assert_eq!(bytes(&p, 7, 0, 3), Some(vec![5, 5, 0]));
        assert!(
            !range(&p, 8, 0, 1, 1, PS as u64),
            "a new page past capacity"
        );
        assert_eq!(used_pages(&s), 1);
        // Shared with a snapshot: the snapshot keeps its bytes, the writer gets a copy.
        assert!(s.snapshot(&p, SessionId(2)).unwrap());
        let c = attach(&s, 2, AttachMode::Snapshot(Duration::ZERO));
        assert!(range(&p, 7, 101, 4, 1, CAP));
        assert_eq!(bytes(&p, 7, 100, 3), Some(vec![9, 4, 9]));
        assert_eq!(bytes(&c, 7, 100, 3), Some(vec![9, 9, 9]));
        assert_eq!(bytes(&p, 7, 0, 2), Some(vec![5, 5]), "the rest copied");
        assert_eq!(used_pages(&s), 2);
    }

    #[test]
    fn a_snapshot_outlives_its_parent_and_a_grandchild_reads_through_both() {
        let s = Sessions::default();
        let p = attach(&s, 1, AttachMode::Create);
        write(&s, &p, 1, 1);
        write(&s, &p, 2, 2);
        s.snapshot(&p, SessionId(2)).unwrap();
        let c = attach(&s, 2, AttachMode::Snapshot(Duration::ZERO));
        write(&s, &c, 2, 22);
        s.snapshot(&c, SessionId(3)).unwrap();
        let g = attach(&s, 3, AttachMode::Snapshot(Duration::ZERO));
        write(&s, &c, 1, 21);
        write(&s, &p, 1, 11);
        assert_eq!((read(&g, 1), read(&g, 2)), (Some(1), Some(22)));
        // The parent ends (its process exited); the snapshots keep what they read.
        s.end(&p);
        assert_eq!((read(&c, 1), read(&c, 2)), (Some(21), Some(22)));
        assert_eq!((read(&g, 1), read(&g, 2)), (Some(1), Some(22)));
        // The middle one ends too; the grandchild reads the same.
        assert!(s.end_snapshot(&g, SessionId(2)).is_ok());
        assert_eq!((read(&g, 1), read(&g, 2)), (Some(1), Some(22)));
        assert_eq!(used_pages(&s), 2);
        s.end(&g);
        assert_eq!(used_pages(&s), 0);
        assert!(s.list(Instant::now()).is_empty());
    }

    #[test]
    fn an_attach_waits_for_a_snapshot_and_never_creates_one() {
        let s = Arc::new(Sessions::default());
        let wait = AttachMode::Snapshot(Duration::from_millis(50));
        let err = s
            .attach(SessionId(9), PS, Duration::from_secs(1), false, wait)
            .err()
            .expect("no such snapshot");
        assert!(err.contains("does not exist"), "{err}");
        assert!(s.list(Instant::now()).is_empty());
        let p = attach(&s, 1, AttachMode::Create);
        let s2 = s.clone();
        let t = std::thread::spawn(move || {
            s2.attach(
                SessionId(9),
                PS,
                Duration::from_secs(1),
                false,
                AttachMode::Snapshot(Duration::from_secs(10)),
            )
            .map(|a| a.existed)
        });
        std::thread::sleep(Duration::from_millis(20));
        s.snapshot(&p, SessionId(9)).unwrap();
        assert_eq!(t.join().unwrap(), Ok(true));
        assert!(s.snapshot(&p, SessionId(1)).is_err(), "not a snapshot");
        let other = attach(&s, 5, AttachMode::Create);
        assert!(
            s.end_snapshot(&other, SessionId(9)).is_err(),
            "another family"
        );
    }

    #[test]
    fn capacity_counts_shared_pages_once_and_a_full_server_stores_nothing() {
        let s = Sessions::default();
        let p = attach(&s, 1, AttachMode::Create);
        write(&s, &p, 1, 1);
        s.snapshot(&p, SessionId(2)).unwrap();
        let cap = 2 * PS as u64;
        // One slot is free: the parent's rewrite of a shared page takes it.
        p.lock().unwrap().store(&s, cap, 1, &page(2)).unwrap();
        assert!(
            matches!(
                p.lock().unwrap().store(&s, cap, 5, &page(5)),
                Err(StoreRefusal::Full)
            ),
            "full"
        );
        assert_eq!(read(&p, 5), None);
        assert_eq!(used_pages(&s), 2);
    }

    fn on_disk(path: &std::path::Path, persist: bool) -> (Sessions, Vec<crate::disk::Restored>) {
        let (store, restored) = DiskStore::open(path, persist, 2 * PS as u64).unwrap();
        (Sessions::on_disk(Arc::new(store)), restored)
    }

    #[test]
    fn sessions_on_disk_keep_snapshots_apart_and_a_failed_write_leaves_no_page() {
        let d = crate::disk::tests::dir();
        let (s, _) = on_disk(&d.join("scratch"), false);
        let p = attach(&s, 1, AttachMode::Create);
        for k in 0..20 {
            write(&s, &p, k, k as u8);
        }
        s.snapshot(&p, SessionId(2)).unwrap();
        let c = attach(&s, 2, AttachMode::Snapshot(Duration::ZERO));
        write(&s, &p, 1, 101);
        write(&s, &c, 2, 202);
        p.lock().unwrap().free(&s, &[PageKey(3)]);
        assert_eq!(
            (read(&p, 1), read(&p, 2), read(&p, 3)),
            (Some(101), Some(2), None)
        );
        assert_eq!(
            (read(&c, 1), read(&c, 2), read(&c, 3)),
            (Some(1), Some(202), Some(3))
        );
        assert_eq!(used_pages(&s), 22);
        // The disk fails: the write is refused, and the key it named reads as absent, never
        // as its old page (the client puts it elsewhere).
        let store = s.disk().unwrap().clone();
        store.fail_writes.store(true, Ordering::Relaxed);
        let r = p.lock().unwrap().store(&s, CAP, 4, &page(44));
        assert!(matches!(r, Err(StoreRefusal::Io(_))), "{r:?}");
        let r = p
            .lock()
            .unwrap()
            .store(&s, CAP, 100, &[page(7), page(8)].concat());
        assert!(matches!(r, Err(StoreRefusal::Io(_))), "{r:?}");
        store.fail_writes.store(false, Ordering::Relaxed);
        assert_eq!(
            (read(&p, 4), read(&p, 100), read(&p, 101)),
            (None, None, None)
        );
        assert_eq!(read(&c, 4), Some(4), "the snapshot keeps what it read");
        assert_eq!(used_pages(&s), 22, "capacity given back");
        s.end(&p);
        s.end(&c);
        assert_eq!(used_pages(&s), 0);
        drop((p, c, s, store));
    }

    #[test]
    fn persisted_sessions_come_back_with_their_pages_and_expire_unless_attached() {
        let d = crate::disk::tests::dir();
        let path = d.join("persist");
        let (s, _) = on_disk(&path, true);
        let a = attach(&s, 1, AttachMode::Create);
        let b = attach(&s, 2, AttachMode::Create);
        for k in 0..50 {
            write(&s, &a, k, k as u8);
            write(&s, &b, k, 100 + k as u8);
        }
        write(&s, &a, 7, 77);
        a.lock().unwrap().free(&s, &[PageKey(8)]);
        s.snapshot(&a, SessionId(3)).unwrap();
        let c = attach(&s, 3, AttachMode::Snapshot(Duration::ZERO));
        write(&s, &c, 60, 60);
        drop((a, b, c, s));
        let (s, restored) = on_disk(&path, true);
        let lease = Duration::from_millis(200);
        assert_eq!(
            s.restore(&restored, lease),
            (2, 99),
            "the snapshot is not restored"
        );
        assert_eq!(used_pages(&s), 99);
        // Session 1's client reconnects (and asks for a longer lease).
        let a = s
            .attach(
                SessionId(1),
                PS,
                Duration::from_secs(30),
                true,
                AttachMode::Create,
            )
            .unwrap();
        assert!(a.existed && a.session_bytes == 49 * PS as u64);
        let a = a.attachment;
        assert_eq!(
            (read(&a, 7), read(&a, 8), read(&a, 9)),
            (Some(77), None, Some(9))
        );
        // Session 2 is not attached again: its lease runs out and its pages go.
        let later = Instant::now() + 2 * lease;
        assert_eq!(s.reap(later), vec![(SessionId(2), 50 * PS as u64)]);
        drop((a, s));
        let (s, restored) = on_disk(&path, true);
        assert_eq!(
            s.restore(&restored, lease),
            (1, 49),
            "session 2's pages were cleared"
        );
        drop(s);
    }
}
