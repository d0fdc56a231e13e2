//! Kernel-mode access to remote memory in `UFFD_USER_MODE_ONLY` mode.
//!
//! Without the privilege to handle kernel faults, a system call whose buffer lies on a remote
//! page that is not resident fails with EFAULT instead of faulting. The I/O calls below are
//! interposed: when their buffer lies in the region they fault it in from the calling thread
//! first (a write-touch when the kernel will write the buffer, so the page is also dirty and
//! writable), in chunks small enough to stay resident, and retry a chunk that still got EFAULT
//! because another thread evicted it meanwhile (JumboMem section IV-C did the same). Where
//! kernel faults are handled natively the calls pass straight through.

use crate::region_contains;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

/// Buffers in the region must be faulted in before a system call touches them.
pub static PREFAULT: AtomicBool = AtomicBool::new(false);
/// Bytes of region buffer handed to one system call; set at start from the budget.
pub static CHUNK: AtomicUsize = AtomicUsize::new(1 << 20);
/// The DLM page size, for touching once per page.
pub static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// A chunk that still fails with EFAULT after this many prefaults gives up with EFAULT.
const EFAULT_RETRIES: usize = 16;

/// Every C library function librmem forwards to by name, looked up when the library loads
/// ([`resolve_all`]). dlsym takes the dynamic loader's lock, which a program thread may hold
/// (in `dlopen`, running a library's constructors) while it faults on remote memory: a pager
/// that looked up `read` then, to read that very fault, waited for the lock forever (the JVM
/// hung so in about one start of twenty). A unit test checks that the list names them all.
const EAGER: [&CStr; 37] = [
    c"__pread64_chk",
    c"__read_chk",
    c"__recv_chk",
    c"__register_atfork",
    c"close",
    c"dup2",
    c"dup3",
    c"fork",
    c"madvise",
    c"mlock",
    c"mlock2",
    c"mlockall",
    c"mmap",
    c"mprotect",
    c"mremap",
    c"munlock",
    c"munlockall",
    c"munmap",
    c"popen",
    c"pread",
    c"pthread_attr_setstack",
    c"pthread_create",
    c"pwrite",
    c"read",
    c"readv",
    c"recv",
    c"recvfrom",
    c"recvmmsg",
    c"recvmsg",
    c"send",
    c"sendmsg",
    c"sendto",
    c"sigaction",
    c"sigaltstack",
    c"system",
    c"write",
    c"writev",
];

/// The addresses of [`EAGER`]'s functions, 0 until [`resolve_all`].
static EAGER_AT: [AtomicUsize; EAGER.len()] = [const { AtomicUsize::new(0) }; EAGER.len()];

/// Look up every function of [`EAGER`] now: from the library's constructor, while the loader
/// lock is this thread's own.
pub fn resolve_all() {
    for (name, at) in EAGER.iter().zip(&EAGER_AT) {
        at.store(lookup(name), Relaxed);
    }
}

/// The next definition of `name` after this library (glibc's), as an address. Aborts if
/// there is none: rmem cannot forward the call.
pub fn next_symbol(name: &CStr) -> usize {
    match EAGER.iter().position(|n| *n == name) {
        Some(i) if EAGER_AT[i].load(Relaxed) != 0 => EAGER_AT[i].load(Relaxed),
        _ => lookup(name),
    }
}

fn lookup(name: &CStr) -> usize {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT searches the libraries after ours.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    if f == 0 {
        crate::report(&format!("cannot find {name:?} in the C library"));
        std::process::abort();
    }
    f
}

/// Declare `$name` as an interposer and `real` as the C library's definition.
macro_rules! real {
    ($name:literal, fn($($t:ty),* $(,)?) -> $r:ty) => {{
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
        static REAL: AtomicUsize = AtomicUsize::new(0);
        let mut f = REAL.load(Relaxed);
        if f == 0 {
            f = $crate::io::next_symbol($name);
            REAL.store(f, Relaxed);
        }
        // SAFETY: f is the C library's definition of this very function, same signature.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(f) }
    }};
}
pub(crate) use real;

/// The region part of `[buf, buf+len)` needs faulting in before the kernel touches it.
pub(crate) fn needs_prefault(buf: *const c_void, len: usize) -> bool {
    if len == 0 || !PREFAULT.load(Relaxed) {
        return false;
    }
    let (a, b) = (buf as u64, buf as u64 + len as u64 - 1);
    region_contains(a) || region_contains(b) || crate::region_within(a, b)
}

/// Fault in every DLM page of `[buf, buf+len)` that lies in the region, from this thread.
/// `for_write`: the kernel will write the buffer, so the pages must be writable (dirty).
/// Every 4 KiB piece is touched, not only the first of each DLM page: a piece the program
/// dropped itself with a raw madvise(2) is missing from a page the pager holds as mapped, and
/// a touch of it is what lets the pager give it zeros (the kernel would get EFAULT).
/// Stops at a piece the program's protection forbids that access to (probe.rs): the kernel
/// then stops there too, with EFAULT or a short transfer, as it does without rmem.
pub(crate) fn prefault(buf: *const c_void, len: usize, for_write: bool) {
    let base = crate::REGION_BASE.load(Relaxed);
    let region_end = base + crate::REGION_LEN.load(Relaxed);
    let (a, b) = (
        (buf as u64).max(base),
        (buf as u64 + len as u64).min(region_end),
    );
    if a < b {
        crate::probe::accessible(a as usize, (b - a) as usize, for_write);
    }
}

pub(crate) fn errno() -> c_int {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() }
}

