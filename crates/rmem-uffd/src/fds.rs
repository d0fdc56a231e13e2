//! rmem's file descriptors, kept out of the program's way.
//!
//! A program that closes or overwrites descriptors it does not know about (`dup2` onto a low
//! number, `close_range(3, ~0)` at start, a loop closing every descriptor, bash's
//! `exec 6>file`) must never reach rmem's: closing the userfaultfd unregisters the region, and
//! the program then reads zeros where its data was.
//!
//! Two mechanisms, one per kind of descriptor:
//!
//! - **Private** descriptors (the userfaultfd, server sockets, `/proc/self/pagemap`, the pidfd)
//!   are used by the pager thread alone. The pager gives itself its own descriptor table
//!   ([`isolate_thread`], `unshare(CLONE_FILES)`), and the runtime then closes their copies in
//!   the program's table. Nothing the program does to its table, system calls included, can
//!   reach them, and the low numbers they were created on are free for the program again.
//! - **Shared** descriptors (the pager's wake-up eventfds, written by program threads) stay in
//!   the program's table, moved by [`place`] to a reserved range of [`SLOTS`] numbers: from the
//!   open-file soft limit up when the hard limit leaves room (no `open`, `dup` or `dup2` of the
//!   program can produce such a number unless it raises its limit), else the top [`SLOTS`]
//!   numbers below the soft limit (or below [`FD_CEILING`] when the limit is larger, so that the
//!   kernel's descriptor table stays small). They are close-on-exec, and librmem's `close`,
//!   `dup2`, `dup3`, `close_range` and `closefrom` leave them alone ([`is_rmem`]).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Numbers reserved for rmem's shared descriptors.
pub const SLOTS: i32 = 64;
/// The reserved range never starts above this, whatever the limit: the kernel's descriptor
/// table grows to the highest open number, and a fork copies it.
pub const FD_CEILING: i32 = 1 << 16;

/// The reserved range `[lo, lo + SLOTS)`, fixed at first use.
static RANGE: OnceLock<i32> = OnceLock::new();
/// Which slots of the range hold one of rmem's descriptors now.
static USED: AtomicU64 = AtomicU64::new(0);

fn nofile() -> (u64, u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return (1024, 1024);
    }
    (r.rlim_cur, r.rlim_max)
}

/// The first number of the reserved range (see the module doc for how it is chosen).
pub fn range_start() -> i32 {
    *RANGE.get_or_init(|| {
        let (soft, hard) = nofile();
        let ceiling = FD_CEILING as u64;
        let slots = SLOTS as u64;
        let lo = if soft + slots <= hard.min(ceiling) {
            soft
        } else {
            soft.min(ceiling).max(2 * slots) - slots
        };
        lo as i32
    })
}

/// `fd` is one of rmem's shared descriptors in this process.
pub fn is_rmem(fd: RawFd) -> bool {
    let slot = fd.wrapping_sub(range_start());
    (0..SLOTS).contains(&slot) && USED.load(Ordering::Acquire) & (1 << slot) != 0
}

/// Forget every shared descriptor: in a fork() child, whose table is its own and whose pager
/// does not exist, the program may do what it likes with those numbers.
pub fn forget_all() {
    USED.store(0, Ordering::Release);
}

/// Move `fd` into the reserved range, close-on-exec, and mark it as rmem's. The returned
/// descriptor clears the mark when it is dropped (closed in the table of the thread that
/// drops it: drop it on a thread that shares the program's table).
pub fn place(fd: OwnedFd) -> io::Result<Reserved> {
    let lo = range_start();
    let hi = lo + SLOTS;
    let (soft, hard) = nofile();
    // F_DUPFD refuses a minimum at or above the soft limit: raise it for the one call. The
    // descriptor stays valid once the limit is back (the limit is checked only when a number
    // is handed out).
    let raise = (soft as i64) < hi as i64 && hi as u64 <= hard;
    let set = |cur: u64| {
        let r = libc::rlimit {
            rlim_cur: cur,
            rlim_max: hard,
        };
        // SAFETY: setrlimit reads the struct it is given.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }
    };
    if raise && set(hi as u64) != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new one or fails.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, lo) };
    let err = io::Error::last_os_error();
    if raise {
        set(soft);
    }
    if moved < 0 {
        return Err(err);
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let moved = unsafe { OwnedFd::from_raw_fd(moved) };
    if moved.as_raw_fd() >= hi {
        return Err(io::Error::other(format!(
            "all {SLOTS} descriptor numbers rmem reserves ({lo}..{hi}) are taken"
        )));
    }
    USED.fetch_or(1 << (moved.as_raw_fd() - lo), Ordering::AcqRel);
    Ok(Reserved(moved))
}

