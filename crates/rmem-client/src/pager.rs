//! The pager: one thread that owns every page's state and resolves every fault in the region.
//!
//! Fault path, end to end (see ARCHITECTURE.md):
//!
//! 1. A program thread touches a page that is not mapped; the kernel queues a userfaultfd
//!    message and puts the thread to sleep.
//! 2. The pager reads the message ([`Pager::run`] spins on the non-blocking descriptor for
//!    `RMEM_SPIN_US` after its last event, then sleeps in poll(2)).
//! 3. By the page's [`PageState`]: an `Untouched` page is zero-filled locally; a `Remote` page
//!    is fetched from the [`PageStore`]; if the budget is full a victim is chosen by the
//!    policy first. A clean victim is simply dropped (its server copy is current); a dirty
//!    one is moved out of the region with `UFFDIO_MOVE` into a staging slot, so the program
//!    can no longer change it, and written back - in the same round trip as the fetch when
//!    both pages live on the same server.
//! 4. When the page arrives it is installed with `UFFDIO_COPY`, which maps it atomically and
//!    wakes every thread waiting on it. Pages are installed write-protected unless the fault
//!    was a write, so the first write to a clean page raises a write-protect fault that marks
//!    it dirty: clean victims cost no network traffic.
//!
//! The pager never reads or writes the region itself: data leaves it by `UFFDIO_MOVE` and
//! enters it by `UFFDIO_COPY`, so it cannot fault on its own memory.

