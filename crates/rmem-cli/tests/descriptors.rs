//! What a program does to its descriptors and its receives never costs it data: rmem's own
//! descriptors are out of its reach (dup2 onto every number, close_range, closefrom, a loop of
//! close, bash's `exec 6>`, Python's os.dup2), a raw system call that takes one is reported,
//! and messages received unprivileged into remote buffers are never lost.

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

/// `rmem run OPTS -- PROGRAM`; `unprivileged`: as `nobody` when root, and user-mode-only
/// userfaultfd either way.
fn run(opts: &[&str], stats: &Path, program: &[&str], unprivileged: bool) -> Output {
    let mut c = rmem_run(opts, stats, program, unprivileged);
    if unprivileged {
        c.env("RMEM_UFFD_USER_MODE_ONLY", "1");
    }
    run_bounded(&mut c, Duration::from_secs(120))
}

fn paged(stats: &Path) {
    let v = read_json(stats);
    assert!(
        v["swap_ins"].as_u64().unwrap() > 0 && v["swap_outs"].as_u64().unwrap() > 0,
        "no paging: {v}"
    );
}

fn fd_reuse(mode: &str, unprivileged: bool) -> Output {
    let prog = build_plain("tests/c/fd_reuse.c");
    let dir = scratch(&format!("fds-{mode}-{unprivileged}"));
    let stats = dir.join("stats.json");
    let out = run(
        &["--local", "4M"],
        &stats,
        &[prog.to_str().unwrap(), mode, "32"],
        unprivileged,
    );
    if out.status.success() {
        paged(&stats);
    }
    let _ = std::fs::remove_dir_all(dir);
    out
}

fn assert_ok(out: &Output, marker: &str) {
    assert!(
        out.status.success() && out.stdout.contains(marker),
        "{:?}\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
}

#[test]
fn dup2_onto_every_low_number_and_onto_rmems_own_descriptors() {
    assert_ok(&fd_reuse("dup2", false), "fds: ok");
}

#[test]
fn dup2_onto_every_descriptor_unprivileged() {
    assert_ok(&fd_reuse("dup2", true), "fds: ok");
}

#[test]
fn close_range_through_the_c_library() {
    assert_ok(&fd_reuse("range", false), "fds: ok");
    assert_ok(&fd_reuse("range", true), "fds: ok");
}

#[test]
fn closefrom_and_a_loop_closing_every_descriptor() {
    assert_ok(&fd_reuse("closefrom", false), "fds: ok");
    assert_ok(&fd_reuse("loop", false), "fds: ok");
}

#[test]
fn a_raw_close_range_keeps_the_data_and_stops_with_a_message_at_the_next_command() {
    let out = fd_reuse("raw", false);
    let stderr = &out.stderr;
    assert_eq!(
        out.status.code(),
        Some(rmem_client::runtime::EXIT_DESCRIPTOR_LOST),
        "{stderr}"
    );
    assert!(
        stderr.contains("was closed by a raw system call") && !stderr.contains("bytes wrong"),
        "{stderr}"
    );
}

#[test]
fn bash_exec_onto_low_descriptors_with_all_of_its_memory_remote() {
    let dir = scratch("fds-bash");
    let stats = dir.join("stats.json");
    // No command substitution: the descriptors, not fork(), are what this tests (fork.rs has bash
    // with its substitutions and subshells).
    let script = "exec 3>/dev/null 4>/dev/null 5>/dev/null 6>/dev/null 7</dev/null 8>&1 9>&2; \
                  a=(); for ((i = 0; i < 100000; i++)); do a[i]=$i; done; exec 6>&-; \
                  s=0; for v in \"${a[@]}\"; do ((s += v)); done; echo \"sum $s\"";
    let out = run(
        &["--local", "1M", "--page-size", "4K", "--min-alloc", "0"],
        &stats,
        &["bash", "-c", script],
        false,
    );
    let expect: u64 = (0..100000u64).sum();
    assert_ok(&out, &format!("sum {expect}"));
    paged(&stats);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn python_dup2_onto_low_descriptors() {
    let dir = scratch("fds-python");
    let stats = dir.join("stats.json");
    let script = "import hashlib, os\n\
                  a = bytearray(os.urandom(1 << 20)) * 32\n\
                  h = hashlib.sha256(a).hexdigest()\n\
                  f = os.open('/dev/null', os.O_WRONLY)\n\
                  for n in range(3, 256):\n    \
                      if n != f: os.dup2(f, n)\n\
                  assert hashlib.sha256(a).hexdigest() == h, 'data changed'\n\
                  b = bytearray(a)\n\
                  assert b == a\n\
                  print('python: ok')\n";
    let out = run(
        &["--local", "8M"],
        &stats,
        &["python3", "-c", script],
        false,
    );
    assert_ok(&out, "python: ok");
    paged(&stats);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn no_message_is_lost_receiving_into_remote_buffers_unprivileged() {
    let prog = build_plain("tests/c/msg_recv.c");
    let dir = scratch("msgs");
    let stats = dir.join("stats.json");
    let out = run(
        &["--local", "1M", "--page-size", "16K"],
        &stats,
        &[prog.to_str().unwrap()],
        true,
    );
    assert_ok(&out, "msgs: ok");
    paged(&stats);
    let _ = std::fs::remove_dir_all(dir);
}
