//! `rmem bench suite --quick` as the test suite runs it: the run works, the JSON is
//! well-formed, the plots are written; under root the kernel swap systems run too, and the
//! machine's swap and cgroups are as they were afterwards.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

const SYSTEMS: [&str; 4] = ["local", "rmem", "swap-disk", "swap-zram"];
const STATUSES: [&str; 5] = ["ok", "killed", "timed-out", "failed", "skipped"];

fn swaps() -> String {
    std::fs::read_to_string("/proc/swaps").unwrap_or_default()
}

#[test]
fn quick_suite_runs_and_writes_json_and_plots() {
    let dir = scratch("bench-suite");
    let json = dir.join("suite.json");
    let plots = dir.join("plots");
    let swaps_before = swaps();
    let mut cmd = Command::new(rmem());
    cmd.args(["bench", "suite", "--quick", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&plots);
    // Quick finishes in under a minute on an idle machine; leave room for a busy one.
    let out = run_bounded(&mut cmd, Duration::from_secs(300));
    assert!(
        out.status.success(),
        "suite failed ({:?}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    let v = read_json(&json);
    for key in ["rtt_us_p50", "loopback_gbps", "memcpy_gbps"] {
        let x = v["limits"][key].as_f64().unwrap_or(0.0);
        assert!(x > 0.0 && x.is_finite(), "limits.{key} = {x}");
    }
    let results = v["results"].as_array().expect("results is a list");
    assert!(!results.is_empty());
    for r in results {
        let system = r["system"].as_str().unwrap_or("?");
        let status = r["status"].as_str().unwrap_or("?");
        assert!(SYSTEMS.contains(&system), "{r}");
        assert!(STATUSES.contains(&status), "{r}");
        assert!(["stream", "sort"].contains(&r["workload"].as_str().unwrap_or("?")));
        let ratio = r["local_ratio"].as_f64().unwrap_or(-1.0);
        assert!(ratio > 0.0 && ratio <= 1.0, "{r}");
        assert!(r["page_size"].as_u64().is_some_and(|p| p >= 4096), "{r}");
        assert_eq!(status == "ok", r["seconds"].as_f64().is_some(), "{r}");
        if system == "rmem" && status != "skipped" {
            assert!(r["swap_ins"].is_u64() && r["swap_outs"].is_u64(), "{r}");
        }
    }
    // The baseline and rmem itself must work at every ratio with 4K and 64K pages.
    let ok = |system: &str, ps: u64| {
        results
            .iter()
            .filter(|r| r["system"] == system && r["status"] == "ok" && r["page_size"] == ps)
            .count()
    };
    assert_eq!(ok("local", 4096), 2, "{}", out.stdout);
    assert_eq!(ok("rmem", 4096), 8, "{}", out.stdout);
    assert_eq!(ok("rmem", 65536), 8, "{}", out.stdout);
    let swapped = results.iter().filter(|r| {
        r["system"].as_str().unwrap_or("").starts_with("swap-") && r["status"] != "skipped"
    });
    if is_root() && std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        assert!(
            swapped.count() > 0,
            "root, but kernel swap did not run:\n{}",
            out.stdout
        );
    } else {
        assert_eq!(swapped.count(), 0);
        assert!(out.stdout.contains("kernel swap skipped"), "{}", out.stdout);
    }
    assert_eq!(swaps(), swaps_before, "the suite left swap changed");
    let table2 = v["table2"].as_array().expect("table2 is a list");
    assert_eq!(table2.len(), 4);
    for t in table2 {
        assert!(t["write_us_p50"].as_f64().is_some_and(|x| x > 0.0), "{t}");
        assert!(t["swap_ins"].as_u64().is_some_and(|n| n > 0), "{t}");
    }
    for w in ["stream", "sort"] {
        for ext in ["png", "svg"] {
            let p = plots.join(format!("{w}.{ext}"));
            let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            assert!(len > 1000, "{} missing or empty", p.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
