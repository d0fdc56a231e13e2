//! Stacks in remote memory: threads on malloc'ed stacks (`pthread_attr_setstack`) and
//! alternate signal stacks (`sigaltstack`).
//!
//! The kernel writes to a stack without a system call the program makes: a signal frame when
//! it delivers a signal, and on a thread's own stack the thread's control block, which holds
//! what the kernel updates on its own (the rseq area on every preemption, the thread id it
//! clears at exit). Where kernel-mode faults are handled (root, /dev/userfaultfd) these
//! writes simply fault the page in. In `UFFD_USER_MODE_ONLY` mode they fail instead, and the
//! kernel kills the thread with SIGSEGV. So in that mode such a stack is pinned
//! (`Runtime::lock`): resident as long as it is allocated, counted against the budget. A
//! thread stack too big to pin whole keeps only its top pinned (the control block and the
//! first frames); signals delivered deeper on it may then still kill it.
//!
//! A runtime may also put a thread's alternate signal stack in remote memory with a raw
//! system call that no wrapper sees: Go's (cgo builds, `--anon-mmap`) takes each thread's 32 KiB
//! signal stack from its heap and sets it with a raw `sigaltstack`, made while every signal is
//! blocked, so the seccomp filter cannot trap it either (a blocked SIGSYS kills). Once that page
//! was evicted, the next signal (Go's preemption SIGURG, or rmem's own SIGSYS) killed the thread.
//! Such runtimes keep an alternate stack a thread already has, so in user-mode-only mode rmem
//! gives every thread one of its own, outside the region, before the program's code runs on it
//! ([`give_signal_stack`]: the first thread when the runtime starts, every later one through
//! [`pthread_create`]); a program that sets its own through the C library's wrapper replaces it,
//! pinned as above.

use crate::io::real;
use crate::{current, malloc::FORKED, region_contains};
use rmem_client::Runtime;
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;

/// Bytes pinned at the top of a thread stack that cannot be pinned whole: glibc's thread
/// control block and static TLS sit there, with room for the first frames.
const STACK_TOP_BYTES: u64 = 64 << 10;

/// The runtime, when `[addr, addr+len)` is remote memory the kernel cannot fault in itself.
fn needs_pin(addr: u64, len: u64) -> Option<&'static Runtime> {
    if len == 0 || FORKED.load(Relaxed) || rmem_client::on_pager_thread() {
        return None;
    }
    if !region_contains(addr) && !region_contains(addr + len - 1) {
        return None;
    }
    current().filter(|rt| !rt.handles_kernel_faults())
}

/// Bytes of the alternate signal stack rmem gives a thread ([`give_signal_stack`]), above one
/// inaccessible guard page. Far more than a signal frame (about 3 KiB with AVX-512 state) and
/// Go's 32 KiB: a handler that ran on the thread's own stack before may be deep. Only what a
/// handler touches becomes resident.
const SIGNAL_STACK_BYTES: usize = 128 << 10;
const GUARD_BYTES: usize = 4096;

thread_local! {
    /// The mapping of the signal stack rmem gave this thread (its guard page's address), 0
    /// when none.
    static OWN_SIGNAL_STACK: OwnSignalStack = const { OwnSignalStack(Cell::new(0)) };
}

struct OwnSignalStack(Cell<usize>);

/// The C library's sigaltstack(2), past rmem's wrapper.
fn real_sigaltstack(new: *const libc::stack_t, old: *mut libc::stack_t) -> c_int {
    let f = real!(
        c"sigaltstack",
        fn(*const libc::stack_t, *mut libc::stack_t) -> c_int
    );
    // SAFETY: the callers pass a valid stack_t or null for each.
    unsafe { f(new, old) }
}

/// Unmap the signal stack mapping at `base` that [`give_signal_stack`] made.
fn unmap_signal_stack(base: *mut c_void) {
    let munmap = real!(c"munmap", fn(*mut c_void, usize) -> c_int);
    // SAFETY: our own mapping, no thread's signal stack any more.
    unsafe { munmap(base, GUARD_BYTES + SIGNAL_STACK_BYTES) };
}

impl Drop for OwnSignalStack {
    /// At the thread's exit: turn the stack off if it is still the thread's, and unmap it.
    fn drop(&mut self) {
        let base = self.0.replace(0);
        if base == 0 {
            return;
        }
        // SAFETY: all-zero is a valid stack_t.
        let mut cur: libc::stack_t = unsafe { std::mem::zeroed() };
        if real_sigaltstack(std::ptr::null(), &mut cur) != 0 {
            return;
        }
        if cur.ss_sp as usize == base + GUARD_BYTES && cur.ss_flags & libc::SS_DISABLE == 0 {
            let off = libc::stack_t {
                ss_sp: std::ptr::null_mut(),
                ss_flags: libc::SS_DISABLE,
                ss_size: 0,
            };
            // It fails (EPERM) while a handler runs on the stack: then the mapping stays.
            if real_sigaltstack(&off, std::ptr::null_mut()) != 0 {
                return;
            }
        }
        unmap_signal_stack(base as *mut c_void);
    }
}

