//! `rmem run --trace` records a program's page reference string; `rmem sim` replays it.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn trace_a_loop_and_replay_it() {
    let prog = build_c("tests/c/loop_scan.c");
    let dir = scratch("trace");
    let trace = dir.join("loop.trace");
    // 2 MiB in 4 KiB pages = 512 pages; 1 init pass + 3 passes.
    let out = run_bounded(
        Command::new(rmem())
            .args(["run", "--api", "--page-size", "4K", "--trace"])
            .arg(&trace)
            .arg("--")
            .arg(&prog)
            .args(["2", "3"]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("loop_scan ok"));
    let bytes = std::fs::metadata(&trace).unwrap().len();
    let refs = 4 * 512;
    assert!(
        bytes >= 16 + 2 * refs && bytes < 16 + 6 * refs,
        "trace of {bytes} bytes for about {refs} references"
    );
    let sim = run_bounded(
        Command::new(rmem())
            .args(["sim", "--local", "25%", "--trace"])
            .arg(&trace),
        Duration::from_secs(30),
    );
    assert!(sim.status.success(), "{}\n{}", sim.stdout, sim.stderr);
    let misses = |name: &str| -> u64 {
        let line = sim
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in\n{}", sim.stdout));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    // Every reference is a page change: fifo misses on all of them in a loop 4x the memory,
    // OPT keeps a quarter of the pages, and the default policy keeps a stable set too.
    let (fifo, opt, adaptive) = (misses("fifo"), misses("OPT"), misses("adaptive"));
    assert!(fifo >= 4 * 512, "{}", sim.stdout);
    assert!(opt < fifo * 85 / 100, "{}", sim.stdout);
    assert!(adaptive < fifo * 90 / 100, "{}", sim.stdout);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bench_policies_tiny_writes_its_json() {
    let dir = scratch("bench-policies");
    let json = dir.join("policies.json");
    let out = run_bounded(
        Command::new(rmem())
            .args([
                "bench",
                "policies",
                "--pages",
                "64",
                "--workloads",
                "stream,random",
                "--ratios",
                "50",
                "--prefetch",
                "on",
                "--json",
            ])
            .arg(&json),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("| stream | 50% |"), "{}", out.stdout);
    let v = read_json(&json);
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    for c in cells {
        let opt = c["sim"].as_array().unwrap().last().unwrap()["misses"]
            .as_u64()
            .unwrap();
        for r in c["sim"].as_array().unwrap() {
            assert!(r["misses"].as_u64().unwrap() >= opt, "{c}");
        }
        for p in rmem_policy::POLICY_NAMES {
            assert!(c["live"][p]["swap_ins"].as_u64().unwrap() > 0, "{c}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
