//! What a fork() child sees of remote memory.
//!
//! The region is mapped `MADV_DONTFORK`, and its pager thread does not exist in a child, so a
//! child cannot share it. Rather than let a child read zeros where data should be, the child
//! keeps the region's address range reserved with no access, and a child that touches it is
//! stopped with a message that says why, whatever it did with SIGSEGV (rmem's handler stays
//! first: signals.rs). fork() followed by exec(), `system()`, `popen()` and
//! `posix_spawn` are unaffected. Allocations in the child are local from then on.

use crate::malloc::FORKED;
use crate::{region_contains, REGION_BASE, REGION_LEN};
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};

/// Exit status of a fork() child that touched its parent's remote memory.
pub const EXIT_FORK_TOUCH: i32 = 70;

/// Register the fork handler (once, from the library constructor).
pub fn install() {
    // SAFETY: registering a plain extern "C" fn without state.
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

extern "C" fn child() {
    let (base, len) = (REGION_BASE.load(Relaxed), REGION_LEN.load(Relaxed));
    if len == 0 {
        return;
    }
    FORKED.store(true, Relaxed);
    rmem_uffd::fds::forget_all();
    rmem_client::region::reserve_no_access(base, len);
}

/// The process that owns the region (set when its runtime starts).
pub static OWNER_PID: AtomicI32 = AtomicI32::new(0);

/// Keep rmem's SIGSEGV handler first from now on (when a runtime starts): a fork() child
/// inherits it, so even glibc's own work in the child before any atfork handler runs (it
/// resets the locks of every stdio FILE, which may be remote) ends with rmem's message, and
/// so does a touch after the child has reset SIGSEGV (signals.rs).
pub fn guard_children() {
    // SAFETY: getpid has no preconditions.
    OWNER_PID.store(unsafe { libc::getpid() }, Relaxed);
    crate::signals::own(libc::SIGSEGV, on_segv, None);
}

/// rmem's part of SIGSEGV: in a fork() child, a touch of the parent's region ends the child.
fn on_segv(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) -> bool {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (addr, code) = unsafe { ((*info).si_addr() as u64, (*info).si_code) };
    // SAFETY: getpid is async-signal-safe.
    if code <= 0 || !region_contains(addr) || unsafe { libc::getpid() } == OWNER_PID.load(Relaxed) {
        return false;
    }
    let mut msg = [0u8; 200];
    let mut n = 0;
    for part in [
        b"rmem: fatal: a fork() child touched its parent's remote memory at 0x".as_slice(),
        &hex(addr),
        b"; remote memory is not shared with fork() children (exec a program, or use threads)\n",
    ] {
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
