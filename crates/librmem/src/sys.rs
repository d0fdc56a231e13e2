//! Every system call that takes a buffer, unprivileged: a seccomp filter and a SIGSYS handler.
//!
//! Without the privilege to handle kernel faults (`UFFD_USER_MODE_ONLY`), a system call whose
//! buffer lies on a non-resident remote page fails with EFAULT instead of faulting. Wrapping C
//! library functions (io.rs) covers the calls a program makes through them, but not the ones
//! glibc makes internally (stdio's reads into a `setvbuf` buffer, `getrandom`, `posix_spawn`'s
//! exec), raw `syscall(2)`s, or any call nobody thought to wrap.
//!
//! So in that mode rmem installs a seccomp filter on the thread that starts it (every thread
//! the program creates afterwards inherits it; rmem's pager thread, started before, does not):
//! for each system call of [`table::TABLE`] it compares the high 32 bits of each pointer
//! argument with the region's, and traps (`SECCOMP_RET_TRAP`, SIGSYS) only when one lies in the
//! region; every other call costs the filter's few compares and nothing else. Calls whose
//! buffers sit behind a pointer the filter cannot follow (iovecs, msghdrs) are trapped always;
//! their C library functions are interposed to skip the trap (they call [`emulate`] directly).
//! The SIGSYS handler (signals.rs keeps it first) makes the call itself, from a trampoline at a
//! fixed address whose calls the filter lets through, after giving the kernel resident memory:
//! - buffers of known size are copied through local memory (a bounce), so an eviction between
//!   the copy and the call cannot make it fail, and a call that consumes what it returns (a
//!   datagram, a reaped child's status, a dequeued signal) never loses it;
//! - the I/O calls go through io.rs's bodies (chunks that fit in local memory, bounces for
//!   receives that take a message whole);
//! - an address that matters as itself (a futex word) or whose extent the table does not know
//!   (ioctl arguments) is faulted in where it is, and the call retried on EFAULT.
//!
//! io_uring is refused in this mode (ENOSYS, with a message once): its kernel workers would
//! touch remote buffers outside any system call.
//!
//! The trampoline lives at a fixed address so that the filter, which survives `execve`, lets the
//! trampoline of the next program under rmem through too. A program started from one under
//! rmem inherits the filter; without librmem it would die of SIGSYS on a pointer into the old
//! region's range, which rmem reserves far from where Linux places mappings (see region.rs).
//! Installing a filter needs `PR_SET_NO_NEW_PRIVS` when unprivileged: set-user-ID programs run
//! from under rmem do not gain privileges. `RMEM_SYSCALL_TRAP=0` turns the mechanism off.

mod table;

use crate::io;
use crate::probe;
use crate::region_contains;
use libc::{c_int, c_long, c_void, siginfo_t};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use table::{Arg, Back, Entry, Len};

/// The filter is installed: calls with region pointers reach [`emulate`] by SIGSYS.
static FILTERED: AtomicBool = AtomicBool::new(false);

/// The filter's mark on its traps (`si_errno` of the SIGSYS), "RM".
const TAG: u32 = 0x524d;

/// Bytes of one argument rmem copies through local memory; longer ones are faulted in place.
const BOUNCE_ARG_MAX: usize = 1 << 20;

/// Where the trampoline is mapped in every process under rmem (just below the region's
/// preferred address; see region.rs).
const TRAMPOLINE_AT: usize = 0x0fff_ffff_0000;

/// The filter is on: calls that it would trap must go through [`emulate`].
pub fn filtered() -> bool {
    FILTERED.load(Relaxed)
}

#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.rmem_trampoline,\"ax\",@progbits",
    ".globl rmem_trampoline_start",
    ".hidden rmem_trampoline_start",
    ".globl rmem_trampoline_return",
    ".hidden rmem_trampoline_return",
    ".globl rmem_trampoline_end",
    ".hidden rmem_trampoline_end",
    // fn(nr, a0, a1, a2, a3, a4, a5) -> isize, position-independent so it can be copied.
    "rmem_trampoline_start:",
    "mov rax, rdi",
    "mov rdi, rsi",
    "mov rsi, rdx",
    "mov rdx, rcx",
    "mov r10, r8",
    "mov r8, r9",
    "mov r9, [rsp + 8]",
    "syscall",
    "rmem_trampoline_return:",
    "ret",
    "rmem_trampoline_end:",
    ".popsection",
);

