//! Transparent mode: the malloc family, interposed through `LD_PRELOAD`.
//!
//! Allocations of at least `RMEM_MIN_ALLOC` bytes go to the remote region; smaller ones, and
//! every allocation rmem itself makes, go to glibc's own allocator through the `__libc_*`
//! entry points, so rmem never recurses into itself. Frees and reallocs are routed by address:
//! a pointer inside the region is rmem's, any other is glibc's.
//!
//! The whole family is one allocator, whatever else the program is linked with: rmem also
//! defines `malloc_usable_size`, `malloc_trim`, `mallinfo`/`mallinfo2`, `mallopt`,
//! `malloc_stats`, `malloc_info`, jemalloc's `mallocx` API (a program linked with jemalloc may
//! call it) and C++'s `operator new`/`delete` (jemalloc and tcmalloc define their own, which
//! would otherwise serve `new` from them). What does not take a region pointer goes to the
//! *home* allocator: the library that defines the `__libc_malloc` rmem is bound to (glibc, or
//! tcmalloc, which takes over glibc's entry points), looked up in that library, never by
//! `dlsym(RTLD_NEXT)`, which in a program linked with jemalloc finds jemalloc's.
//!
//! The interposers are always exported (a program linked with `-lrmem` gets them too) but
//! only send memory remote in transparent mode, which `rmem run` turns on for the program it
//! starts (see [`crate::transparent_start`]).

use crate::{current, region_contains};
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::{c_char, c_int, c_void, CStr};
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
/// This process is a fork() child without rmem (made without the C library's fork(), or its
/// own pager could not start): the region is not usable here, and nothing may go remote.
pub static FORKED: AtomicBool = AtomicBool::new(false);

/// Transparent mode sends an allocation of `size` bytes remote.
fn wants_remote(size: usize) -> bool {
    TRANSPARENT.load(Relaxed)
        && size >= MIN_ALLOC.load(Relaxed)
        && !FORKED.load(Relaxed)
        && !rmem_client::on_pager_thread()
}

/// A remote allocation for `size` bytes aligned to `align`, when transparent mode wants one;
/// `Some(NULL)` (errno ENOMEM) when it must fail rather than fall back to local memory.
fn remote(size: usize, align: usize) -> Option<*mut c_void> {
    if !wants_remote(size) {
        return None;
    }
    let rt = current()?;
    // Small objects come from power-of-two classes aligned to their size; large ones are
    // page-aligned. Asking for at least `align` bytes therefore gives `align` alignment up to
    // a page; beyond, the region allocator places a run of pages at that alignment.
    let p = if align > rt.page_size() {
        rt.alloc_aligned(size, align)
    } else {
        rt.alloc(size.max(align).max(1))
    }
    .map(|p| p.cast());
    if p.is_none() && !rt.overcommit() {
        // Strict accounting (--no-overcommit): beyond the servers' capacity malloc fails, as
        // Linux's does with overcommit off.
        enomem();
        return Some(null_mut());
    }
    if p.is_none() && !FELL_BACK.swap(true, Relaxed) {
        crate::report(&format!(
            "an allocation of {size} bytes does not fit the remote-memory region ({} bytes, \
             RMEM_REGION); it and any others that do not fit are served from local memory",
            rt.region_bytes()
        ));
    }
    p
}

/// Transparent mode also serves private anonymous mappings from remote memory
/// (`RMEM_ANON_MMAP=1`, `rmem run --anon-mmap`): see [`crate::mem::mmap`].
pub static ANON_MMAP: AtomicBool = AtomicBool::new(false);