/// Give the calling thread an alternate signal stack outside the region when it has none and
/// the kernel cannot fault remote memory in (see the module's doc). Best effort: a thread
/// left without one is as it was before.
pub(crate) fn give_signal_stack() {
    if FORKED.load(Relaxed) || current().is_none_or(|rt| rt.handles_kernel_faults()) {
        return;
    }
    // SAFETY: all-zero is a valid stack_t.
    let mut cur: libc::stack_t = unsafe { std::mem::zeroed() };
    let queried = real_sigaltstack(std::ptr::null(), &mut cur) == 0;
    // A thread that has one keeps it (the sigaltstack wrapper pinned it if remote).
    if !queried || cur.ss_flags & libc::SS_DISABLE == 0 {
        return;
    }
    let mmap = real!(
        c"mmap",
        fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void
    );
    let len = GUARD_BYTES + SIGNAL_STACK_BYTES;
    // SAFETY: a fresh private anonymous mapping (the C library's mmap: outside the region).
    let p = unsafe {
        mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return;
    }
    let mprotect = real!(c"mprotect", fn(*mut c_void, usize, c_int) -> c_int);
    let ss = libc::stack_t {
        ss_sp: p.wrapping_byte_add(GUARD_BYTES),
        ss_flags: 0,
        ss_size: SIGNAL_STACK_BYTES,
    };
    // SAFETY: the guard page of our own mapping.
    let set = unsafe { mprotect(p, GUARD_BYTES, libc::PROT_NONE) } == 0
        && real_sigaltstack(&ss, std::ptr::null_mut()) == 0;
    if !set {
        unmap_signal_stack(p);
        return;
    }
    OWN_SIGNAL_STACK.with(|o| o.0.set(p as usize));
}

/// What [`pthread_create`] runs on the new thread: a signal stack, then the program's start.
struct Start {
    routine: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
}

extern "C" fn start_with_signal_stack(start: *mut c_void) -> *mut c_void {
    // SAFETY: the Box pthread_create leaked for this thread, taken once.
    let start = unsafe { Box::from_raw(start.cast::<Start>()) };
    crate::guard(give_signal_stack);
    (start.routine)(start.arg)
}

/// See pthread_create(3). In user-mode-only mode the new thread gets a signal stack of its own
/// before the program's start routine runs (see the module's doc).
///
/// # Safety
/// As pthread_create(3).
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    routine: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    let f = real!(
        c"pthread_create",
        fn(
            *mut libc::pthread_t,
            *const libc::pthread_attr_t,
            extern "C" fn(*mut c_void) -> *mut c_void,
            *mut c_void,
        ) -> c_int
    );
    if FORKED.load(Relaxed) || current().is_none_or(|rt| rt.handles_kernel_faults()) {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(thread, attr, routine, arg) };
    }
    let start = Box::into_raw(Box::new(Start { routine, arg }));
    // SAFETY: the caller's arguments, with our start routine and its argument.
    let r = unsafe { f(thread, attr, start_with_signal_stack, start.cast()) };
    if r != 0 {
        // SAFETY: no thread was made: the Box is still ours.
        drop(unsafe { Box::from_raw(start) });
    }
    r
}

/// See pthread_attr_setstack(3). A stack in remote memory is pinned first when the kernel
/// cannot fault it in (see the module's doc).
#[no_mangle]
pub extern "C" fn pthread_attr_setstack(
    attr: *mut libc::pthread_attr_t,
    addr: *mut c_void,
    size: usize,
) -> c_int {
    let f = real!(
        c"pthread_attr_setstack",
        fn(*mut libc::pthread_attr_t, *mut c_void, usize) -> c_int
    );
    if let Some(rt) = needs_pin(addr as u64, size as u64) {
        let (a, n) = (addr as u64, size as u64);
        crate::guard(|| {
            if rt.lock(a, n, true, true).is_err() {
                let top = n.min(STACK_TOP_BYTES);
                if rt.lock(a + n - top, top, true, true).is_err() {
                    crate::report(&format!(
                        "cannot pin the thread stack at {a:#x} in remote memory (the budget is \
                         full of pinned pages); the thread may be killed by SIGSEGV"
                    ));
                }
            }
        });
    }
    // SAFETY: forwarding the caller's arguments unchanged.
    unsafe { f(attr, addr, size) }
}

/// See sigaltstack(2). An alternate signal stack in remote memory is pinned first when the
/// kernel cannot fault it in: it writes each signal frame there itself. Beyond the budget
/// the call fails with ENOMEM and the old stack stays.
#[no_mangle]
pub extern "C" fn sigaltstack(ss: *const libc::stack_t, old: *mut libc::stack_t) -> c_int {
    // SAFETY: the caller passes a valid stack_t or null, as sigaltstack(2) requires.
    if let Some(s) = unsafe { ss.as_ref() } {
        if s.ss_flags & libc::SS_DISABLE == 0 {
            if let Some(rt) = needs_pin(s.ss_sp as u64, s.ss_size as u64) {
                let (a, n) = (s.ss_sp as u64, s.ss_size as u64);
                if let Err(e) = crate::guard(|| rt.lock(a, n, true, true)) {
                    // SAFETY: errno is thread-local.
                    unsafe { *libc::__errno_location() = e };
                    return -1;
                }
            }
        }
    }
    real_sigaltstack(ss, old)
}