extern "C" {
    static rmem_trampoline_start: u8;
    static rmem_trampoline_return: u8;
    static rmem_trampoline_end: u8;
}

type Trampoline = unsafe extern "C" fn(c_long, usize, usize, usize, usize, usize, usize) -> isize;

/// The trampoline to call: the fixed copy once mapped, else the one in this library.
fn trampoline() -> Trampoline {
    let at = if FILTERED.load(Relaxed) {
        TRAMPOLINE_AT
    } else {
        std::ptr::addr_of!(rmem_trampoline_start) as usize
    };
    // SAFETY: both addresses hold the trampoline's code, which has this signature.
    unsafe { std::mem::transmute::<usize, Trampoline>(at) }
}

/// Make system call `nr` from the trampoline; the kernel's result (-errno on failure).
pub fn raw(nr: c_long, a: [usize; 6]) -> isize {
    // SAFETY: a system call with the caller's arguments; the caller vouches for them as it
    // would for syscall(2).
    unsafe { trampoline()(nr, a[0], a[1], a[2], a[3], a[4], a[5]) }
}

/// As [`raw`], with the C library's convention: -1 and errno on failure.
pub fn call(nr: c_long, a: [usize; 6]) -> isize {
    libc_result(raw(nr, a))
}

fn libc_result(r: isize) -> isize {
    if (-4095..0).contains(&r) {
        set_errno(-r as c_int);
        -1
    } else {
        r
    }
}

fn kernel_result(r: isize) -> isize {
    if r == -1 {
        -(io::errno() as isize)
    } else {
        r
    }
}

fn set_errno(e: c_int) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = e };
}

/// Make system call `nr` for a C library function rmem interposes, as the SIGSYS handler would:
/// C library convention.
pub fn emulate(nr: c_long, a: [usize; 6]) -> isize {
    libc_result(dispatch(nr, a))
}

