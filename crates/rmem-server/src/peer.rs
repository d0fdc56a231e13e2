//! A server's link to another server, to pull a client's pages from it (`Request::Pull`).
//!
//! A drain moves a client's pages off a server that leaves. Read by the client and written
//! again, every byte would cross the network twice and the client's pager thread twice; with
//! `Pull` the client names the pages and where they are, and the server that will hold them
//! reads them from the one that holds them: once across, and no work in the client but the
//! bookkeeping. This server speaks the client's side of the protocol to the other one with
//! its own token (the pool's servers share it), attaches the client's session there with
//! `ATTACH_PEEK` (never creating it, leaving its lease and attachments as they are), asks for
//! every key at once (consecutive keys in one read) and stores the answers as they come.
//!
//! The client's connection waits meanwhile: requests are answered in order, so what the
//! client sends after a `Pull` sees the pulled pages, and a bounded deadline (the client's
//! choice, at most `PULL_DEADLINE_MAX_MS`) keeps the wait short. Any failure answers how
//! many keys, in order, are stored, and why the rest are not; the client then moves those
//! pages itself.

use crate::session::{Attachment, Sessions, StoreRefusal};
use crate::{read_frame, Deadlined};
use rmem_proto::{auth, ErrorCode, PageKey, Request, Response, SessionId};
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::Instant;

/// An open, attached link to another server.
pub(crate) struct Peer {
    from: String,
    session: SessionId,
    unit: usize,
    sock: TcpStream,
    reader: BufReader<Deadlined>,
    frame_len_max: u32,
    /// The frame being read, kept for the next: a pull's answers are up to a frame of pages
    /// each, and a fresh buffer that size costs its page faults every time.
    body: Vec<u8>,
}

/// Where pulled pages go: the client's session here.
pub(crate) struct Destination<'a> {
    pub attachment: &'a Attachment,
    pub sessions: &'a Sessions,
    pub capacity: u64,
}

/// What a pull asks for besides its keys.
pub(crate) struct Want<'a> {
    pub from: &'a str,
    pub session: SessionId,
    pub token: &'a [u8],
    pub unit: usize,
    pub deadline: Instant,
}

impl Peer {
    fn open(w: &Want<'_>) -> Result<Peer, String> {
        let left = |what: &str| {
            let t = w.deadline.saturating_duration_since(Instant::now());
            if t.is_zero() {
                Err(format!("deadline passed before {what}"))
            } else {
                Ok(t)
            }
        };
        // An address, not a name: the client names the socket address it is connected to,
        // and resolving names here would let a request wait on DNS.
        let addr: std::net::SocketAddr = w
            .from
            .parse()
            .map_err(|_| format!("{:?} is not an IP address and port", w.from))?;
        let sock = TcpStream::connect_timeout(&addr, left("connecting")?)
            .map_err(|e| format!("cannot connect to {}: {e}", w.from))?;
        sock.set_nodelay(true).map_err(|e| e.to_string())?;
        let reader = BufReader::with_capacity(
            crate::IO_BUFFER,
            Deadlined {
                sock: sock.try_clone().map_err(|e| e.to_string())?,
                deadline: Some(w.deadline),
            },
        );
        let mut p = Peer {
            from: w.from.to_string(),
            session: w.session,
            unit: w.unit,
            sock,
            reader,
            frame_len_max: 4096,
            body: Vec::new(),
        };
        let mut t = auth::Transcript {
            client_nonce: auth::nonce().map_err(|e| e.to_string())?,
            server_nonce: [0; auth::NONCE_LEN],
            version: rmem_proto::VERSION,
            page_size: w.unit as u32,
        };
        p.send(&Request::Hello {
            version: t.version,
            page_size: t.page_size,
            nonce: t.client_nonce,
        })?;
        let mut body = Vec::new();
        t.server_nonce = match p.answer(&mut body, "challenge")? {
            Response::Challenge { nonce } => nonce,
            other => return Err(refused("challenge", &other)),
        };
        p.send(&Request::Auth {
            proof: t.proof(w.token, auth::Role::Client),
        })?;
        match p.answer(&mut body, "welcome")? {
            Response::Welcome {
                frame_len_max,
                proof,
                ..
            } => {
                if !t.verify(w.token, auth::Role::Server, &proof) {
                    return Err(format!("{} could not prove it knows the token", w.from));
                }
                p.frame_len_max = frame_len_max;
            }
            other => return Err(refused("welcome", &other)),
        }
        p.send(&Request::Attach {
            session: w.session,
            lease_ms: 0,
            flags: rmem_proto::ATTACH_PEEK,
            reserved: 0,
        })?;
        match p.answer(&mut body, "attach")? {
            Response::Attached { .. } => Ok(p),
            other => Err(refused("attach", &other)),
        }
    }

    fn send(&mut self, req: &Request<'_>) -> Result<(), String> {
        let mut frame = Vec::new();
        req.encode(0, &mut frame);
        self.sock
            .write_all(&frame)
            .map_err(|e| format!("{}: {e}", self.from))
    }

