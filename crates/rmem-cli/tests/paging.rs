//! The core paging path end to end: `rmem run --api` with real server processes and C
//! programs using the DLM API.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

const STATS_KEYS: [&str; 12] = [
    "swap_ins",
    "swap_outs",
    "evictions",
    "zero_fills",
    "faults",
    "fault_us_p50",
    "fault_us_p99",
    "bytes_fetched",
    "bytes_written_back",
    "local_bytes_max",
    "page_size",
    "policy",
];

/// Operations per thread: fewer for big pages, where a random miss moves a whole page.
fn ops_for(page_size: &str) -> &'static str {
    match page_size {
        "4K" => "150000",
        "16K" => "60000",
        "64K" => "20000",
        _ => "2000",
    }
}

fn stress(page_size: &str, as_nobody: bool) {
    let err = stress_with(page_size, as_nobody, "plain", &[]);
    assert!(err.contains("faults by wait"), "{err}");
}

/// The stress run, with more environment for rmem and the program (`tag` names the run).
fn stress_with(page_size: &str, as_nobody: bool, tag: &str, env: &[(&str, &str)]) -> String {
    let prog = build_c("tests/c/stress.c");
    let dir = scratch(&format!("stress-{page_size}-{as_nobody}-{tag}"));
    let stats = dir.join("stats.json");
    let local_mib = 8;
    let region_mib = 4 * local_mib;
    let mut cmd = if as_nobody {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(rmem());
        c
    } else {
        Command::new(rmem())
    };
    cmd.args([
        "run",
        "--api",
        "--servers",
        "2",
        "--placement",
        "stripe",
        "--local",
    ])
    .arg(format!("{local_mib}M"))
    .args(["--page-size", page_size, "--stats-json"])
    .arg(&stats)
    .arg("--")
    .arg(&prog)
    .args(["8", &region_mib.to_string(), ops_for(page_size)])
    .env("RMEM_VERBOSE", "1");
    cmd.envs(env.iter().copied());
    let out = run_bounded(&mut cmd, Duration::from_secs(240));
    assert!(
        out.status.success(),
        "stress failed ({:?}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    assert!(stress_ok(&out.stdout), "{}", out.stdout);
    if as_nobody {
        assert!(
            out.stderr.contains("userfaultfd user-mode-only"),
            "nobody must use user-mode-only: {}",
            out.stderr
        );
    }
    let v = read_json(&stats);
    for k in STATS_KEYS {
        assert!(v.get(k).is_some(), "stats JSON lacks {k}: {v}");
    }
    let n = |k: &str| v[k].as_u64().unwrap();
    assert!(
        n("swap_ins") > 0 && n("swap_outs") > 0 && n("evictions") > 0,
        "{v}"
    );
    assert!(
        n("local_bytes_max") <= local_mib << 20,
        "budget exceeded: {v}"
    );
    assert_eq!(v["policy"], rmem_policy::DEFAULT_POLICY);
    assert!(
        out.stderr.contains("rmem: ") && out.stderr.contains("swap-ins"),
        "no summary: {}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(dir);
    out.stderr
}

#[test]
fn stress_8_threads_4k_pages() {
    stress("4K", false);
}

#[test]
fn stress_8_threads_64k_pages() {
    stress("64K", false);
}

#[test]
fn stress_8_threads_1m_pages() {
    stress("1M", false);
}

/// The kernel swaps region pages while the pager moves them out: Linux 6.18's UFFDIO_MOVE
/// then reports EEXIST for pages it has moved, which once stopped (or hung) the program.
#[test]
fn stress_while_the_kernel_swaps_the_region_out() {
    if !is_root() {
        eprintln!("skipped: needs root to turn on a swap file of its own (CI runs as root)");
        return;
    }
    let _swap = SwapFile::on(256 << 20);
    // Ask the kernel every 2 ms to page the region out.
    stress_with("4K", false, "pageout", &[("STRESS_PAGEOUT_US", "2000")]);
}

/// Faults delivered by signal (RMEM_FAULT_DELIVERY=signal) under the same 8-thread stress.
#[test]
fn stress_with_faults_delivered_by_signal() {
    let err = stress_with("4K", false, "signal", &[("RMEM_FAULT_DELIVERY", "signal")]);
    assert!(err.contains("faults by signal"), "{err}");
}

#[test]
fn stress_unprivileged_as_nobody() {
    if !is_root() {
        // Already unprivileged: the run below is the unprivileged path itself.
        eprintln!("not root: running the stress test as the current user instead of nobody");
        stress("16K", false);
        return;
    }
    stress("16K", true);
}

#[test]
fn without_overcommit_an_allocation_beyond_capacity_fails_cleanly() {
    let prog = build_c("tests/c/capacity.c");
    let out = run_bounded(
        Command::new(rmem())
            .args([
                "run",
                "--api",
                "--servers",
                "2",
                "--server-capacity",
                "16M",
                "--local",
                "4M",
                "--no-overcommit",
                "--",
            ])
            .arg(&prog)
            .args(["64", "24"]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("capacity: ok"));
}

#[test]
fn a_killed_server_stops_the_program_with_its_name() {
    let prog = build_c("tests/c/touch_forever.c");
    let child = Command::new(rmem())
        .args([
            "run",
            "--api",
            "--servers",
            "2",
            "--placement",
            "stripe",
            "--local",
            "4M",
            "--page-size",
            "16K",
            "--",
        ])
        .arg(&prog)
        .args(["32", "60"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let servers = launched_servers(child.id(), 2);
    // Let the program fill its memory across both servers, then kill one.
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: killing a process this test started (indirectly).
    unsafe { libc::kill(servers[1] as i32, libc::SIGKILL) };
    let out = wait_bounded(
        child,
        Duration::from_secs(15),
        "rmem run after a server was killed",
    );
    assert!(!out.status.success(), "rmem run must fail: {}", out.stderr);
    assert!(
        out.stdout.contains("touch_forever: filled"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("finished without interruption"),
        "{}",
        out.stdout
    );
    assert!(
        out.stderr.contains("memory server 127.0.0.1:"),
        "no server named: {}",
        out.stderr
    );
    assert!(
        out.elapsed < Duration::from_secs(12),
        "took {:?}",
        out.elapsed
    );
    // The other server was finalized.
    let other = servers[0];
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !std::path::Path::new(&format!("/proc/{other}")).exists() || {
            let st = std::fs::read_to_string(format!("/proc/{other}/stat")).unwrap_or_default();
            st.contains(") Z ")
        },
        "surviving server was not finalized"
    );
}

#[test]
fn run_rejects_bad_configuration_clearly() {
    for (args, needle) in [
        (vec!["--page-size", "3K"], "power of two"),
        (vec!["--page-size", "8M"], "power of two"),
        (vec!["--local", "lots"], "--local"),
        (vec!["--policy", "random"], "known policies"),
        (vec!["--servers", "0"], "at least 1"),
    ] {
        let out = run_bounded(
            Command::new(rmem())
                .args(["run", "--api"])
                .args(&args)
                .args(["--", "true"]),
            Duration::from_secs(20),
        );
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "{args:?}: {}", out.stderr);
    }
}

#[test]
fn run_exits_with_the_program_status() {
    let out = run_bounded(
        Command::new(rmem()).args(["run", "--api", "--", "sh", "-c", "exit 7"]),
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(7), "{}", out.stderr);
}

#[test]
fn bench_fault_tiny_writes_its_json() {
    let dir = scratch("bench-fault");
    let json = dir.join("fault.json");
    let out = run_bounded(
        Command::new(rmem())
            .args([
                "bench",
                "fault",
                "--samples",
                "300",
                "--threads",
                "1,2",
                "--seconds",
                "0.3",
                "--json",
            ])
            .arg(&json),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let v = read_json(&json);
    for k in [
        "fault_us_p50",
        "fault_us_p99",
        "rtt_us_p50",
        "rtt_us_p99",
        "local_fault_us_p50",
        "local_fault_us_p99",
    ] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k} in {v}");
    }
    assert!(out.stdout.contains("fault / round trip"));
    let rates = v["faults_per_s"].as_array().unwrap();
    assert_eq!(rates.len(), 2, "{v}");
    for (r, n) in rates.iter().zip([1, 2]) {
        assert_eq!(r["threads"].as_u64(), Some(n), "{v}");
        assert!(r["faults_per_s"].as_f64().unwrap() > 0.0, "{v}");
        assert!(r["vs_one_thread"].as_f64().unwrap() > 0.0, "{v}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The reference for `rmem bench fault` (docs/benchmarks.md): a bare blocking handler's
/// fault against its raw round trip, and its faults per second with 1 and 4 threads, at a
/// tiny size.
#[test]
fn uffd_floor_reference_runs() {
    let prog = build_plain("tools/uffd-floor.c");
    let out = run_bounded(
        Command::new(prog).args(["500", "1", "4"]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let words: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(words.len(), 6 + 2 * 4, "{}", out.stdout);
    for pair in words.chunks(2) {
        let v: f64 = pair[1].parse().unwrap_or_else(|_| panic!("{}", out.stdout));
        assert!(v > 0.0, "{}", out.stdout);
    }
}

#[test]
fn bench_scan_tiny_writes_its_json() {
    let dir = scratch("bench-scan");
    let json = dir.join("scan.json");
    let out = run_bounded(
        Command::new(rmem())
            .args([
                "bench",
                "scan",
                "--size",
                "16M",
                "--page-sizes",
                "4K,64K",
                "--json",
            ])
            .arg(&json),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let v = read_json(&json);
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows
        .iter()
        .all(|r| r["mb_per_s"].as_f64().unwrap() > 0.0 && r["swap_ins"].as_u64().unwrap() > 0));
    let _ = std::fs::remove_dir_all(dir);
}
