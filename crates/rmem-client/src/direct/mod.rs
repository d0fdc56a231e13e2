//! Direct regions: byte ranges on memory servers, read and written without paging.
//!
//! Entry point: [`DirectRegion::create`] (a region of `size` bytes on the servers a
//! [`Config`] names, optionally registered under a name) or [`DirectRegion::open`] (a named
//! region of another process of the same user), then [`DirectRegion::read`] /
//! [`DirectRegion::write`] and their list forms. Nothing is mapped or cached: a range is
//! split at page boundaries and each piece is one `ReadRange` or `WriteRange` request, so a
//! 100-byte read moves about 100 bytes ([`RegionStats`]).
//!
//! One engine per region owns where its pieces go (a [`Backend`]: a connection ([`Conn`])
//! per server, or a page store) and keeps many pieces in flight (up to
//! [`DirectRegion::create`]'s in-flight limit in bytes). Callers on any number of threads
//! queue their pieces; the calling thread that holds the engine drives it (sends, waits on the
//! sockets, takes the answers, everyone's) until its own call is answered, then hands it to
//! the next caller. So a call from one thread costs one round trip and no thread hand-off (an
//! engine thread of its own cost two wake-ups per call: a 64-byte read took 3.6x the raw
//! round trip). A ticker thread keeps idle links alive (pings within the lease) and drives a
//! page store's own work (a repair) when no caller does.
//! With byte ranges, page `p` of a region lives on server `p mod N` of the list it was made
//! with: a fixed place, so a second process that opens the region by name finds every page
//! without asking its creator. A server that is full refuses a write (`ENOSPC`); no other
//! server takes the page.
//!
//! Layouts: byte ranges are exact only where a server stores a page as it is (`--redundancy
//! none`, not encrypted): then each piece is a byte-range request ([`Ranges`]). A sealed page
//! (encryption, or the checksums of replicas) or an erasure-coded one cannot be read or
//! patched by a server, and a pool's servers come and go; a region then goes through the
//! pager's page store ([`paged`]: whole pages, or 4 KiB pieces where sealed by the piece,
//! read, patched and stored again by this process, with the store's failover and repair).
//!
//! Named regions: the creator writes a registration file (0600, in a 0700 directory of the
//! user's: `$XDG_RUNTIME_DIR/rmem-regions`, else `/tmp/rmem-regions-UID`) with its pid and
//! how to reach the pages ([`Reach`]). Under the plain layout: the session id, the servers
//! and the token; an opener attaches the same server sessions. Under any other: a socket on
//! which the creator serves the region ([`served`]), since the key, versions and placement of
//! its pages live in its page store alone. The creator's free ends the sessions or the links
//! (openers then get errors) and removes the file.

use crate::config::Config;
use crate::store::remote::{Answer, Conn, Kind, Timing};
use crate::store::StoreError;
use rmem_proto::{PageKey, Request, SessionId};
use std::collections::{HashMap, VecDeque};
use std::fs;
use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod paged;
mod served;

/// Bytes of pieces in flight at once per region when `RMEM_REGION_INFLIGHT` is not set.
pub const INFLIGHT_BYTES_DEFAULT: u64 = 64 << 20;
/// Longest region name.
pub const NAME_LEN_MAX: usize = 64;
/// A caller driving the engine spins only while no more than this is in flight.
const SPIN_INFLIGHT_MAX: u64 = 64 << 10;
/// How often the engine looks at its connections when nothing happens (timeouts, pings).
const TICK: Duration = Duration::from_millis(100);
/// How often while the backend has work of its own under way (a page store's repair).
const BUSY_TICK: Duration = Duration::from_millis(2);

