//! The pool manager's protocol: what memory servers and clients tell the manager
//! (`rmem manager`) and what it answers. Not on the data path: pages never pass here.
//!
//! The frames and the handshake are the memory servers' (the same 16-byte [`Header`], the same
//! `Hello` / `Challenge` / `Auth` / `Welcome` over the shared token, [`crate::auth`]), with a
//! version of its own, [`VERSION`], numbered apart from the memory servers' (which count from
//! 1): a pool client that reaches a memory server, or the reverse, is refused at its `Hello`
//! with a version mismatch, never misread. The unit size in the `Hello` is 0 (the manager
//! stores nothing). After the handshake:
//!
//! ```text
//! memory server ── ServerBeat { addr, capacity, used, flags (DRAINING, DISK, ...), sessions,
//!                               node } ─► manager
//!               ◄─ ServerAck { heartbeat_ms, flags (DRAIN, NODE_BORROWS) }
//! client        ── ClientBeat { session, name, max_remote, uses per server, node } ─►
//!               ◄─ ClientAck { heartbeat_ms, grant, servers by free memory }
//! rmem pool     ── Status ─► ◄─ StatusOk { servers, clients }
//!               ── Drain { server } ─► ◄─ DrainOk   (a later version acts on it)
//! ```
//!
//! Versions ([`VERSIONS`]): [`VERSION`] (0x0103) adds to each of a client's uses why it keeps
//! that server although the server drains (`ServerUse::kept`, in beats and in the status);
//! [`VERSION_NODE`] (0x0102) ends both beats with the sender's node ([`node_id`]'s form);
//! [`VERSION_NODELESS`] (0x0101, the first) has no node. A manager accepts all three and
//! decodes each connection's requests, and encodes its answers, by the version of its `Hello`
//! ([`PoolRequest::decode_for`], [`PoolResponse::encode_for`]); a peer refused by a manager
//! that does not know its version connects again with the next older one (rmem-client's
//! `ManagerConn`). A peer without a node is on no node: it neither borrows nor lends in the
//! manager's accounting of debt. A use without a reason (from an older peer) says nothing of
//! why it stays: `rmem pool drain` then waits it out.
//!
//! Every beat carries the sender's whole state, never a change: a manager that restarts
//! rebuilds its picture from the next beat of each server and client (docs/pool.md). Decoding
//! checks every length and count against the body before allocating, and caps every list.
//!
//! [`Header`]: crate::Header

use crate::{Cursor, ErrorCode, Op, ProtoError, Response, SessionId};

/// The manager protocol's version, sent in `Hello`. Numbered from 256 so that it never equals a
/// memory server's protocol version. This one says why a client keeps a draining server.
pub const VERSION: u16 = 0x0103;
/// Beats end with the sender's node; uses say nothing of why a server is kept.
pub const VERSION_NODE: u16 = 0x0102;
/// The first version: beats without the node. Still accepted, and spoken to a manager that
/// knows no other.
pub const VERSION_NODELESS: u16 = 0x0101;
/// Every version spoken, newest first: the order a peer tries them in.
pub const VERSIONS: [u16; 3] = [VERSION, VERSION_NODE, VERSION_NODELESS];
/// Longest server address (`host:port`) or client name carried.
pub const NAME_LEN_MAX: usize = 256;
/// Most servers one answer lists.
pub const SERVERS_MAX: usize = 4096;
/// Most clients one status lists.
pub const CLIENTS_MAX: usize = 65536;
/// Most sessions one server beat lists, and most servers one client beat lists.
pub const USES_MAX: usize = 65536;
/// `max_remote_bytes` / `grant_bytes` meaning "no limit".
pub const UNLIMITED: u64 = u64::MAX;

