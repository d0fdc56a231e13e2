//! Which arguments of which system calls the kernel dereferences, and how far (x86_64).
//!
//! One table serves both halves of [`super`]: the seccomp filter traps a call listed here
//! when one of its pointer arguments lies in the region, and the SIGSYS handler reads the same
//! entry to give the kernel resident memory. A call that is not listed passes untouched (and
//! fails with EFAULT on a non-resident remote buffer, as before): the list covers the calls of
//! Linux 6.x that take a user buffer, except those that only name an address range (madvise,
//! mprotect, munmap, mremap, mlock: see mem.rs) and those whose buffers the kernel reads later
//! (set_robust_list, rseq, set_tid_address: those live in a thread's control block, which
//! stack.rs keeps resident), and those glibc makes with every signal blocked, when a trap's
//! SIGSYS would kill the process instead of reaching rmem's handler: rt_sigprocmask,
//! rt_sigaction, sigaltstack and clone3 (a new thread restores its mask from its control
//! block, on the thread's stack; their arguments live on stacks, which stack.rs pins when
//! they are remote). Not covered: vmsplice and process_vm_readv/writev (their buffers
//! are behind iovecs and the kernel pins them with get_user_pages, which no prefault keeps
//! valid), io_submit's iocbs (only the pointer array is faulted in).

use libc::{c_int, c_long};

/// How many bytes an argument covers.
#[derive(Clone, Copy, Debug)]
pub enum Len {
    /// A fixed size (a struct).
    Fixed(usize),
    /// The value of argument `i`.
    Arg(usize),
    /// The value of argument `i` times a size (an array).
    Times(usize, usize),
    /// The value of argument `i` plus a constant (a header before a payload).
    Plus(usize, usize),
    /// A bit set of argument `i` bits, in whole 64-bit words (select's fd_set).
    Bits(usize),
}

/// What the kernel copies back into an `Out` argument.
#[derive(Clone, Copy, Debug)]
pub enum Back {
    /// The whole argument (a struct).
    All,
    /// As many bytes as the call returns.
    Ret,
    /// The call's result times a size (so many array elements).
    RetTimes(usize),
}

/// One argument of a system call.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// Not a pointer (or one the kernel does not dereference during the call).
    No,
    /// The kernel reads this many bytes.
    In(Len),
    /// The kernel writes up to this many bytes.
    Out(Len, Back),
    /// The kernel reads and writes the whole extent.
    InOut(Len),
    /// A NUL-terminated string the kernel reads (a path, a name).
    Str,
    /// A NULL-terminated array of strings (execve's argv and envp).
    StrVec,
    /// The address itself matters (a futex word), or the extent is not known (ioctl, fcntl,
    /// prctl arguments): it is faulted in where it is, never copied.
    Touch,
    /// An array of iovecs, a msghdr or an mmsghdr array: the buffers are behind the pointer,
    /// so the call is trapped whatever its arguments are (see [`Entry::always`]).
    Indirect,
}

/// One system call.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub nr: c_long,
    pub args: [Arg; 6],
    /// Trapped on every call, not only when an argument lies in the region: its buffers are
    /// behind a pointer the filter cannot follow, or the call is refused.
    pub always: bool,
}

use Arg::{InOut as IO, No as N, Str as S, Touch as T};
use Len::{Arg as A, Fixed as F};

const fn e(nr: c_long, args: [Arg; 6]) -> Entry {
    Entry {
        nr,
        args,
        always: false,
    }
}

const fn always(nr: c_long) -> Entry {
    Entry {
        nr,
        args: [Arg::Indirect, N, N, N, N, N],
        always: true,
    }
}

const fn i(len: Len) -> Arg {
    Arg::In(len)
}

/// Written whole.
const fn o(len: Len) -> Arg {
    Arg::Out(len, Back::All)
}

/// Written up to the call's result in bytes.
const fn r(len: Len) -> Arg {
    Arg::Out(len, Back::Ret)
}

const STAT: usize = 144;
const STATFS: usize = 120;
const TIMESPEC: usize = 16;
const ITIMER: usize = 32;
const RUSAGE: usize = 144;
const SIGINFO: usize = 128;
const SOCKADDR: usize = 128;
const SOCKLEN: usize = 4;
const EPOLL_EVENT: usize = 12;

