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

use crate::io::real;
use crate::{current, malloc::FORKED, region_contains};
use rmem_client::Runtime;
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
    let f = real!(
        c"sigaltstack",
        fn(*const libc::stack_t, *mut libc::stack_t) -> c_int
    );
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
    // SAFETY: forwarding the caller's arguments unchanged.
    unsafe { f(ss, old) }
}