/// `ServerBeat` flag: the server is draining (moving its pages out; takes no new pages).
pub const SERVER_DRAINING: u32 = 1;
/// `ServerAck` flag: the manager asks the server to drain.
pub const ACK_DRAIN: u32 = 1;
/// `ServerAck` flag: a client on the server's node holds more on other nodes' servers than
/// the other nodes' clients hold on this node's (its node is in debt): lend nothing meanwhile
/// (reclaim as with [`SERVER_RECLAIMING`], saying [`SERVER_NODE_BORROWS`] too).
pub const ACK_NODE_BORROWS: u32 = 2;
/// `ServerOffer` / `ServerRow` flag: the server has not been heard from within the manager's
/// loss window (only in status: clients are offered live servers).
pub const ROW_LOST: u32 = 2;
/// `ServerBeat` / `ServerOffer` / `ServerRow` flag: the server keeps pages on disk
/// (`rmem server --store file:PATH`), a slower tier: clients place pages there only when the
/// RAM servers are full. A flag bit, so the frames are unchanged: a manager or client that
/// predates it passes it on or ignores it, and sees a RAM server.
pub const SERVER_DISK: u32 = 4;
/// `ServerBeat` flag (passed on in offers and status): the server's node is short of memory
/// (`rmem server --reclaim-below`): it takes no new pages, and clients move their pages off it
/// as for a drain, but only while the flag is set; it is not leaving.
pub const SERVER_RECLAIMING: u32 = 8;
/// `ServerBeat` flag (passed on), always with [`SERVER_RECLAIMING`]: it reclaims because its
/// node is in debt ([`ACK_NODE_BORROWS`]), not (only) because memory is short.
pub const SERVER_NODE_BORROWS: u32 = 16;

/// Bytes one session (a client) holds on a server, or one client on one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionUse {
    pub session: SessionId,
    pub bytes: u64,
}

/// Bytes a client holds on one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerUse {
    pub server: String,
    pub bytes: u64,
    /// Why the client keeps this server although it drains or reclaims (its layout needs
    /// every server left, say); empty when it does not, or from a peer older than
    /// [`VERSION`].
    pub kept: String,
}

/// A memory server's heartbeat: everything the manager keeps about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerBeat {
    /// Where clients reach it (`host:port`).
    pub addr: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    /// [`SERVER_DRAINING`], [`SERVER_RECLAIMING`], [`SERVER_DISK`].
    pub flags: u32,
    /// Its sessions and their bytes (at most [`USES_MAX`], the largest first).
    pub sessions: Vec<SessionUse>,
    /// The node it runs on ([`node_id`]; empty: unknown, from a [`VERSION_NODELESS`] peer).
    pub node: String,
}

/// A client's heartbeat: everything the manager keeps about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientBeat {
    /// The session id it uses on every server.
    pub session: SessionId,
    /// For people: `program (pid N) on host`.
    pub name: String,
    /// The most server memory it asks to use ([`UNLIMITED`]: no limit of its own).
    pub max_remote_bytes: u64,
    /// What it has placed where.
    pub uses: Vec<ServerUse>,
    /// The node it runs on ([`node_id`]; empty: unknown, from a [`VERSION_NODELESS`] peer).
    pub node: String,
}

/// This process's node, as beats carry it: the host name and the inode of its network
/// namespace (`/proc/self/ns/net`), `HOST/net:INODE`. Two namespaces of one host are two nodes
/// (as in the tests, where namespaces simulate nodes); the host name tells real hosts apart.
pub fn node_id() -> String {
    use std::os::unix::fs::MetadataExt;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    match std::fs::metadata("/proc/self/ns/net") {
        Ok(m) => format!("{host}/net:{}", m.ino()),
        Err(_) => host,
    }
}

/// A server offered to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerOffer {
    pub addr: String,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    /// [`SERVER_DRAINING`], [`SERVER_RECLAIMING`]: place nothing new there, move pages off;
    /// [`SERVER_DISK`]: the slower tier.
    pub flags: u32,
}

impl ServerOffer {
    /// Whether new pages may go there: it is neither leaving the pool nor reclaiming its
    /// node's memory.
    pub fn takes_pages(&self) -> bool {
        self.flags & (SERVER_DRAINING | SERVER_RECLAIMING) == 0
    }
}

