//! fork() without exec: the child gets its parent's remote memory as it was at the fork,
//! copy-on-write, and a pager of its own.
//!
//! Two registrations of atfork handlers. The first, before any other of the process's (so
//! that its prepare handler runs last and its child handler first), from the library's
//! constructor or, where another library registers its handlers first, from that
//! registration, which rmem interposes ([`__register_atfork`]): a library loaded after librmem
//! with no need of it is initialized before it, and its constructor may register handlers that
//! touch remote memory (jemalloc's, linked into rustc: its child handler writes to its arenas,
//! remote under `--anon-mmap`, pages its prepare handler did not touch). The second, the
//! parent and child handlers proper, from the constructor: they run before those of libraries
//! registered later, after those of libraries registered earlier.
//! - prepare (first registration): takes the C library's stdio list lock (glibc takes it
//!   right after the prepare handlers; a thread holding it may be flushing a remote buffer,
//!   which needs the pager), then
//!   [`Runtime::prepare_fork`]: the allocator held, the pager parked with a snapshot of the
//!   servers' pages taken and the region made inheritable. Nothing of rmem changes until the
//!   fork is done, so the child's copy agrees with itself.
//! - parent: the pager goes on; it frees the child's snapshot when the child exits or execs.
//! - child, first registration ([`child_first`]): where what the child's runtime allocates
//!   (rmem's own tables, and the C library's for a new thread) comes from glibc's allocator,
//!   which glibc's fork() makes usable in the child before any handler runs, the runtime
//!   starts here, before every other library's child handler, so that a page theirs touch
//!   comes from the child's snapshot. Where it would come from an allocator held until its
//!   own child handler runs (tcmalloc, which takes over glibc's entry points; jemalloc linked
//!   into the executable, as in rustc, whose `malloc` the C library calls), the region is
//!   registered here with a userfaultfd that raises SIGBUS where the child lacks a page, so
//!   that a handler's touch of one stops the child with a message and status 70, never reads
//!   zeros and never waits for good (docs/configuration.md, fork() children).
//! - child, second registration: otherwise, [`Forking::child`] makes the child's runtime (its
//!   own userfaultfd and pager thread, from its copy of the parked pager) and it becomes
//!   current. Resident pages are the kernel's copy-on-write copies; every other page comes
//!   from the snapshot.
//!
//! A child rmem cannot serve keeps the old guard: a child made without the C library's fork()
//! (a raw clone or `_Fork`: no handler runs, and the region, outside a prepared fork, is not
//! inherited), or one whose own pager could not start (it says why) has the region's range
//! reserved with no access, and a touch there stops it with a message, whatever it did with
//! SIGSEGV (rmem's handler stays first: signals.rs): never zeros where data should be.
//! fork() itself refuses (ENOSYS, with a message) where no child can ever be served: faults
//! delivered by signal. Where the prepare step fails (no pipe: the open-file limit; the pager
//! cannot park), a call of fork() fails with EAGAIN and a message saying why: the kernel has
//! made the child by then, which ends in its handler before any code of the program runs, and
//! the parent reaps it. A fork inside the C library (daemon(), say) cannot be failed that way;
//! its child keeps the guard below.

use crate::io::real;
use crate::malloc::{FORKED, TRANSPARENT};
use crate::{current, region_contains, report, REGION_BASE, REGION_LEN};
use rmem_client::runtime::{ForkError, Forking};
use rmem_uffd::Uffd;
use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::Relaxed};
use std::sync::{Mutex, Once};

/// Exit status of a child without rmem that touched its parent's remote memory.
pub const EXIT_FORK_TOUCH: i32 = 70;

/// This process is a fork() child of a process under rmem: its statistics, counted from the
/// fork, go beside its parent's (`RMEM_STATS_JSON.PID`).
pub static CHILD: AtomicBool = AtomicBool::new(false);

extern "C" {
    // glibc's lock of its list of stdio streams (exported since 2.2.5), taken by fork after
    // the prepare handlers and reset in the child.
    fn _IO_list_lock();
    fn _IO_list_unlock();
}

/// A fork handler, as the C library takes it.
type Handler = Option<unsafe extern "C" fn()>;

