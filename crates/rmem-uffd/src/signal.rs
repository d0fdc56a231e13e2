//! Fault delivery by signal (`UFFD_FEATURE_SIGBUS`), for [`crate::Uffd::open_signal`].
//!
//! With the default delivery a faulting thread sleeps in the kernel until the handler resolves
//! its fault, and waking it again is the largest cost of a fault on a virtual machine (an
//! inter-processor interrupt to an idle virtual CPU: see docs/benchmarks.md). Here the kernel
//! sends the faulting thread SIGBUS instead. Its signal handler posts the fault in a slot of a
//! process-wide table and spins (then sleeps on a futex) until the pager marks the slot done
//! (only as many threads spin at once as there are CPUs less one; the others sleep at once);
//! on return the access is retried and, the page being there now, succeeds. Nothing sleeps in
//! the kernel, so nothing there needs waking.
//!
//! The price: faults from kernel mode (a `read(2)` into a missing page) fail with EFAULT, as
//! with `UFFD_USER_MODE_ONLY`; a thread that blocks SIGBUS (by a raw system call: librmem
//! keeps SIGBUS out of the masks a program sets through libc) and touches remote memory is
//! killed. A program's own SIGBUS handler would replace this one: librmem's interposed
//! `sigaction` keeps it instead and runs [`handle_sigbus`] before the program's handler. x86-64
//! only: the handler reads the write bit of the page-fault error code from the signal
//! context.
//!
//! Everything the handler touches is a static atomic: it allocates nothing and takes no lock.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Threads that can wait on a fault at once; more wait for a free slot.
pub const SLOTS: usize = 512;
/// Address ranges registered by signal-mode userfaultfds at once.
const RANGES: usize = 16;
/// How long a faulting thread spins before it sleeps on the futex.
const SPIN_NS: u64 = 200_000;

const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const POSTED: u32 = 2;
const TAKEN: u32 = 3;
const DONE: u32 = 4;
/// Set in a slot's state when its thread sleeps on the futex.
const WAITER: u32 = 0x100;
const STATE: u32 = 0xff;

struct Slot {
    state: AtomicU32,
    /// Page address, with bit 0 set for a write.
    addr: AtomicU64,
}

