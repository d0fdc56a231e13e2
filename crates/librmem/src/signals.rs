//! SIGSEGV, SIGBUS and SIGSYS: rmem's handler first, the program's behind it.
//!
//! rmem needs a signal in four cases: SIGBUS when faults are delivered by signal
//! (`RMEM_FAULT_DELIVERY=signal`, rmem-uffd's signal.rs), SIGSEGV in a fork() child, where
//! the region is reserved with no access so that a touch is stopped with rmem's message
//! (fork.rs), SIGSEGV of one of rmem's own touches on the kernel's behalf, which answers "not
//! accessible" (probe.rs, asked first), and SIGSYS for the system calls its seccomp filter
//! traps (sys.rs). Any would break as soon as the program set its own disposition: a child that
//! resets SIGSEGV to SIG_DFL died of a bare SIGSEGV, and a program's SIGBUS handler received
//! rmem's faults.
//!
//! So once rmem [`own`]s one of these signals, the kernel keeps rmem's [`dispatch`] handler for
//! it for good, and the program's disposition becomes a value kept here: the interposed
//! `sigaction`, `signal`, `bsd_signal`, `sysv_signal` and `sigset` read and write that value
//! and never reach the kernel for an owned signal. `dispatch` first asks rmem's part whether
//! the fault is rmem's (an address in the region); if not, it does what the program's
//! disposition says: calls its handler with its flags and mask (SA_SIGINFO or not,
//! SA_RESETHAND), or, for SIG_DFL and SIG_IGN, gives the signal back to the kernel's default
//! and lets the fault repeat (a signal sent by kill(2) is raised again, or dropped when
//! ignored). `sigprocmask` and `pthread_sigmask` leave owned signals unblocked, because a
//! fault with its signal blocked kills the process before any handler runs.
//!
//! Where this differs from the kernel: the program's handler always runs on the alternate
//! signal stack when the thread has one (rmem's handler asks for SA_ONSTACK, which stack
//! overflow handlers need), and the owned signal is not blocked while it runs (rmem's own
//! faults must still be delivered). A disposition set by a raw `rt_sigaction` system call
//! bypasses all this. A signal nobody owns passes straight through to the C library.
//!
//! The program's disposition is read inside a signal handler, so it is kept in atomics under a
//! sequence counter (written with every signal blocked), never behind a lock.

use crate::io::next_symbol;
use libc::{c_int, c_void, siginfo_t};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// rmem's part of a handler: true when the fault was rmem's and has been dealt with.
pub type RmemPart = fn(c_int, *mut siginfo_t, *mut c_void) -> bool;

const SIGNALS: [c_int; 3] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGSYS];
/// sigset(3)'s "block it" disposition (not in the libc crate).
const SIG_HOLD: usize = 2;
const MASK_WORDS: usize = std::mem::size_of::<libc::sigset_t>() / 8;

/// One owned signal: rmem's part and the program's disposition.
struct Owned {
    owned: AtomicBool,
    rmem: AtomicUsize,
    /// Even when the fields below are stable; odd while a writer changes them.
    seq: AtomicU32,
    writer: AtomicBool,
    handler: AtomicUsize,
    flags: AtomicI32,
    mask: [AtomicU64; MASK_WORDS],
}

#[allow(clippy::declare_interior_mutable_const)]
const WORD: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const OWNED: Owned = Owned {
    owned: AtomicBool::new(false),
    rmem: AtomicUsize::new(0),
    seq: AtomicU32::new(0),
    writer: AtomicBool::new(false),
    handler: AtomicUsize::new(libc::SIG_DFL),
    flags: AtomicI32::new(0),
    mask: [WORD; MASK_WORDS],
};
static TABLE: [Owned; 3] = [OWNED; 3];

fn slot(sig: c_int) -> Option<&'static Owned> {
    SIGNALS
        .iter()
        .position(|&s| s == sig)
        .map(|i| &TABLE[i])
        .filter(|o| o.owned.load(Ordering::Acquire))
}

