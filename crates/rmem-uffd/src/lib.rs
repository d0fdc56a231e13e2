//! rmem-uffd: the userfaultfd layer under rmem's fault path.
//!
//! Entry point: [`Uffd::open`], which opens a userfaultfd the most capable way this process
//! is allowed to ([`OpenMode`]): `/dev/userfaultfd`, then the `userfaultfd(2)` syscall with
//! kernel-mode faults, then `UFFD_USER_MODE_ONLY` for unprivileged users. It negotiates the
//! features rmem needs (write-protect faults, and `UFFDIO_MOVE` where present) and exposes
//! the ioctls as safe methods over raw addresses ([`Uffd::copy`], [`Uffd::write_protect`],
//! [`Uffd::move_range`], [`Uffd::wake`], [`Uffd::read_events`]).
//!
//! Written on libc ioctls because the `userfaultfd` crate needs libclang, lacks WP_ASYNC and
//! MOVE, and fails instead of falling back when `/dev/userfaultfd` exists but cannot be opened.
//! The kernel headers on Debian 12 predate MOVE, so the constants are defined here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

pub mod fds;
mod signal;
pub use signal::{handle_sigbus, sigbus_previous_action};

const UFFDIO: u64 = 0xAA;
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}

const UFFD_API: u64 = 0xAA;
const USERFAULTFD_IOC_NEW: u64 = ioc(0, 0x00, 0);
const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, 0x3F, 24);
const UFFDIO_REGISTER: u64 = ioc(IOC_READ | IOC_WRITE, 0x00, 32);
const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, 0x01, 16);
const UFFDIO_WAKE: u64 = ioc(IOC_READ, 0x02, 16);
const UFFDIO_COPY: u64 = ioc(IOC_READ | IOC_WRITE, 0x03, 40);
const UFFDIO_ZEROPAGE: u64 = ioc(IOC_READ | IOC_WRITE, 0x04, 32);
const UFFDIO_MOVE: u64 = ioc(IOC_READ | IOC_WRITE, 0x05, 40);
const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_READ | IOC_WRITE, 0x06, 24);

/// `UFFD_USER_MODE_ONLY`: only user-mode faults are reported; kernel accesses get EFAULT.
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

/// Feature bits of `UFFDIO_API`.
pub mod feature {
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    pub const THREAD_ID: u64 = 1 << 8;
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    pub const POISON: u64 = 1 << 14;
    pub const WP_ASYNC: u64 = 1 << 15;
    pub const MOVE: u64 = 1 << 16;
    pub const SIGBUS: u64 = 1 << 7;
}

const REGISTER_MODE_MISSING: u64 = 1 << 0;
const REGISTER_MODE_WP: u64 = 1 << 1;
const COPY_MODE_DONTWAKE: u64 = 1 << 0;
const COPY_MODE_WP: u64 = 1 << 1;
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;

const EVENT_PAGEFAULT: u8 = 0x12;
const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// `struct uffd_msg`: 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    arg0: u64,
    arg1: u64,
    arg2: u64,
}

/// How the userfaultfd was opened; decides whether kernel-mode accesses (a `read(2)` into a
/// non-resident buffer) are resolved or fail with EFAULT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Through `/dev/userfaultfd`: kernel-mode faults are handled.
    DevNode,
    /// Through the syscall with kernel-mode faults (root, CAP_SYS_PTRACE, or
    /// vm.unprivileged_userfaultfd=1).
    Syscall,
    /// Through the syscall with `UFFD_USER_MODE_ONLY`: kernel accesses to missing pages fail
    /// with EFAULT instead of faulting.
    UserModeOnly,
}

impl OpenMode {
    pub fn handles_kernel_faults(self) -> bool {
        !matches!(self, OpenMode::UserModeOnly)
    }
    pub fn name(self) -> &'static str {
        match self {
            OpenMode::DevNode => "dev-userfaultfd",
            OpenMode::Syscall => "syscall",
            OpenMode::UserModeOnly => "user-mode-only",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UffdError {
    /// Every way of opening a userfaultfd failed.
    #[error("cannot open a userfaultfd (/dev/userfaultfd: {dev}; syscall: {syscall}; user-mode-only syscall: {user})")]
    Open {
        dev: io::Error,
        syscall: io::Error,
        user: io::Error,
    },
    #[error("UFFDIO_API handshake failed")]
    Api(#[source] io::Error),
    #[error(
        "the kernel lacks userfaultfd write-protect support for anonymous memory (features {0:#x})"
    )]
    NoWriteProtect(u64),
    #[error("UFFDIO_REGISTER of {len} bytes at {start:#x} failed")]
    Register {
        start: u64,
        len: u64,
        source: io::Error,
    },
    #[error("{op} of {len} bytes at {addr:#x} failed")]
    Ioctl {
        op: &'static str,
        addr: u64,
        len: u64,
        source: io::Error,
    },
    #[error("reading userfaultfd events failed")]
    Read(#[source] io::Error),
    #[error("fault delivery by signal is not available")]
    Signal(#[source] io::Error),
}

/// One page-fault event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Faulting address (page-aligned by the kernel unless EXACT_ADDRESS was negotiated).
    pub address: u64,
    /// The access was a write.
    pub write: bool,
    /// A write-protect fault (the page is present but write-protected), not a missing page.
    pub write_protect: bool,
}

/// The size of the kernel's pages, the unit the resolve ioctls map (x86-64).
pub const PIECE: u64 = 4096;

/// What [`Uffd::copy`] installed.
#[must_use = "pieces already populated were left as they were"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Copied {
    /// Every piece of the range.
    Whole,
    /// Every piece except these (byte offsets from the destination, one per [`PIECE`]), which
    /// the kernel found populated (EEXIST) and which were left as they were.
    Around(Vec<u64>),
}

/// What [`Uffd::move_range`] did.
#[must_use = "an unwritten range was left where it is"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moved {
    /// Every piece is at the destination now.
    All,
    /// Nothing moved: every piece is shared copy-on-write with a `fork()` parent or child and
    /// this process has not written it since (asked for with `keep_unwritten`).
    Unwritten,
}

