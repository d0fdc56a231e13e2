//! The pool manager (`rmem manager`): it knows the memory servers of a pool (address,
//! capacity, free memory, health by heartbeat) and the clients (what each uses where), offers
//! clients the live servers by free memory, and grants each client the most it may use.
//!
//! Entry point: [`Manager::bind`] with a [`ManagerConfig`], then [`Manager::run`] (or
//! [`Manager::spawn`]). Connections are authenticated exactly as a memory server's (the same
//! [`accept`](super::accept), the pool protocol's own version, `rmem_proto::pool`), then
//! answered in order, a thread each.
//!
//! The manager is not on the data path and holds no state of its own: every entry is the
//! last beat a server or client sent, with the time it came. A restarted manager knows
//! nothing until the beats arrive again, one heartbeat later, and then knows everything it
//! knew before (docs/pool.md). Servers and clients go on without it meanwhile: a client keeps
//! its servers and only stops learning of new ones.

use crate::{accept, accept_loop, log_close, read_frame, Close, Deadlined, ServerError, Welcomed};
use crate::{HANDSHAKE_TIMEOUT, IO_BUFFER};
use rmem_proto::pool::{self, PoolRequest, PoolResponse, PoolStatus};
use rmem_proto::{ErrorCode, SessionId};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Heartbeats missed before a server counts as lost (offered to no client, shown `lost`).
pub const LOST_AFTER_BEATS: u32 = 3;
/// Heartbeats missed before a lost server is forgotten.
pub const FORGET_SERVER_AFTER_BEATS: u32 = 30;
/// Heartbeats missed before a client is forgotten (it ended, or was killed).
pub const FORGET_CLIENT_AFTER_BEATS: u32 = 3;
/// A connection silent for this many heartbeats is closed (a peer that died without a FIN).
pub const IDLE_AFTER_BEATS: u32 = 10;

#[derive(Clone, Debug)]
pub struct ManagerConfig {
    pub listen: SocketAddr,
    pub token: Vec<u8>,
    /// How often servers and clients beat (told to them in every answer).
    pub heartbeat: Duration,
    /// The most server memory one client is granted (`pool::UNLIMITED`: no limit).
    pub max_remote_bytes: u64,
}

struct ServerEntry {
    beat: pool::ServerBeat,
    last: Instant,
    /// `rmem pool drain` asked for it (told to the server in its next ack).
    drain: bool,
    /// Its node was in debt at its last beat ([`Pool::debt`]; told in its ack).
    in_debt: bool,
}

struct ClientEntry {
    beat: pool::ClientBeat,
    last: Instant,
    grant_bytes: u64,
}

/// A node's standing in the pool: what its clients hold on other nodes, and what other nodes'
/// clients hold on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Debt {
    borrowed_bytes: u64,
    lent_bytes: u64,
}

impl Debt {
    /// In debt: it borrows more than it lends. Not "borrows at all": of two nodes that borrow
    /// from each other, at most one is then in debt (every byte between nodes is one node's
    /// borrowing and another's lending, so not every node can borrow more than it lends), and
    /// the other always has servers that take pages; and a node that sheds its loans only
    /// goes deeper in debt, so the state ends when its programs stop borrowing, not by
    /// flapping. A node that lends more than it borrows keeps lending: shedding would move its
    /// loans to other nodes while its own program borrowed just as much.
    fn in_debt(self) -> bool {
        self.borrowed_bytes > self.lent_bytes
    }
}

/// What the manager knows: the last beat of each server and client.
#[derive(Default)]
struct Pool {
    servers: BTreeMap<String, ServerEntry>,
    clients: HashMap<SessionId, ClientEntry>,
}

impl Pool {
    fn forget_stale(&mut self, now: Instant, heartbeat: Duration) {
        self.servers
            .retain(|_, s| now - s.last < heartbeat * FORGET_SERVER_AFTER_BEATS);
        self.clients
            .retain(|_, c| now - c.last < heartbeat * FORGET_CLIENT_AFTER_BEATS);
    }

    fn lost(s: &ServerEntry, now: Instant, heartbeat: Duration) -> bool {
        now - s.last >= heartbeat * LOST_AFTER_BEATS
    }