/// Fault the buffers in with `prefault` and make the call; again while it fails with EFAULT
/// because another thread evicted a page in between, up to EFAULT_RETRIES times.
pub(crate) fn with_prefault(mut prefault: impl FnMut(), mut call: impl FnMut() -> isize) -> isize {
    let mut tries = 0;
    loop {
        prefault();
        let r = call();
        tries += 1;
        if !(r < 0 && errno() == libc::EFAULT && tries < EFAULT_RETRIES) {
            return r;
        }
    }
}

/// The caller's iovec array as a slice.
pub(crate) fn iovecs<'a>(iov: *const libc::iovec, cnt: c_int) -> &'a [libc::iovec] {
    if iov.is_null() || cnt <= 0 {
        return &[];
    }
    // SAFETY: the caller passes cnt valid iovecs, as the system call requires.
    unsafe { std::slice::from_raw_parts(iov, cnt as usize) }
}

/// True when a transfer over `[start, end)` that stopped at `start` was cut by an eviction
/// after the prefault rather than ended by the file or the device. The kernel stops a copy
/// into the buffer (`kernel_writes`: read calls) exactly at the first missing page, so that
/// page must be the one at `start`. A copy out of the buffer (write calls) may be rounded down
/// by the file system (a partly copied page-cache page is discarded), so any missing page
/// from `start` on counts; going on with a write is harmless anyway.
fn cut_by_eviction(start: *const c_void, end: *const c_void, kernel_writes: bool) -> bool {
    let (a, e) = (start as usize, end as usize);
    if a >= e || !region_contains(a as u64) {
        return false;
    }
    if kernel_writes && a % 4096 != 0 {
        return false;
    }
    let first = a & !4095;
    let last = if kernel_writes {
        first + 4096
    } else {
        e.div_ceil(4096) * 4096
    };
    let mut vec = vec![0u8; (last - first) / 4096];
    // mincore only reads page tables; the range lies in the region's mapping, and vec has one
    // byte per page of it. (Through sys::call: this may run inside the SIGSYS handler.)
    let r = crate::sys::call(
        libc::SYS_mincore,
        [first, last - first, vec.as_mut_ptr() as usize, 0, 0, 0],
    );
    r == 0 && vec.iter().any(|v| v & 1 == 0)
}

/// Run a buffer call in chunks that fit in local memory, faulting each in first.
/// `call(ptr, len, done)` does the real call on `[ptr, ptr+len)`, `done` bytes in.
/// Stops at the first short transfer, like the kernel would for one big call, unless the
/// transfer was cut at a page evicted since the prefault: then the rest is faulted in again
/// and the call goes on (up to EFAULT_RETRIES times).
pub(crate) fn chunked(
    buf: *const c_void,
    len: usize,
    for_write: bool,
    mut call: impl FnMut(*const c_void, usize, usize) -> isize,
) -> isize {
    if !needs_prefault(buf, len) {
        return call(buf, len, 0);
    }
    let chunk = CHUNK.load(Relaxed).max(1);
    let (mut done, mut cuts) = (0usize, 0);
    while done < len {
        let n = chunk.min(len - done);
        let p = buf.wrapping_byte_add(done);
        let r = with_prefault(|| prefault(p, n, for_write), || call(p, n, done));
        if r < 0 {
            return if done > 0 { done as isize } else { r };
        }
        done += r as usize;
        if (r as usize) < n {
            cuts += 1;
            let (at, end) = (buf.wrapping_byte_add(done), p.wrapping_byte_add(n));
            if !(cut_by_eviction(at, end, for_write) && cuts < EFAULT_RETRIES) {
                break;
            }
        }
    }
    done as isize
}

/// Fault in every region buffer of an iovec array; retry on EFAULT.
pub(crate) fn vectored(
    iov: *const libc::iovec,
    cnt: c_int,
    for_write: bool,
    mut call: impl FnMut() -> isize,
) -> isize {
    let iovs = iovecs(iov, cnt);
    if !iovs.iter().any(|v| needs_prefault(v.iov_base, v.iov_len)) {
        return call();
    }
    let prefault_all = || {
        for v in iovs {
            if needs_prefault(v.iov_base, v.iov_len) {
                prefault(v.iov_base, v.iov_len, for_write);
            }
        }
    };
    with_prefault(prefault_all, call)
}

/// Largest receive rmem bounces through local memory (see [`receive`]): a message longer than
/// this, into a remote buffer, unprivileged, is received truncated to it.
pub const BOUNCE_MAX: usize = 64 << 20;

/// Whether a receive on `fd` whose copy into the buffer fails can lose data: the kernel takes a
/// datagram, a SEQPACKET message, an eventfd count or a tty line off its queue before copying
/// it out, and a copy that fails with EFAULT drops it. Regular files, block devices, pipes
/// and stream sockets leave data that was not copied where it was, so the prefault-and-retry
/// path is safe there (and needs no bounce copy).
fn consumes_on_fault(fd: c_int) -> bool {
    // SAFETY: fstat fills the struct it is given; all-zero is a valid stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // Through sys::call: this may run inside the SIGSYS handler.
    let st_addr = &mut st as *mut libc::stat as usize;
    if crate::sys::call(libc::SYS_fstat, [fd as usize, st_addr, 0, 0, 0, 0]) != 0 {
        return false; // the real call reports the bad descriptor
    }
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG | libc::S_IFBLK | libc::S_IFIFO | libc::S_IFDIR => false,
        libc::S_IFSOCK => !is_stream_socket(fd),
        _ => true,
    }
}

