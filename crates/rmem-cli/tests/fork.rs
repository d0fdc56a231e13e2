//! fork() without exec under rmem, end to end: children read their parent's remote memory as
//! it was at the fork while everyone writes (a 256 MiB array, eight children; the 8-thread
//! verifying stress), bash's command substitutions and subshells with all of its memory
//! remote, Python's multiprocessing.Pool with the fork start method over remote numpy arrays
//! (also as `nobody`), CPython's own subprocess and multiprocessing tests, children over
//! erasure-coded encrypted pages, a killed child's memory on the servers, and what
//! fork-then-exec costs. Every run is bounded in time.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "secret-for-the-fork-test";

fn ok(out: &Output) -> String {
    format!("{:?}\n{}\n{}", out.status, out.stdout, out.stderr)
}

/// 256 MiB remote at a quarter local; eight children each check the whole array against the
/// parent's pattern at the fork, write their own and check it, while the parent rewrites the
/// array over and over: zero mismatches anywhere, and the parent's data is its own.
#[test]
fn eight_children_read_a_256_mib_snapshot_while_the_parent_writes() {
    let prog = build_plain("tests/c/fork_snapshot.c");
    let dir = scratch("fork-snapshot");
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(
            &["--local", "64M"],
            &stats,
            &[prog.to_str().unwrap(), "256", "8"],
            false,
        ),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success() && out.stdout.contains("fork_snapshot: ok"),
        "{}",
        ok(&out)
    );
    // The parent paged: its array is four times its budget.
    let v = read_json(&stats);
    assert!(v["swap_ins"].as_u64().unwrap() > 0, "{v}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A fork() child's paging is its own and is reported: each child that runs its exit handlers
/// writes `STATS.PID`, counted from the fork (a child that only reads and rewrites its
/// parent's array swaps in and makes no zero-fills, while the parent's fill made them all),
/// within its own budget; the summary says the children paged, and no longer blames the
/// program for a peak resident set that is the children's (a PostgreSQL backend is such a
/// child: its paging was invisible).
#[test]
fn fork_children_report_their_own_paging() {
    let prog = build_plain("tests/c/fork_snapshot.c");
    let dir = scratch("fork-children-stats");
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(
            &["--local", "16M"],
            &stats,
            &[prog.to_str().unwrap(), "64", "3", "exit"],
            false,
        ),
        Duration::from_secs(180),
    );
    assert!(
        out.status.success() && out.stdout.contains("fork_snapshot: ok"),
        "{}",
        ok(&out)
    );
    assert!(
        out.stderr
            .contains("rmem: 3 child processes paged too, each in a --local of its own")
            && !out.stderr.contains("not rmem's to page"),
        "{}",
        out.stderr
    );
    let parent = read_json(&stats);
    let page = parent["page_size"].as_u64().unwrap();
    assert!(
        parent["zero_fills"].as_u64().unwrap() >= (64 << 20) / page,
        "{parent}"
    );
    let children = children_stats(&stats);
    assert_eq!(children.len(), 3, "{children:?}");
    for v in &children {
        assert_eq!(v["complete"], true, "{v}");
        // Read 64 MiB in a 16 MiB budget: at least 48 MiB came back from the snapshot.
        assert!(v["swap_ins"].as_u64().unwrap() * page >= 48 << 20, "{v}");
        assert!(v["zero_fills"].as_u64().unwrap() < 16, "{v}");
        assert!(v["local_bytes_max"].as_u64().unwrap() <= 16 << 20, "{v}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// fork() while 8 threads fault, evict and write back: each child sees the memory of the
/// instant of the fork (a word a thread was storing then may be on either side), then runs a
/// verified workload of its own; the parent's verification is unaffected. On 4 KiB pages, and
/// on the default 64 KiB with sub-page pieces, where random writes leave pages holding written
/// pieces at the fork (written back and waited for before the child's snapshot).
fn fork_during_the_verifying_stress(page: &str, extra: &[&str]) {
    let prog = build_c("tests/c/stress.c");
    let dir = scratch(&format!("fork-stress-{page}-{}", extra.len()));
    let stats = dir.join("stats.json");
    let mut opts = vec!["--api", "--local", "8M", "--page-size", page];
    opts.extend_from_slice(extra);
    let mut cmd = rmem_run(
        &opts,
        &stats,
        &[prog.to_str().unwrap(), "8", "32", "60000"],
        false,
    );
    cmd.env("STRESS_FORKS", "3");
    let out = run_bounded(&mut cmd, Duration::from_secs(300));
    assert!(
        out.status.success()
            && out.stdout.contains("stress: ok")
            && out.stdout.contains("mismatches=0"),
        "{}",
        ok(&out)
    );
    if page == "64K" {
        let v = read_json(&stats);
        assert!(v["sub_page_write_backs"].as_u64().unwrap() > 1000, "{v}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn fork_during_the_verifying_stress_on_4k_pages() {
    fork_during_the_verifying_stress("4K", &[]);
}

#[test]
fn fork_during_the_verifying_stress_with_written_pieces() {
    fork_during_the_verifying_stress("64K", &[]);
}

/// The same where written pieces go back alone under a seal (encrypted replicas: each piece
/// sealed with the page's next version, a version kept per piece), the children reading their
/// snapshots' pages under their parent's key and writing under their own.
#[test]
fn fork_during_the_verifying_stress_with_pieces_sealed_alone_over_encrypted_replicas() {
    fork_during_the_verifying_stress(
        "64K",
        &["--servers", "3", "--redundancy", "replicas:2", "--encrypt"],
    );
}

/// bash under `--min-alloc 0` on 4 KiB pages with 256 KiB local: every variable lives in
/// remote memory, most of it not resident, and every `$(...)`, `( ... )`, pipeline and
/// background job is a fork() child reading it. The output equals a plain run's (an empty
/// `$(...)` used to be the silent result).
fn bash_script(as_nobody: bool) {
    let dir = scratch(&format!("fork-bash-{as_nobody}"));
    let script = dir.join("subshells.sh");
    std::fs::copy(repo_root().join("tests/sh/fork_subshells.sh"), &script).unwrap();
    let plain = run_bounded(Command::new("bash").arg(&script), Duration::from_secs(60));
    assert!(plain.status.success(), "{}", ok(&plain));
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(
            &["--min-alloc", "0", "--page-size", "4K", "--local", "256K"],
            &stats,
            &["bash", script.to_str().unwrap()],
            as_nobody,
        ),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", ok(&out));
    assert_eq!(out.stdout, plain.stdout, "{}", out.stderr);
    assert!(out.stdout.contains("x=hi") && out.stdout.ends_with("done\n"));
    let v = read_json(&stats);
    assert!(
        v["swap_outs"].as_u64().unwrap() > 0,
        "nothing left local memory: {v}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bash_substitutions_and_subshells_with_all_of_its_memory_remote() {
    bash_script(false);
}

#[test]
fn bash_substitutions_and_subshells_as_nobody() {
    bash_script(true);
}

/// multiprocessing.Pool(fork) over 64 MiB of numpy arrays with 16 MiB local: the same results
/// as a plain run, the workers' writes private to them; spawn under rmem gives them too, and
/// the two pools' times are printed (docs/benchmarks.md has the ratio at a larger size).
fn python_pool(as_nobody: bool) {
    let py = "/usr/bin/python3";
    let dir = scratch(&format!("fork-pool-{as_nobody}"));
    let script = dir.join("pool_fork.py");
    std::fs::copy(repo_root().join("tests/py/pool_fork.py"), &script).unwrap();
    let script = script.to_str().unwrap();
    let plain = run_bounded(
        Command::new(py).args([script, "64", "fork", "4"]),
        Duration::from_secs(120),
    );
    assert!(
        plain.status.success() && plain.stdout.contains("parent arrays unchanged: True"),
        "{}",
        ok(&plain)
    );
    let mut took = Vec::new();
    for method in ["fork", "spawn"] {
        let stats = dir.join(format!("stats-{method}.json"));
        let out = run_bounded(
            &mut rmem_run(
                &["--local", "16M"],
                &stats,
                &[py, script, "64", method, "4"],
                as_nobody,
            ),
            Duration::from_secs(240),
        );
        assert!(out.status.success(), "{method}: {}", ok(&out));
        assert_eq!(out.stdout, plain.stdout, "{method}: {}", out.stderr);
        took.push(
            out.stderr
                .lines()
                .find(|l| l.starts_with("pool "))
                .unwrap_or_default()
                .to_string(),
        );
        if method == "fork" {
            let v = read_json(&stats);
            assert!(v["swap_ins"].as_u64().unwrap() > 0, "{v}");
        }
    }
    eprintln!("under rmem: {}; {}", took[0], took[1]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn python_pool_fork_over_remote_numpy_arrays() {
    python_pool(false);
}

#[test]
fn python_pool_fork_as_nobody() {
    python_pool(true);
}

/// The same over the cluster layer: three servers, each page in two data fragments and a
/// parity one, sealed with AES-256-GCM; every server takes a snapshot at each fork, and the
/// children decode their parent's pages from the snapshots' fragments.
#[test]
fn children_read_their_snapshot_from_erasure_coded_encrypted_pages() {
    let prog = build_plain("tests/c/fork_snapshot.c");
    let dir = scratch("fork-ec");
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(
            &[
                "--servers",
                "3",
                "--redundancy",
                "ec:2+1",
                "--encrypt",
                "--local",
                "16M",
            ],
            &stats,
            &[prog.to_str().unwrap(), "64", "4"],
            false,
        ),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success() && out.stdout.contains("fork_snapshot: ok"),
        "{}",
        ok(&out)
    );
    let v = read_json(&stats);
    assert!(v["swap_ins"].as_u64().unwrap() > 0, "{v}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A fork() whose child cannot be served (the pipe rmem watches the child by cannot be made
/// under a lowered open-file limit) fails at the call with EAGAIN and rmem's reason, leaves no
/// child, and the program goes on: with the limit restored, fork() works again.
#[test]
fn a_fork_rmem_cannot_serve_fails_at_the_call() {
    let prog = build_plain("tests/c/fork_refused.c");
    let dir = scratch("fork-refused");
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(&["--local", "4M"], &stats, &[prog.to_str().unwrap()], false),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success()
            && out.stdout.contains("refused: EAGAIN")
            && out.stdout.contains("fork_refused: ok"),
        "{}",
        ok(&out)
    );
    assert!(
        out.stderr.contains("fork() failed (EAGAIN)") && out.stderr.contains("pipe"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("touched its parent's remote memory"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// One line per test of a verbose unittest run: `name (module.Class.name) ... outcome`, the
/// outcome's first word (ok, FAIL, ERROR, skipped, expected, unexpected).
fn unittest_outcomes(stderr: &str) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    for l in without_server_lines(stderr).lines() {
        let Some((name, rest)) = l.split_once(") ... ") else {
            continue;
        };
        let Some((_, id)) = name.rsplit_once(" (") else {
            continue;
        };
        let word = rest.split_whitespace().next().unwrap_or("").to_string();
        out.insert(id.to_string(), word);
    }
    out
}

/// `stderr` without the memory servers' log records, which share the program's stderr under
/// `rmem run` and may cut into a line of its own (`test_x (...) ... rmem-server WARN ...`, then
/// `ok` on the next line): the record is dropped and the line goes on with the next one.
fn without_server_lines(stderr: &str) -> String {
    const LEVELS: [&str; 5] = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"];
    let mut out = String::with_capacity(stderr.len());
    for l in stderr.lines() {
        let record = l.match_indices("rmem-server ").find(|&(at, m)| {
            let level = l[at + m.len()..].split_whitespace().next().unwrap_or("");
            LEVELS.contains(&level)
        });
        match record {
            Some((0, _)) => {}
            Some((at, _)) => out.push_str(&l[..at]),
            None => {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}

#[test]
fn a_server_record_inside_a_unittest_line_is_skipped() {
    let got = unittest_outcomes(
        "test_a (m.C.test_a) ... rmem-server WARN  x: closing y: gone\nok\n\
         rmem-server INFO  z\ntest_b (m.C.test_b) ... FAIL\n",
    );
    assert_eq!(
        got.get("m.C.test_a").map(String::as_str),
        Some("ok"),
        "{got:?}"
    );
    assert_eq!(
        got.get("m.C.test_b").map(String::as_str),
        Some("FAIL"),
        "{got:?}"
    );
}

/// Parts of CPython's own test_subprocess and test_multiprocessing_fork (the classes that run
/// in a bounded time) with every allocation of the interpreter remote (`--min-alloc 0`,
/// `PYTHONMALLOC=malloc`): each test has the same outcome as in a plain run.
#[test]
fn cpython_subprocess_and_multiprocessing_fork_tests() {
    let py = "/usr/bin/python3";
    let have = Command::new(py)
        .args([
            "-c",
            "import test.test_subprocess, test.test_multiprocessing_fork",
        ])
        .status()
        .unwrap();
    assert!(
        have.success(),
        "CPython's test package is missing: run scripts/deps.sh as root \
         (libpython3.X-testsuite)"
    );
    let sp = "test.test_subprocess";
    let mp = "test.test_multiprocessing_fork";
    let mut classes: Vec<String> = [
        "ProcessTestCase",
        "POSIXProcessTestCase",
        "RunFuncTestCase",
        "ContextManagerTests",
        "MiscTests",
    ]
    .iter()
    .map(|c| format!("{sp}.{c}"))
    .collect();
    classes.extend(
        [
            "WithProcessesTestProcess",
            "WithProcessesTestPool",
            "WithProcessesTestQueue",
            "WithProcessesTestConnection",
            "WithProcessesTestLock",
            "WithProcessesTestCondition",
            "WithProcessesTestSemaphore",
            "WithProcessesTestEvent",
            "WithProcessesTestValue",
            "WithProcessesTestArray",
            "WithProcessesTestSharedCTypes",
            "WithProcessesTestPoolWorkerLifetime",
            "WithProcessesTestSubclassingProcess",
            "WithProcessesTestFinalize",
            "WithProcessesTestHeap",
            "WithProcessesTestPoll",
            "TestCloseFds",
            "TestSimpleQueue",
            "TestWait",
        ]
        .iter()
        .map(|c| format!("{mp}.{c}")),
    );
    let dir = scratch("fork-cpython");
    let mut args = vec!["-m", "unittest", "-v"];
    args.extend(classes.iter().map(String::as_str));
    let plain = run_bounded(
        Command::new(py)
            .args(&args)
            .current_dir(&dir)
            .env("PYTHONMALLOC", "malloc"),
        Duration::from_secs(300),
    );
    let want = unittest_outcomes(&plain.stderr);
    assert!(want.len() > 300, "{}", ok(&plain));
    let stats = dir.join("stats.json");
    let mut program = vec![py];
    program.extend(&args);
    let mut cmd = rmem_run(
        &["--min-alloc", "0", "--local", "64M"],
        &stats,
        &program,
        false,
    );
    cmd.current_dir(&dir).env("PYTHONMALLOC", "malloc");
    let out = run_bounded(&mut cmd, Duration::from_secs(480));
    let got = unittest_outcomes(&out.stderr);
    let differ: Vec<String> = want
        .iter()
        .filter(|&(t, w)| got.get(t) != Some(w))
        .map(|(t, w)| format!("{t}: {w} plain, {:?} under rmem", got.get(t)))
        .collect();
    assert!(
        differ.is_empty() && got.len() == want.len(),
        "{} of {} tests differ:\n{}\n{}",
        differ.len(),
        want.len(),
        differ.join("\n"),
        out.stderr
    );
    assert_eq!(out.status.success(), plain.status.success(), "{}", ok(&out));
    eprintln!(
        "{} CPython tests, the same outcomes: plain {:?}, under rmem {:?}",
        want.len(),
        plain.elapsed,
        out.elapsed
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A child killed with SIGKILL: its parent frees its snapshot on the servers at once (the
/// child's end of a pipe closes with it), well within the lease; and with the parent killed
/// too, the lease frees everything.
#[test]
fn a_killed_child_s_memory_is_freed() {
    let lease = Duration::from_secs(2);
    let server = ServerProcess::start(TOKEN, &["--verbose", "--lease", "2"]);
    let prog = build_c("tests/c/fork_kill.c");
    let start = || {
        let mut child = Command::new(&prog)
            .arg("16")
            .env("RMEM_SERVERS", &server.addr)
            .env("RMEM_TOKEN", TOKEN)
            .env("RMEM_LOCAL", "4M")
            .env("RMEM_PAGE_SIZE", "16K")
            .env("RMEM_HEARTBEAT_MS", "500")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut pid = 0;
        for _ in 0..2 {
            let l = lines.next().expect("a line").unwrap();
            if let Some(p) = l.strip_prefix("child ") {
                pid = p.split_whitespace().next().unwrap().parse::<i32>().unwrap();
            }
        }
        assert!(pid > 0, "no child pid");
        (child, pid, lines)
    };
    let sessions = || {
        let st = status_json(&server.addr, TOKEN);
        st["sessions"].as_array().unwrap().clone()
    };
    let wait_sessions = |n: usize, limit: Duration| {
        let t = Instant::now();
        while t.elapsed() < limit {
            if sessions().len() == n {
                return t.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("still {:?} after {limit:?}: {}", sessions(), server.log());
    };

    // The parent alive: the child's snapshot goes when the child does.
    let (mut parent, child, mut lines) = start();
    let held = sessions();
    assert_eq!(
        held.len(),
        2,
        "the parent's session and the child's: {held:?}"
    );
    let child_bytes = held
        .iter()
        .map(|s| s["used_bytes"].as_u64().unwrap())
        .min()
        .unwrap();
    assert!(child_bytes >= 8 << 20, "the child's own pages: {held:?}");
    // SAFETY: kill(2) of the test's own grandchild.
    assert_eq!(unsafe { libc::kill(child, libc::SIGKILL) }, 0);
    let took = wait_sessions(1, lease);
    eprintln!("a killed child's snapshot freed {took:?} after the kill");
    drop(parent.stdin.take());
    assert_eq!(lines.next().unwrap().unwrap(), "parent: ok");
    assert!(parent.wait().unwrap().success());

    // Parent and child killed: the lease frees both sessions (the parent's ended when it
    // could not say so).
    wait_sessions(0, lease + Duration::from_secs(2));
    let (mut parent, child, _lines) = start();
    assert_eq!(sessions().len(), 2);
    parent.kill().unwrap();
    let _ = parent.wait();
    // SAFETY: kill(2) of the test's own grandchild.
    assert_eq!(unsafe { libc::kill(child, libc::SIGKILL) }, 0);
    let killed = Instant::now();
    wait_sessions(0, lease + Duration::from_secs(2));
    assert!(
        killed.elapsed() <= lease + Duration::from_secs(1),
        "{:?}",
        killed.elapsed()
    );
    let st = status_json(&server.addr, TOKEN);
    assert_eq!(st["used_bytes"], 0, "{st}");
}

/// `rmem bench fork` at a small size (32 MiB written before each fork, best of three runs of
/// the median of 100; Pool over 32 MiB of arrays) runs under rmem and reports what it
/// measured, consistently. Whether issue 16's targets are met (fork+exec within 2x or 1 ms
/// of plain, Pool(fork) within 1.5x of Pool(spawn)) is the benchmark's verdict, recorded
/// with the command in docs/benchmarks.md: a timing is not a test's to assert.
#[test]
fn rmem_bench_fork_measures_fork_then_exec_and_pool_fork() {
    let dir = scratch("fork-bench");
    let json = dir.join("fork.json");
    let out = run_bounded(
        Command::new(rmem())
            .args([
                "bench",
                "fork",
                "--mib",
                "32",
                "--forks",
                "100",
                "--rounds",
                "3",
                "--pool-mib",
                "32",
                "--json",
            ])
            .arg(&json),
        Duration::from_secs(240),
    );
    assert!(out.status.success(), "{}", ok(&out));
    eprintln!("{}", out.stdout);
    let v = read_json(&json);
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("no {k} in {v}"));
    let (plain, bare) = (f("fork_exec_plain_us"), f("fork_exec_rmem_us"));
    for k in [
        "fork_exec_plain_us",
        "fork_exec_rmem_us",
        "fork_exec_rmem_ld_preload_us",
        "spawn_plain_us",
        "spawn_rmem_us",
        "pool_fork_s",
        "pool_spawn_s",
    ] {
        assert!(f(k) > 0.0 && f(k).is_finite(), "{k}: {v}");
    }
    assert!((f("fork_exec_ratio") - bare / plain).abs() < 1e-9, "{v}");
    let within = bare <= (2.0 * plain).max(plain + 1000.0);
    assert_eq!(v["fork_exec_within_target"], within, "{v}");
    assert!(
        (f("pool_ratio") - f("pool_fork_s") / f("pool_spawn_s")).abs() < 1e-9,
        "{v}"
    );
    let verdict = if within { "within" } else { "NOT within" };
    let said = format!("kept): {verdict} the target (2x or +1 ms)");
    assert!(out.stdout.contains(&said), "{}", out.stdout);
    let _ = std::fs::remove_dir_all(dir);
}

/// A library whose constructor registers fork handlers before librmem's constructor runs (a
/// library the program links is initialized before the preloaded librmem), and whose
/// prepare handler locks a mutex in remote memory that was pushed out of local memory, as
/// jemalloc's does with its arenas' mutexes: rmem's prepare handler runs after it (before
/// that fix it ran first, parked the pager, and the fork hung for good), and the child's and
/// the parent's handlers unlock it. At the default 64 KiB pages the mutex's page comes by a
/// 4 KiB piece: the child keeps the pieces mapped at the fork (before, partial pages were
/// dropped at the fork, and the child's handler, which runs before rmem's runtime exists in
/// the child, waited for good on the mutex).
#[test]
fn another_library_s_fork_handlers_lock_a_remote_mutex() {
    fork_handlers_lock_a_remote_mutex("64K", false);
}

#[test]
fn another_library_s_fork_handlers_lock_a_remote_mutex_on_4k_pages() {
    fork_handlers_lock_a_remote_mutex("4K", false);
}

#[test]
fn another_library_s_fork_handlers_lock_a_remote_mutex_as_nobody() {
    fork_handlers_lock_a_remote_mutex("64K", true);
}

fn fork_handlers_lock_a_remote_mutex(page: &str, as_nobody: bool) {
    let lib = compile(
        "tests/c/atfork_early.c",
        "lib",
        &["-shared".into(), "-fPIC".into(), "-DLIB".into()],
    );
    let prog = compile("tests/c/atfork_early.c", "plain-", &[lib.into_os_string()]);
    let dir = scratch(&format!("atfork-early-{page}-{as_nobody}"));
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(
            &["--local", "8M", "--page-size", page],
            &stats,
            &[prog.to_str().unwrap(), "32"],
            as_nobody,
        ),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success() && out.stdout.contains("atfork_early: ok 3 3 0"),
        "{}",
        ok(&out)
    );
    // The mutex left local memory and came back: whole at 4 KiB, by a piece at 64 KiB.
    let v = read_json(&stats);
    let came = if page == "4K" {
        "swap_ins"
    } else {
        "sub_page_fetches"
    };
    assert!(v[came].as_u64().unwrap() > 0, "{v}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The same library in a program that defines the malloc family itself, as one with an
/// allocator linked in statically does (rustc and jemalloc), so that the C library's own
/// allocations for a new thread go to an allocator that may be held until its own fork
/// handler runs: the child's runtime cannot start before the library's child handler, whose
/// blocks (from mmap, paged with `--anon-mmap`) are remote. With them resident the children
/// run; where the handler touches a block not resident at the fork, the child stops at once
/// with rmem's message and status 70, never waiting for good (before: a hang, as cargo under
/// `--anon-mmap` hung in rustc's fork children).
#[test]
fn a_fork_handler_that_runs_before_rmem_can_stops_the_child_with_a_message() {
    let lib = compile(
        "tests/c/atfork_early.c",
        "libmmap-",
        &[
            "-shared".into(),
            "-fPIC".into(),
            "-DLIB".into(),
            "-DMMAP".into(),
        ],
    );
    let prog = compile(
        "tests/c/atfork_early.c",
        "ownmalloc-",
        &["-DOWN_MALLOC".into(), lib.into_os_string()],
    );
    let dir = scratch("atfork-own-malloc");
    let stats = dir.join("stats.json");
    // Everything resident: the runtime starts in the second handler, after the library's.
    let out = run_bounded(
        &mut rmem_run(
            &["--anon-mmap", "--local", "256M"],
            &stats,
            &[prog.to_str().unwrap(), "8"],
            false,
        ),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success() && out.stdout.contains("atfork_early: ok 3 3 0"),
        "{}",
        ok(&out)
    );
    // The counter the child handler writes pushed out of local memory (by fifo: the default
    // policy may keep it, as a page older than the program's stream of writes). Rarely it is
    // resident at a fork all the same (seen for the first of three, about one run in twelve):
    // the first child that lacks it stops.
    let out = run_bounded(
        &mut rmem_run(
            &["--anon-mmap", "--local", "8M", "--policy", "fifo"],
            &stats,
            &[prog.to_str().unwrap(), "32"],
            false,
        ),
        Duration::from_secs(60),
    );
    assert!(
        !out.status.success()
            && out
                .stderr
                .contains("rmem: fatal: a fork() child handler that runs before rmem's can")
            && (0..3).any(|i| out.stderr.contains(&format!("child {i}: status 17920"))),
        "{}",
        ok(&out)
    );
    let _ = std::fs::remove_dir_all(dir);
}
