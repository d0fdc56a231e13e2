//! What a touch of remote memory that can no longer be served does: after a lost server
//! (the region was sealed with no access) and in a fork() child whose rmem could not take the
//! region over (fork.rs; the region is not inherited then). Both end the process with a message naming the cause, rather than a bare
//! "Segmentation fault", or zeros, or another mapping's data.
//!
//! The records are fixed arrays of atomics: the SIGSEGV handler and the fork() child
//! handler may only read memory and make async-signal-safe calls.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

/// Regions of sessions alive at once (a closed session lives on while its arrays do).
const SLOTS: usize = 16;

/// Exit status after a touch of a lost server's memory (as the C library's).
const EXIT_SERVER_LOST: i32 = rmem_client::EXIT_SERVER_LOST;
/// Exit status of a fork() child that touched its parent's remote memory (as librmem's).
const EXIT_FORK_TOUCH: i32 = 70;

static BASE: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static LEN: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static LOST: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
/// The process each region's runtime serves (a fork() child that took one over: fork.rs).
static PID: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];
/// The SIGSEGV action before ours, run for every fault that is not rmem's.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

pub fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// Record a new region; the SIGSEGV handler is installed with the first.
pub fn watch(base: u64, len: u64) -> Result<usize, String> {
    install_segv_handler();
    for i in 0..SLOTS {
        if LEN[i].compare_exchange(0, len, Relaxed, Relaxed).is_ok() {
            BASE[i].store(base, Relaxed);
            PID[i].store(getpid(), Relaxed);
            LOST[i].store(false, Relaxed);
            return Ok(i);
        }
    }
    Err(format!("{SLOTS} regions are recorded already"))
}

/// The region of `slot` was unmapped with its runtime.
pub fn forget(slot: usize) {
    LEN[slot].store(0, Relaxed);
}

/// The region of `slot` was sealed after a lost server.
pub fn mark_lost(slot: usize) {
    LOST[slot].store(true, Relaxed);
}

/// In a fork() child, the region of `slot` is served by this process now.
pub fn adopt(slot: usize) {
    PID[slot].store(getpid(), Relaxed);
}

/// In a fork() child, keep the range of every region this process does not serve reserved
/// with no access: it was not inherited (`MADV_DONTFORK`), and something the child maps there
/// later would otherwise be read through the parent's arrays.
pub fn guard_unserved() {
    let me = getpid();
    for i in 0..SLOTS {
        let len = LEN[i].load(Relaxed);
        if len == 0 || LOST[i].load(Relaxed) || PID[i].load(Relaxed) == me {
            continue; // a lost region is sealed already, and the seal is inherited
        }
        rmem_client::region::reserve_no_access(BASE[i].load(Relaxed), len);
    }
}

fn install_segv_handler() {
    PREVIOUS.get_or_init(|| {
        // SAFETY: sigaction structs are plain data for which zeroes are valid; installing a
        // handler that only reads atomics and calls async-signal-safe functions.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_segv as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGSEGV, &new, &mut old);
            old
        }
    });
}

extern "C" fn on_segv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to SA_SIGINFO handlers.
    let (addr, code) = unsafe { ((*info).si_addr() as u64, (*info).si_code) };
    if code > 0 {
        for i in 0..SLOTS {
            let len = LEN[i].load(Relaxed);
            if len == 0 || addr.wrapping_sub(BASE[i].load(Relaxed)) >= len {
                continue;
            }
            if getpid() != PID[i].load(Relaxed) {
                die(
                    b"rmem: fatal: a fork() child touched remote memory its rmem could not \
                      take over at the fork (see the message then)\n",
                    EXIT_FORK_TOUCH,
                );
            }
            if LOST[i].load(Relaxed) {
                die(
                    b"rmem: fatal: a remote array was touched after its memory server was lost \
                      (see above); this happened inside C code (numpy), where no Python \
                      exception can be raised\n",
                    EXIT_SERVER_LOST,
                );
            }
        }
    }
    let Some(prev) = PREVIOUS.get() else { return };
    match prev.sa_sigaction {
        libc::SIG_DFL | libc::SIG_IGN => {
            // SAFETY: restoring the default action; the fault recurs on return and the kernel
            // then acts as if rmem had never been here.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        f if prev.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous handler was installed as an SA_SIGINFO handler with this
            // signature; it gets the kernel's arguments unchanged.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(f) };
            f(sig, info, ctx)
        }
        f => {
            // SAFETY: as above, for a handler installed without SA_SIGINFO.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(f) };
            f(sig)
        }
    }
}

fn die(msg: &[u8], status: i32) -> ! {
    // SAFETY: write(2) and _exit(2) are async-signal-safe; msg is a valid buffer.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(status)
    }
}