fn zeroed_action() -> libc::sigaction {
    // SAFETY: sigaction is a plain C struct for which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

fn mask_words(set: &libc::sigset_t) -> [u64; MASK_WORDS] {
    // SAFETY: sigset_t is MASK_WORDS * 8 bytes of plain data.
    unsafe { std::mem::transmute_copy(set) }
}

impl Owned {
    /// The program's disposition (a consistent copy, even inside a handler).
    fn action(&self) -> libc::sigaction {
        let mut a = zeroed_action();
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            a.sa_sigaction = self.handler.load(Ordering::Relaxed);
            a.sa_flags = self.flags.load(Ordering::Relaxed);
            let words: [u64; MASK_WORDS] =
                std::array::from_fn(|i| self.mask[i].load(Ordering::Relaxed));
            // SAFETY: sigset_t is MASK_WORDS * 8 bytes of plain data.
            a.sa_mask = unsafe { std::mem::transmute_copy(&words) };
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return a;
            }
        }
    }

    /// Set the program's disposition. Every signal is blocked meanwhile, so a handler on this
    /// thread can never wait for this writer.
    fn set_action(&self, a: &libc::sigaction) {
        let mut all = zeroed_action().sa_mask;
        let mut old = all;
        // SAFETY: filling a local sigset and swapping this thread's mask.
        unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        }
        while self
            .writer
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        self.seq.fetch_add(1, Ordering::AcqRel);
        self.handler.store(a.sa_sigaction, Ordering::Relaxed);
        self.flags.store(a.sa_flags, Ordering::Relaxed);
        for (w, v) in self.mask.iter().zip(mask_words(&a.sa_mask)) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.fetch_add(1, Ordering::Release);
        self.writer.store(false, Ordering::Release);
        // SAFETY: restoring this thread's mask.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
}

type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;

/// The C library's `sigaction` (resolved before any handler can need it, in [`own`]).
fn real_sigaction() -> SigactionFn {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let mut f = REAL.load(Ordering::Relaxed);
    if f == 0 {
        f = next_symbol(c"sigaction");
        REAL.store(f, Ordering::Relaxed);
    }
    // SAFETY: f is the C library's sigaction, same signature.
    unsafe { std::mem::transmute::<usize, SigactionFn>(f) }
}

/// Make rmem's handler the kernel's for `sig` (SIGSEGV, SIGBUS or SIGSYS), with `rmem` as its
/// part.
/// The program's disposition is `program` when given (the action another handler of rmem
/// replaced), else the one the kernel had.
pub fn own(sig: c_int, rmem: RmemPart, program: Option<libc::sigaction>) {
    let i = SIGNALS
        .iter()
        .position(|&s| s == sig)
        .expect("rmem owns SIGSEGV, SIGBUS and SIGSYS only");
    let o = &TABLE[i];
    o.rmem.store(rmem as usize, Ordering::Release);
    if o.owned.load(Ordering::Acquire) {
        return;
    }
    let real = real_sigaction();
    // Resolve now what the handler calls: dlsym is not async-signal-safe.
    let _ = real_mask(c"pthread_sigmask");
    let mut sa = zeroed_action();
    sa.sa_sigaction = dispatch as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESTART;
    let mut old = zeroed_action();
    // SAFETY: installing a handler that only reads statics; `old` receives the previous one.
    unsafe {
        libc::sigemptyset(&mut sa.sa_mask);
        real(sig, &sa, &mut old);
    }
    o.set_action(&program.unwrap_or(old));
    o.owned.store(true, Ordering::Release);
}

/// rmem's handler for owned signals.
extern "C" fn dispatch(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    if crate::probe::recover(sig, info, ctx) {
        return;
    }
    let i = SIGNALS.iter().position(|&s| s == sig).unwrap_or(0);
    let o = &TABLE[i];
    let rmem = o.rmem.load(Ordering::Acquire);
    if rmem != 0 {
        // SAFETY: set only from an RmemPart in `own`.
        let part = unsafe { std::mem::transmute::<usize, RmemPart>(rmem) };
        if part(sig, info, ctx) {
            return;
        }
    }
    chain(o, sig, info, ctx);
}