/// `MADV_POPULATE_WRITE` (Linux 5.14): fault a range in for writing, which copies a page
/// shared copy-on-write.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Result of a resolve ioctl that may legitimately lose a race.
#[must_use = "the range may have been populated by someone else"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolve {
    Done,
    /// The destination was already populated (EEXIST): another resolution won.
    AlreadyMapped,
}

/// An open userfaultfd.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    mode: OpenMode,
    features: u64,
    /// /proc/self/pagemap, to check what a failed UFFDIO_MOVE really did (None without /proc).
    pagemap: Option<std::fs::File>,
    /// Fault delivery by SIGBUS ([`Uffd::open_signal`]).
    signal: Option<SignalDelivery>,
    /// Ranges registered for missing faults whose write-protect registration waits for the
    /// first call that protects a page ([`Uffd::register_wp_later`]).
    wp_later: Mutex<Vec<(u64, u64)>>,
    /// `wp_later` is not empty (read without the lock on every install).
    wp_waiting: AtomicBool,
}

/// The state of a userfaultfd whose faults arrive by signal (see `signal.rs`).
#[derive(Debug)]
struct SignalDelivery {
    owner: u64,
    /// Written by a faulting thread's handler when the pager sleeps: a program thread, so
    /// the descriptor is one of rmem's shared ones.
    kick: fds::Reserved,
    /// Slots taken by the pager and not completed yet: (slot, page address).
    waiting: Mutex<Vec<(u32, u64)>>,
}

impl Drop for Uffd {
    fn drop(&mut self) {
        if let Some(s) = &self.signal {
            signal::remove_ranges(s.owner);
        }
    }
}

fn errno() -> io::Error {
    io::Error::last_os_error()
}

fn open_raw(user_mode_only: bool) -> Result<(OwnedFd, OpenMode), UffdError> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    if user_mode_only {
        // SAFETY: the userfaultfd syscall takes an int flags argument and returns an fd or -1.
        let fd =
            unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY) } as RawFd;
        if fd >= 0 {
            // SAFETY: fresh descriptor from the kernel.
            return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, OpenMode::UserModeOnly));
        }
        let e = errno();
        return Err(UffdError::Open {
            dev: io::Error::from_raw_os_error(libc::EPERM),
            syscall: io::Error::from_raw_os_error(libc::EPERM),
            user: e,
        });
    }
    let dev = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
    {
        Ok(f) => {
            // SAFETY: USERFAULTFD_IOC_NEW takes the open flags by value and returns a new fd.
            let fd = unsafe { libc::ioctl(f.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
            if fd >= 0 {
                // SAFETY: fd is a fresh descriptor returned by the kernel and owned by nobody else.
                return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, OpenMode::DevNode));
            }
            errno()
        }
        Err(e) => e,
    };
    // SAFETY: the userfaultfd syscall takes an int flags argument and returns an fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as RawFd;
    if fd >= 0 {
        // SAFETY: fresh descriptor from the kernel.
        return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, OpenMode::Syscall));
    }
    let syscall = errno();
    // SAFETY: as above, with UFFD_USER_MODE_ONLY.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY) } as RawFd;
    if fd >= 0 {
        // SAFETY: fresh descriptor from the kernel.
        return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, OpenMode::UserModeOnly));
    }
    Err(UffdError::Open {
        dev,
        syscall,
        user: errno(),
    })
}

fn api(fd: RawFd, features: u64) -> io::Result<u64> {
    let mut a = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: `a` is a valid, exclusively borrowed uffdio_api for the duration of the call.
    if unsafe { libc::ioctl(fd, UFFDIO_API as _, &mut a) } != 0 {
        return Err(errno());
    }
    Ok(a.features)
}

impl Uffd {
    /// Open a userfaultfd (non-blocking, close-on-exec) and negotiate write-protect faults plus
    /// MOVE when the kernel has it. Fails if write-protect is unavailable: rmem's dirty
    /// tracking depends on it.
    pub fn open() -> Result<Uffd, UffdError> {
        Uffd::open_as(false)
    }

    /// As [`Uffd::open`]; with `user_mode_only`, go straight to `UFFD_USER_MODE_ONLY` even
    /// where kernel-mode faults are allowed (to run and test the unprivileged path as root).
    pub fn open_as(user_mode_only: bool) -> Result<Uffd, UffdError> {
        Uffd::open_with(user_mode_only, false)
    }

