//! The memory calls a program makes on remote memory, with the meaning Linux gives them.
//!
//! The region is one mapping that the pager owns: the kernel must never drop or move its
//! pages, or change their protection, behind the pager, so these calls do not reach the
//! kernel for the region as the program made them. Each does what Linux promises through
//! the runtime instead: `madvise` (MADV_DONTNEED zeroes, MADV_FREE frees whole pages, other
//! advice is accepted and ignored), `munmap` (the pages are freed; a block's tail goes back to
//! the allocator), `mremap` (shrunk in place, grown by moving) and `mprotect` (done by the
//! pager, kept across evictions). The parts of a range outside the region go to the C library
//! as they are. A raw system call bypasses all this: see the pager's missing-piece path for
//! what it does with a raw madvise.

use crate::io::real;
use crate::{current, malloc::FORKED, REGION_BASE, REGION_LEN};
use rmem_client::Runtime;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The kernel's page size: the unit of every address and length these calls take.
const PIECE: u64 = 4096;
/// MADV_DONTNEED_LOCKED (Linux 5.18), missing from older libc headers.
const MADV_DONTNEED_LOCKED: c_int = 24;

fn set_errno(e: c_int) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = e };
}

/// The part of `[addr, addr+len)` inside the region (`len` rounded up to whole pieces, as
/// the kernel does), with the runtime that owns it; None when the range misses the region
/// or the call is not the program's (the pager thread, a fork child).
fn region_part(addr: *mut c_void, len: usize) -> Option<(&'static Runtime, u64, u64)> {
    let (base, rlen) = (REGION_BASE.load(Relaxed), REGION_LEN.load(Relaxed));
    let start = addr as u64;
    let end = start.checked_add((len as u64).div_ceil(PIECE) * PIECE)?;
    let (a, b) = (start.max(base), end.min(base + rlen));
    if a >= b || FORKED.load(Relaxed) || rmem_client::on_pager_thread() {
        return None;
    }
    Some((current()?, a, b))
}

/// Forward `[start, end)` less the region part `[a, b)` to `f`; the first failure wins.
fn outside(start: u64, end: u64, a: u64, b: u64, mut f: impl FnMut(u64, u64) -> c_int) -> c_int {
    let mut r = 0;
    if start < a {
        r = f(start, a - start);
    }
    if r == 0 && b < end {
        r = f(b, end - b);
    }
    r
}

/// See madvise(2). On the region: MADV_DONTNEED (and MADV_DONTNEED_LOCKED) make the range
/// read as zero, MADV_FREE frees its whole pages (Linux may keep or zero freed memory; rmem
/// frees it at once), and any other advice is accepted and ignored: it would split the
/// region's mapping into pieces a page can straddle (numpy asks for MADV_HUGEPAGE on its
/// large arrays), and the pager decides what is resident.
#[no_mangle]
pub extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    let real = || real!(c"madvise", fn(*mut c_void, usize, c_int) -> c_int);
    let Some((rt, a, b)) = region_part(addr, len) else {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { real()(addr, len, advice) };
    };
    if !(addr as u64).is_multiple_of(PIECE) {
        set_errno(libc::EINVAL);
        return -1;
    }
    crate::guard(|| match advice {
        libc::MADV_DONTNEED | MADV_DONTNEED_LOCKED => rt.discard(a, b - a, true),
        libc::MADV_FREE => rt.discard(a, b - a, false),
        _ => {}
    });
    let end = addr as u64 + (len as u64).div_ceil(PIECE) * PIECE;
    outside(addr as u64, end, a, b, |s, n| {
        // SAFETY: the caller's advice on the part of its range outside the region.
        unsafe { real()(s as *mut c_void, n as usize, advice) }
    })
}