/// A server in the manager's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerRow {
    pub addr: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    /// [`SERVER_DRAINING`], [`SERVER_RECLAIMING`], [`ROW_LOST`], [`SERVER_DISK`].
    pub flags: u32,
    /// Milliseconds since its last beat.
    pub beat_age_ms: u64,
    pub sessions: Vec<SessionUse>,
}

/// A client in the manager's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientRow {
    pub session: SessionId,
    pub name: String,
    pub max_remote_bytes: u64,
    pub grant_bytes: u64,
    pub beat_age_ms: u64,
    pub uses: Vec<ServerUse>,
}

/// The manager's picture (`rmem pool status`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStatus {
    pub heartbeat_ms: u32,
    pub servers: Vec<ServerRow>,
    pub clients: Vec<ClientRow>,
}

/// A request to the manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolRequest {
    ServerBeat(ServerBeat),
    ClientBeat(ClientBeat),
    Status,
    /// Ask the pool to move every page off `server` (answered `DrainOk` or `Error`).
    Drain {
        server: String,
    },
}

/// An answer of the manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolResponse {
    ServerAck {
        heartbeat_ms: u32,
        /// [`ACK_DRAIN`].
        flags: u32,
    },
    ClientAck {
        heartbeat_ms: u32,
        /// The most server memory the client may use ([`UNLIMITED`]: no limit).
        grant_bytes: u64,
        /// Live servers, the most free memory first.
        servers: Vec<ServerOffer>,
    },
    StatusOk(PoolStatus),
    DrainOk,
    Error {
        code: ErrorCode,
        message: String,
    },
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let s = crate::truncate_utf8(s, NAME_LEN_MAX);
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_count(out: &mut Vec<u8>, n: usize, max: usize) -> usize {
    let n = n.min(max);
    out.extend_from_slice(&(n as u32).to_le_bytes());
    n
}

impl Cursor<'_> {
    fn string(&mut self) -> Result<String, ProtoError> {
        let n = self.u16()? as usize;
        if n > NAME_LEN_MAX {
            return Err(ProtoError::Invalid("name too long"));
        }
        std::str::from_utf8(self.take(n)?)
            .map(str::to_string)
            .map_err(|_| ProtoError::Invalid("name is not UTF-8"))
    }

    /// A list's count, checked against `max` and against what the body still holds at
    /// `entry_min` bytes an entry, before anything is allocated.
    fn count(&mut self, max: usize, entry_min: usize) -> Result<usize, ProtoError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(ProtoError::Invalid("list too long"));
        }
        let left = self.buf.len() - self.pos;
        if left < n * entry_min {
            return Err(ProtoError::Truncated {
                op: self.op,
                need: self.pos + n * entry_min,
                have: self.buf.len(),
            });
        }
        Ok(n)
    }

    fn session_uses(&mut self) -> Result<Vec<SessionUse>, ProtoError> {
        let n = self.count(USES_MAX, 24)?;
        (0..n)
            .map(|_| {
                Ok(SessionUse {
                    session: SessionId(u128::from_le_bytes(self.array()?)),
                    bytes: self.u64()?,
                })
            })
            .collect()
    }

    fn server_uses(&mut self, version: u16) -> Result<Vec<ServerUse>, ProtoError> {
        let n = self.count(USES_MAX, 10)?;
        (0..n)
            .map(|_| {
                Ok(ServerUse {
                    server: self.string()?,
                    bytes: self.u64()?,
                    kept: if version >= VERSION {
                        self.string()?
                    } else {
                        String::new()
                    },
                })
            })
            .collect()
    }
}

fn put_session_uses(out: &mut Vec<u8>, uses: &[SessionUse]) {
    let n = put_count(out, uses.len(), USES_MAX);
    for u in &uses[..n] {
        out.extend_from_slice(&u.session.0.to_le_bytes());
        out.extend_from_slice(&u.bytes.to_le_bytes());
    }
}

