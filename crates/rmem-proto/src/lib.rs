//! rmem-proto: the wire protocol spoken between the client runtime and memory servers.
//!
//! Entry points: [`Request::encode`] / [`Request::decode`] on the client and server side,
//! [`Response::encode`] / [`Response::decode`], and [`parse_header`] to frame a byte stream.
//!
//! Every frame is a fixed 16-byte [`Header`] followed by `len` body bytes:
//!
//! ```text
//! offset 0  u32 len    body length, checked against the receiver's max frame size
//! offset 4  u8  op     request or response code (see [`Op`])
//! offset 5  u8  flags  reserved, must be 0
//! offset 6  u16 rsvd   reserved, must be 0
//! offset 8  u64 tag    request id chosen by the client, echoed in the response
//! ```
//!
//! All integers are little-endian. A connection opens with a challenge and response that
//! never sends the shared token ([`auth`]): `Hello` (magic, protocol version, unit size, the
//! client's nonce) is answered by `Challenge` (the server's nonce), `Auth` (the client's
//! proof) by `Welcome` (the server's limits and proof) or `Error`. After that the client may
//! attaches a session (`Attach`: a 128-bit id of its choosing and a lease; pages belong to the
//! session, not to the connection, so a client that reconnects within the lease finds them),
//! then keeps many requests in flight; the server answers each connection's requests in order.
//! `Read` and `Write` carry `count` consecutive pages, and `Swap` writes a victim and reads a
//! page in one round trip (DLM's swap). `ReadRange` and `WriteRange` (version 6) move `len`
//! bytes at any `offset` inside one page, so a 100-byte read of a direct region moves about
//! 100 bytes, not a page; a range of a page the session does not hold reads as zeros, and a
//! range written to one creates it zero-filled. `Snapshot` names a copy-on-write snapshot of the
//! attached session as of that point of the connection's requests (a `fork()` child's pages),
//! which a connection attaches with [`ATTACH_SNAPSHOT`] and its creator ends with
//! `EndSnapshot`. `Pull` (version 7) has the server copy pages of the client's session on
//! another server into this one (a drain's move, server to server; the other server is read
//! with an [`ATTACH_PEEK`] attach). Decoding never trusts a length: every field is bounds-checked, and trailing
//! bytes are an error.
#![forbid(unsafe_code)]

pub mod auth;
pub mod pool;
pub mod size;

use auth::{Nonce, Proof};

use std::fmt;

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 16;
/// Magic bytes that open a `Hello` body.
pub const MAGIC: [u8; 4] = *b"RMEM";
/// Protocol version spoken by this build. Bumped on any incompatible change (4: units of any
/// size; 5: snapshots; 6: byte ranges; 7: pulls between servers).
pub const VERSION: u16 = 8;
/// Largest error message carried in an `Error` frame.
pub const MESSAGE_LEN_MAX: usize = 1024;
/// Default upper bound on a frame body: 16 MiB of pages plus room for the fixed fields.
pub const FRAME_LEN_MAX_DEFAULT: u32 = 16 * 1024 * 1024 + 64;
/// Smallest and largest page sizes the protocol accepts (the DLM page size range).
pub const PAGE_SIZE_MIN: u32 = 4096;
pub const PAGE_SIZE_MAX: u32 = 4 * 1024 * 1024;
/// What a server stores per key is a unit of the size the client names in `Hello`: a whole
/// page, a page and its seal, or one erasure-coded fragment of one. Units are a multiple of
/// [`UNIT_ALIGN`] bytes, from [`UNIT_LEN_MIN`] up to a largest page with room for a seal.
pub const UNIT_ALIGN: u32 = 8;
pub const UNIT_LEN_MIN: u32 = 64;
pub const UNIT_LEN_MAX: u32 = PAGE_SIZE_MAX + 4096;

/// Whether a server stores units of `len` bytes.
pub fn unit_len_ok(len: u32) -> bool {
    len.is_multiple_of(UNIT_ALIGN) && (UNIT_LEN_MIN..=UNIT_LEN_MAX).contains(&len)
}
/// Most keys one `Free` request may carry.
pub const FREE_KEYS_MAX: usize = 65536;
/// Most keys one `Pull` request may carry.
pub const PULL_KEYS_MAX: usize = 1024;
/// Longest server address a `Pull` names (`ip:port`).
pub const PULL_FROM_MAX: usize = 255;
/// The message of a `Pulled` answer whose server stopped because it had no room for the next
/// page (the pull itself worked): the client places the rest elsewhere, where any other
/// message means the server could not pull and the rest moves through the client.
pub const PULLED_FULL: &str = "this server is full";
/// Most sessions one `StatusOk` lists (the largest first); `sessions_total` counts them all.
pub const STATUS_SESSIONS_MAX: usize = 65536;

/// A page's name on a server: the client's page index. Servers treat it as opaque.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageKey(pub u64);

/// A session's name on a server: 128 random bits chosen by the client. Pages are kept per
/// session; any number of connections may attach the same session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u128);