/// See munmap(2). On the region the memory is freed (`Runtime::unmap`): a malloc'ed block
/// unmapped from its start is freed, its tail unmapped goes back to the allocator. The range
/// stays mapped, so a later touch reads zeros where Linux raises SIGSEGV.
#[no_mangle]
pub extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    let real = || real!(c"munmap", fn(*mut c_void, usize) -> c_int);
    let Some((rt, a, b)) = region_part(addr, len) else {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { real()(addr, len) };
    };
    if !(addr as u64).is_multiple_of(PIECE) {
        set_errno(libc::EINVAL);
        return -1;
    }
    crate::guard(|| rt.unmap(a, b - a));
    let end = addr as u64 + (len as u64).div_ceil(PIECE) * PIECE;
    outside(addr as u64, end, a, b, |s, n| {
        // SAFETY: the caller's own mapping outside the region.
        unsafe { real()(s as *mut c_void, n as usize) }
    })
}

/// The C library's mremap, called with the optional fifth argument always present.
fn real_mremap(
) -> unsafe extern "C" fn(*mut c_void, usize, usize, c_int, *mut c_void) -> *mut c_void {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let mut f = REAL.load(Relaxed);
    if f == 0 {
        f = crate::io::next_symbol(c"mremap");
        REAL.store(f, Relaxed);
    }
    // SAFETY: f is glibc's mremap. It is variadic, reading `new_address` only with
    // MREMAP_FIXED; on x86-64 (and aarch64) a variadic pointer argument travels in the same
    // register as a fixed one, so calling it with five fixed arguments is the same call.
    unsafe {
        std::mem::transmute::<
            usize,
            unsafe extern "C" fn(*mut c_void, usize, usize, c_int, *mut c_void) -> *mut c_void,
        >(f)
    }
}

/// See mremap(2). Declared with its optional fifth argument fixed (Rust cannot define a C
/// variadic function): on x86-64 and aarch64 the fifth argument is read from the register
/// where a caller that passes it puts it, and only used with MREMAP_FIXED, as in glibc.
///
/// On the region: a range shrinks in place (its tail is freed as by `munmap`) and grows only
/// by moving (MREMAP_MAYMOVE) to a new block of remote memory, the old range then freed;
/// without MREMAP_MAYMOVE growing fails with ENOMEM, which Linux may answer too. Moving a
/// range of the region to a fixed address, or anything else into the region, fails with
/// EINVAL.
#[no_mangle]
pub extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let fixed = flags & (libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0;
    if fixed && region_part(new_addr, new_len).is_some() {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    let Some((rt, a, b)) = region_part(old, old_len) else {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { real_mremap()(old, old_len, new_len, flags, new_addr) };
    };
    let old_end = old as u64 + (old_len as u64).div_ceil(PIECE) * PIECE;
    if (a, b) != (old as u64, old_end) {
        // Part in the region, part outside: no single mapping to resize.
        set_errno(libc::EFAULT);
        return libc::MAP_FAILED;
    }
    if fixed || old_len == 0 || new_len == 0 || !(old as u64).is_multiple_of(PIECE) {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    let new_len = (new_len as u64).div_ceil(PIECE) * PIECE;
    let may_move = flags & libc::MREMAP_MAYMOVE != 0;
    match crate::guard(|| rt.remap(a, b - a, new_len, may_move)) {
        Some(p) => p as *mut c_void,
        None => {
            set_errno(libc::ENOMEM);
            libc::MAP_FAILED
        }
    }
}

/// See mprotect(2). On the region the pager changes the protection (`Runtime::protect`), so
/// that it stays through evictions and fetches: a write to a read-only page, or any access
/// to an inaccessible one, is the program's SIGSEGV, with the address, as Linux gives.
#[no_mangle]
pub extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    let real = || real!(c"mprotect", fn(*mut c_void, usize, c_int) -> c_int);
    let Some((rt, a, b)) = region_part(addr, len) else {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { real()(addr, len, prot) };
    };
    if !(addr as u64).is_multiple_of(PIECE) {
        set_errno(libc::EINVAL);
        return -1;
    }
    if let Err(e) = crate::guard(|| rt.protect(a, b - a, prot)) {
        set_errno(e);
        return -1;
    }
    let end = addr as u64 + (len as u64).div_ceil(PIECE) * PIECE;
    outside(addr as u64, end, a, b, |s, n| {
        // SAFETY: the caller's own mapping outside the region.
        unsafe { real()(s as *mut c_void, n as usize, prot) }
    })
}
