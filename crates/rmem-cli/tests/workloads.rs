//! Every workload in `workloads/` at a tiny size, on plain memory and under
//! `rmem run --api` with a quarter of its footprint local: the self-check must pass, the
//! result must be the same, and rmem must have swapped.

mod common;
#[allow(dead_code)]
#[path = "../../rmem-bench/src/workloads.rs"]
mod workloads;

use common::*;
use std::process::Command;
use std::time::Duration;

/// Run workload `name` on SIZE_MIB MiB (plus its optional argument) both ways.
fn plain_and_rmem(name: &str, size_mib: u64, extra: &[&str]) {
    let prog = workloads::build(&target_dir(), name).unwrap();
    let size = size_mib.to_string();

    let mut plain = Command::new(&prog);
    plain.arg(&size).args(extra).env_remove("RMEM_MODE");
    let out = run_bounded(&mut plain, Duration::from_secs(60));
    assert!(out.status.success(), "{name} plain: {}", out.stderr);
    let local = workloads::parse_result(name, &out.stdout)
        .unwrap_or_else(|| panic!("{name} plain printed no result: {}", out.stdout));

    let dir = scratch(&format!("workload-{name}"));
    let stats = dir.join("stats.json");
    let mut cmd = Command::new(rmem());
    cmd.args(["run", "--api", "--page-size", "64K", "--local"])
        .arg(format!("{}K", size_mib * 1024 / 4))
        .arg("--stats-json")
        .arg(&stats)
        .arg("--")
        .arg(&prog)
        .arg(&size)
        .args(extra);
    let out = run_bounded(&mut cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{name} under rmem ({:?}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    let remote = workloads::parse_result(name, &out.stdout)
        .unwrap_or_else(|| panic!("{name} under rmem printed no result: {}", out.stdout));
    assert_eq!(
        remote.checksum, local.checksum,
        "{name}: different results on rmem and on plain memory"
    );
    let s = read_json(&stats);
    for key in ["swap_ins", "swap_outs"] {
        assert!(
            s[key].as_u64().is_some_and(|n| n > 0),
            "{name}: rmem did not swap ({key} = {})",
            s[key]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stream() {
    plain_and_rmem("stream", 4, &[]);
}

#[test]
fn himeno() {
    // 14 grids touched at every cell: 8 MiB so that a quarter holds them all at 64K pages.
    plain_and_rmem("himeno", 8, &["2"]);
}

#[test]
fn cg() {
    plain_and_rmem("cg", 4, &[]);
}

#[test]
fn is() {
    plain_and_rmem("is", 4, &["1"]);
}

#[test]
fn cluster() {
    plain_and_rmem("cluster", 4, &["8"]);
}

#[test]
fn random() {
    // Every update misses three times in four at a quarter local: keep them few.
    plain_and_rmem("random", 4, &["20000"]);
}

#[test]
fn sort() {
    plain_and_rmem("sort", 4, &[]);
}

#[test]
fn a_bad_argument_fails_with_a_message() {
    let prog = workloads::build(&target_dir(), "stream").unwrap();
    let out = run_bounded(Command::new(&prog).arg("0"), Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("workload stream FAILED"),
        "{}",
        out.stderr
    );
}
