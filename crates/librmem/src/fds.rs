//! The descriptor calls that could reach rmem's own descriptors.
//!
//! rmem's private descriptors live in the pager's own table and cannot be reached; its shared
//! ones (the pager's wake-up eventfds) sit in the program's table at reserved numbers
//! (`rmem_uffd::fds`). These interposers give the program what it would get if those were not
//! there: `close` of one is EBADF, `dup2`/`dup3` from one is EBADF, and `close_range` and
//! `closefrom` close everything else in their range. A `dup2` *onto* one (possible only where
//! the program raised its open-file limit past the range, or the limit left no room above it)
//! moves rmem's descriptor to another reserved number first; only the fault-by-signal wake-up
//! (experimental mode) cannot move, and that `dup2` fails with EBUSY. In a fork() child, whose
//! pager does not exist, every call passes straight through.

use crate::io::real;
use crate::malloc::FORKED;
use rmem_uffd::fds::{is_rmem, make_way, range_start, SLOTS};
use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering::Relaxed;

fn guarded(fd: c_int) -> bool {
    !FORKED.load(Relaxed) && is_rmem(fd)
}

fn fail(err: c_int) -> c_int {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = err };
    -1
}

/// See close(2).
#[no_mangle]
pub extern "C" fn close(fd: c_int) -> c_int {
    if guarded(fd) {
        return fail(libc::EBADF);
    }
    let f = real!(c"close", fn(c_int) -> c_int);
    // SAFETY: forwarding the caller's arguments to the C library.
    unsafe { f(fd) }
}

fn dup_check(old: c_int, new: c_int) -> Option<c_int> {
    if guarded(old) {
        Some(fail(libc::EBADF))
    } else if guarded(new) && !make_way(new) {
        Some(fail(libc::EBUSY))
    } else {
        None
    }
}

/// See dup2(2).
#[no_mangle]
pub extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if let Some(r) = dup_check(old, new) {
        return r;
    }
    let f = real!(c"dup2", fn(c_int, c_int) -> c_int);
    // SAFETY: forwarding the caller's arguments to the C library.
    unsafe { f(old, new) }
}

/// See dup3(2).
#[no_mangle]
pub extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if let Some(r) = dup_check(old, new) {
        return r;
    }
    let f = real!(c"dup3", fn(c_int, c_int, c_int) -> c_int);
    // SAFETY: forwarding the caller's arguments to the C library.
    unsafe { f(old, new, flags) }
}

/// `close_range(first, last, flags)` over `[first, last]` less rmem's shared descriptors.
fn close_range_around(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: the raw system call: glibc's closefrom calls it internally too.
    let sys = |a: c_uint, b: c_uint| unsafe {
        libc::syscall(libc::SYS_close_range, a, b, flags as c_uint) as c_int
    };
    if FORKED.load(Relaxed) {
        return sys(first, last);
    }
    let lo = range_start() as c_uint;
    let mut from = first;
    for fd in lo..lo + SLOTS as c_uint {
        if fd < from || fd > last || !is_rmem(fd as c_int) {
            continue;
        }
        if fd > from {
            let r = sys(from, fd - 1);
            if r != 0 {
                return r;
            }
        }
        from = fd + 1;
    }
    if from <= last && from >= first {
        sys(from, last)
    } else {
        0
    }
}

/// See close_range(2).
#[no_mangle]
pub extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if first > last {
        return fail(libc::EINVAL);
    }
    close_range_around(first, last, flags)
}

/// See closefrom(3).
#[no_mangle]
pub extern "C" fn closefrom(low: c_int) {
    if close_range_around(low.max(0) as c_uint, c_uint::MAX, 0) == 0 {
        return;
    }
    // No close_range in this kernel: one close per open descriptor, as glibc's fallback does.
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let open: Vec<c_int> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd >= low)
        .collect();
    for fd in open {
        close(fd);
    }
}