impl SessionId {
    /// A fresh random id (the operating system's random source).
    pub fn random() -> Result<SessionId, std::io::Error> {
        let mut b = [0u8; 16];
        getrandom::getrandom(&mut b).map_err(std::io::Error::from)?;
        Ok(SessionId(u128::from_le_bytes(b)))
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// `Attach` flag: fence every other connection attached to the session. A request those
/// connections still have buffered is never applied after this attach; they are closed. A
/// client that reconnects sets it, so that nothing it sent on the dropped connection can
/// land after what it re-sends on the new one.
pub const ATTACH_EXCLUSIVE: u32 = 1;
/// `Attach` flag: the session is a snapshot that another connection creates (`Snapshot`, sent
/// by a `fork()` child's parent): never create it, and wait up to [`SNAPSHOT_WAIT_MS`] for it
/// to appear (the parent's request may still be on its way); `SessionLost` if it does not.
pub const ATTACH_SNAPSHOT: u32 = 2;
/// `Attach` flag: read an existing session on its owner's behalf (another server pulling its
/// pages, see `Pull`): never create it, leave its lease as it is, fence nobody. Refused with
/// `SessionLost` when the session is not there; the attachment is fenced like any other by
/// the owner's next exclusive attach.
pub const ATTACH_PEEK: u32 = 4;
/// Every `Attach` flag this version knows; any other bit is refused (room for later ones).
pub const ATTACH_FLAGS_KNOWN: u32 = ATTACH_EXCLUSIVE | ATTACH_SNAPSHOT | ATTACH_PEEK;
/// Longest a server waits, answering an `Attach` with [`ATTACH_SNAPSHOT`], for the snapshot to
/// be created.
pub const SNAPSHOT_WAIT_MS: u64 = 5000;
/// `Attached` flag: the session existed (its pages are there); clear for a new session.
pub const ATTACHED_EXISTED: u32 = 1;
/// `Attached` flag: the server keeps its sessions across its own restart (a persisted disk
/// store, `--store file:PATH,persist`). A client that finds nothing listening on its port
/// goes on trying within its reconnection window rather than taking the session as gone.
pub const ATTACHED_PERSISTS: u32 = 2;

/// Frame operation codes. Requests have the high bit clear, responses set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Hello = 0x01,
    Read = 0x02,
    Write = 0x03,
    Swap = 0x04,
    Free = 0x05,
    Ping = 0x06,
    Auth = 0x07,
    Attach = 0x08,
    EndSession = 0x09,
    Status = 0x0A,
    Snapshot = 0x0B,
    EndSnapshot = 0x0C,
    ReadRange = 0x0D,
    WriteRange = 0x0E,
    Pull = 0x0F,
    ReadPart = 0x10,
    /// The pool manager's protocol ([`pool`]): same frames and handshake, its own version.
    PoolServerBeat = 0x20,
    PoolClientBeat = 0x21,
    PoolStatus = 0x22,
    PoolDrain = 0x23,
    Welcome = 0x81,
    ReadOk = 0x82,
    WriteOk = 0x83,
    SwapOk = 0x84,
    FreeOk = 0x85,
    Pong = 0x86,
    Challenge = 0x87,
    Attached = 0x88,
    SessionEnded = 0x89,
    StatusOk = 0x8A,
    SnapshotOk = 0x8B,
    ReadRangeOk = 0x8D,
    WriteRangeOk = 0x8E,
    Pulled = 0x8F,
    PoolServerAck = 0xA0,
    PoolClientAck = 0xA1,
    PoolStatusOk = 0xA2,
    PoolDrainOk = 0xA3,
    Error = 0xFF,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            0x01 => Op::Hello,
            0x02 => Op::Read,
            0x03 => Op::Write,
            0x04 => Op::Swap,
            0x05 => Op::Free,
            0x06 => Op::Ping,
            0x07 => Op::Auth,
            0x08 => Op::Attach,
            0x09 => Op::EndSession,
            0x0A => Op::Status,
            0x0B => Op::Snapshot,
            0x0C => Op::EndSnapshot,
            0x0D => Op::ReadRange,
            0x0E => Op::WriteRange,
            0x0F => Op::Pull,
            0x10 => Op::ReadPart,
            0x20 => Op::PoolServerBeat,
            0x21 => Op::PoolClientBeat,
            0x22 => Op::PoolStatus,
            0x23 => Op::PoolDrain,
            0x81 => Op::Welcome,
            0x82 => Op::ReadOk,
            0x83 => Op::WriteOk,
            0x84 => Op::SwapOk,
            0x85 => Op::FreeOk,
            0x86 => Op::Pong,
            0x87 => Op::Challenge,
            0x88 => Op::Attached,
            0x89 => Op::SessionEnded,
            0x8A => Op::StatusOk,
            0x8B => Op::SnapshotOk,
            0x8D => Op::ReadRangeOk,
            0x8E => Op::WriteRangeOk,
            0x8F => Op::Pulled,
            0xA0 => Op::PoolServerAck,
            0xA1 => Op::PoolClientAck,
            0xA2 => Op::PoolStatusOk,
            0xA3 => Op::PoolDrainOk,
            0xFF => Op::Error,
            _ => return None,
        })
    }
}

/// Error codes carried by an `Error` response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    /// The token did not match.
    Unauthorized = 1,
    /// The client speaks a protocol version the server does not.
    VersionMismatch = 2,
    /// Storing the pages would exceed the server's capacity; nothing was stored.
    Full = 3,
    /// A read named a page the server does not hold.
    NotFound = 4,
    /// The request was well-framed but invalid (wrong data length, bad page size, ...).
    BadRequest = 5,
    /// Anything else.
    Internal = 6,
    /// The session's lease expired (or it was ended): its pages are gone.
    SessionLost = 7,
}

impl ErrorCode {
    pub fn from_u16(v: u16) -> ErrorCode {
        match v {
            1 => ErrorCode::Unauthorized,
            2 => ErrorCode::VersionMismatch,
            3 => ErrorCode::Full,
            4 => ErrorCode::NotFound,
            5 => ErrorCode::BadRequest,
            7 => ErrorCode::SessionLost,
            _ => ErrorCode::Internal,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::VersionMismatch => "protocol version mismatch",
            ErrorCode::Full => "server full",
            ErrorCode::NotFound => "page not found",
            ErrorCode::BadRequest => "bad request",
            ErrorCode::Internal => "internal error",
            ErrorCode::SessionLost => "session lost",
        };
        f.write_str(s)
    }
}

/// Why a frame was rejected. The receiver closes the connection on any of these.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    /// frame length {len} exceeds the limit of {max} bytes
    #[error("frame length {len} exceeds the limit of {max} bytes")]
    Oversized { len: u32, max: u32 },
    #[error("unknown operation code {0:#04x}")]
    UnknownOp(u8),
    #[error("reserved header bits are set")]
    ReservedBits,
    #[error("{op:?} body is truncated: need {need} bytes, have {have}")]
    Truncated { op: Op, need: usize, have: usize },
    #[error("{op:?} body has {extra} trailing bytes")]
    Trailing { op: Op, extra: usize },
    #[error("bad magic in hello")]
    BadMagic,
    #[error("{0}")]
    Invalid(&'static str),
    #[error("{0:?} is not valid in this direction")]
    WrongDirection(Op),
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub len: u32,
    pub op: Op,
    pub tag: u64,
}

impl Header {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.len.to_le_bytes());
        out.push(self.op as u8);
        out.push(0);
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.tag.to_le_bytes());
    }
}

