//! Memory servers a program starts for itself, as DLM's runtime did: a program that uses
//! remote memory with no `RMEM_SERVERS` (it was not started by `rmem run`) runs
//! `rmem launch --detach`, which starts the servers (two on loopback, or those of a hosts
//! file), prints where they are, and finalizes them when the pipe to its stdin closes: at
//! [`Helper::stop`], or when the process ends, however it ends. librmem and the Python
//! bindings both start their servers here.
//!
//! The helper is detached (not the program's child), so a program that waits for all of its
//! children never waits for it, and never reaps it by surprise.

use crate::config::OwnServers;
use std::ffi::{c_void, CStr};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};

/// The pipes to a running `rmem launch --detach`: closing `stdin` finalizes the servers,
/// `stdout` reaches EOF once they are gone.
pub struct Helper {
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// The hosts file a program without servers uses: `RMEM_HOSTFILE`, else `./dlm_hosts` if
/// it exists.
pub fn hostfile_from_env() -> Option<PathBuf> {
    match std::env::var_os("RMEM_HOSTFILE").filter(|v| !v.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            let p = PathBuf::from("dlm_hosts");
            p.is_file().then_some(p)
        }
    }
}

/// The `rmem` binary: `RMEM_BIN`, else beside the shared object holding this code
/// (librmem.so in a build tree), else in its `../bin` (an installed prefix), else `rmem` on
/// the PATH.
pub fn rmem_binary() -> PathBuf {
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
        // object stays loaded (for the life of the process).
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

impl Helper {
    /// Start the servers (those of `hostfile`, else two on loopback) and return where they
    /// are. On failure the helper has said why on stderr; the error says what was run.
    pub fn start(hostfile: Option<&Path>) -> Result<(Helper, OwnServers), String> {
        let rmem = rmem_binary();
        let mut cmd = Command::new(&rmem);
        cmd.args(["launch", "--detach"]);
        if let Some(h) = hostfile {
            cmd.arg("--hostfile").arg(h);
        }
        let what = match hostfile {
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
        // The detached helper goes on in its own child; this one exits at once. (`wait`
        // would close a stdin still held by the Child, so the pipes are taken first.)
        let _ = child.wait();
        let mut stdout = BufReader::new(stdout);
        let (mut servers, mut token, mut local_bytes) = (Vec::new(), Vec::new(), None);
        let (mut redundancy, mut encrypt) = (None, None);
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
                "redundancy" => {
                    let r = crate::store::codec::Redundancy::parse(value);
                    redundancy = Some(r.map_err(|e| format!("{what}: redundancy {e}"))?);
                }
                "encrypt" => encrypt = Some(value == "on"),
                "ready" => break,
                _ => {}
            }
        }
        let own = OwnServers {
            servers,
            token,
            local_bytes,
            redundancy,
            encrypt,
            manager: None,
        };
        Ok((Helper { stdin, stdout }, own))
    }

    /// Finalize the servers and wait until they are gone.
    pub fn stop(self) {
        drop(self.stdin);
        let mut rest = Vec::new();
        let _ = self.stdout.take(1 << 16).read_to_end(&mut rest);
    }
}