fn put_server_uses(out: &mut Vec<u8>, uses: &[ServerUse], version: u16) {
    let n = put_count(out, uses.len(), USES_MAX);
    for u in &uses[..n] {
        put_str(out, &u.server);
        out.extend_from_slice(&u.bytes.to_le_bytes());
        if version >= VERSION {
            put_str(out, &u.kept);
        }
    }
}

fn begin(out: &mut Vec<u8>, op: Op, tag: u64) -> usize {
    let start = out.len();
    crate::Header { len: 0, op, tag }.encode(out);
    start
}

impl PoolRequest {
    pub fn op(&self) -> Op {
        match self {
            PoolRequest::ServerBeat(_) => Op::PoolServerBeat,
            PoolRequest::ClientBeat(_) => Op::PoolClientBeat,
            PoolRequest::Status => Op::PoolStatus,
            PoolRequest::Drain { .. } => Op::PoolDrain,
        }
    }

    /// Append the whole frame to `out`, as [`VERSION`] has it.
    pub fn encode(&self, tag: u64, out: &mut Vec<u8>) {
        self.encode_for(VERSION, tag, out)
    }

    /// Append the whole frame to `out`, as protocol `version` has it (a beat's node is left
    /// out for [`VERSION_NODELESS`], the reasons servers are kept before [`VERSION`]).
    pub fn encode_for(&self, version: u16, tag: u64, out: &mut Vec<u8>) {
        let with_node = version >= VERSION_NODE;
        let start = begin(out, self.op(), tag);
        match self {
            PoolRequest::ServerBeat(b) => {
                put_str(out, &b.addr);
                out.extend_from_slice(&b.capacity_bytes.to_le_bytes());
                out.extend_from_slice(&b.used_bytes.to_le_bytes());
                out.extend_from_slice(&b.flags.to_le_bytes());
                put_session_uses(out, &b.sessions);
                if with_node {
                    put_str(out, &b.node);
                }
            }
            PoolRequest::ClientBeat(b) => {
                out.extend_from_slice(&b.session.0.to_le_bytes());
                put_str(out, &b.name);
                out.extend_from_slice(&b.max_remote_bytes.to_le_bytes());
                put_server_uses(out, &b.uses, version);
                if with_node {
                    put_str(out, &b.node);
                }
            }
            PoolRequest::Status => {}
            PoolRequest::Drain { server } => put_str(out, server),
        }
        crate::patch_len(out, start);
    }

    /// Decode a [`VERSION`] frame.
    pub fn decode(op: Op, body: &[u8]) -> Result<PoolRequest, ProtoError> {
        Self::decode_for(VERSION, op, body)
    }

    /// Decode a frame of protocol `version` (a [`VERSION_NODELESS`] beat has no node: empty;
    /// before [`VERSION`] no use says why it is kept: empty).
    pub fn decode_for(version: u16, op: Op, body: &[u8]) -> Result<PoolRequest, ProtoError> {
        let mut c = Cursor::new(op, body);
        let node = |c: &mut Cursor<'_>| {
            if version >= VERSION_NODE {
                c.string()
            } else {
                Ok(String::new())
            }
        };
        let req = match op {
            Op::PoolServerBeat => PoolRequest::ServerBeat(ServerBeat {
                addr: c.string()?,
                capacity_bytes: c.u64()?,
                used_bytes: c.u64()?,
                flags: c.u32()?,
                sessions: c.session_uses()?,
                node: node(&mut c)?,
            }),
            Op::PoolClientBeat => PoolRequest::ClientBeat(ClientBeat {
                session: SessionId(u128::from_le_bytes(c.array()?)),
                name: c.string()?,
                max_remote_bytes: c.u64()?,
                uses: c.server_uses(version)?,
                node: node(&mut c)?,
            }),
            Op::PoolStatus => PoolRequest::Status,
            Op::PoolDrain => PoolRequest::Drain {
                server: c.string()?,
            },
            other => return Err(ProtoError::WrongDirection(other)),
        };
        c.finish()?;
        Ok(req)
    }
}