    /// The next frame, decoded; `what` names it for the message when none comes.
    fn answer<'b>(&mut self, body: &'b mut Vec<u8>, what: &str) -> Result<Response<'b>, String> {
        let (h, frame) = read_frame(&mut self.reader, self.frame_len_max.max(4096), body)
            .map_err(|e| format!("{} sent no {what}: {e}", self.from))?
            .ok_or_else(|| format!("{} closed the link before its {what}", self.from))?;
        Response::decode(h.op, frame).map_err(|e| format!("{}'s {what}: {e}", self.from))
    }

    /// Read `keys` (in runs of consecutive keys, one request each, all sent at once) and
    /// hand each page to `store` in order. The keys stored, and why not all were.
    fn read_into(
        &mut self,
        keys: &[PageKey],
        deadline: Instant,
        store: impl FnMut(u64, &[u8]) -> Result<(), String>,
    ) -> Stopped {
        self.reader.get_mut().deadline = Some(deadline);
        let per_read = ((self.frame_len_max as usize).saturating_sub(64) / self.unit).max(1);
        let mut runs: Vec<(u64, u32)> = Vec::new();
        for k in keys {
            match runs.last_mut() {
                Some((start, n))
                    if start.wrapping_add(u64::from(*n)) == k.0 && (*n as usize) < per_read =>
                {
                    *n += 1
                }
                _ => runs.push((k.0, 1)),
            }
        }
        let mut frames = Vec::new();
        for &(key, count) in &runs {
            Request::Read {
                key: PageKey(key),
                count,
            }
            .encode(0, &mut frames);
        }
        if let Err(e) = self.sock.write_all(&frames) {
            return Stopped {
                stored: 0,
                why: format!("{}: {e}", self.from),
                link: true,
            };
        }
        let mut body = std::mem::take(&mut self.body);
        let done = self.store_answers(&runs, &mut body, store);
        self.body = body;
        done
    }

    /// The answers to the reads of `runs`, in order, each page handed to `store`: the pages
    /// stored, and why not all were.
    fn store_answers(
        &mut self,
        runs: &[(u64, u32)],
        body: &mut Vec<u8>,
        mut store: impl FnMut(u64, &[u8]) -> Result<(), String>,
    ) -> Stopped {
        let mut stored = 0;
        let unit = self.unit;
        let stop = |stored, why, link| Stopped { stored, why, link };
        for &(key, count) in runs {
            let data = match self.answer(body, "read answer") {
                Ok(Response::ReadOk {
                    key: k,
                    count: c,
                    data,
                }) if k.0 == key && c == count && data.len() == count as usize * unit => data,
                // The session fenced here (the client attached it again, exclusively, after
                // a dropped link of its own) or gone: a fresh link may see it again.
                Ok(
                    other @ Response::Error {
                        code: ErrorCode::SessionLost,
                        ..
                    },
                ) => return stop(stored, refused("read answer", &other), true),
                Ok(other) => return stop(stored, refused("read answer", &other), false),
                Err(e) => return stop(stored, e, true),
            };
            for (i, page) in data.chunks(unit).enumerate() {
                if let Err(e) = store(key.wrapping_add(i as u64), page) {
                    return stop(stored, e, false);
                }
                stored += 1;
            }
        }
        stop(stored, String::new(), false)
    }
}

/// Where a pull over one link stopped.
struct Stopped {
    /// Keys stored, in order.
    stored: usize,
    /// Why not all were (empty when all were).
    why: String,
    /// The link failed (closed, cut, timed out, or the session fenced on it), not the data
    /// or this server's store: the rest may come over a fresh link.
    link: bool,
}

fn refused(what: &str, r: &Response<'_>) -> String {
    match r {
        Response::Error { code, message } => format!("refused ({code}): {message}"),
        other => format!("answered {:?} where a {what} was due", other.op()),
    }
}

/// Links kept per client connection, to the servers its pulls came from (a repair pulls from
/// every server holding a copy, a drain from one); the least recently used goes first.
pub(crate) const PEERS_KEPT: usize = 16;

/// Pull `keys` as `w` says into `to`, over the link in `peers` to the same server and session
/// (else a new one, kept there for the next pulls, at most [`PEERS_KEPT`]). The keys stored,
/// in order, and why not all were (empty when all were). A failed link is dropped.
pub(crate) fn pull(
    peers: &mut Vec<Peer>,
    w: Want<'_>,
    keys: &[PageKey],
    to: Destination<'_>,
) -> (usize, String) {
    let kept = peers
        .iter()
        .position(|p| p.from == w.from && p.session == w.session && p.unit == w.unit);
    let mut peer = kept.map(|i| peers.remove(i));
    // A kept link may have gone stale (the other server closed it, or the client's exclusive
    // attach there fenced it, maybe in the middle of this pull): when the link failed, the
    // keys not stored yet are asked again over a fresh one, once.
    let mut done = 0;
    for fresh in [peer.is_none(), true] {
        if fresh {
            match Peer::open(&w) {
                Ok(p) => peer = Some(p),
                Err(e) => return (done, e),
            }
        }
        let p = peer.as_mut().expect("opened");
        let stopped = p.read_into(&keys[done..], w.deadline, |key, page| {
            let mut pages = to.attachment.lock().map_err(|e| e.to_string())?;
            pages
                .store(to.sessions, to.capacity, key, page)
                .map_err(|e| match e {
                    StoreRefusal::Full => rmem_proto::PULLED_FULL.to_string(),
                    e => format!("cannot store it: {e}"),
                })
        });
        done += stopped.stored;
        if done == keys.len() {
            // Most recently used last.
            if peers.len() >= PEERS_KEPT {
                peers.remove(0);
            }
            peers.extend(peer);
            return (done, stopped.why);
        }
        if !stopped.link || fresh {
            return (done, stopped.why);
        }
    }
    unreachable!("the second try opens a fresh link and returns")
}
