//! `rmem bench programs` at a tiny size, as the test suite runs it: every real program plain,
//! under rmem at its defaults and (as root) under kernel swap to zram and to disk at half its
//! footprint; every output identical to the plain run's, and the JSON, the table's geometric
//! means and the plots consistent with the runs.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn tiny_programs_bench_matches_plain_runs_and_reports_ratios() {
    let dir = scratch("bench-programs");
    let json = dir.join("programs.json");
    let plots = dir.join("plots");
    std::fs::create_dir_all(&plots).unwrap();
    let mut cmd = Command::new(rmem());
    cmd.args([
        "bench",
        "programs",
        "--size",
        "tiny",
        "--ratios",
        "50",
        "--min-limit-s",
        "40",
        "--timeout-s",
        "120",
        "--json",
    ])
    .arg(&json)
    .arg("--plot")
    .arg(&plots);
    let out = run_bounded(&mut cmd, Duration::from_secs(900));
    assert!(
        out.status.success(),
        "bench programs failed ({:?}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    let v = read_json(&json);
    let systems: Vec<&str> = v["systems"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_str())
        .collect();
    if is_root() {
        assert_eq!(systems, ["rmem", "zram", "disk"]);
    } else {
        assert_eq!(systems, ["rmem"]);
        assert!(out
            .stdout
            .contains("kernel swap not measured: kernel swap runs need root"));
    }
    let progs = v["programs"].as_array().expect("programs is a list");
    let names: Vec<&str> = progs.iter().filter_map(|r| r["program"].as_str()).collect();
    assert_eq!(
        names,
        [
            "sort",
            "numpy",
            "sqlite",
            "octave",
            "imagemagick",
            "python",
            "stream",
            "himeno"
        ]
    );
    for p in progs {
        assert!(p["footprint_bytes"].as_u64().unwrap() > 0, "{p}");
        let plain = p["plain_seconds"].as_f64().unwrap();
        let runs = p["runs"].as_array().unwrap();
        assert_eq!(runs.len(), systems.len(), "{p}");
        for r in runs {
            let limit = r["limit_bytes"].as_u64().unwrap();
            assert_eq!(
                limit,
                (p["footprint_bytes"].as_u64().unwrap() / 2).max(1 << 20),
                "{r}"
            );
            let rel = r["relative_to_plain"].as_f64().unwrap();
            assert!(
                (rel - r["seconds"].as_f64().unwrap() / plain).abs() < 1e-9,
                "{r}"
            );
            if r["system"] == "rmem" {
                // rmem must finish with the plain run's output.
                assert_eq!(r["status"], "ok", "{r}");
                assert_eq!(r["identical"], true, "{r}");
            } else if r["status"] == "ok" {
                assert_eq!(r["identical"], true, "kernel swap changed the output: {r}");
                assert!(
                    r["peak_bytes"].as_u64().unwrap() <= limit + (1 << 20),
                    "the cgroup limit did not hold: {r}"
                );
            }
        }
    }
    // rmem's own runs: the numpy one runs as nobody (as root), and something was fetched in
    // the programs whose data dwarfs their code (ImageMagick's image is allocated whole).
    let named = |name: &str| progs.iter().find(|p| p["program"] == name).unwrap();
    assert_eq!(named("numpy")["as_nobody"], is_root());
    for p in ["sort", "imagemagick", "stream"].map(named) {
        let rmem = &p["runs"][0];
        assert!(rmem["bytes_in"].as_u64().unwrap() > 0, "nothing paged: {p}");
    }
    // The geometric means are of the runs listed, over the programs whose every run counts:
    // ended with the plain output or at its time limit, and under rmem was paged at all.
    let counts = |r: &serde_json::Value| {
        let ended = (r["status"] == "ok" && r["identical"] == true) || r["status"] == "timed-out";
        let unpaged = r["system"] == "rmem"
            && r["bytes_in"] == 0
            && r["peak_bytes"].as_u64() > r["limit_bytes"].as_u64();
        ended && !unpaged
    };
    let common: Vec<&serde_json::Value> = progs
        .iter()
        .filter(|p| p["runs"].as_array().unwrap().iter().all(counts))
        .collect();
    let rmem_mean = v["geomeans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["what"] == "rmem/plain" && m["ratio"] == 50);
    if common.is_empty() {
        assert!(rmem_mean.is_none(), "a mean over no program: {rmem_mean:?}");
    } else {
        let rmem_mean = rmem_mean.expect("rmem's geometric mean");
        assert_eq!(rmem_mean["programs"], common.len(), "{rmem_mean}");
        let logs: f64 = common
            .iter()
            .map(|p| p["runs"][0]["relative_to_plain"].as_f64().unwrap().ln())
            .sum();
        let g = (logs / common.len() as f64).exp();
        assert!(
            (g - rmem_mean["geomean"].as_f64().unwrap()).abs() < 1e-6 * g,
            "{g} {rmem_mean}"
        );
    }
    assert!(
        out.stdout.contains("50%: geomean rmem / plain"),
        "{}",
        out.stdout
    );
    for f in ["programs-50.png", "programs-50.svg"] {
        assert!(
            std::fs::metadata(plots.join(f)).is_ok_and(|m| m.len() > 1000),
            "{f}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `rmem bench compress` at a tiny size: the programs' memory sampled while they run (their
/// output unchanged), every page round-tripped through both codecs, and the modelled link
/// figures consistent with the measured ratios and times.
#[test]
fn tiny_compress_bench_samples_programs_and_models_links() {
    let dir = scratch("bench-compress");
    let json = dir.join("compress.json");
    let mut cmd = Command::new(rmem());
    cmd.args([
        "bench",
        "compress",
        "--size",
        "tiny",
        "--only",
        "python,stream",
        "--gbits",
        "10,25",
        "--timeout-s",
        "120",
        "--json",
    ])
    .arg(&json);
    let out = run_bounded(&mut cmd, Duration::from_secs(600));
    assert!(
        out.status.success(),
        "bench compress failed ({:?}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    let v = read_json(&json);
    assert_eq!(v["page_size"], 65536);
    let progs = v["programs"].as_array().expect("programs is a list");
    let names: Vec<&str> = progs.iter().filter_map(|r| r["program"].as_str()).collect();
    // Both run long enough at the tiny size to be sampled (sort and Himeno may not).
    assert_eq!(names, ["python", "stream"]);
    for p in progs {
        assert!(p["samples"].as_u64().unwrap() >= 1, "{p}");
        let pages = p["pages"].as_u64().unwrap();
        let bytes_in = p["bytes_in"].as_u64().unwrap();
        assert!(pages > 0 && bytes_in == pages * 65536, "{p}");
        let codecs: Vec<&str> = p["codecs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["codec"].as_str())
            .collect();
        assert_eq!(codecs, ["lz4", "zstd-1"], "{p}");
        for c in p["codecs"].as_array().unwrap() {
            let bytes_out = c["bytes_out"].as_u64().unwrap();
            // A page that does not shrink is sent as it is: never more bytes than came in.
            assert!(bytes_out > 0 && bytes_out <= bytes_in, "{c}");
            let ratio = c["ratio"].as_f64().unwrap();
            assert!(
                (ratio - bytes_in as f64 / bytes_out as f64).abs() < 1e-9,
                "{c}"
            );
            assert!(c["pages_not_shrunk"].as_u64().unwrap() <= pages, "{c}");
            let (comp, dec) = (
                c["compress_us_per_page"].as_f64().unwrap(),
                c["decompress_us_per_page"].as_f64().unwrap(),
            );
            assert!(comp > 0.0 && dec >= 0.0, "{c}");
            let saved_bits = (bytes_in - bytes_out) as f64 * 8.0 / pages as f64;
            for l in c["links"].as_array().unwrap() {
                let g = l["gbits"].as_f64().unwrap();
                let saved_us = saved_bits / (g * 1e3);
                let near = |a: f64, b: f64| (a - b).abs() < 1e-6 * (1.0 + b.abs());
                assert!(
                    near(l["wire_saved_us_per_page"].as_f64().unwrap(), saved_us),
                    "{l}"
                );
                assert!(
                    near(l["fetch_delta_us"].as_f64().unwrap(), dec - saved_us),
                    "{l}"
                );
                assert!(
                    near(l["write_back_delta_us"].as_f64().unwrap(), comp - saved_us),
                    "{l}"
                );
            }
        }
    }
    assert!(out.stdout.contains("pays below"), "{}", out.stdout);
}
