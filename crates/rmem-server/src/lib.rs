//! rmem-server: the memory server, which keeps clients' pages in its RAM.
//!
//! Entry point: [`Server::bind`] with a [`ServerConfig`], then [`Server::run`] (blocking) or
//! [`Server::spawn`] (a background thread, for in-process tests). Each connection gets a
//! thread: it authenticates the client by a challenge and response over a shared-secret token
//! (`rmem_proto::auth`; the token never crosses the network), attaches it to a session
//! ([`session`]), then answers its requests strictly in order. Pages belong to the session,
//! which lives while a connection of it is open (probed by TCP keepalive) and for its lease
//! after the last one closes; a reaper thread frees the pages of sessions whose lease ran out. Capacity is global across sessions. `Status` reports
//! them (`rmem status`), [`metrics`] counts requests and serves both to Prometheus. Logs go
//! through the `log` facade (the `rmem server` binary prints them on stderr, by level). Any malformed frame closes that one connection
//! with a logged reason; other clients never notice.
//! Pages are stored compactly in slabs ([`slab`]), or with `--store file:PATH` in a file on
//! local disk behind a bounded RAM cache ([`disk`]); `rmem server --lock` locks the server's
//! memory (mlockall, in rmem-cli: this crate has no unsafe code). The pool manager
//! (`rmem manager`, [`manager`]) lives here too: it shares the listener's handshake.
//! [`reclaim`] reads the node's free memory for `rmem server --reclaim-below`.
#![forbid(unsafe_code)]

pub mod disk;
pub mod manager;
pub mod metrics;
mod peer;
pub mod reclaim;
pub mod session;
pub mod slab;

use metrics::Metrics;
use rmem_proto::{
    auth, parse_header, ErrorCode, Op, ProtoError, Request, Response, ServerStatus, SessionStatus,
    HEADER_LEN,
};
use session::{AttachMode, Attachment, SessionInfo, Sessions, StoreRefusal};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most connections served at once; more are refused (each costs a thread).
pub const CONNECTIONS_MAX: usize = 1024;
/// A client must finish the handshake (hello and auth) within this long, however slowly its
/// bytes come.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const IO_BUFFER: usize = 256 * 1024;
/// What is left of a frame's body read straight into it rather than through the reader's
/// buffer, when that buffer is empty.
const DIRECT_READ_MIN: usize = 16 * 1024;
/// Longest a `Pull` may take, whatever its deadline says: the client's other requests on
/// the connection wait behind it.
pub const PULL_DEADLINE_MAX_MS: u32 = 10_000;
/// A client connection that carried nothing for this long is probed by TCP keepalive, every
/// [`KEEPALIVE_INTERVAL`], and closed after [`KEEPALIVE_PROBES`] unanswered probes; data the
/// client's host does not acknowledge for [`PEER_TIMEOUT`] closes it too (`TCP_USER_TIMEOUT`).
/// A session is kept while a connection of it is open (see [`session`]): these bound how long
/// a client host that died or was cut off holds a session beyond its lease, while a client
/// that is only stopped (its kernel answers) keeps it however long it stays stopped.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
pub const KEEPALIVE_PROBES: u32 = 3;
pub const PEER_TIMEOUT: Duration = Duration::from_secs(25);

/// The lease of a session when `--lease` is not given.
pub const LEASE_DEFAULT: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub capacity_bytes: u64,
    pub token: Vec<u8>,
    pub frame_len_max: u32,
    /// How long a session outlives its last request (the longest lease a client may ask).
    pub lease: Duration,
    /// Log every disconnect and session end at info level, not only the abnormal ones (they
    /// are at debug level otherwise).
    pub verbose: bool,
    /// Where pages are kept.
    pub store: StoreConfig,
    /// How long a connection's thread polls for the next request after answering one before
    /// it sleeps in read(2), giving way to any other runnable thread between polls.
    pub spin: Duration,
}

/// [`ServerConfig::spin`] by default (`rmem server --spin-us`).
pub const SPIN_DEFAULT: Duration = Duration::from_micros(200);

impl ServerConfig {
    /// A server on a free loopback port that knows `token` and lends `capacity_bytes` of RAM,
    /// every other setting at its default (what tests and examples run in-process).
    pub fn loopback(capacity_bytes: u64, token: &[u8]) -> ServerConfig {
        ServerConfig {
            listen: (std::net::Ipv4Addr::LOCALHOST, 0).into(),
            capacity_bytes,
            token: token.to_vec(),
            frame_len_max: rmem_proto::FRAME_LEN_MAX_DEFAULT,
            lease: LEASE_DEFAULT,
            verbose: false,
            store: StoreConfig::Ram,
            spin: SPIN_DEFAULT,
        }
    }
}

