//! Helpers for the pool's tests (tests/pool.rs on loopback, tests/pool_netns.rs across
//! simulated nodes): a real `rmem manager`, `rmem pool status` parsed and waited on, programs
//! under `rmem run --manager`, optionally through a prefix (`ip netns exec NS`).

use super::*;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const TOKEN: &str = "secret-for-the-pool-test";
/// The manager's heartbeat in these tests, in milliseconds.
pub const BEAT_MS: u64 = 200;

/// A running `rmem manager`, killed when dropped.
pub struct ManagerProcess {
    pub child: Child,
    pub addr: String,
    log: Arc<Mutex<String>>,
}

impl ManagerProcess {
    pub fn start(listen: &str, args: &[&str]) -> ManagerProcess {
        ManagerProcess::start_in(&[], listen, args)
    }

    /// `rmem manager` run through `prefix` (e.g. `ip netns exec NS`).
    pub fn start_in(prefix: &[&str], listen: &str, args: &[&str]) -> ManagerProcess {
        let mut cmd = prefixed(prefix);
        cmd.args(["manager", "--listen", listen, "--heartbeat-ms"])
            .arg(BEAT_MS.to_string())
            .args(args);
        let (child, addr, log) = start_daemon(cmd, TOKEN, "rmem-manager");
        ManagerProcess { child, addr, log }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `rmem pool status --manager M --json`, parsed; `None` if it failed.
pub fn pool_status(manager: &str) -> Option<serde_json::Value> {
    let out = run_bounded(
        Command::new(rmem())
            .args(["pool", "status", "--json", "--manager", manager])
            .env("RMEM_TOKEN", TOKEN),
        Duration::from_secs(20),
    );
    if !out.status.success() {
        return None;
    }
    Some(serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout)))
}

