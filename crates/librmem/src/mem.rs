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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

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

/// The protection of a private anonymous mapping rmem serves from the region with
/// `--anon-mmap`, or None when the kernel keeps it. Two kinds go remote: a read-write mapping
/// at no particular address (what a program's own allocator asks for: CPython's arenas,
/// OpenBLAS's buffers), and an inaccessible reservation (PROT_NONE) at any address (a
/// managed runtime's heap: the JVM and V8 reserve address space so and make it accessible
/// piece by piece with `mprotect` or `mmap(MAP_FIXED)`, which then act on the region). A
/// reservation's address hint is not honored, as Linux may not honor one: the JVM then tries
/// its other addresses and at last takes one anywhere. Shared mappings (shared with fork
/// children), file mappings, executable or read-only ones, fixed addresses, stacks, huge
/// pages and MAP_LOCKED (resident at once, never paged) stay with the kernel.
fn remote_prot(addr: *mut c_void, prot: c_int, flags: c_int) -> Option<c_int> {
    let others = libc::MAP_FIXED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_GROWSDOWN
        | libc::MAP_STACK
        | libc::MAP_HUGETLB
        | libc::MAP_LOCKED
        | libc::MAP_32BIT;
    let private_anon = flags & libc::MAP_TYPE == libc::MAP_PRIVATE
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & others == 0;
    let kind =
        (prot == libc::PROT_READ | libc::PROT_WRITE && addr.is_null()) || prot == libc::PROT_NONE;
    (private_anon && kind).then_some(prot)
}

/// See mmap(2). With `RMEM_ANON_MMAP=1` in transparent mode, a private anonymous mapping of
/// at least `--min-alloc` bytes ([`remote_prot`]) is remote memory, zeroed and page-aligned,
/// as a large malloc'ed block is; `munmap`, `mremap`, `madvise` and `mprotect` then act on it
/// as they do on the region. A fixed mapping over the region is [`fixed_on_region`]'s.
/// Everything else is the C library's mmap.
#[no_mangle]
pub extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    if flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0 {
        if let Some((rt, a, b)) = region_part(addr, len) {
            return fixed_on_region(rt, addr, len, prot, flags, (fd, off), (a, b));
        }
    } else if let Some(prot) = remote_prot(addr, prot, flags) {
        if let Some(p) = remote_with(len, prot) {
            return p;
        }
    }
    let real = real!(
        c"mmap",
        fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void
    );
    // SAFETY: forwarding the caller's arguments unchanged.
    unsafe { real(addr, len, prot, flags, fd, off) }
}

/// Remote memory for a mapping of `len` bytes with protection `prot`, or None when the
/// kernel is to map it. A read-write mapping that strict accounting (`--no-overcommit`) cannot
/// fit fails (MAP_FAILED); a reservation then goes to the kernel, which does not count
/// inaccessible memory either. So does a reservation larger than every server holds: that is
/// address space, not memory the program can fill (ZGC reserves views of 94 GiB at fixed
/// addresses, maps shared memory into them, and tries other addresses until the kernel gives
/// the one asked).
fn remote_with(len: usize, prot: c_int) -> Option<*mut c_void> {
    if prot == libc::PROT_READ | libc::PROT_WRITE {
        let p = crate::malloc::remote_mapping(len)?;
        return Some(if p.is_null() { libc::MAP_FAILED } else { p });
    }
    let rt = current()?;
    if round_up(len) > rt.capacity_bytes() {
        rt.reservation_left_to_kernel(len as u64);
        return None;
    }
    let p = crate::malloc::remote_mapping(len).filter(|p| !p.is_null())?;
    if crate::guard(|| rt.protect(p as u64, round_up(len), prot)).is_err() {
        munmap(p, len);
        return None;
    }
    Some(p)
}

/// `len` rounded up to whole pieces (the caller checked that it fits).
fn round_up(len: usize) -> u64 {
    (len as u64).div_ceil(PIECE) * PIECE
}