/// Where a server keeps its pages (`rmem server --store`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StoreConfig {
    /// In RAM (`--store ram`, the default).
    #[default]
    Ram,
    /// In a file on local disk (`--store file:PATH[,persist]`) behind a RAM cache of
    /// `cache_bytes` ([`disk::CACHE_BYTES_DEFAULT`] by default).
    File {
        path: std::path::PathBuf,
        persist: bool,
        cache_bytes: u64,
    },
}

impl StoreConfig {
    /// Parse `ram`, `file:PATH` or `file:PATH,persist`.
    pub fn parse(spec: &str, cache_bytes: u64) -> Result<StoreConfig, String> {
        if spec == "ram" {
            return Ok(StoreConfig::Ram);
        }
        let Some(rest) = spec.strip_prefix("file:") else {
            return Err(format!(
                "{spec:?} is not `ram`, `file:PATH` or `file:PATH,persist`"
            ));
        };
        let (path, persist) = match rest.strip_suffix(",persist") {
            Some(path) => (path, true),
            None => (rest, false),
        };
        if path.is_empty() {
            return Err(format!("{spec:?}: no file named"));
        }
        Ok(StoreConfig::File {
            path: path.into(),
            persist,
            cache_bytes,
        })
    }

    /// Whether pages go to disk (the pool's slower tier).
    pub fn on_disk(&self) -> bool {
        matches!(self, StoreConfig::File { .. })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("accept failed")]
    Accept(#[source] io::Error),
    #[error("an empty token would let anyone in")]
    EmptyToken,
    #[error("--store")]
    Store(#[source] disk::OpenError),
}

/// Shared accounting, readable by tests and the CLI.
#[derive(Debug)]
pub struct ServerState {
    sessions: Sessions,
    connections: AtomicUsize,
    pub metrics: Metrics,
    capacity_bytes: u64,
    lease: Duration,
}

impl ServerState {
    /// Capacity, use, and every session (the largest first, at most
    /// `rmem_proto::STATUS_SESSIONS_MAX` listed).
    pub fn status(&self) -> ServerStatus {
        let all = self.sessions();
        ServerStatus {
            capacity_bytes: self.capacity_bytes,
            used_bytes: self.used_bytes(),
            lease_ms: u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX),
            sessions_total: u32::try_from(all.len()).unwrap_or(u32::MAX),
            sessions: all
                .iter()
                .take(rmem_proto::STATUS_SESSIONS_MAX)
                .map(|s| SessionStatus {
                    id: s.id,
                    used_bytes: s.used_bytes,
                    lease_age_ms: u64::try_from(s.lease_age.as_millis()).unwrap_or(u64::MAX),
                    connections: u32::try_from(s.connections).unwrap_or(u32::MAX),
                })
                .collect(),
        }
    }

    pub fn used_bytes(&self) -> u64 {
        self.sessions.used_bytes.load(Ordering::Relaxed)
    }
    /// The most bytes it lends now: the capacity, or less while its node is short of memory
    /// (`rmem server --reclaim-below`, which sets it with [`ServerState::set_lend_limit`]).
    pub fn lendable_bytes(&self) -> u64 {
        self.capacity_bytes.min(self.sessions.lend_limit.get())
    }
    /// Take no new pages beyond `bytes` in all (`u64::MAX`: up to the capacity). Pages held
    /// beyond it stay (and may be overwritten) until their clients move them.
    pub fn set_lend_limit(&self, bytes: u64) {
        self.sessions.lend_limit.set(bytes);
    }
    /// Every session, largest first.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.sessions.list(Instant::now())
    }
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
    /// The disk store of a disk-backed server.
    pub fn disk(&self) -> Option<&Arc<disk::DiskStore>> {
        self.sessions.disk()
    }
}

pub struct Server {
    listener: TcpListener,
    config: Arc<ServerConfig>,
    state: Arc<ServerState>,
    addr: SocketAddr,
}