/// Why a region call failed. [`RegionError::errno`] is what the C API sets.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("range of {len} bytes at offset {offset} is outside the region of {size} bytes")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Layout(String),
    #[error("region name {name:?}: {why}")]
    Name { name: String, why: String },
    #[error("no region named {name:?}: {why}")]
    NoSuchName { name: String, why: String },
    #[error("a region named {name:?} exists already (process {pid})")]
    NameTaken { name: String, pid: u32 },
    #[error("region registry {path}")]
    Registry {
        path: String,
        source: std::io::Error,
    },
    #[error("memory server {server} is full: a new page of the region does not fit")]
    Full { server: String },
    /// A page store refused a page for want of room (every server full, or the pool's grant).
    #[error("{0}")]
    NoRoom(String),
    #[error("the region is unusable: {0}")]
    Failed(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl RegionError {
    /// The errno the C API reports this with.
    pub fn errno(&self) -> i32 {
        match self {
            RegionError::OutOfRange { .. } | RegionError::Invalid(_) => libc::EINVAL,
            RegionError::Name { .. } => libc::EINVAL,
            RegionError::Layout(_) => libc::ENOTSUP,
            RegionError::NoSuchName { .. } => libc::ENOENT,
            RegionError::NameTaken { .. } => libc::EEXIST,
            RegionError::Registry { .. } => libc::EACCES,
            RegionError::Full { .. } | RegionError::NoRoom(_) => libc::ENOSPC,
            RegionError::Failed(_) | RegionError::Store(_) => libc::EIO,
        }
    }
}

/// What a region has moved. `bytes_*` count page data only (no frame headers): a
/// `read` of 100 bytes adds 100 to `bytes_read` and to `bytes_fetched`.
#[derive(Debug, Default)]
pub struct RegionStats {
    /// Calls that read or wrote, and their bytes as the callers asked.
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Page data that came from the servers and went to them.
    pub bytes_fetched: AtomicU64,
    pub bytes_sent: AtomicU64,
    /// Requests sent to servers: one per piece of a range within a page; through a page store
    /// (sealed or coded layouts, pools) one per page (or 4 KiB piece) read and one per page
    /// stored, however many servers it goes to.
    pub requests: AtomicU64,
}

/// A caller's buffer, written (read pieces) or read (write pieces) by whichever thread
/// drives the engine.
#[derive(Clone, Copy)]
struct Buf(*mut u8);
// SAFETY: a Buf is only used while the call that made it has not returned (it drives the
// engine until its job is done), which keeps the buffer borrowed; the engine forgets every
// piece before the job completes.
unsafe impl Send for Buf {}

/// One call's pieces: how many are unanswered, and the first error.
struct Job {
    state: Mutex<(usize, Option<RegionError>)>,
}

impl Job {
    fn new(pieces: usize) -> Arc<Job> {
        Arc::new(Job {
            state: Mutex::new((pieces, None)),
        })
    }

    /// One piece answered (with `err` if it failed).
    fn answered(&self, err: Option<RegionError>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 -= 1;
        if s.1.is_none() {
            s.1 = err;
        }
    }

    fn done(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0 == 0
    }

    /// The call's outcome, once [`Job::done`].
    fn result(&self) -> Result<(), RegionError> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1.take().map_or(Ok(()), Err)
    }
}

/// A range within one page.
struct Piece {
    job: Arc<Job>,
    page: u64,
    offset: u32,
    len: u32,
    buf: Buf,
    write: bool,
}

struct Queue {
    pieces: Vec<Piece>,
    stop: bool,
    /// Set by the engine when it gave up; every later call fails with it.
    failed: Option<String>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// An eventfd: the caller driving the engine sleeps on it with the connections, so that
    /// another caller's pieces go out at once.
    wake: OwnedFd,
    stats: RegionStats,
}

impl Shared {
    fn kick(&self) {
        let one = 1u64;
        // SAFETY: writing 8 bytes from a local to our own eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// How a region's links attach its sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attach {
    /// An unnamed region: no other process attaches its sessions, so a link attaches
    /// exclusively, and a lost one is re-established (fencing whatever the old link still had
    /// buffered on the server) with its requests sent again, as the pager's are.
    Alone,
    /// A named region's creator, and another process that opened it by name: attaches fence
    /// no one, and a lost link ends the region ([`Conn::connect_shared`]). The creator ends
    /// the sessions when it frees the region.
    Creator,
    Opener,
}

/// Where a region lives, as the registration file says (what [`registered`] shows of it:
/// [`Registered`]).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Place {
    size: u64,
    page_size: usize,
    /// The creator: the region lives while it does.
    pid: u32,
    reach: Reach,
}

/// How an opener reaches a named region's pages.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reach {
    /// Pages stored as they are: attach the creator's sessions on its servers (page `p` on
    /// server `p mod N`) and read and write byte ranges there.
    Servers {
        session: SessionId,
        servers: Vec<String>,
        token: Vec<u8>,
    },
    /// Pages only the creator can read (sealed, coded or pooled): ask it, on this socket.
    Creator { socket: PathBuf },
}

/// A region of bytes on memory servers. Safe to use from several threads at once.
pub struct DirectRegion {
    core: Arc<Core>,
    ticker: Option<std::thread::JoinHandle<()>>,
    /// The registration file of a named region this process created (removed at drop).
    registered: Option<PathBuf>,
    /// Where this process serves its named region to openers, under a layout only it can
    /// read ([`served`]).
    host: Option<served::Host>,
}

/// What calls on a region go through: its queue and engine. Shared with the threads that
/// serve a named region's openers ([`served::Host`]).
struct Core {
    shared: Arc<Shared>,
    /// Driven by whichever calling thread holds it (see the module's notes).
    engine: Arc<Mutex<Engine>>,
    size: u64,
    page_size: usize,
}

