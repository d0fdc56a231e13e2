//! Pages on memory servers over TCP: one connection per server, many requests in flight on
//! each, answered in order. Placement (priority fill or round-robin stripe) is decided here
//! and recorded per page in two bytes.
//!
//! Each connection ([`Conn`]) owns its link to one server and survives losing it: its pages
//! belong to a server session (a random id chosen here, one lease per server), every request
//! stays encoded until its answer arrives, and when the link drops (reset, EOF, a request
//! unanswered past the timeout) it connects again with backoff, attaches the session
//! exclusively (fencing whatever the old link still had buffered on the server) and re-sends
//! every unanswered request in order, with its tag. Requests are idempotent by page (a write
//! sets a page, a free removes it, a read changes nothing), so a request applied before the
//! drop and again after leaves the same pages. The pager sees only requests that take longer.
//!
//! An outage ends when the server answers again, not when a new link is up: a server that
//! accepts, authenticates and then never answers (or closes every link) is given up on once
//! the reconnection window has passed since the first loss. A frame that breaks the protocol
//! (garbage, a length past the limit, an answer with another request's tag or another page's
//! key, a page of the wrong size) is never retried: it is not a broken link but a server that
//! cannot be trusted with the program's pages, and it stops the program at once, naming the
//! server (ARCHITECTURE.md, "A hostile or broken server").
//!
//! A fork() child's connection ([`Conn::forked`]) reads a snapshot its parent's connection
//! asked for at the fork; it opens its link at its first request (most children exec at once
//! and need none), attaches the snapshot without ever creating it, and waits for it if the
//! parent's request is still on its way.

use super::StoreError;
use rmem_proto::{auth, parse_header, PageKey, Request, Response, SessionId, HEADER_LEN};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The connection layer's clocks.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Connecting (and the handshake) gives up after this long.
    pub connect: Duration,
    /// A request unanswered this long means the link is lost.
    pub request: Duration,
    /// An idle connection is pinged this often (at most a third of the lease).
    pub heartbeat: Duration,
    /// After a link is lost, reconnecting goes on this long (at most the lease) before the
    /// server counts as lost; 0 gives up at once.
    pub reconnect: Duration,
}

impl Timing {
    pub fn of(config: &crate::Config) -> Timing {
        Timing {
            connect: config.connect_timeout,
            request: config.server_timeout,
            heartbeat: config.heartbeat,
            reconnect: config.reconnect,
        }
    }
}

/// The operation of a write taken off a server's hands ([`Conn::redirect_writes`]): none, so
/// its answer is ignored. The store numbers its operations from 1.
pub(crate) const REDIRECTED: u64 = 0;

/// What a request was for: the store's operation and which piece of the page it carries.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Read {
        op: u64,
        piece: u8,
        key: u64,
    },
    Write {
        op: u64,
        piece: u8,
        key: u64,
    },
    /// A byte range of one page (a direct region's, [`crate::direct`], or a sub-page
    /// fetch's, of piece `piece` of the page's group): read `len` bytes at `offset`, or write
    /// there.
    ReadRange {
        op: u64,
        piece: u8,
        key: u64,
        offset: u32,
        len: u32,
    },
    WriteRange {
        op: u64,
        /// The member of the page's group written (its copy: `none`, or one of `replicas:N`).
        piece: u8,
        key: u64,
        offset: u32,
    },
    Free,
    Ping,
    /// Pages this server copies from another (`Request::Pull`): the store's batch of them.
    Pull {
        batch: u64,
    },
    /// A snapshot of the session for a fork() child, or its end.
    Snapshot,
    EndSnapshot,
}

/// One server's answer to one piece of a store operation.
#[derive(Debug)]
pub(crate) enum Answer<'a> {
    /// `data` lies in the link's receive buffer, which the answer may change (a seal opened
    /// where the bytes came, not on a copy).
    Read {
        op: u64,
        piece: u8,
        data: &'a mut [u8],
    },
    Written {
        op: u64,
        piece: u8,
    },
    /// The server does not have the piece (it lost it, or never had it).
    Missing {
        op: u64,
        piece: u8,
    },
    /// The server is full: the piece (`unit`) must go elsewhere (overcommit).
    Full {
        op: u64,
        piece: u8,
        unit: Vec<u8>,
    },
    /// A pull's answer: the first `stored` keys of `batch` are stored; why not the rest.
    Pulled {
        batch: u64,
        stored: u32,
        why: &'a str,
    },
}

/// A request a dead server will never answer, for the store to send elsewhere (a write
/// with its piece).
#[derive(Debug)]
pub(crate) struct Orphan {
    pub kind: Kind,
    pub unit: Option<Vec<u8>>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    tag: u64,
    kind: Kind,
    sent: Instant,
    /// Bytes of its frame in `Conn::out`.
    len: usize,
}

impl Pending {
    /// A read's (operation, piece), of a whole piece or a byte range in one; None for others.
    fn read(&self) -> Option<(u64, u8)> {
        match self.kind {
            Kind::Read { op, piece, .. } | Kind::ReadRange { op, piece, .. } => Some((op, piece)),
            _ => None,
        }
    }
}

/// An outage: since when, why, and when to try again. It lasts from the first lost link
/// until the server answers a request, across any links re-established meanwhile.
#[derive(Debug)]
struct Lost {
    since: Instant,
    cause: StoreError,
    next_try: Instant,
    backoff: Duration,
    last_try: Option<String>,
    /// Links re-established during this outage that were lost again before any answer.
    relinks: u32,
    /// A new link being opened on a thread of its own: connecting to a host that is down
    /// waits out the whole connect timeout, and the pager (whose thread calls this) serves
    /// the program's other faults meanwhile, from other servers or other copies.
    dialing: Option<mpsc::Receiver<Result<Link, StoreError>>>,
}

/// How long giving up waits for the attempt still open to end: it ends with the window.
const DIAL_LATE: Duration = Duration::from_millis(250);
/// Shortest and longest waits between two reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Bytes of frames one outbox segment takes before the next frame starts a new one.
const SEGMENT: usize = 256 * 1024;
/// Emptied segments kept for reuse.
const SPARE_SEGMENTS: usize = 8;

/// Every request frame not yet answered, in order, then the ones not yet sent. Kept so that
/// a new link can re-send them. Frames lie whole in segments of about [`SEGMENT`] bytes; a
/// segment whose frames are all answered is reused for new frames, the most recently emptied
/// first, so the memory frames are written into and sent from stays in the CPU's cache (one
/// buffer that only grew while anything was unanswered, compacted by moving its tail, made
/// a 1 GiB scan a quarter slower: docs/benchmarks.md, issue 10's A/B).
#[derive(Default)]
#[cfg_attr(test, derive(Clone))]
pub(crate) struct Outbox {
    segs: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    /// The oldest unanswered frame's offset in `segs[0]`.
    acked: usize,
    /// The first unsent byte: segment and offset (at a segment's end, the next one's start).
    sent_seg: usize,
    sent: usize,
}

impl Outbox {
    /// Bytes of the frames held until answered (sent or not).
    fn held(&self) -> usize {
        self.segs.iter().map(Vec::len).sum::<usize>() - self.acked
    }

    pub(crate) fn unsent(&self) -> &[u8] {
        let (mut i, mut at) = (self.sent_seg, self.sent);
        while let Some(s) = self.segs.get(i) {
            if at < s.len() {
                return &s[at..];
            }
            i += 1;
            at = 0;
        }
        &[]
    }

    /// `n` bytes of [`Outbox::unsent`] went out.
    fn sent(&mut self, n: usize) {
        while self.sent == self.segs[self.sent_seg].len() {
            self.sent_seg += 1;
            self.sent = 0;
        }
        self.sent += n;
    }

