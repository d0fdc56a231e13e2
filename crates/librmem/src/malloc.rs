//! Transparent mode: the malloc family, interposed through `LD_PRELOAD`.
//!
//! Allocations of at least `RMEM_MIN_ALLOC` bytes go to the remote region; smaller ones, and
//! every allocation rmem itself makes, go to glibc's own allocator through the `__libc_*`
//! entry points, so rmem never recurses into itself. Frees and reallocs are routed by address:
//! a pointer inside the region is rmem's, any other is glibc's.
//!
//! The interposers are always exported (a program linked with `-lrmem` gets them too) but
//! only send memory remote in transparent mode, which `rmem run` turns on for the program it
//! starts (see [`crate::transparent_start`]).

use crate::{current, region_contains};
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// Alignment glibc's malloc guarantees on x86-64 and aarch64.
const LIBC_ALIGN: usize = 16;

/// rmem's own allocations (the runtime, its tables, its threads' buffers) use glibc directly,
/// never the interposed `malloc`.
pub struct LibcAlloc;

// SAFETY: every method forwards to glibc's allocator, which satisfies the GlobalAlloc contract
// for the alignments it is asked for (memalign for those above LIBC_ALIGN).
unsafe impl GlobalAlloc for LibcAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain glibc allocation calls.
        unsafe {
            if l.align() <= LIBC_ALIGN {
                __libc_malloc(l.size()).cast()
            } else {
                __libc_memalign(l.align(), l.size()).cast()
            }
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
        // SAFETY: p came from one of the glibc calls above.
        unsafe { __libc_free(p.cast()) }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.align() <= LIBC_ALIGN {
            // SAFETY: plain glibc allocation call.
            return unsafe { __libc_calloc(1, l.size()).cast() };
        }
        // SAFETY: alloc returns null or l.size() writable bytes.
        unsafe {
            let p = self.alloc(l);
            if !p.is_null() {
                p.write_bytes(0, l.size());
            }
            p
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if l.align() <= LIBC_ALIGN {
            // SAFETY: p came from __libc_malloc/__libc_calloc with the same alignment class.
            return unsafe { __libc_realloc(p.cast(), new).cast() };
        }
        // SAFETY: new block of `new` bytes; copy the smaller size; free the old one.
        unsafe {
            let q = self.alloc(Layout::from_size_align_unchecked(new, l.align()));
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(new));
                __libc_free(p.cast());
            }
            q
        }
    }
}

/// Transparent mode is on in this process.
pub static TRANSPARENT: AtomicBool = AtomicBool::new(false);
/// Smallest allocation that goes remote in transparent mode.
pub static MIN_ALLOC: AtomicUsize = AtomicUsize::new(crate::MIN_ALLOC_DEFAULT);
/// This process is a fork() child of the process that owns the region: the region is not
/// mapped here, and nothing may go remote.
pub static FORKED: AtomicBool = AtomicBool::new(false);

/// Transparent mode sends an allocation of `size` bytes remote.
fn wants_remote(size: usize) -> bool {
    TRANSPARENT.load(Relaxed)
        && size >= MIN_ALLOC.load(Relaxed)
        && !FORKED.load(Relaxed)
        && !rmem_client::on_pager_thread()
}

/// A remote allocation for `size` bytes aligned to `align`, when transparent mode wants one.
fn remote(size: usize, align: usize) -> Option<*mut c_void> {
    if !wants_remote(size) {
        return None;
    }
    let rt = current()?;
    if align > rt.page_size() {
        return None;
    }
    // Small objects come from power-of-two classes aligned to their size; large ones are
    // page-aligned. Asking for at least `align` bytes therefore gives `align` alignment.
    let p = rt.alloc(size.max(align).max(1)).map(|p| p.cast());
    if p.is_none() && !FELL_BACK.swap(true, Relaxed) {
        crate::report(&format!(
            "an allocation of {size} bytes does not fit the memory servers' remaining capacity; \
             it and any others that do not fit are served from local memory \
             (give the servers more capacity: --server-capacity or the hosts file)"
        ));
    }
    p
}

