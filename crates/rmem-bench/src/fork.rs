//! `rmem bench fork`: what fork() costs under rmem (issue 16), in one run.
//!
//! - fork then exec: a worker (this binary, `rmem-bench fork --worker`) with `--mib` MiB of
//!   malloc'ed memory written (remote under `rmem run`, resident: the budget holds it) forks
//!   `--forks` children that exec `/bin/true` at once, and waits for each; the time from the
//!   call to the end of the wait, median and best of `--rounds` runs, without rmem and under
//!   `rmem run`. Under rmem the exec'd program's environment keeps `LD_PRELOAD`, so `/bin/true`
//!   loads librmem (a cost of exec that posix_spawn pays too); the `bare` measure takes it out
//!   of the child's environment, and is the one held to the target (2x or 1 ms).
//! - Pool(fork) against Pool(spawn): tests/py/pool_fork.py (numpy arrays of `--pool-mib` MiB,
//!   four workers, eight chunks) under `rmem run --local` a quarter of them, with each start
//!   method, best of `--rounds`; the pool's wall time as the script reports it. Target: fork
//!   within 1.5x of spawn.
//!
//! Timings are the best of a few runs: the numbers are noisy on a shared machine.

use crate::report::{err, JsonOut};
use crate::setup::worker_json;
use std::ffi::CString;
use std::process::Command;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct ForkArgs {
    /// Memory the forking process has written before it forks, in MiB.
    #[arg(long, default_value_t = 32)]
    pub mib: usize,
    /// fork+exec per run.
    #[arg(long, default_value_t = 200)]
    pub forks: usize,
    /// Runs of each measure; the best is kept.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Size of the Pool's numpy arrays in MiB (0: no Pool measure).
    #[arg(long, default_value_t = 256)]
    pub pool_mib: usize,
    #[command(flatten)]
    pub out: JsonOut,
    /// Fork in this process and print the medians as JSON (what the bench starts).
    #[arg(long, hide = true)]
    pub worker: bool,
}

const POOL_SCRIPT: &str = include_str!("../../../tests/py/pool_fork.py");

pub fn fork(a: ForkArgs) -> Result<(), String> {
    if a.worker {
        return worker(a.mib, a.forks);
    }
    let rmem = rmem_cli::launch::rmem_exe()?;
    let bench = std::env::current_exe().map_err(|e| e.to_string())?;
    let (mib, forks) = (a.mib.to_string(), a.forks.to_string());
    let worker_args = ["fork", "--worker", "--mib", &mib, "--forks", &forks];
    let local = format!("{}M", 2 * a.mib + 64);
    let mut best = [f64::INFINITY; 5];
    for _ in 0..a.rounds.max(1) {
        let plain = worker_json(Command::new(&bench).args(worker_args))?;
        let under = worker_json(
            Command::new(&rmem)
                .args(["run", "--local", &local, "--"])
                .arg(&bench)
                .args(worker_args),
        )?;
        let got = [
            plain["fork_exec_us"].as_f64(),
            under["fork_exec_bare_us"].as_f64(),
            under["fork_exec_us"].as_f64(),
            plain["spawn_us"].as_f64(),
            under["spawn_us"].as_f64(),
        ];
        for (b, g) in best.iter_mut().zip(got) {
            *b = b.min(g.unwrap_or(f64::NAN));
        }
    }
    let [plain, bare, full, spawn_plain, spawn_rmem] = best;
    let ratio = bare / plain;
    let within = bare <= (2.0 * plain).max(plain + 1000.0);
    println!(
        "fork+exec+wait with {} MiB written, median of {} (best of {}):",
        a.mib, a.forks, a.rounds
    );
    println!(
        "  plain {plain:.0} us, rmem {bare:.0} us ({ratio:.2}x, +{:.0} us; {full:.0} us with \
         LD_PRELOAD kept): {} the target (2x or +1 ms)",
        bare - plain,
        if within { "within" } else { "NOT within" }
    );
    println!("  posix_spawn+wait: plain {spawn_plain:.0} us, rmem {spawn_rmem:.0} us");
    let mut v = serde_json::json!({
        "bench": "fork",
        "mib": a.mib,
        "forks": a.forks,
        "rounds": a.rounds,
        "fork_exec_plain_us": plain,
        "fork_exec_rmem_us": bare,
        "fork_exec_rmem_ld_preload_us": full,
        "fork_exec_ratio": ratio,
        "fork_exec_within_target": within,
        "spawn_plain_us": spawn_plain,
        "spawn_rmem_us": spawn_rmem,
    });
    if a.pool_mib > 0 {
        let (fork_s, spawn_s) = pools(&rmem, a.pool_mib, a.rounds.max(1))?;
        let ratio = fork_s / spawn_s;
        println!(
            "Pool(4) over {} MiB of numpy arrays at a quarter local under rmem (best of {}): \
             fork {fork_s:.2} s, spawn {spawn_s:.2} s ({ratio:.2}x): {} the target (1.5x)",
            a.pool_mib,
            a.rounds,
            if ratio <= 1.5 { "within" } else { "NOT within" }
        );
        v["pool_mib"] = a.pool_mib.into();
        v["pool_fork_s"] = fork_s.into();
        v["pool_spawn_s"] = spawn_s.into();
        v["pool_ratio"] = ratio.into();
    }
    a.out.write(&v)
}