struct Range {
    start: AtomicU64,
    len: AtomicU64,
    /// Owner's id (nonzero while in use), so one userfaultfd takes only its own faults.
    owner: AtomicU64,
    /// eventfd that wakes the owner's pager when it sleeps.
    kick: AtomicI32,
    sleeping: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const SLOT: Slot = Slot {
    state: AtomicU32::new(FREE),
    addr: AtomicU64::new(0),
};
#[allow(clippy::declare_interior_mutable_const)]
const RANGE: Range = Range {
    start: AtomicU64::new(0),
    len: AtomicU64::new(0),
    owner: AtomicU64::new(0),
    kick: AtomicI32::new(-1),
    sleeping: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [SLOT; SLOTS];
static TABLE_RANGES: [Range; RANGES] = [RANGE; RANGES];
/// Slots posted and not yet taken, so a pager need not scan the table when there are none.
static POSTED_COUNT: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Threads spinning in the handler now, and how many may: one fewer than the CPUs, so that
/// the pager keeps one; the others sleep on their futex at once.
static SPINNERS: AtomicUsize = AtomicUsize::new(0);
static SPINNERS_MAX: AtomicUsize = AtomicUsize::new(1);
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);
/// The SIGBUS action before ours, for faults that are not ours.
static mut PREVIOUS: libc::sigaction = unsafe_zeroed_sigaction();

const fn unsafe_zeroed_sigaction() -> libc::sigaction {
    // SAFETY: sigaction is a plain C struct for which all-zero bytes are a valid value
    // (SIG_DFL, empty mask, no flags).
    unsafe { std::mem::zeroed() }
}

/// A new owner id for a signal-mode userfaultfd.
pub(crate) fn new_owner() -> u64 {
    NEXT_OWNER.fetch_add(1, Ordering::Relaxed)
}

/// Install the SIGBUS handler (once per process).
pub(crate) fn install() -> std::io::Result<()> {
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    SPINNERS_MAX.store(cpus.saturating_sub(1).max(1), Ordering::Relaxed);
    // SAFETY: a zeroed sigaction filled in below; PREVIOUS is written only here, once, before
    // any signal can reach the handler that reads it.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGBUS, &sa, std::ptr::addr_of_mut!(PREVIOUS)) != 0 {
            INSTALLED.store(false, Ordering::Release);
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Let faults in `[start, start+len)` through to `owner`, whose pager sleeps on `kick`.
pub(crate) fn add_range(owner: u64, start: u64, len: u64, kick: i32) -> bool {
    for r in &TABLE_RANGES {
        if r.owner
            .compare_exchange(0, u64::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            r.start.store(start, Ordering::Relaxed);
            r.len.store(len, Ordering::Relaxed);
            r.kick.store(kick, Ordering::Relaxed);
            r.owner.store(owner, Ordering::Release);
            return true;
        }
    }
    false
}

/// Forget `owner`'s ranges (its userfaultfd is closing).
pub(crate) fn remove_ranges(owner: u64) {
    for r in &TABLE_RANGES {
        if r.owner.load(Ordering::Acquire) == owner {
            r.len.store(0, Ordering::Relaxed);
            r.kick.store(-1, Ordering::Relaxed);
            r.owner.store(0, Ordering::Release);
        }
    }
}

fn range_of(addr: u64) -> Option<&'static Range> {
    TABLE_RANGES.iter().find(|r| {
        let owner = r.owner.load(Ordering::Acquire);
        owner != 0
            && owner != u64::MAX
            && addr.wrapping_sub(r.start.load(Ordering::Relaxed)) < r.len.load(Ordering::Relaxed)
    })
}

fn owner_of(addr: u64) -> u64 {
    range_of(addr).map_or(0, |r| r.owner.load(Ordering::Relaxed))
}

/// Whether `owner` has faults posted (others' do not keep it awake); also marks its pager
/// as about to sleep (`sleeping`), or awake again, so that a fault posted meanwhile kicks it.
pub(crate) fn set_sleeping(owner: u64, sleeping: bool) -> bool {
    for r in &TABLE_RANGES {
        if r.owner.load(Ordering::Acquire) == owner {
            r.sleeping.store(sleeping, Ordering::SeqCst);
        }
    }
    POSTED_COUNT.load(Ordering::SeqCst) > 0
        && TABLE.iter().any(|s| {
            s.state.load(Ordering::SeqCst) & STATE == POSTED
                && owner_of(s.addr.load(Ordering::Relaxed) & !1) == owner
        })
}

/// Take the faults posted in `owner`'s ranges: (slot, page address, write).
pub(crate) fn take_posted(owner: u64, out: &mut impl FnMut(u32, u64, bool)) -> usize {
    if POSTED_COUNT.load(Ordering::SeqCst) == 0 {
        return 0;
    }
    let mut n = 0;
    for (i, s) in TABLE.iter().enumerate() {
        let st = s.state.load(Ordering::Acquire);
        if st & STATE != POSTED {
            continue;
        }
        let a = s.addr.load(Ordering::Relaxed);
        if owner_of(a & !1) != owner {
            continue;
        }
        if s.state
            .compare_exchange(
                st,
                (st & WAITER) | TAKEN,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            POSTED_COUNT.fetch_sub(1, Ordering::SeqCst);
            out(i as u32, a & !1, a & 1 != 0);
            n += 1;
        }
    }
    n
}

/// Let the thread waiting on `slot` retry its access.
pub(crate) fn complete(slot: u32) {
    let s = &TABLE[slot as usize];
    let old = s.state.swap(DONE, Ordering::AcqRel);
    if old & WAITER != 0 {
        // SAFETY: FUTEX_WAKE on a static atomic word of this process.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                s.state.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            )
        };
    }
}

fn now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into a valid timespec; async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Whether the interrupted access was a write: bit 1 of the x86 page-fault error code.
fn was_write(ctx: *mut libc::c_void) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: for an SA_SIGINFO handler the kernel passes a valid ucontext_t.
        let uc = unsafe { &*(ctx as *const libc::ucontext_t) };
        uc.uc_mcontext.gregs[libc::REG_ERR as usize] & 2 != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ctx;
        false
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's arguments to this SA_SIGINFO handler.
    if !unsafe { handle_sigbus(info, ctx) } {
        chain(sig, info, ctx);
    }
}