impl PoolResponse {
    pub fn op(&self) -> Op {
        match self {
            PoolResponse::ServerAck { .. } => Op::PoolServerAck,
            PoolResponse::ClientAck { .. } => Op::PoolClientAck,
            PoolResponse::StatusOk(_) => Op::PoolStatusOk,
            PoolResponse::DrainOk => Op::PoolDrainOk,
            PoolResponse::Error { .. } => Op::Error,
        }
    }

    /// Append the whole frame to `out`, as [`VERSION`] has it.
    pub fn encode(&self, tag: u64, out: &mut Vec<u8>) {
        self.encode_for(VERSION, tag, out)
    }

    /// Append the whole frame to `out`, as protocol `version` has it (the status's uses say
    /// why a server is kept from [`VERSION`] on).
    pub fn encode_for(&self, version: u16, tag: u64, out: &mut Vec<u8>) {
        if let PoolResponse::Error { code, message } = self {
            // The memory servers' error frame, shared.
            return Response::Error {
                code: *code,
                message,
            }
            .encode(tag, out);
        }
        let start = begin(out, self.op(), tag);
        match self {
            PoolResponse::ServerAck {
                heartbeat_ms,
                flags,
            } => {
                out.extend_from_slice(&heartbeat_ms.to_le_bytes());
                out.extend_from_slice(&flags.to_le_bytes());
            }
            PoolResponse::ClientAck {
                heartbeat_ms,
                grant_bytes,
                servers,
            } => {
                out.extend_from_slice(&heartbeat_ms.to_le_bytes());
                out.extend_from_slice(&grant_bytes.to_le_bytes());
                let n = put_count(out, servers.len(), SERVERS_MAX);
                for s in &servers[..n] {
                    put_str(out, &s.addr);
                    out.extend_from_slice(&s.capacity_bytes.to_le_bytes());
                    out.extend_from_slice(&s.free_bytes.to_le_bytes());
                    out.extend_from_slice(&s.flags.to_le_bytes());
                }
            }
            PoolResponse::StatusOk(st) => {
                out.extend_from_slice(&st.heartbeat_ms.to_le_bytes());
                let n = put_count(out, st.servers.len(), SERVERS_MAX);
                for s in &st.servers[..n] {
                    put_str(out, &s.addr);
                    out.extend_from_slice(&s.capacity_bytes.to_le_bytes());
                    out.extend_from_slice(&s.used_bytes.to_le_bytes());
                    out.extend_from_slice(&s.flags.to_le_bytes());
                    out.extend_from_slice(&s.beat_age_ms.to_le_bytes());
                    put_session_uses(out, &s.sessions);
                }
                let n = put_count(out, st.clients.len(), CLIENTS_MAX);
                for c in &st.clients[..n] {
                    out.extend_from_slice(&c.session.0.to_le_bytes());
                    put_str(out, &c.name);
                    out.extend_from_slice(&c.max_remote_bytes.to_le_bytes());
                    out.extend_from_slice(&c.grant_bytes.to_le_bytes());
                    out.extend_from_slice(&c.beat_age_ms.to_le_bytes());
                    put_server_uses(out, &c.uses, version);
                }
            }
            PoolResponse::DrainOk => {}
            PoolResponse::Error { .. } => unreachable!("encoded above"),
        }
        crate::patch_len(out, start);
    }

    /// Decode a [`VERSION`] frame.
    pub fn decode(op: Op, body: &[u8]) -> Result<PoolResponse, ProtoError> {
        Self::decode_for(VERSION, op, body)
    }