impl DirectRegion {
    /// A region of `size` zeroed bytes on `config`'s servers, a new session on each. With a
    /// `name`, registered so that [`DirectRegion::open`] finds it while this one lives.
    pub fn create(
        config: &Config,
        size: u64,
        name: Option<&str>,
    ) -> Result<DirectRegion, RegionError> {
        if size == 0 {
            return Err(RegionError::Invalid("a region of 0 bytes".into()));
        }
        if let Some(n) = name {
            check_name(n)?;
        }
        let (redundancy, encrypt) = config.layout();
        let sealed = redundancy != crate::store::codec::Redundancy::None || encrypt;
        if sealed || config.manager.is_some() {
            // The servers cannot serve byte ranges of sealed or coded pages, and a pool's
            // servers come and go: the pager's page store takes the region's pages whole,
            // and only this process can read them: it serves a named region's openers.
            let store = crate::store::cluster::RemoteStore::from_config(config)?;
            let mut r = DirectRegion::with_backend(
                Box::new(paged::Paged::new(Box::new(store), config.page_size)),
                size,
                config.page_size,
                config.spin,
                inflight_limit()?,
            )?;
            if let Some(n) = name {
                let socket = registry_dir(true)?.join(format!(".{n}"));
                let place = Place {
                    size,
                    page_size: config.page_size,
                    pid: std::process::id(),
                    reach: Reach::Creator {
                        socket: socket.clone(),
                    },
                };
                let registered = register(n, &place)?;
                match served::Host::start(socket, r.core.clone(), n) {
                    Ok(h) => r.host = Some(h),
                    Err(e) => {
                        let _ = fs::remove_file(&registered);
                        return Err(e);
                    }
                }
                r.registered = Some(registered);
            }
            return Ok(r);
        }
        if config.servers.is_empty() {
            return Err(RegionError::Layout(
                "a region needs memory servers: none are configured (RMEM_SERVERS)".into(),
            ));
        }
        let session = SessionId::random().map_err(|e| RegionError::Registry {
            path: "(random source)".into(),
            source: e,
        })?;
        let place = Place {
            size,
            page_size: config.page_size,
            pid: std::process::id(),
            reach: Reach::Servers {
                session,
                servers: config.servers.clone(),
                token: config.token.clone(),
            },
        };
        let registered = match name {
            Some(n) => Some(register(n, &place)?),
            None => None,
        };
        let attach = if name.is_some() {
            Attach::Creator
        } else {
            Attach::Alone
        };
        let r = DirectRegion::start(
            &place,
            Timing::of(config),
            config.spin,
            attach,
            inflight_limit()?,
        );
        if r.is_err() {
            if let Some(p) = &registered {
                let _ = fs::remove_file(p);
            }
        }
        let mut r = r?;
        r.registered = registered;
        Ok(r)
    }

    /// The region another process of this user created under `name` and still holds.
    pub fn open(name: &str, timing: Timing) -> Result<DirectRegion, RegionError> {
        let file = check_name(name)?;
        let Some(dir) = existing_registry_dir()? else {
            return Err(RegionError::NoSuchName {
                name: name.into(),
                why: "this user has registered no region here (no registry directory)".into(),
            });
        };
        let path = dir.join(file);
        let text = fs::read_to_string(&path).map_err(|e| RegionError::NoSuchName {
            name: name.into(),
            why: format!("{}: {e}", path.display()),
        })?;
        let place = parse_place(&text).ok_or_else(|| RegionError::NoSuchName {
            name: name.into(),
            why: format!("{} is not a region's registration", path.display()),
        })?;
        if !alive(place.pid) {
            return Err(RegionError::NoSuchName {
                name: name.into(),
                why: format!("its creator (process {}) is gone", place.pid),
            });
        }
        let spin =
            crate::config::spin_from_env().map_err(|e| RegionError::Invalid(e.to_string()))?;
        match &place.reach {
            Reach::Servers { .. } => {
                DirectRegion::start(&place, timing, spin, Attach::Opener, inflight_limit()?)
            }
            Reach::Creator { socket } => DirectRegion::with_backend(
                Box::new(served::Served::connect(socket, place.pid, name)?),
                place.size,
                place.page_size,
                spin,
                inflight_limit()?,
            ),
        }
    }