/// The SIGBUS action that [`Uffd::open_signal`](crate::Uffd::open_signal) replaced with rmem's
/// handler (SIG_DFL before it did).
pub fn sigbus_previous_action() -> libc::sigaction {
    // SAFETY: PREVIOUS is written once, in `install`, before the handler exists.
    unsafe { std::ptr::addr_of!(PREVIOUS).read() }
}

/// The work of rmem's SIGBUS handler, for a SIGBUS handler installed by someone else: a fault
/// in a range of a signal-mode userfaultfd is posted to its pager and waited for (the access is
/// retried on return and succeeds); returns false, having done nothing, for any other SIGBUS.
/// Async-signal-safe.
///
/// # Safety
/// `info` and `ctx` are what the kernel passed to an SA_SIGINFO handler of SIGBUS.
pub unsafe fn handle_sigbus(info: *mut libc::siginfo_t, ctx: *mut libc::c_void) -> bool {
    // SAFETY: the caller passes the kernel's siginfo.
    let addr = unsafe { (*info).si_addr() } as u64;
    // A SIGBUS sent by kill(2) has no fault address (si_code <= 0).
    // SAFETY: as above.
    if unsafe { (*info).si_code } <= 0 {
        return false;
    }
    let Some(range) = range_of(addr) else {
        return false;
    };
    // SAFETY: errno is thread-local; the system calls below may change it.
    let saved_errno = unsafe { *libc::__errno_location() };
    let page = addr & !4095;
    let word = page | was_write(ctx) as u64;
    let start = (page >> 12) as usize % SLOTS;
    let slot = 'claim: loop {
        for k in 0..SLOTS {
            let s = &TABLE[(start + k) % SLOTS];
            if s.state
                .compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                break 'claim s;
            }
        }
        std::hint::spin_loop();
    };
    slot.addr.store(word, Ordering::Relaxed);
    slot.state.store(POSTED, Ordering::Release);
    POSTED_COUNT.fetch_add(1, Ordering::SeqCst);
    if range.sleeping.load(Ordering::SeqCst) {
        let one: u64 = 1;
        // SAFETY: an 8-byte write to the pager's eventfd; async-signal-safe.
        unsafe {
            libc::write(
                range.kick.load(Ordering::Relaxed),
                (&one as *const u64).cast(),
                8,
            )
        };
    }
    let t0 = now_ns();
    let spin = SPINNERS.fetch_add(1, Ordering::AcqRel) < SPINNERS_MAX.load(Ordering::Relaxed);
    let mut spinning = true;
    while slot.state.load(Ordering::Acquire) & STATE != DONE {
        if spin && now_ns() - t0 < SPIN_NS {
            // Spin, but give way at once to anything runnable on this CPU (the memory
            // server, when it shares the machine).
            // SAFETY: sched_yield has no preconditions; async-signal-safe.
            unsafe { libc::sched_yield() };
            continue;
        }
        if spinning {
            SPINNERS.fetch_sub(1, Ordering::AcqRel);
            spinning = false;
        }
        let st = slot.state.fetch_or(WAITER, Ordering::AcqRel) | WAITER;
        if st & STATE == DONE {
            break;
        }
        // SAFETY: FUTEX_WAIT on a static atomic word; returns at once if it changed.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                slot.state.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                st,
                std::ptr::null::<libc::timespec>(),
            )
        };
    }
    if spinning {
        SPINNERS.fetch_sub(1, Ordering::AcqRel);
    }
    slot.state.store(FREE, Ordering::Release);
    // SAFETY: restoring this thread's errno.
    unsafe { *libc::__errno_location() = saved_errno };
    true
}

/// Hand a SIGBUS that is not ours to the action the program had.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: PREVIOUS was written once before the handler was installed.
    let prev = unsafe { std::ptr::addr_of!(PREVIOUS).read() };
    if prev.sa_sigaction == libc::SIG_DFL || prev.sa_sigaction == libc::SIG_IGN {
        // Restore the default action: the access is retried on return, faults again, and the
        // kernel's default (a core dump) follows.
        // SAFETY: resetting SIGBUS to its default action.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
        return;
    }
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program's own SA_SIGINFO handler, called as the kernel would.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(prev.sa_sigaction) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program's own plain handler, called as the kernel would.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev.sa_sigaction) };
        f(sig);
    }
}