/// Parse a header from the front of `buf`. `Ok(None)` means fewer than [`HEADER_LEN`] bytes
/// are buffered yet. A length above `frame_len_max` or a bad op is an error.
pub fn parse_header(buf: &[u8], frame_len_max: u32) -> Result<Option<Header>, ProtoError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().unwrap());
    let op = Op::from_u8(buf[4]).ok_or(ProtoError::UnknownOp(buf[4]))?;
    if buf[5] != 0 || buf[6] != 0 || buf[7] != 0 {
        return Err(ProtoError::ReservedBits);
    }
    if len > frame_len_max {
        return Err(ProtoError::Oversized {
            len,
            max: frame_len_max,
        });
    }
    let tag = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    Ok(Some(Header { len, op, tag }))
}

/// Bounds-checked little-endian reader over a frame body.
struct Cursor<'a> {
    op: Op,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(op: Op, buf: &'a [u8]) -> Self {
        Cursor { op, buf, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(ProtoError::Truncated {
                op: self.op,
                need: self.pos.saturating_add(n),
                have: self.buf.len(),
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        Ok(self.take(N)?.try_into().unwrap())
    }
    /// A u16 length and that many bytes of UTF-8, at most [`MESSAGE_LEN_MAX`].
    fn message(&mut self) -> Result<&'a str, ProtoError> {
        let n = self.u16()? as usize;
        if n > MESSAGE_LEN_MAX {
            return Err(ProtoError::Invalid("message too long"));
        }
        std::str::from_utf8(self.take(n)?).map_err(|_| ProtoError::Invalid("message is not UTF-8"))
    }

    fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    fn finish(self) -> Result<(), ProtoError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            extra => Err(ProtoError::Trailing { op: self.op, extra }),
        }
    }
}

/// A request from a client. Page payloads borrow from the receive buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// Opens a connection: the client's protocol version, the size of what it stores per key
    /// (`page_size`: a page, a sealed page or a fragment; see [`unit_len_ok`]) and nonce.
    Hello {
        version: u16,
        page_size: u32,
        nonce: Nonce,
    },
    /// The client's proof that it knows the token (see [`auth`]), answering `Challenge`.
    Auth {
        proof: Proof,
    },
    /// Attach this connection to `session`, creating it if the server has none by that id.
    /// `lease_ms` 0 asks for the server's lease. `flags`: [`ATTACH_EXCLUSIVE`]. `reserved`
    /// must be 0: room for a manager that moves a session's pages between servers (say, the
    /// epoch of a move), which a later version will define.
    Attach {
        session: SessionId,
        lease_ms: u32,
        flags: u32,
        reserved: u64,
    },
    /// End the attached session now: its pages are freed (a client's clean exit).
    EndSession,
    /// The server's capacity, use and sessions (`rmem status`); valid without `Attach`.
    Status,
    /// Read `count` consecutive pages starting at `key`.
    Read {
        key: PageKey,
        count: u32,
    },
    /// Store `count` consecutive pages starting at `key`; `data` is `count` pages.
    Write {
        key: PageKey,
        count: u32,
        data: &'a [u8],
    },
    /// Store one page under `write_key`, then read `read_key`: one round trip for a swap.
    Swap {
        write_key: PageKey,
        read_key: PageKey,
        data: &'a [u8],
    },
    /// Forget these pages (their space returns to the server).
    Free {
        keys: Vec<PageKey>,
    },
    Ping,
    /// Create `session` as a copy-on-write snapshot of the attached session as it is after
    /// every earlier request of this connection: reads in `session` see those pages, and
    /// later writes and frees of either session do not reach the other. Nothing is copied:
    /// the two share page slots until one of them writes. Idempotent (a re-sent request finds
    /// the snapshot there). A `fork()` child's memory: its parent sends this at the fork.
    Snapshot {
        session: SessionId,
    },
    /// End `session`, a snapshot taken from the attached session (or from one of its own
    /// snapshots): its pages are freed. A `fork()` parent sends this when the child is gone.
    /// Answered with `SessionEnded`; 0 bytes if it was gone already.
    EndSnapshot {
        session: SessionId,
    },
    /// Read `len` bytes at `offset` of page `key` (`offset + len` within the page; `len` at
    /// least 1). A page the session does not hold reads as zeros.
    ReadRange {
        key: PageKey,
        offset: u32,
        len: u32,
    },
    /// As `ReadRange`, of a page the session must hold: `NotFound` if it does not (version
    /// 8). A paging client's sub-page fetch, where a missing page is a lost one, never zeros.
    ReadPart {
        key: PageKey,
        offset: u32,
        len: u32,
    },
    /// Write `data` at `offset` of page `key` (within the page, at least one byte); the rest
    /// of the page keeps its bytes, or zeros if the session did not hold it (it is created,
    /// taking a page of capacity).
    WriteRange {
        key: PageKey,
        offset: u32,
        data: &'a [u8],
    },
    /// Copy `keys` of `session` on server `from` (an IP address and port, never a name)
    /// into the attached session
    /// here, as they are: this server connects to `from` with its own token, attaches
    /// `session` there with [`ATTACH_PEEK`] and reads them. A drain moves pages this way,
    /// between servers, without their bytes crossing the client. Answered with `Pulled`
    /// (how many of the keys, in order, are stored) after at most `deadline_ms`. Like every
    /// request of a connection it is answered in order: the client's later requests here
    /// see the pulled pages.
    Pull {
        from: &'a str,
        session: SessionId,
        deadline_ms: u32,
        keys: Vec<PageKey>,
    },
}