    /// Decode a frame of protocol `version`.
    pub fn decode_for(version: u16, op: Op, body: &[u8]) -> Result<PoolResponse, ProtoError> {
        if op == Op::Error {
            let Response::Error { code, message } = Response::decode(op, body)? else {
                unreachable!("an error frame decodes to an error")
            };
            return Ok(PoolResponse::Error {
                code,
                message: message.to_string(),
            });
        }
        let mut c = Cursor::new(op, body);
        let resp = match op {
            Op::PoolServerAck => PoolResponse::ServerAck {
                heartbeat_ms: c.u32()?,
                flags: c.u32()?,
            },
            Op::PoolClientAck => {
                let heartbeat_ms = c.u32()?;
                let grant_bytes = c.u64()?;
                let n = c.count(SERVERS_MAX, 22)?;
                let servers = (0..n)
                    .map(|_| {
                        Ok(ServerOffer {
                            addr: c.string()?,
                            capacity_bytes: c.u64()?,
                            free_bytes: c.u64()?,
                            flags: c.u32()?,
                        })
                    })
                    .collect::<Result<_, ProtoError>>()?;
                PoolResponse::ClientAck {
                    heartbeat_ms,
                    grant_bytes,
                    servers,
                }
            }
            Op::PoolStatusOk => {
                let heartbeat_ms = c.u32()?;
                let n = c.count(SERVERS_MAX, 34)?;
                let servers = (0..n)
                    .map(|_| {
                        Ok(ServerRow {
                            addr: c.string()?,
                            capacity_bytes: c.u64()?,
                            used_bytes: c.u64()?,
                            flags: c.u32()?,
                            beat_age_ms: c.u64()?,
                            sessions: c.session_uses()?,
                        })
                    })
                    .collect::<Result<_, ProtoError>>()?;
                let n = c.count(CLIENTS_MAX, 46)?;
                let clients = (0..n)
                    .map(|_| {
                        Ok(ClientRow {
                            session: SessionId(u128::from_le_bytes(c.array()?)),
                            name: c.string()?,
                            max_remote_bytes: c.u64()?,
                            grant_bytes: c.u64()?,
                            beat_age_ms: c.u64()?,
                            uses: c.server_uses(version)?,
                        })
                    })
                    .collect::<Result<_, ProtoError>>()?;
                PoolResponse::StatusOk(PoolStatus {
                    heartbeat_ms,
                    servers,
                    clients,
                })
            }
            Op::PoolDrainOk => PoolResponse::DrainOk,
            other => return Err(ProtoError::WrongDirection(other)),
        };
        c.finish()?;
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_header, FRAME_LEN_MAX_DEFAULT, HEADER_LEN};

    fn beat() -> ServerBeat {
        ServerBeat {
            addr: "10.0.0.7:7000".into(),
            capacity_bytes: 1 << 34,
            used_bytes: 4096,
            flags: SERVER_DRAINING | SERVER_DISK,
            sessions: vec![SessionUse {
                session: SessionId(7 << 90),
                bytes: 4096,
            }],
            node: "node7/net:4026531840".into(),
        }
    }

    fn uses() -> Vec<ServerUse> {
        vec![
            ServerUse {
                server: "10.0.0.7:7000".into(),
                bytes: 1 << 20,
                kept: "--redundancy ec:4+1 puts each page on 5 servers, and 4 others are left"
                    .into(),
            },
            ServerUse {
                server: "10.0.0.8:7000".into(),
                bytes: 1 << 21,
                kept: String::new(),
            },
        ]
    }

    /// `uses` as a peer of `version` sends them.
    fn uses_as_of(version: u16, uses: Vec<ServerUse>) -> Vec<ServerUse> {
        let kept = |u: ServerUse| ServerUse {
            kept: if version >= VERSION {
                u.kept
            } else {
                String::new()
            },
            ..u
        };
        uses.into_iter().map(kept).collect()
    }