    /// A region of byte ranges on the servers `place` names.
    fn start(
        place: &Place,
        timing: Timing,
        spin: Duration,
        attach: Attach,
        inflight_max: u64,
    ) -> Result<DirectRegion, RegionError> {
        let Reach::Servers {
            session,
            servers,
            token,
        } = &place.reach
        else {
            unreachable!("a region served by its creator has no servers to attach");
        };
        let owner = attach != Attach::Opener;
        let mut conns = Vec::with_capacity(servers.len());
        for s in servers {
            let (t, ps, id) = (token, place.page_size, *session);
            let c = match attach {
                Attach::Alone => Conn::connect(s, t, ps, id, timing),
                Attach::Creator | Attach::Opener => Conn::connect_shared(s, t, ps, id, timing),
            };
            match c {
                Ok(c) => conns.push(c),
                Err(e) => {
                    if owner {
                        conns.iter_mut().for_each(Conn::end_session);
                    }
                    return Err(e.into());
                }
            }
        }
        let ranges = Ranges {
            conns,
            pending: Pending::default(),
            owner,
        };
        DirectRegion::with_backend(
            Box::new(ranges),
            place.size,
            place.page_size,
            spin,
            inflight_max,
        )
    }

    fn with_backend(
        backend: Box<dyn Backend>,
        size: u64,
        page_size: usize,
        spin: Duration,
        inflight_max: u64,
    ) -> Result<DirectRegion, RegionError> {
        // SAFETY: eventfd has no memory arguments; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(RegionError::Registry {
                path: "eventfd".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                pieces: Vec::new(),
                stop: false,
                failed: None,
            }),
            // SAFETY: `fd` is a new descriptor nobody else owns.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            stats: RegionStats::default(),
        });
        let engine = Arc::new(Mutex::new(Engine {
            shared: shared.clone(),
            backend,
            waiting: VecDeque::new(),
            inflight_max,
            next_tick: Instant::now() + TICK,
            spin,
        }));
        let (e, sh) = (engine.clone(), shared.clone());
        let ticker = std::thread::Builder::new()
            .name("rmem-region".into())
            .spawn(move || tick_until_stopped(&sh, &e))
            .map_err(|e| RegionError::Registry {
                path: "(ticker thread)".into(),
                source: e,
            })?;
        Ok(DirectRegion {
            core: Arc::new(Core {
                shared,
                engine,
                size,
                page_size,
            }),
            ticker: Some(ticker),
            registered: None,
            host: None,
        })
    }

    pub fn size(&self) -> u64 {
        self.core.size
    }

    pub fn page_size(&self) -> usize {
        self.core.page_size
    }

    pub fn stats(&self) -> &RegionStats {
        &self.core.shared.stats
    }

    /// Read `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), RegionError> {
        self.read_ranges(&mut [(offset, buf)])
    }

    /// Write `buf` at `offset`.
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<(), RegionError> {
        self.write_ranges(&[(offset, buf)])
    }

    /// Read every range (offset, buffer), all in flight together. Nothing is read unless
    /// every range lies inside the region.
    pub fn read_ranges(&self, ranges: &mut [(u64, &mut [u8])]) -> Result<(), RegionError> {
        let list: Vec<(u64, Buf, usize)> = ranges
            .iter_mut()
            .map(|(o, b)| (*o, Buf(b.as_mut_ptr()), b.len()))
            .collect();
        let n: u64 = list.iter().map(|r| r.2 as u64).sum();
        self.core.run(&list, false)?;
        let stats = &self.core.shared.stats;
        stats.reads.fetch_add(1, Relaxed);
        stats.bytes_read.fetch_add(n, Relaxed);
        Ok(())
    }

    /// Write every range (offset, data), all in flight together; ranges that overlap land
    /// in no particular order. Nothing is written unless every range lies inside the region.
    pub fn write_ranges(&self, ranges: &[(u64, &[u8])]) -> Result<(), RegionError> {
        let list: Vec<(u64, Buf, usize)> = ranges
            .iter()
            .map(|(o, b)| (*o, Buf(b.as_ptr().cast_mut()), b.len()))
            .collect();
        let n: u64 = list.iter().map(|r| r.2 as u64).sum();
        self.core.run(&list, true)?;
        let stats = &self.core.shared.stats;
        stats.writes.fetch_add(1, Relaxed);
        stats.bytes_written.fetch_add(n, Relaxed);
        Ok(())
    }
}

impl Core {
    /// Queue the ranges and wait for every answer.
    fn run(&self, ranges: &[(u64, Buf, usize)], write: bool) -> Result<(), RegionError> {
        match self.queue(ranges, write)? {
            Some(job) => self.wait(&job),
            None => Ok(()),
        }
    }

