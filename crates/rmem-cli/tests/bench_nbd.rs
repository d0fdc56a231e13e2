//! `rmem bench nbd` at a tiny size, so the benchmark never rots: every target and job has a
//! row, each measured row has sane positive numbers and ratios computed against nbdkit
//! memory's row of the same job, the loop row is measured as root and says why it skipped
//! otherwise, and the targets are evaluated.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

const TARGETS: [&str; 5] = [
    "nbdkit-memory",
    "rmem-fit",
    "rmem-4x",
    "nbdkit-file",
    "loop",
];
const JOBS: [&str; 6] = [
    "randread-4k-qd1",
    "randread-4k-qd32",
    "randwrite-4k-qd1",
    "randwrite-4k-qd32",
    "read-1m",
    "write-1m",
];

#[test]
fn bench_nbd_tiny_writes_every_row_against_the_anchor() {
    for tool in ["fio", "nbdkit"] {
        let ok = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            eprintln!("skipped: {tool} is not installed (scripts/deps.sh installs it)");
            return;
        }
    }
    let dir = scratch("bench-nbd");
    let json = dir.join("nbd.json");
    let out = run_bounded(
        Command::new(rmem())
            .args([
                "bench",
                "nbd",
                "--size",
                "8M",
                "--runtime-s",
                "1",
                "--ramp-s",
                "0",
                "--dir",
            ])
            .arg(&dir)
            .arg("--json")
            .arg(&json)
            .arg("--plot")
            .arg(&dir),
        Duration::from_secs(240),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let v = read_json(&json);
    assert_eq!(v["anchor"], "nbdkit-memory", "{v}");
    for k in ["loopback_mb_per_s", "raw_rtt_us_p50", "tcp_rtt_us_p50"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), TARGETS.len() * JOBS.len(), "{v}");
    let row = |t: &str, j: &str| {
        rows.iter()
            .find(|r| r["target"] == t && r["job"] == j)
            .unwrap_or_else(|| panic!("no row for {t} {j}: {v}"))
    };
    for j in JOBS {
        let base = row("nbdkit-memory", j);
        for t in TARGETS {
            let r = row(t, j);
            if t == "loop" && !is_root() {
                assert_eq!(r["status"], "skipped", "{r}");
                assert!(r["reason"].as_str().unwrap().contains("root"), "{r}");
                continue;
            }
            assert_eq!(r["status"], "ok", "{t} {j}: {r}");
            let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap();
            for k in ["iops", "mb_per_s", "lat_us_p50", "lat_us_p99"] {
                assert!(f(r, k) > 0.0 && f(r, k).is_finite(), "{t} {j} {k}: {r}");
            }
            assert!(f(r, "lat_us_p50") <= f(r, "lat_us_p99"), "{r}");
            for (ratio, k) in [
                ("iops_ratio", "iops"),
                ("mb_per_s_ratio", "mb_per_s"),
                ("lat_p50_ratio", "lat_us_p50"),
                ("lat_p99_ratio", "lat_us_p99"),
            ] {
                let want = f(r, k) / f(base, k);
                assert!(
                    (f(r, ratio) - want).abs() < 1e-9 * want,
                    "{t} {j} {ratio}: {r}"
                );
            }
        }
    }
    let goals = v["targets"].as_array().unwrap();
    assert_eq!(goals.len(), 7, "{v}");
    for g in goals {
        assert!(g["met"].is_boolean(), "every target measured: {g}");
    }
    assert!(
        v["rmem"]["rmem-4x"]["stats"]["bytes_fetched"]
            .as_u64()
            .unwrap()
            > 0,
        "{v}"
    );
    assert!(dir.join("nbd.png").exists() && dir.join("nbd.svg").exists());
    let _ = std::fs::remove_dir_all(dir);
}
