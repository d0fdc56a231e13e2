//! Running a program bounded in time, as the benchmarks that run whole programs do (`suite`,
//! `programs`): in its own process group, optionally in a cgroup, killed when it runs over its
//! limit or when the benchmark is interrupted (SIGINT, SIGTERM: the benchmark then returns an
//! error, so that what it set up, such as kernel swap, is undone on the way out).

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    Killed,
    TimedOut,
    /// Ran and failed otherwise: a failed self-check, a lost server, an error.
    Failed,
    Skipped,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Killed => "killed",
            Status::TimedOut => "timed-out",
            Status::Failed => "failed",
            Status::Skipped => "skipped",
        }
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// From now on SIGINT and SIGTERM stop the running program and make [`interrupted`] fail.
pub fn catch_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_interrupt as *const () as libc::sighandler_t) };
    }
}

/// Err once the benchmark has been interrupted.
pub fn interrupted() -> Result<(), String> {
    if INTERRUPTED.load(Ordering::Relaxed) {
        Err("interrupted; the machine's swap and cgroups were restored".into())
    } else {
        Ok(())
    }
}

/// How a bounded run ended.
pub struct Finished {
    pub status: Status,
    pub stdout: String,
    pub stderr: String,
    pub wall: f64,
    /// The largest resident set of the program and of every descendant it waited for
    /// (`wait4`'s ru_maxrss), in bytes.
    pub max_rss: u64,
}

/// Run `cmd` in its own process group (in the cgroup behind `procs`, if given), killing the
/// group if it runs over `limit` or the benchmark is interrupted.
pub fn run_bounded(cmd: &mut Command, limit: Duration, procs: Option<&File>) -> Finished {
    let procs_fd = procs.map(|f| f.as_raw_fd());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure calls only async-signal-safe functions (setpgid, write).
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Join the cgroup before exec, so that everything the program touches is charged.
            if let Some(fd) = procs_fd {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let t0 = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Finished {
                status: Status::Failed,
                stdout: String::new(),
                stderr: format!("cannot start {:?}: {e}", cmd.get_program()),
                wall: 0.0,
                max_rss: 0,
            }
        }
    };
    let drain = |mut r: Box<dyn Read + Send>| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            let _ = tx.send(s);
        });
        rx
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let errs = drain(Box::new(child.stderr.take().expect("piped")));
    let pid = child.id() as i32;
    // Reaped here with wait4 for its resource usage; `child` is never waited on.
    let reap = || -> Option<(ExitStatus, u64)> {
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: pid is our child, not yet reaped.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        (r == pid).then(|| (ExitStatus::from_raw(status), ru.ru_maxrss as u64 * 1024))
    };
    let (mut ended, mut note) = (None, None);
    while ended.is_none() {
        ended = reap();
        if ended.is_some() {
            break;
        }
        if t0.elapsed() > limit || INTERRUPTED.load(Ordering::Relaxed) {
            note = Some(if t0.elapsed() > limit {
                Status::TimedOut
            } else {
                Status::Failed
            });
            // SAFETY: kill has no memory-safety preconditions; the group is our child's.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            // A task stuck in reclaim can take a while to die; do not wait forever.
            let end = Instant::now() + Duration::from_secs(30);
            while ended.is_none() && Instant::now() < end {
                ended = reap();
                std::thread::sleep(Duration::from_millis(20));
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let wall = t0.elapsed().as_secs_f64();
    let collect =
        |rx: mpsc::Receiver<String>| rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    let (stdout, stderr) = (collect(out), collect(errs));
    let status = match (note, ended) {
        (Some(n), _) => n,
        (None, Some((s, _))) if s.success() => Status::Ok,
        // The OOM killer's SIGKILL, seen directly or through `rmem run` (128 + 9).
        (None, Some((s, _))) if s.signal() == Some(libc::SIGKILL) || s.code() == Some(137) => {
            Status::Killed
        }
        (None, _) => Status::Failed,
    };
    Finished {
        status,
        stdout,
        stderr,
        wall,
        max_rss: ended.map_or(0, |e| e.1),
    }
}