/// The C library's registration of fork handlers (what `pthread_atfork` calls).
fn register(prepare: Handler, parent: Handler, child: Handler, dso: *mut c_void) -> c_int {
    let f = real!(
        c"__register_atfork",
        fn(Handler, Handler, Handler, *mut c_void) -> c_int
    );
    // SAFETY: the C library's definition, with the caller's handlers (or rmem's own).
    unsafe { f(prepare, parent, child, dso) }
}

/// Register rmem's first fork handlers, once: from the library's constructor, or from the
/// first registration of another's if that comes first. (rmem's handlers are never
/// unregistered, librmem is never unloaded: no DSO handle.)
pub fn install_first() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        register(Some(prepare), None, Some(child_first), std::ptr::null_mut());
    });
}

/// Register rmem's parent and child handlers (once, from the library's constructor).
pub fn install() {
    install_first();
    let glibc_fn = _IO_list_lock as unsafe extern "C" fn() as *const c_void;
    START_FIRST.store(
        crate::malloc::fork_child_allocates_from_glibc(glibc_fn),
        Relaxed,
    );
    register(None, Some(parent), Some(child), std::ptr::null_mut());
}

/// A fork child's runtime starts in rmem's first child handler, before every other library's
/// (so that theirs find a pager serving the region), where what it allocates comes from
/// glibc's allocator ([`crate::malloc::fork_child_allocates_from_glibc`]): set by
/// [`install`] before it registers the second handler. Otherwise (tcmalloc, or an allocator
/// linked into the executable, held until their own child handlers run) it starts in the
/// second, and the first registers the region to raise SIGBUS meanwhile.
static START_FIRST: AtomicBool = AtomicBool::new(false);

/// See pthread_atfork(3), which calls it: rmem's first handlers are registered before the
/// caller's (see the module's notes).
///
/// # Safety
/// As for the C library's: the handlers are callable at every fork (until `dso` unloads).
#[no_mangle]
pub unsafe extern "C" fn __register_atfork(
    prepare: Handler,
    parent: Handler,
    child: Handler,
    dso: *mut c_void,
) -> c_int {
    install_first();
    register(prepare, parent, child, dso)
}

/// A fork between its prepare handler and its parent or child handler (all three run on the
/// forking thread).
enum Pending {
    /// Prepared: the child gets remote memory.
    Ready(Forking<'static>),
    /// A runtime was running but the child cannot have it: why.
    Refused(String),
}

thread_local! {
    static PENDING: RefCell<Option<Pending>> = const { RefCell::new(None) };
    /// This thread is in [`fork`]: a refused fork can fail there.
    static IN_CALL: Cell<bool> = const { Cell::new(false) };
    /// Why the fork of this thread's [`fork`] call was refused, set by the parent handler.
    static REFUSED: RefCell<Option<String>> = const { RefCell::new(None) };
}

extern "C" fn prepare() {
    let Some(rt) = current() else { return };
    if FORKED.load(Relaxed) {
        return;
    }
    // The slot's first use registers its destructor with the C library, which allocates:
    // before the allocator is held.
    PENDING.with(|_| {});
    // SAFETY: glibc's recursive lock; this thread takes it again in fork and releases both
    // in the parent; the child's copy is reset by glibc.
    unsafe { _IO_list_lock() };
    let pending = crate::guard(|| match rt.prepare_fork() {
        Ok(f) => Pending::Ready(f),
        Err(e) => Pending::Refused(rmem_client::error_chain(&e)),
    });
    PENDING.with(|p| *p.borrow_mut() = Some(pending));
}

extern "C" fn parent() {
    let Some(pending) = PENDING.with(|p| p.borrow_mut().take()) else {
        return;
    };
    match pending {
        Pending::Ready(f) => crate::guard(|| f.parent()),
        Pending::Refused(why) if IN_CALL.get() => REFUSED.with(|r| *r.borrow_mut() = Some(why)),
        Pending::Refused(_) => {}
    }
    // SAFETY: taken in prepare on this thread.
    unsafe { _IO_list_unlock() };
}

/// The first of the child's handlers: the child's runtime where what it allocates comes from
/// glibc's allocator ([`START_FIRST`]); else a userfaultfd that raises SIGBUS where the child
/// lacks a page, so that a touch of one by a handler that runs before the runtime can start
/// stops the child with a message (see the module's notes). Where that cannot be made, the
/// child has no remote memory (its second handler says why).
extern "C" fn child_first() {
    if START_FIRST.load(Relaxed) {
        start_child();
        return;
    }
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        if let Some(Pending::Ready(f)) = p.as_ref() {
            // Allocation-free: the C library's sigaction was resolved when SIGSEGV was taken
            // over, at the runtime's start.
            crate::signals::own(libc::SIGBUS, on_bus_before_runtime, None);
            match crate::guard(|| f.child_sigbus()) {
                Ok(uffd) => {
                    *CHILD_SIGBUS.lock().unwrap_or_else(|e| e.into_inner()) = Some(uffd);
                    BEFORE_RUNTIME.store(true, Relaxed);
                }
                Err(e) => *p = Some(Pending::Refused(rmem_client::error_chain(&e))),
            }
        }
    });
}