impl Server {
    pub fn bind(config: ServerConfig) -> Result<Server, ServerError> {
        if config.token.is_empty() {
            return Err(ServerError::EmptyToken);
        }
        let listener = TcpListener::bind(config.listen).map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
        let sessions = match &config.store {
            StoreConfig::Ram => Sessions::default(),
            StoreConfig::File {
                path,
                persist,
                cache_bytes,
            } => {
                let (store, pages) = disk::DiskStore::open(path, *persist, *cache_bytes)
                    .map_err(ServerError::Store)?;
                let sessions = Sessions::on_disk(Arc::new(store));
                if !pages.is_empty() {
                    let (n, restored) = sessions.restore(&pages, config.lease);
                    log::info!(
                        "{addr}: {} restored {restored} pages of {n} sessions; each is freed unless its client reconnects within {} s",
                        path.display(),
                        config.lease.as_secs_f64()
                    );
                }
                sessions
            }
        };
        let state = Arc::new(ServerState {
            sessions,
            connections: AtomicUsize::new(0),
            metrics: Metrics::default(),
            capacity_bytes: config.capacity_bytes,
            lease: config.lease,
        });
        Ok(Server {
            listener,
            config: Arc::new(config),
            state,
            addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn state(&self) -> Arc<ServerState> {
        self.state.clone()
    }

    /// Accept and serve clients forever.
    pub fn run(self) -> Result<(), ServerError> {
        self.spawn_reaper()?;
        let me = self.addr;
        accept_loop(&self.listener, me, &self.state.connections, |sock, peer| {
            let config = self.config.clone();
            let state = self.state.clone();
            std::thread::Builder::new().name(format!("rmem-conn-{peer}")).spawn(move || {
                let mut conn = Connection { config: &config, state: &state, me, attachment: None, page_size: 0, scratch: Vec::new(), peers: Vec::new() };
                log_close(me, peer, conn.serve(sock));
                state.connections.fetch_sub(1, Ordering::Relaxed);
                if let Some(a) = conn.attachment.take() {
                    let id = a.session.id;
                    let level = if config.verbose { log::Level::Info } else { log::Level::Debug };
                    match a.detach() {
                        Some((held, held_max)) => log::log!(level, "{me}: client {peer} disconnected, session {id} keeps {held} pages for its lease, held at most {held_max} pages"),
                        None => log::log!(level, "{me}: client {peer} disconnected, session {id} has ended"),
                    }
                }
            }).map(drop)
        })
    }

    /// A thread that frees the pages of sessions whose lease ran out, checking often enough
    /// (an eighth of the lease, 10 ms to 1 s) that a session is gone at most that much after
    /// its lease ended.
    fn spawn_reaper(&self) -> Result<(), ServerError> {
        let state = self.state.clone();
        let me = self.addr;
        let period =
            (self.config.lease / 8).clamp(Duration::from_millis(10), Duration::from_secs(1));
        std::thread::Builder::new()
            .name("rmem-reaper".into())
            .spawn(move || loop {
                std::thread::sleep(period);
                for (id, bytes) in state.sessions.reap(Instant::now()) {
                    let level = if bytes > 0 {
                        log::Level::Info
                    } else {
                        log::Level::Debug
                    };
                    log::log!(
                        level,
                        "{me}: session {id}: lease expired, freed {bytes} bytes"
                    );
                }
            })
            .map(drop)
            .map_err(ServerError::Accept)
    }

    /// Serve the Prometheus metrics on `addr` from a thread of their own; the address bound.
    pub fn serve_metrics(&self, addr: SocketAddr) -> Result<SocketAddr, ServerError> {
        let (listener, bound) =
            metrics::bind(addr).map_err(|source| ServerError::Bind { addr, source })?;
        let state = self.state.clone();
        std::thread::Builder::new()
            .name("rmem-metrics".into())
            .spawn(move || metrics::serve(listener, state))
            .map_err(ServerError::Accept)?;
        Ok(bound)
    }

    /// Run on a background thread.
    pub fn spawn(self) -> std::thread::JoinHandle<Result<(), ServerError>> {
        std::thread::spawn(move || self.run())
    }
}

/// Accept connections on `listener` forever, each handed to `spawn` (which starts a thread
/// that serves it and takes one off `connections` when done) while fewer than
/// [`CONNECTIONS_MAX`] are open: the memory server's and the manager's loop.
fn accept_loop(
    listener: &TcpListener,
    me: SocketAddr,
    connections: &AtomicUsize,
    mut spawn: impl FnMut(TcpStream, SocketAddr) -> io::Result<()>,
) -> ! {
    loop {
        let (sock, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Out of descriptors or similar: log, back off, keep serving the others.
            Err(e) => {
                log::error!("{me}: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if connections.load(Ordering::Relaxed) >= CONNECTIONS_MAX {
            log::warn!("{me}: refusing {peer}: {CONNECTIONS_MAX} connections already");
            continue;
        }
        connections.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = spawn(sock, peer) {
            connections.fetch_sub(1, Ordering::Relaxed);
            log::error!("{me}: cannot serve {peer}: {e}");
        }
    }
}

/// TCP keepalive and a user timeout on a client connection ([`KEEPALIVE_IDLE`] and the rest).
fn keep_alive(sock: &TcpStream) -> io::Result<()> {
    let s = socket2::SockRef::from(sock);
    s.set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_PROBES),
    )?;
    s.set_tcp_user_timeout(Some(PEER_TIMEOUT))
}

/// Log why a connection ended: a peer that hangs up is not news; anything else is.
fn log_close(me: SocketAddr, peer: SocketAddr, r: Result<(), Close>) {
    match r {
        Ok(()) => {}
        Err(Close::Io(e)) if is_disconnect(&e) => log::debug!("{me}: {peer} hung up: {e}"),
        // A fork child's late requests after its parent ended its snapshot (it exited or
        // exec'd), or a client's after its own end: orderly, nothing lost.
        Err(Close::Session(r @ session::Refusal::Ended(_))) => {
            log::debug!("{me}: closing {peer}: {r}")
        }
        Err(reason) => log::warn!("{me}: closing {peer}: {reason}"),
    }
}

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
enum Close {
    #[error("{0}")]
    Proto(#[from] ProtoError),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Refused(String),
    #[error("bad request: {0}")]
    Bad(String),
    #[error("{0}")]
    Session(#[from] session::Refusal),
}

struct Connection<'a> {
    config: &'a ServerConfig,
    state: &'a ServerState,
    me: SocketAddr,
    /// The session this connection serves; page requests before `Attach` are refused.
    attachment: Option<Attachment>,
    page_size: usize,
    /// A page read for a swap's answer (disk-backed servers read into it).
    scratch: Vec<u8>,
    /// Links to the servers this connection's client pulled pages from, kept for its next
    /// pulls ([`peer`]).
    peers: Vec<peer::Peer>,
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof
    )
}

/// The socket, read with a deadline while there is one: a socket's read timeout bounds one
/// read, so a client sending a byte at a time could otherwise hold a connection (and its
/// thread, of [`CONNECTIONS_MAX`]) in the handshake for as long as it likes.
struct Deadlined {
    sock: TcpStream,
    deadline: Option<Instant>,
}

impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "handshake not finished in time",
                ));
            }
            self.sock.set_read_timeout(Some(left))?;
        }
        self.sock.read(buf)
    }
}

