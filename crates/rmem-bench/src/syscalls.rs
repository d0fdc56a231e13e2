//! `rmem bench syscalls`: what librmem's system call trap costs per call, unprivileged.
//!
//! The same loops run three times in child processes: without rmem, under `rmem run` in
//! user-mode-only mode with the seccomp filter off (`RMEM_SYSCALL_TRAP=0`), and with it on
//! (the default). Each loop times one kind of call (ns per call, the best of a few repeats):
//! - `getppid`: a call the filter lets through (the cost of the filter itself);
//! - `read_local`: a read into a local buffer (filter plus librmem's read wrapper);
//! - `getrandom_remote`: 64 bytes of getrandom into a resident remote buffer, a call rmem
//!   does not wrap, so with the filter on it is trapped: a SIGSYS round trip each time;
//! - `pread_remote`: pread of 64 bytes into a resident remote buffer through librmem's wrapper;
//! - `writev_local`: writev through librmem's wrapper (always trapped calls skip the trap);
//! - `raw_writev_local`: writev by syscall(2), trapped on every call with the filter on.
//!
//! The worker is this binary (`rmem-bench syscalls --worker`), run under `rmem run`: its
//! allocations go through librmem like any program's.

use crate::report::JsonOut;
use crate::setup::worker_json;
use std::process::Command;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct SyscallsArgs {
    /// Calls per timed loop.
    #[arg(long, default_value_t = 200_000)]
    pub calls: u64,
    #[command(flatten)]
    pub out: JsonOut,
    /// Run the loops in this process and print them as JSON (what the bench starts).
    #[arg(long, hide = true)]
    pub worker: bool,
}

const KINDS: [&str; 6] = [
    "getppid",
    "read_local",
    "getrandom_remote",
    "pread_remote",
    "writev_local",
    "raw_writev_local",
];

pub fn syscalls(a: SyscallsArgs) -> Result<(), String> {
    if a.worker {
        return worker(a.calls);
    }
    let rmem = rmem_cli::launch::rmem_exe()?;
    let bench = std::env::current_exe().map_err(|e| e.to_string())?;
    let calls = a.calls.to_string();
    let worker_args = ["syscalls", "--worker", "--calls", calls.as_str()];
    let plain = worker_json(Command::new(&bench).args(worker_args))?;
    let under_rmem = |trap: &str| {
        let mut c = Command::new(&rmem);
        c.args(["run", "--local", "64M", "--"])
            .arg(&bench)
            .args(worker_args)
            .env("RMEM_UFFD_USER_MODE_ONLY", "1")
            .env("RMEM_SYSCALL_TRAP", trap);
        worker_json(&mut c)
    };
    let off = under_rmem("0")?;
    let on = under_rmem("1")?;
    println!("ns per call; ratios against the run without rmem (unprivileged userfaultfd)");
    println!(
        "{:<18} {:>9} {:>12} {:>12} {:>9} {:>9}",
        "call", "plain", "rmem no trap", "rmem trap", "no trap/x", "trap/x"
    );
    let mut rows = Vec::new();
    for k in KINDS {
        let ns = |v: &serde_json::Value| v[k].as_f64().unwrap_or(f64::NAN);
        let (p, f, t) = (ns(&plain), ns(&off), ns(&on));
        println!(
            "{k:<18} {p:>9.0} {f:>12.0} {t:>12.0} {:>9.2} {:>9.2}",
            f / p,
            t / p
        );
        rows.push(serde_json::json!({
            "call": k, "plain_ns": p, "rmem_no_trap_ns": f, "rmem_trap_ns": t,
            "no_trap_ratio": f / p, "trap_ratio": t / p,
        }));
    }
    let v = serde_json::json!({ "bench": "syscalls", "calls": a.calls, "results": rows });
    a.out.write(&v)
}

/// Best ns per call of `f` over a few loops of `calls`.
fn time(calls: u64, mut f: impl FnMut()) -> f64 {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..calls {
                f();
            }
            t.elapsed().as_nanos() as f64 / calls as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn worker(calls: u64) -> Result<(), String> {
    let open = |p: &std::ffi::CStr, flags| {
        // SAFETY: opening a device by a NUL-terminated path.
        let fd = unsafe { libc::open(p.as_ptr(), flags) };
        if fd < 0 {
            Err(format!("{p:?}: {}", std::io::Error::last_os_error()))
        } else {
            Ok(fd)
        }
    };
    let (zero, null) = (
        open(c"/dev/zero", libc::O_RDONLY)?,
        open(c"/dev/null", libc::O_WRONLY)?,
    );
    let mut local = [0u8; 64];
    // 1 MiB: above librmem's smallest remote allocation, so in remote memory under rmem.
    let mut remote = vec![1u8; 1 << 20];
    let r = remote.as_mut_ptr().cast::<libc::c_void>();
    let l = local.as_mut_ptr().cast::<libc::c_void>();
    let iov = libc::iovec {
        iov_base: l,
        iov_len: 64,
    };
    // Each loop: a system call on our own descriptors and 64-byte buffers.
    let results = [
        // SAFETY: no arguments.
        time(calls, || unsafe {
            libc::getppid();
        }),
        // SAFETY: 64 bytes into `local`.
        time(calls, || unsafe {
            libc::read(zero, l, 64);
        }),
        // SAFETY: 64 bytes into `remote`.
        time(calls, || unsafe {
            libc::getrandom(r, 64, 0);
        }),
        // SAFETY: 64 bytes into `remote`.
        time(calls, || unsafe {
            libc::pread(zero, r, 64, 0);
        }),
        // SAFETY: one iovec of `local`'s 64 bytes.
        time(calls, || unsafe {
            libc::writev(null, &iov, 1);
        }),
        // SAFETY: as above, by syscall(2).
        time(calls, || unsafe {
            libc::syscall(libc::SYS_writev, null, &iov as *const libc::iovec, 1);
        }),
    ];
    std::hint::black_box(&remote);
    let v: serde_json::Map<String, serde_json::Value> = KINDS
        .iter()
        .zip(results)
        .map(|(k, ns)| (k.to_string(), ns.into()))
        .collect();
    println!("{}", serde_json::Value::Object(v));
    Ok(())
}
