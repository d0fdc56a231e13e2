//! The reserved virtual region that holds remote memory, and the staging area that dirty
//! victims are moved into while their write-back is in flight.

use crate::PageIndex;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

/// mmap(2) by system call, with libc's `mmap` signature: librmem interposes the `mmap` symbol
/// for the program (and acts on the region for it), and rmem's own mappings must not go there.
///
/// # Safety
/// As mmap(2): a fixed mapping replaces whatever was at its range.
unsafe fn sys_mmap(
    addr: *mut libc::c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: libc::off_t,
) -> *mut libc::c_void {
    libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut libc::c_void
}

/// Every mapping rmem has reserved and not yet unmapped, as (start, length): what the
/// program's mlockall(2) must leave alone (locking would populate them and pin them).
static RESERVED: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The address ranges rmem has reserved (the region and staging areas of every runtime).
pub fn reserved() -> Vec<(u64, u64)> {
    RESERVED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// In a fork() child without a pager (its own could not start), reserve with no access a
/// region's range, replacing the copy-on-write copy the fork gave it, whose pages not
/// resident at the fork would read as zeros: a touch then faults (SIGSEGV) instead, and never
/// reads whatever the child maps there later. Only makes a system call, so it may run in an
/// atfork child handler.
pub fn reserve_no_access(base: u64, len: u64) {
    // SAFETY: replaces exactly the range of the parent's region, which nothing in this
    // process may use without a pager.
    unsafe {
        sys_mmap(
            base as *mut libc::c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

/// A private anonymous mapping reserved with `MAP_NORESERVE`: no memory is committed until a
/// page is installed. Huge pages are disabled (the paging unit is the DLM page) and the
/// mapping is not inherited by `fork` children, which would otherwise read zeros where data
/// should be: a child that touches it gets SIGSEGV instead.
#[derive(Debug)]
pub struct Mapping {
    base: u64,
    len: u64,
    /// The raw mmap (before alignment), for munmap.
    raw_base: u64,
    raw_len: u64,
    /// Replaced by an inaccessible reservation that outlives this value ([`Mapping::seal`]).
    sealed: bool,
}

/// Where rmem asks Linux to place the region: 16 TiB, far below where Linux puts programs
/// (about 85 TiB up), the heap and mappings (near the top of the 128 TiB user space), so no
/// ordinary mapping of a program lies in the same 4 GiB windows. librmem's seccomp filter
/// compares the high 32 bits of system call arguments with the region's, and a program that
/// inherits the filter across exec must not have its own pointers there. A hint only: if the
/// range is taken, Linux chooses, and rmem works the same.
pub const REGION_AT: u64 = 0x1000_0000_0000;

impl Mapping {
    /// Reserve `len` bytes aligned to `align` (a power of two).
    pub fn reserve(len: u64, align: u64) -> io::Result<Mapping> {
        Mapping::reserve_at(0, len, align)
    }

    /// Reserve `len` bytes aligned to `align`, at `hint` if that range is free.
    pub fn reserve_at(hint: u64, len: u64, align: u64) -> io::Result<Mapping> {
        let raw_len = len
            .checked_add(align)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: an anonymous mapping at a kernel-chosen address touches no existing memory.
        let p = unsafe {
            sys_mmap(
                hint as *mut libc::c_void,
                raw_len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let raw_base = p as u64;
        let base = (raw_base + align - 1) & !(align - 1);
        let m = Mapping {
            base,
            len,
            raw_base,
            raw_len,
            sealed: false,
        };
        for advice in [libc::MADV_NOHUGEPAGE, libc::MADV_DONTFORK] {
            // SAFETY: advising our own fresh mapping.
            if unsafe { madvise(base, len, advice) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        RESERVED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((raw_base, raw_len));
        Ok(m)
    }

    /// Reserve up to `len` bytes at `hint` if free, halving on failure down to `min` (a strict
    /// overcommit policy or a small address-space limit may refuse a terabyte).
    pub fn reserve_up_to(hint: u64, mut len: u64, min: u64, align: u64) -> io::Result<Mapping> {
        loop {
            match Mapping::reserve_at(hint, len, align) {
                Ok(m) => return Ok(m),
                Err(e) if len / 2 >= min => {
                    let _ = e;
                    len /= 2;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.len
    }

    /// Whether fork() children inherit the mapping (MADV_DOFORK), or have none there
    /// (MADV_DONTFORK, as reserved): a fork that rmem prepares lets the child have a
    /// copy-on-write copy; any other fork (a raw clone) must not hand one to a child that has
    /// no pager for it, which would read zeros where the pages were not resident.
    pub fn inherit(&self, yes: bool) -> io::Result<()> {
        let advice = if yes {
            libc::MADV_DOFORK
        } else {
            libc::MADV_DONTFORK
        };
        // SAFETY: advising our own mapping; fork inheritance changes nothing in this process.
        if unsafe { madvise(self.base, self.len, advice) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Drop the pages of a range: they read as missing again.
    pub fn discard(&self, addr: u64, len: u64) -> io::Result<()> {
        debug_assert!(self.contains(addr) && addr + len <= self.base + self.len);
        // SAFETY: the range lies inside our own mapping; MADV_DONTNEED only drops pages.
        if unsafe { madvise(addr, len, libc::MADV_DONTNEED) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Replace the mapping by one with no access over the same range, kept for the life of
    /// the process: touches fault with SIGSEGV (never zeros, as an unregistered anonymous
    /// mapping would give, nor another mapping's data, as a range given back to the kernel
    /// and reused would). Used when the pager gives up with a handler that does not exit.
    pub fn seal(&mut self) -> io::Result<()> {
        // SAFETY: replacing exactly our own mapping; no pointer into it may be dereferenced
        // successfully afterwards, which is the point.
        let p = unsafe {
            sys_mmap(
                self.raw_base as *mut _,
                self.raw_len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        self.sealed = true;
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.sealed {
            return;
        }
        RESERVED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&r| r != (self.raw_base, self.raw_len));
        // SAFETY: unmapping exactly the mapping we created; nothing else refers to it once the
        // pager has stopped.
        unsafe { libc::munmap(self.raw_base as *mut _, self.raw_len as usize) };
    }
}

/// Geometry of the region: where page `i` lives.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub base: u64,
    pub len: u64,
    pub page_size: u64,
}

impl Geometry {
    pub fn page_of(&self, addr: u64) -> Option<PageIndex> {
        (addr >= self.base && addr - self.base < self.len)
            .then(|| PageIndex((addr - self.base) / self.page_size))
    }

    pub fn addr_of(&self, page: PageIndex) -> u64 {
        self.base + page.0 * self.page_size
    }

    pub fn pages(&self) -> u64 {
        self.len / self.page_size
    }
}

/// Fixed slots in the staging mapping, one per in-flight write-back.
///
/// A victim is moved into an empty slot (`UFFDIO_MOVE` moves only into holes), so a slot is
/// emptied (MADV_DONTNEED) before it is taken again. Emptying one slot at a time, as each
/// write-back landed, made every landing flush the TLBs of every CPU running the program (an
/// interrupt to each): on GNU sort at a quarter of its footprint that was a fifth of the
/// pager's time. Released slots are therefore kept as they are and emptied together, in one
/// batch ([`Dropper::discard`]: one flush), when no empty slot is left.
#[derive(Debug)]
pub struct Staging {
    pub mapping: Mapping,
    slot_size: u64,
    /// Empty slots.
    free: Vec<u32>,
    /// Released slots that still hold their page.
    used: Vec<u32>,
    addrs: Vec<u64>,
}

impl Staging {
    pub fn new(slots: usize, slot_size: u64) -> io::Result<Staging> {
        let mapping = Mapping::reserve(slots as u64 * slot_size, slot_size.max(4096))?;
        Ok(Staging {
            mapping,
            slot_size,
            free: (0..slots as u32).rev().collect(),
            used: Vec::with_capacity(slots),
            addrs: Vec::with_capacity(slots),
        })
    }

    /// An empty slot, if any is not holding a page in flight; the released ones are emptied
    /// first if none is empty.
    pub fn take(&mut self, dropper: &mut Dropper) -> io::Result<Option<u32>> {
        if self.free.is_empty() && !self.used.is_empty() {
            self.addrs.clear();
            for &slot in &self.used {
                self.addrs
                    .push(self.mapping.base() + slot as u64 * self.slot_size);
            }
            dropper.discard(&self.mapping, &self.addrs, self.slot_size)?;
            self.free.append(&mut self.used);
        }
        Ok(self.free.pop())
    }

    /// Slots not holding a page in flight.
    pub fn available(&self) -> usize {
        self.free.len() + self.used.len()
    }

    /// A slot's page is no longer needed: it is emptied with others before it is taken again.
    pub fn release(&mut self, slot: u32) {
        assert!(
            !self.free.contains(&slot) && !self.used.contains(&slot),
            "staging slot {slot} released twice"
        );
        self.used.push(slot);
    }

    pub fn addr(&self, slot: u32) -> u64 {
        self.mapping.base() + slot as u64 * self.slot_size
    }

    /// The bytes of a slot that holds a moved page.
    ///
    /// # Safety
    /// The slot must hold a page moved in with `UFFDIO_MOVE` and not yet released; the
    /// staging range is never touched by the application, so nothing else writes it.
    pub unsafe fn bytes(&self, slot: u32) -> &[u8] {
        // SAFETY: per the contract above, the slot is populated and stable.
        unsafe { std::slice::from_raw_parts(self.addr(slot) as *const u8, self.slot_size as usize) }
    }

    /// The bytes of a slot that holds a moved page, to change them.
    ///
    /// # Safety
    /// As [`Staging::bytes`].
    pub unsafe fn bytes_mut(&mut self, slot: u32) -> &mut [u8] {
        // SAFETY: per the contract above, the slot is populated, and only the pager, which
        // holds `self` mutably, touches it.
        unsafe {
            std::slice::from_raw_parts_mut(self.addr(slot) as *mut u8, self.slot_size as usize)
        }
    }
}

/// Drops many pages of a mapping in one system call: `process_madvise(2)` on our own process
/// takes a list of ranges and (from Linux 6.16) flushes the TLBs once for the whole list,
/// where one madvise(2) per page interrupts every other CPU running the program once per
/// page. Falls back to one madvise(2) per range where the kernel refuses (before 6.13 it
/// takes no MADV_DONTNEED).
#[derive(Debug)]
pub struct Dropper {
    pidfd: Option<OwnedFd>,
}

impl Default for Dropper {
    fn default() -> Dropper {
        Dropper::new()
    }
}

impl Dropper {
    /// Most ranges per system call (the kernel's UIO_MAXIOV is 1024).
    const BATCH: usize = 64;

    pub fn new() -> Dropper {
        // SAFETY: pidfd_open on our own pid creates a new descriptor or fails.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
        Dropper {
            // SAFETY: a fresh descriptor that nothing else owns.
            pidfd: (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        }
    }

    /// One that has no pidfd yet ([`Dropper::open`]): a fork child's, made before its pager
    /// has a descriptor table of its own.
    pub fn closed() -> Dropper {
        Dropper { pidfd: None }
    }

    /// Open the pidfd if there is none (a no-op where the kernel refused it before: then the
    /// fallback is used anyway).
    pub fn open(&mut self) {
        if self.pidfd.is_none() {
            *self = Dropper::new();
        }
    }

    /// The pidfd, if pidfd_open worked.
    pub fn fd(&self) -> Option<std::os::fd::RawFd> {
        self.pidfd.as_ref().map(|f| f.as_raw_fd())
    }

    /// MADV_DONTNEED each `len`-byte range starting at `addrs`, all inside `m`.
    pub fn discard(&mut self, m: &Mapping, addrs: &[u64], len: u64) -> io::Result<()> {
        for chunk in addrs.chunks(Self::BATCH) {
            let done = self.discard_batch(chunk, len);
            // Whatever the batch call did not cover goes one range at a time (advising a
            // range twice is harmless), which also reports a real error with its range.
            for &a in &chunk[done..] {
                m.discard(a, len)?;
            }
        }
        Ok(())
    }

    /// Ranges of `chunk` fully discarded by one process_madvise call.
    fn discard_batch(&mut self, chunk: &[u64], len: u64) -> usize {
        let Some(fd) = &self.pidfd else { return 0 };
        if chunk.len() < 2 {
            return 0;
        }
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; Self::BATCH];
        for (v, &a) in iov.iter_mut().zip(chunk) {
            v.iov_base = a as *mut libc::c_void;
            v.iov_len = len as usize;
        }
        // SAFETY: `iov` holds chunk.len() valid entries naming ranges of our own mapping;
        // MADV_DONTNEED only drops their pages.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                fd.as_raw_fd(),
                iov.as_ptr(),
                chunk.len(),
                libc::MADV_DONTNEED,
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error().raw_os_error();
            if matches!(
                e,
                Some(libc::EINVAL | libc::ENOSYS | libc::EPERM | libc::EBADF | libc::ESRCH)
            ) {
                // This kernel does not take the call: stop trying.
                self.pidfd = None;
            }
            return 0;
        }
        (r as u64 / len) as usize
    }
}

/// madvise(2) by system call: librmem interposes the `madvise` symbol to ignore the program's
/// advice on the region, and rmem's own advice must not be ignored.
///
/// # Safety
/// As madvise(2): the range must not hold memory anything else relies on.
unsafe fn madvise(addr: u64, len: u64, advice: libc::c_int) -> libc::c_long {
    // SAFETY: the caller's contract; the kernel validates the range.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Write a marker to every 4 KiB page, drop every other one, check what reads zero.
    fn drop_every_other(mut dropper: Dropper) -> Dropper {
        const PAGES: u64 = 200;
        let m = Mapping::reserve(PAGES * 4096, 4096).unwrap();
        let at = |i: u64| (m.base() + i * 4096) as *mut u8;
        for i in 0..PAGES {
            // SAFETY: inside our own fresh read-write mapping.
            unsafe { at(i).write(i as u8 | 1) };
        }
        let addrs: Vec<u64> = (0..PAGES).step_by(2).map(|i| m.base() + i * 4096).collect();
        dropper.discard(&m, &addrs, 4096).unwrap();
        for i in 0..PAGES {
            // SAFETY: as above; a dropped page reads as a fresh zero page.
            let v = unsafe { at(i).read() };
            let want = if i % 2 == 0 { 0 } else { i as u8 | 1 };
            assert_eq!(v, want, "page {i}");
        }
        dropper
    }

    #[test]
    fn dropper_discards_exactly_the_listed_pages() {
        let d = drop_every_other(Dropper::new());
        if d.pidfd.is_none() {
            // Linux before 6.13: the fallback did the work, tested below as well.
            crate::tell!(
                "process_madvise(MADV_DONTNEED) refused by this kernel: batch path untested"
            );
        }
    }

    #[test]
    fn dropper_without_process_madvise_falls_back_to_madvise() {
        drop_every_other(Dropper { pidfd: None });
    }

    /// A released slot keeps its page until no empty slot is left; every slot taken is empty
    /// (UFFDIO_MOVE moves only into holes).
    #[test]
    fn staging_slots_are_empty_when_taken() {
        for mut dropper in [Dropper::new(), Dropper { pidfd: None }] {
            let mut st = Staging::new(4, 16384).unwrap();
            let fill = |st: &Staging, slot: u32| {
                // SAFETY: inside the staging mapping, which nothing else uses here.
                unsafe { std::ptr::write_bytes(st.addr(slot) as *mut u8, 0xAB, 16384) };
            };
            let empty = |st: &Staging, slot: u32| {
                // SAFETY: a slot of the mapping; a dropped page reads as zeros.
                unsafe { st.bytes(slot) }.iter().all(|&b| b == 0)
            };
            let mut held: Vec<u32> = (0..4)
                .map(|_| st.take(&mut dropper).unwrap().unwrap())
                .collect();
            assert_eq!(st.take(&mut dropper).unwrap(), None, "four slots");
            for &s in &held {
                fill(&st, s);
            }
            st.release(held.pop().unwrap());
            st.release(held.pop().unwrap());
            assert_eq!(st.available(), 2);
            for _ in 0..2 {
                let s = st.take(&mut dropper).unwrap().unwrap();
                assert!(empty(&st, s), "slot {s} taken with a page in it");
                fill(&st, s);
                held.push(s);
            }
            for s in held {
                st.release(s);
            }
            for _ in 0..4 {
                let s = st.take(&mut dropper).unwrap().unwrap();
                assert!(empty(&st, s), "slot {s} taken with a page in it");
            }
        }
    }
}