    /// Split the ranges into pieces within pages and queue them: the job that tells when
    /// they are answered (none when there is nothing to move). The buffers must stay
    /// borrowed until [`Core::wait`] of the job returns.
    fn queue(
        &self,
        ranges: &[(u64, Buf, usize)],
        write: bool,
    ) -> Result<Option<Arc<Job>>, RegionError> {
        for &(offset, _, len) in ranges {
            let end = offset.checked_add(len as u64);
            if end.is_none_or(|e| e > self.size) {
                return Err(RegionError::OutOfRange {
                    offset,
                    len: len as u64,
                    size: self.size,
                });
            }
        }
        let ps = self.page_size as u64;
        let count: usize = ranges
            .iter()
            .filter(|r| r.2 > 0)
            .map(|&(o, _, l)| ((o + l as u64 - 1) / ps - o / ps + 1) as usize)
            .sum();
        if count == 0 {
            return Ok(None);
        }
        let job = Job::new(count);
        let mut pieces = Vec::with_capacity(count);
        for &(offset, buf, len) in ranges {
            let mut done = 0u64;
            while done < len as u64 {
                let at = offset + done;
                let within = at % ps;
                let n = (ps - within).min(len as u64 - done);
                pieces.push(Piece {
                    job: job.clone(),
                    page: at / ps,
                    offset: within as u32,
                    len: n as u32,
                    // SAFETY: `done < len`: inside the caller's buffer.
                    buf: Buf(unsafe { buf.0.add(done as usize) }),
                    write,
                });
                done += n;
            }
        }
        {
            let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(why) = &q.failed {
                return Err(RegionError::Failed(why.clone()));
            }
            q.pieces.append(&mut pieces);
        }
        self.shared.kick();
        Ok(Some(job))
    }

    /// Drive the engine, everyone's pieces, until `job`'s are answered. A caller that
    /// waited for the engine may find its pieces answered by the one before.
    /// With little in flight it polls without sleeping for up to `spin` after its last
    /// answer, as the pager does: a sleep in poll(2) and the wake-up after it cost more
    /// than a round trip. With more, the wake-up is small beside the transfer, and on a
    /// machine with few cores a spinning caller takes the CPU the servers send with.
    fn wait(&self, job: &Job) -> Result<(), RegionError> {
        let mut engine = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        let mut last = Instant::now();
        while !job.done() {
            engine.take_queued();
            let sleep = last.elapsed() >= engine.spin
                || engine.backend.inflight_bytes() > SPIN_INFLIGHT_MAX;
            match engine.step(sleep) {
                Ok(0) => crate::config::spin_pause(),
                Ok(_) => last = Instant::now(),
                Err(e) => engine.fail(e), // answers every piece, this call's too
            }
        }
        drop(engine);
        job.result()
    }
}