/// From [`child_first`] until the child's runtime starts: the userfaultfd that raises SIGBUS
/// where the child lacks a page (a static, not in [`PENDING`]: every thread's static TLS
/// block is carved from its stack, and a program may size its threads' stacks closely).
static CHILD_SIGBUS: Mutex<Option<Uffd>> = Mutex::new(None);

/// [`CHILD_SIGBUS`] is registered over the region: a SIGBUS there is its.
static BEFORE_RUNTIME: AtomicBool = AtomicBool::new(false);

/// rmem's part of SIGBUS in a fork child before its runtime starts: a touch of a page of the
/// region the child lacks (raised by [`CHILD_SIGBUS`]'s userfaultfd) stops it with a message;
/// any other SIGBUS is the program's.
fn on_bus_before_runtime(_sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) -> bool {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (addr, code) = unsafe { ((*info).si_addr() as u64, (*info).si_code) };
    if code <= 0 || !region_contains(addr) || !BEFORE_RUNTIME.load(Relaxed) {
        return false;
    }
    stop_at(
        b"rmem: fatal: a fork() child handler that runs before rmem's can (another allocator's: \
          jemalloc linked into the program, as in rustc, or tcmalloc) touched remote memory at \
          0x",
        addr,
        b", which was not resident at the fork; run without --anon-mmap (see \
          docs/configuration.md, fork() children)\n",
    )
}

/// The second of the child's handlers: the child's runtime, unless the first started it.
extern "C" fn child() {
    if !START_FIRST.load(Relaxed) {
        start_child();
    }
}

/// The child's runtime, from its copy of the parked pager, made current; or, where the child
/// cannot have one, the region reserved with no access.
fn start_child() {
    // Closing it unregisters the region, for the child's own userfaultfd (this thread is the
    // child's only one: nothing touches the region meanwhile).
    if let Some(uffd) = CHILD_SIGBUS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        uffd.close();
    }
    BEFORE_RUNTIME.store(false, Relaxed);
    let pending = PENDING.with(|p| p.borrow_mut().take());
    let (base, len) = (REGION_BASE.load(Relaxed), REGION_LEN.load(Relaxed));
    if len == 0 {
        return;
    }
    CHILD.store(true, Relaxed);
    let why = match pending {
        Some(Pending::Ready(f)) => {
            // The new pager thread allocates before it can serve faults: allocations are local
            // until it says it has started.
            let transparent = TRANSPARENT.swap(false, Relaxed);
            let started =
                crate::guard(|| f.child(Box::new(move || TRANSPARENT.store(transparent, Relaxed))));
            match started {
                Ok(rt) => {
                    crate::make_current(rt);
                    // SAFETY: getpid has no preconditions.
                    OWNER_PID.store(unsafe { libc::getpid() }, Relaxed);
                    return;
                }
                Err(e) => rmem_client::error_chain(&e),
            }
        }
        // SAFETY: _exit ends the child before any code of the program runs in it; the
        // parent's fork() reaps it and fails.
        Some(Pending::Refused(_)) if IN_CALL.get() => unsafe { libc::_exit(EXIT_FORK_TOUCH) },
        Some(Pending::Refused(why)) => why,
        None => {
            // No runtime was running at the fork (stopped by rmem_exit): its range is not
            // the child's, and may hold a mapping of the program's by now.
            FORKED.store(true, Relaxed);
            rmem_uffd::fds::forget_all();
            return;
        }
    };
    report(&format!(
        "this fork() child has no remote memory: {why}; touching its parent's stops it"
    ));
    FORKED.store(true, Relaxed);
    rmem_uffd::fds::forget_all();
    rmem_client::region::reserve_no_access(base, len);
}