    /// Live servers, RAM before disk ([`pool::SERVER_DISK`]), the most free memory first
    /// (ties by address).
    fn offers(&self, now: Instant, heartbeat: Duration) -> Vec<pool::ServerOffer> {
        let mut v: Vec<pool::ServerOffer> = self
            .servers
            .values()
            .filter(|s| !Self::lost(s, now, heartbeat))
            .map(|s| pool::ServerOffer {
                addr: s.beat.addr.clone(),
                capacity_bytes: s.beat.capacity_bytes,
                free_bytes: s.beat.capacity_bytes.saturating_sub(s.beat.used_bytes),
                flags: s.beat.flags | if s.drain { pool::SERVER_DRAINING } else { 0 },
            })
            .collect();
        let disk = |o: &pool::ServerOffer| o.flags & pool::SERVER_DISK != 0;
        v.sort_by(|a, b| {
            (disk(a).cmp(&disk(b)))
                .then(b.free_bytes.cmp(&a.free_bytes))
                .then(a.addr.cmp(&b.addr))
        });
        v
    }

    /// What clients on `node` hold on other nodes' servers (borrowed), and what clients on
    /// other nodes hold on `node`'s servers (lent), by the clients' own counts. Peers without
    /// a node (protocol [`pool::VERSION_NODELESS`]) count for nothing.
    fn debt(&self, node: &str) -> Debt {
        let mut d = Debt::default();
        if node.is_empty() {
            return d;
        }
        let server_node: HashMap<&str, &str> = self
            .servers
            .values()
            .map(|s| (s.beat.addr.as_str(), s.beat.node.as_str()))
            .collect();
        for c in self.clients.values().filter(|c| !c.beat.node.is_empty()) {
            for u in &c.beat.uses {
                let Some(&on) = server_node.get(u.server.as_str()) else {
                    continue;
                };
                if on.is_empty() || on == c.beat.node {
                    continue;
                }
                if c.beat.node == node {
                    d.borrowed_bytes = d.borrowed_bytes.saturating_add(u.bytes);
                } else if on == node {
                    d.lent_bytes = d.lent_bytes.saturating_add(u.bytes);
                }
            }
        }
        d
    }

    fn status(&self, now: Instant, heartbeat: Duration) -> PoolStatus {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut clients: Vec<pool::ClientRow> = self
            .clients
            .values()
            .map(|c| pool::ClientRow {
                session: c.beat.session,
                name: c.beat.name.clone(),
                max_remote_bytes: c.beat.max_remote_bytes,
                grant_bytes: c.grant_bytes,
                beat_age_ms: ms(now - c.last),
                uses: c.beat.uses.clone(),
            })
            .collect();
        clients.sort_by_key(|c| c.session);
        PoolStatus {
            heartbeat_ms: u32::try_from(heartbeat.as_millis()).unwrap_or(u32::MAX),
            servers: self
                .servers
                .values()
                .map(|s| pool::ServerRow {
                    addr: s.beat.addr.clone(),
                    capacity_bytes: s.beat.capacity_bytes,
                    used_bytes: s.beat.used_bytes,
                    flags: s.beat.flags
                        | if Self::lost(s, now, heartbeat) {
                            pool::ROW_LOST
                        } else {
                            0
                        }
                        | if s.drain { pool::SERVER_DRAINING } else { 0 },
                    beat_age_ms: ms(now - s.last),
                    sessions: s.beat.sessions.clone(),
                })
                .collect(),
            clients,
        }
    }
}

pub struct Manager {
    listener: TcpListener,
    config: Arc<ManagerConfig>,
    pool: Arc<Mutex<Pool>>,
    connections: Arc<AtomicUsize>,
    addr: SocketAddr,
}