fn is_stream_socket(fd: c_int) -> bool {
    let mut ty: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SO_TYPE writes one int into `ty`, whose size `len` gives.
    let r = crate::sys::call(
        libc::SYS_getsockopt,
        [
            fd as usize,
            libc::SOL_SOCKET as usize,
            libc::SO_TYPE as usize,
            &mut ty as *mut c_int as usize,
            &mut len as *mut libc::socklen_t as usize,
            0,
        ],
    );
    r == 0 && ty == libc::SOCK_STREAM
}

thread_local! {
    /// This thread's bounce buffer, kept between calls up to 1 MiB (glibc memory: librmem's
    /// own allocations never go to the region).
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `f` with a local (never remote) buffer of `len` bytes.
fn with_bounce<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    const KEEP: usize = 1 << 20;
    if len > KEEP {
        return f(&mut vec![0u8; len]);
    }
    BOUNCE.with(|b| match b.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < len {
                v.resize(len, 0);
            }
            f(&mut v[..len])
        }
        // Re-entered (a signal handler receiving during a receive): a buffer of its own.
        Err(_) => f(&mut vec![0u8; len]),
    })
}

/// Copy `src` into the caller's buffers, in order; returns the bytes copied. The copy is an
/// ordinary store from this thread, so non-resident pages fault in as usual. It stops before
/// a buffer the program made read-only or inaccessible (probe.rs), where the kernel's own copy
/// would have failed with EFAULT.
fn scatter(src: &[u8], iovs: &[libc::iovec]) -> usize {
    let mut done = 0;
    for v in iovs {
        if done == src.len() {
            break;
        }
        let k = v.iov_len.min(src.len() - done);
        if !crate::probe::accessible(v.iov_base as usize, k, true) {
            break;
        }
        // SAFETY: the caller handed these buffers to a receive call, so each is valid for
        // iov_len bytes, and writable; `src` is our own buffer and does not overlap them.
        unsafe { std::ptr::copy_nonoverlapping(src[done..].as_ptr(), v.iov_base.cast(), k) };
        done += k;
    }
    done
}

/// A receive into the caller's buffer `[buf, buf+n)`. Where a failed copy could lose data (see
/// [`consumes_on_fault`]) and the buffer is remote memory the kernel cannot fault in, the call
/// receives into a local bounce buffer and copies from there: it never consumes a message it
/// then fails to deliver. Elsewhere it goes through [`chunked`].
/// `call(ptr, len, done)` is the real call on `[ptr, ptr+len)`, `done` bytes in.
pub(crate) fn receive(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    mut call: impl FnMut(*mut c_void, usize, usize) -> isize,
) -> isize {
    if !needs_prefault(buf, n) || !consumes_on_fault(fd) {
        return chunked(buf, n, true, |p, k, d| call(p as *mut c_void, k, d));
    }
    let len = n.min(BOUNCE_MAX);
    with_bounce(len, |b| {
        let r = call(b.as_mut_ptr().cast(), len, 0);
        if r > 0 {
            let iov = libc::iovec {
                iov_base: buf,
                iov_len: len,
            };
            let got = (r as usize).min(len);
            if scatter(&b[..got], &[iov]) < got {
                return efault();
            }
        }
        r
    })
}

/// The call `nr` with `args` made by sys.rs's emulation, when its seccomp filter is on and
/// `[buf, buf+len)` is remote: the C library's call would only be trapped and emulated anyway.
fn emulated(buf: *const c_void, len: usize, nr: libc::c_long, args: [usize; 6]) -> Option<isize> {
    (crate::sys::filtered() && needs_prefault(buf, len)).then(|| crate::sys::emulate(nr, args))
}

type Fd = c_int;
type Buf = *mut c_void;
type CBuf = *const c_void;
type Off = libc::off_t;
type Flags = c_int;
type Addr = *mut libc::sockaddr;
type CAddr = *const libc::sockaddr;
type ALen = *mut libc::socklen_t;
type CALen = libc::socklen_t;

/// See read(2).
#[no_mangle]
pub extern "C" fn read(fd: Fd, buf: Buf, n: usize) -> isize {
    if let Some(r) = emulated(
        buf,
        n,
        libc::SYS_read,
        [fd as usize, buf as usize, n, 0, 0, 0],
    ) {
        return r;
    }
    let f = real!(c"read", fn(Fd, Buf, usize) -> isize);
    // SAFETY: forwarding the caller's arguments, with a sub-range of its buffer or a bounce
    // buffer of at most its length.
    receive(fd, buf, n, |p, n, _| unsafe { f(fd, p, n) })
}

/// See write(2).
#[no_mangle]
pub extern "C" fn write(fd: Fd, buf: CBuf, n: usize) -> isize {
    if let Some(r) = emulated(
        buf,
        n,
        libc::SYS_write,
        [fd as usize, buf as usize, n, 0, 0, 0],
    ) {
        return r;
    }
    let f = real!(c"write", fn(Fd, CBuf, usize) -> isize);
    // SAFETY: as read.
    chunked(buf, n, false, |p, n, _| unsafe { f(fd, p, n) })
}

/// See pread(2).
#[no_mangle]
pub extern "C" fn pread(fd: Fd, buf: Buf, n: usize, off: Off) -> isize {
    let args = [fd as usize, buf as usize, n, off as usize, 0, 0];
    if let Some(r) = emulated(buf, n, libc::SYS_pread64, args) {
        return r;
    }
    let f = real!(c"pread", fn(Fd, Buf, usize, Off) -> isize);
    // SAFETY: as read; the offset advances with the chunk.
    chunked(buf, n, true, |p, n, d| unsafe {
        f(fd, p as Buf, n, off + d as Off)
    })
}

/// See pread(2).
#[no_mangle]
pub extern "C" fn pread64(fd: Fd, buf: Buf, n: usize, off: Off) -> isize {
    pread(fd, buf, n, off)
}