/// One of rmem's shared descriptors in the reserved range (see [`place`]).
#[derive(Debug)]
pub struct Reserved(OwnedFd);

impl Reserved {
    /// The descriptor, marked as rmem's for the life of the process (until exec closes it):
    /// for one whose owner moves to the pager's own table while the program table keeps a
    /// copy nobody will close.
    pub fn into_kept(self) -> OwnedFd {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: moved out of a value that is never dropped.
        unsafe { std::ptr::read(&this.0) }
    }

    /// Take over the program table's copy of a descriptor that [`place`] marked and whose
    /// first owner went with the pager's own table (see [`isolate_thread`]).
    ///
    /// # Safety
    /// `fd` must be open in the calling thread's table and owned by nothing else there.
    pub unsafe fn adopt(fd: RawFd) -> Reserved {
        // SAFETY: guaranteed by the caller.
        Reserved(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl AsRawFd for Reserved {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        unmark(self.0.as_raw_fd());
    }
}

/// `fd` is no longer one of rmem's shared descriptors: the program's close of it (and
/// rmem's own, which goes through the same interposer) closes it again.
pub fn unmark(fd: RawFd) {
    let slot = fd - range_start();
    if (0..SLOTS).contains(&slot) {
        USED.fetch_and(!(1 << slot), Ordering::AcqRel);
    }
}

/// A shared descriptor that steps aside when the program `dup2`s onto its number: where the
/// reserved range lies below the program's limit, the program may name it, and must get it.
/// Users take the number through [`Movable::with`], under the lock a move takes.
#[derive(Debug)]
pub struct Movable {
    fd: Mutex<Reserved>,
}

/// Every live [`Movable`], for [`make_way`].
static MOVABLES: Mutex<Vec<Weak<Movable>>> = Mutex::new(Vec::new());

impl Movable {
    /// [`place`] `fd` and register it so that it can be moved.
    pub fn new(fd: OwnedFd) -> io::Result<Arc<Movable>> {
        let m = Arc::new(Movable {
            fd: Mutex::new(place(fd)?),
        });
        let mut all = MOVABLES.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&m));
        Ok(m)
    }

    /// Call `f` with the descriptor's current number; it does not move meanwhile.
    pub fn with<R>(&self, f: impl FnOnce(RawFd) -> R) -> R {
        let fd = self.fd.lock().unwrap_or_else(|e| e.into_inner());
        f(fd.as_raw_fd())
    }
}