/// Remote memory for an anonymous mapping of `len` bytes: page-aligned and zeroed, freed by
/// `munmap` as a malloc'ed block is (its protection is the caller's to set). None when transparent mode does not want it (then the
/// C library maps it); `Some(NULL)` when the mapping must fail (strict accounting).
pub fn remote_mapping(len: usize) -> Option<*mut c_void> {
    if !ANON_MMAP.load(Relaxed) || len == 0 {
        // A zero length is the kernel's EINVAL to give.
        return None;
    }
    // A length that does not round up to whole pages is the kernel's ENOMEM to give.
    remote(len.checked_next_multiple_of(4096)?, 4096)
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

/// Whether every allocation made in a fork child before the program's allocator's own child
/// handler runs goes to glibc's allocator, which glibc's fork() makes usable in the child
/// before any fork handler runs: rmem's own (the `__libc_malloc` rmem calls is defined by
/// the object that defines `glibc_fn`, a function only glibc has, not by a replacement that
/// takes over glibc's entry points, as tcmalloc does), and those the C library makes for a
/// new thread (its TLS, its thread-exit destructors), which go to the `malloc` and `calloc`
/// the process resolves first: rmem's, unless the program's executable defines its own (a
/// replacement allocator linked in statically, as jemalloc is into rustc), which is held
/// until its own child handler has run.
pub fn fork_child_allocates_from_glibc(glibc_fn: *const c_void) -> bool {
    let object = |f: *const c_void| {
        // SAFETY: Dl_info is plain data.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables and fills `info`.
        let found = unsafe { libc::dladdr(f, &mut info) } != 0;
        found.then_some(info.dli_fbase as usize)
    };
    let first = |name: &CStr| {
        // SAFETY: dlsym in the global scope with a NUL-terminated name.
        object(unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) })
    };
    // (Not the address of rmem's `malloc`: taken here, it is the one the process resolves.)
    let rmem =
        object(fork_child_allocates_from_glibc as fn(*const c_void) -> bool as *const c_void);
    let home = object(__libc_malloc as *const c_void);
    home.is_some()
        && home == object(glibc_fn)
        && first(c"malloc") == rmem
        && first(c"calloc") == rmem
}

/// The home allocator's definition of `name`, or 0. The home allocator is the library that
/// defines the `__libc_malloc` rmem calls; `ours` (the interposer of the same name) is never
/// the answer, so a lookup can never recurse into rmem.
fn home_symbol(name: &CStr, ours: usize) -> usize {
    static HOME: AtomicUsize = AtomicUsize::new(0);
    static LIBC: AtomicUsize = AtomicUsize::new(0);
    let open = |cache: &AtomicUsize, file: *const c_char| {
        let mut h = cache.load(Relaxed);
        if h == 0 {
            // SAFETY: dlopen of an already loaded library (RTLD_NOLOAD): it only finds its
            // handle. `file` is a NUL-terminated name.
            h = unsafe { libc::dlopen(file, libc::RTLD_NOLOAD | libc::RTLD_LAZY) } as usize;
            cache.store(h, Relaxed);
        }
        h
    };
    let find = |h: usize| {
        if h == 0 {
            return 0;
        }
        // SAFETY: dlsym on a live handle with a NUL-terminated name.
        let f = unsafe { libc::dlsym(h as *mut c_void, name.as_ptr()) } as usize;
        if f == ours {
            0
        } else {
            f
        }
    };
    // SAFETY: Dl_info is plain data; dladdr fills it for an address inside a loaded object.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let home = if HOME.load(Relaxed) == 0
        // SAFETY: dladdr only reads the loader's tables.
        && unsafe { libc::dladdr(__libc_malloc as *const c_void, &mut info) } != 0
        && !info.dli_fname.is_null()
    {
        open(&HOME, info.dli_fname)
    } else {
        HOME.load(Relaxed)
    };
    match find(home) {
        0 => find(open(&LIBC, c"libc.so.6".as_ptr())),
        f => f,
    }
}

/// Declare `real` as the home allocator's definition of `$name` (resolved once).
macro_rules! home {
    ($name:literal, $ours:expr, fn($($t:ty),*) -> $r:ty) => {{
        static REAL: AtomicUsize = AtomicUsize::new(0);
        let mut f = REAL.load(Relaxed);
        if f == 0 {
            f = home_symbol($name, $ours as *const () as usize);
            REAL.store(f, Relaxed);
        }
        // SAFETY: f is 0 or the home allocator's definition of this very function, with the
        // same signature.
        (f != 0).then(|| unsafe {
            std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(f)
        })
    }};
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
    let Some(real) = home!(
        c"malloc_usable_size",
        malloc_usable_size,
        fn(*mut c_void) -> usize
    ) else {
        crate::report("fatal: the C library has no malloc_usable_size");
        std::process::abort();
    };
    // SAFETY: not rmem's block, so the home allocator's.
    unsafe { real(p) }
}

