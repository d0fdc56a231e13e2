//! Memory servers a program starts for itself, as DLM's runtime did: when a program using
//! the explicit API starts with no `RMEM_SERVERS` (it was not started by `rmem run`), the
//! runtime runs `rmem launch --detach`, which starts the servers (two on loopback, or those
//! of the hosts file named by `RMEM_HOSTFILE`, else `./dlm_hosts` when it exists), prints
//! where they are, and finalizes them when the pipe to its stdin closes: at `rmem_exit`, or
//! when the process ends, however it ends.
//!
//! The helper is detached (not the program's child), so a program that waits for all of its
//! children never waits for it, and never reaps it by surprise.

use rmem_client::config::OwnServers;
use std::ffi::{c_void, CStr};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

/// The pipes to the running helper: closing `stdin` finalizes the servers, `stdout` reaches
/// EOF once they are gone.
struct Helper {
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

static HELPER: Mutex<Option<Helper>> = Mutex::new(None);

/// The hosts file to use: `RMEM_HOSTFILE`, else `./dlm_hosts` if it exists.
fn hostfile() -> Option<PathBuf> {
    match std::env::var_os("RMEM_HOSTFILE").filter(|v| !v.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            let p = PathBuf::from("dlm_hosts");
            p.is_file().then_some(p)
        }
    }
}

/// The `rmem` binary: `RMEM_BIN`, else beside this librmem.so (a build tree), else in
/// `../bin` (an installed prefix), else `rmem` on the PATH.
fn rmem_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("RMEM_BIN").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    // SAFETY: Dl_info is plain data (pointers), for which all zeroes is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = rmem_binary as fn() -> PathBuf as *const c_void;
    // SAFETY: dladdr only reads the loader's tables and fills `info`, which we own.
    let found = unsafe { libc::dladdr(here, &mut info) } != 0 && !info.dli_fname.is_null();
    if found {
        // SAFETY: dli_fname is a NUL-terminated path owned by the loader, valid while the
        // library stays loaded (for the life of the process).
        let lib = PathBuf::from(
            unsafe { CStr::from_ptr(info.dli_fname) }
                .to_string_lossy()
                .into_owned(),
        );
        if let Some(dir) = lib.parent() {
            for c in [dir.join("rmem"), dir.join("../bin/rmem")] {
                if c.is_file() {
                    return c;
                }
            }
        }
    }
    PathBuf::from("rmem")
}

/// Start the servers and return where they are. On failure the helper has said why on
/// stderr; the error says what was run.
pub(crate) fn start() -> Result<OwnServers, String> {
    let rmem = rmem_binary();
    let mut cmd = Command::new(&rmem);
    cmd.args(["launch", "--detach"]);
    let hosts = hostfile();
    if let Some(h) = &hosts {
        cmd.arg("--hostfile").arg(h);
    }
    let what = match &hosts {
        Some(h) => format!("{} launch --hostfile {}", rmem.display(), h.display()),
        None => format!("{} launch", rmem.display()),
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("no memory servers configured, and {what} could not run: {e} (set RMEM_BIN, or use rmem run)"))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        unreachable!("both pipes were asked for");
    };
    // The detached helper goes on in its own child; this one exits at once. (`wait` would
    // close a stdin still held by the Child, so the pipes are taken first.)
    let _ = child.wait();
    let mut stdout = BufReader::new(stdout);
    let (mut servers, mut token, mut local_bytes) = (Vec::new(), Vec::new(), None);
    let mut line = String::new();
    loop {
        line.clear();
        if stdout.read_line(&mut line).unwrap_or(0) == 0 {
            return Err(format!("no memory servers configured, and {what} failed"));
        }
        let (key, value) = line
            .trim_end()
            .split_once(' ')
            .unwrap_or((line.trim_end(), ""));
        match key {
            "servers" => servers = value.split(',').map(str::to_string).collect(),
            "token" => token = value.as_bytes().to_vec(),
            "local" => local_bytes = value.parse().ok(),
            "ready" => break,
            _ => {}
        }
    }
    *HELPER.lock().unwrap_or_else(|e| e.into_inner()) = Some(Helper { stdin, stdout });
    Ok(OwnServers {
        servers,
        token,
        local_bytes,
    })
}

/// Finalize the servers `start` started, if any, and wait until they are gone.
pub(crate) fn stop() {
    let Some(h) = HELPER.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    drop(h.stdin);
    let mut rest = Vec::new();
    let _ = h.stdout.take(1 << 16).read_to_end(&mut rest);
}