impl Request<'_> {
    pub fn op(&self) -> Op {
        match self {
            Request::Hello { .. } => Op::Hello,
            Request::Auth { .. } => Op::Auth,
            Request::Attach { .. } => Op::Attach,
            Request::EndSession => Op::EndSession,
            Request::Status => Op::Status,
            Request::Read { .. } => Op::Read,
            Request::Write { .. } => Op::Write,
            Request::Swap { .. } => Op::Swap,
            Request::Free { .. } => Op::Free,
            Request::Ping => Op::Ping,
            Request::Snapshot { .. } => Op::Snapshot,
            Request::EndSnapshot { .. } => Op::EndSnapshot,
            Request::ReadRange { .. } => Op::ReadRange,
            Request::ReadPart { .. } => Op::ReadPart,
            Request::WriteRange { .. } => Op::WriteRange,
            Request::Pull { .. } => Op::Pull,
        }
    }

    /// Append the whole frame (header and body) to `out`.
    pub fn encode(&self, tag: u64, out: &mut Vec<u8>) {
        let start = out.len();
        Header {
            len: 0,
            op: self.op(),
            tag,
        }
        .encode(out);
        match self {
            Request::Hello {
                version,
                page_size,
                nonce,
            } => {
                out.extend_from_slice(&MAGIC);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&0u16.to_le_bytes());
                out.extend_from_slice(&page_size.to_le_bytes());
                out.extend_from_slice(nonce);
            }
            Request::Auth { proof } => out.extend_from_slice(proof),
            Request::Attach {
                session,
                lease_ms,
                flags,
                reserved,
            } => {
                out.extend_from_slice(&session.0.to_le_bytes());
                out.extend_from_slice(&lease_ms.to_le_bytes());
                out.extend_from_slice(&flags.to_le_bytes());
                out.extend_from_slice(&reserved.to_le_bytes());
            }
            Request::EndSession | Request::Status => {}
            Request::Read { key, count } => {
                out.extend_from_slice(&key.0.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
            Request::Write { key, count, data } => {
                out.extend_from_slice(&key.0.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
                rmem_copy::extend(out, data);
            }
            Request::Swap {
                write_key,
                read_key,
                data,
            } => {
                out.extend_from_slice(&write_key.0.to_le_bytes());
                out.extend_from_slice(&read_key.0.to_le_bytes());
                rmem_copy::extend(out, data);
            }
            Request::Free { keys } => {
                out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
                for k in keys {
                    out.extend_from_slice(&k.0.to_le_bytes());
                }
            }
            Request::Ping => {}
            Request::Snapshot { session } | Request::EndSnapshot { session } => {
                out.extend_from_slice(&session.0.to_le_bytes())
            }
            Request::ReadRange { key, offset, len } | Request::ReadPart { key, offset, len } => {
                out.extend_from_slice(&key.0.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
            }
            Request::WriteRange { key, offset, data } => {
                out.extend_from_slice(&key.0.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                rmem_copy::extend(out, data);
            }
            Request::Pull {
                from,
                session,
                deadline_ms,
                keys,
            } => {
                let from = truncate_utf8(from, PULL_FROM_MAX);
                out.push(from.len() as u8);
                out.extend_from_slice(from.as_bytes());
                out.extend_from_slice(&session.0.to_le_bytes());
                out.extend_from_slice(&deadline_ms.to_le_bytes());
                out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
                for k in keys {
                    out.extend_from_slice(&k.0.to_le_bytes());
                }
            }
        }
        patch_len(out, start);
    }

    /// Decode a request body. Page payload lengths are checked by the caller, which knows
    /// the connection's page size.
    pub fn decode(op: Op, body: &[u8]) -> Result<Request<'_>, ProtoError> {
        let mut c = Cursor::new(op, body);
        let req = match op {
            Op::Hello => {
                if c.take(4)? != MAGIC {
                    return Err(ProtoError::BadMagic);
                }
                let version = c.u16()?;
                let _reserved = c.u16()?;
                Request::Hello {
                    version,
                    page_size: c.u32()?,
                    nonce: c.array()?,
                }
            }
            Op::Auth => Request::Auth { proof: c.array()? },
            Op::Attach => Request::Attach {
                session: SessionId(u128::from_le_bytes(c.array()?)),
                lease_ms: c.u32()?,
                flags: c.u32()?,
                reserved: c.u64()?,
            },
            Op::EndSession => Request::EndSession,
            Op::Status => Request::Status,
            Op::Read => Request::Read {
                key: PageKey(c.u64()?),
                count: c.u32()?,
            },
            Op::Write => Request::Write {
                key: PageKey(c.u64()?),
                count: c.u32()?,
                data: c.rest(),
            },
            Op::Swap => Request::Swap {
                write_key: PageKey(c.u64()?),
                read_key: PageKey(c.u64()?),
                data: c.rest(),
            },
            Op::Free => {
                let n = c.u32()? as usize;
                if n > FREE_KEYS_MAX {
                    return Err(ProtoError::Invalid("too many keys in free"));
                }
                let mut keys = Vec::with_capacity(n);
                for _ in 0..n {
                    keys.push(PageKey(c.u64()?));
                }
                Request::Free { keys }
            }
            Op::Ping => Request::Ping,
            Op::Snapshot => Request::Snapshot {
                session: SessionId(u128::from_le_bytes(c.array()?)),
            },
            Op::EndSnapshot => Request::EndSnapshot {
                session: SessionId(u128::from_le_bytes(c.array()?)),
            },
            Op::ReadRange => Request::ReadRange {
                key: PageKey(c.u64()?),
                offset: c.u32()?,
                len: c.u32()?,
            },
            Op::ReadPart => Request::ReadPart {
                key: PageKey(c.u64()?),
                offset: c.u32()?,
                len: c.u32()?,
            },
            Op::WriteRange => Request::WriteRange {
                key: PageKey(c.u64()?),
                offset: c.u32()?,
                data: c.rest(),
            },
            Op::Pull => {
                let n = c.take(1)?[0] as usize;
                let from = std::str::from_utf8(c.take(n)?)
                    .map_err(|_| ProtoError::Invalid("pull address is not UTF-8"))?;
                let session = SessionId(u128::from_le_bytes(c.array()?));
                let deadline_ms = c.u32()?;
                let n = c.u32()? as usize;
                if n > PULL_KEYS_MAX {
                    return Err(ProtoError::Invalid("too many keys in pull"));
                }
                let mut keys = Vec::with_capacity(n);
                for _ in 0..n {
                    keys.push(PageKey(c.u64()?));
                }
                Request::Pull {
                    from,
                    session,
                    deadline_ms,
                    keys,
                }
            }
            other => return Err(ProtoError::WrongDirection(other)),
        };
        c.finish()?;
        Ok(req)
    }
}

/// A server's state as `Status` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStatus {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    /// The server's lease (`--lease`).
    pub lease_ms: u64,
    /// Sessions on the server; `sessions` lists at most [`STATUS_SESSIONS_MAX`] of them.
    pub sessions_total: u32,
    pub sessions: Vec<SessionStatus>,
}

/// One session in a [`ServerStatus`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionStatus {
    pub id: SessionId,
    pub used_bytes: u64,
    /// Milliseconds since its lease was last renewed.
    pub lease_age_ms: u64,
    pub connections: u32,
}