impl Drop for DirectRegion {
    fn drop(&mut self) {
        if let Some(p) = &self.registered {
            let _ = fs::remove_file(p);
        }
        // Openers' links close before the engine stops: a call of theirs under way ends.
        drop(self.host.take());
        self.core
            .shared
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stop = true;
        if let Some(t) = self.ticker.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Where a region's pieces go: straight to the servers as byte ranges ([`Ranges`]), or
/// through a page store ([`paged::Paged`]) where the servers cannot serve byte ranges.
trait Backend: Send {
    /// Send `p`, or hold it until its page is free.
    fn submit(&mut self, p: Piece, stats: &RegionStats) -> Result<(), RegionError>;
    /// Bytes of pieces (or pages) under way.
    fn inflight_bytes(&self) -> u64;
    /// Whether anything is under way.
    fn busy(&self) -> bool;
    fn flush(&mut self, now: Instant) -> Result<(), RegionError>;
    /// Descriptors to wait on for answers.
    fn pollfds(&self, out: &mut Vec<libc::pollfd>);
    /// Take the answers that came, answering pieces; how many came.
    fn take_answers(&mut self, now: Instant, stats: &RegionStats) -> Result<usize, RegionError>;
    /// Upkeep every [`TICK`]: pings, deadlines.
    fn tick(&mut self, now: Instant) -> Result<(), RegionError>;
    /// Whether work of its own (a repair) wants polling more often than every [`TICK`].
    fn wants_polling(&self) -> bool {
        false
    }
    /// Every piece held or under way, taken back (the region failed).
    fn drain(&mut self) -> Vec<Piece>;
    /// The region is freed: end the sessions this process made.
    fn end_sessions(&mut self);
}

/// The engine's state: where pieces go, and those waiting for room.
struct Engine {
    shared: Arc<Shared>,
    backend: Box<dyn Backend>,
    waiting: VecDeque<Piece>,
    inflight_max: u64,
    /// When the links are next looked at for timeouts and pings.
    next_tick: Instant,
    /// How long a driving caller polls without sleeping after an answer (`RMEM_SPIN_US`).
    spin: Duration,
}

/// The ticker thread: every [`TICK`] (more often while the backend has work of its own),
/// unless a caller is driving the engine, take answers and ping idle links; when the region
/// is dropped, end its sessions if this process made them.
fn tick_until_stopped(shared: &Shared, engine: &Mutex<Engine>) {
    let mut period = TICK;
    loop {
        std::thread::park_timeout(period);
        let (stop, failed) = {
            let q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            (q.stop, q.failed.is_some())
        };
        if stop {
            break;
        }
        if failed {
            continue;
        }
        if let Ok(mut e) = engine.try_lock() {
            e.take_queued();
            if let Err(err) = e.step(false) {
                e.fail(err);
            }
            period = if e.backend.wants_polling() {
                BUSY_TICK
            } else {
                TICK
            };
        }
    }
    let mut e = engine.lock().unwrap_or_else(|e| e.into_inner());
    e.backend.end_sessions();
}

impl Engine {
    /// Take the pieces callers queued.
    fn take_queued(&mut self) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        self.waiting.extend(q.pieces.drain(..));
    }

    /// Send what fits, wait (if `wait`: for answers, a kick or the next tick) and take the
    /// answers; how many came.
    fn step(&mut self, wait: bool) -> Result<usize, RegionError> {
        while !self.waiting.is_empty() {
            if self.backend.inflight_bytes() >= self.inflight_max && self.backend.busy() {
                break;
            }
            let p = self.waiting.pop_front().expect("front");
            self.backend.submit(p, &self.shared.stats)?;
        }
        let now = Instant::now();
        self.backend.flush(now)?;
        let mut fds = vec![libc::pollfd {
            fd: self.shared.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        self.backend.pollfds(&mut fds);
        let timeout = if wait {
            (self.next_tick.saturating_duration_since(now).as_millis() as i32).max(1)
        } else {
            0
        };
        // SAFETY: `fds` is a live array of pollfd of the length passed.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        let mut sink = 0u64;
        // SAFETY: reading 8 bytes into a local from our own non-blocking eventfd.
        unsafe {
            libc::read(
                self.shared.wake.as_raw_fd(),
                (&mut sink as *mut u64).cast(),
                8,
            )
        };
        let now = Instant::now();
        let answers = self.backend.take_answers(now, &self.shared.stats)?;
        if now >= self.next_tick {
            self.backend.tick(now)?;
            self.next_tick = now + TICK;
        }
        Ok(answers)
    }

    /// The engine gives up: every piece fails, and every later call.
    fn fail(&mut self, e: RegionError) {
        let why = crate::error_chain(&e);
        let pieces: Vec<Piece> = {
            let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.failed = Some(why.clone());
            q.pieces.drain(..).collect()
        };
        let all = self
            .backend
            .drain()
            .into_iter()
            .chain(self.waiting.drain(..))
            .chain(pieces);
        for p in all {
            p.job.answered(Some(RegionError::Failed(why.clone())));
        }
    }
}

/// A backend's pieces under way, by the op number their answer names.
#[derive(Default)]
struct Pending {
    ops: HashMap<u64, Piece>,
    last_op: u64,
    /// Bytes of the pieces.
    bytes: u64,
}

impl Pending {
    /// A number no piece under way has.
    fn next_op(&mut self) -> u64 {
        self.last_op += 1;
        self.last_op
    }

    fn insert(&mut self, op: u64, p: Piece) {
        self.bytes += u64::from(p.len);
        self.ops.insert(op, p);
    }

    /// The piece `op` names, answered now (none if it is not under way).
    fn take(&mut self, op: u64) -> Option<Piece> {
        let p = self.ops.remove(&op)?;
        self.bytes -= u64::from(p.len);
        Some(p)
    }

    fn drain(&mut self) -> Vec<Piece> {
        self.bytes = 0;
        self.ops.drain().map(|(_, p)| p).collect()
    }
}

/// Pieces as byte ranges, straight to the servers: page `p` on server `p mod N`.
struct Ranges {
    conns: Vec<Conn>,
    pending: Pending,
    /// This process created the sessions: it ends them when the region is freed.
    owner: bool,
}

impl Backend for Ranges {
    fn submit(&mut self, p: Piece, stats: &RegionStats) -> Result<(), RegionError> {
        let op = self.pending.next_op();
        let s = (p.page % self.conns.len() as u64) as usize;
        let key = PageKey(p.page);
        if p.write {
            // SAFETY: the caller's buffer, `len` bytes from `buf`, borrowed while it waits.
            let data = unsafe { std::slice::from_raw_parts(p.buf.0, p.len as usize) };
            self.conns[s].submit(
                Request::WriteRange {
                    key,
                    offset: p.offset,
                    data,
                },
                Kind::WriteRange {
                    op,
                    piece: 0,
                    key: p.page,
                    offset: p.offset,
                },
            );
            stats.bytes_sent.fetch_add(p.len.into(), Relaxed);
        } else {
            self.conns[s].submit(
                Request::ReadRange {
                    key,
                    offset: p.offset,
                    len: p.len,
                },
                Kind::ReadRange {
                    op,
                    piece: 0,
                    key: p.page,
                    offset: p.offset,
                    len: p.len,
                },
            );
        }
        stats.requests.fetch_add(1, Relaxed);
        self.pending.insert(op, p);
        Ok(())
    }

    fn inflight_bytes(&self) -> u64 {
        self.pending.bytes
    }

    fn busy(&self) -> bool {
        !self.pending.ops.is_empty()
    }

    fn flush(&mut self, now: Instant) -> Result<(), RegionError> {
        Ok(self.conns.iter_mut().try_for_each(|c| c.flush(now))?)
    }

    fn pollfds(&self, out: &mut Vec<libc::pollfd>) {
        out.extend(self.conns.iter().filter_map(Conn::pollfd));
    }

    fn take_answers(&mut self, now: Instant, stats: &RegionStats) -> Result<usize, RegionError> {
        let mut refused = Vec::new();
        let mut answers = 0;
        let pending = &mut self.pending;
        let mut done = |op: u64, data: Option<&[u8]>| {
            let Some(p) = pending.take(op) else {
                return;
            };
            match data {
                Some(data) => {
                    assert_eq!(data.len(), p.len as usize, "the link checks the length");
                    stats.bytes_fetched.fetch_add(data.len() as u64, Relaxed);
                    answer_read(&p, data);
                }
                None => p.job.answered(None),
            }
        };
        for (s, c) in self.conns.iter_mut().enumerate() {
            c.poll(
                &mut |a| {
                    answers += 1;
                    match a {
                        Answer::Read { op, data, .. } => done(op, Some(data)),
                        Answer::Written { op, .. } => done(op, None),
                        Answer::Full { op, .. } | Answer::Missing { op, .. } => {
                            refused.push((op, s))
                        }
                        Answer::Pulled { .. } => unreachable!("a region sends no pulls"),
                    }
                },
                now,
            )?;
        }
        for (op, s) in refused {
            if let Some(p) = self.pending.take(op) {
                let server = self.conns[s].name().to_string();
                p.job.answered(Some(RegionError::Full { server }));
            }
        }
        Ok(answers)
    }

    fn tick(&mut self, now: Instant) -> Result<(), RegionError> {
        Ok(self.conns.iter_mut().try_for_each(|c| c.tick(now))?)
    }

    fn drain(&mut self) -> Vec<Piece> {
        self.pending.drain()
    }

    fn end_sessions(&mut self) {
        if self.owner {
            self.conns.iter_mut().for_each(Conn::end_session);
        }
    }
}

/// Read piece `p` is answered with `data` (its bytes): to the caller's buffer.
fn answer_read(p: &Piece, data: &[u8]) {
    debug_assert_eq!(data.len(), p.len as usize);
    // SAFETY: the caller's buffer, `len` bytes from `buf`, borrowed while it waits.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.buf.0, data.len()) };
    p.job.answered(None);
}

/// `RMEM_REGION_INFLIGHT` (a size), else the default.
fn inflight_limit() -> Result<u64, RegionError> {
    match std::env::var("RMEM_REGION_INFLIGHT") {
        Err(_) => Ok(INFLIGHT_BYTES_DEFAULT),
        Ok(v) => rmem_proto::size::parse_size(&v)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                RegionError::Invalid(format!(
                    "RMEM_REGION_INFLIGHT={v:?}: expected a size above 0 (like 64M)"
                ))
            }),
    }
}

fn check_name(name: &str) -> Result<&str, RegionError> {
    let ok = !name.is_empty()
        && name.len() <= NAME_LEN_MAX
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(name)
    } else {
        Err(RegionError::Name {
            name: name.into(),
            why: format!(
                "1 to {NAME_LEN_MAX} letters, digits, '.', '_' or '-', not starting with '.'"
            ),
        })
    }
}

