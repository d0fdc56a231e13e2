//! `rmem bench pool` at a tiny size, so the benchmark never rots: the drain, the reclaim
//! (measured, or skipped with the reason when other work moved the node's memory), every
//! direct-access transfer size and the disk rows exist with sane positive numbers, the
//! ratios are the quotients of the numbers beside them, and the targets are evaluated.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

/// `v[k]` as a positive finite number.
fn pos(v: &serde_json::Value, k: &str) -> f64 {
    let x = v[k]
        .as_f64()
        .unwrap_or_else(|| panic!("{k} is not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{k} = {x}: {v}");
    x
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1e-9)
}

/// A drain's or a reclaim's object: positive numbers, ratios computed from them.
fn check_move(m: &serde_json::Value, loop_mbs: f64) {
    let bytes = pos(m, "bytes_moved");
    let mbs = pos(m, "mb_per_s");
    assert!(close(mbs, bytes / pos(m, "move_s") / 1e6), "{m}");
    assert!(
        close(pos(m, "wall_mb_per_s"), bytes / pos(m, "wall_s") / 1e6),
        "{m}"
    );
    assert!(close(pos(m, "x_loopback"), mbs / loop_mbs), "{m}");
    let before = pos(m, "program_ops_per_s_before");
    let slow = before / pos(m, "program_ops_per_s_during");
    assert!(close(pos(m, "program_slowdown"), slow), "{m}");
    // A move of a few milliseconds may see the program make no progress at all.
    let moving = m["program_ops_per_s_while_moving"].as_f64().unwrap();
    match m["program_slowdown_while_moving"].as_f64() {
        Some(x) => assert!(close(x, before / moving), "{m}"),
        None => assert_eq!(moving, 0.0, "{m}"),
    }
}

#[test]
fn bench_pool_tiny_measures_every_row_and_computes_its_ratios() {
    let dir = scratch("bench-pool");
    let json = dir.join("pool.json");
    let out = run_bounded(
        Command::new(rmem())
            .args(["bench", "pool", "--size", "8M", "--disk-size", "16M"])
            .args(["--samples", "30", "--before-s", "0.5", "--dir"])
            .arg(&dir)
            .arg("--json")
            .arg(&json)
            .arg("--plot")
            .arg(&dir),
        Duration::from_secs(90),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let v = read_json(&json);
    let loop_mbs = pos(&v, "loopback_mb_per_s");
    let raw = pos(&v, "raw_rtt_us_p50");
    for k in ["tcp_rtt_us_p50", "tcp_rtt_64_us_p50", "raw_rtt_us_p99"] {
        pos(&v, k);
    }
    check_move(&v["drain"], loop_mbs);
    match v["reclaim"]["skipped"].as_str() {
        Some(why) => {
            // The reclaim itself is tested for real in pool.rs (a hog in a memory cgroup).
            eprintln!("bench pool: the reclaim row was {why}");
            assert!(why.starts_with("skipped: "), "{v}");
        }
        None => check_move(&v["reclaim"], loop_mbs),
    }
    let rows = v["direct"].as_array().unwrap();
    let sizes: Vec<u64> = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [64, 512, 4096, 65536, 1 << 20, 4 << 20], "{v}");
    for r in rows {
        for k in ["read_us_p50", "write_us_p50", "calls"] {
            pos(r, k);
        }
        assert!(pos(r, "read_us_p99") >= pos(r, "read_us_p50"), "{r}");
        assert!(pos(r, "write_us_p99") >= pos(r, "write_us_p50"), "{r}");
        let read = pos(r, "read_mb_per_s");
        assert!(close(pos(r, "read_x_loopback"), read / loop_mbs), "{r}");
        let write = pos(r, "write_mb_per_s");
        assert!(close(pos(r, "write_x_loopback"), write / loop_mbs), "{r}");
        assert!(
            close(pos(r, "read_p50_x_raw_rtt"), pos(r, "read_us_p50") / raw),
            "{r}"
        );
    }
    let d = &v["disk"];
    let (w, rd) = (pos(d, "write_mb_per_s"), pos(d, "read_mb_per_s"));
    for (ratio, num, den) in [
        ("write_x_raw_buffered", w, "raw_write_buffered_mb_per_s"),
        ("write_x_raw_fsync", w, "raw_write_fsync_mb_per_s"),
        ("read_x_raw_cached", rd, "raw_read_cached_mb_per_s"),
        ("read_x_raw_device", rd, "raw_read_device_mb_per_s"),
    ] {
        assert!(close(pos(d, ratio), num / pos(d, den)), "{ratio}: {d}");
    }
    let targets = v["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 6, "{v}");
    for t in targets {
        let what = t["what"].as_str().unwrap();
        let measured = t["met"].is_boolean();
        let skipped = what.starts_with("reclaim") && v["reclaim"]["skipped"].is_string();
        // No progress at all while pages moved leaves that slowdown unmeasured.
        let stalled = what.contains("while the client moved")
            && v["drain"]["program_slowdown_while_moving"].is_null();
        assert!(measured || skipped || stalled, "{t}");
    }
    assert!(out.stdout.contains("targets:"), "{}", out.stdout);
    for f in ["pool.png", "pool.svg", "pool-direct.png", "pool-direct.svg"] {
        assert!(dir.join(f).exists(), "{f}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