    fn requests() -> Vec<PoolRequest> {
        vec![
            PoolRequest::ServerBeat(beat()),
            PoolRequest::ClientBeat(ClientBeat {
                session: SessionId(u128::MAX),
                name: "stress (pid 7) on node1".into(),
                max_remote_bytes: UNLIMITED,
                uses: uses(),
                node: "node1/net:4026531840".into(),
            }),
            PoolRequest::Status,
            PoolRequest::Drain {
                server: "10.0.0.7:7000".into(),
            },
        ]
    }

    fn responses() -> Vec<PoolResponse> {
        vec![
            PoolResponse::ServerAck {
                heartbeat_ms: 1000,
                flags: ACK_DRAIN | ACK_NODE_BORROWS,
            },
            PoolResponse::ClientAck {
                heartbeat_ms: 1000,
                grant_bytes: 1 << 30,
                servers: vec![ServerOffer {
                    addr: "a:1".into(),
                    capacity_bytes: 2,
                    free_bytes: 1,
                    flags: 0,
                }],
            },
            PoolResponse::StatusOk(PoolStatus {
                heartbeat_ms: 500,
                servers: vec![ServerRow {
                    addr: "a:1".into(),
                    capacity_bytes: 2,
                    used_bytes: 1,
                    flags: ROW_LOST,
                    beat_age_ms: 9,
                    sessions: beat().sessions,
                }],
                clients: vec![ClientRow {
                    session: SessionId(3),
                    name: "x".into(),
                    max_remote_bytes: 5,
                    grant_bytes: 5,
                    beat_age_ms: 1,
                    uses: uses(),
                }],
            }),
            PoolResponse::DrainOk,
            PoolResponse::Error {
                code: ErrorCode::BadRequest,
                message: "no such server".into(),
            },
        ]
    }

    #[test]
    fn every_message_roundtrips() {
        for r in requests() {
            let mut buf = Vec::new();
            r.encode(5, &mut buf);
            let h = parse_header(&buf, FRAME_LEN_MAX_DEFAULT).unwrap().unwrap();
            assert_eq!(h.len as usize, buf.len() - HEADER_LEN);
            assert_eq!(PoolRequest::decode(h.op, &buf[HEADER_LEN..]).unwrap(), r);
        }
        for r in responses() {
            let mut buf = Vec::new();
            r.encode(5, &mut buf);
            let h = parse_header(&buf, FRAME_LEN_MAX_DEFAULT).unwrap().unwrap();
            assert_eq!(PoolResponse::decode(h.op, &buf[HEADER_LEN..]).unwrap(), r);
        }
    }

    /// A beat of an older version lacks what came after it (the first has no node; none
    /// before [`VERSION`] says why a server is kept), and a manager decodes it as such, and
    /// answers a status in the same form; the forms differ by exactly that, so none is
    /// misread as another.
    #[test]
    fn older_versions_roundtrip_without_what_came_later() {
        for version in [VERSION_NODE, VERSION_NODELESS] {
            let node = |n: String| {
                if version >= VERSION_NODE {
                    n
                } else {
                    String::new()
                }
            };
            for r in requests() {
                let mut old = Vec::new();
                r.encode_for(version, 5, &mut old);
                let h = parse_header(&old, FRAME_LEN_MAX_DEFAULT).unwrap().unwrap();
                let body = &old[HEADER_LEN..];
                let back = PoolRequest::decode_for(version, h.op, body).unwrap();
                let older = match r.clone() {
                    PoolRequest::ServerBeat(b) => PoolRequest::ServerBeat(ServerBeat {
                        node: node(b.node.clone()),
                        ..b
                    }),
                    PoolRequest::ClientBeat(b) => PoolRequest::ClientBeat(ClientBeat {
                        node: node(b.node.clone()),
                        uses: uses_as_of(version, b.uses.clone()),
                        ..b
                    }),
                    other => other,
                };
                assert_eq!(back, older, "{version:#x}");
                let mut new = Vec::new();
                r.encode(5, &mut new);
                if new.len() != old.len() {
                    assert!(PoolRequest::decode(h.op, body).is_err(), "{r:?}");
                    assert!(PoolRequest::decode_for(version, h.op, &new[HEADER_LEN..]).is_err());
                }
            }
            for r in responses() {
                let mut old = Vec::new();
                r.encode_for(version, 5, &mut old);
                let h = parse_header(&old, FRAME_LEN_MAX_DEFAULT).unwrap().unwrap();
                let back = PoolResponse::decode_for(version, h.op, &old[HEADER_LEN..]).unwrap();
                let older = match r.clone() {
                    PoolResponse::StatusOk(mut st) => {
                        for c in &mut st.clients {
                            c.uses = uses_as_of(version, c.uses.clone());
                        }
                        PoolResponse::StatusOk(st)
                    }
                    other => other,
                };
                assert_eq!(back, older, "{version:#x}");
            }
        }
        let id = node_id();
        assert!(id.contains("/net:"), "{id}");
        assert_eq!(id, node_id(), "the same process, the same node");
    }