/// See pwrite(2).
#[no_mangle]
pub extern "C" fn pwrite(fd: Fd, buf: CBuf, n: usize, off: Off) -> isize {
    let args = [fd as usize, buf as usize, n, off as usize, 0, 0];
    if let Some(r) = emulated(buf, n, libc::SYS_pwrite64, args) {
        return r;
    }
    let f = real!(c"pwrite", fn(Fd, CBuf, usize, Off) -> isize);
    // SAFETY: as pread.
    chunked(buf, n, false, |p, n, d| unsafe {
        f(fd, p, n, off + d as Off)
    })
}

/// See pwrite(2).
#[no_mangle]
pub extern "C" fn pwrite64(fd: Fd, buf: CBuf, n: usize, off: Off) -> isize {
    pwrite(fd, buf, n, off)
}

/// See recv(2).
#[no_mangle]
pub extern "C" fn recv(fd: Fd, buf: Buf, n: usize, flags: Flags) -> isize {
    let args = [fd as usize, buf as usize, n, flags as usize, 0, 0];
    if let Some(r) = emulated(buf, n, libc::SYS_recvfrom, args) {
        return r;
    }
    let f = real!(c"recv", fn(Fd, Buf, usize, Flags) -> isize);
    // SAFETY: as read.
    receive(fd, buf, n, |p, n, _| unsafe { f(fd, p, n, flags) })
}

/// See send(2).
#[no_mangle]
pub extern "C" fn send(fd: Fd, buf: CBuf, n: usize, flags: Flags) -> isize {
    let args = [fd as usize, buf as usize, n, flags as usize, 0, 0];
    if let Some(r) = emulated(buf, n, libc::SYS_sendto, args) {
        return r;
    }
    let f = real!(c"send", fn(Fd, CBuf, usize, Flags) -> isize);
    // SAFETY: as read.
    chunked(buf, n, false, |p, n, _| unsafe { f(fd, p, n, flags) })
}

/// See recvfrom(2). The source address is that of the first chunk.
#[no_mangle]
pub extern "C" fn recvfrom(
    fd: Fd,
    buf: Buf,
    n: usize,
    flags: Flags,
    addr: Addr,
    alen: ALen,
) -> isize {
    let args = [
        fd as usize,
        buf as usize,
        n,
        flags as usize,
        addr as usize,
        alen as usize,
    ];
    if let Some(r) = emulated(buf, n, libc::SYS_recvfrom, args).or_else(|| {
        emulated(
            addr.cast(),
            size_of::<libc::sockaddr>(),
            libc::SYS_recvfrom,
            args,
        )
    }) {
        return r;
    }
    let f = real!(c"recvfrom", fn(Fd, Buf, usize, Flags, Addr, ALen) -> isize);
    // SAFETY: forwarding the caller's arguments (recvmsg: as below).
    recvfrom_with(
        fd,
        buf,
        n,
        addr,
        alen,
        |p, k, a, l| unsafe { f(fd, p, k, flags, a, l) },
        |m| unsafe { recvmsg(fd, m, flags) },
    )
}

/// A recvfrom with the caller's arguments: `call(buf, n, addr, alen)` is the real recvfrom,
/// `recvmsg(msg)` a recvmsg on the same descriptor with the same flags.
pub(crate) fn recvfrom_with(
    fd: Fd,
    buf: Buf,
    n: usize,
    addr: Addr,
    alen: ALen,
    mut call: impl FnMut(Buf, usize, Addr, ALen) -> isize,
    recvmsg: impl FnOnce(*mut libc::msghdr) -> isize,
) -> isize {
    if needs_prefault(addr.cast(), size_of::<libc::sockaddr_storage>()) {
        // The source address is written after the message is taken: receive through recvmsg,
        // which bounces the address too.
        let mut iov = libc::iovec {
            iov_base: buf,
            iov_len: n,
        };
        // SAFETY: all-zero is a valid msghdr.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_name = addr.cast();
        // SAFETY: alen is valid when addr is not null, as recvfrom requires.
        m.msg_namelen = if alen.is_null() { 0 } else { unsafe { *alen } };
        // m describes the caller's buffers.
        let r = recvmsg(&mut m);
        if r >= 0 && !alen.is_null() {
            // SAFETY: as above.
            unsafe { *alen = m.msg_namelen };
        }
        return r;
    }
    // Later chunks do not overwrite the address of the first.
    receive(fd, buf, n, |p, n, d| {
        if d == 0 {
            call(p, n, addr, alen)
        } else {
            call(p, n, std::ptr::null_mut(), std::ptr::null_mut())
        }
    })
}

/// See sendto(2).
#[no_mangle]
pub extern "C" fn sendto(
    fd: Fd,
    buf: CBuf,
    n: usize,
    flags: Flags,
    addr: CAddr,
    alen: CALen,
) -> isize {
    let args = [
        fd as usize,
        buf as usize,
        n,
        flags as usize,
        addr as usize,
        alen as usize,
    ];
    if let Some(r) = emulated(buf, n, libc::SYS_sendto, args)
        .or_else(|| emulated(addr.cast(), alen as usize, libc::SYS_sendto, args))
    {
        return r;
    }
    let f = real!(c"sendto", fn(Fd, CBuf, usize, Flags, CAddr, CALen) -> isize);
    // SAFETY: as read.
    chunked(buf, n, false, |p, n, _| unsafe {
        f(fd, p, n, flags, addr, alen)
    })
}

