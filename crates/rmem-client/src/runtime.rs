//! [`Runtime`]: one region, one pager thread, one allocator.

use crate::alloc::Allocator;
use crate::config::{Config, ConfigError};
use crate::pager::{Command, Done, Mailbox, Pager, PagerSetup, Park, Parked, TraceOut};
use crate::region::{Mapping, Staging, REGION_AT};
use crate::stats::{Stats, StatsSnapshot};
use crate::store::mem::MemStore;
use crate::store::remote::RemoteStore;
use crate::store::{PageStore, StoreError};
use crate::PageIndex;
use rmem_policy::trace::TraceWriter;
use rmem_uffd::{fds, OpenMode, Uffd, UffdError};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("bad configuration")]
    Config(#[from] ConfigError),
    #[error("unknown policy {0:?} (known: {known})", known = rmem_policy::POLICY_NAMES.join(", "))]
    Policy(String),
    #[error("cannot reserve {bytes} bytes of address space for the region")]
    Reserve { bytes: u64, source: std::io::Error },
    #[error("userfaultfd")]
    Uffd(#[from] UffdError),
    #[error("the kernel lacks UFFDIO_MOVE (Linux 6.8 or later is required)")]
    NoMove,
    #[error("memory servers")]
    Store(#[from] StoreError),
    #[error("cannot write the trace {path}")]
    Trace {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the pager thread")]
    Thread(#[source] std::io::Error),
    #[error("cannot give the pager a descriptor table of its own (unshare(CLONE_FILES))")]
    Isolate(#[source] std::io::Error),
    #[error("cannot take over the parent's region: {0}")]
    Child(String),
}

/// What happens when the pager hits an error it cannot recover from (a lost server, or every
/// server full).
pub type FatalHandler = Box<dyn Fn(&str) + Send + Sync>;

/// Why a fork() cannot give its child remote memory.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error("faults delivered by signal (RMEM_FAULT_DELIVERY=signal) cannot be handed to a fork() child")]
    BySignal,
    #[error("cannot make the pipe that tells the pager when the child is gone")]
    Pipe(#[source] std::io::Error),
    #[error("the pager cannot park for the fork: {0}")]
    Park(String),
    #[error("the child cannot start its own pager")]
    Child(#[source] RuntimeError),
}

/// Report and end the process: memory on a lost server cannot be trusted, and a page no server
/// takes cannot be kept (the program owns it already: overcommit), so going on would hand the
/// program zeros or stale data.
pub fn exit_on_fatal(message: &str) {
    crate::tell!("rmem: fatal: {message}");
    crate::tell!("rmem: stopping the program: part of its memory cannot be kept or trusted");
    // SAFETY: _exit ends the process at once without running atexit handlers, which could
    // touch remote memory and hang.
    unsafe { libc::_exit(crate::EXIT_SERVER_LOST) };
}

/// Exit status when one of rmem's own descriptors was taken from it.
pub const EXIT_DESCRIPTOR_LOST: i32 = 71;

/// Report that the program closed one of rmem's descriptors behind its back and end the
/// process: going on could lose the program's frees or hang it.
pub fn exit_descriptor_lost(fd: i32, what: &str) -> ! {
    crate::tell!(
        "rmem: fatal: descriptor {fd}, {what}, was closed by a raw system call of the program \
         (librmem's close, dup2, dup3, close_range and closefrom leave rmem's descriptors alone)"
    );
    // SAFETY: as in exit_on_fatal.
    unsafe { libc::_exit(EXIT_DESCRIPTOR_LOST) };
}

/// A running rmem client: the region, its pager and its allocator.
pub struct Runtime {
    base: u64,
    len: u64,
    page_size: u64,
    policy: String,
    stats: Arc<Stats>,
    mailbox: Arc<Mailbox>,
    pager: Mutex<Option<JoinHandle<()>>>,
    alloc: Mutex<Allocator>,
    capacity_bytes: u64,
    /// Allocations take no capacity (it is taken as pages are written back).
    overcommit: bool,
    mode: OpenMode,
    kernel_faults: bool,
    by_signal: bool,
    servers: String,
    local_bytes: u64,
    tracing: bool,
    /// What the pager does when it must give up; a fork() child's pager does the same.
    on_fatal: Arc<dyn Fn(&str) + Send + Sync>,
    /// The program table's copies of the descriptors program threads write whose first owner
    /// went with the pager's table (the fault-by-signal wake-up); closed with the runtime.
    _shared: Vec<fds::Reserved>,
    /// In a fork() child: the write end of the pipe its parent's pager watches; it closes
    /// when this process exits or execs, and the parent then frees this process's snapshot.
    _parent_watch: Option<fds::Reserved>,
}

/// Pages mapped at once in trace mode: the least budget allowed (one of them is the staging
/// slot, so three are mapped).
pub const TRACE_LOCAL_PAGES: u64 = 4;

/// How far ahead the prefetcher may run, in bytes, and at most 1/64 of the budget: prefetched
/// pages not yet touched must stay inside `adaptive`'s guard (the newest 1/32 of the resident
/// pages), or its loop mode evicts them before use (measured: 4 KiB pages with 1/4 of the
/// budget as the limit fetched 58% more pages than without prefetching).
pub const PREFETCH_AHEAD_BYTES: u64 = 2 << 20;

impl Runtime {
    /// Start from the `RMEM_*` environment, connecting to the servers it names.
    pub fn from_env() -> Result<Runtime, RuntimeError> {
        Runtime::from_config(&Config::from_env()?)
    }

    /// Start from `config`: trace mode if it names a trace file, else connect to its servers.
    pub fn from_config(config: &Config) -> Result<Runtime, RuntimeError> {
        match &config.trace {
            Some(path) => Runtime::trace(config, path),
            None => Runtime::connect(config),
        }
    }

    /// Trace mode: record the program's page reference string to `path`. Pages live in an
    /// in-process store and only [`TRACE_LOCAL_PAGES`] are mapped at once, so every change of
    /// page faults - locally, in microseconds - and is recorded. The budget and the servers in
    /// `config` are ignored.
    pub fn trace(config: &Config, path: &str) -> Result<Runtime, RuntimeError> {
        let ps = config.page_size as u64;
        let traced = Config {
            local_bytes: TRACE_LOCAL_PAGES * ps,
            ..config.clone()
        };
        let file = std::fs::File::create(path).map_err(|source| RuntimeError::Trace {
            path: path.into(),
            source,
        })?;
        let writer =
            TraceWriter::new(std::io::BufWriter::new(file), ps as u32).map_err(|source| {
                RuntimeError::Trace {
                    path: path.into(),
                    source,
                }
            })?;
        let store = MemStore::new(config.page_size, config.region_bytes);
        Runtime::start_traced(
            &traced,
            Box::new(store),
            Box::new(exit_on_fatal),
            Some((writer, std::time::Instant::now())),
        )
    }

    /// Connect to the configured servers and start; a lost server ends the process.
    pub fn connect(config: &Config) -> Result<Runtime, RuntimeError> {
        Runtime::connect_with(config, Box::new(exit_on_fatal))
    }

    /// [`Runtime::connect`] with `on_fatal` run on the pager thread if it must give up (the
    /// Python bindings raise an exception instead of ending the process).
    pub fn connect_with(config: &Config, on_fatal: FatalHandler) -> Result<Runtime, RuntimeError> {
        config.validate()?;
        let store = RemoteStore::from_config(config)?;
        Runtime::start(config, Box::new(store), on_fatal)
    }

    /// Start over any page store. `on_fatal` runs on the pager thread if it must give up.
    pub fn start(
        config: &Config,
        store: Box<dyn PageStore>,
        on_fatal: FatalHandler,
    ) -> Result<Runtime, RuntimeError> {
        Runtime::start_traced(config, store, on_fatal, None)
    }

    /// [`Runtime::start`], recording every fault to `trace` if given.
    pub fn start_traced(
        config: &Config,
        store: Box<dyn PageStore>,
        on_fatal: FatalHandler,
        trace: Option<TraceOut>,
    ) -> Result<Runtime, RuntimeError> {
        let tracing = trace.is_some();
        config.validate()?;
        let ps = config.page_size as u64;
        let budget_pages = config.local_pages();
        // Trace mode records every reference: a prefetched page would hide its first one.
        let prefetch_window_max = if config.prefetch && !tracing {
            (PREFETCH_AHEAD_BYTES / ps).clamp(2, (budget_pages / 64).max(2))
        } else {
            0
        };
        let params = rmem_policy::PolicyParams {
            prefetch_reach: (2 * prefetch_window_max).max(1),
            ..config.policy_params.clone()
        };
        let policy = rmem_policy::by_name_with(&config.policy, &params)
            .ok_or_else(|| RuntimeError::Policy(config.policy.clone()))?;
        let uffd = if config.fault_by_signal {
            Uffd::open_signal(config.uffd_user_mode_only)?
        } else {
            Uffd::open_as(config.uffd_user_mode_only)?
        };
        let kernel_faults = uffd.handles_kernel_faults();
        let by_signal = uffd.by_signal();
        if !uffd.has_move() {
            return Err(RuntimeError::NoMove);
        }
        let min = (64 * ps).min(config.region_bytes);
        let region = Mapping::reserve_up_to(REGION_AT, config.region_bytes / ps * ps, min, ps)
            .map_err(|source| RuntimeError::Reserve {
                bytes: config.region_bytes,
                source,
            })?;
        uffd.register(region.base(), region.len())?;
        let slots = config.staging_slots();
        let staging = Staging::new(slots as usize, ps).map_err(|source| RuntimeError::Reserve {
            bytes: slots * ps,
            source,
        })?;
        uffd.register_missing(staging.mapping.base(), staging.mapping.len())?;
        let (base, len) = (region.base(), region.len());
        let capacity_bytes = store.capacity_bytes();
        let servers = store.describe();
        let stats = Arc::new(Stats::default());
        if let Some(c) = store.counters() {
            let layout = c.layout.clone();
            let _ = stats.store.set((c, layout));
        }
        let mailbox = Arc::new(Mailbox::new().map_err(RuntimeError::Thread)?);
        let mode = uffd.mode();
        let pager = Pager::new(PagerSetup {
            region,
            staging,
            uffd,
            page_size: ps,
            budget_pages,
            policy,
            store,
            stats: stats.clone(),
            mailbox: mailbox.clone(),
            spin: config.spin,
            heartbeat: config.heartbeat,
            trace,
            prefetch_window_max,
            sub_page: config.sub_page && !tracing,
        });
        let on_fatal: Arc<dyn Fn(&str) + Send + Sync> = Arc::from(on_fatal);
        let (handle, shared) = spawn_pager(pager, on_fatal.clone(), Start::Wait)?;
        Ok(Runtime {
            base,
            len,
            page_size: ps,
            policy: config.policy.clone(),
            stats,
            mailbox,
            pager: Mutex::new(Some(handle)),
            // Overcommit: only the region bounds allocations; the servers' capacity is taken
            // page by page as pages are written back (RemoteStore::place).
            alloc: Mutex::new(Allocator::new(
                ps,
                len / ps,
                if config.overcommit {
                    u64::MAX
                } else {
                    capacity_bytes / ps
                },
            )),
            capacity_bytes,
            overcommit: config.overcommit,
            mode,
            kernel_faults,
            by_signal,
            servers,
            local_bytes: budget_pages * ps,
            tracing,
            on_fatal,
            _shared: shared,
            _parent_watch: None,
        })
    }

    /// The first half of a fork() (an atfork prepare handler, the last to run): park the
    /// pager, with a snapshot of the store taken and the region inheritable, and hold the
    /// allocator, so that the child's copy of this process agrees with itself. Then fork, then
    /// [`Forking::parent`] or [`Forking::child`]. Other program threads that fault meanwhile
    /// wait; one that allocates waits on the allocator.
    pub fn prepare_fork(&self) -> Result<Forking<'_>, ForkError> {
        if self.by_signal {
            return Err(ForkError::BySignal);
        }
        let mut ends = [0; 2];
        // SAFETY: pipe2 writes two new descriptors into `ends` or fails.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(ForkError::Pipe(std::io::Error::last_os_error()));
        }
        // SAFETY: fresh descriptors that nothing else owns.
        let (read, write) =
            unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        // The write end sits among rmem's reserved numbers: a child that closes every
        // descriptor it does not know (subprocess children do) keeps it until exec.
        let write = fds::place(write).map_err(ForkError::Pipe)?;
        let movables = fds::hold_movables();
        let alloc = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let park = Arc::new(Park::default());
        self.mailbox.send(Command::Fork {
            park: park.clone(),
            watch: read.as_raw_fd(),
        });
        let parked = park
            .wait_parked(|| {
                self.pager
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .is_none_or(|h| h.is_finished())
            })
            .map_err(ForkError::Park)?;
        // The pager has its own copy now; the child must not inherit this one.
        drop(read);
        Ok(Forking {
            rt: self,
            alloc,
            movables: Some(movables),
            park,
            parked,
            watch: write,
        })
    }
}

/// A fork() between [`Runtime::prepare_fork`] and one of its ends.
pub struct Forking<'a> {
    rt: &'a Runtime,
    alloc: MutexGuard<'a, Allocator>,
    movables: Option<fds::MovablesHeld>,
    park: Arc<Park>,
    parked: Parked,
    /// The write end of the pipe the pager watches; only the child keeps it.
    watch: fds::Reserved,
}

impl Forking<'_> {
    /// The parent's half: the pager goes on (and frees the child's snapshot once the pipe
    /// says it exited or exec'd). Also right after a fork() that failed.
    pub fn parent(self) {
        self.park.release();
    }

    /// The child's first step, in the child before any other library's fork handler runs,
    /// where [`Forking::child`] must wait until they have (it allocates and starts a thread,
    /// and the program's allocator may be held by its own fork handler until then: jemalloc
    /// linked into rustc): a userfaultfd over the region that raises SIGBUS where the child
    /// lacks a page ([`Pager::child_sigbus`]), so that such a handler's touch of one fails at
    /// once rather than reading zeros or waiting for good. The caller keeps it, and closes it
    /// before [`Forking::child`]. (Not in this value: librmem keeps this value in a
    /// thread-local, which every thread's static TLS block holds, carved from stacks a program
    /// may size closely.)
    pub fn child_sigbus(&self) -> Result<Uffd, ForkError> {
        fds::forget_all_but(&self.watch);
        // SAFETY: as in `child`: the child's copy of the parked pager, whose thread does not
        // exist here; only read.
        let pager = unsafe { &*self.parked.pager };
        pager.child_sigbus().map_err(|e| ForkError::Child(e.into()))
    }

    /// The child's half, in the child (its only thread): a runtime of its own, from its copy
    /// of the parked pager, the allocator and the region, on the parent's snapshot. The caller
    /// makes it current; the parent's runtime value is forgotten (its pager is not here).
    /// Allocations must not go to the region until the new pager thread calls `started`
    /// (its start-up allocates before it can serve faults); this does not wait for it, so a
    /// child that execs at once does not wait for a thread it will never use.
    pub fn child(mut self, started: Box<dyn FnOnce() + Send>) -> Result<Runtime, ForkError> {
        // Held by this thread in the parent; the child's copies are free (a mutex here has no
        // owner to check).
        drop(self.movables.take());
        fds::forget_all_but(&self.watch);
        let rt = self.rt;
        let mailbox =
            Arc::new(Mailbox::new().map_err(|e| ForkError::Child(RuntimeError::Thread(e)))?);
        // SAFETY: the pager parked at this address in the parent and the fork copied it here;
        // its thread does not exist in the child, so this is the only use of it from now on.
        let pager = unsafe { std::ptr::read(self.parked.pager) };
        let pager = pager
            .into_child(self.parked.snapshot, mailbox.clone())
            .map_err(|e| ForkError::Child(e.into()))?;
        // Another fork of this child made without the C library's fork() gets no region.
        pager
            .inherit(false)
            .map_err(|e| ForkError::Child(RuntimeError::Child(crate::error_chain(&e))))?;
        let stats = pager.stats();
        let (handle, shared) = spawn_pager(pager, rt.on_fatal.clone(), Start::Child(started))
            .map_err(ForkError::Child)?;
        Ok(Runtime {
            base: rt.base,
            len: rt.len,
            page_size: rt.page_size,
            policy: rt.policy.clone(),
            stats,
            mailbox,
            pager: Mutex::new(Some(handle)),
            alloc: Mutex::new(self.alloc.clone()),
            capacity_bytes: rt.capacity_bytes,
            overcommit: rt.overcommit,
            mode: rt.mode,
            kernel_faults: rt.kernel_faults,
            by_signal: rt.by_signal,
            servers: rt.servers.clone(),
            local_bytes: rt.local_bytes,
            tracing: false,
            on_fatal: rt.on_fatal.clone(),
            _shared: shared,
            _parent_watch: Some(self.watch),
        })
    }
}

/// How the caller of [`spawn_pager`] waits for the pager thread.
enum Start {
    /// Until the pager has marked itself and taken its own descriptor table; then the program
    /// table's copies of its private descriptors are closed.
    Wait,
    /// Not at all (a fork child, most often about to exec): the calling thread takes a new
    /// table for the program instead and leaves the one of the instant of the fork to the
    /// pager, which closes in it every descriptor but its own and stderr; transparent mode,
    /// off meanwhile, is turned back on by `started` from the pager thread.
    Child(Box<dyn FnOnce() + Send>),
}

/// Start the pager thread; returns it and the program table's copies of the descriptors
/// program threads write.
///
/// The new thread's start-up (std's spawn hooks, glibc's thread-exit registration) calls
/// malloc before the closure runs. In transparent mode that malloc would go to the region and
/// the pager would fault on its own memory, so transparent mode is off until the pager has
/// marked itself: it turns on only after the runtime is started, and in a fork child the
/// pager turns it back on itself.
///
/// The pager then gives itself a descriptor table of its own, and the descriptors only it
/// uses are closed in the program's: nothing the program does to its descriptors can reach the
/// userfaultfd or the sockets (rmem_uffd::fds).
///
/// In a fork child the program's thread makes the switch (unshare), so that the pager's table
/// is the one of the instant of the fork, whenever the pager thread gets to run: a table copied
/// later held the pipes the program made meanwhile, and a bash whose `$(...)` child was done
/// waited forever for the end of file that its own pager's copy of the pipe withheld. The
/// pager then closes the program's descriptors in its table (keeping stderr for its messages):
/// a copy there would hold a pipe open after the program closed it.
fn spawn_pager(
    mut pager: Pager,
    on_fatal: Arc<dyn Fn(&str) + Send + Sync>,
    start: Start,
) -> Result<(JoinHandle<()>, Vec<fds::Reserved>), RuntimeError> {
    let private = pager.private_fds();
    let shared = pager.shared_fds();
    let mut own = pager.own_fds();
    own.push(libc::STDERR_FILENO);
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<std::io::Result<()>>(1);
    // A fork child's pager waits for this before it touches its table: until the program's
    // thread has a table of its own, the two share one.
    let (go_tx, go_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let child = match start {
        Start::Wait => None,
        Start::Child(started) => Some(started),
    };
    let waits = child.is_none();
    let fatal = on_fatal;
    let handle = std::thread::Builder::new()
        .name("rmem-pager".into())
        .spawn(move || {
            crate::PAGER_THREAD.with(|t| t.set(true));
            if let Some(started) = child {
                if go_rx.recv().is_err() {
                    return; // the program's thread could not take a table of its own
                }
                fds::close_all_but(&own);
                pager.open_private();
                started();
            } else {
                let isolated = fds::isolate_thread();
                let failed = isolated.is_err();
                let _ = ready_tx.send(isolated);
                if failed {
                    return;
                }
            }
            match pager.run() {
                Ok(done) => {
                    drop(pager);
                    done.signal();
                }
                Err(e) => {
                    fatal(&crate::error_chain(&e));
                    // Only reached when the handler returns (tests, the Python bindings):
                    // the range stays reserved with no access, so late touches fault
                    // with SIGSEGV, never zeros or the data of a mapping made later.
                    if let Err(e) = pager.seal_region() {
                        crate::tell!("rmem: cannot make the lost region inaccessible: {e}");
                    }
                }
            }
        })
        .map_err(RuntimeError::Thread)?;
    if waits {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = handle.join();
                return Err(RuntimeError::Isolate(e));
            }
            // The thread is gone already; the pager's own report says why.
            Err(_) => {}
        }
    } else {
        // Dropping `go_tx` unsent ends the thread.
        fds::isolate_thread().map_err(RuntimeError::Isolate)?;
        let _ = go_tx.send(());
    }
    for fd in private {
        fds::close_raw(fd);
    }
    // SAFETY: each is open in this table (the pager's copy is in its own) and owned by
    // nothing else here: the Uffd that owned it now lives in the pager's table.
    let shared = shared
        .into_iter()
        .map(|fd| unsafe { fds::Reserved::adopt(fd) })
        .collect();
    Ok((handle, shared))
}

impl Runtime {
    /// Allocate `size` zeroed bytes in remote memory. Sizes of a quarter page or more are
    /// page-aligned. `None` when the region is exhausted, or without overcommit the servers'
    /// capacity.
    pub fn alloc(&self, size: usize) -> Option<*mut u8> {
        let (off, reused) = self.alloc.lock().unwrap().alloc(size as u64)?;
        let p = (self.base + off) as *mut u8;
        if reused {
            // SAFETY: [p, p+size) is a live allocation just handed to us inside the region;
            // the pager resolves any fault this write takes.
            unsafe { std::ptr::write_bytes(p, 0, size.max(1)) };
        }
        Some(p)
    }

    /// Allocate `size` zeroed bytes in remote memory aligned to `align` (a power of two; more
    /// than a page: smaller alignments are what [`Runtime::alloc`] of `size.max(align)` gives).
    /// `None` as for [`Runtime::alloc`].
    pub fn alloc_aligned(&self, size: usize, align: usize) -> Option<*mut u8> {
        assert!(align.is_power_of_two());
        let align_pages = (align as u64 / self.page_size).max(1);
        let phase = (self.base / self.page_size) % align_pages;
        let off = self
            .alloc
            .lock()
            .unwrap()
            .alloc_aligned(size as u64, align_pages, phase)?;
        Some((self.base + off) as *mut u8)
    }

    /// Bytes of region pages allocations hold now (what `mallinfo2` reports as rmem's).
    pub fn allocated_bytes(&self) -> u64 {
        self.alloc.lock().unwrap().committed_bytes()
    }

    /// Free an allocation. Its pages go back to the servers once no other object uses them.
    /// Returns an error for a pointer that is not a live allocation of this runtime.
    pub fn free(&self, p: *mut u8) -> Result<(), &'static str> {
        let addr = p as u64;
        if !self.contains(addr) {
            return Err("pointer is not in the rmem region");
        }
        let mut a = self.alloc.lock().unwrap();
        if let Some(freed) = a.free(addr - self.base)? {
            // Release before the pages can be handed out again: the lock is held until the
            // pager has dropped them.
            self.release(freed.first, freed.count, true);
        }
        Ok(())
    }

    /// Usable size of a live allocation.
    pub fn usable_size(&self, p: *const u8) -> Option<usize> {
        let addr = p as u64;
        if !self.contains(addr) {
            return None;
        }
        self.alloc
            .lock()
            .unwrap()
            .usable_size(addr - self.base)
            .map(|s| s as usize)
    }

    /// Drop the pages of `[addr, addr+len)` in the region as madvise(2) does: with
    /// `zero_ends` as MADV_DONTNEED (the whole range reads as zero afterwards: the parts of
    /// pages at its ends are zeroed from the calling thread), without as MADV_FREE (whole pages
    /// only; the rest keeps its data, which Linux allows). Whole pages go back to the servers
    /// like freed ones and read as zero again. Must not run on the pager thread.
    pub fn discard(&self, addr: u64, len: u64, zero_ends: bool) {
        let start = addr.max(self.base);
        let end = addr.saturating_add(len).min(self.base + self.len);
        if start >= end {
            return;
        }
        let ps = self.page_size;
        let first = (start - self.base).div_ceil(ps);
        let last = (end - self.base) / ps;
        let (whole_start, whole_end) = if last > first {
            // Under the allocator's lock, as a free: no page is handed out meanwhile.
            let _a = self.alloc.lock().unwrap();
            self.release(PageIndex(first), last - first, false);
            (self.base + first * ps, self.base + last * ps)
        } else {
            (end, end)
        };
        if zero_ends {
            for (a, b) in [(start, whole_start), (whole_end, end)] {
                if a < b {
                    // Linux drops these bytes whatever their protection; rmem writes zeros.
                    self.with_writable(a & !4095, b.next_multiple_of(4096) - (a & !4095), || {
                        // SAFETY: [a, b) lies in the region, which stays mapped for the life
                        // of the process, and is writable now; the program asked for these
                        // bytes to read as zero, and the pager resolves the faults this write
                        // takes.
                        unsafe { std::ptr::write_bytes(a as *mut u8, 0, (b - a) as usize) };
                    });
                }
            }
        }
    }

    /// munmap(2) of `[addr, addr+len)` in the region: its memory is freed. A range that covers
    /// a large allocation from its start frees it; one that covers its tail gives the tail
    /// back (the head stays allocated); any other whole page is dropped as by `discard`. The
    /// range stays mapped: a later touch reads zeros where Linux would raise SIGSEGV.
    pub fn unmap(&self, addr: u64, len: u64) {
        let end = addr.saturating_add(len);
        if !self.contains(addr) {
            return self.discard(addr, len, false);
        }
        let mut a = self.alloc.lock().unwrap();
        if let Some((off, size)) = a.block_of(addr - self.base) {
            let (b0, b1) = (self.base + off, self.base + off + size);
            if end >= b1 {
                let freed = if addr == b0 {
                    a.free(off).ok().flatten()
                } else {
                    a.shrink(off, addr - b0)
                };
                if let Some(f) = freed {
                    self.release(f.first, f.count, true);
                }
                drop(a);
                if end > b1 {
                    self.discard(b1, end - b1, false);
                }
                return;
            }
        }
        drop(a);
        self.discard(addr, len, false);
    }

    /// mremap(2) of `[addr, addr+old_len)` in the region to `new_len` bytes. Shrinking gives
    /// the tail back as `unmap` does, in place. Growing moves the contents to a new allocation
    /// (only if `may_move`: rmem never grows a range in place) and frees the old range.
    /// Returns the new address, or None where Linux answers ENOMEM.
    pub fn remap(&self, addr: u64, old_len: u64, new_len: u64, may_move: bool) -> Option<u64> {
        if new_len <= old_len {
            if new_len < old_len {
                self.unmap(addr + new_len, old_len - new_len);
            }
            return Some(addr);
        }
        if !may_move {
            return None;
        }
        let p = self.alloc(new_len as usize)?;
        // SAFETY: both ranges lie in the region, which stays mapped; the new one is a fresh
        // allocation of new_len > old_len bytes, so they do not overlap. The pager resolves
        // the faults of both.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, p, old_len as usize) };
        self.unmap(addr, old_len);
        Some(p as u64)
    }

    /// mlock(2) (`lock`) or munlock(2) of the pages of `[addr, addr+len)` in the region: pinned
    /// pages stay resident and count against the budget; pinning more than the budget allows
    /// (all but an eighth of it) fails with ENOMEM and pins nothing. With `populate` the pager
    /// makes the pages resident now (this thread waits for them), else on first touch
    /// (MLOCK_ONFAULT).
    pub fn lock(&self, addr: u64, len: u64, lock: bool, populate: bool) -> Result<(), i32> {
        let start = addr.max(self.base);
        let end = addr.saturating_add(len).min(self.base + self.len);
        if start >= end {
            return Ok(());
        }
        let ps = self.page_size;
        let first = (start - self.base) / ps;
        let count = (end - self.base).div_ceil(ps) - first;
        self.lock_pages(PageIndex(first), count, lock, populate)?;
        if lock && populate {
            self.wait_resident(PageIndex(first), count);
        }
        Ok(())
    }

    /// Wait until `count` pages from `first`, pinned and being made resident by the pager,
    /// are mapped (mincore, bounded to 10 s), without touching them: a touch of a page the
    /// program made inaccessible would raise SIGSEGV. Pages are mapped whole, so the first
    /// 4 KiB of each tells.
    fn wait_resident(&self, first: PageIndex, count: u64) {
        let ps = self.page_size;
        let (addr, len) = (self.base + first.0 * ps, count * ps);
        let mut v = vec![0u8; (len / 4096) as usize];
        let step = (ps / 4096) as usize;
        let t0 = std::time::Instant::now();
        loop {
            // SAFETY: mincore only reads the page tables of this range of the region into
            // `v`, which has one byte per 4 KiB of it.
            let r =
                unsafe { libc::mincore(addr as *mut libc::c_void, len as usize, v.as_mut_ptr()) };
            let all = v.iter().step_by(step).all(|b| b & 1 != 0);
            if r != 0 || all || t0.elapsed() > std::time::Duration::from_secs(10) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// mlockall(2) (`lock`) or munlockall(2) for the region: every page allocated now. A
    /// refusal (ENOMEM) leaves no page pinned by this call.
    pub fn lock_all(&self, lock: bool, populate: bool) -> Result<(), i32> {
        let runs = self.alloc.lock().unwrap().runs();
        for (i, &(first, count)) in runs.iter().enumerate() {
            if let Err(e) = self.lock_pages(first, count, lock, false) {
                for &(f, c) in &runs[..i] {
                    let _ = self.lock_pages(f, c, false, false);
                }
                return Err(e);
            }
        }
        if lock && populate {
            for (first, count) in runs {
                self.lock_pages(first, count, true, true)?;
                self.wait_resident(first, count);
            }
        }
        Ok(())
    }

    fn lock_pages(
        &self,
        first: PageIndex,
        count: u64,
        lock: bool,
        populate: bool,
    ) -> Result<(), i32> {
        self.ask(|errno, done| Command::Lock {
            first,
            count,
            lock,
            populate,
            errno,
            done,
        })
    }

    /// Send the pager the command `make` builds and wait for it; Err: the errno it set.
    fn ask(
        &self,
        make: impl FnOnce(Arc<std::sync::atomic::AtomicI32>, Arc<Done>) -> Command,
    ) -> Result<(), i32> {
        let done = Arc::new(Done::default());
        let errno = Arc::new(std::sync::atomic::AtomicI32::new(0));
        self.mailbox.send(make(errno.clone(), done.clone()));
        done.wait();
        match errno.load(std::sync::atomic::Ordering::Acquire) {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// mprotect(2) of `[addr, addr+len)`, 4 KiB-aligned and inside the region, to `prot`:
    /// kept across evictions; a forbidden access is the program's SIGSEGV. Err: the errno.
    pub fn protect(&self, addr: u64, len: u64, prot: i32) -> Result<(), i32> {
        self.ask(|errno, done| Command::Protect {
            addr,
            len,
            prot,
            widen: false,
            old: None,
            errno,
            done,
        })
    }

    /// Run `f` with `[addr, addr+len)` (4 KiB-aligned, inside the region) readable and
    /// writable (and still executable where it is), then give its parts their protection back:
    /// for rmem's own writes on the program's behalf into memory the program may have made
    /// read-only or inaccessible.
    fn with_writable(&self, addr: u64, len: u64, f: impl FnOnce()) {
        let old = Arc::new(Mutex::new(Vec::new()));
        let made = self.ask(|errno, done| Command::Protect {
            addr,
            len,
            prot: crate::protect::READ_WRITE,
            widen: true,
            old: Some(old.clone()),
            errno,
            done,
        });
        f();
        if made.is_ok() {
            for (s, e, p) in std::mem::take(&mut *old.lock().unwrap()) {
                // It was this protection a moment ago: setting it again cannot fail.
                let _ = self.protect(s, e - s, p);
            }
        }
    }

    fn release(&self, first: PageIndex, count: u64, unprotect: bool) {
        let done = Arc::new(Done::default());
        self.mailbox.send(Command::Release {
            first,
            count,
            unprotect,
            done: done.clone(),
        });
        done.wait();
    }

    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.len
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot(self.page_size as usize, &self.policy)
    }

    /// A reservation of `bytes` larger than the servers' capacity, left to the kernel by
    /// transparent mode (counted in the statistics, which say why such memory is not paged).
    pub fn reservation_left_to_kernel(&self, bytes: u64) {
        Stats::add(&self.stats.reservations_to_kernel, 1);
        Stats::add(&self.stats.reservation_bytes_to_kernel, bytes);
    }

    /// Write the statistics as JSON (atomically: to a temporary name, then renamed), with
    /// `"complete": complete`: false for the file written when the runtime starts, which
    /// stays if the program never runs its exit handlers (`_exit`), true at its exit.
    pub fn write_stats_json(&self, path: &str, complete: bool) -> std::io::Result<()> {
        let tmp = format!("{path}.tmp");
        std::fs::write(&tmp, self.stats().to_json_complete(complete))?;
        std::fs::rename(&tmp, path)
    }

    pub fn page_size(&self) -> usize {
        self.page_size as usize
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// Whether allocations may exceed the servers' capacity (`RMEM_OVERCOMMIT`, on by default).
    pub fn overcommit(&self) -> bool {
        self.overcommit
    }

    /// Bytes of the region (where every remote allocation lies).
    pub fn region_bytes(&self) -> u64 {
        self.len
    }

    pub fn uffd_mode(&self) -> OpenMode {
        self.mode
    }

    /// Whether a system call reading into or writing from a missing page of the region is
    /// served (else it fails with EFAULT, and librmem faults its buffers in first).
    pub fn handles_kernel_faults(&self) -> bool {
        self.kernel_faults
    }

    /// How faults reach the pager: "wait" (the thread sleeps in the kernel on a userfaultfd
    /// message) or "signal" (SIGBUS; RMEM_FAULT_DELIVERY=signal).
    pub fn fault_delivery(&self) -> &'static str {
        if self.by_signal {
            "signal"
        } else {
            "wait"
        }
    }

    /// The local memory budget in bytes.
    pub fn local_bytes(&self) -> u64 {
        self.local_bytes
    }

    pub fn servers(&self) -> &str {
        &self.servers
    }

    /// Region bounds.
    pub fn region(&self) -> (u64, u64) {
        (self.base, self.len)
    }

    /// Write out the buffered reference trace (trace mode; a no-op otherwise). librmem calls
    /// this at exit, since the pager thread is not stopped then.
    pub fn flush_trace(&self) {
        if !self.tracing {
            return;
        }
        let done = Arc::new(Done::default());
        self.mailbox
            .send(Command::FlushTrace { done: done.clone() });
        done.wait();
    }

    /// Stop the pager and unmap the region; later touches of region memory get SIGSEGV.
    pub fn shutdown(&self) {
        let Some(handle) = self.pager.lock().unwrap().take() else {
            return;
        };
        if handle.is_finished() {
            // The pager already gave up (a fatal error whose handler did not exit).
            let _ = handle.join();
            return;
        }
        let done = Arc::new(Done::default());
        self.mailbox.send(Command::Stop { done: done.clone() });
        done.wait();
        let _ = handle.join();
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown();
    }
}