    /// The buffer the next frame is encoded onto the end of.
    fn tail(&mut self) -> &mut Vec<u8> {
        if self.segs.back().is_none_or(|s| s.len() >= SEGMENT) {
            let seg = self
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(SEGMENT + 64 * 1024));
            self.segs.push_back(seg);
        }
        self.segs.back_mut().expect("a segment")
    }

    /// The unanswered frames of `lens` bytes each, oldest first.
    fn frames<'a>(
        &'a self,
        lens: impl Iterator<Item = usize> + 'a,
    ) -> impl Iterator<Item = &'a [u8]> {
        let (mut i, mut at) = (0, self.acked);
        lens.map(move |len| {
            while at == self.segs[i].len() {
                i += 1;
                at = 0;
            }
            at += len;
            &self.segs[i][at - len..at]
        })
    }

    /// Each unanswered frame (of `len` bytes, with its `T`) to `f`, oldest first, each segment
    /// freed as soon as its frames are done: what `f` copies out of them and the outbox are
    /// never both whole in memory.
    fn drain_frames<T>(
        self,
        frames: impl Iterator<Item = (usize, T)>,
        mut f: impl FnMut(T, &[u8]),
    ) {
        let mut segs = self.segs;
        let (mut seg, mut at) = (segs.pop_front().unwrap_or_default(), self.acked);
        for (len, t) in frames {
            while at == seg.len() {
                seg = segs.pop_front().expect("an unanswered frame's segment");
                at = 0;
            }
            f(t, &seg[at..at + len]);
            at += len;
        }
    }

    /// The oldest unanswered frame, `len` bytes, was answered: it need not be kept.
    fn answered(&mut self, len: usize) {
        self.acked += len;
        debug_assert!(self.acked <= self.segs[0].len());
        if self.acked == self.segs[0].len() {
            self.drop_front();
        }
    }

    /// The front segment's frames are all answered (and so sent): reuse it.
    fn drop_front(&mut self) {
        let mut seg = self.segs.pop_front().expect("a segment");
        if self.sent_seg == 0 {
            self.sent = 0;
        } else {
            self.sent_seg -= 1;
        }
        self.acked = 0;
        seg.clear();
        if self.spare.len() < SPARE_SEGMENTS {
            self.spare.push(seg);
        }
    }

    /// A new link: everything unanswered is unsent again.
    fn rewind(&mut self) {
        self.sent_seg = 0;
        self.sent = self.acked;
    }
}

/// What a server told a connection about its limits.
#[derive(Clone, Copy, Debug)]
struct Limits {
    frame_len_max: u32,
    /// The lease the server granted.
    lease: Duration,
    /// Bytes this client may use on the server (its capacity less what others used at connect).
    capacity_bytes: u64,
    /// The server's whole capacity, for messages.
    server_capacity_bytes: u64,
}

/// One server: its session, its link (when up), and every unanswered request.
pub(crate) struct Conn {
    pub(crate) name: String,
    token: Vec<u8>,
    session: SessionId,
    page_size: usize,
    timing: Timing,
    pub(crate) sock: Option<TcpStream>,
    pub(crate) out: Outbox,
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    pub(crate) pending: VecDeque<Pending>,
    next_tag: u64,
    pub(crate) frees: Vec<PageKey>,
    last_activity: Instant,
    frame_len_max: u32,
    /// The lease the server granted.
    lease: Duration,
    /// The server said its sessions outlive its process: a refused reconnect is a restart
    /// under way, waited out like any lost link, not the end of the session.
    persists: bool,
    lost: Option<Lost>,
    /// An outage whose new link has not been answered on yet: kept so that losing the link
    /// again continues it (and its deadline) rather than starting a new one.
    relinked: Option<Lost>,
    /// Links re-established.
    pub(crate) reconnects: u64,
    /// Bytes this client may use on the server (its capacity less what others used at connect).
    pub(crate) capacity_bytes: u64,
    /// Bytes this client has placed there.
    pub(crate) used_bytes: u64,
    /// The server's whole capacity, for messages.
    pub(crate) server_capacity_bytes: u64,
    /// It answered `Full`: new pages go elsewhere until this client frees a page there or a
    /// ping shows room.
    pub(crate) full: bool,
    /// What it said the last time it refused a page (past its capacity, or it could not
    /// take the memory or write its disk), for the message when no server takes one.
    pub(crate) refused_why: String,
    /// The pool's manager says it keeps pages on disk (`SERVER_DISK`): the slower tier,
    /// placed on only when the RAM servers are full.
    pub(crate) disk: bool,
    /// The session is a snapshot its parent's connection creates: attach it with
    /// `ATTACH_SNAPSHOT` (wait for it, never create it).
    snapshot: bool,
    /// The address the latest link is connected to (read once per link, for `peer_addr`).
    linked_to: Option<std::net::SocketAddr>,
}

fn io_err(server: &str, e: io::Error) -> StoreError {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => StoreError::Closed {
            server: server.into(),
            detail: format!(" ({e})"),
        },
        _ => StoreError::Io {
            server: server.into(),
            source: e,
        },
    }
}

/// Whether a new link may cure `e`: the link broke, not the server's answers.
fn link_failure(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Closed { .. }
            | StoreError::Io { .. }
            | StoreError::Timeout { .. }
            | StoreError::Connect { .. }
    )
}

/// Whether `e`, met connecting at start, says the server is down or unreachable now (a
/// fault a redundant layout outlives) rather than that the configuration is wrong: a name
/// that does not resolve, a wrong token, a refused attach or an incompatible server stay
/// errors.
pub(crate) fn down_at_start(e: &StoreError) -> bool {
    match e {
        // Of the failures a new link may cure, only the network's: not a name that does
        // not resolve.
        StoreError::Connect { source, .. } => matches!(
            source.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::TimedOut
                | io::ErrorKind::WouldBlock
                | io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable
                | io::ErrorKind::NetworkDown
        ),
        other => link_failure(other),
    }
}

/// A connected, authenticated, attached link and what the server said.
struct Link {
    sock: TcpStream,
    welcome: Welcome,
    lease: Duration,
    existed: bool,
    /// The server keeps the session across its own restart ([`rmem_proto::ATTACHED_PERSISTS`]).
    persists: bool,
}