/// Do what the program's disposition says for a signal that was not rmem's.
fn chain(o: &Owned, sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    let act = o.action();
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    // A SIGSYS of somebody else's seccomp filter does not repeat on return: raise it too.
    let sent = unsafe { (*info).si_code } <= 0 || sig == libc::SIGSYS;
    if act.sa_sigaction == libc::SIG_DFL || act.sa_sigaction == libc::SIG_IGN {
        if sent && act.sa_sigaction == libc::SIG_IGN {
            return;
        }
        // Give the signal back to the kernel: a fault repeats on return and gets the default
        // action (a synchronous fault cannot be ignored); a sent signal is raised again.
        o.owned.store(false, Ordering::Release);
        let mut dfl = zeroed_action();
        dfl.sa_sigaction = libc::SIG_DFL;
        // SAFETY: resetting the disposition to the default; raise is async-signal-safe and
        // the signal is not blocked here (SA_NODEFER).
        unsafe {
            real_sigaction()(sig, &dfl, std::ptr::null_mut());
            if sent {
                libc::raise(sig);
            }
        }
        return;
    }
    if act.sa_flags & libc::SA_RESETHAND != 0 {
        let mut dfl = zeroed_action();
        dfl.sa_sigaction = libc::SIG_DFL;
        o.set_action(&dfl);
    }
    let mut mask = act.sa_mask;
    // SAFETY: editing a local sigset, then blocking it for the program's handler as the
    // kernel would have; the kernel restores the interrupted mask when this handler returns.
    unsafe {
        if act.sa_flags & libc::SA_NODEFER == 0 {
            libc::sigaddset(&mut mask, sig);
        }
        for s in SIGNALS {
            libc::sigdelset(&mut mask, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &mask, std::ptr::null_mut());
    }
    if act.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program's SA_SIGINFO handler, called as the kernel would call it.
        let f = unsafe {
            std::mem::transmute::<usize, extern "C" fn(c_int, *mut siginfo_t, *mut c_void)>(
                act.sa_sigaction,
            )
        };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program's plain handler, called as the kernel would call it.
        let f = unsafe { std::mem::transmute::<usize, extern "C" fn(c_int)>(act.sa_sigaction) };
        f(sig);
    }
}

fn einval() -> c_int {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = libc::EINVAL };
    -1
}

/// See sigaction(2). For a signal rmem owns, the program's disposition is kept apart.
///
/// # Safety
/// `act` and `old` are null or valid.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let Some(o) = slot(sig) else {
        if let Some(copy) = unmasked(act) {
            // SAFETY: the caller's action without the owned signals in its mask.
            return unsafe { real_sigaction()(sig, &copy, old) };
        }
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real_sigaction()(sig, act, old) };
    };
    let prev = o.action();
    if !act.is_null() {
        // SAFETY: caller's contract.
        o.set_action(unsafe { &*act });
    }
    if !old.is_null() {
        // SAFETY: caller's contract.
        unsafe { old.write(prev) };
    }
    0
}

/// `act` without the owned signals in its mask, when it has some: a handler of the program
/// must not block them while it runs (a fault, or a trapped system call, would then kill the
/// process instead of reaching rmem).
fn unmasked(act: *const libc::sigaction) -> Option<libc::sigaction> {
    if act.is_null() {
        return None;
    }
    // SAFETY: the caller's valid action.
    let mut copy = unsafe { *act };
    unblockable(libc::SIG_BLOCK, &copy.sa_mask).map(|mask| {
        copy.sa_mask = mask;
        copy
    })
}

/// glibc's internal name for [`sigaction`], exported too.
///
/// # Safety
/// As [`sigaction`].
#[no_mangle]
pub unsafe extern "C" fn __sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { sigaction(sig, act, old) }
}