/// The user's registry directory, made (0700) when `create`; refused unless it is a real
/// directory of this user that nobody else can read.
fn registry_dir(create: bool) -> Result<PathBuf, RegionError> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| Path::new(d).is_dir()) {
        Some(d) => PathBuf::from(d).join("rmem-regions"),
        None => PathBuf::from(format!("/tmp/rmem-regions-{uid}")),
    };
    let err = |source| RegionError::Registry {
        path: dir.display().to_string(),
        source,
    };
    if create {
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(e)),
        }
    }
    let m = fs::symlink_metadata(&dir).map_err(err)?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(err(std::io::Error::other(
            "is not a directory of this user closed to others (mode 0700); remove it",
        )));
    }
    Ok(dir)
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn format_place(p: &Place) -> String {
    let reach = match &p.reach {
        Reach::Servers {
            session,
            servers,
            token,
        } => format!(
            "session {session}\nservers {}\ntoken {}\n",
            servers.join(","),
            hex(token)
        ),
        Reach::Creator { socket } => format!("socket {}\n", socket.display()),
    };
    format!(
        "size {}\npage_size {}\n{reach}pid {}\n",
        p.size, p.page_size, p.pid
    )
}

fn parse_place(text: &str) -> Option<Place> {
    let mut f: HashMap<&str, &str> = HashMap::new();
    for line in text.lines() {
        let (k, v) = line.split_once(' ')?;
        f.insert(k, v);
    }
    let reach = match f.get("socket") {
        Some(socket) => Reach::Creator {
            socket: Some(PathBuf::from(socket)).filter(|p| p.is_absolute())?,
        },
        None => {
            let servers: Vec<String> = f.get("servers")?.split(',').map(str::to_string).collect();
            if servers.iter().any(String::is_empty) {
                return None;
            }
            Reach::Servers {
                session: SessionId(u128::from_str_radix(f.get("session")?, 16).ok()?),
                servers,
                token: unhex(f.get("token")?)?,
            }
        }
    };
    Some(Place {
        size: f.get("size")?.parse().ok().filter(|&s| s > 0)?,
        page_size: f.get("page_size")?.parse().ok().filter(|&s| s > 0)?,
        pid: f.get("pid")?.parse().ok()?,
        reach,
    })
}