/// See fork(2). Refused (ENOSYS, with a message) where rmem can never serve a fork child:
/// with faults delivered by signal (`RMEM_FAULT_DELIVERY=signal`, experimental); fails with
/// EAGAIN and a message where this fork's child cannot be served (see the module's notes).
#[no_mangle]
pub extern "C" fn fork() -> libc::pid_t {
    if let Some(rt) = current() {
        if rt.fault_delivery() == "signal" && !FORKED.load(Relaxed) {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Relaxed) {
                report(&format!("fork() refused (ENOSYS): {}", ForkError::BySignal));
            }
            // SAFETY: errno is thread-local.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            return -1;
        }
    }
    let f = real!(c"fork", fn() -> libc::pid_t);
    IN_CALL.set(true);
    // SAFETY: the C library's fork, which runs the handlers above.
    let pid = unsafe { f() };
    IN_CALL.set(false);
    let refused = REFUSED.with(|r| r.borrow_mut().take());
    let (Some(why), true) = (refused, pid > 0) else {
        return pid; // served, or the kernel's own failure (its errno)
    };
    // The child ended in its handler: reap it (ECHILD if the program ignores SIGCHLD).
    // SAFETY: waitpid on our own child, no status wanted.
    while unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::__WALL) } < 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
    {}
    report(&format!("fork() failed (EAGAIN): {why}"));
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = libc::EAGAIN };
    -1
}

/// The process that owns the region (set when its runtime starts, and in a fork() child once
/// its own has).
pub static OWNER_PID: AtomicI32 = AtomicI32::new(0);

/// Keep rmem's SIGSEGV handler first from now on (when a runtime starts): a fork() child
/// without rmem inherits it, so a touch there ends with rmem's message, also after the child
/// has reset SIGSEGV (signals.rs).
pub fn guard_children() {
    // SAFETY: getpid has no preconditions.
    OWNER_PID.store(unsafe { libc::getpid() }, Relaxed);
    crate::signals::own(libc::SIGSEGV, on_segv, None);
}

/// rmem's part of SIGSEGV: in a child without rmem, a touch of the parent's region ends it.
fn on_segv(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) -> bool {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (addr, code) = unsafe { ((*info).si_addr() as u64, (*info).si_code) };
    // SAFETY: getpid is async-signal-safe.
    if code <= 0 || !region_contains(addr) || unsafe { libc::getpid() } == OWNER_PID.load(Relaxed) {
        return false;
    }
    stop_at(
        b"rmem: fatal: a child without rmem touched its parent's remote memory at 0x",
        addr,
        b" (it was made without the C library's fork(), or its rmem could not start: see above)\n",
    )
}

/// End this fork child with status [`EXIT_FORK_TOUCH`] and the message `before`, `addr` in
/// hex, `after` (async-signal-safe: from rmem's part of a signal handler).
fn stop_at(before: &[u8], addr: u64, after: &[u8]) -> ! {
    let mut msg = [0u8; 400];
    let mut n = 0;
    for part in [before, &hex(addr), after] {
        let k = part.len().min(msg.len() - n);
        msg[n..n + k].copy_from_slice(&part[..k]);
        n += k;
    }
    // SAFETY: write(2) and _exit(2) are async-signal-safe; msg is a valid buffer of n bytes.
    unsafe {
        libc::syscall(libc::SYS_write, 2, msg.as_ptr(), n);
        libc::_exit(EXIT_FORK_TOUCH);
    }
}

fn hex(v: u64) -> [u8; 16] {
    let mut out = [b'0'; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let d = (v >> (60 - 4 * i)) & 0xf;
        *o = b"0123456789abcdef"[d as usize];
    }
    out
}