/// `signal` and its relatives on an owned signal: set the program's disposition with `flags`,
/// return the previous handler. None when `sig` is not owned.
fn set_handler(sig: c_int, handler: usize, flags: c_int) -> Option<usize> {
    let o = slot(sig)?;
    if handler == libc::SIG_ERR {
        return Some(einval() as usize);
    }
    if handler == SIG_HOLD {
        // sigset(sig, SIG_HOLD) blocks the signal; an owned one is never blocked.
        return Some(o.action().sa_sigaction);
    }
    let mut a = zeroed_action();
    a.sa_sigaction = handler;
    a.sa_flags = flags;
    // SAFETY: a local sigset.
    unsafe { libc::sigemptyset(&mut a.sa_mask) };
    let prev = o.action().sa_sigaction;
    o.set_action(&a);
    Some(prev)
}

macro_rules! signal_like {
    ($($name:ident: $flags:expr, $doc:literal;)*) => {$(
        #[doc = $doc]
        #[no_mangle]
        pub extern "C" fn $name(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
            if let Some(prev) = set_handler(sig, handler, $flags) {
                return prev;
            }
            static REAL: AtomicUsize = AtomicUsize::new(0);
            let mut f = REAL.load(Ordering::Relaxed);
            if f == 0 {
                f = next_symbol(
                    std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes())
                        .expect("no NUL inside"),
                );
                REAL.store(f, Ordering::Relaxed);
            }
            // SAFETY: f is the C library's definition of this function, same signature.
            unsafe {
                std::mem::transmute::<usize, extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t>(f)(sig, handler)
            }
        }
    )*};
}

signal_like! {
    signal: libc::SA_RESTART, "See signal(2) (glibc's BSD semantics).";
    bsd_signal: libc::SA_RESTART, "See bsd_signal(3).";
    sysv_signal: libc::SA_RESETHAND | libc::SA_NODEFER, "See sysv_signal(3).";
    __sysv_signal: libc::SA_RESETHAND | libc::SA_NODEFER, "glibc's name for sysv_signal.";
    sigset: 0, "See sigset(3) (SIG_HOLD on an owned signal is ignored: it is never blocked).";
}

type MaskFn = unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;

/// `set` without the owned signals when it would block one of them.
fn unblockable(how: c_int, set: *const libc::sigset_t) -> Option<libc::sigset_t> {
    if set.is_null() || how == libc::SIG_UNBLOCK {
        return None;
    }
    // SAFETY: caller's set is valid.
    let mut copy = unsafe { *set };
    let mut changed = false;
    for s in SIGNALS {
        // SAFETY: a local sigset.
        if slot(s).is_some() && unsafe { libc::sigismember(&copy, s) } == 1 {
            // SAFETY: as above.
            unsafe { libc::sigdelset(&mut copy, s) };
            changed = true;
        }
    }
    changed.then_some(copy)
}

/// The C library's `sigprocmask` or `pthread_sigmask`.
fn real_mask(name: &std::ffi::CStr) -> MaskFn {
    static REAL: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
    let cache = &REAL[(name == c"pthread_sigmask") as usize];
    let mut f = cache.load(Ordering::Relaxed);
    if f == 0 {
        f = next_symbol(name);
        cache.store(f, Ordering::Relaxed);
    }
    // SAFETY: f is the C library's definition of this function, same signature.
    unsafe { std::mem::transmute::<usize, MaskFn>(f) }
}

macro_rules! mask_like {
    ($($name:ident, $doc:literal;)*) => {$(
        #[doc = $doc]
        ///
        /// # Safety
        /// `set` and `old` are null or valid.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            how: c_int,
            set: *const libc::sigset_t,
            old: *mut libc::sigset_t,
        ) -> c_int {
            let name = concat!(stringify!($name), "\0");
            let real = real_mask(
                std::ffi::CStr::from_bytes_with_nul(name.as_bytes()).expect("no NUL inside"),
            );
            match unblockable(how, set) {
                // SAFETY: the caller's arguments, the set without the owned signals.
                Some(copy) => unsafe { real(how, &copy, old) },
                // SAFETY: the caller's arguments, unchanged.
                None => unsafe { real(how, set, old) },
            }
        }
    )*};
}

mask_like! {
    sigprocmask, "See sigprocmask(2): never blocks a signal rmem owns.";
    pthread_sigmask, "See pthread_sigmask(3): never blocks a signal rmem owns.";
}