/// Run a readv/writev in windows of iovecs of at most a chunk of bytes, each faulted in first,
/// stopping at the first short transfer unless it was cut at a page evicted since the
/// prefault (then it goes on from there, as `chunked` does). `call(iov, cnt, done)` does the
/// real call, `done` bytes in.
pub(crate) fn windowed(
    iov: *const libc::iovec,
    cnt: c_int,
    for_write: bool,
    mut call: impl FnMut(*const libc::iovec, c_int, usize) -> isize,
) -> isize {
    let iovs = iovecs(iov, cnt);
    if !iovs.iter().any(|v| needs_prefault(v.iov_base, v.iov_len)) {
        return call(iov, cnt, 0);
    }
    let chunk = CHUNK.load(Relaxed).max(1);
    // Split the buffers into pieces of at most a chunk, then group pieces into windows.
    let mut pieces: Vec<libc::iovec> = Vec::new();
    for v in iovs {
        let mut off = 0;
        while off < v.iov_len || (v.iov_len == 0 && off == 0) {
            let len = chunk.min(v.iov_len - off);
            pieces.push(libc::iovec {
                iov_base: v.iov_base.wrapping_byte_add(off),
                iov_len: len,
            });
            off += len.max(1);
        }
    }
    let (mut done, mut cuts) = (0isize, 0);
    let mut i = 0;
    while i < pieces.len() {
        let (mut j, mut bytes) = (i, 0);
        while j < pieces.len()
            && (j == i || bytes + pieces[j].iov_len <= chunk)
            && j - i < libc::UIO_MAXIOV as usize
        {
            bytes += pieces[j].iov_len;
            j += 1;
        }
        let window = &pieces[i..j];
        let r = with_prefault(
            || {
                window
                    .iter()
                    .for_each(|v| prefault(v.iov_base, v.iov_len, for_write))
            },
            || call(window.as_ptr(), window.len() as c_int, done as usize),
        );
        if r < 0 {
            return if done > 0 { done } else { r };
        }
        done += r;
        if (r as usize) < bytes {
            // Where did it stop? If at a page evicted since the prefault, go on from there.
            let (mut k, mut left) = (i, r as usize);
            while k < j && left >= pieces[k].iov_len {
                left -= pieces[k].iov_len;
                k += 1;
            }
            cuts += 1;
            let at = pieces[k.min(j - 1)].iov_base.wrapping_byte_add(left);
            // The piece it stopped in (pieces are contiguous only within themselves).
            let piece = &pieces[k.min(j - 1)];
            let end = piece.iov_base.wrapping_byte_add(piece.iov_len);
            if k == j || !(cut_by_eviction(at, end, for_write) && cuts < EFAULT_RETRIES) {
                break;
            }
            pieces[k].iov_base = at;
            pieces[k].iov_len -= left;
            i = k;
            continue;
        }
        i = j;
    }
    done
}

/// See readv(2).
#[no_mangle]
pub extern "C" fn readv(fd: Fd, iov: *const libc::iovec, cnt: c_int) -> isize {
    if crate::sys::filtered() {
        return crate::sys::emulate(
            libc::SYS_readv,
            [fd as usize, iov as usize, cnt as usize, 0, 0, 0],
        );
    }
    let f = real!(c"readv", fn(Fd, *const libc::iovec, c_int) -> isize);
    // SAFETY: forwarding the caller's buffers, a window at a time.
    readv_with(fd, iov, cnt, |v, c, _| unsafe { f(fd, v, c) })
}

/// A readv into the caller's buffers, `call(iov, cnt, done)` the real call (see [`receive`]).
pub(crate) fn readv_with(
    fd: Fd,
    iov: *const libc::iovec,
    cnt: c_int,
    mut call: impl FnMut(*const libc::iovec, c_int, usize) -> isize,
) -> isize {
    let iovs = iovecs(iov, cnt);
    if iovs.iter().any(|v| needs_prefault(v.iov_base, v.iov_len)) && consumes_on_fault(fd) {
        let len = iovs
            .iter()
            .map(|v| v.iov_len)
            .sum::<usize>()
            .min(BOUNCE_MAX);
        return with_bounce(len, |b| {
            let local = libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: len,
            };
            let r = call(&local, 1, 0);
            if r > 0 && scatter(&b[..r as usize], iovs) < r as usize {
                return efault();
            }
            r
        });
    }
    windowed(iov, cnt, true, call)
}

/// See writev(2).
#[no_mangle]
pub extern "C" fn writev(fd: Fd, iov: *const libc::iovec, cnt: c_int) -> isize {
    if crate::sys::filtered() {
        return crate::sys::emulate(
            libc::SYS_writev,
            [fd as usize, iov as usize, cnt as usize, 0, 0, 0],
        );
    }
    let f = real!(c"writev", fn(Fd, *const libc::iovec, c_int) -> isize);
    // SAFETY: as readv.
    windowed(iov, cnt, false, |v, c, _| unsafe { f(fd, v, c) })
}

/// See recvmsg(2).
///
/// # Safety
/// `msg` points to a valid msghdr, as the system call requires.
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: Fd, msg: *mut libc::msghdr, flags: Flags) -> isize {
    if crate::sys::filtered() {
        let args = [fd as usize, msg as usize, flags as usize, 0, 0, 0];
        return crate::sys::emulate(libc::SYS_recvmsg, args);
    }
    let f = real!(c"recvmsg", fn(Fd, *mut libc::msghdr, Flags) -> isize);
    // SAFETY: caller's contract.
    unsafe { recvmsg_with(fd, msg, |m| f(fd, m, flags)) }
}