/// Map the trampoline at its fixed address (or find it there, inherited across fork).
fn map_trampoline() -> Result<(), String> {
    let (start, end) = (
        std::ptr::addr_of!(rmem_trampoline_start) as usize,
        std::ptr::addr_of!(rmem_trampoline_end) as usize,
    );
    // SAFETY: the trampoline's own bytes, in this library's text.
    let code = unsafe { std::slice::from_raw_parts(start as *const u8, end - start) };
    // SAFETY: a fresh private mapping at an address nothing else uses; NOREPLACE fails rather
    // than clobber anything there.
    let p = unsafe {
        libc::mmap(
            TRAMPOLINE_AT as *mut c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        let mut vec = [0u8; 1];
        // SAFETY: mincore only reads page tables, for one page, into one byte.
        let there = unsafe { libc::mincore(TRAMPOLINE_AT as *mut c_void, 4096, vec.as_mut_ptr()) };
        if there == 0 {
            // SAFETY: mincore said a mapping is there (inherited across fork): our code?
            let found =
                unsafe { std::slice::from_raw_parts(TRAMPOLINE_AT as *const u8, code.len()) };
            if found == code {
                return Ok(());
            }
        }
        return Err(format!(
            "cannot map the system call trampoline at {TRAMPOLINE_AT:#x}: {e}"
        ));
    }
    // SAFETY: copying code into our fresh page, then making it read-only and executable.
    unsafe {
        std::ptr::copy_nonoverlapping(code.as_ptr(), p.cast::<u8>(), code.len());
        if libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC) != 0 {
            return Err(format!(
                "cannot protect the system call trampoline: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// Install the filter for the region `[base, base+len)` on this thread (inherited by the
/// threads it creates), with rmem's SIGSYS handler first. Errors say why it is not on.
pub fn install(base: u64, len: u64) -> Result<(), String> {
    if !cfg!(target_arch = "x86_64") {
        return Err("system call trapping is implemented for x86_64 only".into());
    }
    if std::env::var_os("RMEM_SYSCALL_TRAP").is_some_and(|v| v == "0") {
        return Err("turned off by RMEM_SYSCALL_TRAP=0".into());
    }
    map_trampoline()?;
    let ret = TRAMPOLINE_AT
        + (std::ptr::addr_of!(rmem_trampoline_return) as usize
            - std::ptr::addr_of!(rmem_trampoline_start) as usize);
    let (lo, hi) = ((base >> 32) as u32, ((base + len - 1) >> 32) as u32);
    let prog = bpf::program(lo, hi, ret as u64);
    crate::signals::own(libc::SIGSYS, on_sigsys, None);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl and seccomp with valid arguments; `fprog` points to `prog`, alive for the
    // call (the kernel copies it).
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(format!(
                "PR_SET_NO_NEW_PRIVS: {}",
                std::io::Error::last_os_error()
            ));
        }
        if libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0 {
            return Err(format!(
                "seccomp filter: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    FILTERED.store(true, Relaxed);
    Ok(())
}

/// The classic-BPF seccomp program.
mod bpf {
    use super::table::{Arg, Entry, TABLE};
    use libc::sock_filter;

    const LD_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
    const JGT: u16 = (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16;
    const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const TRAP: u32 = libc::SECCOMP_RET_TRAP | super::TAG;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    // Offsets in struct seccomp_data (little-endian: the high word of a u64 is at +4).
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    const IP: u32 = 8;
    const fn arg_high(i: usize) -> u32 {
        16 + 8 * i as u32 + 4
    }

    fn stmt(code: u16, k: u32) -> sock_filter {
        sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        }
    }

    fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
        sock_filter { code, jt, jf, k }
    }

    /// Allow calls from the trampoline's `syscall` (`ret` is the address after it); for a
    /// table entry, trap when a pointer argument's high word lies in `[lo, hi]`.
    pub fn program(lo: u32, hi: u32, ret: u64) -> Vec<sock_filter> {
        let mut p = vec![
            stmt(LD_ABS, ARCH),
            jump(JEQ, AUDIT_ARCH_X86_64, 1, 0),
            stmt(RET, ALLOW),
            stmt(LD_ABS, IP + 4),
            jump(JEQ, (ret >> 32) as u32, 0, 3),
            stmt(LD_ABS, IP),
            jump(JEQ, ret as u32, 0, 1),
            stmt(RET, ALLOW),
            stmt(LD_ABS, NR),
        ];
        let mut entries: Vec<&Entry> = TABLE.iter().collect();
        entries.sort_by_key(|e| e.nr);
        p.extend(tree(&entries, lo, hi));
        p
    }

    /// A binary search over system call numbers (the accumulator holds the number), leaves of
    /// a few entries compared in turn.
    fn tree(e: &[&Entry], lo: u32, hi: u32) -> Vec<sock_filter> {
        if e.len() <= 4 {
            let mut out = Vec::new();
            for x in e {
                let b = block(x, lo, hi);
                out.push(jump(JEQ, x.nr as u32, 0, b.len() as u8));
                out.extend(b);
            }
            out.push(stmt(RET, ALLOW));
            return out;
        }
        let mid = e.len() / 2;
        let (left, right) = (tree(&e[..mid], lo, hi), tree(&e[mid..], lo, hi));
        let mut out = vec![
            jump(JGE, e[mid].nr as u32, 0, 1),
            stmt(JA, left.len() as u32),
        ];
        out.extend(left);
        out.extend(right);
        out
    }

    /// The checks of one entry; always ends in a return.
    fn block(x: &Entry, lo: u32, hi: u32) -> Vec<sock_filter> {
        if x.always {
            return vec![stmt(RET, TRAP)];
        }
        let mut b = Vec::new();
        for (i, a) in x.args.iter().enumerate() {
            if matches!(a, Arg::No) {
                continue;
            }
            b.push(stmt(LD_ABS, arg_high(i)));
            b.push(jump(JGE, lo, 0, 2));
            b.push(jump(JGT, hi, 1, 0));
            b.push(stmt(RET, TRAP));
        }
        b.push(stmt(RET, ALLOW));
        b
    }
}

/// rmem's part of SIGSYS: a trap of rmem's filter is made here and its result given back.
fn on_sigsys(_sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) -> bool {
    const SYS_SECCOMP: c_int = 1;
    // SAFETY: the kernel passes a valid siginfo; for SIGSYS, si_syscall is the int at offset
    // 24 (after si_call_addr).
    let (code, data, nr) = unsafe {
        let nr = *(info as *const u8).add(24).cast::<c_int>();
        ((*info).si_code, (*info).si_errno, nr)
    };
    if code != SYS_SECCOMP || data != TAG as c_int {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the kernel passes the interrupted context as a ucontext_t.
        let g = unsafe { &mut (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
        let a = [
            libc::REG_RDI,
            libc::REG_RSI,
            libc::REG_RDX,
            libc::REG_R10,
            libc::REG_R8,
            libc::REG_R9,
        ]
        .map(|r| g[r as usize] as usize);
        let saved = io::errno();
        let r = dispatch(nr as c_long, a);
        set_errno(saved);
        g[libc::REG_RAX as usize] = r as i64;
    }
    true
}

/// Make a trapped call with resident memory; the kernel's result.
fn dispatch(nr: c_long, a: [usize; 6]) -> isize {
    if crate::malloc::FORKED.load(Relaxed) || rmem_client::on_pager_thread() {
        // A fork() child without rmem has no remote memory: the kernel answers as for any bad
        // address. A fork child's pager inherits the filter (its parent's was started before
        // it) and never passes region memory to the kernel itself.
        return raw(nr, a);
    }
    let fd = a[0];
    let r = match nr {
        libc::SYS_read => io::receive(fd as c_int, a[1] as _, a[2], |p, k, _| {
            call(nr, [fd, p as usize, k, 0, 0, 0])
        }),
        libc::SYS_pread64 => io::chunked(a[1] as _, a[2], true, |p, k, d| {
            call(nr, [fd, p as usize, k, a[3] + d, 0, 0])
        }),
        libc::SYS_write => io::chunked(a[1] as _, a[2], false, |p, k, _| {
            call(nr, [fd, p as usize, k, 0, 0, 0])
        }),
        libc::SYS_pwrite64 => io::chunked(a[1] as _, a[2], false, |p, k, d| {
            call(nr, [fd, p as usize, k, a[3] + d, 0, 0])
        }),
        libc::SYS_getrandom => io::chunked(a[0] as _, a[1], true, |p, k, _| {
            call(nr, [p as usize, k, a[2], 0, 0, 0])
        }),
        libc::SYS_recvfrom => {
            let flags = a[3];
            io::recvfrom_with(
                fd as c_int,
                a[1] as _,
                a[2],
                a[4] as _,
                a[5] as _,
                |p, k, ad, l| call(nr, [fd, p as usize, k, flags, ad as usize, l as usize]),
                |m| call(libc::SYS_recvmsg, [fd, m as usize, flags, 0, 0, 0]),
            )
        }
        libc::SYS_sendto => {
            let addr = Local::copy(a[4], a[5].min(BOUNCE_ARG_MAX), false);
            io::chunked(a[1] as _, a[2], false, |p, k, _| {
                call(nr, [fd, p as usize, k, a[3], addr.at(a[4]), a[5]])
            })
        }
        libc::SYS_readv
        | libc::SYS_writev
        | libc::SYS_preadv
        | libc::SYS_pwritev
        | libc::SYS_preadv2
        | libc::SYS_pwritev2 => vectored(nr, a),
        libc::SYS_recvmsg => recvmsg(a),
        libc::SYS_sendmsg => {
            let Some(m) = LocalMsg::copy(a[1]) else {
                return -(libc::EFAULT as isize);
            };
            m.prefault_data();
            io::vectored(m.hdr.msg_iov, m.hdr.msg_iovlen as c_int, false, || {
                call(
                    nr,
                    [fd, &m.hdr as *const libc::msghdr as usize, a[2], 0, 0, 0],
                )
            })
        }
        libc::SYS_recvmmsg => {
            // SAFETY: the program's arguments, as the system call takes them.
            unsafe {
                io::recvmmsg_with(fd as c_int, a[1] as _, a[2] as _, a[4] as _, |m, v, t| {
                    call(nr, [fd, m as usize, v as usize, a[3], t as usize, 0]) as c_int
                }) as isize
            }
        }
        libc::SYS_sendmmsg => sendmmsg(a),
        libc::SYS_futex => return generic(&table::futex(a[1]), a),
        libc::SYS_io_uring_setup => {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Relaxed) {
                crate::report(
                    "io_uring refused (ENOSYS): unprivileged, the kernel cannot fault in remote memory \
                     for io_uring's workers; the program falls back to ordinary I/O if it can \
                     (docs/configuration.md)",
                );
            }
            return -(libc::ENOSYS as isize);
        }
        _ => match table::entry(nr) {
            Some(e) => return generic(e, a),
            None => return raw(nr, a),
        },
    };
    kernel_result(r)
}

/// readv, writev, preadv, pwritev, preadv2, pwritev2: the iovec array copied here, the buffers
/// through io.rs's windows (and bounces for receives that take messages whole).
fn vectored(nr: c_long, a: [usize; 6]) -> isize {
    let (fd, cnt) = (a[0], a[2] as c_int);
    let iov: Vec<libc::iovec> = io::iovecs(a[1] as _, cnt).to_vec();
    let positioned = !matches!(nr, libc::SYS_readv | libc::SYS_writev);
    // preadv2/pwritev2 take -1 as "the file position": it does not advance with `done`.
    let at = |done: usize| {
        if positioned && a[3] as i64 >= 0 {
            a[3] + done
        } else {
            a[3]
        }
    };
    let one = |v: *const libc::iovec, c: c_int, done: usize| {
        call(nr, [fd, v as usize, c as usize, at(done), a[4], a[5]])
    };
    let (p, c) = (iov.as_ptr(), iov.len() as c_int);
    kernel_result(match nr {
        libc::SYS_readv => io::readv_with(fd as c_int, p, c, one),
        libc::SYS_preadv | libc::SYS_preadv2 => io::windowed(p, c, true, one),
        _ => io::windowed(p, c, false, one),
    })
}

/// recvmsg with the header and its iovec array copied here; the header's results copied back.
fn recvmsg(a: [usize; 6]) -> isize {
    let Some(mut m) = LocalMsg::copy(a[1]) else {
        return -(libc::EFAULT as isize);
    };
    // SAFETY: m.hdr is a valid msghdr: the program's, with a local iovec array.
    let r = unsafe {
        io::recvmsg_with(a[0] as c_int, &mut m.hdr, |h| {
            call(libc::SYS_recvmsg, [a[0], h as usize, a[2], 0, 0, 0])
        })
    };
    if r >= 0 && !m.give_back(a[1]) {
        return -(libc::EFAULT as isize);
    }
    kernel_result(r)
}

/// sendmmsg with every header, iovec array, address and control buffer copied here.
fn sendmmsg(a: [usize; 6]) -> isize {
    let vlen = a[2].min(libc::UIO_MAXIOV as usize);
    let mut msgs = Vec::with_capacity(vlen);
    let size = std::mem::size_of::<libc::mmsghdr>();
    for k in 0..vlen {
        match LocalMsg::copy(a[1] + k * size) {
            Some(m) => msgs.push(m),
            None => return -(libc::EFAULT as isize),
        }
    }
    let mut hdrs: Vec<libc::mmsghdr> = msgs
        .iter()
        .map(|m| libc::mmsghdr {
            msg_hdr: m.hdr,
            msg_len: 0,
        })
        .collect();
    let r = retry_efault(
        || msgs.iter().for_each(LocalMsg::prefault_data),
        || {
            raw(
                libc::SYS_sendmmsg,
                [a[0], hdrs.as_mut_ptr() as usize, vlen, a[3], 0, 0],
            )
        },
    );
    for (k, h) in hdrs.iter().enumerate().take(r.max(0) as usize) {
        let len = (a[1] + k * size + std::mem::offset_of!(libc::mmsghdr, msg_len)) as *mut u32;
        // SAFETY: the program's mmsghdr array holds vlen headers.
        unsafe { len.write_unaligned(h.msg_len) };
    }
    r
}

/// Run `call` (kernel convention) after `prefault`, again while it fails with EFAULT.
fn retry_efault(prefault: impl FnMut(), mut call: impl FnMut() -> isize) -> isize {
    kernel_result(io::with_prefault(prefault, || libc_result(call())))
}

/// A copy of some bytes of the program's memory in local memory.
struct Local(Option<Vec<u8>>);

impl Local {
    /// `len` bytes at `p` when `p` lies in the region; nothing otherwise, or where the program
    /// made some of them inaccessible, or read-only when the kernel is to `write` them (the
    /// kernel is then given `p`, and answers EFAULT).
    fn copy(p: usize, len: usize, write: bool) -> Local {
        if p == 0 || !region_contains(p as u64) {
            return Local(None);
        }
        let len = len.min(region_left(p));
        if !probe::accessible(p, len, write) {
            return Local(None);
        }
        let mut v = vec![0u8; len];
        // SAFETY: `len` bytes at p lie in the region, which is mapped; a missing page faults
        // in as the load touches it.
        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, v.as_mut_ptr(), len) };
        Local(Some(v))
    }

    /// The address to give the kernel instead of `p`.
    fn at(&self, p: usize) -> usize {
        self.0.as_ref().map_or(p, |v| v.as_ptr() as usize)
    }
}

/// Bytes from `p` to the end of the region.
fn region_left(p: usize) -> usize {
    let end = crate::REGION_BASE.load(Relaxed) + crate::REGION_LEN.load(Relaxed);
    (end as usize).saturating_sub(p)
}

/// A msghdr of the program with its iovec array, address and control data copied here.
struct LocalMsg {
    hdr: libc::msghdr,
    iov: Vec<libc::iovec>,
    name: Local,
    control: Local,
    /// The program's pointers, restored in [`LocalMsg::give_back`].
    program: libc::msghdr,
}

impl LocalMsg {
    fn copy(p: usize) -> Option<LocalMsg> {
        let size = std::mem::size_of::<libc::msghdr>();
        if p == 0 || !probe::accessible(p, size, false) {
            return None;
        }
        // SAFETY: the program passed a msghdr here, found readable; reading it faults it in
        // if remote.
        let program: libc::msghdr = unsafe { (p as *const libc::msghdr).read_unaligned() };
        let mut hdr = program;
        let iov_bytes = hdr.msg_iovlen * std::mem::size_of::<libc::iovec>();
        if !probe::accessible(hdr.msg_iov as usize, iov_bytes, false) {
            return None;
        }
        let iov = io::iovecs(hdr.msg_iov, hdr.msg_iovlen as c_int).to_vec();
        hdr.msg_iov = iov.as_ptr() as *mut libc::iovec;
        let name = Local::copy(hdr.msg_name as usize, hdr.msg_namelen as usize, false);
        let control = Local::copy(hdr.msg_control as usize, hdr.msg_controllen, false);
        hdr.msg_name = name.at(hdr.msg_name as usize) as *mut c_void;
        hdr.msg_control = control.at(hdr.msg_control as usize) as *mut c_void;
        Some(LocalMsg {
            hdr,
            iov,
            name,
            control,
            program,
        })
    }

    /// Fault in the data buffers (the kernel reads them).
    fn prefault_data(&self) {
        for v in &self.iov {
            if io::needs_prefault(v.iov_base, v.iov_len) {
                io::prefault(v.iov_base, v.iov_len, false);
            }
        }
    }

    /// Write what a receive changed into the program's msghdr at `p` and its buffers. False
    /// when the program made some of them read-only or inaccessible (the kernel would have
    /// answered EFAULT).
    fn give_back(&self, p: usize) -> bool {
        let mut out = self.program;
        out.msg_namelen = self.hdr.msg_namelen;
        out.msg_controllen = self.hdr.msg_controllen;
        out.msg_flags = self.hdr.msg_flags;
        for (local, theirs, len) in [
            (
                &self.name,
                self.program.msg_name,
                self.hdr.msg_namelen as usize,
            ),
            (
                &self.control,
                self.program.msg_control,
                self.hdr.msg_controllen,
            ),
        ] {
            let Some(v) = &local.0 else { continue };
            let n = len.min(v.len());
            if !probe::accessible(theirs as usize, n, true) {
                return false;
            }
            // SAFETY: the program's buffer holds at least what the kernel filled in, and may
            // be written.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), theirs.cast(), n) };
        }
        if !probe::accessible(p, std::mem::size_of::<libc::msghdr>(), true) {
            return false;
        }
        // SAFETY: the program's msghdr, writable.
        unsafe { (p as *mut libc::msghdr).write_unaligned(out) };
        true
    }
}

impl Len {
    fn of(self, a: &[usize; 6]) -> usize {
        match self {
            Len::Fixed(n) => n,
            Len::Arg(i) => a[i],
            Len::Times(i, n) => a[i].saturating_mul(n),
            Len::Plus(i, n) => a[i].saturating_add(n),
            Len::Bits(i) => a[i].div_ceil(64).saturating_mul(8),
        }
    }
}

/// A NUL-terminated string at `p` (in the region) copied here, or None when it runs off the
/// region's end or past 1 MiB (the kernel is then given it in place).
pub(crate) fn copy_str(p: usize) -> Option<Vec<u8>> {
    let left = region_left(p).min(BOUNCE_ARG_MAX);
    let mut v = Vec::new();
    for k in 0..left {
        if (k == 0 || (p + k).is_multiple_of(4096)) && !probe::touch(p + k, false) {
            return None;
        }
        // SAFETY: p + k lies in the region and was found readable (probe.rs); the load
        // faults the page in if it is missing.
        let b = unsafe { std::ptr::read_volatile((p + k) as *const u8) };
        v.push(b);
        if b == 0 {
            return Some(v);
        }
    }
    None
}

/// The generic path: every region argument of `e` copied here or faulted in, per the table.
fn generic(e: &Entry, a: [usize; 6]) -> isize {
    let mut args = a;
    // Local copies: (argument, buffer, what to copy back).
    let mut bounces: Vec<(usize, Vec<u8>, Option<Back>)> = Vec::new();
    // Arrays of string pointers built here (execve's argv and envp) and their strings.
    let mut vectors: Vec<(Vec<usize>, Vec<Vec<u8>>)> = Vec::new();
    // Faulted in place: (address, bytes, the kernel writes it).
    let mut touch: Vec<(usize, usize, bool)> = Vec::new();
    for (j, arg) in e.args.iter().enumerate() {
        let p = a[j];
        if p == 0 || !region_contains(p as u64) {
            if matches!(arg, Arg::StrVec) && p != 0 {
                if let Some(v) = copy_strvec(p) {
                    args[j] = v.0.as_ptr() as usize;
                    vectors.push(v);
                }
            }
            continue;
        }
        match *arg {
            Arg::No | Arg::Indirect => {}
            Arg::In(len) | Arg::Out(len, _) | Arg::InOut(len) => {
                let n = len.of(&a);
                let write = !matches!(arg, Arg::In(_));
                // A buffer the program made inaccessible (or read-only, for the kernel to
                // write) is left where it is: the kernel answers EFAULT, as without rmem.
                let copied = (n <= BOUNCE_ARG_MAX)
                    .then(|| Local::copy(p, n, write).0)
                    .flatten();
                let Some(mut b) = copied else {
                    touch.push((p, n, write));
                    continue;
                };
                args[j] = b.as_mut_ptr() as usize;
                let back = match *arg {
                    Arg::Out(_, back) => Some(back),
                    Arg::InOut(_) => Some(Back::All),
                    _ => None,
                };
                bounces.push((j, b, back));
            }
            Arg::Str => match copy_str(p) {
                Some(s) => {
                    args[j] = s.as_ptr() as usize;
                    bounces.push((j, s, None));
                }
                None => touch.push((p, region_left(p).min(BOUNCE_ARG_MAX), false)),
            },
            Arg::StrVec => {
                if let Some(v) = copy_strvec(p) {
                    args[j] = v.0.as_ptr() as usize;
                    vectors.push(v);
                }
            }
            Arg::Touch => touch.push((p, 4096.min(region_left(p)), false)),
        }
    }
    let mut tries = 0;
    let r = retry_efault(
        || {
            // Read-touch first; after an EFAULT, write-touch: the kernel may write it.
            let write = tries > 0;
            tries += 1;
            for &(p, n, w) in &touch {
                io::prefault(p as *const c_void, n, w || write);
            }
        },
        || raw(e.nr, args),
    );
    if r >= 0 {
        for (j, b, back) in &bounces {
            let n = match back {
                None => continue,
                Some(Back::All) => b.len(),
                Some(Back::Ret) => (r as usize).min(b.len()),
                Some(Back::RetTimes(size)) => (r as usize).saturating_mul(*size).min(b.len()),
            };
            // SAFETY: the program's buffer at a[j] holds b.len() bytes (copied from there).
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), a[*j] as *mut u8, n) };
        }
    }
    r
}

/// A NULL-terminated array of strings at `p` rebuilt in local memory, when the array or any
/// of its strings lies in the region; None otherwise (the kernel reads it in place).
pub(crate) fn copy_strvec(p: usize) -> Option<(Vec<usize>, Vec<Vec<u8>>)> {
    let mut ptrs = Vec::new();
    let mut strings = Vec::new();
    let mut any = region_contains(p as u64);
    for k in 0.. {
        let at = p + k * std::mem::size_of::<usize>();
        if !probe::accessible(at, std::mem::size_of::<usize>(), false) {
            return None;
        }
        // SAFETY: the program passed a NULL-terminated array here, found readable (probe.rs);
        // loads fault it in.
        let s = unsafe { std::ptr::read_volatile(at as *const usize) };
        if s == 0 {
            break;
        }
        if region_contains(s as u64) {
            any = true;
            let c = copy_str(s)?;
            ptrs.push(c.as_ptr() as usize);
            strings.push(c);
        } else {
            ptrs.push(s);
        }
    }
    ptrs.push(0);
    any.then_some((ptrs, strings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trampoline_makes_system_calls() {
        // SAFETY: getpid has no preconditions.
        assert_eq!(raw(libc::SYS_getpid, [0; 6]), unsafe { libc::getpid() }
            as isize);
        assert_eq!(
            raw(libc::SYS_close, [usize::MAX >> 1, 0, 0, 0, 0, 0]),
            -(libc::EBADF as isize)
        );
        assert_eq!(call(libc::SYS_close, [usize::MAX >> 1, 0, 0, 0, 0, 0]), -1);
        assert_eq!(io::errno(), libc::EBADF);
    }

    #[test]
    fn the_filter_fits_the_kernel_limit_and_every_jump_lands_inside() {
        let p = bpf::program(0x1000, 0x10ff, 0x0fff_ffff_0010);
        assert!(p.len() < 4096, "{} instructions", p.len());
        for (k, i) in p.iter().enumerate() {
            let class = i.code & 0x07;
            if class == libc::BPF_JMP as u16 {
                let far = if i.code == (libc::BPF_JMP | libc::BPF_JA) as u16 {
                    i.k as usize
                } else {
                    i.jt.max(i.jf) as usize
                };
                assert!(k + 1 + far < p.len(), "jump at {k} leaves the program");
            }
        }
        assert_eq!(
            p.last().map(|i| i.code),
            Some((libc::BPF_RET | libc::BPF_K) as u16)
        );
    }
}