/// See malloc_trim(3). Only the home allocator keeps free memory to trim: the region's pages
/// go back to the servers when they are freed.
#[no_mangle]
pub extern "C" fn malloc_trim(pad: usize) -> c_int {
    // SAFETY: the home allocator's malloc_trim.
    home!(c"malloc_trim", malloc_trim, fn(usize) -> c_int).map_or(0, |f| unsafe { f(pad) })
}

/// See mallopt(3). Its parameters tune the home allocator; the region has none.
#[no_mangle]
pub extern "C" fn mallopt(param: c_int, value: c_int) -> c_int {
    // SAFETY: the home allocator's mallopt.
    home!(c"mallopt", mallopt, fn(c_int, c_int) -> c_int).map_or(0, |f| unsafe { f(param, value) })
}

/// glibc's `struct mallinfo2`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct Mallinfo2 {
    arena: usize,
    ordblks: usize,
    smblks: usize,
    hblks: usize,
    hblkhd: usize,
    usmblks: usize,
    fsmblks: usize,
    uordblks: usize,
    fordblks: usize,
    keepcost: usize,
}

/// glibc's `struct mallinfo` (the same fields as `int`).
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct Mallinfo {
    arena: c_int,
    ordblks: c_int,
    smblks: c_int,
    hblks: c_int,
    hblkhd: c_int,
    usmblks: c_int,
    fsmblks: c_int,
    uordblks: c_int,
    fordblks: c_int,
    keepcost: c_int,
}

/// Bytes the region's allocations hold, reported by mallinfo as memory in mmapped blocks
/// (`hblkhd`, which programs add to `uordblks` for the total in use).
fn region_bytes() -> usize {
    if FORKED.load(Relaxed) {
        return 0;
    }
    current().map_or(0, |rt| rt.allocated_bytes() as usize)
}

/// See mallinfo2(3): the home allocator's figures, with the region's allocations counted as
/// mmapped memory.
#[no_mangle]
pub extern "C" fn mallinfo2() -> Mallinfo2 {
    // SAFETY: the home allocator's mallinfo2.
    let mut m = home!(c"mallinfo2", mallinfo2, fn() -> Mallinfo2)
        .map_or_else(Mallinfo2::default, |f| unsafe { f() });
    m.hblkhd = m.hblkhd.wrapping_add(region_bytes());
    m
}

/// See mallinfo(3): as [`mallinfo2`], in `int` fields that wrap as glibc's do.
#[no_mangle]
pub extern "C" fn mallinfo() -> Mallinfo {
    // SAFETY: the home allocator's mallinfo.
    let mut m = home!(c"mallinfo", mallinfo, fn() -> Mallinfo)
        .map_or_else(Mallinfo::default, |f| unsafe { f() });
    m.hblkhd = m.hblkhd.wrapping_add(region_bytes() as c_int);
    m
}

/// See malloc_stats(3): the home allocator's report, then one line for the region.
#[no_mangle]
pub extern "C" fn malloc_stats() {
    if let Some(f) = home!(c"malloc_stats", malloc_stats, fn() -> ()) {
        // SAFETY: the home allocator's malloc_stats.
        unsafe { f() };
    }
    crate::report(&format!("remote region: {} bytes in use", region_bytes()));
}