    #[test]
    fn every_prefix_is_truncated_and_a_byte_more_trailing() {
        let frames = requests()
            .iter()
            .map(|r| {
                let mut b = Vec::new();
                r.encode(0, &mut b);
                (true, b)
            })
            .chain(responses().iter().map(|r| {
                let mut b = Vec::new();
                r.encode(0, &mut b);
                (false, b)
            }))
            .collect::<Vec<_>>();
        for (request, frame) in frames {
            let op = parse_header(&frame, u32::MAX).unwrap().unwrap().op;
            let decode = |body: &[u8]| {
                if request {
                    PoolRequest::decode(op, body).map(drop)
                } else {
                    PoolResponse::decode(op, body).map(drop)
                }
            };
            let body = &frame[HEADER_LEN..];
            assert_eq!(decode(body), Ok(()));
            for n in 0..body.len() {
                assert!(decode(&body[..n]).is_err(), "{op:?} cut to {n} bytes");
            }
            let mut long = body.to_vec();
            long.push(0);
            assert!(decode(&long).is_err(), "{op:?} with a byte more");
        }
    }

    #[test]
    fn counts_beyond_the_body_or_the_limit_are_refused_before_allocating() {
        let mut body = 1000u32.to_le_bytes().to_vec();
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&(SERVERS_MAX as u32).to_le_bytes());
        assert!(matches!(
            PoolResponse::decode(Op::PoolClientAck, &body),
            Err(ProtoError::Truncated { .. })
        ));
        body[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            PoolResponse::decode(Op::PoolClientAck, &body),
            Err(ProtoError::Invalid(_))
        ));
        let mut name = (NAME_LEN_MAX as u16 + 1).to_le_bytes().to_vec();
        name.extend(vec![b'a'; NAME_LEN_MAX + 1]);
        assert!(PoolRequest::decode(Op::PoolDrain, &name).is_err());
        assert!(
            PoolRequest::decode(Op::PoolDrain, &[1, 0, 0xFF]).is_err(),
            "not UTF-8"
        );
    }

    #[test]
    fn memory_server_frames_are_not_pool_frames() {
        assert!(matches!(
            PoolRequest::decode(Op::Read, &[0; 12]),
            Err(ProtoError::WrongDirection(Op::Read))
        ));
        assert!(crate::Request::decode(Op::PoolStatus, &[]).is_err());
        assert!(crate::Response::decode(Op::PoolStatusOk, &[0; 12]).is_err());
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics() {
        let mut x: u64 = 0x2545F4914F6CDD1D;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 96) as usize;
            let body: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            let op = [
                Op::PoolServerBeat,
                Op::PoolClientBeat,
                Op::PoolStatus,
                Op::PoolDrain,
                Op::PoolServerAck,
                Op::PoolClientAck,
                Op::PoolStatusOk,
                Op::PoolDrainOk,
                Op::Error,
            ][(x >> 56) as usize % 9];
            let _ = PoolRequest::decode(op, &body);
            let _ = PoolResponse::decode(op, &body);
        }
    }
}