/// An allocation has fallen back to local memory (reported once).
static FELL_BACK: AtomicBool = AtomicBool::new(false);

fn enomem() {
    // SAFETY: errno is thread-local; setting it is always allowed.
    unsafe { *libc::__errno_location() = libc::ENOMEM };
}

/// See malloc(3).
#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    match remote(size, LIBC_ALIGN) {
        Some(p) => p,
        // SAFETY: glibc's allocator.
        None => unsafe { __libc_malloc(size) },
    }
}

/// See calloc(3). Remote memory is always handed out zeroed.
#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        enomem();
        return null_mut();
    };
    match remote(total, LIBC_ALIGN) {
        Some(p) => p,
        // SAFETY: glibc's allocator.
        None => unsafe { __libc_calloc(n, size) },
    }
}

/// See free(3).
///
/// # Safety
/// `p` is null or a live allocation from this malloc family.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    if region_contains(p as u64) {
        if FORKED.load(Relaxed) {
            // The parent owns the region; a fork child's frees of it are no-ops.
            return;
        }
        if let Some(rt) = current() {
            if let Err(e) = rt.free(p.cast()) {
                crate::report(&format!("free({p:p}): {e}; ignored"));
            }
        }
        return;
    }
    // SAFETY: not ours, so glibc's.
    unsafe { __libc_free(p) }
}

/// Usable size of glibc's block `p`, through glibc's own `malloc_usable_size`.
fn libc_usable_size(p: *mut c_void) -> usize {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let mut f = REAL.load(Relaxed);
    if f == 0 {
        f = crate::io::next_symbol(c"malloc_usable_size");
        REAL.store(f, Relaxed);
    }
    // SAFETY: f is glibc's malloc_usable_size, resolved by dlsym(RTLD_NEXT).
    unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void) -> usize>(f)(p) }
}

/// See malloc_usable_size(3).
///
/// # Safety
/// `p` is null or a live allocation from this malloc family.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if region_contains(p as u64) {
        return current()
            .and_then(|rt| rt.usable_size(p.cast()))
            .unwrap_or(0);
    }
    libc_usable_size(p)
}

/// See realloc(3).
///
/// # Safety
/// `p` is null or a live allocation from this malloc family.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(size);
    }
    if size == 0 {
        // SAFETY: p is live (caller's contract).
        unsafe { free(p) };
        return null_mut();
    }
    let ours = region_contains(p as u64);
    if !ours && !wants_remote(size) {
        // SAFETY: glibc's block, staying with glibc.
        return unsafe { __libc_realloc(p, size) };
    }
    // SAFETY: p is live; both usable sizes are of live blocks.
    let old = unsafe { malloc_usable_size(p) };
    if ours && size <= old {
        return p;
    }
    let q = malloc(size);
    if q.is_null() {
        return null_mut();
    }
    // SAFETY: q has at least `size` bytes, p at least `old`; they do not overlap. The copy
    // faults remote pages in on this thread, as any access would.
    unsafe {
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.min(size));
        free(p);
    }
    q
}

/// See reallocarray(3).
///
/// # Safety
/// As [`realloc`].
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: forwarded contract.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            enomem();
            null_mut()
        }
    }
}

fn aligned(align: usize, size: usize) -> *mut c_void {
    match remote(size, align) {
        Some(p) => p,
        // SAFETY: glibc's allocator.
        None => unsafe { __libc_memalign(align, size) },
    }
}

/// See posix_memalign(3).
///
/// # Safety
/// `out` points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<usize>()) {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: caller's contract.
    unsafe { out.write(p) };
    0
}

/// See aligned_alloc(3).
#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return null_mut();
    }
    aligned(align, size)
}

/// See memalign(3).
#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    aligned(align.max(1).next_power_of_two(), size)
}

const SYS_PAGE: usize = 4096;

/// See valloc(3).
#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(SYS_PAGE, size)
}

/// See pvalloc(3).
#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    aligned(SYS_PAGE, size.div_ceil(SYS_PAGE).max(1) * SYS_PAGE)
}