/// See malloc_info(3): the home allocator's XML (the region is not in it).
///
/// # Safety
/// `stream` is an open `FILE *`.
#[no_mangle]
pub unsafe extern "C" fn malloc_info(options: c_int, stream: *mut libc::FILE) -> c_int {
    match home!(
        c"malloc_info",
        malloc_info,
        fn(c_int, *mut libc::FILE) -> c_int
    ) {
        // SAFETY: the home allocator's malloc_info on the caller's stream.
        Some(f) => unsafe { f(options, stream) },
        None => {
            // SAFETY: errno is thread-local.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            -1
        }
    }
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

// jemalloc's non-standard API. A program linked with jemalloc may call it on any block; with
// rmem in front every block is rmem's or the home allocator's, never jemalloc's, so these
// are served here. Flags: the low 6 bits are log2 of the alignment (MALLOCX_LG_ALIGN),
// 0x40 asks for zeroed memory (MALLOCX_ZERO); the tcache and arena bits do not apply.

const MALLOCX_ZERO: c_int = 0x40;

/// The alignment `flags` ask for (at least glibc's).
fn mallocx_align(flags: c_int) -> usize {
    match flags & 0x3f {
        0 => LIBC_ALIGN,
        lg => (1usize << lg).max(LIBC_ALIGN),
    }
}

/// See jemalloc(3) `mallocx`.
#[no_mangle]
pub extern "C" fn mallocx(size: usize, flags: c_int) -> *mut c_void {
    let align = mallocx_align(flags);
    let p = if align > LIBC_ALIGN {
        aligned(align, size.max(1))
    } else {
        malloc(size.max(1))
    };
    if !p.is_null() && flags & MALLOCX_ZERO != 0 && !region_contains(p as u64) {
        // SAFETY: p has at least `size` writable bytes. Region memory is handed out zeroed.
        unsafe { p.cast::<u8>().write_bytes(0, size) };
    }
    p
}

/// See jemalloc(3) `rallocx`: null (and `p` untouched) when it cannot.
///
/// # Safety
/// `p` is a live allocation from this malloc family.
#[no_mangle]
pub unsafe extern "C" fn rallocx(p: *mut c_void, size: usize, flags: c_int) -> *mut c_void {
    let size = size.max(1);
    // SAFETY: p is live (caller's contract).
    let old = unsafe { malloc_usable_size(p) };
    let align = mallocx_align(flags);
    let q = if align > LIBC_ALIGN {
        let q = mallocx(size, flags & !MALLOCX_ZERO);
        if !q.is_null() {
            // SAFETY: both live, distinct blocks of at least the sizes copied.
            unsafe {
                std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.min(size));
                free(p);
            }
        }
        q
    } else {
        // SAFETY: as realloc; size is not 0, so p is never freed without a replacement.
        unsafe { realloc(p, size) }
    };
    if !q.is_null() && flags & MALLOCX_ZERO != 0 && size > old && !region_contains(q as u64) {
        // SAFETY: q has `size` bytes; the ones past the old contents are zeroed.
        unsafe { q.cast::<u8>().add(old).write_bytes(0, size - old) };
    }
    q
}

/// See jemalloc(3) `xallocx`: blocks are never resized in place here, so this returns the
/// block's current usable size (less than asked means "not resized").
///
/// # Safety
/// `p` is a live allocation from this malloc family.
#[no_mangle]
pub unsafe extern "C" fn xallocx(
    p: *mut c_void,
    _size: usize,
    _extra: usize,
    _flags: c_int,
) -> usize {
    // SAFETY: caller's contract.
    unsafe { malloc_usable_size(p) }
}

/// See jemalloc(3) `sallocx`.
///
/// # Safety
/// `p` is a live allocation from this malloc family.
#[no_mangle]
pub unsafe extern "C" fn sallocx(p: *const c_void, _flags: c_int) -> usize {
    // SAFETY: caller's contract.
    unsafe { malloc_usable_size(p.cast_mut()) }
}

/// See jemalloc(3) `dallocx`.
///
/// # Safety
/// `p` is a live allocation from this malloc family.
#[no_mangle]
pub unsafe extern "C" fn dallocx(p: *mut c_void, _flags: c_int) {
    // SAFETY: caller's contract.
    unsafe { free(p) }
}

/// See jemalloc(3) `sdallocx`.
///
/// # Safety
/// `p` is a live allocation from this malloc family.
#[no_mangle]
pub unsafe extern "C" fn sdallocx(p: *mut c_void, _size: usize, _flags: c_int) {
    // SAFETY: caller's contract.
    unsafe { free(p) }
}

/// See jemalloc(3) `nallocx`: a size `mallocx(size, flags)` gives at least (0 on overflow).
#[no_mangle]
pub extern "C" fn nallocx(size: usize, flags: c_int) -> usize {
    size.max(1)
        .checked_next_multiple_of(mallocx_align(flags))
        .unwrap_or(0)
}

// C++ `operator new` and `delete`, all their forms (Itanium ABI names). libstdc++'s own call
// malloc, so they would reach rmem anyway; jemalloc and tcmalloc define theirs, which would
// serve `new` from themselves, never remote. When malloc fails, the C++ runtime's own operator
// (found in libstdc++ or libc++, never by RTLD_NEXT) runs the new-handler and throws
// std::bad_alloc, or returns null for the nothrow forms.