/// A recvmsg with the caller's `msg`; `call(msg)` is the real call.
///
/// # Safety
/// `msg` points to a valid msghdr, as the system call requires.
pub(crate) unsafe fn recvmsg_with(
    fd: Fd,
    msg: *mut libc::msghdr,
    mut call: impl FnMut(*mut libc::msghdr) -> isize,
) -> isize {
    // SAFETY: caller's contract; the msghdr's iovecs are the buffers.
    let (iov, cnt) = unsafe { ((*msg).msg_iov, (*msg).msg_iovlen as c_int) };
    // SAFETY: caller's contract.
    if unsafe { msghdr_needs_bounce(fd, &*msg) } {
        // SAFETY: caller's contract; the real call gets our local copies.
        return unsafe { recvmsg_bounced(&mut *msg, call) };
    }
    vectored(iov, cnt, true, || call(msg))
}

/// A receive with `m` can lose data if its copy-out fails: some buffer of it is remote
/// memory the kernel cannot fault in, and either the socket takes messages whole or the
/// kernel writes the address or control data after taking it.
fn msghdr_needs_bounce(fd: c_int, m: &libc::msghdr) -> bool {
    if !PREFAULT.load(Relaxed) {
        return false;
    }
    let side = needs_prefault(m.msg_name, m.msg_namelen as usize)
        || needs_prefault(m.msg_control, m.msg_controllen)
        || needs_prefault(m.msg_iov.cast(), m.msg_iovlen * size_of::<libc::iovec>());
    let data = iovecs(m.msg_iov, m.msg_iovlen as c_int)
        .iter()
        .any(|v| needs_prefault(v.iov_base, v.iov_len));
    side || (data && consumes_on_fault(fd))
}

/// Receive with `m` through local copies of its data, address and control buffers, then copy
/// what arrived into the caller's. `call` is the real call on a msghdr.
///
/// # Safety
/// `m` describes valid buffers, as recvmsg requires.
pub(crate) unsafe fn recvmsg_bounced(
    m: &mut libc::msghdr,
    call: impl FnOnce(*mut libc::msghdr) -> isize,
) -> isize {
    let len = iovecs(m.msg_iov, m.msg_iovlen as c_int)
        .iter()
        .map(|v| v.iov_len)
        .sum::<usize>()
        .min(BOUNCE_MAX);
    let mut name = vec![0u8; m.msg_namelen as usize];
    let mut control = vec![0u8; m.msg_controllen];
    with_bounce(len, |b| {
        let mut iov = libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: len,
        };
        let mut local = *m;
        local.msg_iov = &mut iov;
        local.msg_iovlen = 1;
        if !m.msg_name.is_null() {
            local.msg_name = name.as_mut_ptr().cast();
        }
        if !m.msg_control.is_null() {
            local.msg_control = control.as_mut_ptr().cast();
        }
        let r = call(&mut local);
        // SAFETY: caller's contract.
        if r >= 0 && !unsafe { deliver(m, &local, &b[..(r as usize).min(len)], &name, &control) } {
            return efault();
        }
        r
    })
}

/// Copy what a receive into local copies (`local`, `data`, `name`, `control`) got into the
/// caller's msghdr `m` and its buffers. False when some buffer the program made read-only or
/// inaccessible could not take its part (the kernel would have failed with EFAULT).
///
/// # Safety
/// `m` describes valid buffers, as recvmsg requires.
unsafe fn deliver(
    m: &mut libc::msghdr,
    local: &libc::msghdr,
    data: &[u8],
    name: &[u8],
    control: &[u8],
) -> bool {
    let mut whole = scatter(data, iovecs(m.msg_iov, m.msg_iovlen as c_int)) == data.len();
    let writable = |p: *mut c_void, k: usize| crate::probe::accessible(p as usize, k, true);
    let k = (local.msg_namelen as usize).min(name.len());
    if !m.msg_name.is_null() {
        whole &= writable(m.msg_name, k);
        if whole {
            // SAFETY: the caller's name buffer holds msg_namelen >= k bytes, writable.
            unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), m.msg_name.cast(), k) };
        }
    }
    let k = local.msg_controllen.min(control.len());
    if !m.msg_control.is_null() {
        whole &= writable(m.msg_control, k);
        if whole {
            // SAFETY: the caller's control buffer holds msg_controllen >= k bytes, writable.
            unsafe { std::ptr::copy_nonoverlapping(control.as_ptr(), m.msg_control.cast(), k) };
        }
    }
    m.msg_namelen = local.msg_namelen;
    m.msg_controllen = local.msg_controllen;
    m.msg_flags = local.msg_flags;
    whole
}

/// -1 with errno EFAULT, where the kernel's own copy into the program's buffer would have
/// failed.
fn efault() -> isize {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = libc::EFAULT };
    -1
}

/// See recvmmsg(2). Where some message would need a bounce (see [`recvmsg`]), every message
/// is received through local copies, the headers and lengths included.
///
/// # Safety
/// `msgs` points to `vlen` valid mmsghdrs, as the system call requires.
#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: Fd,
    msgs: *mut libc::mmsghdr,
    vlen: libc::c_uint,
    flags: Flags,
    timeout: *mut libc::timespec,
) -> c_int {
    if crate::sys::filtered() {
        let args = [
            fd as usize,
            msgs as usize,
            vlen as usize,
            flags as usize,
            timeout as usize,
            0,
        ];
        return crate::sys::emulate(libc::SYS_recvmmsg, args) as c_int;
    }
    let f = real!(
        c"recvmmsg",
        fn(Fd, *mut libc::mmsghdr, libc::c_uint, Flags, *mut libc::timespec) -> c_int
    );
    // SAFETY: caller's contract.
    unsafe { recvmmsg_with(fd, msgs, vlen, timeout, |m, v, t| f(fd, m, v, flags, t)) }
}

