//! `rmem bench programs` at a tiny size, as the test suite runs it: every program's output under
//! rmem is identical to its plain run, at a quarter of its footprint, and the JSON says so.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn tiny_programs_bench_matches_plain_runs() {
    let dir = scratch("bench-programs");
    let json = dir.join("programs.json");
    let mut cmd = Command::new(rmem());
    cmd.args([
        "bench",
        "programs",
        "--sort-mib",
        "4",
        "--numpy-mib",
        "16",
        "--small-keys",
        "20000",
        "--page-size",
        "4K",
        "--timeout-s",
        "200",
        "--json",
    ])
    .arg(&json);
    let out = run_bounded(&mut cmd, Duration::from_secs(280));
    assert!(
        out.status.success(),
        "bench programs failed ({:?}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    let v = read_json(&json);
    let rows = v["results"].as_array().expect("results is a list");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["program"].as_str()).collect();
    assert_eq!(names, ["sort", "numpy", "python-small"]);
    for r in rows {
        assert_eq!(r["identical"], true, "{r}");
        assert_eq!(r["status"], "ok", "{r}");
        let footprint = r["footprint_bytes"].as_u64().unwrap();
        let local = r["local_bytes"].as_u64().unwrap();
        assert!(footprint > 0 && local <= footprint / 4 + 8 * 4096, "{r}");
        assert!(r["rmem_seconds"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["swap_outs"].as_u64().unwrap() > 0, "nothing paged: {r}");
    }
    assert_eq!(
        rows[1]["as_nobody"],
        is_root(),
        "numpy runs as nobody under root"
    );
    let _ = std::fs::remove_dir_all(dir);
}