/// The C++ runtime's own definition of `name` (libstdc++'s or libc++'s), or 0.
fn cxx_runtime_symbol(name: &CStr) -> usize {
    for lib in [c"libstdc++.so.6", c"libc++.so.1"] {
        // SAFETY: dlopen of an already loaded library (RTLD_NOLOAD) only finds its handle.
        let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if !h.is_null() {
            // SAFETY: dlsym on a live handle with a NUL-terminated name.
            let f = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
            if f != 0 {
                return f;
            }
        }
    }
    0
}

/// `p`, or what the C++ runtime's own `name` does when rmem's allocation failed.
fn new_or_runtime(p: *mut c_void, name: &CStr, size: usize, align: Option<usize>) -> *mut c_void {
    if !p.is_null() {
        return p;
    }
    let f = cxx_runtime_symbol(name);
    if f == 0 {
        crate::report("fatal: operator new failed and no C++ runtime is loaded to throw bad_alloc");
        std::process::abort();
    }
    // The nothrow forms take an extra `const std::nothrow_t&`, which the Itanium ABI passes as
    // a pointer that these operators never read: passing a null one is harmless.
    // SAFETY: f is the runtime's definition of the same operator, same signature.
    unsafe {
        match align {
            None => std::mem::transmute::<
                usize,
                unsafe extern "C" fn(usize, *const c_void) -> *mut c_void,
            >(f)(size, std::ptr::null()),
            Some(a) => std::mem::transmute::<
                usize,
                unsafe extern "C" fn(usize, usize, *const c_void) -> *mut c_void,
            >(f)(size, a, std::ptr::null()),
        }
    }
}

macro_rules! operator_new {
    ($($name:ident),*) => {$(
        /// C++ `operator new` (see the comment above).
        #[no_mangle]
        pub extern "C" fn $name(size: usize) -> *mut c_void {
            let name = concat!(stringify!($name), "\0");
            let name = CStr::from_bytes_with_nul(name.as_bytes()).expect("no NUL inside");
            new_or_runtime(malloc(size.max(1)), name, size, None)
        }
    )*};
}

macro_rules! operator_new_aligned {
    ($($name:ident),*) => {$(
        /// C++ aligned `operator new` (see the comment above).
        #[no_mangle]
        pub extern "C" fn $name(size: usize, align: usize) -> *mut c_void {
            let name = concat!(stringify!($name), "\0");
            let name = CStr::from_bytes_with_nul(name.as_bytes()).expect("no NUL inside");
            let p = if align.is_power_of_two() { aligned(align.max(LIBC_ALIGN), size.max(1)) } else { null_mut() };
            new_or_runtime(p, name, size, Some(align))
        }
    )*};
}

macro_rules! operator_delete {
    ($($name:ident),*) => {$(
        /// C++ `operator delete` (every form frees by address).
        ///
        /// # Safety
        /// `p` is null or a live allocation from this malloc family.
        #[no_mangle]
        pub unsafe extern "C" fn $name(p: *mut c_void) {
            // SAFETY: caller's contract. The forms with more arguments (size, alignment,
            // nothrow_t) pass them after `p`; the C calling convention lets a callee ignore
            // trailing arguments, and none is needed to free by address.
            unsafe { free(p) }
        }
    )*};
}

operator_new!(_Znwm, _Znam, _ZnwmRKSt9nothrow_t, _ZnamRKSt9nothrow_t);
operator_new_aligned!(
    _ZnwmSt11align_val_t,
    _ZnamSt11align_val_t,
    _ZnwmSt11align_val_tRKSt9nothrow_t,
    _ZnamSt11align_val_tRKSt9nothrow_t
);
operator_delete!(
    _ZdlPv,
    _ZdaPv,
    _ZdlPvm,
    _ZdaPvm,
    _ZdlPvRKSt9nothrow_t,
    _ZdaPvRKSt9nothrow_t,
    _ZdlPvSt11align_val_t,
    _ZdaPvSt11align_val_t,
    _ZdlPvmSt11align_val_t,
    _ZdaPvmSt11align_val_t,
    _ZdlPvSt11align_val_tRKSt9nothrow_t,
    _ZdaPvSt11align_val_tRKSt9nothrow_t
);