/// Every system call the filter watches. The I/O calls at the top have handlers of their own
/// in [`super`] (chunks, bounces for receives that consume a message); the rest go through
/// the generic path driven by their arguments.
pub static TABLE: &[Entry] = &[
    // Handled by io.rs's bodies (see super::dispatch); their arguments here drive the filter.
    e(libc::SYS_read, [N, T, N, N, N, N]),
    e(libc::SYS_write, [N, T, N, N, N, N]),
    e(libc::SYS_pread64, [N, T, N, N, N, N]),
    e(libc::SYS_pwrite64, [N, T, N, N, N, N]),
    e(libc::SYS_recvfrom, [N, T, N, N, T, T]),
    e(libc::SYS_sendto, [N, T, N, N, T, N]),
    e(libc::SYS_getrandom, [T, N, N, N, N, N]),
    always(libc::SYS_readv),
    always(libc::SYS_writev),
    always(libc::SYS_preadv),
    always(libc::SYS_pwritev),
    always(libc::SYS_preadv2),
    always(libc::SYS_pwritev2),
    always(libc::SYS_recvmsg),
    always(libc::SYS_sendmsg),
    always(libc::SYS_recvmmsg),
    always(libc::SYS_sendmmsg),
    // Refused: the kernel's io_uring workers would touch remote buffers out of any thread.
    always(libc::SYS_io_uring_setup),
    // Paths and names.
    e(libc::SYS_open, [S, N, N, N, N, N]),
    e(libc::SYS_openat, [N, S, N, N, N, N]),
    e(libc::SYS_openat2, [N, S, i(A(3)), N, N, N]),
    e(libc::SYS_creat, [S, N, N, N, N, N]),
    e(libc::SYS_access, [S, N, N, N, N, N]),
    e(libc::SYS_faccessat, [N, S, N, N, N, N]),
    e(libc::SYS_faccessat2, [N, S, N, N, N, N]),
    e(libc::SYS_stat, [S, o(F(STAT)), N, N, N, N]),
    e(libc::SYS_lstat, [S, o(F(STAT)), N, N, N, N]),
    e(libc::SYS_fstat, [N, o(F(STAT)), N, N, N, N]),
    e(libc::SYS_newfstatat, [N, S, o(F(STAT)), N, N, N]),
    e(libc::SYS_statx, [N, S, N, N, o(F(256)), N]),
    e(libc::SYS_statfs, [S, o(F(STATFS)), N, N, N, N]),
    e(libc::SYS_fstatfs, [N, o(F(STATFS)), N, N, N, N]),
    e(libc::SYS_readlink, [S, r(A(2)), N, N, N, N]),
    e(libc::SYS_readlinkat, [N, S, r(A(3)), N, N, N]),
    e(libc::SYS_getcwd, [r(A(1)), N, N, N, N, N]),
    e(libc::SYS_getdents64, [N, r(A(2)), N, N, N, N]),
    e(libc::SYS_getdents, [N, r(A(2)), N, N, N, N]),
    e(libc::SYS_chdir, [S, N, N, N, N, N]),
    e(libc::SYS_chroot, [S, N, N, N, N, N]),
    e(libc::SYS_mkdir, [S, N, N, N, N, N]),
    e(libc::SYS_mkdirat, [N, S, N, N, N, N]),
    e(libc::SYS_mknod, [S, N, N, N, N, N]),
    e(libc::SYS_mknodat, [N, S, N, N, N, N]),
    e(libc::SYS_rmdir, [S, N, N, N, N, N]),
    e(libc::SYS_unlink, [S, N, N, N, N, N]),
    e(libc::SYS_unlinkat, [N, S, N, N, N, N]),
    e(libc::SYS_rename, [S, S, N, N, N, N]),
    e(libc::SYS_renameat, [N, S, N, S, N, N]),
    e(libc::SYS_renameat2, [N, S, N, S, N, N]),
    e(libc::SYS_link, [S, S, N, N, N, N]),
    e(libc::SYS_linkat, [N, S, N, S, N, N]),
    e(libc::SYS_symlink, [S, S, N, N, N, N]),
    e(libc::SYS_symlinkat, [S, N, S, N, N, N]),
    e(libc::SYS_chmod, [S, N, N, N, N, N]),
    e(libc::SYS_fchmodat, [N, S, N, N, N, N]),
    e(libc::SYS_chown, [S, N, N, N, N, N]),
    e(libc::SYS_lchown, [S, N, N, N, N, N]),
    e(libc::SYS_fchownat, [N, S, N, N, N, N]),
    e(libc::SYS_truncate, [S, N, N, N, N, N]),
    e(libc::SYS_utime, [S, i(F(16)), N, N, N, N]),
    e(libc::SYS_utimes, [S, i(F(32)), N, N, N, N]),
    e(libc::SYS_futimesat, [N, S, i(F(32)), N, N, N]),
    e(libc::SYS_utimensat, [N, S, i(F(32)), N, N, N]),
    e(libc::SYS_execve, [S, Arg::StrVec, Arg::StrVec, N, N, N]),
    e(libc::SYS_execveat, [N, S, Arg::StrVec, Arg::StrVec, N, N]),
    e(libc::SYS_memfd_create, [S, N, N, N, N, N]),
    e(libc::SYS_inotify_add_watch, [N, S, N, N, N, N]),
    e(libc::SYS_fanotify_mark, [N, N, N, N, S, N]),
    e(libc::SYS_name_to_handle_at, [N, S, T, T, N, N]),
    e(libc::SYS_acct, [S, N, N, N, N, N]),
    e(libc::SYS_mount, [S, S, S, N, T, N]),
    e(libc::SYS_umount2, [S, N, N, N, N, N]),
    e(libc::SYS_swapon, [S, N, N, N, N, N]),
    e(libc::SYS_swapoff, [S, N, N, N, N, N]),
    e(libc::SYS_pivot_root, [S, S, N, N, N, N]),
    // Extended attributes.
    e(libc::SYS_setxattr, [S, S, i(A(3)), N, N, N]),
    e(libc::SYS_lsetxattr, [S, S, i(A(3)), N, N, N]),
    e(libc::SYS_fsetxattr, [N, S, i(A(3)), N, N, N]),
    e(libc::SYS_getxattr, [S, S, r(A(3)), N, N, N]),
    e(libc::SYS_lgetxattr, [S, S, r(A(3)), N, N, N]),
    e(libc::SYS_fgetxattr, [N, S, r(A(3)), N, N, N]),
    e(libc::SYS_listxattr, [S, r(A(2)), N, N, N, N]),
    e(libc::SYS_llistxattr, [S, r(A(2)), N, N, N, N]),
    e(libc::SYS_flistxattr, [N, r(A(2)), N, N, N, N]),
    e(libc::SYS_removexattr, [S, S, N, N, N, N]),
    e(libc::SYS_lremovexattr, [S, S, N, N, N, N]),
    e(libc::SYS_fremovexattr, [N, S, N, N, N, N]),
    // Waiting: poll, select, epoll, futex, sleeps, timers.
    e(libc::SYS_poll, [IO(Len::Times(1, 8)), N, N, N, N, N]),
    e(
        libc::SYS_ppoll,
        [IO(Len::Times(1, 8)), N, i(F(TIMESPEC)), i(A(4)), N, N],
    ),
    e(
        libc::SYS_select,
        [
            N,
            IO(Len::Bits(0)),
            IO(Len::Bits(0)),
            IO(Len::Bits(0)),
            IO(F(16)),
            N,
        ],
    ),
    e(
        libc::SYS_pselect6,
        [
            N,
            IO(Len::Bits(0)),
            IO(Len::Bits(0)),
            IO(Len::Bits(0)),
            IO(F(TIMESPEC)),
            i(F(16)),
        ],
    ),
    e(
        libc::SYS_epoll_wait,
        [
            N,
            Arg::Out(Len::Times(2, EPOLL_EVENT), Back::RetTimes(EPOLL_EVENT)),
            N,
            N,
            N,
            N,
        ],
    ),
    e(
        libc::SYS_epoll_pwait,
        [
            N,
            Arg::Out(Len::Times(2, EPOLL_EVENT), Back::RetTimes(EPOLL_EVENT)),
            N,
            N,
            i(A(5)),
            N,
        ],
    ),
    e(
        libc::SYS_epoll_pwait2,
        [
            N,
            Arg::Out(Len::Times(2, EPOLL_EVENT), Back::RetTimes(EPOLL_EVENT)),
            N,
            i(F(TIMESPEC)),
            i(A(5)),
            N,
        ],
    ),
    e(libc::SYS_epoll_ctl, [N, N, N, i(F(EPOLL_EVENT)), N, N]),
    // The futex word's address is what the kernel keys waiters by: faulted in in place. What
    // the other arguments are depends on the operation: [`futex`].
    e(libc::SYS_futex, [T, N, N, T, T, N]),
    e(libc::SYS_futex_waitv, [T, N, N, i(F(TIMESPEC)), N, N]),
    e(
        libc::SYS_nanosleep,
        [i(F(TIMESPEC)), o(F(TIMESPEC)), N, N, N, N],
    ),
    e(
        libc::SYS_clock_nanosleep,
        [N, N, i(F(TIMESPEC)), o(F(TIMESPEC)), N, N],
    ),
    e(libc::SYS_clock_gettime, [N, o(F(TIMESPEC)), N, N, N, N]),
    e(libc::SYS_clock_getres, [N, o(F(TIMESPEC)), N, N, N, N]),
    e(libc::SYS_clock_settime, [N, i(F(TIMESPEC)), N, N, N, N]),
    e(libc::SYS_clock_adjtime, [N, IO(F(208)), N, N, N, N]),
    e(libc::SYS_adjtimex, [IO(F(208)), N, N, N, N, N]),
    e(libc::SYS_gettimeofday, [o(F(16)), o(F(8)), N, N, N, N]),
    e(libc::SYS_settimeofday, [i(F(16)), i(F(8)), N, N, N, N]),
    e(libc::SYS_time, [o(F(8)), N, N, N, N, N]),
    e(libc::SYS_getitimer, [N, o(F(ITIMER)), N, N, N, N]),
    e(
        libc::SYS_setitimer,
        [N, i(F(ITIMER)), o(F(ITIMER)), N, N, N],
    ),
    e(libc::SYS_timer_create, [N, i(F(64)), o(F(4)), N, N, N]),
    e(
        libc::SYS_timer_settime,
        [N, N, i(F(ITIMER)), o(F(ITIMER)), N, N],
    ),
    e(libc::SYS_timer_gettime, [N, o(F(ITIMER)), N, N, N, N]),
    e(
        libc::SYS_timerfd_settime,
        [N, N, i(F(ITIMER)), o(F(ITIMER)), N, N],
    ),
    e(libc::SYS_timerfd_gettime, [N, o(F(ITIMER)), N, N, N, N]),
    // Signals.
    e(libc::SYS_rt_sigpending, [o(A(1)), N, N, N, N, N]),
    e(libc::SYS_rt_sigsuspend, [i(A(1)), N, N, N, N, N]),
    e(
        libc::SYS_rt_sigtimedwait,
        [i(A(3)), o(F(SIGINFO)), i(F(TIMESPEC)), N, N, N],
    ),
    e(libc::SYS_rt_sigqueueinfo, [N, N, i(F(SIGINFO)), N, N, N]),
    e(libc::SYS_rt_tgsigqueueinfo, [N, N, N, i(F(SIGINFO)), N, N]),
    e(libc::SYS_pidfd_send_signal, [N, N, i(F(SIGINFO)), N, N, N]),
    e(libc::SYS_signalfd, [N, i(A(2)), N, N, N, N]),
    e(libc::SYS_signalfd4, [N, i(A(2)), N, N, N, N]),
    // Processes.
    e(libc::SYS_wait4, [N, o(F(4)), N, o(F(RUSAGE)), N, N]),
    e(libc::SYS_waitid, [N, N, o(F(SIGINFO)), N, o(F(RUSAGE)), N]),
    e(libc::SYS_getrusage, [N, o(F(RUSAGE)), N, N, N, N]),
    e(libc::SYS_getrlimit, [N, o(F(16)), N, N, N, N]),
    e(libc::SYS_setrlimit, [N, i(F(16)), N, N, N, N]),
    e(libc::SYS_prlimit64, [N, N, i(F(16)), o(F(16)), N, N]),
    e(libc::SYS_uname, [o(F(390)), N, N, N, N, N]),
    e(libc::SYS_sysinfo, [o(F(112)), N, N, N, N, N]),
    e(libc::SYS_times, [o(F(32)), N, N, N, N, N]),
    e(libc::SYS_getgroups, [N, o(Len::Times(0, 4)), N, N, N, N]),
    e(libc::SYS_setgroups, [N, i(Len::Times(0, 4)), N, N, N, N]),
    e(libc::SYS_getresuid, [o(F(4)), o(F(4)), o(F(4)), N, N, N]),
    e(libc::SYS_getresgid, [o(F(4)), o(F(4)), o(F(4)), N, N, N]),
    e(libc::SYS_getcpu, [o(F(4)), o(F(4)), N, N, N, N]),
    e(libc::SYS_sethostname, [i(A(1)), N, N, N, N, N]),
    e(libc::SYS_setdomainname, [i(A(1)), N, N, N, N, N]),
    e(libc::SYS_sched_setaffinity, [N, N, i(A(1)), N, N, N]),
    e(libc::SYS_sched_getaffinity, [N, N, r(A(1)), N, N, N]),
    e(libc::SYS_sched_setparam, [N, i(F(4)), N, N, N, N]),
    e(libc::SYS_sched_getparam, [N, o(F(4)), N, N, N, N]),
    e(libc::SYS_sched_setscheduler, [N, N, i(F(4)), N, N, N]),
    e(
        libc::SYS_sched_rr_get_interval,
        [N, o(F(TIMESPEC)), N, N, N, N],
    ),
    e(libc::SYS_sched_setattr, [N, i(F(56)), N, N, N, N]),
    e(libc::SYS_sched_getattr, [N, o(A(2)), N, N, N, N]),
    e(libc::SYS_capget, [IO(F(8)), o(F(24)), N, N, N, N]),
    e(libc::SYS_capset, [i(F(8)), i(F(24)), N, N, N, N]),
    e(libc::SYS_syslog, [N, r(A(2)), N, N, N, N]),
    e(libc::SYS_perf_event_open, [T, N, N, N, N, N]),
    // Sockets and pipes.
    e(libc::SYS_connect, [N, i(A(2)), N, N, N, N]),
    e(libc::SYS_bind, [N, i(A(2)), N, N, N, N]),
    e(
        libc::SYS_accept,
        [N, o(F(SOCKADDR)), IO(F(SOCKLEN)), N, N, N],
    ),
    e(
        libc::SYS_accept4,
        [N, o(F(SOCKADDR)), IO(F(SOCKLEN)), N, N, N],
    ),
    e(
        libc::SYS_getsockname,
        [N, o(F(SOCKADDR)), IO(F(SOCKLEN)), N, N, N],
    ),
    e(
        libc::SYS_getpeername,
        [N, o(F(SOCKADDR)), IO(F(SOCKLEN)), N, N, N],
    ),
    e(libc::SYS_setsockopt, [N, N, N, i(A(4)), N, N]),
    e(libc::SYS_getsockopt, [N, N, N, T, T, N]),
    e(libc::SYS_socketpair, [N, N, N, o(F(8)), N, N]),
    e(libc::SYS_pipe, [o(F(8)), N, N, N, N, N]),
    e(libc::SYS_pipe2, [o(F(8)), N, N, N, N, N]),
    e(libc::SYS_sendfile, [N, N, IO(F(8)), N, N, N]),
    e(libc::SYS_splice, [N, IO(F(8)), N, IO(F(8)), N, N]),
    e(libc::SYS_copy_file_range, [N, IO(F(8)), N, IO(F(8)), N, N]),
    // SysV and POSIX message queues, semaphores, Linux AIO.
    e(libc::SYS_msgsnd, [N, i(Len::Plus(2, 8)), N, N, N, N]),
    e(
        libc::SYS_msgrcv,
        [N, Arg::Out(Len::Plus(2, 8), Back::All), N, N, N, N],
    ),
    e(libc::SYS_semop, [N, i(Len::Times(2, 6)), N, N, N, N]),
    e(
        libc::SYS_semtimedop,
        [N, i(Len::Times(2, 6)), N, i(F(TIMESPEC)), N, N],
    ),
    e(libc::SYS_mq_open, [S, N, N, i(F(64)), N, N]),
    e(libc::SYS_mq_unlink, [S, N, N, N, N, N]),
    e(
        libc::SYS_mq_timedsend,
        [N, i(A(2)), N, N, i(F(TIMESPEC)), N],
    ),
    e(
        libc::SYS_mq_timedreceive,
        [N, r(A(2)), N, o(F(4)), i(F(TIMESPEC)), N],
    ),
    e(libc::SYS_mq_notify, [N, i(F(64)), N, N, N, N]),
    e(libc::SYS_mq_getsetattr, [N, i(F(64)), o(F(64)), N, N, N]),
    e(libc::SYS_io_setup, [N, o(F(8)), N, N, N, N]),
    e(
        libc::SYS_io_getevents,
        [
            N,
            N,
            N,
            Arg::Out(Len::Times(2, 32), Back::RetTimes(32)),
            i(F(TIMESPEC)),
            N,
        ],
    ),
    e(libc::SYS_io_submit, [N, N, T, N, N, N]),
    // Arguments whose meaning depends on a command: faulted in place.
    e(libc::SYS_ioctl, [N, N, T, N, N, N]),
    e(libc::SYS_fcntl, [N, N, T, N, N, N]),
    e(libc::SYS_prctl, [N, T, T, T, T, N]),
    e(libc::SYS_arch_prctl, [N, T, N, N, N, N]),
    e(libc::SYS_mincore, [N, N, T, N, N, N]),
    e(libc::SYS_get_mempolicy, [T, T, N, N, N, N]),
    e(libc::SYS_set_mempolicy, [N, T, N, N, N, N]),
    e(libc::SYS_mbind, [N, N, N, T, N, N]),
    e(libc::SYS_keyctl, [N, T, T, T, T, N]),
    e(libc::SYS_bpf, [N, T, N, N, N, N]),
    e(libc::SYS_seccomp, [N, N, T, N, N, N]),
    e(libc::SYS_ptrace, [N, N, T, T, N, N]),
    e(libc::SYS_shmctl, [N, N, T, N, N, N]),
    e(libc::SYS_msgctl, [N, N, T, N, N, N]),
    e(libc::SYS_semctl, [N, N, N, T, N, N]),
];

