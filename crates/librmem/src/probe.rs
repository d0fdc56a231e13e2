//! Touches of the program's memory made on the kernel's behalf, which fail as the kernel's
//! own access would.
//!
//! Unprivileged, rmem faults a system call's buffer in (or copies it through local memory)
//! before the kernel sees it (io.rs, sys.rs). The kernel meets memory the program made
//! inaccessible (PROT_NONE) or read-only (for a write) with EFAULT, or not at all where it
//! ignores the argument; a plain load or store from rmem there raised SIGSEGV instead and
//! killed the program. Node.js died so about once in a hundred runs with `--anon-mmap`:
//! glibc's FUTEX_WAKE leaves a stale register in the unused `uaddr2` argument, which sometimes
//! pointed into a V8 reservation in the region.
//!
//! So each touch is one instruction at a known address ([`touch`]). When it faults with
//! SIGSEGV, rmem's handler ([`recover`], called first by signals.rs) resumes the thread after
//! it with the answer "not accessible", as the kernel's exception tables do for its own user
//! copies. A missing page is not a SIGSEGV: it reaches the pager as any fault does.

use libc::{c_int, c_void, siginfo_t};

#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.rmem_probe,\"ax\",@progbits",
    ".globl rmem_probe_read",
    ".hidden rmem_probe_read",
    ".globl rmem_probe_write",
    ".hidden rmem_probe_write",
    ".globl rmem_probe_read_at",
    ".hidden rmem_probe_read_at",
    ".globl rmem_probe_write_at",
    ".hidden rmem_probe_write_at",
    ".globl rmem_probe_done",
    ".hidden rmem_probe_done",
    // fn(addr) -> u32: 1 when the byte at addr could be read, 0 when that faulted.
    "rmem_probe_read:",
    "mov eax, 1",
    "rmem_probe_read_at:",
    "movzx ecx, byte ptr [rdi]",
    "ret",
    // fn(addr) -> u32: 1 when the byte at addr could be written, 0 when that faulted. A locked
    // OR of zero is a write access that changes nothing, atomic against other threads' stores.
    "rmem_probe_write:",
    "mov eax, 1",
    "rmem_probe_write_at:",
    "lock or byte ptr [rdi], 0",
    "ret",
    // Where a faulted probe resumes, with eax = 0.
    "rmem_probe_done:",
    "xor eax, eax",
    "ret",
    ".popsection",
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn rmem_probe_read(addr: usize) -> u32;
    fn rmem_probe_write(addr: usize) -> u32;
    static rmem_probe_read_at: u8;
    static rmem_probe_write_at: u8;
    static rmem_probe_done: u8;
}

/// Touch the byte at `addr` as a read, or as a write of its own value (`write`), faulting its
/// page in. False when the program's protection forbids that access (the kernel would answer
/// EFAULT); the byte is then untouched.
pub fn touch(addr: usize, write: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the probes access one byte at `addr`; a fault there (SIGSEGV) is turned into a
    // return of 0 by `recover`, and a missing page is resolved by the pager as usual.
    unsafe {
        if write {
            rmem_probe_write(addr) != 0
        } else {
            rmem_probe_read(addr) != 0
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (addr, write);
        true
    }
}

/// Whether every 4 KiB piece of `[addr, addr+len)` allows the access (`write`: a write),
/// touching each, so that all are faulted in when it does. Stops at the first that does not.
pub fn accessible(addr: usize, len: usize, write: bool) -> bool {
    if len == 0 {
        return true;
    }
    let mut at = addr;
    let end = addr.saturating_add(len);
    while at < end {
        if !touch(at, write) {
            return false;
        }
        at = (at / 4096 + 1) * 4096;
    }
    true
}

/// rmem's SIGSEGV handler, first: a fault of one of [`touch`]'s probes resumes after it with
/// its answer "not accessible". True when it was one.
pub fn recover(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler.
        let (code, uc) = unsafe { ((*info).si_code, &mut *(ctx as *mut libc::ucontext_t)) };
        if sig != libc::SIGSEGV || code <= 0 {
            return false;
        }
        let ip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize;
        let at = [
            std::ptr::addr_of!(rmem_probe_read_at) as usize,
            std::ptr::addr_of!(rmem_probe_write_at) as usize,
        ];
        if !at.contains(&ip) {
            return false;
        }
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] =
            std::ptr::addr_of!(rmem_probe_done) as usize as i64;
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (sig, info, ctx);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_answer_as_the_protection_allows() {
        crate::signals::own(libc::SIGSEGV, |_, _, _| false, None);
        // SAFETY: a fresh private mapping of three pages, ours alone.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as usize;
        assert_ne!(p, libc::MAP_FAILED as usize);
        // SAFETY: protecting pages of that mapping.
        unsafe {
            *((p + 4096) as *mut u8) = 7;
            libc::mprotect((p + 4096) as *mut c_void, 4096, libc::PROT_READ);
            libc::mprotect((p + 8192) as *mut c_void, 4096, libc::PROT_NONE);
        }
        assert!(touch(p, false) && touch(p, true));
        assert!(touch(p + 4096, false) && !touch(p + 4096, true));
        assert!(!touch(p + 8192, false) && !touch(p + 8192, true));
        // SAFETY: the read-only page is readable; the failed write probe changed nothing.
        assert_eq!(unsafe { *((p + 4096) as *const u8) }, 7);
        assert!(accessible(p, 8192, false) && !accessible(p, 8192, true));
        assert!(!accessible(p + 100, 3 * 4096 - 100, false));
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(p as *mut c_void, 3 * 4096) };
    }
}
