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

use super::{Completion, PageStore, StoreError};
use crate::config::Placement;
use crate::PageIndex;
use rmem_proto::{auth, parse_header, PageKey, Request, Response, SessionId, HEADER_LEN};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
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

#[derive(Clone, Copy, Debug)]
enum Kind {
    Fetch(PageIndex),
    Store(PageIndex),
    Swap { victim: PageIndex, page: PageIndex },
    Free,
    Ping,
}

#[derive(Debug)]
struct Pending {
    tag: u64,
    kind: Kind,
    sent: Instant,
    /// Bytes of its frame in `Conn::out`.
    len: usize,
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
}

/// Shortest and longest waits between two reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Unanswered bytes kept at the front of `out` before they are dropped from it.
const OUT_COMPACT: usize = 1 << 20;

/// Every request frame not yet answered, in order, then the ones not yet sent:
/// `[acked..pos)` sent and unanswered, `[pos..)` unsent. Kept so that a new link can re-send
/// them.
#[derive(Default)]
struct Outbox {
    buf: Vec<u8>,
    acked: usize,
    pos: usize,
}

impl Outbox {
    fn unsent(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// The oldest unanswered frame, `len` bytes, was answered: it need not be kept.
    fn answered(&mut self, len: usize) {
        self.acked += len;
        debug_assert!(self.acked <= self.pos);
        if self.acked == self.buf.len() {
            self.buf.clear();
            self.acked = 0;
            self.pos = 0;
        } else if self.acked > OUT_COMPACT && self.acked * 2 > self.buf.len() {
            self.buf.drain(..self.acked);
            self.pos -= self.acked;
            self.acked = 0;
        }
    }

    /// A new link: everything unanswered is unsent again.
    fn rewind(&mut self) {
        self.pos = self.acked;
    }
}

/// A write the server answered `Full`: the store places the page elsewhere (a swap's fetch is
/// sent again on its own).
#[derive(Debug)]
enum Rejected {
    Store {
        page: PageIndex,
        data: Vec<u8>,
    },
    Swap {
        victim: PageIndex,
        page: PageIndex,
        data: Vec<u8>,
    },
}

/// One server: its session, its link (when up), and every unanswered request.
pub struct Conn {
    name: String,
    token: Vec<u8>,
    session: SessionId,
    page_size: usize,
    timing: Timing,
    sock: Option<TcpStream>,
    out: Outbox,
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    pending: VecDeque<Pending>,
    next_tag: u64,
    frees: Vec<PageKey>,
    last_activity: Instant,
    frame_len_max: u32,
    /// The lease the server granted.
    lease: Duration,
    lost: Option<Lost>,
    /// An outage whose new link has not been answered on yet: kept so that losing the link
    /// again continues it (and its deadline) rather than starting a new one.
    relinked: Option<Lost>,
    /// Links re-established.
    reconnects: u64,
    /// Bytes this client may use on the server (its capacity less what others used at connect).
    capacity_bytes: u64,
    /// Bytes this client has placed there.
    used_bytes: u64,
    /// The server's whole capacity, for messages.
    server_capacity_bytes: u64,
    /// It answered `Full`: new pages go elsewhere until this client frees a page there or a
    /// ping shows room.
    full: bool,
    /// Writes answered `Full`, for the store to place again.
    rejected: Vec<Rejected>,
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

/// A connected, authenticated, attached link and what the server said.
struct Link {
    sock: TcpStream,
    welcome: Welcome,
    lease: Duration,
    existed: bool,
}

/// Connect to `server`, authenticate and attach `session` (blocking, each step bounded by
/// `timeout`).
fn open(
    server: &str,
    token: &[u8],
    page_size: usize,
    session: SessionId,
    timeout: Duration,
) -> Result<Link, StoreError> {
    let connect_err = |source| StoreError::Connect {
        server: server.into(),
        source,
    };
    // Connecting, the handshake and the attach all together, however slowly bytes come.
    let deadline = Instant::now() + timeout;
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
    let mut sock = sock.ok_or_else(|| connect_err(last))?;
    sock.set_nodelay(true).map_err(connect_err)?;
    sock.set_read_timeout(Some(timeout)).map_err(connect_err)?;
    sock.set_write_timeout(Some(timeout)).map_err(connect_err)?;
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
    Request::Attach {
        session,
        lease_ms: 0,
        flags: rmem_proto::ATTACH_EXCLUSIVE,
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
    let (lease, existed) = match Response::decode(h.op, &frame).map_err(|e| proto(e.to_string()))? {
        Response::Attached {
            lease_ms, flags, ..
        } => (
            Duration::from_millis(lease_ms.max(1).into()),
            flags & rmem_proto::ATTACHED_EXISTED != 0,
        ),
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
        existed,
    })
}

impl Conn {
    /// Connect, authenticate, learn the server's limits and open `session` there.
    pub fn connect(
        server: &str,
        token: &[u8],
        page_size: usize,
        session: SessionId,
        timing: Timing,
    ) -> Result<Conn, StoreError> {
        let link = open(server, token, page_size, session, timing.connect)?;
        let inbuf_len = (2 * (page_size + 64)).max(256 * 1024);
        Ok(Conn {
            name: server.into(),
            token: token.to_vec(),
            session,
            page_size,
            timing,
            sock: Some(link.sock),
            out: Outbox {
                buf: Vec::with_capacity(256 * 1024),
                ..Outbox::default()
            },
            inbuf: vec![0; inbuf_len],
            in_start: 0,
            in_end: 0,
            pending: VecDeque::new(),
            next_tag: 1,
            frees: Vec::new(),
            last_activity: Instant::now(),
            frame_len_max: link.welcome.frame_len_max,
            lease: link.lease,
            lost: None,
            relinked: None,
            reconnects: 0,
            capacity_bytes: link
                .welcome
                .capacity_bytes
                .saturating_sub(link.welcome.used_bytes),
            used_bytes: 0,
            server_capacity_bytes: link.welcome.capacity_bytes,
            full: false,
            rejected: Vec::new(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn heartbeat(&self) -> Duration {
        self.timing.heartbeat.min(self.lease / 3)
    }

    fn submit(&mut self, req: Request<'_>, kind: Kind) {
        let tag = self.next_tag;
        self.next_tag += 1;
        let start = self.out.buf.len();
        req.encode(tag, &mut self.out.buf);
        self.pending.push_back(Pending {
            tag,
            kind,
            sent: Instant::now(),
            len: self.out.buf.len() - start,
        });
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
                },
            });
        }
        Ok(())
    }