impl ServerStatus {
    fn encode(&self, out: &mut Vec<u8>) {
        let listed = self.sessions.len().min(STATUS_SESSIONS_MAX);
        out.extend_from_slice(&self.capacity_bytes.to_le_bytes());
        out.extend_from_slice(&self.used_bytes.to_le_bytes());
        out.extend_from_slice(&self.lease_ms.to_le_bytes());
        out.extend_from_slice(&self.sessions_total.to_le_bytes());
        out.extend_from_slice(&(listed as u32).to_le_bytes());
        for s in &self.sessions[..listed] {
            out.extend_from_slice(&s.id.0.to_le_bytes());
            out.extend_from_slice(&s.used_bytes.to_le_bytes());
            out.extend_from_slice(&s.lease_age_ms.to_le_bytes());
            out.extend_from_slice(&s.connections.to_le_bytes());
        }
    }

    fn decode(c: &mut Cursor<'_>) -> Result<ServerStatus, ProtoError> {
        let mut st = ServerStatus {
            capacity_bytes: c.u64()?,
            used_bytes: c.u64()?,
            lease_ms: c.u64()?,
            sessions_total: c.u32()?,
            sessions: Vec::new(),
        };
        let listed = c.u32()? as usize;
        if listed > STATUS_SESSIONS_MAX {
            return Err(ProtoError::Invalid("too many sessions in status"));
        }
        // Checked against what the body holds before anything is allocated.
        let entry = 16 + 8 + 8 + 4;
        if c.buf.len() - c.pos < listed * entry {
            return Err(ProtoError::Truncated {
                op: c.op,
                need: c.pos + listed * entry,
                have: c.buf.len(),
            });
        }
        st.sessions.reserve(listed);
        for _ in 0..listed {
            st.sessions.push(SessionStatus {
                id: SessionId(u128::from_le_bytes(c.array()?)),
                used_bytes: c.u64()?,
                lease_age_ms: c.u64()?,
                connections: c.u32()?,
            });
        }
        Ok(st)
    }
}

/// A response from a server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    /// Answers `Hello`: the server's nonce.
    Challenge {
        nonce: Nonce,
    },
    /// Answers `Attach`: the lease granted, [`ATTACHED_EXISTED`], and the bytes the session
    /// holds.
    Attached {
        lease_ms: u32,
        flags: u32,
        session_bytes: u64,
    },
    /// Answers `EndSession`: the bytes freed.
    SessionEnded {
        freed_bytes: u64,
    },
    /// Answers `Status`.
    StatusOk(ServerStatus),
    /// Answers `Snapshot`: whether it was created now (false: a re-sent request found it).
    SnapshotOk {
        created: bool,
    },
    /// Answers a good `Auth`: the server's limits and its own proof.
    Welcome {
        version: u16,
        frame_len_max: u32,
        capacity_bytes: u64,
        used_bytes: u64,
        proof: Proof,
    },
    ReadOk {
        key: PageKey,
        count: u32,
        data: &'a [u8],
    },
    WriteOk {
        key: PageKey,
        count: u32,
    },
    SwapOk {
        read_key: PageKey,
        data: &'a [u8],
    },
    FreeOk {
        count: u32,
    },
    Pong {
        used_bytes: u64,
        capacity_bytes: u64,
    },
    /// Answers `ReadRange`: the bytes asked, `offset` into page `key`.
    ReadRangeOk {
        key: PageKey,
        offset: u32,
        data: &'a [u8],
    },
    /// Answers `WriteRange`: `len` bytes at `offset` of page `key` are stored.
    WriteRangeOk {
        key: PageKey,
        offset: u32,
        len: u32,
    },
    /// Answers `Pull`: the first `stored` keys are stored here; when that is not all of
    /// them, `message` says why the rest are not (the other server unreachable or without
    /// them, this one full, the deadline).
    Pulled {
        stored: u32,
        message: &'a str,
    },
    Error {
        code: ErrorCode,
        message: &'a str,
    },
}