/// The entry for system call `nr`.
pub fn entry(nr: c_long) -> Option<&'static Entry> {
    TABLE.iter().find(|e| e.nr == nr)
}

/// futex(2)'s entry for operation `op`: the timeout (argument 3) and the second futex word
/// (argument 4) only where the operation reads them. Elsewhere they are not pointers at all:
/// glibc's FUTEX_WAKE leaves whatever its register held in `uaddr2`, and argument 3 is a count
/// for the requeue operations. (The filter cannot tell, and traps such a call when the stale
/// value points into the region; it is then made as it is.)
pub fn futex(op: usize) -> Entry {
    let cmd = op as c_int & libc::FUTEX_CMD_MASK;
    let timeout = matches!(
        cmd,
        libc::FUTEX_WAIT
            | libc::FUTEX_WAIT_BITSET
            | libc::FUTEX_LOCK_PI
            | libc::FUTEX_LOCK_PI2
            | libc::FUTEX_WAIT_REQUEUE_PI
    );
    let second = matches!(
        cmd,
        libc::FUTEX_REQUEUE
            | libc::FUTEX_CMP_REQUEUE
            | libc::FUTEX_WAKE_OP
            | libc::FUTEX_CMP_REQUEUE_PI
            | libc::FUTEX_WAIT_REQUEUE_PI
    );
    e(
        libc::SYS_futex,
        [
            T,
            N,
            N,
            if timeout { i(F(TIMESPEC)) } else { N },
            if second { T } else { N },
            N,
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_is_listed_once_and_has_a_pointer() {
        let mut seen = std::collections::HashSet::new();
        for e in TABLE {
            assert!(seen.insert(e.nr), "system call {} listed twice", e.nr);
            assert!(
                e.always || e.args.iter().any(|a| !matches!(a, Arg::No)),
                "system call {} has no pointer argument",
                e.nr
            );
        }
    }
}