    /// While lost: try a new link when the backoff allows; give up (with the first cause)
    /// once reconnecting has taken longer than allowed (at most the lease: after it the
    /// session is gone anyway).
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
            return Err(StoreError::GaveUp {
                cause: Box::new(std::mem::replace(&mut lost.cause, gone)),
                secs: spent.as_secs_f64(),
                last: lost.last_try.clone().unwrap_or_else(|| "no attempt".into()),
            });
        }
        if now < lost.next_try {
            return Ok(());
        }
        let timeout = self
            .timing
            .connect
            .min(window - spent)
            .max(Duration::from_millis(1));
        match open(
            &self.name,
            &self.token,
            self.page_size,
            self.session,
            timeout,
        ) {
            Ok(link) => {
                if !link.existed && self.used_bytes > 0 {
                    return Err(StoreError::SessionLost {
                        server: self.name.clone(),
                        detail: format!(
                            "after the connection was lost {:.1} s ago ({}), it no longer held this program's {} bytes (lease {:.1} s)",
                            spent.as_secs_f64(),
                            lost.cause,
                            self.used_bytes,
                            link.lease.as_secs_f64()
                        ),
                    });
                }
                self.sock = Some(link.sock);
                self.lease = link.lease;
                self.frame_len_max = link.welcome.frame_len_max;
                self.relinked = self.lost.take();
                self.reconnects += 1;
                // Answers half-read from the old link are gone; every unanswered request
                // goes out again, in order, with its tag.
                self.in_start = 0;
                self.in_end = 0;
                self.out.rewind();
                self.last_activity = now;
                for p in &mut self.pending {
                    p.sent = now;
                }
                self.flush(now)
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

    fn flush(&mut self, now: Instant) -> Result<(), StoreError> {
        if !self.frees.is_empty() {
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
        if self.lost.is_some() {
            return self.reconnect(now);
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
                Ok(n) => self.out.pos += n,
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
                kind: Kind::Fetch(p),
                ..
            }) => format!(" while page {} was being fetched", p.0),
            Some(Pending {
                kind: Kind::Store(p),
                ..
            }) => format!(" while page {} was being written back", p.0),
            Some(Pending {
                kind: Kind::Swap { victim, page },
                ..
            }) => {
                format!(
                    " while page {} was being written back and page {} fetched",
                    victim.0, page.0
                )
            }
            Some(_) => format!(" with {} requests in flight", self.pending.len()),
            None => String::new(),
        }
    }

    /// Read what is available and hand complete responses to `f`. A broken link is lost
    /// (see [`Conn::lose`]), not an error.
    fn poll(
        &mut self,
        f: &mut dyn FnMut(Completion<'_>),
        now: Instant,
    ) -> Result<usize, StoreError> {
        let mut done = 0;
        match self.receive(f, &mut done) {
            Ok(()) => Ok(done),
            Err(e) => self.lose(e, now).map(|()| done),
        }
    }

    fn receive(
        &mut self,
        f: &mut dyn FnMut(Completion<'_>),
        done: &mut usize,
    ) -> Result<(), StoreError> {
        let page_size = self.page_size;
        let Some(mut sock) = self.sock.as_ref() else {
            return Ok(());
        };
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
                let pending = self
                    .pending
                    .pop_front()
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
                *done += 1;
                match (pending.kind, resp) {
                    (
                        Kind::Fetch(page),
                        Response::ReadOk {
                            key,
                            count: 1,
                            data,
                        },
                    ) if key.0 == page.0 && data.len() == page_size => {
                        f(Completion::Fetched { page, data })
                    }
                    (Kind::Store(page), Response::WriteOk { key, count: 1 }) if key.0 == page.0 => {
                        f(Completion::Stored { page })
                    }
                    (Kind::Swap { victim, page }, Response::SwapOk { read_key, data })
                        if read_key.0 == page.0 && data.len() == page_size =>
                    {
                        f(Completion::Stored { page: victim });
                        f(Completion::Fetched { page, data });
                    }
                    (Kind::Free, Response::FreeOk { .. }) => {}
                    (
                        Kind::Ping,
                        Response::Pong {
                            used_bytes,
                            capacity_bytes,
                        },
                    ) => {
                        // The server's numbers: a lying one must not overflow them.
                        if capacity_bytes.saturating_sub(used_bytes) >= page_size as u64 {
                            self.full = false;
                        }
                    }
                    (
                        kind @ (Kind::Store(_) | Kind::Swap { .. }),
                        Response::Error {
                            code: rmem_proto::ErrorCode::Full,
                            ..
                        },
                    ) => {
                        // Overcommit: the page goes to another server (RemoteStore::poll).
                        self.full = true;
                        let at = self.out.acked;
                        let data = written_page(&self.out.buf[at..at + pending.len]);
                        self.rejected.push(match kind {
                            Kind::Swap { victim, page } => Rejected::Swap { victim, page, data },
                            Kind::Store(page) => Rejected::Store { page, data },
                            _ => unreachable!(),
                        });
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
                            describe_request(kind, page_size)
                        )))
                    }
                }
                self.out.answered(pending.len);
                // An answer: whatever outage there was is over.
                self.relinked = None;
            }
            if self.in_start == self.in_end {
                self.in_start = 0;
                self.in_end = 0;
            } else if self.in_end == self.inbuf.len() {
                self.inbuf.copy_within(self.in_start..self.in_end, 0);
                self.in_end -= self.in_start;
                self.in_start = 0;
            }
            match sock.read(&mut self.inbuf[self.in_end..]) {
                Ok(0) => {
                    return Err(StoreError::Closed {
                        server: self.name.clone(),
                        detail: self.describe_inflight(),
                    })
                }
                Ok(n) => self.in_end += n,
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
    fn tick(&mut self, now: Instant) -> Result<(), StoreError> {
        if self.lost.is_some() {
            return self.reconnect(now);
        }
        if let Some(p) = self.pending.front() {
            let waited = now.saturating_duration_since(p.sent.max(self.last_activity));
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
    fn end_session(&mut self) {
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
fn describe_request(kind: Kind, page_size: usize) -> String {
    match kind {
        Kind::Fetch(p) => format!("a read of page {} ({page_size} bytes)", p.0),
        Kind::Store(p) => format!("a write of page {}", p.0),
        Kind::Swap { victim, page } => format!(
            "a swap writing page {} and reading page {} ({page_size} bytes)",
            victim.0, page.0
        ),
        Kind::Free => "a free".into(),
        Kind::Ping => "a ping".into(),
    }
}

/// The page a Write or Swap frame of ours carries.
fn written_page(frame: &[u8]) -> Vec<u8> {
    let h = parse_header(frame, u32::MAX)
        .expect("a frame we encoded")
        .expect("whole");
    match Request::decode(h.op, &frame[HEADER_LEN..]).expect("a frame we encoded") {
        Request::Write { data, .. } | Request::Swap { data, .. } => data.to_vec(),
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
        _ => StoreError::Refused {
            server: server.into(),
            message: format!("no {what} ({e}); is it an rmem server of this version?"),
        },
    })?;
    let h = parse_header(&hdr, max)
        .map_err(|e| StoreError::Protocol {
            server: server.into(),
            what: format!("{e} (waiting for its {what})"),
        })?
        .expect("full header");
    body.resize(h.len as usize, 0);
    read_exact_by(sock, body, deadline).map_err(failed)?;
    Ok(h)
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
        version: rmem_proto::VERSION,
        page_size: page_size as u32,
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
            if version != rmem_proto::VERSION {
                return Err(proto(format!(
                    "protocol version {version}, this client speaks {}",
                    rmem_proto::VERSION
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

/// Per-page server slot: 0 = no remote copy, i + 1 = on server i. Chunked like the page table.
#[derive(Default)]
struct Locations {
    chunks: Vec<Option<Box<[u16]>>>,
}

const LOC_CHUNK: usize = 1 << 16;

impl Locations {
    fn get(&self, page: PageIndex) -> Option<usize> {
        let c = page.0 as usize / LOC_CHUNK;
        match self.chunks.get(c) {
            Some(Some(ch)) => ch[page.0 as usize % LOC_CHUNK]
                .checked_sub(1)
                .map(usize::from),
            _ => None,
        }
    }

    fn set(&mut self, page: PageIndex, server: Option<usize>) {
        let c = page.0 as usize / LOC_CHUNK;
        if c >= self.chunks.len() {
            if server.is_none() {
                return;
            }
            self.chunks.resize_with(c + 1, || None);
        }
        let ch = self.chunks[c].get_or_insert_with(|| vec![0u16; LOC_CHUNK].into_boxed_slice());
        ch[page.0 as usize % LOC_CHUNK] = server.map_or(0, |s| s as u16 + 1);
    }
}

/// Pages on a set of memory servers.
pub struct RemoteStore {
    conns: Vec<Conn>,
    page_size: usize,
    placement: Placement,
    locations: Locations,
    session: SessionId,
    /// Pages whose write some servers answered `Full`, and those servers, until it is stored.
    refusals: std::collections::HashMap<u64, Vec<usize>>,
}

/// Most servers one client can address (the per-page slot is 16 bits).
pub const SERVERS_MAX: usize = u16::MAX as usize - 1;

impl RemoteStore {
    /// Connect to every server, in order, and open one new session (a random id) on each.
    /// The first failure is returned; sessions already opened are ended.
    pub fn connect(
        servers: &[String],
        token: &[u8],
        page_size: usize,
        placement: Placement,
        timing: Timing,
    ) -> Result<RemoteStore, StoreError> {
        assert!(servers.len() <= SERVERS_MAX, "too many servers");
        let session = SessionId::random().map_err(|e| io_err("(none)", e))?;
        let mut store = RemoteStore {
            conns: Vec::with_capacity(servers.len()),
            page_size,
            placement,
            locations: Locations::default(),
            session,
            refusals: Default::default(),
        };
        for s in servers {
            store
                .conns
                .push(Conn::connect(s, token, page_size, session, timing)?);
        }
        Ok(store)
    }

    /// This client's session id (the same on every server).
    pub fn session(&self) -> SessionId {
        self.session
    }

    /// Links re-established so far, over all servers.
    pub fn reconnects(&self) -> u64 {
        self.conns.iter().map(|c| c.reconnects).sum()
    }

    /// Where `page` goes (and stays): its current server, or a new placement.
    fn place(&mut self, page: PageIndex) -> Result<usize, StoreError> {
        if let Some(s) = self.locations.get(page) {
            return Ok(s);
        }
        let n = self.conns.len();
        let start = match self.placement {
            Placement::Priority => 0,
            Placement::Stripe => (page.0 % n as u64) as usize,
        };
        // Capacity is taken when a page is written (overcommit): the first server not known
        // to be full; else any that has not refused this page yet (another client may have
        // freed room there); only when every server refused it is the store full.
        let refused = self.refusals.get(&page.0).map_or(&[][..], |r| r.as_slice());
        let order = (0..n).map(|i| (start + i) % n);
        let s = order
            .clone()
            .find(|&s| !self.conns[s].full && !refused.contains(&s))
            .or_else(|| order.clone().find(|s| !refused.contains(s)))
            .ok_or_else(|| StoreError::AllFull {
                page: page.0,
                servers: self
                    .conns
                    .iter()
                    .map(|c| format!("{} (capacity {} bytes)", c.name, c.server_capacity_bytes))
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        self.conns[s].used_bytes += self.page_size as u64;
        self.locations.set(page, Some(s));
        Ok(s)
    }

    fn located(&self, page: PageIndex) -> Result<usize, StoreError> {
        self.locations
            .get(page)
            .ok_or_else(|| StoreError::Protocol {
                server: "(none)".into(),
                what: format!("page {} has no remote copy to fetch", page.0),
            })
    }

    /// The server holding `page`, if any (for messages and tests).
    pub fn server_of(&self, page: PageIndex) -> Option<&str> {
        self.locations.get(page).map(|s| self.conns[s].name())
    }

    /// Writes a server answered `Full`: forget that placement and place the page again (its
    /// fetch, for a swap, goes again to where the page is).
    fn place_again(&mut self, server: usize, rejected: Rejected) -> Result<(), StoreError> {
        let (victim, data, fetch) = match rejected {
            Rejected::Store { page, data } => (page, data, None),
            Rejected::Swap { victim, page, data } => (victim, data, Some(page)),
        };
        self.locations.set(victim, None);
        self.conns[server].used_bytes -= self.page_size as u64;
        self.refusals.entry(victim.0).or_default().push(server);
        let s = self.place(victim)?;
        self.conns[s].submit(
            Request::Write {
                key: PageKey(victim.0),
                count: 1,
                data: &data,
            },
            Kind::Store(victim),
        );
        if let Some(page) = fetch {
            self.conns[server].submit(
                Request::Read {
                    key: PageKey(page.0),
                    count: 1,
                },
                Kind::Fetch(page),
            );
        }
        Ok(())
    }

    /// Bytes placed on each server by this client.
    pub fn used_per_server(&self) -> Vec<(String, u64)> {
        self.conns
            .iter()
            .map(|c| (c.name.clone(), c.used_bytes))
            .collect()
    }
}

impl PageStore for RemoteStore {
    fn capacity_bytes(&self) -> u64 {
        // What the servers said (saturating: a lying one may say u64::MAX).
        self.conns
            .iter()
            .fold(0u64, |sum, c| sum.saturating_add(c.capacity_bytes))
    }

    fn fetch(&mut self, page: PageIndex) -> Result<(), StoreError> {
        let s = self.located(page)?;
        self.conns[s].submit(
            Request::Read {
                key: PageKey(page.0),
                count: 1,
            },
            Kind::Fetch(page),
        );
        self.conns[s].flush(Instant::now())
    }

    fn store(&mut self, page: PageIndex, data: &[u8]) -> Result<(), StoreError> {
        debug_assert_eq!(data.len(), self.page_size);
        let s = self.place(page)?;
        self.conns[s].submit(
            Request::Write {
                key: PageKey(page.0),
                count: 1,
                data,
            },
            Kind::Store(page),
        );
        Ok(())
    }

    fn swap(&mut self, victim: PageIndex, data: &[u8], page: PageIndex) -> Result<(), StoreError> {
        let v = self.place(victim)?;
        let p = self.located(page)?;
        if v == p {
            let req = Request::Swap {
                write_key: PageKey(victim.0),
                read_key: PageKey(page.0),
                data,
            };
            self.conns[v].submit(req, Kind::Swap { victim, page });
            self.conns[v].flush(Instant::now())
        } else {
            self.conns[p].submit(
                Request::Read {
                    key: PageKey(page.0),
                    count: 1,
                },
                Kind::Fetch(page),
            );
            self.conns[p].flush(Instant::now())?;
            self.conns[v].submit(
                Request::Write {
                    key: PageKey(victim.0),
                    count: 1,
                    data,
                },
                Kind::Store(victim),
            );
            Ok(())
        }
    }

    fn free(&mut self, page: PageIndex) -> Result<(), StoreError> {
        if let Some(s) = self.locations.get(page) {
            self.locations.set(page, None);
            let c = &mut self.conns[s];
            c.used_bytes -= self.page_size as u64;
            c.full = false;
            c.frees.push(PageKey(page.0));
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        let now = Instant::now();
        self.conns.iter_mut().try_for_each(|c| c.flush(now))
    }

    fn poll(&mut self, f: &mut dyn FnMut(Completion<'_>)) -> Result<usize, StoreError> {
        let mut n = 0;
        let now = Instant::now();
        let refusals = &mut self.refusals;
        let mut f = |c: Completion<'_>| {
            if let (Completion::Stored { page }, false) = (&c, refusals.is_empty()) {
                refusals.remove(&page.0);
            }
            f(c)
        };
        let mut spilled = false;
        for c in &mut self.conns {
            if !c.pending.is_empty() {
                n += c.poll(&mut f, now)?;
                spilled |= !c.rejected.is_empty();
            }
        }
        if spilled {
            for s in 0..self.conns.len() {
                for r in std::mem::take(&mut self.conns[s].rejected) {
                    self.place_again(s, r)?;
                }
            }
            self.flush()?;
        }
        Ok(n)
    }

    fn wait_fds(&self, out: &mut Vec<libc::pollfd>) {
        for c in &self.conns {
            // A lost link has no descriptor: its reconnection runs from tick().
            let Some(sock) = &c.sock else { continue };
            let mut events = libc::POLLIN;
            if !c.out.unsent().is_empty() {
                events |= libc::POLLOUT;
            }
            out.push(libc::pollfd {
                fd: sock.as_raw_fd(),
                events,
                revents: 0,
            });
        }
    }

    fn tick(&mut self, now: Instant) -> Result<(), StoreError> {
        self.conns.iter_mut().try_for_each(|c| c.tick(now))
    }

    fn heartbeat(&self) -> Option<Duration> {
        self.conns.iter().map(Conn::heartbeat).min()
    }

    fn in_flight(&self) -> usize {
        self.conns.iter().map(|c| c.pending.len()).sum()
    }

    fn describe(&self) -> String {
        self.conns
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for RemoteStore {
    /// A clean exit ends the sessions, so servers free the pages now.
    fn drop(&mut self) {
        self.conns.iter_mut().for_each(Conn::end_session);
    }
}