impl Response<'_> {
    pub fn op(&self) -> Op {
        match self {
            Response::Challenge { .. } => Op::Challenge,
            Response::Attached { .. } => Op::Attached,
            Response::SessionEnded { .. } => Op::SessionEnded,
            Response::StatusOk(_) => Op::StatusOk,
            Response::SnapshotOk { .. } => Op::SnapshotOk,
            Response::Welcome { .. } => Op::Welcome,
            Response::ReadOk { .. } => Op::ReadOk,
            Response::WriteOk { .. } => Op::WriteOk,
            Response::SwapOk { .. } => Op::SwapOk,
            Response::FreeOk { .. } => Op::FreeOk,
            Response::Pong { .. } => Op::Pong,
            Response::ReadRangeOk { .. } => Op::ReadRangeOk,
            Response::WriteRangeOk { .. } => Op::WriteRangeOk,
            Response::Pulled { .. } => Op::Pulled,
            Response::Error { .. } => Op::Error,
        }
    }

    /// Append the whole frame to `out`.
    pub fn encode(&self, tag: u64, out: &mut Vec<u8>) {
        let start = out.len();
        Header {
            len: 0,
            op: self.op(),
            tag,
        }
        .encode(out);
        match self {
            Response::Challenge { nonce } => out.extend_from_slice(nonce),
            Response::Attached {
                lease_ms,
                flags,
                session_bytes,
            } => {
                out.extend_from_slice(&lease_ms.to_le_bytes());
                out.extend_from_slice(&flags.to_le_bytes());
                out.extend_from_slice(&session_bytes.to_le_bytes());
            }
            Response::SessionEnded { freed_bytes } => {
                out.extend_from_slice(&freed_bytes.to_le_bytes())
            }
            Response::StatusOk(st) => st.encode(out),
            Response::SnapshotOk { created } => out.push(u8::from(*created)),
            Response::Welcome {
                version,
                frame_len_max,
                capacity_bytes,
                used_bytes,
                proof,
            } => {
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&0u16.to_le_bytes());
                out.extend_from_slice(&frame_len_max.to_le_bytes());
                out.extend_from_slice(&capacity_bytes.to_le_bytes());
                out.extend_from_slice(&used_bytes.to_le_bytes());
                out.extend_from_slice(proof);
            }
            Response::ReadOk { key, count, data } => {
                out.extend_from_slice(&key.0.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
                rmem_copy::extend(out, data);
            }
            Response::WriteOk { key, count } => {
                out.extend_from_slice(&key.0.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
            Response::SwapOk { read_key, data } => {
                out.extend_from_slice(&read_key.0.to_le_bytes());
                rmem_copy::extend(out, data);
            }
            Response::FreeOk { count } => out.extend_from_slice(&count.to_le_bytes()),
            Response::Pong {
                used_bytes,
                capacity_bytes,
            } => {
                out.extend_from_slice(&used_bytes.to_le_bytes());
                out.extend_from_slice(&capacity_bytes.to_le_bytes());
            }
            Response::ReadRangeOk { key, offset, data } => {
                out.extend_from_slice(&key.0.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                rmem_copy::extend(out, data);
            }
            Response::WriteRangeOk { key, offset, len } => {
                out.extend_from_slice(&key.0.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
            }
            Response::Pulled { stored, message } => {
                let m = truncate_utf8(message, MESSAGE_LEN_MAX);
                out.extend_from_slice(&stored.to_le_bytes());
                out.extend_from_slice(&(m.len() as u16).to_le_bytes());
                out.extend_from_slice(m.as_bytes());
            }
            Response::Error { code, message } => {
                let m = truncate_utf8(message, MESSAGE_LEN_MAX);
                out.extend_from_slice(&(*code as u16).to_le_bytes());
                out.extend_from_slice(&(m.len() as u16).to_le_bytes());
                out.extend_from_slice(m.as_bytes());
            }
        }
        patch_len(out, start);
    }

    pub fn decode(op: Op, body: &[u8]) -> Result<Response<'_>, ProtoError> {
        let mut c = Cursor::new(op, body);
        let resp = match op {
            Op::Challenge => Response::Challenge { nonce: c.array()? },
            Op::Attached => Response::Attached {
                lease_ms: c.u32()?,
                flags: c.u32()?,
                session_bytes: c.u64()?,
            },
            Op::SessionEnded => Response::SessionEnded {
                freed_bytes: c.u64()?,
            },
            Op::StatusOk => Response::StatusOk(ServerStatus::decode(&mut c)?),
            Op::SnapshotOk => Response::SnapshotOk {
                created: match c.take(1)?[0] {
                    0 => false,
                    1 => true,
                    _ => return Err(ProtoError::Invalid("snapshot flag is not 0 or 1")),
                },
            },
            Op::Welcome => {
                let version = c.u16()?;
                let _reserved = c.u16()?;
                Response::Welcome {
                    version,
                    frame_len_max: c.u32()?,
                    capacity_bytes: c.u64()?,
                    used_bytes: c.u64()?,
                    proof: c.array()?,
                }
            }
            Op::ReadOk => Response::ReadOk {
                key: PageKey(c.u64()?),
                count: c.u32()?,
                data: c.rest(),
            },
            Op::WriteOk => Response::WriteOk {
                key: PageKey(c.u64()?),
                count: c.u32()?,
            },
            Op::SwapOk => Response::SwapOk {
                read_key: PageKey(c.u64()?),
                data: c.rest(),
            },
            Op::FreeOk => Response::FreeOk { count: c.u32()? },
            Op::Pong => Response::Pong {
                used_bytes: c.u64()?,
                capacity_bytes: c.u64()?,
            },
            Op::ReadRangeOk => Response::ReadRangeOk {
                key: PageKey(c.u64()?),
                offset: c.u32()?,
                data: c.rest(),
            },
            Op::WriteRangeOk => Response::WriteRangeOk {
                key: PageKey(c.u64()?),
                offset: c.u32()?,
                len: c.u32()?,
            },
            Op::Pulled => Response::Pulled {
                stored: c.u32()?,
                message: c.message()?,
            },
            Op::Error => Response::Error {
                code: ErrorCode::from_u16(c.u16()?),
                message: c.message()?,
            },
            other => return Err(ProtoError::WrongDirection(other)),
        };
        c.finish()?;
        Ok(resp)
    }
}

/// Set the length field of the frame starting at `start` in `out` to the bytes after its header
/// (for a sender that appends a body piece by piece).
pub fn patch_len(out: &mut [u8], start: usize) {
    let body = out.len() - start - HEADER_LEN;
    let body = u32::try_from(body).expect("frame body fits in u32");
    out[start..start + 4].copy_from_slice(&body.to_le_bytes());
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::auth::{NONCE_LEN, PROOF_LEN};
    use super::*;

    fn roundtrip_req(r: Request<'_>) {
        let mut buf = Vec::new();
        r.encode(42, &mut buf);
        let h = parse_header(&buf, FRAME_LEN_MAX_DEFAULT).unwrap().unwrap();
        assert_eq!(h.tag, 42);
        assert_eq!(h.len as usize, buf.len() - HEADER_LEN);
        assert_eq!(Request::decode(h.op, &buf[HEADER_LEN..]).unwrap(), r);
    }

    fn roundtrip_resp(r: Response<'_>) {
        let mut buf = Vec::new();
        r.encode(7, &mut buf);
        let h = parse_header(&buf, FRAME_LEN_MAX_DEFAULT).unwrap().unwrap();
        assert_eq!(Response::decode(h.op, &buf[HEADER_LEN..]).unwrap(), r);
    }

    #[test]
    fn requests_roundtrip() {
        let page = vec![0xA5u8; 4096];
        roundtrip_req(Request::Hello {
            version: VERSION,
            page_size: 4096,
            nonce: [7; NONCE_LEN],
        });
        roundtrip_req(Request::Auth {
            proof: [9; PROOF_LEN],
        });
        roundtrip_req(Request::Attach {
            session: SessionId(u128::MAX - 5),
            lease_ms: 2000,
            flags: ATTACH_EXCLUSIVE,
            reserved: 0,
        });
        roundtrip_req(Request::EndSession);
        roundtrip_req(Request::Status);
        roundtrip_req(Request::Read {
            key: PageKey(9),
            count: 3,
        });
        roundtrip_req(Request::Write {
            key: PageKey(1),
            count: 1,
            data: &page,
        });
        roundtrip_req(Request::Swap {
            write_key: PageKey(1),
            read_key: PageKey(2),
            data: &page,
        });
        roundtrip_req(Request::Free {
            keys: vec![PageKey(1), PageKey(u64::MAX)],
        });
        roundtrip_req(Request::Ping);
        roundtrip_req(Request::Snapshot {
            session: SessionId(u128::MAX / 3),
        });
        roundtrip_req(Request::EndSnapshot {
            session: SessionId(17),
        });
        roundtrip_req(Request::ReadRange {
            key: PageKey(5),
            offset: 4001,
            len: 95,
        });
        roundtrip_req(Request::ReadPart {
            key: PageKey(5),
            offset: 4001,
            len: 95,
        });
        roundtrip_req(Request::WriteRange {
            key: PageKey(u64::MAX),
            offset: 3,
            data: &page[..100],
        });
        roundtrip_req(Request::Pull {
            from: "10.0.0.2:7070",
            session: SessionId(u128::MAX - 9),
            deadline_ms: 1500,
            keys: vec![PageKey(4), PageKey(5), PageKey(u64::MAX)],
        });
    }

    #[test]
    fn pull_bodies_are_bounds_checked() {
        let pull = |keys: usize| {
            let mut buf = Vec::new();
            Request::Pull {
                from: "a:1",
                session: SessionId(1),
                deadline_ms: 1,
                keys: (0..keys as u64).map(PageKey).collect(),
            }
            .encode(1, &mut buf);
            buf.split_off(HEADER_LEN)
        };
        assert!(Request::decode(Op::Pull, &pull(PULL_KEYS_MAX)).is_ok());
        assert!(matches!(
            Request::decode(Op::Pull, &pull(PULL_KEYS_MAX + 1)),
            Err(ProtoError::Invalid(_))
        ));
        // An address of more bytes than the frame holds, and one that is not UTF-8.
        let mut body = pull(1);
        body[0] = 200;
        assert!(Request::decode(Op::Pull, &body).is_err());
        let mut body = pull(1);
        body[1] = 0xFF;
        assert!(matches!(
            Request::decode(Op::Pull, &body),
            Err(ProtoError::Invalid(_))
        ));
        // A longer address is cut at the limit when sent.
        let long = "x".repeat(PULL_FROM_MAX + 10);
        let mut buf = Vec::new();
        Request::Pull {
            from: &long,
            session: SessionId(1),
            deadline_ms: 1,
            keys: vec![],
        }
        .encode(1, &mut buf);
        match Request::decode(Op::Pull, &buf[HEADER_LEN..]).unwrap() {
            Request::Pull { from, .. } => assert_eq!(from.len(), PULL_FROM_MAX),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn responses_roundtrip() {
        let page = vec![0x5Au8; 8192];
        roundtrip_resp(Response::Challenge {
            nonce: [3; NONCE_LEN],
        });
        roundtrip_resp(Response::Attached {
            lease_ms: 30_000,
            flags: ATTACHED_EXISTED,
            session_bytes: 1 << 33,
        });
        roundtrip_resp(Response::SessionEnded { freed_bytes: 9 });
        roundtrip_resp(Response::SnapshotOk { created: true });
        roundtrip_resp(Response::SnapshotOk { created: false });
        assert!(Response::decode(Op::SnapshotOk, &[2]).is_err());
        roundtrip_resp(Response::StatusOk(ServerStatus {
            capacity_bytes: 1 << 34,
            used_bytes: 4096,
            lease_ms: 30_000,
            sessions_total: 2,
            sessions: vec![
                SessionStatus {
                    id: SessionId(1 << 100),
                    used_bytes: 4096,
                    lease_age_ms: 250,
                    connections: 1,
                },
                SessionStatus {
                    id: SessionId(3),
                    used_bytes: 0,
                    lease_age_ms: 0,
                    connections: 0,
                },
            ],
        }));
        roundtrip_resp(Response::Welcome {
            version: 1,
            frame_len_max: 99,
            capacity_bytes: 1 << 40,
            used_bytes: 3,
            proof: [4; PROOF_LEN],
        });
        roundtrip_resp(Response::ReadOk {
            key: PageKey(3),
            count: 2,
            data: &page,
        });
        roundtrip_resp(Response::WriteOk {
            key: PageKey(3),
            count: 2,
        });
        roundtrip_resp(Response::SwapOk {
            read_key: PageKey(3),
            data: &page[..4096],
        });
        roundtrip_resp(Response::FreeOk { count: 5 });
        roundtrip_resp(Response::Pong {
            used_bytes: 1,
            capacity_bytes: 2,
        });
        roundtrip_resp(Response::ReadRangeOk {
            key: PageKey(5),
            offset: 4001,
            data: &page[..95],
        });
        roundtrip_resp(Response::Pulled {
            stored: 3,
            message: "10.0.0.2:7070 does not answer",
        });
        roundtrip_resp(Response::WriteRangeOk {
            key: PageKey(5),
            offset: 7,
            len: 100,
        });
        roundtrip_resp(Response::Error {
            code: ErrorCode::Full,
            message: "server full",
        });
    }

    #[test]
    fn range_bodies_are_bounds_checked() {
        // The fixed fields of each range frame: every shorter body is truncated; the fixed-size
        // ones refuse a byte more, the ones with data take the rest as data.
        for (op, fixed, data_rest) in [
            (Op::ReadRange, 16, false),
            (Op::ReadPart, 16, false),
            (Op::WriteRange, 12, true),
            (Op::ReadRangeOk, 12, true),
            (Op::WriteRangeOk, 16, false),
        ] {
            let decode = |body: &[u8]| match op {
                Op::ReadRange | Op::ReadPart | Op::WriteRange => {
                    Request::decode(op, body).map(|_| ())
                }
                _ => Response::decode(op, body).map(|_| ()),
            };
            for n in 0..fixed {
                assert!(
                    matches!(decode(&vec![0; n]), Err(ProtoError::Truncated { .. })),
                    "{op:?} cut to {n} bytes"
                );
            }
            assert_eq!(decode(&vec![0; fixed]), Ok(()));
            let long = decode(&vec![0; fixed + 1]);
            if data_rest {
                assert_eq!(long, Ok(()));
            } else {
                assert!(matches!(long, Err(ProtoError::Trailing { extra: 1, .. })));
            }
        }
        assert!(matches!(
            Response::decode(Op::ReadRange, &[0; 16]),
            Err(ProtoError::WrongDirection(Op::ReadRange))
        ));
        assert!(matches!(
            Request::decode(Op::WriteRangeOk, &[0; 16]),
            Err(ProtoError::WrongDirection(Op::WriteRangeOk))
        ));
    }

    #[test]
    fn oversized_and_garbage_headers_are_rejected() {
        let mut buf = Vec::new();
        Request::Ping.encode(1, &mut buf);
        buf[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            parse_header(&buf, 1024),
            Err(ProtoError::Oversized { .. })
        ));
        let garbage = [0x47u8; 16];
        assert!(parse_header(&garbage, 1024).is_err());
        assert_eq!(parse_header(&garbage[..5], 1024), Ok(None));
    }

    #[test]
    fn truncated_and_trailing_bodies_are_rejected() {
        assert!(matches!(
            Request::decode(Op::Read, &[0; 11]),
            Err(ProtoError::Truncated { .. })
        ));
        assert!(matches!(
            Request::decode(Op::Read, &[0; 13]),
            Err(ProtoError::Trailing { .. })
        ));
        let mut free = 4u32.to_le_bytes().to_vec();
        free.extend_from_slice(&[0; 8]);
        assert!(matches!(
            Request::decode(Op::Free, &free),
            Err(ProtoError::Truncated { .. })
        ));
        assert!(Request::decode(Op::Free, &u32::MAX.to_le_bytes()).is_err());
        assert!(matches!(
            Request::decode(Op::ReadOk, &[]),
            Err(ProtoError::WrongDirection(_))
        ));
    }

    #[test]
    fn handshake_bodies_are_bounds_checked() {
        // Every prefix of a valid body is truncated, and one byte more is trailing.
        let mut hello = Vec::new();
        Request::Hello {
            version: VERSION,
            page_size: 4096,
            nonce: [1; NONCE_LEN],
        }
        .encode(0, &mut hello);
        let mut auth = Vec::new();
        Request::Auth {
            proof: [2; PROOF_LEN],
        }
        .encode(0, &mut auth);
        let mut challenge = Vec::new();
        Response::Challenge {
            nonce: [3; NONCE_LEN],
        }
        .encode(0, &mut challenge);
        let mut welcome = Vec::new();
        Response::Welcome {
            version: VERSION,
            frame_len_max: 1,
            capacity_bytes: 2,
            used_bytes: 3,
            proof: [4; PROOF_LEN],
        }
        .encode(0, &mut welcome);
        let mut bad_magic = hello.clone();
        let mut attach = Vec::new();
        Request::Attach {
            session: SessionId(7),
            lease_ms: 1,
            flags: 0,
            reserved: 0,
        }
        .encode(0, &mut attach);
        let mut attached = Vec::new();
        Response::Attached {
            lease_ms: 1,
            flags: 0,
            session_bytes: 0,
        }
        .encode(0, &mut attached);
        let mut status = Vec::new();
        Response::StatusOk(ServerStatus {
            sessions_total: 1,
            sessions: vec![SessionStatus {
                id: SessionId(5),
                used_bytes: 1,
                lease_age_ms: 2,
                connections: 3,
            }],
            ..ServerStatus::default()
        })
        .encode(0, &mut status);
        let decode = |op, body: &[u8]| match op {
            Op::Hello | Op::Auth | Op::Attach => Request::decode(op, body).map(|_| ()),
            _ => Response::decode(op, body).map(|_| ()),
        };
        for (op, frame) in [
            (Op::Hello, hello),
            (Op::Auth, auth),
            (Op::Attach, attach),
            (Op::Challenge, challenge),
            (Op::Welcome, welcome),
            (Op::Attached, attached),
            (Op::StatusOk, status),
        ] {
            let body = &frame[HEADER_LEN..];
            assert_eq!(decode(op, body), Ok(()));
            for n in 0..body.len() {
                assert!(
                    matches!(decode(op, &body[..n]), Err(ProtoError::Truncated { .. })),
                    "{op:?} cut to {n} bytes"
                );
            }
            let mut long = body.to_vec();
            long.push(0);
            assert!(matches!(
                decode(op, &long),
                Err(ProtoError::Trailing { extra: 1, .. })
            ));
        }
        bad_magic[HEADER_LEN] = b'X';
        assert_eq!(
            Request::decode(Op::Hello, &bad_magic[HEADER_LEN..]),
            Err(ProtoError::BadMagic)
        );
        assert!(matches!(
            Request::decode(Op::Challenge, &[0; NONCE_LEN]),
            Err(ProtoError::WrongDirection(Op::Challenge))
        ));
        assert!(matches!(
            Response::decode(Op::Auth, &[0; PROOF_LEN]),
            Err(ProtoError::WrongDirection(Op::Auth))
        ));
    }

    #[test]
    fn a_status_claiming_more_sessions_than_it_holds_is_refused_before_allocating() {
        let mut body = vec![0u8; 28];
        body.extend_from_slice(&(STATUS_SESSIONS_MAX as u32).to_le_bytes());
        assert!(matches!(
            Response::decode(Op::StatusOk, &body),
            Err(ProtoError::Truncated { .. })
        ));
        body[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Response::decode(Op::StatusOk, &body),
            Err(ProtoError::Invalid(_))
        ));
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics() {
        // A cheap deterministic fuzz: every op over many pseudo-random bodies.
        let mut x: u64 = 0x9E3779B97F4A7C15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 64) as usize;
            let body: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            let op = Op::from_u8((x >> 56) as u8).unwrap_or(Op::Free);
            let _ = Request::decode(op, &body);
            let _ = Response::decode(op, &body);
            let _ = parse_header(&body, 1 << 20);
        }
    }
}