/// A named region held now, as its registration says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    pub name: String,
    pub size: u64,
    pub page_size: usize,
    /// The creator: the region lives while it does.
    pub pid: u32,
}

/// The user's registry directory, if there is one yet (it is made by the first registration).
fn existing_registry_dir() -> Result<Option<PathBuf>, RegionError> {
    match registry_dir(false) {
        Err(RegionError::Registry { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        r => r.map(Some),
    }
}

/// This user's named regions whose creators are alive, by name (none without a registry).
pub fn registered() -> Result<Vec<Registered>, RegionError> {
    let Some(dir) = existing_registry_dir()? else {
        return Ok(Vec::new());
    };
    let entries = fs::read_dir(&dir).map_err(|source| RegionError::Registry {
        path: dir.display().to_string(),
        source,
    })?;
    let mut list: Vec<Registered> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let place = parse_place(&fs::read_to_string(e.path()).ok()?)?;
            alive(place.pid).then_some(Registered {
                name,
                size: place.size,
                page_size: place.page_size,
                pid: place.pid,
            })
        })
        .collect();
    list.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(list)
}

/// Write `place` as `name`'s registration (0600, created new); a registration whose creator
/// is gone is replaced. The file's path.
fn register(name: &str, place: &Place) -> Result<PathBuf, RegionError> {
    let path = registry_dir(true)?.join(check_name(name)?);
    let err = |source| RegionError::Registry {
        path: path.display().to_string(),
        source,
    };
    for _ in 0..2 {
        let opened = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path);
        match opened {
            Ok(mut f) => {
                f.write_all(format_place(place).as_bytes()).map_err(err)?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let old = fs::read_to_string(&path).ok().and_then(|t| parse_place(&t));
                if let Some(old) = old.filter(|o| alive(o.pid)) {
                    return Err(RegionError::NameTaken {
                        name: name.into(),
                        pid: old.pid,
                    });
                }
                // Its creator is gone (or it is half-written by one that died): stale.
                fs::remove_file(&path).map_err(err)?;
            }
            Err(e) => return Err(err(e)),
        }
    }
    Err(err(std::io::ErrorKind::AlreadyExists.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_round_trips_and_bad_names_are_refused() {
        let p = Place {
            size: 12345,
            page_size: 4096,
            pid: 42,
            reach: Reach::Servers {
                session: SessionId(u128::MAX - 3),
                servers: vec!["127.0.0.1:1".into(), "[::1]:2".into()],
                token: b"t\x00ok\xff".to_vec(),
            },
        };
        assert_eq!(parse_place(&format_place(&p)), Some(p));
        let served = Place {
            size: 7,
            page_size: 65536,
            pid: 43,
            reach: Reach::Creator {
                socket: "/run/user/1/rmem-regions/.frames".into(),
            },
        };
        assert_eq!(parse_place(&format_place(&served)), Some(served));
        assert_eq!(
            parse_place("size 7\npage_size 4096\nsocket rel\npid 1\n"),
            None
        );
        assert_eq!(parse_place("session zz\n"), None);
        for bad in ["", ".x", "a/b", "../x", &"n".repeat(NAME_LEN_MAX + 1)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("a-b_c.9").is_ok());
    }
}
