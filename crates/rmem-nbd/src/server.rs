//! The NBD server's event loop: one thread that polls the listeners, the clients'
//! connections and the page store's links, and moves every request forward as far as the
//! cache lets it.
//!
//! A request is split into the pages it touches; each page is read, written or zeroed as soon
//! as the cache has it, in any order, and the request is answered when its last page is done
//! (and, with FUA, when its pages are on the servers). Requests on one connection, and on
//! every connection, proceed at once, so replies go out in whatever order they finish, as the
//! protocol allows. All connections share one cache, so a FLUSH on one covers the writes
//! acknowledged on all (CAN_MULTI_CONN).

use crate::proto::{self, Command, Export, Handshake, Next, ProtoError, Request};
use rmem_client::blocks::{Barrier, BlockCache, Step};
use rmem_client::store::StoreError;
use rmem_client::PageIndex;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// Limits of the server (docs/configuration.md).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Requests one connection may have in flight before the server stops reading from it.
    pub requests_per_connection_max: usize,
    /// Bytes of request and reply data one connection may hold in the server before it stops
    /// reading from it.
    pub bytes_per_connection_max: usize,
    /// How long a stop waits for the clients to take the replies of the requests in flight.
    pub stop_grace: Duration,
    /// How long the event loop polls without sleeping after its last event while at most
    /// [`SPIN_BLOCKED_MAX`] requests wait for the store (`RMEM_SPIN_US`, as the pager): a
    /// sleep in poll(2) and the wake-up after it cost more than a memory server's answer or
    /// a client's next request (fio at QD1 over 4x the cache: p50 84 -> 47-57 us; spinning
    /// only for the store's answers gained nothing there).
    pub spin: Duration,
}

/// More requests than this waiting for the store: the loop sleeps between events (the
/// wake-up is small beside the work, and on a machine with few cores a spinning loop takes
/// the CPU the memory servers answer with).
pub const SPIN_BLOCKED_MAX: usize = 2;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            requests_per_connection_max: 256,
            bytes_per_connection_max: 128 << 20,
            stop_grace: Duration::from_secs(10),
            spin: rmem_client::Config::default().spin,
        }
    }
}

/// Pages of a request tried per pass while earlier ones wait: enough to keep the servers
/// busy with a large request, few enough that a pass over blocked requests stays short.
const WAIT_WINDOW: usize = 256;
/// A read's data from this size up is sent from its own buffer rather than copied; a write's
/// payload from this size up is received into its own buffer rather than through `rbuf`.
const OWN_CHUNK_MIN: usize = 64 * 1024;
/// Buffers of sent reads and done writes a connection keeps for its next requests, and the
/// largest it keeps.
const SPARE_READ_BUFFERS: usize = 4;
const SPARE_READ_BUFFER_MAX: usize = 4 << 20;
/// Bytes read from a socket at a time.
const READ_CHUNK: usize = 256 * 1024;
/// Room for received bytes a connection keeps when it has none waiting (more was needed by
/// a write larger than this, up to the maximum request).
const RBUF_KEEP: usize = 8 << 20;
/// Requests waiting this long for the store with nothing landing are reported (and again
/// each such period), naming what the cache and the store wait for.
const STALL_REPORT: Duration = Duration::from_secs(5);