/// Wait up to `limit` until the pool's status satisfies `ok`; the last status seen.
pub fn await_status(
    manager: &str,
    limit: Duration,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value, String> {
    let t = Instant::now();
    let mut last = None;
    while t.elapsed() < limit {
        if let Some(st) = pool_status(manager) {
            if ok(&st) {
                return Ok(st);
            }
            last = Some(st);
        }
        std::thread::sleep(Duration::from_millis(BEAT_MS / 2));
    }
    Err(format!("after {limit:?}: {last:?}"))
}

pub fn live_servers(st: &serde_json::Value) -> usize {
    st["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["health"] == "ok")
        .count()
}

pub fn clients(st: &serde_json::Value) -> usize {
    st["clients"].as_array().unwrap().len()
}

/// `rmem run --manager M OPTS -- PROGRAM`, started (stdout and stderr piped).
pub fn run_in_pool(manager: &str, opts: &[&str], program: &[&str], as_nobody: bool) -> Child {
    run_in_pool_env(manager, opts, program, as_nobody, &[])
}

/// [`run_in_pool`] with more environment for the program.
pub fn run_in_pool_env(
    manager: &str,
    opts: &[&str],
    program: &[&str],
    as_nobody: bool,
    env: &[(&str, &str)],
) -> Child {
    let nobody: &[&str] = if as_nobody && is_root() {
        &["runuser", "-u", "nobody", "--"]
    } else {
        &[]
    };
    run_in_pool_on(nobody, manager, opts, program, env)
}

/// `rmem run --manager M OPTS -- PROGRAM` run through `prefix` (e.g. `ip netns exec NS`, or
/// `runuser`), with more environment for the program; started (stdout and stderr piped).
pub fn run_in_pool_on(
    prefix: &[&str],
    manager: &str,
    opts: &[&str],
    program: &[&str],
    env: &[(&str, &str)],
) -> Child {
    let dir = scratch("pool-run");
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stats = dir.join(format!("stats-{n}.json"));
    let mut cmd = prefixed(prefix);
    cmd.args(["run", "--manager", manager])
        .args(opts)
        .arg("--stats-json")
        .arg(&stats)
        .arg("--")
        .args(program)
        .envs(env.iter().copied())
        .env("RMEM_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

/// `rmem` run through `prefix`.
pub fn prefixed(prefix: &[&str]) -> Command {
    match prefix {
        [] => Command::new(rmem()),
        [first, rest @ ..] => {
            let mut c = Command::new(first);
            c.args(rest).arg(rmem());
            c
        }
    }
}

pub fn shown(out: &Output) -> String {
    format!(
        "{:?}\nstdout:\n{}\nstderr:\n{}",
        out.status, out.stdout, out.stderr
    )
}

pub fn assert_stress_ok(out: &Output) {
    assert!(out.status.success(), "{}", shown(out));
    assert!(stress_ok(&out.stdout), "{}", shown(out));
}

/// A file of `lines` pseudo-random lines (the same every run).
pub fn random_lines(path: &std::path::Path, lines: usize, seed: u64) {
    let mut x = seed;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for _ in 0..lines {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        writeln!(f, "{:016x} {}", x, x % 1000).unwrap();
    }
    f.flush().unwrap();
    drop(f);
    let _ = Command::new("chmod").arg("644").arg(path).status();
}

/// The 8-thread stress over 32 MiB with no redundancy (a page lost or stale on the way would
/// be a mismatch, or the end), started.
pub fn stress_unreplicated(manager: &str, env: &[(&str, &str)]) -> Child {
    stress_unreplicated_on(&[], manager, env)
}

/// [`stress_unreplicated`] run through `prefix` (e.g. `ip netns exec NS`).
pub fn stress_unreplicated_on(prefix: &[&str], manager: &str, env: &[(&str, &str)]) -> Child {
    let prog = stress_program();
    let prog: Vec<&str> = prog.iter().map(String::as_str).collect();
    run_in_pool_on(prefix, manager, &stress_opts("none"), &prog, env)
}

/// The `rmem run` options of the pool tests' stress: 4 KiB pages, 8 MiB local, `redundancy`.
pub fn stress_opts(redundancy: &str) -> [&str; 7] {
    [
        "--api",
        "--page-size",
        "4K",
        "--local",
        "8M",
        "--redundancy",
        redundancy,
    ]
}

/// The pool tests' stress program and its arguments: 8 threads over 32 MiB, 60,000 operations
/// each.
pub fn stress_program() -> Vec<String> {
    let prog = build_c("tests/c/stress.c");
    [prog.to_str().unwrap(), "8", "32", "60000"]
        .map(String::from)
        .to_vec()
}

/// Bytes `server` holds according to the pool's status.
pub fn used_on(st: &serde_json::Value, server: &str) -> u64 {
    st["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["addr"] == server)
        .and_then(|s| s["used_bytes"].as_u64())
        .unwrap_or(0)
}

pub fn server_row<'a>(st: &'a serde_json::Value, addr: &str) -> &'a serde_json::Value {
    st["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["addr"] == addr)
        .unwrap_or(&serde_json::Value::Null)
}

/// `rmem pool drain SERVER --manager M --wait 60`, from this side (as an operator would from
/// any machine that reaches the manager), bounded.
pub fn pool_drain(manager: &str, server: &str) -> Output {
    pool_drain_waiting(manager, server, 60)
}

/// `rmem pool drain SERVER --wait WAIT`, bounded at WAIT + 30 s.
pub fn pool_drain_waiting(manager: &str, server: &str, wait: u64) -> Output {
    run_bounded(
        Command::new(rmem())
            .args(["pool", "drain", server, "--manager", manager])
            .args(["--wait", &wait.to_string()])
            .env("RMEM_TOKEN", TOKEN),
        Duration::from_secs(wait + 30),
    )
}

/// `rmem pool drain VICTIM` while `run` (the stress with no redundancy) goes on: the drain
/// succeeds, the stress verifies with zero mismatches, and it was told the server is leaving.
/// The stress's output.
pub fn drain_under_stress(manager: &str, victim: &str, run: Child) -> Output {
    let drained = pool_drain(manager, victim);
    let out = wait_bounded(run, Duration::from_secs(240), "stress under a drain");
    assert!(
        drained.status.success(),
        "{}\n{}",
        shown(&drained),
        shown(&out)
    );
    assert_stress_ok(&out);
    let leaving = format!("memory server {victim} is leaving the pool");
    assert!(out.stderr.contains(&leaving), "{}", shown(&out));
    out
}

/// Wait up to `limit` for a drained server to exit by itself; it must have, saying so.
pub fn assert_exits_drained(server: &mut ServerProcess, limit: Duration) {
    let t = Instant::now();
    while server.child.try_wait().unwrap().is_none() && t.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        server.child.try_wait().unwrap().is_some(),
        "{}",
        server.log()
    );
    assert!(server.log().contains("drained"), "{}", server.log());
}

/// The two inputs of the two-programs tests, under a scratch directory named `tag`: 200,000
/// and 150,000 pseudo-random lines.
pub fn sort_inputs(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = scratch(tag);
    let (a, b) = (dir.join("a.txt"), dir.join("b.txt"));
    random_lines(&a, 200_000, 0x9E3779B97F4A7C15);
    random_lines(&b, 150_000, 0x2545F4914F6CDD1D);
    (a, b)
}

/// `sort -S 16M FILE` run plainly: what a run in the pool must print.
pub fn sort_plain(f: &std::path::Path) -> String {
    let out = run_bounded(
        Command::new("sort").arg("-S").arg("16M").arg(f),
        Duration::from_secs(60),
    );
    assert!(out.status.success());
    out.stdout
}

/// `sort -S 16M FILE` under `rmem run --manager` through `prefix`: its 16 MiB buffer is
/// remote (transparent mode), 2 MiB of it resident at once.
pub fn sort_in_pool(prefix: &[&str], manager: &str, f: &std::path::Path) -> Child {
    run_in_pool_on(
        prefix,
        manager,
        &["--local", "2M", "--page-size", "16K"],
        &["sort", "-S", "16M", f.to_str().unwrap()],
        &[],
    )
}

/// Wait for the two sorts of `a` and `b` (started with [`sort_in_pool`]): each must succeed,
/// print what a plain run prints, and have swapped pages out to the pool.
pub fn assert_sorts_match_plain(runs: [Child; 2], inputs: [&std::path::Path; 2]) {
    let outs = runs.map(|r| wait_bounded(r, Duration::from_secs(180), "a sort in the pool"));
    for (o, f) in outs.iter().zip(inputs) {
        assert!(o.status.success(), "{}", shown(o));
        assert!(
            o.stdout == sort_plain(f),
            "sort {} differs from a plain run",
            f.display()
        );
        // Its pages went to the pool: swap-outs were written to its servers.
        assert!(!o.stderr.contains(" 0 swap-outs"), "{}", shown(o));
    }
}
