//! `rmem launch`: start memory servers for a program that runs without `rmem run`.
//!
//! librmem runs it when a program using the explicit API (`dlm.h`, `rmem.h`) starts with no
//! servers configured, as DLM's runtime forked its memory servers from the hosts file: it
//! starts the servers as `rmem run` would (the same launch options, hosts file and
//! launchers), tells the program where they are on stdout, and finalizes them when its stdin
//! closes, which happens when the program exits however it exits (the program holds the
//! other end and nothing else does).
//!
//! Output, one `KEY VALUE` per line, then `ready`: `servers HOST:PORT,...`, `token TOKEN`,
//! `local BYTES` when a hosts file gives the local budget, and `redundancy R` / `encrypt
//! on|off` when it has those lines. The token goes over this
//! private pipe, never on a command line.

use crate::launch;
use std::io::{Read, Write};

#[derive(clap::Args, Debug)]
pub struct LaunchCmdArgs {
    /// Where the memory servers come from: --servers, --hostfile, --launcher, ...
    #[command(flatten)]
    pub launch: launch::LaunchArgs,
    /// Go on in a child process and exit at once, so the caller can go on too and never
    /// sees this process among its children (a program that waits for all of its children
    /// must not wait for its memory servers).
    #[arg(long)]
    pub detach: bool,
}

pub fn run(args: LaunchCmdArgs) -> i32 {
    let plan = match launch::Plan::new(&args.launch) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rmem launch: {e}");
            return 2;
        }
    };
    if args.detach {
        // SAFETY: single-threaded here (nothing has been started yet); the parent only exits.
        match unsafe { libc::fork() } {
            -1 => {
                eprintln!("rmem launch: fork: {}", std::io::Error::last_os_error());
                return 1;
            }
            0 => {}
            // SAFETY: _exit ends the parent without running anything of the child's.
            _ => unsafe { libc::_exit(0) },
        }
    }
    // Ctrl-C reaches the whole foreground process group: the program decides whether to
    // end; its servers must stay until it has (its exit closes our stdin).
    // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let mut servers = match launch::start(&plan) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rmem launch: {e}");
            return 1;
        }
    };
    let addrs: Vec<&str> = servers.iter().map(|s| s.addr.as_str()).collect();
    let mut out = format!("servers {}\ntoken {}\n", addrs.join(","), plan.token);
    if let Some(b) = plan.local_bytes {
        out.push_str(&format!("local {b}\n"));
    }
    if let Some(r) = &plan.redundancy {
        out.push_str(&format!("redundancy {r}\n"));
    }
    if let Some(e) = plan.encrypt {
        out.push_str(if e { "encrypt on\n" } else { "encrypt off\n" });
    }
    out.push_str("ready\n");
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush())
        .is_err()
    {
        launch::finalize_all(&mut servers, launch::FINALIZE_GRACE);
        return 1;
    }
    drop(stdout);
    // Wait for EOF: the program has exited (or called rmem_exit). Our stdout stays open until
    // we exit, so the program can wait for the servers to be finalized by reading it to EOF.
    let mut sink = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
    launch::finalize_all(&mut servers, launch::FINALIZE_GRACE);
    0
}