/// A recvmmsg with the caller's arguments; `f(msgs, vlen, timeout)` is the real call.
///
/// # Safety
/// As [`recvmmsg`].
pub(crate) unsafe fn recvmmsg_with(
    fd: Fd,
    msgs: *mut libc::mmsghdr,
    vlen: libc::c_uint,
    timeout: *mut libc::timespec,
    f: impl FnOnce(*mut libc::mmsghdr, libc::c_uint, *mut libc::timespec) -> c_int,
) -> c_int {
    if msgs.is_null() || vlen == 0 || !PREFAULT.load(Relaxed) {
        return f(msgs, vlen, timeout);
    }
    let vlen = vlen.min(libc::UIO_MAXIOV as libc::c_uint);
    // SAFETY: caller's contract.
    let all = unsafe { std::slice::from_raw_parts_mut(msgs, vlen as usize) };
    let headers_remote = needs_prefault(msgs.cast(), size_of_val(all))
        || needs_prefault(timeout.cast(), size_of::<libc::timespec>());
    if !headers_remote && !all.iter().any(|h| msghdr_needs_bounce(fd, &h.msg_hdr)) {
        return f(msgs, vlen, timeout);
    }
    // Local copies: one buffer per message, its address and control, the headers, the timeout.
    let mut local: Vec<libc::mmsghdr> = all.to_vec();
    let mut bufs: Vec<Vec<u8>> = Vec::with_capacity(all.len());
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(all.len());
    let mut names: Vec<Vec<u8>> = Vec::with_capacity(all.len());
    let mut controls: Vec<Vec<u8>> = Vec::with_capacity(all.len());
    for h in all.iter() {
        let m = &h.msg_hdr;
        let len = iovecs(m.msg_iov, m.msg_iovlen as c_int)
            .iter()
            .map(|v| v.iov_len)
            .sum::<usize>()
            .min(BOUNCE_MAX);
        bufs.push(vec![0u8; len]);
        names.push(vec![0u8; m.msg_namelen as usize]);
        controls.push(vec![0u8; m.msg_controllen]);
    }
    for (i, l) in local.iter_mut().enumerate() {
        iovs.push(libc::iovec {
            iov_base: bufs[i].as_mut_ptr().cast(),
            iov_len: bufs[i].len(),
        });
        let m = &mut l.msg_hdr;
        if !m.msg_name.is_null() {
            m.msg_name = names[i].as_mut_ptr().cast();
        }
        if !m.msg_control.is_null() {
            m.msg_control = controls[i].as_mut_ptr().cast();
        }
        m.msg_iovlen = 1;
    }
    for (l, iov) in local.iter_mut().zip(iovs.iter_mut()) {
        l.msg_hdr.msg_iov = iov;
    }
    let mut t = (!timeout.is_null()).then(|| {
        // SAFETY: caller's contract: timeout is null or valid.
        unsafe { *timeout }
    });
    let tp = t
        .as_mut()
        .map_or(std::ptr::null_mut(), |t| t as *mut libc::timespec);
    // Every pointer in `local` points to our own buffers of the lengths it says.
    let r = f(local.as_mut_ptr(), vlen, tp);
    if let Some(t) = t {
        // SAFETY: as above.
        unsafe { *timeout = t };
    }
    for (i, (h, l)) in all
        .iter_mut()
        .zip(&local)
        .enumerate()
        .take(r.max(0) as usize)
    {
        let got = (l.msg_len as usize).min(bufs[i].len());
        // SAFETY: caller's contract.
        let whole = unsafe {
            deliver(
                &mut h.msg_hdr,
                &l.msg_hdr,
                &bufs[i][..got],
                &names[i],
                &controls[i],
            )
        };
        if !whole {
            // As the kernel: the messages delivered before the failed one, else EFAULT.
            return if i > 0 { i as c_int } else { efault() as c_int };
        }
        h.msg_len = l.msg_len;
    }
    r
}

/// See sendmsg(2).
///
/// # Safety
/// As [`recvmsg`].
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: Fd, msg: *const libc::msghdr, flags: Flags) -> isize {
    if crate::sys::filtered() {
        let args = [fd as usize, msg as usize, flags as usize, 0, 0, 0];
        return crate::sys::emulate(libc::SYS_sendmsg, args);
    }
    let f = real!(c"sendmsg", fn(Fd, *const libc::msghdr, Flags) -> isize);
    // SAFETY: caller's contract.
    let (iov, cnt) = unsafe { ((*msg).msg_iov, (*msg).msg_iovlen as c_int) };
    // SAFETY: as readv.
    vectored(iov, cnt, false, || unsafe { f(fd, msg, flags) })
}

type File = *mut libc::FILE;

/// Run a stdio call in chunks of whole items; `call(ptr, items)` returns items done.
/// A chunk cut short by EFAULT (a page evicted between the prefault and the kernel's copy)
/// is resumed after clearing the stream's error, up to EFAULT_RETRIES times, when items
/// divide pages: the kernel stops at a page boundary, so no item was half transferred.
fn stdio_chunked(
    ptr: CBuf,
    size: usize,
    n: usize,
    for_write: bool,
    stream: File,
    mut call: impl FnMut(CBuf, usize) -> usize,
) -> usize {
    let Some(total) = size.checked_mul(n) else {
        return call(ptr, n);
    };
    if size == 0 || !needs_prefault(ptr, total) {
        return call(ptr, n);
    }
    let per = (CHUNK.load(Relaxed) / size).max(1);
    let resumable = PAGE.load(Relaxed).is_multiple_of(size);
    let (mut done, mut tries) = (0, 0);
    while done < n {
        let k = per.min(n - done);
        let p = ptr.wrapping_byte_add(done * size);
        prefault(p, k * size, for_write);
        let r = call(p, k);
        done += r;
        if r < k {
            // SAFETY: stream is the caller's open FILE, as the stdio call required.
            let efault = unsafe { libc::ferror(stream) } != 0 && errno() == libc::EFAULT;
            tries += 1;
            if !(efault && resumable && tries < EFAULT_RETRIES) {
                break;
            }
            // SAFETY: as above.
            unsafe { libc::clearerr(stream) };
        }
    }
    done
}