/// Poll `sock` for up to `spin` until it has data (or an end, or an error, which the read
/// after it reports), giving the CPU to any other runnable thread between polls: one
/// non-blocking peek a poll, the socket itself left blocking. A client that sends its next
/// request within the spin finds this thread awake: waking a thread asleep in read(2) costs
/// about 20 us on a virtual machine, as much as a loopback round trip (docs/benchmarks.md,
/// "A server that spins"), and a busy client sends its next request within microseconds.
fn spin_for_data(sock: &TcpStream, spin: Duration) {
    let s = socket2::SockRef::from(sock);
    let mut b = [std::mem::MaybeUninit::<u8>::uninit()];
    let t0 = Instant::now();
    loop {
        match s.recv_with_flags(&mut b, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && t0.elapsed() < spin => {
                std::thread::yield_now()
            }
            _ => return,
        }
    }
}

/// Read one frame into `body`; Ok(None) on a clean EOF between frames.
fn read_frame<'b, R: Read>(
    r: &mut BufReader<R>,
    max: u32,
    body: &'b mut Vec<u8>,
) -> Result<Option<(rmem_proto::Header, &'b [u8])>, Close> {
    let mut hdr = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut hdr[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(Close::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the link ended {got} bytes into a frame's header of {HEADER_LEN}"),
                )))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let h = parse_header(&hdr, max)?.expect("full header");
    let len = h.len as usize;
    // `body` keeps the length of the largest frame yet: growing it zeroes the new bytes, which
    // the frame then overwrites (a write of a page after a small request zeroed the page).
    if body.len() < len {
        body.resize(len, 0);
    }
    let body = &mut body[..len];
    // Out of the reader's buffer with rmem_copy (a page's offset there is the stream's); once
    // that is empty, the rest of a large body straight from the socket (no copy through the
    // buffer: pages are most of what a server reads). The link ending inside a body is a
    // hang-up, not a malformed frame: a client gives up a link that went silent (this server
    // stopped, or its network) in the middle of a page it was sending, and says so itself.
    let truncated = |got: usize| {
        Close::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "the link ended {got} bytes into the body of a {:?} frame of {} bytes",
                h.op, h.len
            ),
        ))
    };
    let mut got = 0;
    while got < body.len() {
        if r.buffer().is_empty() && body.len() - got >= DIRECT_READ_MIN {
            match r.get_mut().read(&mut body[got..]) {
                Ok(0) => return Err(truncated(got)),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
            continue;
        }
        let buffered = match r.fill_buf() {
            Ok([]) => return Err(truncated(got)),
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        let n = buffered.len().min(body.len() - got);
        rmem_copy::copy(&mut body[got..got + n], &buffered[..n]);
        r.consume(n);
        got += n;
    }
    Ok(Some((h, body)))
}

/// What a `Welcome` tells the client besides the proof.
struct Welcomed {
    version: u16,
    frame_len_max: u32,
    capacity_bytes: u64,
    used_bytes: u64,
}

/// The listener's side of the challenge and response (`rmem_proto::auth`), shared by the
/// memory server and the pool manager: Hello -> Challenge, Auth -> Welcome. `hello` checks the
/// client's protocol version and unit size (or says why it refuses them, which the client is
/// told); `welcome` fills in the answer. The unit size on success; `None` if the peer closed
/// before saying anything.
fn accept<R: Read>(
    reader: &mut BufReader<R>,
    writer: &mut BufWriter<TcpStream>,
    token: &[u8],
    hello: impl FnOnce(u16, u32) -> Result<(), (ErrorCode, String)>,
    welcome: impl FnOnce() -> Welcomed,
) -> Result<Option<u32>, Close> {
    let mut body = Vec::new();
    let mut out = Vec::new();
    let Some((h, first)) = read_frame(reader, 4096, &mut body)? else {
        return Ok(None);
    };
    if h.op != Op::Hello {
        return Err(Close::Bad(format!("expected hello, got {:?}", h.op)));
    }
    let Request::Hello {
        version,
        page_size,
        nonce: client_nonce,
    } = Request::decode(h.op, first)?
    else {
        unreachable!()
    };
    let refuse = |code, tag, msg: String, writer: &mut BufWriter<TcpStream>| -> Result<_, Close> {
        let mut out = Vec::new();
        Response::Error {
            code,
            message: &msg,
        }
        .encode(tag, &mut out);
        let _ = writer.write_all(&out).and_then(|_| writer.flush());
        Err(Close::Refused(msg))
    };
    if let Err((code, msg)) = hello(version, page_size) {
        return refuse(code, h.tag, msg, writer);
    }
    // A fresh nonce for every connection: a recorded Auth proves nothing here.
    let transcript = auth::Transcript {
        client_nonce,
        server_nonce: auth::nonce()?,
        version,
        page_size,
    };
    Response::Challenge {
        nonce: transcript.server_nonce,
    }
    .encode(h.tag, &mut out);
    writer.write_all(&out)?;
    writer.flush()?;
    out.clear();
    let Some((h, auth)) = read_frame(reader, 4096, &mut body)? else {
        // A client that exits while it connects (a fork() child that needed its pages and
        // then ended) is not news: logged as a hang-up.
        return Err(Close::Io(io::ErrorKind::UnexpectedEof.into()));
    };
    let Request::Auth { proof } = Request::decode(h.op, auth)? else {
        return Err(Close::Bad(format!("expected auth, got {:?}", h.op)));
    };
    if !transcript.verify(token, auth::Role::Client, &proof) {
        let msg = "wrong token: the client's proof of the shared token does not match".into();
        return refuse(ErrorCode::Unauthorized, h.tag, msg, writer);
    }
    let w = welcome();
    Response::Welcome {
        version: w.version,
        frame_len_max: w.frame_len_max,
        capacity_bytes: w.capacity_bytes,
        used_bytes: w.used_bytes,
        proof: transcript.proof(token, auth::Role::Server),
    }
    .encode(h.tag, &mut out);
    writer.write_all(&out)?;
    writer.flush()?;
    Ok(Some(page_size))
}

impl Connection<'_> {
    fn serve(&mut self, sock: TcpStream) -> Result<(), Close> {
        sock.set_nodelay(true)?;
        keep_alive(&sock)?;
        let handshake = Deadlined {
            sock: sock.try_clone()?,
            deadline: Some(Instant::now() + HANDSHAKE_TIMEOUT),
        };
        let mut reader = BufReader::with_capacity(IO_BUFFER, handshake);
        let mut writer = BufWriter::with_capacity(IO_BUFFER, sock.try_clone()?);
        let mut body = Vec::new();
        let mut out = Vec::new();
        let config = self.config;
        let state = self.state;
        let hello = |version, page_size: u32| {
            if version != rmem_proto::VERSION {
                let msg = format!("protocol version {version} is not {}", rmem_proto::VERSION);
                return Err((ErrorCode::VersionMismatch, msg));
            }
            if !rmem_proto::unit_len_ok(page_size)
                || page_size as u64 + 64 > config.frame_len_max as u64
            {
                let msg = format!("unsupported unit size {page_size}");
                return Err((ErrorCode::BadRequest, msg));
            }
            Ok(())
        };
        let welcome = || Welcomed {
            version: rmem_proto::VERSION,
            frame_len_max: config.frame_len_max,
            capacity_bytes: config.capacity_bytes,
            used_bytes: state.used_bytes(),
        };
        let Some(page_size) = accept(&mut reader, &mut writer, &config.token, hello, welcome)?
        else {
            return Ok(());
        };
        self.page_size = page_size as usize;
        reader.get_mut().deadline = None;
        sock.set_read_timeout(None)?;
        // Requests, answered in order. The answers gather in `out`, which goes to the socket
        // as it is (no copy into a BufWriter: pages are most of it) once no further request
        // is buffered or it holds IO_BUFFER bytes.
        writer.flush()?;
        let mut sock = &sock;
        out.clear();
        loop {
            if reader.buffer().is_empty() && !self.config.spin.is_zero() {
                spin_for_data(sock, self.config.spin);
            }
            let Some((h, frame)) = read_frame(&mut reader, self.config.frame_len_max, &mut body)?
            else {
                return Ok(());
            };
            let req = Request::decode(h.op, frame)?;
            let started = Instant::now();
            let answered = self.answer(req, h.tag, &mut out);
            if let Err(Close::Session(_) | Close::Refused(_)) = answered {
                // Tell the client why before closing (best effort).
                let _ = sock.write_all(&out);
            }
            answered?;
            self.state.metrics.record(h.op, started.elapsed());
            if reader.buffer().is_empty() || out.len() >= IO_BUFFER {
                sock.write_all(&out)?;
                out.clear();
            }
        }
    }

    /// Session starts and ends are logged at info level with `--verbose`, else at debug.
    fn verbose_level(&self) -> log::Level {
        if self.config.verbose {
            log::Level::Info
        } else {
            log::Level::Debug
        }
    }

    fn check_data(&self, count: u32, data: &[u8]) -> Result<(), Close> {
        if count == 0 || data.len() as u64 != count as u64 * self.page_size as u64 {
            return Err(Close::Bad(format!(
                "{count} pages with {} bytes of data",
                data.len()
            )));
        }
        Ok(())
    }

    /// A byte range must lie inside one page and hold at least one byte.
    fn check_range(&self, offset: u32, len: usize) -> Result<(), Close> {
        if len == 0 || offset as usize + len > self.page_size {
            return Err(Close::Bad(format!(
                "range of {len} bytes at offset {offset} of a {}-byte page",
                self.page_size
            )));
        }
        Ok(())
    }

    fn not_found(key: u64, out: &mut Vec<u8>, tag: u64) {
        let msg = format!("page {key} is not stored here");
        Response::Error {
            code: ErrorCode::NotFound,
            message: &msg,
        }
        .encode(tag, out);
    }

    /// A read the disk store could not serve: NotFound, as for a page the server lacks (a
    /// client with redundancy reads it from the others), never the bytes read.
    fn unreadable(&self, key: u64, e: &io::Error, out: &mut Vec<u8>, tag: u64) {
        log::error!("{}: page {key}: disk store: {e}", self.me);
        let msg = format!(
            "page {key} cannot be read from server {}'s disk: {e}",
            self.me
        );
        Response::Error {
            code: ErrorCode::NotFound,
            message: &msg,
        }
        .encode(tag, out);
    }

    /// A store refused: `Full` whether capacity, the disk store or the node's memory refused
    /// it, so that the client places the pages elsewhere (the message says which).
    fn refused(&self, key: u64, why: StoreRefusal, want: u64, out: &mut Vec<u8>, tag: u64) {
        let StoreRefusal::Io(e) = why else {
            return self.full(want, out, tag);
        };
        let place = match self.state.disk() {
            Some(_) => "on its disk",
            None => "in its memory",
        };
        log::warn!("{}: page {key}: cannot store it {place}: {e}", self.me);
        let msg = format!(
            "server {} cannot store page {key} {place}: {e}; place it elsewhere",
            self.me
        );
        Response::Error {
            code: ErrorCode::Full,
            message: &msg,
        }
        .encode(tag, out);
    }

    fn full(&self, want: u64, out: &mut Vec<u8>, tag: u64) {
        let lendable = self.state.lendable_bytes();
        let short = if lendable < self.config.capacity_bytes {
            format!(" (lending at most {lendable} now: its node is short of memory)")
        } else {
            String::new()
        };
        let msg = format!(
            "server {} full: capacity {} bytes{short}, used {}, {} more needed",
            self.me,
            self.config.capacity_bytes,
            self.state.used_bytes(),
            want
        );
        Response::Error {
            code: ErrorCode::Full,
            message: &msg,
        }
        .encode(tag, out);
    }

    fn answer(&mut self, req: Request<'_>, tag: u64, out: &mut Vec<u8>) -> Result<(), Close> {
        let sessions = &self.state.sessions;
        let capacity = self.config.capacity_bytes;
        let a = match (&req, &self.attachment) {
            (Request::Status, _) => {
                Response::StatusOk(self.state.status()).encode(tag, out);
                return Ok(());
            }
            (Request::Hello { .. } | Request::Auth { .. }, _) => {
                return Err(Close::Bad(format!("{:?} after the handshake", req.op())))
            }
            (
                Request::Attach {
                    session,
                    lease_ms,
                    flags,
                    reserved,
                },
                None,
            ) => return self.attach(*session, *lease_ms, *flags, *reserved, tag, out),
            (Request::Attach { .. }, Some(_)) => {
                return Err(Close::Bad("a second attach on one connection".into()))
            }
            (_, None) => return Err(Close::Bad(format!("{:?} before attach", req.op()))),
            (_, Some(a)) => a,
        };
        // Every request renews the lease; a refusal closes the connection.
        let mut pages = match a.lock() {
            Ok(p) => p,
            Err(refusal) => {
                // A fork child ending its own children's snapshots as it exits, after its
                // parent ended its session (it saw the child go): they end too, so that their
                // pages are freed now rather than when their leases run out.
                if let (session::Refusal::Ended(_), Request::EndSnapshot { session }) =
                    (&refusal, &req)
                {
                    if let Ok(freed_bytes) = sessions.end_snapshot(a, *session) {
                        Response::SessionEnded { freed_bytes }.encode(tag, out);
                        return Ok(());
                    }
                }
                let msg = refusal.to_string();
                Response::Error {
                    code: ErrorCode::SessionLost,
                    message: &msg,
                }
                .encode(tag, out);
                return Err(Close::Session(refusal));
            }
        };
        match req {
            Request::Hello { .. }
            | Request::Auth { .. }
            | Request::Attach { .. }
            | Request::Status => unreachable!(),
            Request::Pull {
                from,
                session,
                deadline_ms,
                keys,
            } => {
                drop(pages);
                let deadline = Instant::now()
                    + Duration::from_millis(deadline_ms.clamp(1, PULL_DEADLINE_MAX_MS).into());
                let to = peer::Destination {
                    attachment: a,
                    sessions,
                    capacity,
                };
                let want = peer::Want {
                    from,
                    session,
                    token: &self.config.token,
                    unit: self.page_size,
                    deadline,
                };
                let (stored, message) = peer::pull(&mut self.peers, want, &keys, to);
                if stored < keys.len() {
                    // Routine when the client wrote a page meanwhile (its old copy is freed
                    // there): the client decides what it means.
                    log::info!(
                        "{}: pulled {stored} of {} pages of session {} from {from}: {message}",
                        self.me,
                        keys.len(),
                        a.session.id
                    );
                }
                Response::Pulled {
                    stored: stored as u32,
                    message: &message,
                }
                .encode(tag, out);
            }
            Request::Read { key, count } => {
                if count == 0
                    || count as u64 * self.page_size as u64 + 64 > self.config.frame_len_max as u64
                {
                    return Err(Close::Bad(format!("read of {count} pages")));
                }
                let keys = (0..count as u64).map(|i| key.0.wrapping_add(i));
                if let Some(k) = keys.clone().find(|k| !pages.contains(*k)) {
                    Self::not_found(k, out, tag);
                    return Ok(());
                }
                // Encoded straight into `out`: header, fixed fields, then the pages.
                let start = out.len();
                Response::ReadOk {
                    key,
                    count,
                    data: &[],
                }
                .encode(tag, out);
                for k in keys {
                    if let Err(e) = pages.read(k, out) {
                        out.truncate(start);
                        self.unreadable(k, &e, out, tag);
                        return Ok(());
                    }
                }
                rmem_proto::patch_len(out, start);
            }
            Request::Write { key, count, data } => {
                self.check_data(count, data)?;
                match pages.store(sessions, capacity, key.0, data) {
                    Ok(()) => Response::WriteOk { key, count }.encode(tag, out),
                    Err(refusal) => {
                        drop(pages);
                        self.refused(key.0, refusal, data.len() as u64, out, tag);
                    }
                }
            }
            Request::Swap {
                write_key,
                read_key,
                data,
            } => {
                self.check_data(1, data)?;
                if let Err(refusal) = pages.store(sessions, capacity, write_key.0, data) {
                    drop(pages);
                    self.refused(write_key.0, refusal, data.len() as u64, out, tag);
                    return Ok(());
                }
                let mut page = std::mem::take(&mut self.scratch);
                page.clear();
                match pages.read(read_key.0, &mut page) {
                    Ok(true) => Response::SwapOk {
                        read_key,
                        data: &page,
                    }
                    .encode(tag, out),
                    Ok(false) => Self::not_found(read_key.0, out, tag),
                    Err(e) => self.unreadable(read_key.0, &e, out, tag),
                }
                self.scratch = page;
            }
            Request::ReadRange { key, offset, len } | Request::ReadPart { key, offset, len } => {
                let part = matches!(req, Request::ReadPart { .. });
                self.check_range(offset, len as usize)?;
                // Encoded straight into `out`: the header, then the range's bytes from the
                // page (no copy of the page in between).
                let start = out.len();
                Response::ReadRangeOk {
                    key,
                    offset,
                    data: &[],
                }
                .encode(tag, out);
                match pages.read_range(key.0, offset as usize, len as usize, out) {
                    Ok(true) => {}
                    Ok(false) if part => {
                        out.truncate(start);
                        Self::not_found(key.0, out, tag);
                        return Ok(());
                    }
                    // A page this session does not hold reads as zeros.
                    Ok(false) => out.resize(out.len() + len as usize, 0),
                    Err(e) => {
                        out.truncate(start);
                        self.unreadable(key.0, &e, out, tag);
                        return Ok(());
                    }
                }
                rmem_proto::patch_len(out, start);
            }
            Request::WriteRange { key, offset, data } => {
                self.check_range(offset, data.len())?;
                match pages.store_range(sessions, capacity, key.0, offset as usize, data) {
                    Ok(()) => {
                        let len = data.len() as u32;
                        Response::WriteRangeOk { key, offset, len }.encode(tag, out);
                    }
                    Err(refusal) => {
                        drop(pages);
                        self.refused(key.0, refusal, self.page_size as u64, out, tag);
                    }
                }
            }
            Request::Free { keys } => {
                let removed = pages.free(sessions, &keys);
                Response::FreeOk {
                    count: removed as u32,
                }
                .encode(tag, out);
            }
            Request::Ping => Response::Pong {
                used_bytes: self.state.used_bytes(),
                capacity_bytes: self.state.lendable_bytes(),
            }
            .encode(tag, out),
            Request::Snapshot { session } => {
                drop(pages);
                match sessions.snapshot(a, session) {
                    Ok(created) => Response::SnapshotOk { created }.encode(tag, out),
                    Err(message) => Response::Error {
                        code: ErrorCode::BadRequest,
                        message: &message,
                    }
                    .encode(tag, out),
                }
            }
            Request::EndSnapshot { session } => {
                drop(pages);
                match sessions.end_snapshot(a, session) {
                    Ok(freed_bytes) => {
                        log::log!(
                            self.verbose_level(),
                            "{}: snapshot {session} of session {} ended, freed {freed_bytes} bytes",
                            self.me,
                            a.session.id
                        );
                        Response::SessionEnded { freed_bytes }.encode(tag, out)
                    }
                    Err(message) => Response::Error {
                        code: ErrorCode::BadRequest,
                        message: &message,
                    }
                    .encode(tag, out),
                }
            }
            Request::EndSession => {
                drop(pages);
                let (freed_bytes, held_max) = sessions.end(a);
                log::log!(
                    self.verbose_level(),
                    "{}: session {} ended, freed {freed_bytes} bytes, held at most {held_max} pages",
                    self.me,
                    a.session.id
                );
                Response::SessionEnded { freed_bytes }.encode(tag, out);
            }
        }
        Ok(())
    }

    fn attach(
        &mut self,
        session: rmem_proto::SessionId,
        lease_ms: u32,
        flags: u32,
        reserved: u64,
        tag: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), Close> {
        if flags & !rmem_proto::ATTACH_FLAGS_KNOWN != 0 || reserved != 0 {
            return Err(Close::Bad(format!(
                "attach flags {flags:#x} or reserved {reserved:#x} not known to this server"
            )));
        }
        let lease = match lease_ms {
            0 => self.config.lease,
            ms => Duration::from_millis(ms.into()).min(self.config.lease),
        };
        let exclusive = flags & rmem_proto::ATTACH_EXCLUSIVE != 0;
        let mode = if flags & rmem_proto::ATTACH_SNAPSHOT != 0 {
            AttachMode::Snapshot(Duration::from_millis(rmem_proto::SNAPSHOT_WAIT_MS))
        } else if flags & rmem_proto::ATTACH_PEEK != 0 {
            AttachMode::Peek
        } else {
            AttachMode::Create
        };
        let attached =
            match self
                .state
                .sessions
                .attach(session, self.page_size, lease, exclusive, mode)
            {
                Ok(a) => a,
                // A snapshot that never came, or a session to peek at that is not here: the
                // client's pages are not here (its parent lost them, the snapshot ended, the
                // lease ran out). It says so, then the connection closes.
                Err(message) if mode != AttachMode::Create => {
                    Response::Error {
                        code: ErrorCode::SessionLost,
                        message: &message,
                    }
                    .encode(tag, out);
                    return Err(Close::Refused(message));
                }
                Err(message) => return Err(Close::Bad(message)),
            };
        Response::Attached {
            lease_ms: u32::try_from(attached.lease.as_millis()).unwrap_or(u32::MAX),
            flags: if attached.existed {
                rmem_proto::ATTACHED_EXISTED
            } else {
                0
            } | if attached.persists {
                rmem_proto::ATTACHED_PERSISTS
            } else {
                0
            },
            session_bytes: attached.session_bytes,
        }
        .encode(tag, out);
        self.attachment = Some(attached.attachment);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (s, c)
    }

    /// The spin ends when data is there (at once when it already is), and leaves the socket
    /// blocking either way: the connection's reads after it must wait, not fail.
    #[test]
    fn spin_for_data_returns_on_data_and_leaves_the_socket_blocking() {
        let (s, mut c) = pair();
        c.write_all(b"x").unwrap();
        let t = Instant::now();
        spin_for_data(&s, Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let mut b = [0u8; 1];
        (&s).read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");

        // Nothing comes: the spin runs out, and a read then blocks until its timeout.
        spin_for_data(&s, Duration::from_millis(2));
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let t = Instant::now();
        let e = (&s).read(&mut b).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{e}"
        );
        assert!(
            t.elapsed() >= Duration::from_millis(80),
            "{:?}",
            t.elapsed()
        );

        // Data arriving during the spin ends it early.
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c.write_all(b"y").unwrap();
            c
        });
        let t = Instant::now();
        spin_for_data(&s, Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let _c = writer.join().unwrap();
    }
}