/// Connect to `server`, authenticate and attach `session` (blocking, each step bounded by
/// `timeout`).
fn open(
    server: &str,
    token: &[u8],
    page_size: usize,
    session: SessionId,
    timeout: Duration,
    snapshot: bool,
    exclusive: bool,
) -> Result<Link, StoreError> {
    let connect_err = |source| StoreError::Connect {
        server: server.into(),
        source,
    };
    // Connecting, the handshake and the attach all together, however slowly bytes come.
    let deadline = Instant::now() + timeout;
    let mut sock = dial(server, timeout)?;
    let welcome = handshake(&mut sock, server, token, page_size, deadline)?;
    let proto = |what: String| StoreError::Protocol {
        server: server.into(),
        what,
    };
    if (welcome.frame_len_max as usize) < page_size + 64 {
        return Err(proto(format!(
            "frame limit {} is below one page of {page_size} bytes",
            welcome.frame_len_max
        )));
    }
    let mut frame = Vec::new();
    let mut flags = if exclusive {
        rmem_proto::ATTACH_EXCLUSIVE
    } else {
        0
    };
    let mut deadline = deadline;
    if snapshot {
        flags |= rmem_proto::ATTACH_SNAPSHOT;
        // The server may wait for the snapshot this long before it answers.
        deadline += Duration::from_millis(rmem_proto::SNAPSHOT_WAIT_MS);
    }
    Request::Attach {
        session,
        lease_ms: 0,
        flags,
        reserved: 0,
    }
    .encode(0, &mut frame);
    sock.write_all(&frame).map_err(|e| io_err(server, e))?;
    let h = read_frame(
        &mut sock,
        server,
        "attach answer",
        &mut frame,
        SETUP_FRAME_MAX,
        deadline,
    )?;
    let (lease, flags) = match Response::decode(h.op, &frame).map_err(|e| proto(e.to_string()))? {
        Response::Attached {
            lease_ms, flags, ..
        } => (Duration::from_millis(lease_ms.max(1).into()), flags),
        Response::Error { code, message } => {
            return Err(StoreError::Refused {
                server: server.into(),
                message: format!("{code}: {message}"),
            })
        }
        other => return Err(proto(format!("expected attached, got {:?}", other.op()))),
    };
    sock.set_read_timeout(None).map_err(connect_err)?;
    sock.set_write_timeout(None).map_err(connect_err)?;
    sock.set_nonblocking(true).map_err(connect_err)?;
    Ok(Link {
        sock,
        welcome,
        lease,
        existed: flags & rmem_proto::ATTACHED_EXISTED != 0,
        persists: flags & rmem_proto::ATTACHED_PERSISTS != 0,
    })
}

/// Connect to `server` (`host:port`, every address it resolves to in turn), blocking, with
/// `timeout` for each attempt and as the socket's read and write timeout.
pub(crate) fn dial(server: &str, timeout: Duration) -> Result<TcpStream, StoreError> {
    let connect_err = |source| StoreError::Connect {
        server: server.into(),
        source,
    };
    let addrs: Vec<_> = server.to_socket_addrs().map_err(connect_err)?.collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    let mut sock = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                sock = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let sock = sock.ok_or_else(|| connect_err(last))?;
    sock.set_nodelay(true).map_err(connect_err)?;
    sock.set_read_timeout(Some(timeout)).map_err(connect_err)?;
    sock.set_write_timeout(Some(timeout)).map_err(connect_err)?;
    Ok(sock)
}

/// Where `part`, a slice of `buf` (a frame's payload as decoded), lies in it: to take it
/// mutably.
fn within(buf: &[u8], part: &[u8]) -> std::ops::Range<usize> {
    let at = (part.as_ptr() as usize)
        .checked_sub(buf.as_ptr() as usize)
        .filter(|&at| at + part.len() <= buf.len())
        .expect("a slice of the receive buffer");
    at..at + part.len()
}

impl Conn {
    /// Connect, authenticate, learn the server's limits and open `session` there.
    pub(crate) fn connect(
        server: &str,
        token: &[u8],
        page_size: usize,
        session: SessionId,
        timing: Timing,
    ) -> Result<Conn, StoreError> {
        Conn::connect_as(server, token, page_size, session, timing, true)
    }

    /// [`Conn::connect`] for a session that other processes attach too (a named direct
    /// region): the attach fences no one, and a lost link is not re-established (an exclusive
    /// reattach would fence the other processes; a shared one could let frames the old link
    /// still had buffered on the server land after those re-sent), so it is an error at once.
    pub(crate) fn connect_shared(
        server: &str,
        token: &[u8],
        page_size: usize,
        session: SessionId,
        timing: Timing,
    ) -> Result<Conn, StoreError> {
        let timing = Timing {
            reconnect: Duration::ZERO,
            ..timing
        };
        Conn::connect_as(server, token, page_size, session, timing, false)
    }

    fn connect_as(
        server: &str,
        token: &[u8],
        page_size: usize,
        session: SessionId,
        timing: Timing,
        exclusive: bool,
    ) -> Result<Conn, StoreError> {
        let link = open(
            server,
            token,
            page_size,
            session,
            timing.connect,
            false,
            exclusive,
        )?;
        let limits = Limits {
            frame_len_max: link.welcome.frame_len_max,
            lease: link.lease,
            capacity_bytes: link
                .welcome
                .capacity_bytes
                .saturating_sub(link.welcome.used_bytes),
            server_capacity_bytes: link.welcome.capacity_bytes,
        };
        let mut conn = Conn::unlinked(server, token, page_size, session, timing, limits);
        conn.take_link(link, Instant::now());
        Ok(conn)
    }

    /// A server that could not be reached at start (under a layout that outlives it): no
    /// link, no room known; it is buried from the start and replaced by a live connection
    /// if it answers again.
    pub(crate) fn unreachable(
        server: &str,
        token: &[u8],
        page_size: usize,
        session: SessionId,
        timing: Timing,
    ) -> Conn {
        let limits = Limits {
            frame_len_max: 0,
            lease: Duration::ZERO,
            capacity_bytes: 0,
            server_capacity_bytes: 0,
        };
        Conn::unlinked(server, token, page_size, session, timing, limits)
    }

    /// A connection with no link yet and nothing sent.
    fn unlinked(
        server: &str,
        token: &[u8],
        page_size: usize,
        session: SessionId,
        timing: Timing,
        limits: Limits,
    ) -> Conn {
        Conn {
            name: server.into(),
            token: token.to_vec(),
            session,
            page_size,
            timing,
            sock: None,
            // Both buffers are made with the first link: a fork child that execs at once
            // never needs them.
            out: Outbox::default(),
            inbuf: Vec::new(),
            in_start: 0,
            in_end: 0,
            pending: VecDeque::new(),
            next_tag: 1,
            frees: Vec::new(),
            last_activity: Instant::now(),
            frame_len_max: limits.frame_len_max,
            lease: limits.lease,
            persists: false,
            lost: None,
            relinked: None,
            reconnects: 0,
            capacity_bytes: limits.capacity_bytes,
            used_bytes: 0,
            server_capacity_bytes: limits.server_capacity_bytes,
            full: false,
            refused_why: String::new(),
            disk: false,
            snapshot: false,
            linked_to: None,
        }
    }

    /// In a fork() child, from its copy of its parent's connection: the same server, the
    /// child's snapshot `session`, no link yet (opened at the first request, or to keep the
    /// snapshot's lease once a heartbeat has passed), nothing of the parent's in flight.
    pub(crate) fn forked(&self, session: SessionId) -> Conn {
        let limits = Limits {
            frame_len_max: self.frame_len_max,
            lease: self.lease,
            capacity_bytes: self.capacity_bytes,
            server_capacity_bytes: self.server_capacity_bytes,
        };
        Conn {
            used_bytes: self.used_bytes,
            full: self.full,
            persists: self.persists,
            snapshot: true,
            linked_to: None,
            ..Conn::unlinked(
                &self.name,
                &self.token,
                self.page_size,
                session,
                self.timing,
                limits,
            )
        }
    }

    /// A fork child's connection that has never had a link.
    fn never_linked(&self) -> bool {
        self.sock.is_none() && self.lost.is_none()
    }

    /// Open the first link of a connection made without one ([`Conn::forked`]).
    fn link_first(&mut self, now: Instant) -> Result<(), StoreError> {
        let opened = open(
            &self.name,
            &self.token,
            self.page_size,
            self.session,
            self.timing.connect,
            self.snapshot,
            true,
        );
        match opened {
            Ok(link) => {
                self.take_link(link, now);
                self.flush(now)
            }
            Err(e) => self.lose(e, now),
        }
    }