/// Interpose a stdio call `fn(ptr, size, n, stream) -> items`. Large transfers go between
/// the kernel and the caller's buffer directly, inside the C library.
macro_rules! stdio {
    ($(#[$doc:meta])* $name:ident, $sym:literal, $buf:ty, $for_write:expr) => {
        $(#[$doc])*
        #[no_mangle]
        pub extern "C" fn $name(ptr: $buf, size: usize, n: usize, stream: File) -> usize {
            let f = real!($sym, fn($buf, usize, usize, File) -> usize);
            // SAFETY: forwarding the caller's arguments over a sub-range of its buffer.
            stdio_chunked(ptr, size, n, $for_write, stream, |p, k| unsafe {
                f(p as $buf, size, k, stream)
            })
        }
    };
}

stdio!(/// See fread(3).
    fread, c"fread", Buf, true);
stdio!(/// See fwrite(3).
    fwrite, c"fwrite", CBuf, false);
stdio!(/// See unlocked_stdio(3): GNU coreutils read and write through these.
    fread_unlocked, c"fread_unlocked", Buf, true);
stdio!(/// See unlocked_stdio(3).
    fwrite_unlocked, c"fwrite_unlocked", CBuf, false);

/// The `_FORTIFY_SOURCE` variant of read(2) that distributions build programs with.
#[no_mangle]
pub extern "C" fn __read_chk(fd: Fd, buf: Buf, n: usize, buflen: usize) -> isize {
    let f = real!(c"__read_chk", fn(Fd, Buf, usize, usize) -> isize);
    // SAFETY: as read; the chunk's bound shrinks with it.
    receive(fd, buf, n, |p, k, d| unsafe {
        f(fd, p, k, buflen.saturating_sub(d))
    })
}

/// The `_FORTIFY_SOURCE` variant of pread(2).
#[no_mangle]
pub extern "C" fn __pread64_chk(fd: Fd, buf: Buf, n: usize, off: Off, buflen: usize) -> isize {
    let f = real!(c"__pread64_chk", fn(Fd, Buf, usize, Off, usize) -> isize);
    // SAFETY: as pread.
    chunked(buf, n, true, |p, k, d| unsafe {
        f(fd, p as Buf, k, off + d as Off, buflen.saturating_sub(d))
    })
}

/// The `_FORTIFY_SOURCE` variant of pread(2).
#[no_mangle]
pub extern "C" fn __pread_chk(fd: Fd, buf: Buf, n: usize, off: Off, buflen: usize) -> isize {
    __pread64_chk(fd, buf, n, off, buflen)
}

/// The `_FORTIFY_SOURCE` variant of recv(2).
#[no_mangle]
pub extern "C" fn __recv_chk(fd: Fd, buf: Buf, n: usize, buflen: usize, flags: Flags) -> isize {
    let f = real!(c"__recv_chk", fn(Fd, Buf, usize, usize, Flags) -> isize);
    // SAFETY: as recv.
    receive(fd, buf, n, |p, k, d| unsafe {
        f(fd, p, k, buflen.saturating_sub(d), flags)
    })
}

/// Interpose a fortified stdio read `fn(ptr, ptrlen, size, n, stream) -> items`.
macro_rules! fread_chk {
    ($(#[$doc:meta])* $name:ident, $sym:literal) => {
        $(#[$doc])*
        #[no_mangle]
        pub extern "C" fn $name(ptr: Buf, ptrlen: usize, size: usize, n: usize, stream: File) -> usize {
            let f = real!($sym, fn(Buf, usize, usize, usize, File) -> usize);
            // SAFETY: as fread; the buffer bound shrinks with the chunk.
            stdio_chunked(ptr, size, n, true, stream, |p, k| unsafe {
                f(p as Buf, ptrlen.saturating_sub(p as usize - ptr as usize), size, k, stream)
            })
        }
    };
}

fread_chk!(/// The `_FORTIFY_SOURCE` variant of fread(3).
    __fread_chk, c"__fread_chk");
fread_chk!(/// The `_FORTIFY_SOURCE` variant of fread_unlocked(3).
    __fread_unlocked_chk, c"__fread_unlocked_chk");

#[cfg(test)]
mod tests {
    /// Every function librmem forwards to by a literal name is looked up at load ([`EAGER`]).
    #[test]
    fn every_forwarded_function_is_looked_up_at_load() {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut missing = Vec::new();
        let mut stack = vec![std::path::PathBuf::from(src)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                for site in ["real!(", "next_symbol("] {
                    for (i, _) in text.match_indices(site) {
                        let rest = text[i + site.len()..].trim_start();
                        let Some(name) = rest.strip_prefix("c\"") else {
                            continue;
                        };
                        let name = &name[..name.find('"').unwrap()];
                        if !super::EAGER.iter().any(|n| n.to_str() == Ok(name)) {
                            missing.push(format!("{name} ({})", p.display()));
                        }
                    }
                }
            }
        }
        assert!(missing.is_empty(), "not in io::EAGER: {missing:?}");
    }
}
