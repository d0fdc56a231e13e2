//! Starting and finalizing local memory server processes (`rmem run`, `rmem bench`).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a server may take to report its address.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A memory server process this launcher started. Killed on drop.
pub struct ServerProc {
    pub addr: String,
    child: Child,
}

impl ServerProc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// If it exited, how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Ask it to stop (SIGTERM), then kill it if it has not within `grace`.
    pub fn finalize(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + grace;
        while Instant::now() < end {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.finalize(Duration::from_secs(2));
    }
}

/// A fresh random token, hex-encoded.
pub fn fresh_token() -> String {
    let mut b = [0u8; 32];
    // SAFETY: getrandom fills the buffer we own.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    assert_eq!(n, b.len() as isize, "getrandom failed");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Start `count` servers on loopback, each with `capacity` bytes, sharing `token` (passed in
/// the environment, never on the command line). On any failure the ones started are
/// finalized by drop.
pub fn start_local_servers(
    count: usize,
    capacity: u64,
    token: &str,
) -> Result<Vec<ServerProc>, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the rmem executable: {e}"))?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            &capacity.to_string(),
        ])
        .env("RMEM_TOKEN", token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        // SAFETY: the closure only calls async-signal-safe functions (setpgid, prctl).
        unsafe {
            cmd.pre_exec(|| {
                // Own process group: a Ctrl-C for the program does not kill the servers
                // under it; the launcher finalizes them after the program is gone.
                libc::setpgid(0, 0);
                // If the launcher dies without finalizing, the servers follow it.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start a memory server: {e}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let mut r = BufReader::new(stdout);
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so the server never blocks on a full pipe.
            let mut sink = String::new();
            while r.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                sink.clear();
            }
        });
        let mut proc_ = ServerProc {
            addr: String::new(),
            child,
        };
        let line = rx.recv_timeout(START_TIMEOUT).map_err(|_| {
            format!(
                "memory server (pid {}) did not report its address within {:?}",
                proc_.pid(),
                START_TIMEOUT
            )
        })?;
        proc_.addr = parse_listen_line(&line).ok_or_else(|| {
            format!(
                "memory server (pid {}) failed to start: {:?}",
                proc_.pid(),
                line.trim()
            )
        })?;
        out.push(proc_);
    }
    Ok(out)
}

/// `rmem-server listening on ADDR ...` -> ADDR.
pub fn parse_listen_line(line: &str) -> Option<String> {
    line.strip_prefix("rmem-server listening on ")?
        .split_whitespace()
        .next()
        .map(str::to_string)
}