use crate::pages::PageState;
use crate::prefetch::Prefetcher;
use crate::protect::{Protected, Protections, READ_WRITE};
use crate::region::{Dropper, Geometry, Mapping, Staging};
use crate::state::{Fill, Freed, Landed, Merged, PageStates};
use crate::stats::Stats;
use crate::store::{Completion, PageStore, Snapshot, StoreError};
use crate::PageIndex;
use rmem_policy::trace::TraceWriter;
use rmem_policy::Policy;
use rmem_uffd::{fds, Copied, Fault, Moved, Uffd, UffdError, PIECE};
use std::collections::VecDeque;
use std::fs::File;
use std::io::BufWriter;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Why the pager stopped the program.
#[derive(Debug, thiserror::Error)]
pub enum PagerError {
    #[error(transparent)]
    Store(StoreError),
    /// The store's [`StoreError::AllFull`], with what a program paged by rmem can do.
    #[error(
        "{0}. The program's allocations take the servers' capacity only as their pages are \
         written (overcommit); give the servers more (--server-capacity or the hosts file), \
         or run with --no-overcommit so that allocations beyond it fail instead"
    )]
    ServersFull(StoreError),
    /// The store's [`StoreError::OverGrant`], with what a program paged by rmem can do.
    #[error(
        "{0}. Allocations take server memory only as their pages are written (overcommit); \
         raise --max-remote, or run with --no-overcommit so that allocations beyond it fail \
         instead"
    )]
    OverGrant(StoreError),
    #[error(transparent)]
    Uffd(#[from] UffdError),
    #[error("pager stuck with faults waiting and nothing in flight (a bug): {0}")]
    Stuck(String),
    #[error("madvise on the region failed")]
    Madvise(#[source] std::io::Error),
    #[error("mprotect on the region failed")]
    Mprotect(#[source] std::io::Error),
    #[error("cannot write the reference trace")]
    Trace(#[source] std::io::Error),
    #[error("4 KiB piece at {addr:#x} of page {page} stays populated after it was dropped")]
    Populated { page: u64, addr: u64 },
    #[error("cannot prepare a fork: {0}")]
    Fork(String),
}

impl From<StoreError> for PagerError {
    fn from(e: StoreError) -> PagerError {
        match e {
            StoreError::AllFull { .. } => PagerError::ServersFull(e),
            StoreError::OverGrant { .. } => PagerError::OverGrant(e),
            e => PagerError::Store(e),
        }
    }
}

/// The reference trace being recorded (`rmem run --trace`), and when it started.
pub type TraceOut = (TraceWriter<BufWriter<File>>, Instant);

/// A request from a program thread to the pager.
pub enum Command {
    /// The program freed these pages: drop them locally and remotely; they read as zero again.
    /// With `unprotect`, parts the program made other than read-write become read-write (the
    /// memory goes back to the allocator); without, they keep their protection (madvise).
    Release {
        first: PageIndex,
        count: u64,
        unprotect: bool,
        done: Arc<Done>,
    },
    /// Pin (`lock`) or unpin `count` pages from `first` (mlock(2), munlock(2)): a pinned page is
    /// never evicted once resident. Pinning beyond the limit fails with ENOMEM and pins
    /// nothing; the outcome (0 or an errno) lands in `errno` before `done` is signalled. With
    /// `populate` the pager makes the pages resident (they may still be arriving then).
    Lock {
        first: PageIndex,
        count: u64,
        lock: bool,
        populate: bool,
        errno: Arc<std::sync::atomic::AtomicI32>,
        done: Arc<Done>,
    },
    /// mprotect(2) of `[addr, addr+len)` (4 KiB-aligned, inside the region) to `prot`, done by
    /// the pager so that no eviction is halfway through a page meanwhile; the outcome (0 or an
    /// errno) lands in `errno` before `done` is signalled. With `widen`, each part of the range
    /// that is not read-write gets `prot` added to its protection instead (parts that are
    /// read-write stay so). With `old`, the parts of the range that were not read-write before,
    /// with their protection, land there too.
    Protect {
        addr: u64,
        len: u64,
        prot: i32,
        widen: bool,
        old: Option<Arc<Mutex<Protected>>>,
        errno: Arc<std::sync::atomic::AtomicI32>,
        done: Arc<Done>,
    },
    Stop {
        done: Arc<Done>,
    },
    /// Write out the buffered reference trace (at program exit).
    FlushTrace {
        done: Arc<Done>,
    },
    /// The program is about to fork() (see [`Park`]): take a snapshot of the store, let the
    /// mappings be inherited, say where this pager is, and wait, changing nothing, until the
    /// fork is done. `watch` is the read end (a number of the program's descriptor table) of
    /// a pipe whose write end only the child holds: when it reports end of file the child has
    /// exited or exec'd, and its snapshot is ended.
    Fork {
        park: Arc<Park>,
        watch: RawFd,
    },
}

/// A pager parked for a fork(): where it is (in the child, the parked pager's memory is the
/// child's to take: the thread is not there) and the snapshot its child reads.
#[derive(Clone, Copy, Debug)]
pub struct Parked {
    pub pager: *mut Pager,
    pub snapshot: Snapshot,
}

// SAFETY: the pointer is only dereferenced in a fork() child, where no other thread exists.
unsafe impl Send for Parked {}

/// The meeting point of a forking thread and the pager for one fork().
///
/// The forking thread sends [`Command::Fork`] and waits ([`Park::wait_parked`]) until the
/// pager has parked; the pager then waits ([`Park::hold`]) until the parent's half of the fork
/// releases it ([`Park::release`]). Meanwhile nothing of the pager changes, so the child's copy
/// of its memory (page states, staging slots, the store) agrees with the child's copy of the
/// region at the instant of the fork.
#[derive(Default)]
pub struct Park {
    state: Mutex<ParkState>,
    cv: Condvar,
}

#[derive(Default)]
struct ParkState {
    parked: Option<Result<Parked, String>>,
    released: bool,
}

impl Park {
    /// Wait until the pager parked (or says why it cannot), giving up if `gone` says it died.
    pub fn wait_parked(&self, gone: impl Fn() -> bool) -> Result<Parked, String> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = &st.parked {
                return r.clone();
            }
            if gone() {
                return Err("the pager has stopped".into());
            }
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Let the parked pager go on (the parent's half of the fork).
    pub fn release(&self) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .released = true;
        self.cv.notify_all();
    }

    fn park(&self, r: Result<Parked, String>) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).parked = Some(r);
        self.cv.notify_all();
    }

    fn hold(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while !st.released {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A one-shot completion flag a program thread waits on.
#[derive(Default)]
pub struct Done {
    flag: Mutex<bool>,
    cv: Condvar,
}

impl Done {
    pub fn signal(&self) {
        *self.flag.lock().unwrap() = true;
        self.cv.notify_all();
    }

    pub fn wait(&self) {
        let mut f = self.flag.lock().unwrap();
        while !*f {
            f = self.cv.wait(f).unwrap();
        }
    }
}

/// The command queue shared by program threads and the pager.
///
/// Its eventfd is one of rmem's shared descriptors (`rmem_uffd::fds`): program threads write
/// it in the program's table, where it may move if the program wants its number; the pager
/// reads and polls its own copy, on the number it had when the pager took its own table. The
/// runtime holds the last reference, so the program's copy is closed on the program's side.
pub struct Mailbox {
    queue: Mutex<Vec<Command>>,
    pending: AtomicBool,
    eventfd: Arc<fds::Movable>,
    pager_fd: RawFd,
}

impl Mailbox {
    pub fn new() -> std::io::Result<Mailbox> {
        // SAFETY: eventfd creates a new descriptor; we take ownership on success.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is fresh and owned by nobody else.
        let eventfd = fds::Movable::new(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })?;
        Ok(Mailbox {
            queue: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            pager_fd: eventfd.with(|fd| fd),
            eventfd,
        })
    }

    /// Queue a command and wake the pager.
    pub fn send(&self, c: Command) {
        self.queue.lock().unwrap().push(c);
        self.pending.store(true, Ordering::Release);
        let one: u64 = 1;
        self.eventfd.with(|fd| {
            // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
            if unsafe { libc::write(fd, (&one as *const u64).cast(), 8) } < 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
            {
                // librmem's close, dup2, close_range and closefrom leave this number alone;
                // only a raw system call can have closed it. The pager would no longer hear
                // commands.
                crate::runtime::exit_descriptor_lost(fd, "its command channel to the pager");
            }
        });
    }

    fn take(&self) -> Vec<Command> {
        self.pending.store(false, Ordering::Release);
        let mut buf = 0u64;
        // SAFETY: reading 8 bytes into a valid u64 from our non-blocking eventfd.
        unsafe { libc::read(self.pager_fd, (&mut buf as *mut u64).cast(), 8) };
        // Leave capacity behind (allocated here, on the pager thread, in local memory), so
        // that a program thread's `send` rarely allocates while it holds the lock: with
        // --min-alloc 0 that allocation could fault on the region while the pager waits for
        // the lock.
        std::mem::replace(&mut *self.queue.lock().unwrap(), Vec::with_capacity(64))
    }
}

/// Everything the pager owns except the store (so completions can borrow both).
///
/// Field order is drop order: the region is unmapped before the userfaultfd closes, so a
/// thread still touching it gets SIGSEGV rather than silent zero pages.
struct Core {
    region: Mapping,
    staging: Staging,
    uffd: Uffd,
    geo: Geometry,
    /// Every page's state, with the policy and what is in flight (state.rs).
    pages: PageStates,
    /// Most pages mapped or being filled at once: the budget less the staging slots.
    resident_max: u64,
    /// Pages evicted beyond the one needed when the budget is full, so that the next faults
    /// find room without evicting and clean victims leave in one system call.
    evict_ahead: u64,
    /// Clean victims chosen and not yet dropped (dropped together before the pager moves on).
    drops: Vec<PageIndex>,
    drop_addrs: Vec<u64>,
    dropper: Dropper,
    stats: Arc<Stats>,
    /// Remote copies to forget once the store is free to take requests.
    frees: Vec<PageIndex>,
    /// Faults that found no room (every resident page in flight); retried as pages settle.
    blocked: VecDeque<(Fault, Instant)>,
    /// A fault's requests wait for the pager's one write after the faults read with it,
    /// instead of leaving at once (see [`Core::send`]).
    later_of_batch: bool,
    /// Stride detector, when prefetching is on.
    prefetcher: Option<Prefetcher>,
    /// A read fault on a remote page away from any fault stream fetches only its 4 KiB
    /// piece (`--sub-page`, where the store has part reads).
    sub_page: bool,
    /// Merged pages to write back from their slots once the store's poll is over.
    merged: Vec<(PageIndex, u32)>,
    /// Per [`DENSITY_PAGES`] pages of the region, what was learnt of the program's use of
    /// its pages.
    learnt: Vec<Learnt>,
    /// Scattered faults in dense regions so far (see [`Core::dense`]).
    probe: u64,
    /// Read faults in regions where writes follow reads so far (see [`Core::writes_follow`]).
    write_probe: u64,
    /// Parts of the region the program made other than read-write (mprotect).
    protections: Protections,
    zeros: Vec<u8>,
}

/// Where a victim that may be dirty went ([`Core::move_out`]).
enum Out {
    /// Into this staging slot, to be written back: whole, or (a partial page) only the
    /// written pieces in `pieces`.
    Staged { slot: u32, pieces: u64 },
    /// Nowhere: a page a fork child inherited and never wrote; drop it like a clean page.
    Unwritten,
    /// Out of the region and gone: it was zero-filled and is all zeros, so it is untouched
    /// again and nothing is written.
    Unchanged,
}

/// Whether every byte of `data` is zero.
fn all_zero(data: &[u8]) -> bool {
    data.chunks(256)
        .all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

/// A partial page faulted on again, at the piece next to its last, within this many fetches
/// of that piece is fetched whole: the program scans it (a sort's merge through the lines of a
/// run). Any other later piece is random access within the page (a sort's output, which
/// reads lines in sorted order at random places of its text, comes back to a page many times
/// while its pieces are resident): it comes alone.
const DENSE_WITHIN: u64 = 64;

/// Pages per region of [`Core::learnt`] (16 MiB of 64 KiB pages): an allocation's worth,
/// small enough that a program's arrays and its random-access structures mostly fall apart.
const DENSITY_PAGES: u64 = 256;
/// Bound of a region's density score: this many more outcomes of the other kind turn it.
const DENSITY_MAX: i8 = 8;
/// One scattered fault in this many in a dense region fetches a piece all the same. (Where
/// the region's reads are followed by writes, [`Core::writes_follow`] fetches whole pages
/// before this is asked, save one fault in [`WRITES_PROBE`]: a probe there, a piece fetched
/// and then the page for the write, comes one fault in 128.)
const DENSE_PROBE: u64 = 8;

/// A region whose fetched pages were written this many times more often than they left
/// unwritten (of at most [`DENSITY_MAX`]) maps the pages its read faults fetch writable.
const WRITES_SURE: i8 = 4;
/// One read fault in this many there maps its page write-protected all the same, so that
/// what is learnt follows the program (a page mapped writable teaches nothing: it is never
/// write-protect faulted, and leaves dirty whether written or not).
const WRITES_PROBE: u64 = 16;

/// What one region of [`DENSITY_PAGES`] pages has shown of the program's use of its pages.
#[derive(Clone, Copy, Default)]
struct Learnt {
    /// Partial pages faulted on again by a scan (+1 each: see [`DENSE_WITHIN`]) or at a
    /// piece away from their last (-1 each), or leaving with their few pieces (-1 each),
    /// saturating at [`DENSITY_MAX`]: above 0, faults there fetch whole pages from the start
    /// (see [`DENSE_PROBE`]).
    score: i8,
    /// Pages fetched write-protected that the program then wrote (+1 each) or that left
    /// unwritten (-1 each), saturating at [`DENSITY_MAX`] (see [`WRITES_SURE`]).
    writes: i8,
    /// Partial pages that the program made whole by its own faults (a scan through them, or
    /// half their pieces: +1 each) or that left partial (-1 each), saturating at
    /// [`DENSITY_MAX`]: above 0, streams there fetch whole pages whatever `score` says
    /// ([`Core::sparse`]).
    kept: i8,
}

/// One more outcome of a kind in a learnt score: +1 or -1, saturating at [`DENSITY_MAX`].
fn nudge(score: &mut i8, up: bool) {
    *score = if up {
        (*score + 1).min(DENSITY_MAX)
    } else {
        (*score - 1).max(-DENSITY_MAX)
    };
}

/// Pages to evict beyond the one needed: none for small budgets, where every page counts,
/// up to 15 (one 16-page batch) from 1024 resident pages.
fn evict_ahead(resident_max: u64) -> u64 {
    (resident_max / 64).min(15)
}

/// Most pages the program may pin (mlock): an eighth of the resident pages, and at least one,
/// stay free for faults on everything else.
fn locked_max(resident_max: u64) -> u64 {
    resident_max.saturating_sub(resident_max / 8 + 1)
}

/// The pager thread's state.
pub struct Pager {
    core: Core,
    store: Box<dyn PageStore>,
    mailbox: Arc<Mailbox>,
    spin: Duration,
    heartbeat: Duration,
    trace: Option<TraceOut>,
    /// Fork children's snapshots, each with the read end of the pipe only that child writes:
    /// end of file there means the child exited or exec'd.
    watches: Vec<(OwnedFd, Snapshot)>,
}

/// What the runtime hands the pager.
pub struct PagerSetup {
    pub region: Mapping,
    pub staging: Staging,
    pub uffd: Uffd,
    pub page_size: u64,
    pub budget_pages: u64,
    pub policy: Box<dyn Policy>,
    pub store: Box<dyn PageStore>,
    pub stats: Arc<Stats>,
    pub mailbox: Arc<Mailbox>,
    pub spin: Duration,
    pub heartbeat: Duration,
    /// Record every fault in the region here (trace mode).
    pub trace: Option<TraceOut>,
    /// Most pages to prefetch ahead of a fault stream; 0: no prefetching.
    pub prefetch_window_max: u64,
    /// Fetch a scattered read fault's 4 KiB piece alone, where the store can
    /// ([`PageStore::part_reads`]) and a page has 2 to 64 pieces.
    pub sub_page: bool,
}

impl Pager {
    pub fn new(s: PagerSetup) -> Pager {
        let geo = Geometry {
            base: s.region.base(),
            len: s.region.len(),
            page_size: s.page_size,
        };
        let slots = s.staging.available() as u64;
        let pieces = s.page_size / PIECE;
        let sub_page = s.sub_page && s.store.part_reads() && (2..=64).contains(&pieces);
        let mut pages = PageStates::new(s.policy, locked_max(s.budget_pages - slots));
        if sub_page {
            pages.set_pieces(pieces);
        }
        assert!(
            s.budget_pages > slots,
            "budget must exceed the staging slots"
        );
        Pager {
            core: Core {
                zeros: vec![0; s.page_size as usize],
                region: s.region,
                staging: s.staging,
                uffd: s.uffd,
                geo,
                pages,
                resident_max: s.budget_pages - slots,
                evict_ahead: evict_ahead(s.budget_pages - slots),
                drops: Vec::new(),
                drop_addrs: Vec::new(),
                dropper: Dropper::new(),
                stats: s.stats,
                frees: Vec::new(),
                blocked: VecDeque::new(),
                later_of_batch: false,
                prefetcher: (s.prefetch_window_max > 0)
                    .then(|| Prefetcher::new(s.prefetch_window_max)),
                sub_page,
                merged: Vec::new(),
                learnt: vec![
                    Learnt::default();
                    (geo.len / geo.page_size).div_ceil(DENSITY_PAGES) as usize + 1
                ],
                probe: 0,
                write_probe: 0,
                protections: Protections::default(),
            },
            store: s.store,
            mailbox: s.mailbox,
            spin: s.spin,
            heartbeat: s.heartbeat,
            trace: s.trace,
            watches: Vec::new(),
        }
    }

    /// After a fatal error whose handler returned: make the region inaccessible for good
    /// ([`Mapping::seal`]) before the userfaultfd closes with the pager. Closing it wakes the
    /// waiting threads, and they must then fault with SIGSEGV, never read zeros.
    pub fn seal_region(&mut self) -> std::io::Result<()> {
        self.core.region.seal()
    }

    /// Serve faults until told to stop; returns the stop request's completion, to be
    /// signalled once the pager (and with it the region) is dropped. An error is fatal for
    /// the program: its memory can no longer be trusted. The pager stays alive, region
    /// mapped, until the caller has reported it, so threads keep waiting rather than crash.
    pub fn run(&mut self) -> Result<Arc<Done>, PagerError> {
        let mut faults = Vec::with_capacity(64);
        // No work yet: sleep until some comes rather than spin (a fork child's new pager would
        // otherwise take a CPU from the child while it execs).
        let mut last_work = Instant::now()
            .checked_sub(self.spin)
            .unwrap_or_else(Instant::now);
        let mut last_tick = Instant::now();
        let mut fds = Vec::new();
        loop {
            let mut work = 0;
            if self.mailbox.pending.load(Ordering::Acquire) {
                for cmd in self.mailbox.take() {
                    match cmd {
                        Command::Release {
                            first,
                            count,
                            unprotect,
                            done,
                        } => {
                            self.core
                                .release(&mut *self.store, first, count, unprotect)?;
                            done.signal();
                        }
                        Command::Lock {
                            first,
                            count,
                            lock,
                            populate,
                            errno,
                            done,
                        } => {
                            let e = self.core.lock(first, count, lock)?;
                            errno.store(e, Ordering::Release);
                            done.signal();
                            if e == 0 && lock && populate {
                                self.core.populate(&mut *self.store, first, count)?;
                            }
                        }
                        Command::Protect {
                            addr,
                            len,
                            prot,
                            widen,
                            old,
                            errno,
                            done,
                        } => {
                            let parts = self.core.protections.within(addr, addr + len);
                            let e = if widen {
                                parts
                                    .iter()
                                    .map(|&(s, e, p)| self.core.protect(s, e - s, p | prot))
                                    .find(|&e| e != 0)
                                    .unwrap_or(0)
                            } else {
                                self.core.protect(addr, len, prot)
                            };
                            if let Some(old) = old {
                                *old.lock().unwrap() = parts;
                            }
                            errno.store(e, Ordering::Release);
                            done.signal();
                        }
                        Command::Stop { done } => {
                            self.store.flush()?;
                            self.flush_trace()?;
                            return Ok(done);
                        }
                        Command::FlushTrace { done } => {
                            self.flush_trace()?;
                            done.signal();
                        }
                        Command::Fork { park, watch } => {
                            self.fork(&park, watch)?;
                            // Not work to spin after: the CPU is the child's, which most
                            // often execs at once.
                            continue;
                        }
                    }
                    work += 1;
                }
            }
            faults.clear();
            work += self.core.uffd.read_events(&mut faults)?;
            if let Some((t, t0)) = &mut self.trace {
                // Every fault is a reference: with the handful of pages trace mode keeps
                // mapped, each change of page faults (cheaply, from the in-process store).
                for f in &faults {
                    if let Some(page) = self.core.geo.page_of(f.address) {
                        t.record(
                            page,
                            f.write || f.write_protect,
                            t0.elapsed().as_micros() as u64,
                        )
                        .map_err(PagerError::Trace)?;
                    }
                }
            }
            let now = Instant::now();
            for (i, f) in faults.drain(..).enumerate() {
                self.core.later_of_batch = i > 0;
                self.core.fault(&mut *self.store, f, now)?;
            }
            self.core.later_of_batch = false;
            let completed = self.poll_store()?;
            work += completed;
            if completed > 0 || self.core.pages.reinstall_waiting() {
                self.core.settle(&mut *self.store)?;
            }
            if !self.core.frees.is_empty() {
                for p in self.core.frees.drain(..) {
                    self.store.free(p)?;
                }
            }
            self.store.flush()?;
            let now = Instant::now();
            if work > 0 {
                last_work = now;
            }
            if now.duration_since(last_tick) > Duration::from_millis(50) {
                self.store.tick(now)?;
                self.end_finished_forks()?;
                last_tick = now;
            }
            if work > 0 {
                continue;
            }
            if now.duration_since(last_work) < self.spin {
                crate::config::spin_pause();
                continue;
            }
            if !self.core.blocked.is_empty() && self.store.in_flight() == 0 {
                // Nothing in flight will retry the waiting faults: retry them now. If they
                // still find no room, no event can ever give them any, so fail loudly rather
                // than hang the program.
                self.core.settle(&mut *self.store)?;
                self.store.flush()?;
                if !self.core.blocked.is_empty() && self.store.in_flight() == 0 {
                    return Err(PagerError::Stuck(format!(
                        "{}; {}",
                        self.core.describe(),
                        self.store.describe_in_flight()
                    )));
                }
                continue;
            }
            // Idle: sleep until a fault, a command, or a server speaks.
            if self.core.uffd.set_sleeping(true) {
                // A fault by signal was posted meanwhile.
                self.core.uffd.set_sleeping(false);
                continue;
            }
            fds.clear();
            fds.push(libc::pollfd {
                fd: self.core.uffd.event_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            fds.push(libc::pollfd {
                fd: self.mailbox.pager_fd,
                events: libc::POLLIN,
                revents: 0,
            });
            self.store.wait_fds(&mut fds);
            fds.extend(self.watches.iter().map(|(fd, _)| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            let timeout_ms = if self.store.ready() {
                0
            } else if self.store.in_flight() > 0 {
                10
            } else {
                let beat = self
                    .store
                    .heartbeat()
                    .map_or(self.heartbeat, |b| b.min(self.heartbeat));
                beat.as_millis().clamp(1, 1000) as i32
            };
            // SAFETY: `fds` is a valid array of pollfd of the given length.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
            self.core.uffd.set_sleeping(false);
            let now = Instant::now();
            self.store.tick(now)?;
            self.end_finished_forks()?;
            last_tick = now;
        }
    }

    /// [`Command::Fork`]: park until the parent's half of the fork releases the pager.
    fn fork(&mut self, park: &Park, watch: RawFd) -> Result<(), PagerError> {
        let parked = self.park_for_fork(watch);
        let (result, watch) = match parked {
            Ok((p, w)) => (Ok(p), w),
            Err(e) => (Err(crate::error_chain(&e)), None),
        };
        let failed = result.is_err();
        park.park(result.clone());
        if failed {
            // The forking thread goes on without a snapshot (its child gets none); the store's
            // error is this pager's own to report.
            return result.map(drop).map_err(PagerError::Fork);
        }
        park.hold();
        self.core.inherit(false)?;
        if let (Some(fd), Ok(p)) = (watch, result) {
            self.watches.push((fd, p.snapshot));
        }
        Ok(())
    }

    /// Everything a fork needs before the pager parks: the frees the program made so far
    /// reach the store (the snapshot need not keep those pages), the store takes the snapshot,
    /// the region and staging slots are inherited, and the child's pipe is taken into the
    /// pager's own table (None where that fails: the snapshot is then freed by its lease).
    fn park_for_fork(&mut self, watch: RawFd) -> Result<(Parked, Option<OwnedFd>), PagerError> {
        assert!(self.core.drops.is_empty(), "clean victims left undropped");
        self.land_leaving_pieces()?;
        for p in self.core.frees.drain(..) {
            self.store.free(p)?;
        }
        let snapshot = self.store.snapshot()?;
        self.core.inherit(true)?;
        let watch = self
            .core
            .dropper
            .fd()
            .and_then(|pidfd| fds::take_from_program(pidfd, watch).ok());
        Ok((
            Parked {
                pager: self as *mut Pager,
                snapshot,
            },
            watch,
        ))
    }

    /// Before a fork: the write-backs of partial pages' written pieces in flight land. A
    /// child reinstalls a page whose write-back was in flight from its copy of the staging
    /// slot, which for a partial page holds only the written pieces. Pages that hold pieces
    /// stay as they are: the child keeps them mapped (`PageStates::after_fork`), so that a
    /// lock another library's fork handler took in one is there in the child before rmem's
    /// runtime is (librmem's fork.rs). A round trip, paid only by a fork made while such a
    /// write-back is in flight.
    fn land_leaving_pieces(&mut self) -> Result<(), PagerError> {
        let mut fds = Vec::new();
        while self.core.pages.pieces_leaving() {
            let completed = self.poll_store()?;
            if completed > 0 || self.core.pages.reinstall_waiting() {
                // Wanted pages whose write-backs landed go back to the region.
                self.core.settle(&mut *self.store)?;
            }
            if completed == 0 {
                fds.clear();
                self.store.wait_fds(&mut fds);
                // SAFETY: `fds` is a valid array of pollfd of the given length.
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 10) };
                self.store.tick(Instant::now())?;
            }
        }
        Ok(())
    }

    /// Deliver the store's finished operations to the pager; how many pages completed.
    fn poll_store(&mut self) -> Result<usize, PagerError> {
        let core = &mut self.core;
        let mut result = Ok(());
        let completed = self.store.poll(&mut |c| {
            if result.is_ok() {
                result = core.complete(c);
            }
        })?;
        result?;
        for (page, slot) in core.merged.drain(..) {
            // SAFETY: the slot holds the merged page until its write-back lands.
            let data = unsafe { core.staging.bytes(slot) };
            self.store.store(page, data)?;
        }
        Ok(completed)
    }

    /// End the snapshots of fork children that have exited or exec'd.
    fn end_finished_forks(&mut self) -> Result<(), PagerError> {
        if self.watches.is_empty() {
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> = self
            .watches
            .iter()
            .map(|(fd, _)| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd of the given length; no wait.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        let mut i = 0;
        for p in fds {
            if p.revents == 0 {
                i += 1;
                continue;
            }
            // Its only writer is gone (a pipe's write end, held by the child alone).
            let (_, snapshot) = self.watches.remove(i);
            self.store.end_snapshot(snapshot)?;
        }
        Ok(())
    }

    /// In a fork() child: the pager that goes on from the parent's, parked at the fork (this
    /// value is the child's copy of it, read where the parent's pager thread left it; that
    /// thread does not exist here). Descriptors it held were in that thread's own table and
    /// are not the child's: they are forgotten, never closed (closing would close whatever
    /// the child has under those numbers). The child opens its own userfaultfd and registers
    /// the region and staging area (the kernel dropped the child's registrations; the region's
    /// write protection waits for the child's first protected page, so that a child that
    /// execs at once does not pay for clearing it), reads its
    /// pages' states as `PageStates::after_fork` says, and takes over the store under its
    /// snapshot. Trace mode records the parent only.
    pub fn into_child(self, snapshot: Snapshot, mailbox: Arc<Mailbox>) -> Result<Pager, UffdError> {
        let Pager {
            mut core,
            mut store,
            mailbox: parents,
            spin,
            heartbeat,
            trace,
            watches,
        } = self;
        let child_store = store.forked(snapshot);
        std::mem::forget(store);
        std::mem::forget(parents);
        std::mem::forget(trace);
        std::mem::forget(watches);
        let uffd = core.uffd.reopen().and_then(|u| {
            // Write protection at the first page protected: see `register_wp_later`.
            let registered = u
                .register_wp_later(core.region.base(), core.region.len())
                .and_then(|()| {
                    u.register_missing(core.staging.mapping.base(), core.staging.mapping.len())
                });
            match registered {
                Ok(()) => Ok(u),
                Err(e) => {
                    u.close();
                    Err(e)
                }
            }
        });
        std::mem::forget(std::mem::replace(&mut core.dropper, Dropper::closed()));
        let uffd = match uffd {
            Ok(u) => u,
            Err(e) => {
                // Nothing of the copy may be released by the value's drop: the descriptors
                // are the parent's, the mappings the child's memory (and the program's munmap,
                // which their drop goes through, waits for the allocator the fork holds).
                std::mem::forget(core);
                return Err(e);
            }
        };
        std::mem::forget(std::mem::replace(&mut core.uffd, uffd));
        core.blocked.clear();
        core.pages.after_fork(Instant::now());
        // The child's statistics are its own, counted from the fork: the copy of the parent's
        // counters it was made with would report the parent's work as the child's, and its
        // store keeps counters of its own.
        let stats = Stats::default();
        stats.set_local_bytes(core.pages.local() * core.ps());
        if let Some(c) = child_store.counters() {
            let layout = c.layout.clone();
            let _ = stats.store.set((c, layout));
        }
        core.stats = Arc::new(stats);
        Ok(Pager {
            core,
            store: child_store,
            mailbox,
            spin,
            heartbeat,
            trace: None,
            watches: Vec::new(),
        })
    }

    /// In a fork() child, from this (the child's copy of the parked pager, only read): a
    /// userfaultfd over the region that raises SIGBUS where the child lacks a page
    /// ([`Uffd::reopen_sigbus`]), for the child's moments before its pager can start (see
    /// librmem's fork.rs): a touch there fails at once, never reads zeros and never waits for
    /// good. It is closed before [`Pager::into_child`] registers the region with the child's
    /// own.
    pub fn child_sigbus(&self) -> Result<Uffd, UffdError> {
        let uffd = self.core.uffd.reopen_sigbus()?;
        uffd.register_missing(self.core.region.base(), self.core.region.len())?;
        Ok(uffd)
    }

    /// The counters this pager writes (a fork child's are its own: [`Pager::into_child`]).
    pub fn stats(&self) -> Arc<Stats> {
        self.core.stats.clone()
    }

    /// In a fork child's pager thread, once it has its own descriptor table: open what
    /// [`Pager::into_child`] left unopened so that the program's table never has it.
    pub fn open_private(&mut self) {
        self.core.uffd.open_pagemap();
        self.core.dropper.open();
    }

    /// Whether the region and staging slots are inherited by fork() children; a child calls
    /// it with `false` once its pager is ready, so that a child made without the C library's
    /// fork() (no rmem there) never sees them.
    pub fn inherit(&self, yes: bool) -> Result<(), PagerError> {
        self.core.inherit(yes)
    }
}

impl Pager {
    /// Descriptors only the pager uses: the userfaultfd, /proc/self/pagemap, the pidfd and the
    /// servers' sockets. The runtime closes the program's copies once the pager has a
    /// descriptor table of its own (see `rmem_uffd::fds`).
    pub fn private_fds(&self) -> Vec<RawFd> {
        let mut v = self.core.uffd.private_fds();
        v.extend(self.core.dropper.fd());
        let mut polled = Vec::new();
        self.store.wait_fds(&mut polled);
        v.extend(polled.iter().map(|p| p.fd));
        v
    }

    /// Descriptors program threads write (see [`Uffd::shared_fds`]).
    pub fn shared_fds(&self) -> Vec<RawFd> {
        self.core.uffd.shared_fds()
    }

    /// Every descriptor this pager uses in its own table: its private ones, the shared ones
    /// and its end of the mailbox.
    pub fn own_fds(&self) -> Vec<RawFd> {
        let mut v = self.private_fds();
        v.extend(self.shared_fds());
        v.push(self.mailbox.pager_fd);
        v
    }

    fn flush_trace(&mut self) -> Result<(), PagerError> {
        match &mut self.trace {
            Some((t, _)) => t.flush().map_err(PagerError::Trace),
            None => Ok(()),
        }
    }
}

impl Core {
    fn inherit(&self, yes: bool) -> Result<(), PagerError> {
        self.region.inherit(yes).map_err(PagerError::Madvise)?;
        self.staging
            .mapping
            .inherit(yes)
            .map_err(PagerError::Madvise)
    }

    fn addr(&self, page: PageIndex) -> u64 {
        self.geo.addr_of(page)
    }

    fn ps(&self) -> u64 {
        self.geo.page_size
    }

    /// A one-line account of the pager's state, for error reports.
    fn describe(&self) -> String {
        format!(
            "{}, at most {} resident, blocked {}, free slots {}",
            self.pages.describe(),
            self.resident_max,
            self.blocked.len(),
            self.staging.available()
        )
    }

    /// Pages mapped or being filled: at most `resident_max`, so that with the staged victims
    /// (at most one per staging slot) the budget holds.
    fn resident(&self) -> u64 {
        self.pages.resident()
    }

    /// Whether the 4 KiB piece at `addr` of a page the pager holds as mapped is missing from
    /// the page tables (a fault there is then not a stale message).
    fn piece_missing(&self, addr: u64) -> bool {
        self.uffd.is_populated(addr & !4095) == Some(false)
    }

    /// Install the contents of `page`, which the pager holds as missing, from `src`,
    /// write-protected if `write_protect`.
    ///
    /// The pager maps pages whole and drops or moves them whole, so no piece of a missing
    /// page can be populated by rmem; one that is (`Copied::Around`) was put there behind
    /// rmem's back and does not hold the page's contents. It is dropped and installed like the
    /// rest. Only those pieces are touched: a thread may already use the others.
    fn install(
        &mut self,
        page: PageIndex,
        src: *const u8,
        write_protect: bool,
    ) -> Result<(), PagerError> {
        self.install_at(page, 0, src, self.ps(), write_protect)
    }

    /// Install `len` bytes of `page` from offset `at` (whole 4 KiB pieces), from `src` (the
    /// bytes of that part), as [`Core::install`] does for a whole page.
    fn install_at(
        &mut self,
        page: PageIndex,
        at: u64,
        src: *const u8,
        len: u64,
        write_protect: bool,
    ) -> Result<(), PagerError> {
        let addr = self.addr(page) + at;
        let Copied::Around(present) = self.uffd.copy(addr, src, len, write_protect)? else {
            return Ok(());
        };
        Stats::add(&self.stats.pieces_replaced, present.len() as u64);
        for off in present {
            self.region
                .discard(addr + off, PIECE)
                .map_err(PagerError::Madvise)?;
            let again = self.uffd.copy(
                addr + off,
                src.wrapping_add(off as usize),
                PIECE,
                write_protect,
            )?;
            if again != Copied::Whole {
                return Err(PagerError::Populated {
                    page: page.0,
                    addr: addr + off,
                });
            }
        }
        Ok(())
    }

    /// Map a partial page fetched whole: its missing pieces from `src`, around the pieces
    /// `present` (mapped write-protected from the same server copy, and unwritten: a write
    /// to one is what fetched the page whole). Writable if `write`: the present pieces lose
    /// their write protection then, which wakes the thread that wrote.
    fn install_around(
        &mut self,
        page: PageIndex,
        src: *const u8,
        present: u64,
        write: bool,
    ) -> Result<(), PagerError> {
        let n = self.pages.pieces();
        let mut i = 0;
        while i < n {
            if present & (1 << i) != 0 {
                i += 1;
                continue;
            }
            let start = i;
            while i < n && present & (1 << i) == 0 {
                i += 1;
            }
            let at = start * PIECE;
            self.install_at(
                page,
                at,
                src.wrapping_add(at as usize),
                (i - start) * PIECE,
                !write,
            )?;
        }
        if write {
            self.uffd
                .write_protect(self.addr(page), self.ps(), false, false)?;
        }
        Ok(())
    }

    /// The 4 KiB piece at `fault_addr` of a page the pager holds as mapped is missing from the
    /// page tables. rmem maps, drops and moves pages whole and librmem's `madvise` never
    /// reaches the kernel for the region, so the program dropped the piece itself with a raw
    /// madvise(2) system call (MADV_DONTNEED, or MADV_FREE that the kernel acted on). Linux
    /// gives zeros there: so does rmem. The page then differs from any copy on a server, so it
    /// becomes dirty (and wholly writable, as a dirty page is).
    fn zero_piece(&mut self, page: PageIndex, fault_addr: u64) -> Result<(), PagerError> {
        self.map_zeros(fault_addr)?;
        if self.pages.get(page) != PageState::Dirty {
            self.pages.dirty(page);
            self.uffd
                .write_protect(self.addr(page), self.ps(), false, false)?;
        }
        Ok(())
    }

    /// Map zeros, writable, at the missing 4 KiB piece at `fault_addr` (one the program
    /// dropped itself: Linux gives zeros there).
    fn map_zeros(&mut self, fault_addr: u64) -> Result<(), PagerError> {
        let piece = fault_addr & !(PIECE - 1);
        // `Around` here means the piece was populated meanwhile: that is all the fault needs.
        let _ = self.uffd.copy(piece, self.zeros.as_ptr(), PIECE, false)?;
        Stats::add(&self.stats.pieces_zeroed, 1);
        Ok(())
    }

    fn update_local_bytes(&self) {
        // Mapped, filling and staged pages: everything that holds local memory.
        self.stats.set_local_bytes(self.pages.local() * self.ps());
    }

    fn fault(
        &mut self,
        store: &mut dyn PageStore,
        f: Fault,
        t0: Instant,
    ) -> Result<(), PagerError> {
        let Some(page) = self.geo.page_of(f.address) else {
            // Not ours (the staging area is never touched by the program): let it retry.
            self.uffd.wake(f.address & !4095, 4096)?;
            return Ok(());
        };
        let fill = Fill {
            write: f.write,
            t0,
            prefetched: false,
            piece: None,
        };
        match self.pages.get(page) {
            PageState::Untouched => self.fault_untouched(store, page, f, t0),
            PageState::Remote => {
                let write = f.write || self.writes_follow(page);
                let piece = self.piece_for(page, &f);
                self.fault_remote(store, page, f, t0, piece, write)
            }
            PageState::Partial => self.fault_partial(store, page, f, t0),
            PageState::Filling => self.fault_filling(store, page, fill),
            PageState::ZeroClean
            | PageState::Clean
            | PageState::Dirty
            | PageState::ForkedClean
            | PageState::ForkedZero => self.fault_mapped(page, f),
            PageState::Leaving | PageState::LeavingWanted => {
                self.pages.want(page, fill);
                Ok(())
            }
            PageState::Syncing | PageState::SyncingDirty => {
                unreachable!("the pager never syncs a resident page (page {})", page.0)
            }
        }
    }

    /// A first touch: a zero page, mapped writable if the fault was a write.
    fn fault_untouched(
        &mut self,
        store: &mut dyn PageStore,
        page: PageIndex,
        f: Fault,
        t0: Instant,
    ) -> Result<(), PagerError> {
        self.pages.missed(page);
        if !self.make_room(store)? {
            self.blocked.push_back((f, t0));
            return Ok(());
        }
        let write = self.pages.zero_fill(page, f.write);
        self.install(page, self.zeros.as_ptr(), !write)?;
        Stats::add(&self.stats.zero_fills, 1);
        Stats::add(&self.stats.faults, 1);
        self.stats.record_fault(t0.elapsed());
        self.update_local_bytes();
        Ok(())
    }

    /// The piece of `page` a fault on it fetches alone, or None to fetch the whole page: an
    /// access away from every fault stream (random access: a hash table's lookup or update, a
    /// sort's comparison, a garbage collector's mark) brings 4 KiB in a round trip of its own
    /// size where the whole page would bring 16 times that for one word; a write maps its
    /// piece writable, and the page's written pieces go back alone. A fault that continues
    /// a stream (or starts one beside pages on their way) fetches the whole page, as does one
    /// on a pinned page; the first page of a new stream costs one piece's round trip more.
    fn piece_for(&mut self, page: PageIndex, f: &Fault) -> Option<u8> {
        let piece = (f.address - self.addr(page)) / PIECE;
        if !self.sub_page
            || self.near_stream(page, piece)
            || self.pages.is_locked(page)
            || self.dense(page)
        {
            return None;
        }
        Some(piece as u8)
    }

    /// Whether the pages around `page` have been wanted whole after a first piece. One
    /// scattered fault there in [`DENSE_PROBE`] takes a piece all the same, so that what is
    /// learnt follows the program's phases (a matrix product over an array, then random
    /// gathers from it).
    fn dense(&mut self, page: PageIndex) -> bool {
        if self.learnt[(page.0 / DENSITY_PAGES) as usize].score <= 0 {
            return false;
        }
        self.probe += 1;
        !self.probe.is_multiple_of(DENSE_PROBE)
    }

    /// Whether the pages around `page` have shown sparse use: partial pages there were faulted
    /// on again away from their last piece, or left with only their few pieces, more often
    /// than they were scanned (`score`), and none was lately made whole by the program's own
    /// faults (`kept`: OpenBLAS's matrix-vector product reads four rows of under a page at
    /// once, so a page's first faults land on pieces away from one another and look sparse,
    /// yet it reads every piece: its pages, made whole at half their pieces, say so; taken
    /// for sparse, numpy's power iteration came piece by piece, 0.2 s to 0.55 s). Streams
    /// there neither fetch whole pages nor prefetch (whole pages both), until scans there
    /// turn the score (each costs a piece's round trip more).
    fn sparse(&self, page: PageIndex) -> bool {
        let l = self.learnt[(page.0 / DENSITY_PAGES) as usize];
        self.sub_page && l.score < 0 && l.kept <= 0
    }

    /// A partial page was wanted whole (`true`) or left with only its pieces.
    fn learn_density(&mut self, page: PageIndex, whole: bool) {
        nudge(
            &mut self.learnt[(page.0 / DENSITY_PAGES) as usize].score,
            whole,
        );
    }

    /// A partial page leaves with only its pieces (`false`), or the program's faults made it
    /// whole (`true`).
    fn learn_kept(&mut self, page: PageIndex, whole: bool) {
        nudge(
            &mut self.learnt[(page.0 / DENSITY_PAGES) as usize].kept,
            whole,
        );
    }

    /// Whether a read fault on `page` should map it writable: the pages around it that were
    /// fetched write-protected were mostly written soon after (a program that reads a word
    /// and then writes it: a hash table's update, a database's page cache, which touches a
    /// page's header on every read), so that its write would cost a write-protect fault of
    /// its own, a second trip through the pager for the thread. One such fault in
    /// [`WRITES_PROBE`] is mapped write-protected all the same, to keep learning.
    fn writes_follow(&mut self, page: PageIndex) -> bool {
        if self.learnt[(page.0 / DENSITY_PAGES) as usize].writes < WRITES_SURE {
            return false;
        }
        self.write_probe += 1;
        !self.write_probe.is_multiple_of(WRITES_PROBE)
    }

    /// A page fetched write-protected was written (`true`) or leaves unwritten.
    fn learn_writes(&mut self, page: PageIndex, written: bool) {
        nudge(
            &mut self.learnt[(page.0 / DENSITY_PAGES) as usize].writes,
            written,
        );
    }

    /// Whether a fault on piece `piece` of `page` continues a stream of faults: the
    /// prefetcher follows one there, or the fault is at the edge of the page next to a
    /// neighbour that is here whole or on its way whole (a scan enters a page at its first
    /// piece going up, its last going down). The prefetcher follows 16 streams, and a
    /// program's random faults push its sequential ones out of them (a sort's merge reads its
    /// runs in order between thousands of random faults on the lines they point to); a random
    /// fault is at a page's edge one time in eight.
    ///
    /// A stream says the program walks the pages in order, not that it uses all of each: where
    /// the region's pages have shown sparse use ([`Core::sparse`]), a stream's pages come by
    /// pieces like any other (ImageMagick's blur reads an image by columns, one pixel of each
    /// row: a stream of faults down the pages, a few pieces of each; fetched whole, each column
    /// cost the whole image: 85 s at a quarter of its footprint, 1.1 s plain, 5.1 s by pieces).
    fn near_stream(&self, page: PageIndex, piece: u64) -> bool {
        if self.sparse(page) {
            return false;
        }
        if self.prefetcher.as_ref().is_some_and(|p| p.near(page.0)) {
            return true;
        }
        let whole = |q: u64| {
            let q = PageIndex(q);
            match self.pages.get(q) {
                PageState::Filling => self.pages.present(q) == 0,
                PageState::Partial => false,
                s => s.is_mapped(),
            }
        };
        (piece == 0 && page.0 > 0 && whole(page.0 - 1))
            || (piece + 1 == self.pages.pieces() && whole(page.0 + 1))
    }

    /// A fault on a page that holds some of its pieces. A write to a piece it holds
    /// (a write-protect fault) makes that piece writable and written, nothing fetched. A
    /// fault on another piece fetches that piece (writable for a write), unless the page is
    /// wanted densely (its last piece, next to this one, came fewer than [`DENSE_WITHIN`]
    /// fetches ago: a scan; or half the page is here; or a stream of faults reaches it; or it
    /// is pinned): then the whole page comes and is mapped around the pieces already
    /// there. Room is made first; where that drops this very page, the fault is served as one
    /// on a remote page.
    fn fault_partial(
        &mut self,
        store: &mut dyn PageStore,
        page: PageIndex,
        f: Fault,
        t0: Instant,
    ) -> Result<(), PagerError> {
        let i = (f.address - self.addr(page)) / PIECE;
        let write = f.write || f.write_protect;
        if self.pages.present(page) & (1 << i) != 0 {
            let written = self.pages.written_pieces(page) & (1 << i) != 0;
            // A write-protect fault is told apart from a missing piece by the kernel, except
            // when faults arrive by signal (write_protect is then a guess).
            let maybe_missing = !f.write_protect || self.uffd.by_signal();
            let missing = maybe_missing && self.piece_missing(f.address);
            match (missing, written) {
                // The program dropped the piece with a raw madvise(2) system call (librmem's
                // madvise never lets one reach the region). A written piece reads as zeros, as
                // Linux gives; one not written comes again from the server's copy (Linux would
                // give zeros; a piece never fetched and dropped so cannot be told from one not
                // fetched yet, so both read the copy: docs/configuration.md).
                (true, true) => return self.map_zeros(f.address),
                (true, false) => self.pages.lose_piece(page, i as u8),
                // A pinned page is made whole and writable (mlock's populate), below.
                (false, _) if write && self.pages.is_locked(page) => {}
                (false, false) if write => return self.write_piece(page, i as u8),
                // A message queued before the piece was mapped or made writable: the thread
                // retries.
                (false, _) => {
                    self.uffd.wake(self.addr(page), self.ps())?;
                    return Ok(());
                }
            }
        }
        let have = self.pages.present(page);
        // A scan through the page: the piece next to the one fetched last, soon after it.
        let scan = self
            .pages
            .last_piece(page)
            .map(|(last, ago)| ago < DENSE_WITHIN && u64::from(last).abs_diff(i) == 1);
        let used_densely =
            scan == Some(true) || u64::from(have.count_ones()) * 2 >= self.pages.pieces();
        let whole = used_densely || self.near_stream(page, i) || self.pages.is_locked(page);
        if used_densely {
            self.learn_kept(page, true);
        }
        let piece = (!whole).then_some(i as u8);
        // Fetched for a read where writes follow reads: mapped writable (the whole page, or
        // the piece, written), as on a remote page.
        let write = write || self.writes_follow(page);
        if let Some(scan) = scan {
            // Learnt before room is made: that may drop this very page.
            self.learn_density(page, scan);
        }
        // Room first, as for a remote page. It may be made by dropping this very page (it is
        // in the policy): the fault is then one on a remote page.
        let need = match piece {
            Some(_) => 1,
            None => self.pages.pieces() - u64::from(have.count_ones()),
        };
        let room = self.resident_max * self.pages.pieces();
        if self.pages.resident_units() + need > room {
            let ahead = self.evict_ahead * self.pages.pieces();
            self.evict_down_to_units(room.saturating_sub(need + ahead), store)?;
            if self.pages.get(page) != PageState::Partial {
                return self.fault(store, f, t0);
            }
            if self.pages.resident_units() + need > room {
                self.blocked.push_back((f, t0));
                return Ok(());
            }
        }
        self.pages.missed(page);
        self.pages.begin_fill(
            page,
            Fill {
                write,
                t0,
                prefetched: false,
                piece,
            },
        );
        match piece {
            Some(i) => store.fetch_part(page, u32::from(i) * PIECE as u32, PIECE as u32)?,
            None => store.fetch(page)?,
        }
        self.send(store)?;
        self.update_local_bytes();
        self.prefetch_after(page, store, t0)
    }

    /// The program wrote piece `i` of a partial page, which it holds write-protected: the
    /// piece becomes writable and is written back alone when the page leaves.
    fn write_piece(&mut self, page: PageIndex, i: u8) -> Result<(), PagerError> {
        self.pages.write_piece(page, i);
        self.learn_writes(page, true);
        self.uffd
            .write_protect(self.addr(page) + u64::from(i) * PIECE, PIECE, false, false)?;
        Stats::add(&self.stats.wp_faults, 1);
        Ok(())
    }

    /// A page only a server holds: fetch it (or only its piece `piece`) and, if the budget
    /// is full, evict a victim while the fetch travels. It is mapped writable (dirty) if
    /// `write`: the fault is a write, or writes follow reads where it is.
    fn fault_remote(
        &mut self,
        store: &mut dyn PageStore,
        page: PageIndex,
        f: Fault,
        t0: Instant,
        piece: Option<u8>,
        write: bool,
    ) -> Result<(), PagerError> {
        self.pages.missed(page);
        if !self.shrink_to(self.resident_max, store)? {
            self.blocked.push_back((f, t0));
            return Ok(());
        }
        // One victim makes room for a page, unless it is partial: it gives back only its
        // pieces, so partial victims (clean ones dropped together below, those with written
        // pieces moved out and their pieces written back at once) are taken until there is
        // room or a whole victim comes.
        let need = if piece.is_some() {
            1
        } else {
            self.pages.pieces()
        };
        let room = self.resident_max * self.pages.pieces();
        let mut dropping = self.drops_units();
        let mut victim = None;
        while self.pages.resident_units() - dropping + need > room {
            match self.pick_victim() {
                Some(v) if self.pages.written_pieces(v) != 0 => self.leave_pieces(v, store)?,
                Some(v) if self.pages.get(v) == PageState::Partial => {
                    dropping += self.pages.units_of(v);
                    self.drops.push(v);
                }
                Some(v) => {
                    victim = Some(v);
                    break;
                }
                None => {
                    self.drop_clean()?;
                    self.blocked.push_back((f, t0));
                    return Ok(());
                }
            }
        }
        let fill = Fill {
            write,
            t0,
            prefetched: false,
            piece,
        };
        self.pages.begin_fill(page, fill);
        // Where the store sends a fetch as cheaply alone as with the victim's write-back, it
        // goes out first and the victim is dealt with while it travels: a dirty one moved out
        // of the program's view (a TLB flush), sealed and queued, a clean one dropped with a
        // few more, so the next faults need not evict. A piece's fetch always goes first.
        let ahead = piece.is_some() || store.fetch_ahead();
        if ahead {
            match piece {
                Some(i) => store.fetch_part(page, u32::from(i) * PIECE as u32, PIECE as u32)?,
                None => store.fetch(page)?,
            }
            self.send(store)?;
        }
        let out = match victim {
            Some(v) if self.pages.get(v).may_be_dirty() => self.move_out(v)?,
            _ => Out::Unwritten,
        };
        match (victim, out) {
            (Some(v), Out::Staged { slot, .. }) => {
                // SAFETY: the slot was just filled by move_out and is released only when the
                // write-back completes.
                let data = unsafe { self.staging.bytes(slot) };
                if ahead {
                    store.store(v, data)?;
                } else {
                    store.swap(v, data, page)?;
                }
                self.send(store)?;
            }
            (victim, out) => {
                if !ahead {
                    store.fetch(page)?;
                    self.send(store)?;
                }
                if let Some(v) = victim {
                    if matches!(out, Out::Unwritten) {
                        self.drops.push(v);
                    }
                    let down_to = self.resident_max.saturating_sub(self.evict_ahead);
                    self.evict_down_to(down_to, store)?;
                }
            }
        }
        // Partial victims taken above and not dropped yet.
        self.drop_clean()?;
        self.update_local_bytes();
        self.prefetch_after(page, store, t0)
    }

    /// Sends the requests queued for a fault. The first fault of those read together goes at
    /// once, so that its fetch travels while the pager deals with its victim; the others'
    /// wait for the one write after the batch (eight faulting threads: one `sendto` for
    /// about seven faults instead of one each, and a request's system call on loopback also
    /// does the server's receive).
    fn send(&self, store: &mut dyn PageStore) -> Result<(), PagerError> {
        if !self.later_of_batch {
            store.flush()?;
        }
        Ok(())
    }

    /// Another fault on a page being fetched joins the fetch; one that catches up with a
    /// prefetch makes it a fault.
    fn fault_filling(
        &mut self,
        store: &mut dyn PageStore,
        page: PageIndex,
        f: Fill,
    ) -> Result<(), PagerError> {
        let fill = self.pages.fill_mut(page);
        fill.write |= f.write;
        if fill.prefetched {
            fill.prefetched = false;
            fill.t0 = f.t0;
            Stats::add(&self.stats.prefetch_hits, 1);
            self.prefetch_after(page, store, f.t0)?;
        }
        Ok(())
    }

    /// A fault on a mapped page: a write to a write-protected clean page, a piece the program
    /// dropped itself, or a message queued before the page was installed.
    fn fault_mapped(&mut self, page: PageIndex, f: Fault) -> Result<(), PagerError> {
        let dirty = self.pages.get(page) == PageState::Dirty;
        // A write-protect fault is told apart from a missing piece by the kernel, except when
        // faults arrive by signal (write_protect is then a guess).
        let maybe_missing = dirty || !f.write_protect || self.uffd.by_signal();
        if maybe_missing && self.piece_missing(f.address) {
            self.zero_piece(page, f.address)?;
        } else if f.write_protect && !dirty {
            if self.pages.get(page) == PageState::Clean {
                self.learn_writes(page, true);
            }
            self.pages.dirty(page);
            self.uffd
                .write_protect(self.addr(page), self.ps(), false, false)?;
            Stats::add(&self.stats.wp_faults, 1);
        } else {
            // A message queued before the page was installed: the thread retries.
            self.uffd.wake(self.addr(page), self.ps())?;
        }
        Ok(())
    }

    /// Tell the prefetcher about a remote fault on `page` and fetch what it asks for, as
    /// room allows: each prefetched page is in flight and counts against the budget like a
    /// fault, and is never taken ahead of a fault waiting for room.
    fn prefetch_after(
        &mut self,
        page: PageIndex,
        store: &mut dyn PageStore,
        now: Instant,
    ) -> Result<(), PagerError> {
        let Some(pf) = &mut self.prefetcher else {
            return Ok(());
        };
        let states = &self.pages;
        let plan = pf.on_fault(page.0, |q| {
            !matches!(
                states.get(PageIndex(q)),
                PageState::Remote | PageState::Untouched
            )
        });
        if let Some((from, to)) = plan.passed {
            self.pages.passed(PageIndex(from), PageIndex(to));
        }
        let pages = self.geo.len / self.geo.page_size;
        for q in plan.pages().map(PageIndex) {
            if !self.blocked.is_empty() {
                break;
            }
            if q.0 >= pages || self.pages.get(q) != PageState::Remote || self.sparse(q) {
                continue;
            }
            if !self.make_room(store)? {
                break;
            }
            self.pages.begin_fill(
                q,
                Fill {
                    write: false,
                    t0: now,
                    prefetched: true,
                    piece: None,
                },
            );
            store.fetch(q)?;
            Stats::add(&self.stats.prefetches, 1);
        }
        self.update_local_bytes();
        Ok(())
    }

    /// A victim the pager can evict right now, or None if every candidate is busy.
    fn pick_victim(&mut self) -> Option<PageIndex> {
        let t = Instant::now();
        let v = self.pages.take_victim(self.staging.available() > 0);
        self.stats.record_select(t.elapsed());
        v
    }

    /// Evict until a page can be mapped. False if nothing can be evicted yet.
    fn make_room(&mut self, store: &mut dyn PageStore) -> Result<bool, PagerError> {
        self.shrink_to(self.resident_max - 1, store)
    }

    /// Evict until at most `limit` pages are resident (a few more when it must evict at
    /// all: see `evict_ahead`). False if nothing can be evicted yet.
    fn shrink_to(&mut self, limit: u64, store: &mut dyn PageStore) -> Result<bool, PagerError> {
        if self.resident() > limit {
            self.evict_down_to(limit.saturating_sub(self.evict_ahead), store)?;
        }
        Ok(self.resident() <= limit)
    }

    /// Evict until at most `target` pages are resident or no victim is free, then drop the
    /// clean victims (with any already in `drops`) together.
    fn evict_down_to(&mut self, target: u64, store: &mut dyn PageStore) -> Result<(), PagerError> {
        self.evict_down_to_units(target * self.pages.pieces(), store)
    }

    /// What the clean victims chosen and not yet dropped give back, in the units of
    /// [`PageStates::resident_units`].
    fn drops_units(&self) -> u64 {
        self.drops.iter().map(|&v| self.pages.units_of(v)).sum()
    }

    /// [`Core::evict_down_to`] counted in the units of [`PageStates::resident_units`]
    /// (pieces where a partial page gives back only its own).
    fn evict_down_to_units(
        &mut self,
        target: u64,
        store: &mut dyn PageStore,
    ) -> Result<(), PagerError> {
        let mut dropping = self.drops_units();
        while self.pages.resident_units() - dropping > target {
            let Some(v) = self.pick_victim() else {
                break;
            };
            let units = self.pages.units_of(v);
            dropping += units;
            let out = if self.pages.get(v).may_be_dirty() || self.pages.written_pieces(v) != 0 {
                self.move_out(v)?
            } else {
                Out::Unwritten
            };
            match out {
                Out::Staged { slot, pieces } => {
                    dropping -= units;
                    self.write_back(v, slot, pieces, store)?;
                }
                Out::Unwritten => self.drops.push(v),
                Out::Unchanged => dropping -= units,
            }
        }
        self.drop_clean()
    }

    /// Start the write-back of victim `v`, moved out into staging `slot`: the whole page, or
    /// only its written `pieces`.
    fn write_back(
        &mut self,
        v: PageIndex,
        slot: u32,
        pieces: u64,
        store: &mut dyn PageStore,
    ) -> Result<(), PagerError> {
        // SAFETY: the slot was just filled and is held until the write completes.
        let data = unsafe { self.staging.bytes(slot) };
        // A partial page's written pieces go alone where the store takes them
        // ([`PageStore::piece_writes`]); where it cannot (under erasure coding, or a copy's
        // server lost or slow) the rest of the page is fetched as it leaves and it is written
        // back whole ([`Core::merge`]): the program's faults fetch only pieces all the same.
        let alone = pieces != 0 && store.piece_writes(v, pieces);
        if alone {
            Stats::add(&self.stats.sub_page_write_backs, 1);
            Stats::add(
                &self.stats.bytes_written_back,
                u64::from(pieces.count_ones()) * PIECE,
            );
        } else if pieces != 0 {
            Stats::add(&self.stats.swap_outs, 1);
            Stats::add(&self.stats.bytes_written_back, self.ps());
        }
        match pieces {
            0 => store.store(v, data)?,
            _ if alone => store.store_parts(v, data, pieces)?,
            _ => {
                // The rest of the page first: see `Core::merge`.
                self.pages.begin_merge(v);
                store.fetch(v)?;
            }
        }
        Ok(())
    }

    /// A partial victim with written pieces (out of the policy, a staging slot free) leaves:
    /// moved out, its written pieces written back.
    fn leave_pieces(&mut self, v: PageIndex, store: &mut dyn PageStore) -> Result<(), PagerError> {
        let Out::Staged { slot, pieces } = self.move_out(v)? else {
            unreachable!("a partial page with written pieces stays to be written")
        };
        self.write_back(v, slot, pieces, store)
    }

    /// Drop the clean (write-protected) victims in `drops`: their contents are on the
    /// servers, or zero.
    fn drop_clean(&mut self) -> Result<(), PagerError> {
        if self.drops.is_empty() {
            return Ok(());
        }
        let mut addrs = std::mem::take(&mut self.drop_addrs);
        addrs.clear();
        addrs.extend(self.drops.iter().map(|&v| self.geo.addr_of(v)));
        for i in 0..self.drops.len() {
            let v = self.drops[i];
            match self.pages.get(v) {
                PageState::Partial => {
                    // Clean: its pieces came write-protected and were never written.
                    self.learn_density(v, false);
                    self.learn_kept(v, false);
                    self.learn_writes(v, false);
                }
                PageState::Clean => self.learn_writes(v, false),
                _ => {}
            }
        }
        // A thread writing one right now is blocked on write protection; after the drop its
        // write-protect fault finds the page gone, is woken, and faults it back in.
        let r = self.dropper.discard(&self.region, &addrs, self.ps());
        self.drop_addrs = addrs;
        r.map_err(PagerError::Madvise)?;
        for v in self.drops.drain(..) {
            self.pages.dropped(v);
            Stats::add(&self.stats.evictions, 1);
        }
        Ok(())
    }

    /// Move a victim that may be dirty (or a partial one with written pieces) out of the
    /// region into a staging slot, atomically with respect to the program: from here on its
    /// threads fault on it and wait. Nothing moves for a page a fork child inherited and never
    /// wrote (its server copy, or zero, is current: it is dropped like a clean page), and a
    /// zero-filled page that is all zeros leaves its slot at once, written nowhere. A partial
    /// page moves whole (its missing pieces arrive as zeros) and only its written pieces are
    /// to be written.
    fn move_out(&mut self, v: PageIndex) -> Result<Out, PagerError> {
        let ps = self.ps();
        let forked = matches!(
            self.pages.get(v),
            PageState::ForkedClean | PageState::ForkedZero
        );
        if self.pages.get(v) == PageState::Partial {
            // It leaves with its few pieces, as a clean partial page dropped does.
            self.learn_density(v, false);
            self.learn_kept(v, false);
            // Only its written pieces are to be written: the others (write-protected, the
            // server's copy) are dropped, not moved. A write-protected piece could not be
            // moved if it is shared with a fork child (the copy that makes it this process's
            // own would wait on this pager), and the slot need not hold it.
            let unwritten = self.pages.present(v) & !self.pages.written_pieces(v);
            for (at, len) in crate::store::piece_runs(unwritten) {
                self.region
                    .discard(self.addr(v) + at as u64, len as u64)
                    .map_err(PagerError::Madvise)?;
            }
        }
        let slot = self
            .staging
            .take(&mut self.dropper)
            .map_err(PagerError::Madvise)?
            .expect("pick_victim checked for a free slot");
        let addr = self.addr(v);
        // UFFDIO_MOVE moves only between writable mappings with the same access. A page the
        // program made read-only, inaccessible or executable moves with every access any part
        // of it has, plus read-write, on both sides (the staging slot too), and gets its
        // protection back as soon as it is out: for that moment a program access that should
        // fault would not (a known gap), but none that should succeed faults (a thread running
        // JIT-compiled code on the page).
        let prot = self.protections.within(addr, addr + ps);
        let all = prot.iter().fold(READ_WRITE, |all, &(_, _, p)| all | p);
        let slot_at = self.staging.addr(slot);
        if !prot.is_empty() {
            mprotect(addr, ps, all).map_err(PagerError::Mprotect)?;
        }
        if all != READ_WRITE {
            mprotect(slot_at, ps, all).map_err(PagerError::Mprotect)?;
        }
        // Parts of the page the program discarded (madvise) arrive as zero pages, so the
        // slot is whole and the pager never faults on it. A page shared with a fork parent or
        // child is copied on the way.
        let moved = self.uffd.move_range(slot_at, addr, ps, forked)?;
        if all != READ_WRITE {
            mprotect(slot_at, ps, READ_WRITE).map_err(PagerError::Mprotect)?;
            mprotect(addr, ps, READ_WRITE).map_err(PagerError::Mprotect)?;
        }
        for (s, e, p) in prot {
            mprotect(s, e - s, p).map_err(PagerError::Mprotect)?;
        }
        if moved == Moved::Unwritten {
            self.staging.release(slot);
            return Ok(Out::Unwritten);
        }
        // SAFETY: the slot was just filled and is ours until released.
        if self.pages.zero_origin(v) && all_zero(unsafe { self.staging.bytes(slot) }) {
            self.staging.release(slot);
            self.pages.unchanged(v);
            Stats::add(&self.stats.evictions, 1);
            Stats::add(&self.stats.dirty_unchanged, 1);
            return Ok(Out::Unchanged);
        }
        let pieces = self.pages.begin_leave(v, slot);
        Stats::add(&self.stats.evictions, 1);
        if pieces == 0 {
            Stats::add(&self.stats.swap_outs, 1);
            Stats::add(&self.stats.bytes_written_back, ps);
        }
        // (A partial page's written pieces are counted as they go: [`Core::write_back`].)
        Ok(Out::Staged { slot, pieces })
    }

    /// A store operation finished.
    fn complete(&mut self, c: Completion<'_>) -> Result<(), PagerError> {
        match c {
            Completion::Fetched { page, data } if self.pages.merging(page) => {
                self.merge(page, data)?;
            }
            Completion::Fetched { page, data } => {
                let landed = self.pages.fetched(page);
                self.land(page, landed, Some(data))?;
            }
            Completion::Stored { page } => {
                let landed = self.pages.stored(page);
                self.land(page, landed, None)?;
            }
        }
        self.update_local_bytes();
        Ok(())
    }

    /// The rest of a leaving partial page came (`data`, the server's copy): its pieces the
    /// program did not write go into its slot around those it wrote, and the page is written
    /// back whole from there (after the store's poll: `Pager::poll_store`).
    fn merge(&mut self, page: PageIndex, data: &[u8]) -> Result<(), PagerError> {
        match self.pages.merged(page) {
            Merged::Released { slot } => {
                self.land(page, Landed::Released { slot: Some(slot) }, None)?;
            }
            Merged::Write { slot, written } => {
                assert_eq!(data.len() as u64, self.ps(), "page {}", page.0);
                let all = u64::MAX >> (64 - self.pages.pieces());
                // SAFETY: the slot holds this page until its write-back lands; only the pager
                // touches the staging area.
                let dst = unsafe { self.staging.bytes_mut(slot) };
                for (at, len) in crate::store::piece_runs(all & !written) {
                    dst[at..at + len].copy_from_slice(&data[at..at + len]);
                }
                Stats::add(&self.stats.bytes_fetched, self.ps());
                self.merged.push((page, slot));
            }
        }
        Ok(())
    }

    /// The memory side of a fetch or write-back that landed: map the page (from the fetched
    /// `data`, or from its staging slot), free the slot, or finish the program's release of
    /// the page (forget the server copy, wake the threads that wait on it).
    fn land(
        &mut self,
        page: PageIndex,
        landed: Landed,
        data: Option<&[u8]>,
    ) -> Result<(), PagerError> {
        match landed {
            Landed::Released { slot } => {
                self.frees.push(page);
                if let Some(slot) = slot {
                    self.staging.release(slot);
                }
                self.uffd.wake(self.addr(page), self.ps())?;
            }
            Landed::Piece { piece, fill } => {
                let data = data.expect("a piece comes from a fetch");
                assert_eq!(data.len() as u64, PIECE, "page {} piece {piece}", page.0);
                let at = u64::from(piece) * PIECE;
                self.install_at(page, at, data.as_ptr(), PIECE, !fill.write)?;
                // Threads that wait on other pieces of the page fault again, on them.
                self.uffd.wake(self.addr(page), self.ps())?;
                Stats::add(&self.stats.sub_page_fetches, 1);
                Stats::add(&self.stats.bytes_fetched, PIECE);
                Stats::add(&self.stats.faults, 1);
                self.stats.record_fault(fill.t0.elapsed());
            }
            Landed::Map {
                write,
                fill,
                slot,
                present,
            } => {
                let src = match (data, slot) {
                    (Some(d), _) => d.as_ptr(),
                    // SAFETY: the slot holds the page's contents until released just below.
                    (None, Some(s)) => unsafe { self.staging.bytes(s) }.as_ptr(),
                    (None, None) => unreachable!("a page mapped from nothing"),
                };
                if present == 0 {
                    self.install(page, src, !write)?;
                } else {
                    self.install_around(page, src, present, write)?;
                }
                if let Some(slot) = slot {
                    self.staging.release(slot);
                }
                if data.is_some() {
                    Stats::add(&self.stats.swap_ins, 1);
                    Stats::add(&self.stats.bytes_fetched, self.ps());
                }
                if !fill.prefetched {
                    Stats::add(&self.stats.faults, 1);
                    self.stats.record_fault(fill.t0.elapsed());
                }
            }
            Landed::Remote { slot } => {
                self.staging.release(slot);
            }
            Landed::Refetch { slot } => {
                self.staging.release(slot);
                self.uffd.wake(self.addr(page), self.ps())?;
            }
            Landed::Queued => {}
            Landed::Synced { .. } => unreachable!("the pager never syncs a resident page"),
        }
        Ok(())
    }

    /// After completions: reinstall written-back pages that were wanted meanwhile, then retry
    /// faults that were waiting for room.
    fn settle(&mut self, store: &mut dyn PageStore) -> Result<(), PagerError> {
        // Room first, as for any page coming in. Where none can be made now (every other
        // resident page in flight, or dirty with no staging slot free) the page is not
        // reinstalled over the budget: its write-back landed, so it is remote now and the
        // fault that wants it fetches it again, its slot freed for a victim. Mapping it
        // anyway held one page over the budget, and a partial victim's merge could then fill
        // the slot it freed (a budget overrun, not only a page over the resident count).
        // A fork child's page whose write-back was the parent's is mapped all the same (its
        // slot is its only sure copy) and evicted again as soon as a victim is free.
        while self.pages.reinstall_waiting() {
            // A page freed meanwhile maps nothing: no victim is evicted for it.
            let room = !self.pages.next_reinstall_maps() || self.make_room(store)?;
            let (page, landed) = self.pages.next_reinstall(room).expect("waiting");
            let over = !room && matches!(landed, Landed::Map { .. });
            // (Only a reinstall with no room is fetched again.)
            if matches!(landed, Landed::Refetch { .. }) {
                Stats::add(&self.stats.reinstalls_refetched, 1);
            }
            self.land(page, landed, None)?;
            if over {
                self.shrink_to(self.resident_max, store)?;
            }
        }
        for _ in 0..self.blocked.len() {
            let (f, t0) = self.blocked.pop_front().expect("counted");
            self.fault(store, f, t0)?;
        }
        self.pages.check();
        self.update_local_bytes();
        Ok(())
    }

    /// Make `count` pages from `first` resident, as a write fault on each would (mlock's
    /// populate), without a program thread touching them: one may be inaccessible
    /// (mprotect). Counted as faults in the statistics.
    fn populate(
        &mut self,
        store: &mut dyn PageStore,
        first: PageIndex,
        count: u64,
    ) -> Result<(), PagerError> {
        let now = Instant::now();
        for p in first.0..first.0 + count {
            let f = Fault {
                address: self.addr(PageIndex(p)),
                write: true,
                write_protect: false,
            };
            self.fault(store, f, now)?;
        }
        Ok(())
    }

    /// mlock(2)/munlock(2) for the program (`Command::Lock`): 0 or the errno. Pinned pages
    /// leave the policy and are made resident (`populate`), counted against the budget,
    /// which is why their number is bounded. They are kept writable (dirty), as Linux's
    /// mlock populates a writable mapping for writing: the kernel may write them on its own
    /// (a signal frame, a thread's rseq area), and in user-mode-only mode it cannot take a
    /// write-protect fault.
    fn lock(&mut self, first: PageIndex, count: u64, lock: bool) -> Result<i32, PagerError> {
        let pages = (first.0..first.0 + count).map(PageIndex);
        if !lock {
            self.pages.unlock(pages);
            return Ok(0);
        }
        let Some(writable) = self.pages.lock(pages) else {
            return Ok(libc::ENOMEM);
        };
        for p in writable {
            self.uffd
                .write_protect(self.addr(p), self.ps(), false, false)?;
        }
        Ok(0)
    }

    /// mprotect(2) for the program (`Command::Protect`): 0 or the errno.
    fn protect(&mut self, addr: u64, len: u64, prot: i32) -> i32 {
        if prot == READ_WRITE && self.protections.within(addr, addr + len).is_empty() {
            return 0;
        }
        match mprotect(addr, len, prot) {
            Ok(()) => {
                self.protections.set(addr, addr + len, prot);
                0
            }
            Err(e) => e.raw_os_error().unwrap_or(libc::EINVAL),
        }
    }

    /// The program freed `count` pages from `first`: they become untouched (zero) again.
    fn release(
        &mut self,
        store: &mut dyn PageStore,
        first: PageIndex,
        count: u64,
        unprotect: bool,
    ) -> Result<(), PagerError> {
        let ps = self.ps();
        let (start, end) = (self.addr(first), self.addr(first) + count * ps);
        if unprotect && !self.protections.within(start, end).is_empty() {
            mprotect(start, end - start, READ_WRITE).map_err(PagerError::Mprotect)?;
            self.protections.set(start, end, READ_WRITE);
        }
        for page in (first.0..first.0 + count).map(PageIndex) {
            if self.pages.free(page) == Freed::Remote {
                store.free(page)?;
            }
        }
        self.region
            .discard(self.addr(first), count * ps)
            .map_err(PagerError::Madvise)?;
        self.update_local_bytes();
        Ok(())
    }
}

/// mprotect(2) by system call: librmem interposes the `mprotect` symbol for the program.
fn mprotect(addr: u64, len: u64, prot: i32) -> std::io::Result<()> {
    // SAFETY: changes only the protection of a range of the region, which the pager owns;
    // the kernel validates the range.
    if unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