impl Manager {
    pub fn bind(config: ManagerConfig) -> Result<Manager, ServerError> {
        if config.token.is_empty() {
            return Err(ServerError::EmptyToken);
        }
        let bind_err = |source| ServerError::Bind {
            addr: config.listen,
            source,
        };
        let listener = TcpListener::bind(config.listen).map_err(bind_err)?;
        let addr = listener.local_addr().map_err(bind_err)?;
        Ok(Manager {
            listener,
            config: Arc::new(config),
            pool: Arc::default(),
            connections: Arc::default(),
            addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Accept and answer servers, clients and `rmem pool` forever.
    pub fn run(self) -> Result<(), ServerError> {
        let me = self.addr;
        accept_loop(&self.listener, me, &self.connections, |sock, peer| {
            let (config, pool, count) = (
                self.config.clone(),
                self.pool.clone(),
                self.connections.clone(),
            );
            std::thread::Builder::new()
                .name(format!("rmem-pool-{peer}"))
                .spawn(move || {
                    log_close(me, peer, serve(&config, &pool, sock));
                    count.fetch_sub(1, Ordering::Relaxed);
                })
                .map(drop)
        })
    }

    /// Run on a background thread.
    pub fn spawn(self) -> std::thread::JoinHandle<Result<(), ServerError>> {
        std::thread::spawn(move || self.run())
    }
}

fn serve(config: &ManagerConfig, pool: &Mutex<Pool>, sock: TcpStream) -> Result<(), Close> {
    sock.set_nodelay(true)?;
    let deadlined = Deadlined {
        sock: sock.try_clone()?,
        deadline: Some(Instant::now() + HANDSHAKE_TIMEOUT),
    };
    let mut reader = BufReader::with_capacity(IO_BUFFER, deadlined);
    let mut writer = BufWriter::with_capacity(IO_BUFFER, sock.try_clone()?);
    // The version of the peer's Hello: how its requests are decoded and its answers encoded,
    // and what the welcome says.
    let spoken = std::cell::Cell::new(pool::VERSION);
    let hello = |version, unit: u32| {
        if !pool::VERSIONS.contains(&version) {
            let msg = format!(
                "this is an rmem pool manager (protocol {}), not a memory server: protocol \
                 {version} is not spoken here",
                pool::VERSION
            );
            return Err((ErrorCode::VersionMismatch, msg));
        }
        if unit != 0 {
            return Err((ErrorCode::BadRequest, format!("unit size {unit}, not 0")));
        }
        spoken.set(version);
        Ok(())
    };
    let welcome = || {
        let p = pool.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let live = p
            .servers
            .values()
            .filter(|s| !Pool::lost(s, now, config.heartbeat));
        let (capacity_bytes, used_bytes) = live.fold((0u64, 0u64), |(c, u), s| {
            (
                c.saturating_add(s.beat.capacity_bytes),
                u.saturating_add(s.beat.used_bytes),
            )
        });
        Welcomed {
            version: spoken.get(),
            frame_len_max: rmem_proto::FRAME_LEN_MAX_DEFAULT,
            capacity_bytes,
            used_bytes,
        }
    };
    if accept(&mut reader, &mut writer, &config.token, hello, welcome)?.is_none() {
        return Ok(());
    }
    reader.get_mut().deadline = None;
    // A peer that died without closing is noticed: beats come every heartbeat.
    sock.set_read_timeout(Some(config.heartbeat * IDLE_AFTER_BEATS))?;
    let mut body = Vec::new();
    let mut out = Vec::new();
    loop {
        let Some((h, frame)) =
            read_frame(&mut reader, rmem_proto::FRAME_LEN_MAX_DEFAULT, &mut body)?
        else {
            return Ok(());
        };
        let req = PoolRequest::decode_for(spoken.get(), h.op, frame)?;
        out.clear();
        answer(config, pool, req).encode_for(spoken.get(), h.tag, &mut out);
        writer.write_all(&out)?;
        writer.flush()?;
    }
}

/// Whether `addr` is a `host:port` a client could connect to.
fn plausible_addr(addr: &str) -> bool {
    match addr.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0),
        None => false,
    }
}

fn answer(config: &ManagerConfig, pool: &Mutex<Pool>, req: PoolRequest) -> PoolResponse {
    let heartbeat_ms = u32::try_from(config.heartbeat.as_millis()).unwrap_or(u32::MAX);
    let mut p = pool.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    p.forget_stale(now, config.heartbeat);
    match req {
        PoolRequest::ServerBeat(beat) => {
            if !plausible_addr(&beat.addr) {
                return PoolResponse::Error {
                    code: ErrorCode::BadRequest,
                    message: format!("server address {:?} is not HOST:PORT", beat.addr),
                };
            }
            let addr = beat.addr.clone();
            let e = p.servers.entry(addr.clone()).or_insert_with(|| {
                log::info!(
                    "server {addr} joined: capacity {} bytes, {} used",
                    beat.capacity_bytes,
                    beat.used_bytes
                );
                ServerEntry {
                    beat: beat.clone(),
                    last: now,
                    drain: false,
                    in_debt: false,
                }
            });
            if Pool::lost(e, now, config.heartbeat) {
                log::info!("server {addr} is back");
            }
            if beat.flags & pool::SERVER_DRAINING != 0 && !e.drain {
                // It asked to leave itself (SIGTERM): a drain like rmem pool drain's.
                log::info!("server {addr}: draining (it is leaving)");
                e.drain = true;
            }
            let reclaiming = beat.flags & pool::SERVER_RECLAIMING != 0;
            if reclaiming != (e.beat.flags & pool::SERVER_RECLAIMING != 0) {
                if !reclaiming {
                    log::info!("server {addr}: lending again");
                } else if beat.flags & pool::SERVER_NODE_BORROWS != 0 {
                    log::info!("server {addr}: reclaiming (its node is in debt)");
                } else {
                    log::info!("server {addr}: reclaiming (its node is short of memory)");
                }
            }
            e.beat = beat;
            e.last = now;
            let mut flags = if e.drain { pool::ACK_DRAIN } else { 0 };
            let node = p.servers[&addr].beat.node.clone();
            let debt = p.debt(&node);
            let e = p.servers.get_mut(&addr).expect("inserted above");
            if debt.in_debt() != e.in_debt {
                log::info!(
                    "server {addr}: its node ({node}) borrows {} bytes from other nodes and \
                     lends {}: {}",
                    debt.borrowed_bytes,
                    debt.lent_bytes,
                    if debt.in_debt() {
                        "in debt, it lends nothing meanwhile"
                    } else {
                        "no longer in debt"
                    }
                );
                e.in_debt = debt.in_debt();
            }
            if e.in_debt {
                flags |= pool::ACK_NODE_BORROWS;
            }
            PoolResponse::ServerAck {
                heartbeat_ms,
                flags,
            }
        }
        PoolRequest::ClientBeat(beat) => {
            let grant_bytes = beat.max_remote_bytes.min(config.max_remote_bytes);
            let session = beat.session;
            if !p.clients.contains_key(&session) {
                log::info!("client {session} ({}) joined", beat.name);
            }
            p.clients.insert(
                session,
                ClientEntry {
                    beat,
                    last: now,
                    grant_bytes,
                },
            );
            PoolResponse::ClientAck {
                heartbeat_ms,
                grant_bytes,
                servers: p.offers(now, config.heartbeat),
            }
        }
        PoolRequest::Status => PoolResponse::StatusOk(p.status(now, config.heartbeat)),
        PoolRequest::Drain { server } => match p.servers.get_mut(&server) {
            Some(e) if !Pool::lost(e, now, config.heartbeat) => {
                if !e.drain {
                    log::info!("server {server}: draining (asked by rmem pool drain)");
                }
                e.drain = true;
                PoolResponse::DrainOk
            }
            _ => PoolResponse::Error {
                code: ErrorCode::BadRequest,
                message: format!("no live server {server} in this pool"),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(p: &mut Pool, addr: &str, node: &str) {
        let beat = pool::ServerBeat {
            addr: addr.into(),
            capacity_bytes: 1 << 30,
            used_bytes: 0,
            flags: 0,
            sessions: vec![],
            node: node.into(),
        };
        p.servers.insert(
            addr.into(),
            ServerEntry {
                beat,
                last: Instant::now(),
                drain: false,
                in_debt: false,
            },
        );
    }

    fn client(p: &mut Pool, id: u128, node: &str, uses: &[(&str, u64)]) {
        let beat = pool::ClientBeat {
            session: SessionId(id),
            name: format!("c{id}"),
            max_remote_bytes: pool::UNLIMITED,
            uses: uses
                .iter()
                .map(|&(s, bytes)| pool::ServerUse {
                    server: s.into(),
                    bytes,
                    kept: String::new(),
                })
                .collect(),
            node: node.into(),
        };
        p.clients.insert(
            SessionId(id),
            ClientEntry {
                beat,
                last: Instant::now(),
                grant_bytes: pool::UNLIMITED,
            },
        );
    }

    #[test]
    fn a_node_is_in_debt_when_it_borrows_more_than_it_lends() {
        let mut p = Pool::default();
        server(&mut p, "a:1", "A");
        server(&mut p, "b:1", "B");
        server(&mut p, "old:1", "");
        // Pages on its own node's server are not borrowed; on a nodeless server, not counted.
        client(&mut p, 1, "A", &[("a:1", 100), ("old:1", 100)]);
        assert_eq!(p.debt("A"), Debt::default());
        // A borrows 300 from B, B borrows 200 from A: only A is in debt.
        client(&mut p, 2, "A", &[("b:1", 300)]);
        client(&mut p, 3, "B", &[("a:1", 200), ("b:1", 50)]);
        let (a, b) = (p.debt("A"), p.debt("B"));
        assert_eq!((a.borrowed_bytes, a.lent_bytes), (300, 200));
        assert_eq!((b.borrowed_bytes, b.lent_bytes), (200, 300));
        assert!(a.in_debt() && !b.in_debt());
        // Even: neither. A client without a node counts for nothing.
        client(&mut p, 4, "B", &[("a:1", 100)]);
        client(&mut p, 5, "", &[("a:1", 1000)]);
        assert!(!p.debt("A").in_debt() && !p.debt("B").in_debt());
        assert_eq!(p.debt(""), Debt::default());
    }
}