/// mmap(2) with MAP_FIXED or MAP_FIXED_NOREPLACE over the region (`[a, b)` of it). A private
/// mapping wholly inside is done as Linux does it, on the pager's mapping, with protection
/// `prot`: an anonymous one reads as zero (how the JVM commits and uncommits its heap, and
/// jemalloc decommits), a file's holds a copy of the file's bytes (how V8 places its builtins
/// and the JVM its class-data archive in a reservation: a private mapping's later changes are
/// its own either way; bytes past the file's end read as zero where Linux raises SIGBUS).
/// Anything else, a shared mapping, would replace part of the pager's mapping behind its back
/// (and stop the program at the next eviction there), so it fails: EEXIST for
/// MAP_FIXED_NOREPLACE, as on any mapped range; EINVAL otherwise, said once on stderr.
fn fixed_on_region(
    rt: &'static Runtime,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    (fd, off): (c_int, libc::off_t),
    (a, b): (u64, u64),
) -> *mut c_void {
    let fail = |e: c_int| {
        set_errno(e);
        libc::MAP_FAILED
    };
    if flags & libc::MAP_FIXED_NOREPLACE != 0 {
        return fail(libc::EEXIST);
    }
    let start = addr as u64;
    let anon = flags & libc::MAP_ANONYMOUS != 0;
    if !start.is_multiple_of(PIECE) || (!anon && (off < 0 || !(off as u64).is_multiple_of(PIECE))) {
        return fail(libc::EINVAL);
    }
    // Flags Linux ignores, or that only say when pages arrive.
    let allowed = libc::MAP_FIXED
        | libc::MAP_ANONYMOUS
        | libc::MAP_NORESERVE
        | libc::MAP_POPULATE
        | libc::MAP_STACK
        | libc::MAP_DENYWRITE
        | libc::MAP_EXECUTABLE;
    let private = flags & libc::MAP_TYPE == libc::MAP_PRIVATE
        && flags & !(libc::MAP_TYPE | allowed) == 0
        && prot & !(libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) == 0;
    if !private || (a, b) != (start, start + round_up(len)) {
        if !FIXED_REFUSED.swap(true, Relaxed) {
            crate::report(&format!(
                "the program's mmap(MAP_FIXED) of {len} bytes at {addr:?} (flags {flags:#x}) \
                 would replace remote memory with a mapping rmem cannot page; refused with \
                 EINVAL (reported once)"
            ));
        }
        return fail(libc::EINVAL);
    }
    let done = crate::guard(|| {
        rt.discard(a, b - a, true);
        if !anon {
            rt.protect(a, b - a, libc::PROT_READ | libc::PROT_WRITE)?;
            copy_file(fd, off, start, len)?;
        }
        rt.protect(a, b - a, prot)
    });
    match done {
        Ok(()) => addr,
        Err(e) => fail(e),
    }
}

/// Write the bytes of `fd` from `off` over `[addr, addr+len)` of the region (writable, zero),
/// up to the file's end. Err: the errno of the read (ENODEV where the file cannot be mapped).
fn copy_file(fd: c_int, off: libc::off_t, addr: u64, len: usize) -> Result<(), c_int> {
    // Local memory (librmem's allocator is the C library's), read by the kernel.
    let mut buf = vec![0u8; len.min(1 << 20)];
    let mut done = 0;
    while done < len {
        let want = buf.len().min(len - done);
        // SAFETY: `buf` has room for `want` bytes; the kernel validates `fd`.
        let n = unsafe {
            libc::syscall(
                libc::SYS_pread64,
                fd,
                buf.as_mut_ptr(),
                want,
                off + done as i64,
            )
        };
        if n < 0 {
            match std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
            {
                libc::EINTR => continue,
                // Not a file that can be mapped.
                libc::ESPIPE | libc::EISDIR | libc::EINVAL => return Err(libc::ENODEV),
                e => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        // SAFETY: the destination lies in the part of the region the program mapped here, now
        // writable; the pager resolves the faults these writes take.
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), (addr + done as u64) as *mut u8, n as usize)
        };
        done += n as usize;
    }
    Ok(())
}

/// A fixed mapping over the region has been refused (reported once).
static FIXED_REFUSED: AtomicBool = AtomicBool::new(false);

/// See mmap(2): the same call as [`mmap`] under its large-file name.
#[no_mangle]
pub extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    mmap(addr, len, prot, flags, fd, off)
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

/// Pin or unpin `[addr, addr+len)`: the region part by the pager, the rest by `real`.
fn lock_range(
    addr: *const c_void,
    len: usize,
    lock: bool,
    populate: bool,
    real: impl Fn(u64, u64) -> c_int,
) -> c_int {
    // mlock(2) takes whole pages: the start rounded down, the end up.
    let start = addr as u64 & !(PIECE - 1);
    let end = (addr as u64).saturating_add(len as u64).div_ceil(PIECE) * PIECE;
    let Some((rt, a, b)) = region_part(start as *mut c_void, (end - start) as usize) else {
        return real(addr as u64, len as u64);
    };
    if let Err(e) = crate::guard(|| rt.lock(a, b - a, lock, populate)) {
        set_errno(e);
        return -1;
    }
    outside(start, end, a, b, real)
}