    /// A new link is up: every unanswered request goes out on it again, in order, with its
    /// tag (answers half-read from an old link are gone).
    fn take_link(&mut self, link: Link, now: Instant) {
        if self.inbuf.is_empty() {
            self.inbuf = vec![0; (2 * (self.page_size + 64)).max(256 * 1024)];
        }
        self.linked_to = link.sock.peer_addr().ok();
        self.sock = Some(link.sock);
        self.lease = link.lease;
        self.persists = link.persists;
        self.frame_len_max = link.welcome.frame_len_max;
        self.in_start = 0;
        self.in_end = 0;
        self.out.rewind();
        self.last_activity = now;
        for p in &mut self.pending {
            p.sent = now;
        }
    }

    /// The server's address as this link is connected to it (none while the link is down).
    pub(crate) fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.sock.as_ref().and(self.linked_to)
    }

    pub(crate) fn session(&self) -> SessionId {
        self.session
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn heartbeat(&self) -> Duration {
        self.timing.heartbeat.min(self.lease / 3)
    }

    pub(crate) fn submit(&mut self, req: Request<'_>, kind: Kind) {
        self.submit_padded(req, kind, 0);
    }

    /// Submit a `Write` of one unit: `data` and `pad` zero bytes after it, which the caller
    /// fills in the slice returned: the whole unit where the frame waits to go out. A seal
    /// is made there, on the bytes the frame copied, not on a copy of its own.
    pub(crate) fn submit_write_in_place(
        &mut self,
        key: u64,
        data: &[u8],
        pad: usize,
        kind: Kind,
    ) -> &mut [u8] {
        debug_assert!(matches!(kind, Kind::Write { .. }));
        let req = Request::Write {
            key: PageKey(key),
            count: 1,
            data,
        };
        self.submit_padded(req, kind, pad)
    }

    /// Encode `req` with `pad` zero bytes after its body (only a `Write`'s data may grow so)
    /// and wait for its answer; the frame's last `data + pad` bytes, for a `Write`.
    fn submit_padded(&mut self, req: Request<'_>, kind: Kind, pad: usize) -> &mut [u8] {
        if !self.frees.is_empty()
            && matches!(
                kind,
                Kind::Write { .. } | Kind::WriteRange { .. } | Kind::Pull { .. }
            )
        {
            // A free queued before this write may name the same key (a page freed and written
            // again before the next flush: the block device does that within one request).
            // The server answers a connection's requests in order, so sending the frees first
            // keeps them from deleting the new contents.
            self.submit_frees();
        }
        let data = match req {
            Request::Write { data, .. } => data.len(),
            _ => {
                assert_eq!(pad, 0, "only a write's data may be padded");
                0
            }
        };
        let tag = self.next_tag;
        self.next_tag += 1;
        let buf = self.out.tail();
        let start = buf.len();
        req.encode(tag, buf);
        if pad > 0 {
            buf.resize(buf.len() + pad, 0);
            rmem_proto::patch_len(buf, start);
        }
        let len = buf.len() - start;
        self.pending.push_back(Pending {
            tag,
            kind,
            sent: Instant::now(),
            len,
        });
        let end = buf.len();
        &mut buf[end - data - pad..]
    }

    /// The link broke: drop it, keep every unanswered request for the next one. An error a
    /// new link cannot cure, or losing the link with reconnection off, is returned.
    fn lose(&mut self, e: StoreError, now: Instant) -> Result<(), StoreError> {
        if !link_failure(&e) || self.timing.reconnect.is_zero() {
            return Err(e);
        }
        self.sock = None;
        if self.lost.is_none() {
            self.lost = Some(match self.relinked.take() {
                Some(mut outage) => {
                    outage.relinks += 1;
                    outage.next_try = now + outage.backoff;
                    outage.backoff = (outage.backoff * 2).min(BACKOFF_MAX);
                    let (cause, again) = (outage.cause.to_string(), e.to_string());
                    let how = if again == cause {
                        String::new()
                    } else {
                        format!(" ({again})")
                    };
                    outage.last_try = Some(format!(
                        "connected again {} times, but it answered no request{how}",
                        outage.relinks
                    ));
                    outage
                }
                None => Lost {
                    since: now,
                    cause: e,
                    next_try: now,
                    backoff: BACKOFF_MIN,
                    last_try: None,
                    relinks: 0,
                    dialing: None,
                },
            });
        }
        Ok(())
    }

    /// While lost: try a new link when the backoff allows, opened on a thread of its own
    /// (the pager never waits on a connect; the link is taken on a later call once open);
    /// give up (with the first cause) once reconnecting has taken longer than allowed (at
    /// most the lease: after it the session is gone anyway).
    fn reconnect(&mut self, now: Instant) -> Result<(), StoreError> {
        let Some(lost) = &mut self.lost else {
            return Ok(());
        };
        let window = self.timing.reconnect.min(self.lease);
        let spent = now.saturating_duration_since(lost.since);
        if spent >= window {
            // Stays lost: any later call gives up too.
            let gone = StoreError::Closed {
                server: self.name.clone(),
                detail: " (given up)".into(),
            };
            // An attempt still open ends with the window (its deadline): what it met is the
            // last try's news. A link it opens after is closed (nobody takes it).
            let last = match (lost.dialing.take(), &lost.last_try) {
                (Some(dialing), _) => match dialing.recv_timeout(DIAL_LATE) {
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(_)) => "connected only once the window had passed".into(),
                    Err(_) => "still connecting (no answer from its host)".into(),
                },
                (None, Some(last)) => last.clone(),
                (None, None) => "no attempt".into(),
            };
            return Err(StoreError::GaveUp {
                cause: Box::new(std::mem::replace(&mut lost.cause, gone)),
                secs: spent.as_secs_f64(),
                last,
            });
        }
        let opened = match &lost.dialing {
            Some(dialing) => match dialing.try_recv() {
                Ok(opened) => {
                    lost.dialing = None;
                    opened
                }
                Err(mpsc::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::TryRecvError::Disconnected) => {
                    lost.dialing = None;
                    Err(StoreError::Closed {
                        server: self.name.clone(),
                        detail: " (the thread opening a new link ended without one)".into(),
                    })
                }
            },
            None if now < lost.next_try => return Ok(()),
            None => {
                let timeout = self
                    .timing
                    .connect
                    .min(window - spent)
                    .max(Duration::from_millis(1));
                let (name, token) = (self.name.clone(), self.token.clone());
                let (page_size, session, snapshot) = (self.page_size, self.session, self.snapshot);
                let (done, dialing) = mpsc::channel();
                let dial = move || {
                    let opened = open(&name, &token, page_size, session, timeout, snapshot, true);
                    // Nobody waits any more when the outage was given up on meanwhile: the
                    // new link is closed.
                    let _ = done.send(opened);
                };
                match std::thread::Builder::new()
                    .name("rmem-dial".into())
                    .spawn(dial)
                {
                    Ok(_) => {
                        lost.dialing = Some(dialing);
                        return Ok(());
                    }
                    // No thread to be had now: a failed try, tried again after the backoff.
                    Err(source) => Err(StoreError::Connect {
                        server: self.name.clone(),
                        source,
                    }),
                }
            }
        };
        match opened {
            Ok(link) => {
                if !link.existed && self.used_bytes > 0 {
                    return Err(StoreError::SessionLost {
                        server: self.name.clone(),
                        detail: format!(
                            " after the connection was lost {:.1} s ago ({}): it no longer held this program's {} bytes (lease {:.1} s)",
                            spent.as_secs_f64(),
                            lost.cause,
                            self.used_bytes,
                            link.lease.as_secs_f64()
                        ),
                    });
                }
                self.relinked = self.lost.take();
                self.take_link(link, now);
                self.reconnects += 1;
                self.flush(now)
            }
            // Nothing listens there any more: the server process is gone, and with it the
            // session (unless the server said it persists its sessions: then it may be
            // restarting); waiting out the window would only stall the program.
            Err(StoreError::Connect { source, .. })
                if source.kind() == io::ErrorKind::ConnectionRefused && !self.persists =>
            {
                let secs = spent.as_secs_f64();
                let gone = StoreError::Closed {
                    server: self.name.clone(),
                    detail: " (given up)".into(),
                };
                Err(StoreError::GaveUp {
                    cause: Box::new(std::mem::replace(&mut lost.cause, gone)),
                    secs,
                    last: format!("connection refused: {source}"),
                })
            }
            Err(e) if link_failure(&e) => {
                lost.last_try = Some(e.to_string());
                lost.next_try = now + lost.backoff;
                lost.backoff = (lost.backoff * 2).min(BACKOFF_MAX);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Queue the batched frees as requests.
    fn submit_frees(&mut self) {
        let keys = std::mem::take(&mut self.frees);
        for chunk in keys.chunks(rmem_proto::FREE_KEYS_MAX) {
            self.submit(
                Request::Free {
                    keys: chunk.to_vec(),
                },
                Kind::Free,
            );
        }
    }

    pub(crate) fn flush(&mut self, now: Instant) -> Result<(), StoreError> {
        if !self.frees.is_empty() {
            self.submit_frees();
        }
        if self.lost.is_some() {
            return self.reconnect(now);
        }
        if self.never_linked() {
            // A fork child's: its first link opens once there is something to send.
            if self.out.unsent().is_empty() {
                return Ok(());
            }
            return self.link_first(now);
        }
        let sock = self.sock.as_mut().expect("a link when not lost");
        while !self.out.unsent().is_empty() {
            match sock.write(self.out.unsent()) {
                Ok(0) => {
                    let e = StoreError::Closed {
                        server: self.name.clone(),
                        detail: String::new(),
                    };
                    return self.lose(e, now);
                }
                Ok(n) => self.out.sent(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return self.lose(io_err(&self.name, e), now),
            }
        }
        Ok(())
    }

    fn describe_inflight(&self) -> String {
        match self.pending.front() {
            Some(Pending {
                kind: Kind::Read { key, .. },
                ..
            }) => format!(" while page {key} was being fetched"),
            Some(Pending {
                kind: Kind::Write { key, .. },
                ..
            }) => format!(" while page {key} was being written back"),
            Some(_) => format!(" with {} requests in flight", self.pending.len()),
            None => String::new(),
        }
    }

    /// What to wait for on this link when the pager sleeps (none while it is lost: its
    /// reconnection runs from tick).
    pub(crate) fn pollfd(&self) -> Option<libc::pollfd> {
        let sock = self.sock.as_ref()?;
        let mut events = libc::POLLIN;
        if !self.out.unsent().is_empty() {
            events |= libc::POLLOUT;
        }
        Some(libc::pollfd {
            fd: sock.as_raw_fd(),
            events,
            revents: 0,
        })
    }

    /// Use `timing` from now on (a link opened with a short connect timeout).
    pub(crate) fn set_timing(&mut self, timing: Timing) {
        self.timing = timing;
    }

    /// In an outage: the link is down, or up again but not answered on yet.
    pub(crate) fn in_outage(&self) -> bool {
        self.lost.is_some() || self.relinked.is_some()
    }

    /// How long its oldest unanswered request has waited with no answer from it meanwhile
    /// (the request timeout's clock); None when nothing is unanswered.
    pub(crate) fn silent_for(&self, now: Instant) -> Option<Duration> {
        let p = self.pending.front()?;
        Some(now.saturating_duration_since(p.sent.max(self.last_activity)))
    }

    /// Bytes this link keeps in memory for its unanswered requests (to re-send them on a new
    /// link should this one drop): what a server that stops answering makes this client hold.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.out.held() as u64
    }

    /// The tag of the newest request sent to this server (0: none yet), for
    /// [`Conn::pending_reads`] and [`Conn::pending_writes`].
    pub(crate) fn newest_tag(&self) -> u64 {
        self.next_tag - 1
    }

    /// Where the unanswered requests newer than tag `after` start in `pending` (tags grow
    /// from front to back): a look at only what is new costs nothing for what was seen.
    fn pending_after(&self, after: u64) -> usize {
        self.pending.partition_point(|p| p.tag <= after)
    }

    /// The reads waiting on this server sent after tag `after`, of whole pieces and of byte
    /// ranges in one (a 4 KiB piece's cell), as (operation, piece).
    pub(crate) fn pending_reads(&self, after: u64) -> impl Iterator<Item = (u64, u8)> + '_ {
        self.pending
            .range(self.pending_after(after)..)
            .filter_map(Pending::read)
    }

    /// The reads waiting on this server sent after tag `after` and by `by`, as in
    /// [`Conn::pending_reads`], and the tag of the newest request sent by then (the `after`
    /// for the next look: requests are sent in the order of their tags).
    pub(crate) fn reads_sent_by(&self, after: u64, by: Instant) -> (Vec<(u64, u8)>, u64) {
        let from = self.pending_after(after);
        let to = self.pending.partition_point(|p| p.sent <= by);
        if to <= from {
            return (Vec::new(), after);
        }
        let reads = self.pending.range(from..to).filter_map(Pending::read);
        (reads.collect(), self.pending[to - 1].tag)
    }

    /// The operations of the reads (whole pieces and byte ranges) waiting on this server.
    pub(crate) fn pending_read_ops(&self) -> impl Iterator<Item = u64> + '_ {
        self.pending
            .iter()
            .filter_map(Pending::read)
            .map(|(op, _)| op)
    }

    /// The writes waiting on this server sent after tag `after` that are not redirected yet,
    /// as (position among the unanswered requests, operation, piece, key), oldest first.
    pub(crate) fn pending_writes(&self, after: u64) -> Vec<(usize, u64, u8, u64)> {
        let from = self.pending_after(after);
        self.pending
            .range(from..)
            .enumerate()
            .map(|(i, p)| (from + i, p))
            .filter_map(|(i, p)| match p.kind {
                Kind::Write { op, piece, key } if op != REDIRECTED => Some((i, op, piece, key)),
                _ => None,
            })
            .collect()
    }

    /// Take the writes at positions `at` (from [`Conn::pending_writes`], ascending) off this
    /// server's hands: their pieces, as sent, for another server to store. The frames stay
    /// on the link in their place (part of one may be sent already), so whatever is queued
    /// after them here (a free of the same key) still comes after them; their answers, should
    /// any come, name no operation ([`REDIRECTED`]) and are ignored.
    pub(crate) fn redirect_writes(&mut self, at: &[usize]) -> Vec<Vec<u8>> {
        let mut units = Vec::with_capacity(at.len());
        let mut next = at.iter().copied().peekable();
        let lens: Vec<usize> = self.pending.iter().map(|p| p.len).collect();
        let frames = self.out.frames(lens.into_iter());
        for ((i, p), frame) in self.pending.iter_mut().enumerate().zip(frames) {
            if next.peek() != Some(&i) {
                continue;
            }
            next.next();
            let Kind::Write { op, .. } = &mut p.kind else {
                unreachable!("request {i} is not a write")
            };
            *op = REDIRECTED;
            units.push(written_page(frame));
        }
        assert!(
            next.next().is_none(),
            "a position past the unanswered requests"
        );
        units
    }

    /// Every unanswered request, for a store that gives this server up: writes with their
    /// piece. The link is dropped and nothing more is sent.
    pub(crate) fn take_orphans(&mut self) -> Vec<Orphan> {
        let mut orphans = Vec::with_capacity(self.pending.len());
        // The pieces held for a server given up on (up to RELEASED_MAX_BYTES of them) are in
        // memory once while they are taken, not twice (Outbox::drain_frames).
        let kinds = std::mem::take(&mut self.pending)
            .into_iter()
            .map(|p| (p.len, p.kind));
        std::mem::take(&mut self.out).drain_frames(kinds, |kind, frame| {
            let unit = match kind {
                Kind::Write { .. } => Some(written_page(frame)),
                _ => None,
            };
            orphans.push(Orphan { kind, unit });
        });
        self.sock = None;
        // A server given up on keeps its slot (pages name servers by index) but no buffer
        // (a new link makes its own): a long run in a pool whose servers come and go grew by
        // a receive buffer (256 KiB) for every server it had lost or seen drained, and by the
        // room its unanswered requests and frees had taken at their most (tools/soak.sh).
        self.frees = Vec::new();
        self.inbuf = Vec::new();
        (self.in_start, self.in_end) = (0, 0);
        orphans
    }

    /// Bytes this connection holds for its link and its requests: buffers, unanswered
    /// frames, spare segments, frees (a server given up on holds none).
    #[cfg(test)]
    pub(crate) fn kept_bytes(&self) -> usize {
        let segs = self.out.segs.iter().chain(&self.out.spare);
        self.inbuf.capacity()
            + self.pending.capacity() * std::mem::size_of::<Pending>()
            + self.frees.capacity() * std::mem::size_of::<PageKey>()
            + segs.map(Vec::capacity).sum::<usize>()
    }

    /// Read what is available and hand complete responses to `f`. A broken link is lost
    /// (see [`Conn::lose`]), not an error.
    pub(crate) fn poll(
        &mut self,
        f: &mut dyn FnMut(Answer<'_>),
        now: Instant,
    ) -> Result<(), StoreError> {
        self.receive(f).or_else(|e| self.lose(e, now))
    }

    fn receive(&mut self, f: &mut dyn FnMut(Answer<'_>)) -> Result<(), StoreError> {
        let unit = self.page_size;
        let Some(mut sock) = self.sock.as_ref() else {
            return Ok(());
        };
        // A read that left room in the buffer took all the socket had: the frames it
        // completed are handed on, and the next poll of the socket says when more comes (no
        // read that only finds it empty, one system call per answer saved).
        let mut drained = false;
        loop {
            // Parse every complete frame already buffered.
            loop {
                let avail = &self.inbuf[self.in_start..self.in_end];
                let h = match parse_header(avail, self.frame_len_max) {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(e) => {
                        return Err(StoreError::Protocol {
                            server: self.name.clone(),
                            what: e.to_string(),
                        })
                    }
                };
                let total = HEADER_LEN + h.len as usize;
                if total > self.inbuf.len() {
                    return Err(StoreError::Protocol {
                        server: self.name.clone(),
                        what: format!("response of {total} bytes exceeds the receive buffer"),
                    });
                }
                if avail.len() < total {
                    break;
                }
                let body_start = self.in_start + HEADER_LEN;
                self.in_start += total;
                self.last_activity = Instant::now();
                // Left at the front until its answer is taken: a bad answer leaves it and its
                // frame in `out` unanswered together, as `take_orphans` and a re-send expect.
                let pending =
                    self.pending
                        .front()
                        .copied()
                        .ok_or_else(|| StoreError::Protocol {
                            server: self.name.clone(),
                            what: format!("unsolicited {:?} frame", h.op),
                        })?;
                let proto = |what: String| StoreError::Protocol {
                    server: self.name.clone(),
                    what,
                };
                if pending.tag != h.tag {
                    return Err(proto(format!(
                        "answer tag {} out of order (expected {})",
                        h.tag, pending.tag
                    )));
                }
                let body = &self.inbuf[body_start..body_start + h.len as usize];
                let resp = Response::decode(h.op, body).map_err(|e| proto(e.to_string()))?;
                match (pending.kind, resp) {
                    (
                        Kind::Read { op, piece, key },
                        Response::ReadOk {
                            key: k,
                            count: 1,
                            data,
                        },
                    ) if k.0 == key && data.len() == unit => {
                        let at = within(&self.inbuf, data);
                        let data = &mut self.inbuf[at];
                        f(Answer::Read { op, piece, data })
                    }
                    (Kind::Write { op, piece, key }, Response::WriteOk { key: k, count: 1 })
                        if k.0 == key =>
                    {
                        f(Answer::Written { op, piece })
                    }
                    (
                        Kind::ReadRange {
                            op,
                            piece,
                            key,
                            offset,
                            len,
                        },
                        Response::ReadRangeOk {
                            key: k,
                            offset: o,
                            data,
                        },
                    ) if k.0 == key && o == offset && data.len() == len as usize => {
                        let at = within(&self.inbuf, data);
                        let data = &mut self.inbuf[at];
                        f(Answer::Read { op, piece, data })
                    }
                    (
                        Kind::WriteRange {
                            op,
                            piece,
                            key,
                            offset,
                        },
                        Response::WriteRangeOk {
                            key: k, offset: o, ..
                        },
                    ) if k.0 == key && o == offset => f(Answer::Written { op, piece }),
                    (
                        Kind::WriteRange { op, piece, .. },
                        Response::Error {
                            code: rmem_proto::ErrorCode::Full,
                            message,
                        },
                    ) => {
                        // No other server takes a region's page (its place is fixed): the
                        // caller is told.
                        self.full = true;
                        self.refused_why = message.to_string();
                        f(Answer::Full {
                            op,
                            piece,
                            unit: Vec::new(),
                        });
                    }
                    (Kind::Pull { batch }, Response::Pulled { stored, message }) => {
                        f(Answer::Pulled {
                            batch,
                            stored,
                            why: message,
                        })
                    }
                    (Kind::Free, Response::FreeOk { .. })
                    | (Kind::Snapshot, Response::SnapshotOk { .. })
                    | (Kind::EndSnapshot, Response::SessionEnded { .. }) => {}
                    (
                        Kind::Ping,
                        Response::Pong {
                            used_bytes,
                            capacity_bytes,
                        },
                    ) => {
                        // The server's numbers: a lying one must not overflow them.
                        if capacity_bytes.saturating_sub(used_bytes) >= unit as u64 {
                            self.full = false;
                        }
                    }
                    (
                        Kind::Read { op, piece, .. },
                        Response::Error {
                            code: rmem_proto::ErrorCode::NotFound,
                            ..
                        },
                    ) => f(Answer::Missing { op, piece }),
                    // A sub-page fetch (`ReadPart`) of a page the server does not hold.
                    (
                        Kind::ReadRange { op, piece, .. },
                        Response::Error {
                            code: rmem_proto::ErrorCode::NotFound,
                            ..
                        },
                    ) => f(Answer::Missing { op, piece }),
                    (
                        Kind::Write { op, piece, .. },
                        Response::Error {
                            code: rmem_proto::ErrorCode::Full,
                            message,
                        },
                    ) => {
                        // Overcommit: the piece goes to another server.
                        self.full = true;
                        self.refused_why = message.to_string();
                        let frame = self.out.frames(std::iter::once(pending.len)).next();
                        let unit = written_page(frame.expect("the answered frame"));
                        f(Answer::Full { op, piece, unit });
                    }
                    (_, Response::Error { code, message }) => {
                        let server = self.name.clone();
                        let message = message.to_string();
                        return Err(match code {
                            rmem_proto::ErrorCode::SessionLost => StoreError::SessionLost {
                                server,
                                detail: format!(": {message}"),
                            },
                            code => StoreError::Server {
                                server,
                                code,
                                message,
                            },
                        });
                    }
                    (kind, resp) => {
                        return Err(proto(format!(
                            "{} does not answer {}",
                            describe_answer(&resp),
                            describe_request(kind, self.page_size)
                        )))
                    }
                }
                self.pending.pop_front();
                self.out.answered(pending.len);
                // An answer: whatever outage there was is over.
                self.relinked = None;
            }
            if drained {
                return Ok(());
            }
            if self.in_start == self.in_end {
                self.in_start = 0;
                self.in_end = 0;
            } else if self.in_end == self.inbuf.len() {
                self.inbuf.copy_within(self.in_start..self.in_end, 0);
                self.in_end -= self.in_start;
                self.in_start = 0;
            }
            let room = self.inbuf.len() - self.in_end;
            match sock.read(&mut self.inbuf[self.in_end..]) {
                Ok(0) => {
                    return Err(StoreError::Closed {
                        server: self.name.clone(),
                        detail: self.describe_inflight(),
                    })
                }
                Ok(n) => {
                    self.in_end += n;
                    drained = n < room;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let detail = self.describe_inflight();
                    return Err(match io_err(&self.name, e) {
                        StoreError::Closed { server, detail: d } => StoreError::Closed {
                            server,
                            detail: d + &detail,
                        },
                        other => other,
                    });
                }
            }
        }
    }

    /// Periodic upkeep: reconnect when lost, lose a link whose oldest request waited past
    /// the timeout, ping an idle one.
    pub(crate) fn tick(&mut self, now: Instant) -> Result<(), StoreError> {
        if self.lost.is_some() {
            return self.reconnect(now);
        }
        if self.never_linked() {
            // A fork child that has not needed this server yet: from a heartbeat on, a ping
            // opens the link and keeps the snapshot's lease (it would expire otherwise).
            if now.saturating_duration_since(self.last_activity) > self.heartbeat() {
                self.submit(Request::Ping, Kind::Ping);
                self.last_activity = now;
            }
            return self.flush(now);
        }
        if let Some(waited) = self.silent_for(now) {
            if waited > self.timing.request {
                let e = StoreError::Timeout {
                    server: self.name.clone(),
                    secs: waited.as_secs_f64(),
                    detail: self.describe_inflight(),
                };
                return self.lose(e, now);
            }
        } else {
            // Idle: notice a closed connection now rather than at the next fault, and
            // ping so that a silently dead host is caught by the deadline above (and the
            // session's lease is renewed).
            self.poll(&mut |_| {}, now)?;
            if self.lost.is_none()
                && now.saturating_duration_since(self.last_activity) > self.heartbeat()
            {
                self.submit(Request::Ping, Kind::Ping);
                self.last_activity = now;
            }
        }
        self.flush(now)
    }

    /// End the session on a clean exit, so the server frees its pages now rather than when
    /// the lease runs out. Best effort, bounded by the connect timeout: waits for the
    /// answer, since closing a socket with unread answers resets it and the server could
    /// drop the request.
    pub(crate) fn end_session(&mut self) {
        let deadline = Instant::now() + self.timing.connect.min(Duration::from_secs(1));
        while !self.pending.is_empty() && self.sock.is_some() && Instant::now() < deadline {
            let now = Instant::now();
            if self.flush(now).is_err()
                || self.poll(&mut |_| {}, now).is_err()
                || self.lost.is_some()
            {
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let (Some(sock), None, true) = (&mut self.sock, &self.lost, self.pending.is_empty()) else {
            return;
        };
        let timeout = self.timing.connect.min(Duration::from_secs(1));
        if sock.set_nonblocking(false).is_err() || sock.set_write_timeout(Some(timeout)).is_err() {
            return;
        }
        let mut frame = Vec::new();
        Request::EndSession.encode(0, &mut frame);
        if sock.write_all(&frame).is_ok() {
            let deadline = Instant::now() + timeout;
            let _ = read_frame(sock, &self.name, "session end", &mut frame, 64, deadline);
        }
    }
}

/// An answer, for the message when it does not fit its request.
fn describe_answer(resp: &Response<'_>) -> String {
    match resp {
        Response::ReadOk { key, count, data } => {
            format!(
                "ReadOk of {count} page(s) at {} with {} bytes",
                key.0,
                data.len()
            )
        }
        Response::SwapOk { read_key, data } => {
            format!("SwapOk of page {} with {} bytes", read_key.0, data.len())
        }
        Response::WriteOk { key, count } => format!("WriteOk of {count} page(s) at {}", key.0),
        other => format!("{:?}", other.op()),
    }
}

/// A request, for the same message.
fn describe_request(kind: Kind, unit: usize) -> String {
    match kind {
        Kind::Read { key, piece, .. } => {
            format!("a read of page {key} piece {piece} ({unit} bytes)")
        }
        Kind::Write { key, piece, .. } => format!("a write of page {key} piece {piece}"),
        Kind::ReadRange {
            key, offset, len, ..
        } => format!("a read of {len} bytes at offset {offset} of page {key}"),
        Kind::WriteRange { key, offset, .. } => {
            format!("a write at offset {offset} of page {key}")
        }
        Kind::Free => "a free".into(),
        Kind::Ping => "a ping".into(),
        Kind::Pull { .. } => "a pull".into(),
        Kind::Snapshot => "a snapshot".into(),
        Kind::EndSnapshot => "the end of a snapshot".into(),
    }
}

/// The page a Write frame of ours carries.
fn written_page(frame: &[u8]) -> Vec<u8> {
    let h = parse_header(frame, u32::MAX)
        .expect("a frame we encoded")
        .expect("whole");
    match Request::decode(h.op, &frame[HEADER_LEN..]).expect("a frame we encoded") {
        Request::Write { data, .. } => data.to_vec(),
        other => unreachable!("{:?} carries no page", other.op()),
    }
}

/// What a server told a client that proved it knows the token.
#[derive(Clone, Copy, Debug)]
pub struct Welcome {
    pub frame_len_max: u32,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

/// Largest frame the handshake, the attach and a status answer may be.
const SETUP_FRAME_MAX: u32 = rmem_proto::FRAME_LEN_MAX_DEFAULT;

/// `read_exact` that gives up at `deadline` however slowly the bytes come: a socket's read
/// timeout bounds one read, and a server that sends a byte at a time would otherwise hold a
/// handshake for as long as it likes.
fn read_exact_by(sock: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        sock.set_read_timeout(Some(left))?;
        match sock.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read one whole frame of at most `max` bytes on a blocking socket by `deadline`; `what`
/// names the frame expected, for the message when none comes. Running out of time is a
/// [`StoreError::Timeout`] (a link failure: retried while reconnecting).
pub fn read_frame(
    sock: &mut TcpStream,
    server: &str,
    what: &str,
    body: &mut Vec<u8>,
    max: u32,
    deadline: Instant,
) -> Result<rmem_proto::Header, StoreError> {
    let started = Instant::now();
    let failed = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => StoreError::Timeout {
            server: server.into(),
            secs: started.elapsed().as_secs_f64(),
            detail: format!(" (waiting for its {what})"),
        },
        _ => io_err(server, e),
    };
    let mut hdr = [0u8; HEADER_LEN];
    read_exact_by(sock, &mut hdr, deadline).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => failed(e),
        // A reset before any answer: the listener went away with the connection in its
        // backlog (a server killed as the client reconnects, to be restarted): a link
        // failure, tried again while reconnecting, not a refusal.
        io::ErrorKind::ConnectionReset => io_err(server, e),
        // Most often a process that ended (a manager or server stopped) with the connection
        // open; a service of another kind usually answers something first.
        io::ErrorKind::UnexpectedEof => StoreError::Refused {
            server: server.into(),
            message: format!(
                "it closed the connection before its {what}: it ended, or it is not an rmem \
                 server of this version"
            ),
        },
        _ => StoreError::Refused {
            server: server.into(),
            message: format!("no {what} ({e}); is it an rmem server of this version?"),
        },
    })?;
    let h = parse_header(&hdr, max)
        .map_err(|e| StoreError::Protocol {
            server: server.into(),
            what: format!(
                "{e} (waiting for its {what}; it began with {}: is it an rmem server of this \
                 version?)",
                shown_bytes(&hdr)
            ),
        })?
        .expect("full header");
    body.resize(h.len as usize, 0);
    read_exact_by(sock, body, deadline).map_err(failed)?;
    Ok(h)
}

/// Bytes a peer sent, as text if they are (another service's greeting, such as `HTTP/1.1 4`
/// or `SSH-2.0-O`, says at once what answered), else in hex.
fn shown_bytes(b: &[u8]) -> String {
    if b.iter().all(|c| c.is_ascii_graphic() || *c == b' ') {
        format!("{:?}", String::from_utf8_lossy(b))
    } else {
        b.iter()
            .map(|c| format!("{c:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The client's side of the challenge and response (`rmem_proto::auth`) on a connected,
/// blocking socket, all of it by `deadline`: both sides prove they know `token` without
/// sending it. On success the socket is ready for requests.
pub fn handshake(
    sock: &mut TcpStream,
    server: &str,
    token: &[u8],
    page_size: usize,
    deadline: Instant,
) -> Result<Welcome, StoreError> {
    handshake_as(
        sock,
        server,
        token,
        rmem_proto::VERSION,
        page_size as u32,
        deadline,
    )
}

/// [`handshake`] speaking protocol `version` (the memory servers' or the pool manager's,
/// `rmem_proto::pool::VERSION`) with unit size `unit`.
pub fn handshake_as(
    sock: &mut TcpStream,
    server: &str,
    token: &[u8],
    version: u16,
    unit: u32,
    deadline: Instant,
) -> Result<Welcome, StoreError> {
    let proto = |what: String| StoreError::Protocol {
        server: server.into(),
        what,
    };
    let refused = |code, message: &str| StoreError::Refused {
        server: server.into(),
        message: format!("{code}: {message}"),
    };
    let send = |sock: &mut TcpStream, req: Request<'_>| {
        let mut frame = Vec::new();
        req.encode(0, &mut frame);
        sock.write_all(&frame).map_err(|e| io_err(server, e))
    };
    let mut transcript = auth::Transcript {
        client_nonce: auth::nonce().map_err(|e| io_err(server, e))?,
        server_nonce: [0; auth::NONCE_LEN],
        version,
        page_size: unit,
    };
    send(
        sock,
        Request::Hello {
            version: transcript.version,
            page_size: transcript.page_size,
            nonce: transcript.client_nonce,
        },
    )?;
    let mut body = Vec::new();
    let h = read_frame(
        sock,
        server,
        "challenge",
        &mut body,
        SETUP_FRAME_MAX,
        deadline,
    )?;
    match Response::decode(h.op, &body).map_err(|e| proto(e.to_string()))? {
        Response::Challenge { nonce } => transcript.server_nonce = nonce,
        Response::Error { code, message } => return Err(refused(code, message)),
        other => return Err(proto(format!("expected challenge, got {:?}", other.op()))),
    }
    let proof = transcript.proof(token, auth::Role::Client);
    send(sock, Request::Auth { proof })?;
    let h = read_frame(
        sock,
        server,
        "welcome",
        &mut body,
        SETUP_FRAME_MAX,
        deadline,
    )?;
    match Response::decode(h.op, &body).map_err(|e| proto(e.to_string()))? {
        Response::Welcome {
            version,
            frame_len_max,
            capacity_bytes,
            used_bytes,
            proof,
        } => {
            if version != transcript.version {
                return Err(proto(format!(
                    "protocol version {version}, this client speaks {}",
                    transcript.version
                )));
            }
            if !transcript.verify(token, auth::Role::Server, &proof) {
                return Err(StoreError::Impostor {
                    server: server.into(),
                });
            }
            Ok(Welcome {
                frame_len_max,
                capacity_bytes,
                used_bytes,
            })
        }
        Response::Error { code, message } => Err(refused(code, message)),
        other => Err(proto(format!("expected welcome, got {:?}", other.op()))),
    }
}

pub use super::cluster::{RemoteStore, SERVERS_MAX};

#[cfg(test)]
mod tests {
    use super::*;

    fn push(out: &mut Outbox, frame: &[u8]) {
        out.tail().extend_from_slice(frame);
    }

    /// Send everything unsent, `chunk` bytes per write at most; what went out.
    fn send_all(out: &mut Outbox, chunk: usize) -> Vec<u8> {
        let mut wire = Vec::new();
        while !out.unsent().is_empty() {
            let n = out.unsent().len().min(chunk);
            wire.extend_from_slice(&out.unsent()[..n]);
            out.sent(n);
        }
        wire
    }

    /// Frames go out whole and in order across segments, in partial writes; answered ones
    /// are dropped, a rewind re-sends exactly the unanswered ones, and emptied segments are
    /// reused.
    #[test]
    fn another_service_s_greeting_is_shown_as_text_and_binary_in_hex() {
        assert_eq!(shown_bytes(b"HTTP/1.1 400 Bad"), "\"HTTP/1.1 400 Bad\"");
        assert_eq!(shown_bytes(&[0x16, 0x03, 0x01, 0xff]), "16 03 01 ff");
    }

    #[test]
    fn the_outbox_sends_resends_and_reuses_in_order() {
        let frames: Vec<Vec<u8>> = [100_000, 200_000, 50_000, 300_000, 70_000, 5, 262_144, 1]
            .iter()
            .enumerate()
            .map(|(i, &n)| vec![i as u8 + 1; n])
            .collect();
        let mut out = Outbox::default();
        // Half the frames, sent, then the rest queued behind a partly sent one.
        for f in &frames[..4] {
            push(&mut out, f);
        }
        let mut wire = send_all(&mut out, 70_000);
        for f in &frames[4..] {
            push(&mut out, f);
        }
        wire.extend(send_all(&mut out, 9_999));
        assert_eq!(wire, frames.concat());
        let lens = || frames.iter().map(|f| f.len());
        assert!(out.frames(lens()).eq(frames.iter().map(|f| f.as_slice())));
        // Three answered: the rest is what a new link sends again.
        for f in &frames[..3] {
            out.answered(f.len());
        }
        assert!(out
            .frames(lens().skip(3))
            .eq(frames[3..].iter().map(|f| f.as_slice())));
        let mut drained = Vec::new();
        out.clone()
            .drain_frames(lens().skip(3).map(|n| (n, ())), |(), f| {
                drained.push(f.to_vec())
            });
        assert_eq!(
            drained,
            frames[3..],
            "a lost server's frames, taken segment by segment"
        );
        out.rewind();
        assert_eq!(send_all(&mut out, 100_000), frames[3..].concat());
        for f in &frames[3..] {
            out.answered(f.len());
        }
        assert!(out.unsent().is_empty() && out.segs.is_empty());
        assert!(!out.spare.is_empty(), "emptied segments are kept for reuse");
        let spare = out.spare.len();
        push(&mut out, &frames[0]);
        assert_eq!(out.spare.len(), spare - 1);
        assert_eq!(send_all(&mut out, 1 << 20), frames[0]);
    }
}