/// Why the server stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the page store failed")]
    Store(#[from] StoreError),
    #[error("poll failed")]
    Poll(#[source] io::Error),
}

/// A socket the server accepts clients on.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    fn fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l) => l.as_raw_fd(),
        }
    }

    fn accept(&self) -> io::Result<(Stream, String)> {
        match self {
            Listener::Tcp(l) => {
                let (s, a) = l.accept()?;
                s.set_nodelay(true)?;
                Ok((Stream::Tcp(s), a.to_string()))
            }
            Listener::Unix(l) => {
                let (s, _) = l.accept()?;
                Ok((Stream::Unix(s), "unix socket".into()))
            }
        }
    }
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(true),
            Stream::Unix(s) => s.set_nonblocking(true),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(b),
            Stream::Unix(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(b),
            Stream::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(b),
            Stream::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A write request whose payload (`data`, `have` bytes of it so far) is read from the socket
/// into its own buffer: through `rbuf` a 1 MiB payload was copied twice more (moved to the
/// front of `rbuf` while incomplete, then out of it).
struct Incoming {
    request: Request,
    data: Vec<u8>,
    have: usize,
}

/// One client connection.
struct Conn {
    id: u64,
    peer: String,
    stream: Stream,
    /// Received bytes are `rbuf[rpos..rend]`; the rest of `rbuf` is room for more. Its
    /// length only grows (zeroed once), so a receive does not clear the room it reads into.
    rbuf: Vec<u8>,
    rpos: usize,
    rend: usize,
    /// Bytes to send: the chunks of `out` (from byte `opos` of the first; `out_bytes` in all
    /// unsent), then `wbuf`. Replies are written into `wbuf`; a large read's data is queued
    /// as its own chunk instead of being copied (at 1 MiB reads that copy was a third of the
    /// copies the server made).
    out: VecDeque<Vec<u8>>,
    opos: usize,
    out_bytes: usize,
    wbuf: Vec<u8>,
    /// Sent chunks and done writes' payloads kept as the next requests' buffers
    /// ([`Conn::buffer`]).
    spare: Vec<Vec<u8>>,
    /// A large write whose payload is being received straight into its buffer.
    incoming: Option<Incoming>,
    /// Some while negotiating.
    handshake: Option<Handshake>,
    structured: bool,
    requests: usize,
    /// Bytes of request payloads and read buffers held for this connection.
    held_bytes: usize,
    /// The client sent DISC (or aborted): read nothing more, close once answered.
    ending: bool,
    /// Why it must close now, if it must.
    close: Option<String>,
}

impl Conn {
    fn unsent(&self) -> usize {
        self.out_bytes + self.wbuf.len()
    }

    /// Queue a read's data after what is in `wbuf`: copied if small, moved if large.
    fn push_data(&mut self, data: Vec<u8>) {
        if data.len() < OWN_CHUNK_MIN {
            rmem_copy::extend(&mut self.wbuf, &data);
            return;
        }
        if !self.wbuf.is_empty() {
            self.out_bytes += self.wbuf.len();
            self.out.push_back(std::mem::take(&mut self.wbuf));
        }
        self.out_bytes += data.len();
        self.out.push_back(data);
    }

    /// A buffer of `len` bytes for a read's data or a write's payload. Every byte of it is
    /// overwritten before it is used (a read's, page by page by the cache: its data, or
    /// zeros for a page never written; a write's by the bytes received), so a spare one is
    /// reused as it is, old bytes (this connection's own earlier requests) included: zeroing
    /// a new 1 MiB buffer for every 1 MiB read was one of the two copies per byte that kept
    /// large reads below nbdkit's.
    fn buffer(&mut self, len: usize) -> Vec<u8> {
        if len < OWN_CHUNK_MIN {
            return vec![0; len]; // copied behind its reply header, then dropped
        }
        match self.spare.iter().position(|b| b.capacity() >= len) {
            Some(i) => {
                let mut b = self.spare.swap_remove(i);
                b.resize(len, 0);
                b
            }
            None => vec![0; len],
        }
    }

    fn may_read(&self, limits: &Limits) -> bool {
        !self.ending
            && self.close.is_none()
            && self.requests < limits.requests_per_connection_max
            && self.held_bytes + self.unsent() < limits.bytes_per_connection_max
    }

    /// Write what can be written now.
    fn send(&mut self) {
        if !self.wbuf.is_empty() {
            self.out_bytes += self.wbuf.len();
            self.out.push_back(std::mem::take(&mut self.wbuf));
        }
        while self.out_bytes > 0 {
            let mut slices = [io::IoSlice::new(&[]); 64];
            let mut n = 0;
            for (k, chunk) in self.out.iter().take(slices.len()).enumerate() {
                let from = if k == 0 { self.opos } else { 0 };
                slices[k] = io::IoSlice::new(&chunk[from..]);
                n += 1;
            }
            match self.stream.write_vectored(&slices[..n]) {
                Ok(0) => {
                    self.close.get_or_insert_with(|| "the client closed".into());
                    return;
                }
                Ok(mut sent) => {
                    self.out_bytes -= sent;
                    while sent > 0 {
                        let front = self.out.front().expect("sent bytes were queued");
                        let left = front.len() - self.opos;
                        if sent < left {
                            self.opos += sent;
                            break;
                        }
                        sent -= left;
                        self.opos = 0;
                        let mut done = self.out.pop_front().expect("front exists");
                        if done.capacity() >= OWN_CHUNK_MIN {
                            self.give_back(done);
                        } else if self.wbuf.capacity() == 0 {
                            // Keep one small buffer for the next replies.
                            done.clear();
                            self.wbuf = done;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.close
                        .get_or_insert_with(|| format!("write failed: {e}"));
                    return;
                }
            }
        }
    }

    /// Keep a done request's buffer for the next ones (see [`Conn::buffer`]).
    fn give_back(&mut self, b: Vec<u8>) {
        if b.capacity() >= OWN_CHUNK_MIN
            && b.capacity() <= SPARE_READ_BUFFER_MAX
            && self.spare.len() < SPARE_READ_BUFFERS
        {
            self.spare.push(b);
        }
    }

    /// Read what is there (an error or the end is recorded in `close`).
    fn receive(&mut self) {
        if let Some(inc) = self.incoming.as_mut() {
            if inc.have < inc.data.len() {
                let r = self.stream.read(&mut inc.data[inc.have..]);
                match r {
                    Ok(n) => inc.have += n,
                    Err(e) => return self.failed(e),
                }
                if r.is_ok_and(|n| n == 0) {
                    self.close.get_or_insert_with(|| "the client closed".into());
                }
                return;
            }
        }
        if self.rpos == self.rend {
            self.rpos = 0;
            self.rend = 0;
            if self.rbuf.len() > RBUF_KEEP {
                // A large write's payload is done: give its room back.
                self.rbuf = Vec::new();
            }
        } else if self.rbuf.len() - self.rend < READ_CHUNK && self.rpos > 0 {
            // Move the part of a message received so far to the front.
            self.rbuf.copy_within(self.rpos..self.rend, 0);
            self.rend -= self.rpos;
            self.rpos = 0;
        }
        if self.rbuf.len() - self.rend < READ_CHUNK {
            self.rbuf.resize(self.rend + READ_CHUNK, 0);
        }
        let r = self.stream.read(&mut self.rbuf[self.rend..]);
        match r {
            Ok(0) => {
                self.close.get_or_insert_with(|| "the client closed".into());
            }
            Ok(n) => self.rend += n,
            Err(e) => self.failed(e),
        }
    }

    fn failed(&mut self, e: io::Error) {
        if !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ) {
            self.close
                .get_or_insert_with(|| format!("read failed: {e}"));
        }
    }
}

/// Where a request is.
enum Phase {
    /// Pages still to do.
    Pages(Vec<u64>),
    /// Waiting for its barrier (FLUSH, or FUA after its pages).
    Durable,
}

struct Req {
    conn: u64,
    cookie: u64,
    command: Command,
    fua: bool,
    offset: u64,
    length: u32,
    /// A write's payload, or a read's result.
    data: Vec<u8>,
    phase: Phase,
}

/// The block device server: one export over one cache.
pub struct Server<'a> {
    cache: &'a mut BlockCache,
    export: Export,
    limits: Limits,
    listeners: Vec<Listener>,
    conns: HashMap<u64, Conn>,
    next_conn: u64,
    reqs: HashMap<u64, Req>,
    next_req: u64,
    runnable: VecDeque<u64>,
    blocked: Vec<u64>,
    by_barrier: HashMap<Barrier, u64>,
    done: Vec<Barrier>,
    /// When a request was last answered, or when requests came to an idle device: requests
    /// waiting long past it are reported. (Only the last answer, it reported a first request
    /// after a quiet spell as waiting for as long as the device had been quiet.)
    answered_at: Instant,
}

/// What a run served, for the final report.
#[derive(Debug, Default)]
pub struct Served {
    pub connections: u64,
    pub requests: u64,
}

impl<'a> Server<'a> {
    pub fn new(
        cache: &'a mut BlockCache,
        export: Export,
        limits: Limits,
        listeners: Vec<Listener>,
    ) -> io::Result<Server<'a>> {
        for l in &listeners {
            match l {
                Listener::Tcp(l) => l.set_nonblocking(true)?,
                Listener::Unix(l) => l.set_nonblocking(true)?,
            }
        }
        Ok(Server {
            cache,
            export,
            limits,
            listeners,
            conns: HashMap::new(),
            next_conn: 0,
            reqs: HashMap::new(),
            next_req: 0,
            runnable: VecDeque::new(),
            blocked: Vec::new(),
            by_barrier: HashMap::new(),
            done: Vec::new(),
            answered_at: Instant::now(),
        })
    }

    /// Serve until `stop` (a descriptor) becomes readable; then finish the requests in
    /// flight, make every acknowledged write durable, and return.
    pub fn run(&mut self, stop: RawFd) -> Result<Served, ServeError> {
        let mut served = Served::default();
        let mut stopping: Option<Instant> = None;
        let mut final_barrier: Option<Barrier> = None;
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut conn_of_fd: Vec<u64> = Vec::new();
        let mut next_tick = Instant::now();
        let mut reported_at = Instant::now();
        let mut last_event = Instant::now();
        loop {
            // Wait for something to do.
            fds.clear();
            conn_of_fd.clear();
            let pfd = |fd, events| libc::pollfd {
                fd,
                events,
                revents: 0,
            };
            fds.push(pfd(stop, libc::POLLIN));
            if stopping.is_none() {
                for l in &self.listeners {
                    fds.push(pfd(l.fd(), libc::POLLIN));
                }
            }
            let first_conn = fds.len();
            for c in self.conns.values() {
                let mut ev = 0;
                if c.may_read(&self.limits) && stopping.is_none() {
                    ev |= libc::POLLIN;
                }
                if c.unsent() > 0 {
                    ev |= libc::POLLOUT;
                }
                fds.push(pfd(c.stream.fd(), ev));
                conn_of_fd.push(c.id);
            }
            self.cache.wait_fds(&mut fds);
            let now = Instant::now();
            let spinning = self.blocked.len() <= SPIN_BLOCKED_MAX
                && now.duration_since(last_event) < self.limits.spin;
            let timeout_ms = if !self.runnable.is_empty() || spinning || self.cache.ready() {
                0
            } else {
                next_tick
                    .saturating_duration_since(now)
                    .as_millis()
                    .min(100) as i32
            };
            // SAFETY: `fds` is a valid array of pollfd of the given length.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(ServeError::Poll(e));
                }
            }
            if n > 0 {
                last_event = Instant::now();
            } else if spinning {
                rmem_client::config::spin_pause();
            }
            if fds[0].revents != 0 && stopping.is_none() {
                stopping = Some(Instant::now());
                log::info!(
                    "stopping: finishing {} requests in flight on {} connections",
                    self.reqs.len(),
                    self.conns.len()
                );
                // Connections still negotiating have nothing in flight: close them.
                for c in self.conns.values_mut() {
                    if c.handshake.is_some() {
                        c.close
                            .get_or_insert_with(|| "the server is stopping".into());
                    }
                }
            }
            if stopping.is_none() {
                for i in 0..self.listeners.len() {
                    if fds[1 + i].revents != 0 {
                        self.accept(i, &mut served);
                    }
                }
            }
            // Read from the connections that have input.
            for (k, &id) in conn_of_fd.iter().enumerate() {
                let re = fds[first_conn + k].revents;
                if re & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                    if let Some(c) = self.conns.get_mut(&id) {
                        if c.may_read(&self.limits) && stopping.is_none() {
                            c.receive();
                        } else if re & (libc::POLLHUP | libc::POLLERR) != 0 {
                            c.close.get_or_insert_with(|| "the client hung up".into());
                        }
                    }
                }
            }
            if stopping.is_none() {
                let ids: Vec<u64> = self.conns.keys().copied().collect();
                for id in ids {
                    self.parse(id, &mut served);
                }
            }
            // The store's answers, then everything they unblocked.
            if self.cache.poll()? {
                self.runnable.extend(self.blocked.drain(..));
            }
            let now = Instant::now();
            if !(self.blocked.is_empty() && self.by_barrier.is_empty())
                && now.duration_since(self.answered_at.max(reported_at)) > STALL_REPORT
            {
                reported_at = now;
                log::warn!(
                    "{} requests wait for pages and {} for write-backs to land (FLUSH, FUA), \
                     and none was answered for {:?}: {}",
                    self.blocked.len(),
                    self.by_barrier.len(),
                    now.duration_since(self.answered_at),
                    self.cache.describe_in_flight()
                );
            }
            self.cache.take_done(&mut self.done);
            for b in std::mem::take(&mut self.done) {
                if Some(b) == final_barrier {
                    log::info!("every acknowledged write is on the memory servers");
                    self.close_all("the server stopped");
                    return Ok(served);
                }
                if let Some(id) = self.by_barrier.remove(&b) {
                    self.answer(id, 0, "");
                }
            }
            self.work()?;
            self.cache.flush()?;
            let now = Instant::now();
            if now >= next_tick {
                self.cache.tick(now)?;
                next_tick = now
                    + self
                        .cache
                        .heartbeat()
                        .unwrap_or(Duration::from_secs(1))
                        .min(Duration::from_millis(100));
            }
            for c in self.conns.values_mut() {
                if c.unsent() > 0 {
                    c.send();
                }
            }
            self.reap();
            if let (Some(t), None) = (stopping, final_barrier) {
                let drained = self.reqs.is_empty() && self.conns.values().all(|c| c.unsent() == 0);
                if drained || t.elapsed() > self.limits.stop_grace {
                    if !drained {
                        log::warn!(
                            "stopping: {} requests or replies still unfinished after {:?}",
                            self.reqs.len(),
                            self.limits.stop_grace
                        );
                    }
                    let b = self.cache.sync(None)?;
                    final_barrier = Some(b);
                    self.cache.take_done(&mut self.done);
                    if self.done.contains(&b) {
                        log::info!("every acknowledged write is on the memory servers");
                        self.close_all("the server stopped");
                        return Ok(served);
                    }
                }
            }
        }
    }

    fn accept(&mut self, i: usize, served: &mut Served) {
        loop {
            let (stream, peer) = match self.listeners[i].accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::warn!("accept failed: {e}");
                    return;
                }
            };
            if let Err(e) = stream.set_nonblocking() {
                log::warn!("connection from {peer}: {e}");
                continue;
            }
            let id = self.next_conn;
            self.next_conn += 1;
            served.connections += 1;
            log::debug!("connection {id} from {peer}");
            let mut c = Conn {
                id,
                peer,
                stream,
                rbuf: Vec::new(),
                rpos: 0,
                rend: 0,
                out: VecDeque::new(),
                opos: 0,
                out_bytes: 0,
                wbuf: Handshake::greeting(),
                spare: Vec::new(),
                incoming: None,
                handshake: Some(Handshake::new()),
                structured: false,
                requests: 0,
                held_bytes: 0,
                ending: false,
                close: None,
            };
            c.send();
            self.conns.insert(id, c);
        }
    }

    /// Take the complete messages a connection has received.
    fn parse(&mut self, id: u64, served: &mut Served) {
        let write_max = self.export.block_max;
        loop {
            let c = self.conns.get_mut(&id).expect("parsed connection exists");
            if c.close.is_some() || c.ending {
                return;
            }
            let input = &c.rbuf[c.rpos..c.rend];
            if let Some(h) = c.handshake.as_mut() {
                match h.advance(input, &self.export, &mut c.wbuf) {
                    Ok((0, Next::More)) => return,
                    Ok((n, Next::More)) => c.rpos += n,
                    Ok((n, Next::Transmission)) => {
                        c.rpos += n;
                        c.structured = h.structured;
                        c.handshake = None;
                        log::debug!(
                            "connection {id} ({}): transmission{}",
                            c.peer,
                            if c.structured {
                                ", structured replies"
                            } else {
                                ""
                            }
                        );
                    }
                    Ok((n, Next::Close)) => {
                        c.rpos += n;
                        c.ending = true;
                        return;
                    }
                    Err(e) => return self.malformed(id, e),
                }
                continue;
            }
            if let Some(inc) = &c.incoming {
                if inc.have < inc.data.len() {
                    return;
                }
                let inc = c.incoming.take().expect("checked");
                served.requests += 1;
                self.request(id, inc.request, inc.data);
                continue;
            }
            if !c.may_read(&self.limits) {
                return;
            }
            let r = match proto::parse_request(input, write_max) {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(e) => return self.malformed(id, e),
            };
            let len = r.payload_len();
            let total = proto::REQUEST_LEN + len;
            if len >= OWN_CHUNK_MIN {
                // The payload goes to its own buffer: what is here now, the rest straight
                // from the socket.
                let here = (input.len() - proto::REQUEST_LEN).min(len);
                let mut data = c.buffer(len);
                let from = c.rpos + proto::REQUEST_LEN;
                rmem_copy::copy(&mut data[..here], &c.rbuf[from..from + here]);
                c.rpos = from + here;
                c.incoming = Some(Incoming {
                    request: r,
                    data,
                    have: here,
                });
                continue;
            }
            if input.len() < total {
                return;
            }
            let payload = input[proto::REQUEST_LEN..total].to_vec();
            c.rpos += total;
            served.requests += 1;
            self.request(id, r, payload);
        }
    }

    fn malformed(&mut self, id: u64, e: ProtoError) {
        let c = self.conns.get_mut(&id).expect("connection exists");
        log::warn!("connection {id} ({}): closed: {e}", c.peer);
        c.close = Some(e.to_string());
    }

    /// A request arrived: check it, and queue it or answer it now.
    fn request(&mut self, conn: u64, r: Request, payload: Vec<u8>) {
        let size = self.export.size_bytes;
        let c = self.conns.get_mut(&conn).expect("connection exists");
        let known = proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE;
        let end = r.offset.checked_add(r.length as u64);
        let error = match r.command {
            Command::Disc => {
                c.ending = true;
                return;
            }
            Command::Other(t) => Some((proto::EINVAL, format!("command {t} is not supported"))),
            _ if r.flags & !known != 0 => Some((
                proto::EINVAL,
                format!("flags {:#x} are not supported", r.flags),
            )),
            Command::Flush => None,
            Command::Read if r.length > self.export.block_max => Some((
                proto::EINVAL,
                format!("a read over {} bytes", self.export.block_max),
            )),
            _ if !matches!(end, Some(e) if e <= size) => Some((
                if matches!(r.command, Command::Write | Command::WriteZeroes) {
                    proto::ENOSPC
                } else {
                    proto::EINVAL
                },
                format!("beyond the end of the device ({size} bytes)"),
            )),
            _ => None,
        };
        if self.reqs.is_empty() {
            self.answered_at = Instant::now();
        }
        let id = self.next_req;
        self.next_req += 1;
        let data = match r.command {
            Command::Write => payload,
            Command::Read if error.is_none() => c.buffer(r.length as usize),
            _ => Vec::new(),
        };
        c.requests += 1;
        c.held_bytes += data.len();
        let ps = self.cache.page_size() as u64;
        let pages = if r.length == 0 || error.is_some() || r.command == Command::Flush {
            Vec::new()
        } else {
            (r.offset / ps..=(r.offset + r.length as u64 - 1) / ps).collect()
        };
        self.reqs.insert(
            id,
            Req {
                conn,
                cookie: r.cookie,
                command: r.command,
                fua: r.flags & proto::CMD_FLAG_FUA != 0,
                offset: r.offset,
                length: r.length,
                data,
                phase: Phase::Pages(pages),
            },
        );
        if let Some((errno, msg)) = error {
            log::debug!("connection {conn}: request {:?} refused: {msg}", r.command);
            self.answer(id, errno, &msg);
            return;
        }
        self.runnable.push_back(id);
    }

    /// Move runnable requests forward.
    fn work(&mut self) -> Result<(), StoreError> {
        while let Some(id) = self.runnable.pop_front() {
            let ps = self.cache.page_size() as u64;
            let req = self.reqs.get_mut(&id).expect("runnable request exists");
            if req.command == Command::Flush {
                req.phase = Phase::Durable;
                let b = self.cache.sync(None)?;
                self.by_barrier.insert(b, id);
                continue;
            }
            let Phase::Pages(pages) = &mut req.phase else {
                unreachable!("a runnable request has pages");
            };
            let mut waits = 0;
            let mut left = Vec::new();
            for (k, &p) in pages.iter().enumerate() {
                if waits >= WAIT_WINDOW {
                    left.extend_from_slice(&pages[k..]);
                    break;
                }
                let start = (p * ps).max(req.offset);
                let end = ((p + 1) * ps).min(req.offset + req.length as u64);
                let off = (start - p * ps) as usize;
                let len = (end - start) as usize;
                let at = (start - req.offset) as usize;
                let page = PageIndex(p);
                let step = match req.command {
                    Command::Read => self.cache.read(page, off, &mut req.data[at..at + len])?,
                    Command::Write => self.cache.write(page, off, &req.data[at..at + len])?,
                    Command::Trim => self.cache.zero(page, off, len, true)?,
                    Command::WriteZeroes => self.cache.zero(page, off, len, false)?,
                    c => unreachable!("{c:?} has no pages"),
                };
                if step == Step::Wait {
                    waits += 1;
                    left.push(p);
                }
            }
            if !left.is_empty() {
                *pages = left;
                self.blocked.push(id);
                continue;
            }
            if req.fua && req.command != Command::Read && req.length > 0 {
                let first = req.offset / ps;
                let last = (req.offset + req.length as u64 - 1) / ps;
                req.phase = Phase::Durable;
                let b = self.cache.sync(Some(first..last + 1))?;
                self.by_barrier.insert(b, id);
                continue;
            }
            self.answer(id, 0, "");
        }
        Ok(())
    }

    /// Send a request's reply (if its connection is still there) and forget it.
    fn answer(&mut self, id: u64, error: u32, message: &str) {
        let req = self.reqs.remove(&id).expect("answered request exists");
        self.answered_at = Instant::now();
        let Some(c) = self.conns.get_mut(&req.conn) else {
            return;
        };
        c.requests -= 1;
        c.held_bytes -= req.data.len();
        if c.close.is_some() {
            return;
        }
        if req.command == Command::Write {
            c.give_back(req.data);
            return proto::simple_reply(&mut c.wbuf, req.cookie, error);
        }
        match (req.command, c.structured, error) {
            (Command::Read, true, 0) => {
                proto::structured_data_header(&mut c.wbuf, req.cookie, req.offset, req.length);
                c.push_data(req.data);
            }
            (Command::Read, true, e) => {
                proto::structured_error(&mut c.wbuf, req.cookie, e, message)
            }
            (Command::Read, false, 0) => {
                proto::simple_reply(&mut c.wbuf, req.cookie, 0);
                c.push_data(req.data);
            }
            (_, _, e) => proto::simple_reply(&mut c.wbuf, req.cookie, e),
        }
    }

    /// Close connections that must close: broken, or ended and answered.
    fn reap(&mut self) {
        let gone: Vec<u64> = self
            .conns
            .values()
            .filter(|c| c.close.is_some() || (c.ending && c.requests == 0 && c.unsent() == 0))
            .map(|c| c.id)
            .collect();
        for id in gone {
            let c = self.conns.remove(&id).expect("listed");
            let why = c.close.unwrap_or_else(|| "the client disconnected".into());
            if c.requests > 0 {
                log::info!(
                    "connection {id} ({}): closed with {} requests unanswered: {why}",
                    c.peer,
                    c.requests
                );
            } else {
                log::debug!("connection {id} ({}): closed: {why}", c.peer);
            }
        }
    }

    fn close_all(&mut self, why: &str) {
        for c in self.conns.values_mut() {
            c.send();
            c.close.get_or_insert_with(|| why.into());
        }
        self.reap();
    }
}