/// See mlock(2). On the region the pages are pinned by the pager: faulted in now, never
/// evicted, counted against the budget; more than the budget allows (all but an eighth)
/// fails with ENOMEM and pins nothing. The kernel never locks the region itself: a locked
/// page could not be dropped or moved out.
#[no_mangle]
pub extern "C" fn mlock(addr: *const c_void, len: usize) -> c_int {
    let real = real!(c"mlock", fn(*const c_void, usize) -> c_int);
    // SAFETY: the caller's own range outside the region.
    lock_range(addr, len, true, true, |s, n| unsafe {
        real(s as *const c_void, n as usize)
    })
}

/// See mlock2(2): as [`mlock`]; with MLOCK_ONFAULT the pages are pinned as they are touched.
#[no_mangle]
pub extern "C" fn mlock2(addr: *const c_void, len: usize, flags: libc::c_uint) -> c_int {
    let real = real!(c"mlock2", fn(*const c_void, usize, libc::c_uint) -> c_int);
    let populate = flags & libc::MLOCK_ONFAULT == 0;
    // SAFETY: the caller's own range outside the region.
    lock_range(addr, len, true, populate, |s, n| unsafe {
        real(s as *const c_void, n as usize, flags)
    })
}

/// See munlock(2): the region's pages may be evicted again.
#[no_mangle]
pub extern "C" fn munlock(addr: *const c_void, len: usize) -> c_int {
    let real = real!(c"munlock", fn(*const c_void, usize) -> c_int);
    // SAFETY: the caller's own range outside the region.
    lock_range(addr, len, false, false, |s, n| unsafe {
        real(s as *const c_void, n as usize)
    })
}

/// See mlockall(2). MCL_CURRENT pins every page of remote memory allocated now (ENOMEM, and
/// nothing pinned there, beyond the budget) and locks every other mapping of the process
/// except rmem's own, one mlock(2) each: the kernel's mlockall would populate and lock the
/// whole region. MCL_FUTURE goes to the kernel for future mappings; future remote allocations
/// are not pinned.
#[no_mangle]
pub extern "C" fn mlockall(flags: c_int) -> c_int {
    let real = real!(c"mlockall", fn(c_int) -> c_int);
    let rt = match current() {
        Some(rt) if !FORKED.load(Relaxed) && !rmem_client::on_pager_thread() => rt,
        // SAFETY: forwarding the caller's argument unchanged.
        _ => return unsafe { real(flags) },
    };
    if flags & (libc::MCL_CURRENT | libc::MCL_FUTURE) == 0 {
        // SAFETY: invalid flags: the kernel says so without doing anything.
        return unsafe { real(flags) };
    }
    if flags & libc::MCL_FUTURE != 0 {
        // SAFETY: without MCL_CURRENT the kernel only marks future mappings.
        if unsafe { real(flags & !libc::MCL_CURRENT) } != 0 {
            return -1;
        }
    }
    if flags & libc::MCL_CURRENT == 0 {
        return 0;
    }
    let populate = flags & libc::MCL_ONFAULT == 0;
    if let Err(e) = crate::guard(|| rt.lock_all(true, populate)) {
        set_errno(e);
        return -1;
    }
    let lock2 = real!(c"mlock2", fn(*const c_void, usize, libc::c_uint) -> c_int);
    let mlock_flags = if populate { 0 } else { libc::MLOCK_ONFAULT };
    for (s, e) in other_mappings() {
        // SAFETY: locking a mapping of this process outside rmem's.
        if unsafe { lock2(s as *const c_void, (e - s) as usize, mlock_flags) } != 0 {
            return -1;
        }
    }
    0
}

/// See munlockall(2): every page of remote memory may be evicted again.
#[no_mangle]
pub extern "C" fn munlockall() -> c_int {
    let real = real!(c"munlockall", fn() -> c_int);
    if let Some(rt) = current() {
        if !FORKED.load(Relaxed) && !rmem_client::on_pager_thread() {
            let _ = crate::guard(|| rt.lock_all(false, false));
        }
    }
    // SAFETY: no arguments; unlocks the process's other mappings.
    unsafe { real() }
}

/// The mappings of this process (from /proc/self/maps) that are not rmem's and can be
/// locked: not [vsyscall] (no real mapping) and not inaccessible (guard pages, which the
/// kernel's mlockall passes over).
fn other_mappings() -> Vec<(u64, u64)> {
    let rmem = rmem_client::region::reserved();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter(|l| !l.ends_with("[vsyscall]") && !l.contains(" ---p "))
        .filter_map(|l| {
            let (s, e) = l.split_once(' ')?.0.split_once('-')?;
            Some((
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            ))
        })
        .filter(|&(s, e)| rmem.iter().all(|&(b, n)| e <= b || s >= b + n))
        .collect()
}