/// The registry of movable descriptors, held across a fork() so that the child's copy is not
/// locked by a thread that does not exist there (the child makes a [`Movable`] for its own
/// pager's mailbox).
pub struct MovablesHeld(#[allow(dead_code)] std::sync::MutexGuard<'static, Vec<Weak<Movable>>>);

/// Hold the registry of movable descriptors (see [`MovablesHeld`]).
pub fn hold_movables() -> MovablesHeld {
    MovablesHeld(MOVABLES.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Move rmem's descriptor on number `fd` to another reserved number, so that the program can
/// have `fd`. False when it cannot move (not a [`Movable`], or no free reserved number).
pub fn make_way(fd: RawFd) -> bool {
    let all: Vec<Arc<Movable>> = {
        let all = MOVABLES.lock().unwrap_or_else(|e| e.into_inner());
        all.iter().filter_map(Weak::upgrade).collect()
    };
    for m in all {
        let mut cur = m.fd.lock().unwrap_or_else(|e| e.into_inner());
        if cur.as_raw_fd() != fd {
            continue;
        }
        // SAFETY: F_DUPFD_CLOEXEC on an open descriptor returns a new one or fails.
        let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return false;
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        match place(unsafe { OwnedFd::from_raw_fd(copy) }) {
            // The old number closes as `cur` is replaced, under the lock.
            Ok(moved) => *cur = moved,
            Err(_) => return false,
        }
        return true;
    }
    false
}

/// Give the calling thread a descriptor table of its own, a copy of the shared one: from now
/// on, what the program does to its descriptors cannot reach this thread's, and the reverse.
pub fn isolate_thread() -> io::Result<()> {
    // SAFETY: unshare(CLONE_FILES) affects only the calling thread's descriptor table.
    if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A copy, in the calling thread's table, of descriptor `fd` of the program's table (the one
/// the process's first thread uses): how the pager, whose table is its own, takes a descriptor
/// a program thread made for it. `pidfd` names this process. pidfd_getfd(2), Linux 5.6; a
/// process may always take its own descriptors.
pub fn take_from_program(pidfd: RawFd, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd returns a new descriptor or fails; it changes nothing else.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor (close-on-exec) that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// In a fork() child: forget every shared descriptor but `keep` (see [`forget_all`]).
pub fn forget_all_but(keep: &Reserved) {
    forget_all();
    let slot = keep.as_raw_fd() - range_start();
    if (0..SLOTS).contains(&slot) {
        USED.fetch_or(1 << slot, Ordering::AcqRel);
    }
}

/// Close every descriptor of the calling thread's table but those in `keep` (the raw system
/// call, range by range). For a pager whose table was the program's at a fork: the copies of
/// the program's descriptors it holds would keep pipes open after the program closed them, so
/// a reader would wait for an end of file that never comes.
pub fn close_all_but(keep: &[RawFd]) {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter_map(|&fd| u32::try_from(fd).ok())
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from = 0u32;
    for k in keep.into_iter().chain([u32::MAX]) {
        if k > from {
            // SAFETY: close_range closes numbers in the calling thread's table only; the
            // caller owns nothing there outside `keep`.
            unsafe { libc::syscall(libc::SYS_close_range, from, k - 1, 0) };
        }
        from = k.saturating_add(1);
    }
}

/// Close `fd` in the calling thread's table (the raw system call: librmem's `close` would
/// refuse one of rmem's own numbers).
pub fn close_raw(fd: RawFd) {
    // SAFETY: closing a number; the caller says it is a copy nothing in this table uses.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;
    use std::sync::Mutex;

    /// Tests that place descriptors and then check a number is closed run one at a time: the
    /// reserved numbers are the process's, and a parallel test would take the freed one.
    static PLACING: Mutex<()> = Mutex::new(());

    fn eventfd() -> OwnedFd {
        // SAFETY: eventfd returns a fresh descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fresh and owned by nobody else.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    #[test]
    fn placed_descriptors_are_high_close_on_exec_and_marked_until_dropped() {
        let _one = PLACING.lock().unwrap_or_else(|e| e.into_inner());
        let r = place(eventfd()).unwrap();
        let fd = r.as_raw_fd();
        assert!(fd >= range_start() && fd < range_start() + SLOTS, "{fd}");
        assert!(
            fd >= 64,
            "rmem's descriptors sit far above the low numbers: {fd}"
        );
        assert!(is_rmem(fd));
        // SAFETY: F_GETFD on an open descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        let (soft, _) = nofile();
        assert!(
            soft >= 64,
            "the soft limit is restored after placing: {soft}"
        );
        drop(r);
        assert!(!is_rmem(fd));
        // SAFETY: F_GETFD on a closed number fails with EBADF.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_GETFD) }, -1);
    }

    #[test]
    fn a_movable_descriptor_moves_off_a_number_the_program_wants() {
        let _one = PLACING.lock().unwrap_or_else(|e| e.into_inner());
        let m = Movable::new(eventfd()).unwrap();
        let before = m.with(|fd| fd);
        assert!(make_way(before));
        let after = m.with(|fd| fd);
        assert_ne!(before, after);
        assert!(is_rmem(after));
        // SAFETY: F_GETFD on a closed number fails with EBADF.
        assert_eq!(unsafe { libc::fcntl(before, libc::F_GETFD) }, -1);
        assert!(!make_way(before), "nothing of rmem's is there any more");
        let one = 1u64;
        // SAFETY: an 8-byte write from a valid u64 to the eventfd.
        let n = m.with(|fd| unsafe { libc::write(fd, (&one as *const u64).cast(), 8) });
        assert_eq!(n, 8);
    }

    #[test]
    fn an_isolated_thread_keeps_its_descriptors_when_the_program_closes_them() {
        let _one = PLACING.lock().unwrap_or_else(|e| e.into_inner());
        let fd = eventfd().into_raw_fd();
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            isolate_thread().unwrap();
            tx.send(()).unwrap();
            go_rx.recv().unwrap();
            // SAFETY: F_GETFD on a number of this thread's own table.
            let alive = unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
            close_raw(fd);
            alive
        });
        rx.recv().unwrap();
        // Not checked closed here: a test beside this one may open a descriptor on the number.
        close_raw(fd);
        go_tx.send(()).unwrap();
        assert!(t.join().unwrap(), "the isolated thread's copy survived");
    }
}