    /// As [`Uffd::open_as`], with faults delivered by signal: the faulting thread waits in
    /// rmem's SIGBUS handler, not in the kernel (see `signal.rs` for what that costs). Kernel
    /// accesses to missing pages then fail with EFAULT, as in user-mode-only mode.
    pub fn open_signal(user_mode_only: bool) -> Result<Uffd, UffdError> {
        if !cfg!(target_arch = "x86_64") {
            return Err(UffdError::Signal(io::Error::new(
                io::ErrorKind::Unsupported,
                "fault delivery by signal is implemented for x86-64 only",
            )));
        }
        Uffd::open_with(user_mode_only, true)
    }

    fn open_with(user_mode_only: bool, by_signal: bool) -> Result<Uffd, UffdError> {
        // Probe the available features on a throwaway descriptor: UFFDIO_API may be issued
        // only once per descriptor.
        let (probe, _) = open_raw(user_mode_only)?;
        let available = api(probe.as_raw_fd(), 0).map_err(UffdError::Api)?;
        drop(probe);
        if available & feature::PAGEFAULT_FLAG_WP == 0 {
            return Err(UffdError::NoWriteProtect(available));
        }
        let mut wanted = feature::PAGEFAULT_FLAG_WP | feature::MOVE;
        if by_signal {
            if available & feature::SIGBUS == 0 {
                return Err(UffdError::Signal(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "the kernel lacks UFFD_FEATURE_SIGBUS",
                )));
            }
            wanted |= feature::SIGBUS;
        }
        let (fd, mode) = open_raw(user_mode_only)?;
        // The kernel answers with every feature it has; the descriptor has those asked for.
        let features = wanted & available;
        api(fd.as_raw_fd(), features).map_err(UffdError::Api)?;
        let signal = if by_signal {
            signal::install().map_err(UffdError::Signal)?;
            // SAFETY: eventfd creates a new descriptor or fails.
            let kick = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if kick < 0 {
                return Err(UffdError::Signal(errno()));
            }
            // SAFETY: a fresh descriptor that nothing else owns.
            let kick =
                fds::place(unsafe { OwnedFd::from_raw_fd(kick) }).map_err(UffdError::Signal)?;
            Some(SignalDelivery {
                owner: signal::new_owner(),
                kick,
                waiting: Mutex::new(Vec::new()),
            })
        } else {
            None
        };
        Ok(Uffd {
            fd,
            mode,
            features,
            pagemap: std::fs::File::open("/proc/self/pagemap").ok(),
            signal,
            wp_later: Mutex::new(Vec::new()),
            wp_waiting: AtomicBool::new(false),
        })
    }

    /// A new userfaultfd opened the way this one was, with the features it has. A `fork()`
    /// child calls it on its copy of its parent's: the kernel drops the child's registrations
    /// (this descriptor serves the parent's memory), so the child opens its own. Not with
    /// faults by signal. The descriptor is moved among rmem's reserved numbers (`fds::place`),
    /// where the program's close calls leave it alone until the program's thread has taken a
    /// table of its own and closed its copy; the pagemap is opened later, by the pager itself
    /// ([`Uffd::open_pagemap`]).
    pub fn reopen(&self) -> Result<Uffd, UffdError> {
        if self.signal.is_some() {
            return Err(UffdError::Signal(io::Error::new(
                io::ErrorKind::Unsupported,
                "a fork() child cannot take over faults delivered by signal",
            )));
        }
        self.reopen_with(self.features)
    }

    /// A new userfaultfd opened the way this one was, with `UFFD_FEATURE_SIGBUS` alone: a
    /// missing page registered with it raises SIGBUS in the thread that touches it (and a
    /// system call that touches it fails with EFAULT) instead of waiting for a handler. For a
    /// fork() child's first moments, before its pager can exist: a touch of a page it lacks
    /// then fails at once, where it would wait for good. It serves nothing.
    pub fn reopen_sigbus(&self) -> Result<Uffd, UffdError> {
        self.reopen_with(feature::SIGBUS)
    }

    /// Close it now, in the calling thread's table, which unregisters what it registered.
    /// A reopened userfaultfd is marked as rmem's (`fds::place`), and librmem's `close`, which
    /// rmem's own drops go through too, leaves marked descriptors open: the mark goes first.
    pub fn close(self) {
        fds::unmark(self.fd.as_raw_fd());
        drop(self);
    }

    fn reopen_with(&self, features: u64) -> Result<Uffd, UffdError> {
        let (fd, mode) = open_raw(self.mode == OpenMode::UserModeOnly)?;
        api(fd.as_raw_fd(), features).map_err(UffdError::Api)?;
        let fd = fds::place(fd).map_err(UffdError::Api)?.into_kept();
        Ok(Uffd {
            fd,
            mode,
            features,
            pagemap: None,
            signal: None,
            wp_later: Mutex::new(Vec::new()),
            wp_waiting: AtomicBool::new(false),
        })
    }

    /// Open /proc/self/pagemap if it is not open (see [`Uffd::reopen`]).
    pub fn open_pagemap(&mut self) {
        if self.pagemap.is_none() {
            self.pagemap = std::fs::File::open("/proc/self/pagemap").ok();
        }
    }

    pub fn mode(&self) -> OpenMode {
        self.mode
    }

    pub fn features(&self) -> u64 {
        self.features
    }

    pub fn has_move(&self) -> bool {
        self.features & feature::MOVE != 0
    }

    /// Faults arrive by signal ([`Uffd::open_signal`]).
    pub fn by_signal(&self) -> bool {
        self.signal.is_some()
    }

    /// Whether a `read(2)` into a missing page is resolved (rather than failing with EFAULT).
    pub fn handles_kernel_faults(&self) -> bool {
        self.mode.handles_kernel_faults() && self.signal.is_none()
    }

    /// The descriptor to poll for new faults.
    pub fn event_fd(&self) -> RawFd {
        match &self.signal {
            Some(s) => s.kick.as_raw_fd(),
            None => self.fd.as_raw_fd(),
        }
    }

    /// The descriptors that program threads write (the fault-by-signal wake-up), as opposed to
    /// those only the pager uses. See [`fds`].
    pub fn shared_fds(&self) -> Vec<RawFd> {
        self.signal.iter().map(|s| s.kick.as_raw_fd()).collect()
    }

    /// The descriptors only the pager uses: the userfaultfd and /proc/self/pagemap.
    pub fn private_fds(&self) -> Vec<RawFd> {
        let mut v = vec![self.fd.as_raw_fd()];
        v.extend(self.pagemap.as_ref().map(|f| f.as_raw_fd()));
        v
    }

    /// The pager is about to sleep until `event_fd` is readable (`true`), or is awake again.
    /// Returns whether faults are already waiting (then it should not sleep).
    pub fn set_sleeping(&self, sleeping: bool) -> bool {
        match &self.signal {
            Some(s) => {
                if !sleeping {
                    let mut buf = 0u64;
                    // SAFETY: an 8-byte read from our own non-blocking eventfd: drain the
                    // kicks that woke the pager.
                    unsafe { libc::read(s.kick.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
                }
                signal::set_sleeping(s.owner, sleeping)
            }
            None => false,
        }
    }

    /// Let the threads waiting by signal on faults in `[start, start+len)` retry.
    fn complete(&self, start: u64, len: u64) {
        let Some(s) = &self.signal else { return };
        let mut w = s.waiting.lock().unwrap();
        w.retain(|&(slot, addr)| {
            let inside = addr.wrapping_sub(start) < len;
            if inside {
                signal::complete(slot);
            }
            !inside
        });
    }

    fn add_signal_range(&self, start: u64, len: u64) -> Result<(), UffdError> {
        if let Some(s) = &self.signal {
            if !signal::add_range(s.owner, start, len, s.kick.as_raw_fd()) {
                return Err(UffdError::Signal(io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    "too many ranges registered for fault delivery by signal",
                )));
            }
        }
        Ok(())
    }

    /// Register `[start, start+len)` for missing and write-protect faults.
    pub fn register(&self, start: u64, len: u64) -> Result<(), UffdError> {
        self.register_mode(start, len, REGISTER_MODE_MISSING | REGISTER_MODE_WP)?;
        self.add_signal_range(start, len)
    }

    /// Register `[start, start+len)` for missing faults only (a staging area for MOVE).
    pub fn register_missing(&self, start: u64, len: u64) -> Result<(), UffdError> {
        self.register_mode(start, len, REGISTER_MODE_MISSING)?;
        self.add_signal_range(start, len)
    }

    /// Register `[start, start+len)` for missing faults now and for write-protect faults at
    /// the first call that write-protects a page (an install with write protection or
    /// [`Uffd::write_protect`]). For a fork() child, most of which exec at once: the kernel
    /// clears write protection over a write-protect registered range when the descriptor is
    /// released (exec, exit), a walk of every page table entry the range has, which with
    /// tens of MiB resident cost more than the rest of the fork.
    pub fn register_wp_later(&self, start: u64, len: u64) -> Result<(), UffdError> {
        self.register_mode(start, len, REGISTER_MODE_MISSING)?;
        self.wp_later
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((start, len));
        self.wp_waiting.store(true, Ordering::Release);
        self.add_signal_range(start, len)
    }

    /// Add write-protect faults to the ranges [`Uffd::register_wp_later`] left without.
    fn arm_wp(&self) -> Result<(), UffdError> {
        if !self.wp_waiting.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut later = self.wp_later.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(&(start, len)) = later.last() {
            self.register_mode(start, len, REGISTER_MODE_MISSING | REGISTER_MODE_WP)?;
            later.pop();
        }
        self.wp_waiting.store(false, Ordering::Release);
        Ok(())
    }

    fn register_mode(&self, start: u64, len: u64, mode: u64) -> Result<(), UffdError> {
        let mut r = UffdioRegister {
            range: UffdioRange { start, len },
            mode,
            ioctls: 0,
        };
        // SAFETY: `r` is a valid uffdio_register; the kernel validates the range.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER as _, &mut r) } != 0 {
            return Err(UffdError::Register {
                start,
                len,
                source: errno(),
            });
        }
        Ok(())
    }

    pub fn unregister(&self, start: u64, len: u64) -> Result<(), UffdError> {
        let mut r = UffdioRange { start, len };
        // SAFETY: `r` is a valid uffdio_range.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_UNREGISTER as _, &mut r) } != 0 {
            return Err(UffdError::Ioctl {
                op: "UFFDIO_UNREGISTER",
                addr: start,
                len,
                source: errno(),
            });
        }
        Ok(())
    }

    /// Install `len` bytes from `src` at `dst` (a missing range), write-protected if
    /// `write_protect`, and wake the threads waiting on it. Each 4 KiB piece is mapped
    /// atomically. A piece that is already populated is left as it is and every other piece
    /// is still installed: the result names those pieces, and only the caller knows whether
    /// something may be there.
    ///
    /// `src` must point to `len` readable bytes outside any range registered with this
    /// userfaultfd; the kernel reads it with copy_from_user and fails with EFAULT otherwise.
    pub fn copy(
        &self,
        dst: u64,
        src: *const u8,
        len: u64,
        write_protect: bool,
    ) -> Result<Copied, UffdError> {
        let r = self.copy_raw(dst, src, len, write_protect)?;
        self.complete(dst, len);
        Ok(r)
    }

    fn copy_raw(
        &self,
        dst: u64,
        src: *const u8,
        len: u64,
        write_protect: bool,
    ) -> Result<Copied, UffdError> {
        if write_protect {
            self.arm_wp()?;
        }
        let mut mode = if write_protect { COPY_MODE_WP } else { 0 };
        if self.signal.is_some() {
            // Nobody sleeps in the kernel on these pages.
            mode |= COPY_MODE_DONTWAKE;
        }
        let mut done = 0;
        let mut present = Vec::new();
        let mut stalls = 0;
        // One piece per call once the range is found to straddle mappings.
        let mut piecewise = false;
        while done < len {
            let want = if piecewise { PIECE } else { len - done };
            let mut c = UffdioCopy {
                dst: dst + done,
                src: src as u64 + done,
                len: want,
                mode,
                copy: 0,
            };
            // SAFETY: `c` is a valid uffdio_copy; the kernel validates both ranges and reads
            // `src` through copy_from_user, so a bad pointer yields EFAULT, not UB.
            let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_COPY as _, &mut c) };
            if rc == 0 {
                done += want;
                continue;
            }
            let e = errno();
            // The kernel stops at the first piece it cannot install. If it installed some
            // before, it says how many bytes in `copy` (and wakes their waiters) and answers
            // EAGAIN whatever stopped it; the next call from there says what that was.
            if c.copy > 0 {
                done += c.copy as u64;
            }
            match e.raw_os_error() {
                Some(libc::EAGAIN) => {
                    if c.copy <= 0 {
                        // Nothing installed: the mm changed under us. Bounded, as every loop.
                        stalls += 1;
                        if stalls > 1000 {
                            return Err(UffdError::Ioctl {
                                op: "UFFDIO_COPY",
                                addr: dst + done,
                                len: len - done,
                                source: e,
                            });
                        }
                        std::thread::yield_now();
                    }
                }
                // The piece at `done` is populated: leave it, install the rest past it, and
                // tell the caller, who knows whether anything may be there.
                Some(libc::EEXIST) => {
                    present.push(done);
                    done += PIECE;
                }
                // The range must lie in one mapping (VMA): the program's mprotect may have
                // split the region inside a page. Go on a piece at a time.
                Some(libc::ENOENT) if !piecewise && c.copy <= 0 && len - done > PIECE => {
                    piecewise = true;
                }
                _ => {
                    return Err(UffdError::Ioctl {
                        op: "UFFDIO_COPY",
                        addr: dst + done,
                        len: len - done,
                        source: e,
                    })
                }
            }
        }
        if present.is_empty() {
            Ok(Copied::Whole)
        } else {
            // Threads may wait on a populated piece (their fault raced its mapping).
            self.wake(dst, len)?;
            Ok(Copied::Around(present))
        }
    }

    /// Map the zero page over a missing range and wake waiters.
    pub fn zeropage(&self, dst: u64, len: u64) -> Result<Resolve, UffdError> {
        let mut z = UffdioZeropage {
            range: UffdioRange { start: dst, len },
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: `z` is a valid uffdio_zeropage.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_ZEROPAGE as _, &mut z) } != 0 {
            let e = errno();
            if e.raw_os_error() == Some(libc::EEXIST) {
                self.wake(dst, len)?;
                return Ok(Resolve::AlreadyMapped);
            }
            return Err(UffdError::Ioctl {
                op: "UFFDIO_ZEROPAGE",
                addr: dst,
                len,
                source: e,
            });
        }
        self.complete(dst, len);
        Ok(Resolve::Done)
    }

    /// Set (`protect`) or clear write protection on a present range. Clearing also wakes
    /// threads blocked on write-protect faults there, unless `dont_wake`.
    pub fn write_protect(
        &self,
        start: u64,
        len: u64,
        protect: bool,
        dont_wake: bool,
    ) -> Result<(), UffdError> {
        // Clearing needs the registration too: the kernel refuses a range without it.
        self.arm_wp()?;
        let mut mode = if protect { WRITEPROTECT_MODE_WP } else { 0 };
        if dont_wake {
            mode |= WRITEPROTECT_MODE_DONTWAKE;
        }
        let mut w = UffdioWriteprotect {
            range: UffdioRange { start, len },
            mode,
        };
        // SAFETY: `w` is a valid uffdio_writeprotect.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WRITEPROTECT as _, &mut w) } != 0 {
            return Err(UffdError::Ioctl {
                op: "UFFDIO_WRITEPROTECT",
                addr: start,
                len,
                source: errno(),
            });
        }
        if !protect && !dont_wake {
            self.complete(start, len);
        }
        Ok(())
    }

    /// How long [`Uffd::move_range`] retries a piece whose source is there but will not move
    /// (transient: a swap-in in progress) before it gives up.
    const MOVE_STALL_MAX: std::time::Duration = std::time::Duration::from_secs(5);

    /// Move `[src, src+len)` to `dst`, which must be missing and registered with this
    /// userfaultfd, leaving `src` missing. Every 4 KiB piece of `src` that is present or
    /// swapped out is moved; a piece that is missing (a hole) becomes the zero page at `dst`,
    /// so that `dst` is fully populated afterwards and can be read without faulting.
    ///
    /// The kernel moves only pages this process alone owns: a piece still shared
    /// copy-on-write with a `fork()` parent or child (neither wrote it since) answers EBUSY.
    /// Such a piece is made this process's own first, as a write would (MADV_POPULATE_WRITE
    /// copies it), and then moved; `src` must therefore not be write-protected by this
    /// userfaultfd (the write would wait for its own handler). With `keep_unwritten`, a range
    /// whose every piece is shared is left where it is ([`Moved::Unwritten`]): this process
    /// has not written it since the fork, which a fork child uses to tell the pages it
    /// changed from the ones its parent left it.
    ///
    /// Linux 6.18 can report EEXIST (or ENOENT) for a piece it has just moved: after an
    /// internal retry, `move_pages()` keeps a stale -EAGAIN and goes over the piece again. It
    /// happens when the source page is being swapped in or out meanwhile. So a failed piece is
    /// judged by the page tables (/proc/self/pagemap): gone from `src` and present at `dst`
    /// means moved. Only `dst` populated while `src` still is, which would overwrite data, is an
    /// error.
    pub fn move_range(
        &self,
        dst: u64,
        src: u64,
        len: u64,
        keep_unwritten: bool,
    ) -> Result<Moved, UffdError> {
        let mut done = 0;
        let mut stalls = 0u32;
        let mut stalled_at = None;
        // Pieces shared copy-on-write, skipped for now (offsets from the start).
        let mut shared = Vec::new();
        // One piece per call once the range is found to straddle mappings.
        let mut piecewise = false;
        while done < len {
            let want = if piecewise { PIECE } else { len - done };
            let mut m = UffdioMove {
                dst: dst + done,
                src: src + done,
                len: want,
                mode: 0,
                moved: 0,
            };
            // SAFETY: `m` is a valid uffdio_move; the kernel validates both ranges.
            let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_MOVE as _, &mut m) };
            if rc == 0 {
                done += want;
                continue;
            }
            let e = errno();
            let moved = m.moved.max(0) as u64;
            done += moved;
            let fail = |source: io::Error| UffdError::Ioctl {
                op: "UFFDIO_MOVE",
                addr: src + done,
                len: len - done,
                source,
            };
            match e.raw_os_error() {
                // Part moved, the rest not yet (the mm changed, or the next piece is a hole or
                // was moved by the kernel already): go on from where it stopped.
                Some(libc::EAGAIN) if moved > 0 => continue,
                Some(libc::EBUSY) => {
                    shared.push(done);
                    done += PIECE;
                    continue;
                }
                Some(libc::EAGAIN | libc::EEXIST | libc::ENOENT) => {}
                // The source range must lie in one mapping (VMA): the program's mprotect may
                // have split the region inside a page, and the kernel does not always merge
                // the parts again when they get the same protection. Go on a piece at a time.
                Some(libc::EINVAL) if !piecewise && moved == 0 && len - done > PIECE => {
                    piecewise = true;
                    continue;
                }
                _ => return Err(fail(e)),
            }
            let (at_src, at_dst) = match (
                self.populated(src + done).map_err(&fail)?,
                self.populated(dst + done).map_err(&fail)?,
            ) {
                (Some(s), Some(d)) => (s, d),
                // No /proc: nothing to judge by.
                _ => return Err(fail(e)),
            };
            match (at_src, at_dst) {
                // The kernel moved this piece and said otherwise: `dst` was missing (the
                // caller's promise) and the kernel never maps over a present page, so only
                // this move can have filled it. The source may be present again already (a
                // thread touched it since, where nothing serves its faults).
                (_, true) => done += PIECE,
                // A hole: nothing to move, and the destination must read as zero.
                (false, false) => {
                    if self.zeropage(dst + done, PIECE)? == Resolve::AlreadyMapped {
                        // Populated in between: only the kernel's own move can have done it.
                        if self.populated(src + done).map_err(&fail)? != Some(false) {
                            return Err(fail(e));
                        }
                    }
                    done += PIECE;
                }
                // Source still there, destination empty: a transient failure (the page is
                // being swapped in by another thread, which on a loaded machine takes as long
                // as the disk does); try again, for a bounded time rather than a count.
                (true, false) => {
                    stalls += 1;
                    let now = std::time::Instant::now();
                    let since = *stalled_at.get_or_insert(now);
                    if now.duration_since(since) > Self::MOVE_STALL_MAX {
                        return Err(fail(e));
                    }
                    if stalls < 100 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(std::time::Duration::from_micros(100));
                    }
                }
            }
        }
        if keep_unwritten && !shared.is_empty() && shared.len() as u64 == len / PIECE {
            return Ok(Moved::Unwritten);
        }
        for off in shared {
            let at = src + off;
            // SAFETY: the piece is mapped in this process (the kernel found it shared);
            // populating it for writing copies it, as a write by the program would.
            if unsafe { libc::syscall(libc::SYS_madvise, at, PIECE, MADV_POPULATE_WRITE) } != 0 {
                return Err(UffdError::Ioctl {
                    op: "MADV_POPULATE_WRITE (to move a page shared with a fork)",
                    addr: at,
                    len: PIECE,
                    source: errno(),
                });
            }
            // Now this process's own: moved like any other (a second EBUSY is an error).
            if self.move_range(dst + off, at, PIECE, true)? != Moved::All {
                return Err(UffdError::Ioctl {
                    op: "UFFDIO_MOVE",
                    addr: at,
                    len: PIECE,
                    source: io::Error::from_raw_os_error(libc::EBUSY),
                });
            }
        }
        Ok(Moved::All)
    }

    /// Whether the 4 KiB page at `addr` of this process is present or swapped out; None when
    /// that cannot be read (no /proc).
    pub fn is_populated(&self, addr: u64) -> Option<bool> {
        self.populated(addr).ok().flatten()
    }

    /// Whether the 4 KiB page at `addr` of this process is present or swapped out
    /// (/proc/self/pagemap bits 63 and 62); None without /proc.
    fn populated(&self, addr: u64) -> io::Result<Option<bool>> {
        use std::os::unix::fs::FileExt;
        let Some(f) = &self.pagemap else {
            return Ok(None);
        };
        let mut e = [0u8; 8];
        f.read_exact_at(&mut e, addr / 4096 * 8)?;
        Ok(Some(u64::from_ne_bytes(e) & (3 << 62) != 0))
    }

    /// Wake threads waiting on faults in a range without resolving anything: they retry the
    /// access and fault again if the page is still not there.
    pub fn wake(&self, start: u64, len: u64) -> Result<(), UffdError> {
        if self.signal.is_some() {
            self.complete(start, len);
            return Ok(());
        }
        let mut r = UffdioRange { start, len };
        // SAFETY: `r` is a valid uffdio_range.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WAKE as _, &mut r) } != 0 {
            return Err(UffdError::Ioctl {
                op: "UFFDIO_WAKE",
                addr: start,
                len,
                source: errno(),
            });
        }
        Ok(())
    }

    /// Read pending page-fault events without blocking, appending them to `out`. Returns how
    /// many were read (0 when none is pending). Events other than page faults are ignored:
    /// none are negotiated.
    pub fn read_events(&self, out: &mut Vec<Fault>) -> Result<usize, UffdError> {
        if let Some(s) = &self.signal {
            let mut w = s.waiting.lock().unwrap();
            return Ok(signal::take_posted(s.owner, &mut |slot, address, write| {
                w.push((slot, address));
                // A write to a page that is there is a write-protect fault: only those and
                // missing pages raise the signal.
                out.push(Fault {
                    address,
                    write,
                    write_protect: write,
                });
            }));
        }
        let mut msgs = [RawMsg::default(); 64];
        // SAFETY: `msgs` is a writable buffer of 64 uffd_msg-sized entries.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr().cast(),
                std::mem::size_of_val(&msgs),
            )
        };
        if n < 0 {
            let e = errno();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(UffdError::Read(e)),
            };
        }
        let count = n as usize / std::mem::size_of::<RawMsg>();
        for m in &msgs[..count] {
            if m.event == EVENT_PAGEFAULT {
                out.push(Fault {
                    address: m.arg1,
                    write: m.arg0 & PAGEFAULT_FLAG_WRITE != 0,
                    write_protect: m.arg0 & PAGEFAULT_FLAG_WP != 0,
                });
            }
        }
        Ok(count)
    }
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh private anonymous mapping of `len` bytes, read-write.
    fn anon(len: u64) -> *mut libc::c_void {
        // SAFETY: a new mapping that nothing else uses.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(m, libc::MAP_FAILED);
        m
    }

    #[test]
    fn struct_sizes_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<UffdioApi>(), 24);
        assert_eq!(std::mem::size_of::<UffdioRegister>(), 32);
        assert_eq!(std::mem::size_of::<UffdioCopy>(), 40);
        assert_eq!(std::mem::size_of::<UffdioZeropage>(), 32);
        assert_eq!(std::mem::size_of::<UffdioMove>(), 40);
        assert_eq!(std::mem::size_of::<UffdioWriteprotect>(), 24);
        assert_eq!(std::mem::size_of::<RawMsg>(), 32);
        // Values from linux/userfaultfd.h on x86-64.
        assert_eq!(UFFDIO_API, 0xc018aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020aa00);
        assert_eq!(UFFDIO_COPY, 0xc028aa03);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xc018aa06);
        assert_eq!(UFFDIO_WAKE, 0x8010aa02);
    }

    #[test]
    fn opens_with_write_protect() {
        let u = Uffd::open().expect("userfaultfd must be available on the machines rmem supports");
        assert!(u.features() & feature::PAGEFAULT_FLAG_WP != 0);
        eprintln!(
            "userfaultfd mode {:?}, features {:#x}",
            u.mode(),
            u.features()
        );
    }

    /// A copy over a range with one piece already populated installs every other piece and
    /// names that one. The kernel answers such a copy with a partial count and EAGAIN, then
    /// EEXIST at the populated piece; reading that EEXIST as "the range is mapped" (as rmem
    /// once did) left every piece after it missing while the pager held the page as mapped.
    #[test]
    fn a_copy_installs_every_piece_around_a_populated_one() {
        let u = Uffd::open().expect("userfaultfd");
        let pieces = 4u64;
        let len = pieces * PIECE;
        let m = anon(len);
        let base = m as u64;
        u.register(base, len).unwrap();
        let src: Vec<u8> = (0..len).map(|i| (i / PIECE) as u8 + 1).collect();
        let other = vec![0xEEu8; PIECE as usize];
        assert_eq!(
            u.copy(base + PIECE, other.as_ptr(), PIECE, false).unwrap(),
            Copied::Whole
        );
        let r = u.copy(base, src.as_ptr(), len, false).unwrap();
        assert_eq!(r, Copied::Around(vec![PIECE]));
        for i in 0..pieces {
            let at = base + i * PIECE;
            // Checked before reading: a missing piece would block this thread forever.
            assert_eq!(u.is_populated(at), Some(true), "piece {i} installed");
            // SAFETY: a populated piece of our own mapping.
            let v = unsafe { std::ptr::read_volatile(at as *const u8) };
            let want = if i == 1 { 0xEE } else { i as u8 + 1 };
            assert_eq!(v, want, "piece {i}");
        }
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(m, len as usize) };
    }

    /// A copy over a range that a mprotect split into two mappings (the kernel answers
    /// ENOENT: one UFFDIO_COPY must lie in one mapping) installs it a piece at a time.
    #[test]
    fn a_copy_over_a_split_mapping_goes_a_piece_at_a_time() {
        let u = Uffd::open().expect("userfaultfd");
        let len = 4 * PIECE;
        let m = anon(len);
        let base = m as u64;
        u.register(base, len).unwrap();
        // SAFETY: changing the protection of the third piece of our own mapping.
        let r = unsafe {
            libc::mprotect(
                (base + 2 * PIECE) as *mut _,
                PIECE as usize,
                libc::PROT_READ,
            )
        };
        assert_eq!(r, 0);
        let src: Vec<u8> = (0..len).map(|i| (i / PIECE) as u8 + 1).collect();
        assert_eq!(
            u.copy(base, src.as_ptr(), len, false).unwrap(),
            Copied::Whole
        );
        for i in 0..4 {
            let at = base + i * PIECE;
            assert_eq!(u.is_populated(at), Some(true), "piece {i} installed");
            // SAFETY: a populated, readable piece of our own mapping.
            let v = unsafe { std::ptr::read_volatile(at as *const u8) };
            assert_eq!(v, i as u8 + 1, "piece {i}");
        }
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(m, len as usize) };
    }

    /// The VmFlags line of /proc/self/smaps for the mapping that starts at `base`.
    fn vm_flags(base: u64) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{base:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
        lines
            .find_map(|l| l.strip_prefix("VmFlags:"))
            .unwrap_or_else(|| panic!("no mapping at {base:x}"))
            .to_string()
    }

    /// A range registered with `register_wp_later` takes missing faults at once and gets
    /// write protection at the first install that protects a page, which then works (a
    /// fork() child registers so, so that an exec does not pay for clearing protection).
    #[test]
    fn write_protection_registered_later_comes_with_the_first_protected_page() {
        let u = Uffd::open().expect("userfaultfd");
        let len = 2 * PIECE;
        let m = anon(len);
        let base = m as u64;
        u.register_wp_later(base, len).unwrap();
        let flags = |f: &str| vm_flags(base).split_whitespace().any(|x| x == f);
        assert!(flags("um") && !flags("uw"), "{}", vm_flags(base));
        let src = vec![7u8; PIECE as usize];
        // Without protection: nothing to arm.
        assert_eq!(
            u.copy(base, src.as_ptr(), PIECE, false).unwrap(),
            Copied::Whole
        );
        assert!(!flags("uw"), "{}", vm_flags(base));
        assert_eq!(
            u.copy(base + PIECE, src.as_ptr(), PIECE, true).unwrap(),
            Copied::Whole
        );
        assert!(flags("um") && flags("uw"), "{}", vm_flags(base));
        u.write_protect(base, len, false, false).unwrap();
        u.write_protect(base, PIECE, true, false).unwrap();
        // SAFETY: a populated page of our own mapping.
        assert_eq!(unsafe { std::ptr::read_volatile(base as *const u8) }, 7);
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(m, len as usize) };
    }
}