/// The Pool's wall time with fork and with spawn under rmem, best of `rounds` each.
fn pools(rmem: &std::path::Path, mib: usize, rounds: usize) -> Result<(f64, f64), String> {
    let dir = std::env::temp_dir().join(format!("rmem-bench-fork-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(err)?;
    let script = dir.join("pool_fork.py");
    std::fs::write(&script, POOL_SCRIPT).map_err(err)?;
    let local = format!("{}M", (mib / 4).max(1));
    let mut best = [f64::INFINITY; 2];
    let r = (|| {
        for _ in 0..rounds {
            for (i, method) in ["fork", "spawn"].into_iter().enumerate() {
                let out = Command::new(rmem)
                    .args(["run", "--local", &local, "--", "/usr/bin/python3"])
                    .arg(&script)
                    .args([&mib.to_string(), method, "4"])
                    .output()
                    .map_err(|e| format!("python3: {e}"))?;
                let err = String::from_utf8_lossy(&out.stderr);
                let secs = err
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("pool ")?
                            .rsplit_once(": ")?
                            .1
                            .strip_suffix(" s")
                    })
                    .and_then(|s| s.parse::<f64>().ok());
                match (out.status.success(), secs) {
                    (true, Some(s)) => best[i] = best[i].min(s),
                    _ => return Err(format!("Pool({method}) under rmem failed: {err}")),
                }
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    r.map(|()| (best[0], best[1]))
}

fn median_us(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Fork `n` children that exec /bin/true with `env` and wait for each; the median time.
fn fork_exec(n: usize, env: &[*const libc::c_char]) -> Result<f64, String> {
    let path = c"/bin/true";
    let argv = [path.as_ptr(), std::ptr::null()];
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        // SAFETY: the child only calls execve and _exit, both async-signal-safe, on
        // arguments built before the fork.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe {
                libc::execve(path.as_ptr(), argv.as_ptr(), env.as_ptr());
                libc::_exit(127);
            }
        }
        if pid < 0 {
            return Err(format!("fork: {}", std::io::Error::last_os_error()));
        }
        wait(pid)?;
        took.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median_us(took))
}

fn wait(pid: libc::pid_t) -> Result<(), String> {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid || status != 0 {
        return Err(format!("child {pid} failed (wait status {status})"));
    }
    Ok(())
}

fn worker(mib: usize, n: usize) -> Result<(), String> {
    // Written, so that the fork copies page tables for it as any program's would.
    let mem = vec![1u8; mib << 20];
    std::hint::black_box(&mem);
    let vars: Vec<CString> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let mut kv = k.into_encoded_bytes();
            kv.push(b'=');
            kv.extend(v.into_encoded_bytes());
            CString::new(kv).ok()
        })
        .collect();
    let env = |keep_preload: bool| {
        let mut e: Vec<*const libc::c_char> = vars
            .iter()
            .filter(|kv| keep_preload || !kv.as_bytes().starts_with(b"LD_PRELOAD="))
            .map(|kv| kv.as_ptr())
            .collect();
        e.push(std::ptr::null());
        e
    };
    let (full, bare) = (env(true), env(false));
    let fork_exec_us = fork_exec(n, &full)?;
    let fork_exec_bare_us = fork_exec(n, &bare)?;
    let path = c"/bin/true";
    let argv = [path.as_ptr().cast_mut(), std::ptr::null_mut()];
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut pid = 0;
        // SAFETY: posix_spawn with valid NUL-terminated arrays built above.
        let r = unsafe {
            libc::posix_spawn(
                &mut pid,
                path.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                argv.as_ptr(),
                full.as_ptr().cast(),
            )
        };
        if r != 0 {
            return Err(format!(
                "posix_spawn: {}",
                std::io::Error::from_raw_os_error(r)
            ));
        }
        wait(pid)?;
        took.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let spawn_us = median_us(took);
    println!(
        "{}",
        serde_json::json!({
            "fork_exec_us": fork_exec_us,
            "fork_exec_bare_us": fork_exec_bare_us,
            "spawn_us": spawn_us,
        })
    );
    Ok(())
}
