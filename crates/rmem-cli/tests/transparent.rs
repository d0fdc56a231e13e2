//! Transparent mode: unmodified programs under `rmem run` (LD_PRELOAD), in both userfaultfd
//! modes, with threads, fork, C++ static initializers, kernel-mode I/O, and real programs
//! (GNU sort, Python/numpy as `nobody`, Python with many small allocations) whose output is
//! compared with the same program run without rmem; programs linked with jemalloc and
//! tcmalloc, redis-server, large alignments, programs with their own signal handlers
//! (fork children that reset SIGSEGV, stress-ng), and managed runtimes (Java, Node.js, Go).

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn swapped(stats: &Path) -> serde_json::Value {
    let v = read_json(stats);
    assert!(
        v["swap_ins"].as_u64().unwrap() > 0 && v["swap_outs"].as_u64().unwrap() > 0,
        "no paging: {v}"
    );
    v
}

fn kernel_io(user_mode_only: bool, as_nobody: bool) {
    let prog = build_plain("tests/c/transparent_io.c");
    let dir = scratch(&format!("io-{user_mode_only}-{as_nobody}"));
    let stats = dir.join("stats.json");
    let mut cmd = rmem_run(
        &["--local", "1M", "--page-size", "16K"],
        &stats,
        &[prog.to_str().unwrap(), dir.to_str().unwrap(), "2"],
        as_nobody,
    );
    cmd.env(
        "RMEM_UFFD_USER_MODE_ONLY",
        if user_mode_only { "1" } else { "0" },
    )
    .env("RMEM_VERBOSE", "1");
    let out = run_bounded(&mut cmd, Duration::from_secs(120));
    assert!(
        out.status.success() && out.stdout.contains("io: ok"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    let user_mode = user_mode_only || (as_nobody && is_root());
    let started = out
        .stderr
        .lines()
        .find(|l| l.contains("rmem: started"))
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        started.contains("user-mode-only"),
        user_mode,
        "userfaultfd mode (want user-mode-only: {user_mode}): {started}"
    );
    swapped(&stats);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn kernel_io_into_non_resident_buffers_native_faults() {
    if !is_root() {
        eprintln!("SKIPPED kernel_io_into_non_resident_buffers_native_faults: kernel-mode faults need root here (vm.unprivileged_userfaultfd=0)");
        return;
    }
    kernel_io(false, false);
}

#[test]
fn kernel_io_into_non_resident_buffers_user_mode_only() {
    kernel_io(true, false);
}

#[test]
fn kernel_io_as_nobody() {
    kernel_io(false, true);
}

#[test]
fn fork_children_read_the_parent_s_memory_raw_fork_children_get_a_clear_error() {
    let prog = build_plain("tests/c/fork_child.c");
    let dir = scratch("fork");
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(&["--local", "4M"], &stats, &[prog.to_str().unwrap()], false),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success() && out.stdout.contains("fork: ok"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stdout.contains("system-ok")
            && out.stdout.contains("\nchild exit 0")
            && out.stdout.contains("_Fork child exit 70"),
        "{}",
        out.stdout
    );
    assert!(
        out.stderr
            .contains("child without rmem touched its parent's remote memory"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cxx_static_initializers_and_closed_stderr() {
    let prog = build_plain("tests/c/static_init.cpp");
    let plain = run_bounded(&mut Command::new(&prog), Duration::from_secs(30));
    let dir = scratch("static");
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(&["--local", "8M"], &stats, &[prog.to_str().unwrap()], false),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.stdout, plain.stdout);
    assert!(
        out.stderr.contains("swap-ins"),
        "no summary: {}",
        out.stderr
    );
    swapped(&stats);
    let _ = std::fs::remove_dir_all(dir);
}

/// A deterministic text file of `lines` random lines.
fn sort_input(path: &Path, lines: usize) {
    let mut s = String::with_capacity(lines * 24);
    let mut x = 0x2545F4914F6CDD1Du64;
    for i in 0..lines {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(&format!("{x:016x} {i}\n"));
    }
    std::fs::write(path, s).unwrap();
}

fn sort_identical(user_mode_only: bool) {
    let dir = scratch(&format!("sort-{user_mode_only}"));
    let input = dir.join("in.txt");
    sort_input(&input, 200_000);
    let plain = run_bounded(
        Command::new("sort").args(["--parallel=2"]).arg(&input),
        Duration::from_secs(60),
    );
    assert!(plain.status.success());
    let stats = dir.join("stats.json");
    // sort's footprint here is about 16 MiB (a buffer of about twice the input plus the line
    // table); 4 MiB local is a quarter of it.
    let mut cmd = rmem_run(
        &["--local", "4M", "--page-size", "4K", "--min-alloc", "64K"],
        &stats,
        &["sort", "--parallel=2", input.to_str().unwrap()],
        false,
    );
    cmd.env(
        "RMEM_UFFD_USER_MODE_ONLY",
        if user_mode_only { "1" } else { "0" },
    );
    let out = run_bounded(&mut cmd, Duration::from_secs(240));
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout == plain.stdout, "sort output differs under rmem");
    assert!(!out.stderr.contains("peak resident set"), "{}", out.stderr);
    swapped(&stats);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn gnu_sort_parallel_output_identical() {
    sort_identical(false);
}

#[test]
fn gnu_sort_parallel_output_identical_user_mode_only() {
    sort_identical(true);
}

/// A shell's commands are the program's children: without `--children` they run unpaged and
/// rmem says it has no statistics from the shell (dash ends with _exit) and where its commands
/// went; with it, sort (a pipeline's stage, so a child of the shell, not an exec of it) is paged
/// within its own budget and its output is sort's.
#[test]
fn a_shell_s_commands_are_paged_with_children() {
    let dir = scratch("children");
    let input = dir.join("in.txt");
    sort_input(&input, 200_000);
    let pipeline = format!("sort --parallel=2 {} | cat", input.display());
    let plain = run_bounded(
        Command::new("sh").args(["-c", &pipeline]),
        Duration::from_secs(60),
    );
    assert!(plain.status.success());
    let stats = dir.join("stats.json");
    let opts = ["--local", "4M", "--page-size", "4K"];
    let out = run_bounded(
        &mut rmem_run(&opts, &stats, &["sh", "-c", &pipeline], false),
        Duration::from_secs(240),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout == plain.stdout, "output differs under rmem");
    // dash ends with _exit: rmem has no statistics from it, and says where its commands went.
    assert!(
        out.stderr
            .contains("rmem: no statistics: sh ended without running its exit handlers")
            && out.stderr.contains("paged only with --children"),
        "{}",
        out.stderr
    );
    let with = [&opts[..], &["--children"]].concat();
    let out = run_bounded(
        &mut rmem_run(&with, &stats, &["sh", "-c", &pipeline], false),
        Duration::from_secs(240),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout == plain.stdout,
        "output differs under rmem --children"
    );
    assert!(out.stderr.contains("paged too"), "{}", out.stderr);
    let children = children_stats(&stats);
    // sort's statistics: the child that fetched pages.
    assert!(
        children
            .iter()
            .any(|v| v["swap_ins"].as_u64().unwrap_or(0) > 0
                && v["local_bytes_max"].as_u64().unwrap() <= 4 << 20),
        "no child was paged within 4 MiB: {children:?}"
    );
    // Without --children again, to the same --stats-json: the children's files of the run
    // before are not this run's.
    let out = run_bounded(
        &mut rmem_run(&opts, &stats, &["sh", "-c", &pipeline], false),
        Duration::from_secs(240),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stderr.contains("rmem: no statistics: sh") && !out.stderr.contains("paged too"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A paged child the program leaves running in the background (`cmd &`, a daemon) keeps its
/// memory on the servers: `rmem run` says so and waits for it before stopping them, and the
/// child's result is right (before, the servers went with the program and the child died of
/// their loss, while `rmem run` exited 0). Also: a bare `--stats-json` file name still finds
/// the children's `STATS.PID` beside it, for the summary's line about them.
#[test]
fn a_paged_child_left_running_keeps_its_servers() {
    let dir = scratch("background-child");
    let script = "import hashlib, sys, time\n\
                  a = bytearray(32 << 20)\n\
                  for i in range(0, len(a), 4096): a[i] = i % 251\n\
                  time.sleep(1.5)\n\
                  open(sys.argv[1], 'w').write(hashlib.sha256(a).hexdigest())\n";
    let plain = dir.join("plain.txt");
    let out = run_bounded(
        Command::new("/usr/bin/python3")
            .args(["-c", script])
            .arg(&plain),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", out.stderr);
    let shell = format!(
        "/usr/bin/python3 -c \"$0\" {} & sleep 0.3; exit 0",
        dir.join("paged.txt").display()
    );
    let out = run_bounded(
        rmem_run(
            &["--local", "4M", "--children"],
            Path::new("stats.json"),
            &["sh", "-c", &shell, script],
            false,
        )
        .current_dir(&dir),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("rmem run: sh ended; waiting for 1 paged child process still running"),
        "{}",
        out.stderr
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("paged.txt")).unwrap_or_default(),
        std::fs::read_to_string(&plain).unwrap(),
        "the background child's result: {}",
        out.stderr
    );
    assert!(out.stderr.contains("paged too"), "{}", out.stderr);
    let _ = std::fs::remove_dir_all(dir);
}

/// `rmem run --local 16M -- /usr/bin/python3 -c SCRIPT`, statistics in `dir`, bounded.
fn python_at_16m(dir: &Path, script: &str, limit: Duration) -> Output {
    run_bounded(
        &mut rmem_run(
            &["--local", "16M"],
            &dir.join("stats.json"),
            &["/usr/bin/python3", "-c", script],
            false,
        ),
        limit,
    )
}

/// A program whose memory is all small allocations is not bounded by --local; the summary
/// says so, with its peak resident set, instead of leaving the user to find out.
#[test]
fn a_program_rmem_could_not_bound_is_told_so() {
    let dir = scratch("unpaged");
    // 160 MiB in 1000-byte objects (malloc'd by CPython one by one, under --min-alloc).
    let script = "x = [bytearray(1000) for _ in range(160_000)]; print(len(x))";
    let out = python_at_16m(&dir, script, Duration::from_secs(120));
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "160000");
    assert!(
        out.stderr.contains("peak resident set was")
            && out.stderr.contains("against --local 16 MiB")
            && out.stderr.contains("--anon-mmap"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A program that pages (64 MiB at 16 MiB local) and ends without running its exit handlers,
/// where the runtime writes its statistics, is not said to have paged nothing: killed by a
/// signal, rmem names the signal; ended with `_exit` (Python's `os._exit`), rmem says so.
/// Before, both were told "nothing was paged: it made no allocation".
#[test]
fn a_program_ending_without_exit_handlers_is_not_said_to_have_paged_nothing() {
    let dir = scratch("no-exit-handlers");
    let cases = [
        (
            "import signal\nos.kill(os.getpid(), signal.SIGTERM)",
            false,
            "no statistics: /usr/bin/python3 was ended by signal 15",
        ),
        (
            "os._exit(0)",
            true,
            "no statistics: /usr/bin/python3 ended without running its exit handlers",
        ),
    ];
    for (end, success, said) in cases {
        let script =
            format!("import os\nb = bytearray(64 << 20)\nb[::4096] = b'x' * (16 << 10)\n{end}");
        let out = python_at_16m(&dir, &script, Duration::from_secs(60));
        assert_eq!(out.status.success(), success, "{}", out.stderr);
        assert!(out.stderr.contains(said), "{}", out.stderr);
        assert!(!out.stderr.contains("nothing was paged"), "{}", out.stderr);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A budget or page size out of range is named by the option the user typed, not by the
/// environment variable `rmem run` passes it on in.
#[test]
fn a_bad_budget_or_page_size_names_the_option() {
    for (opts, said) in [
        (
            ["--local", "64K"],
            "--local 64 KiB: must hold at least 4 pages",
        ),
        (
            ["--page-size", "3K"],
            "--page-size 3 KiB: must be a power of two",
        ),
    ] {
        let out = run_bounded(
            Command::new(rmem())
                .arg("run")
                .args(opts)
                .args(["--", "/bin/true"]),
            Duration::from_secs(30),
        );
        assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
        assert!(
            out.stderr.contains(said) && !out.stderr.contains("RMEM_"),
            "{}",
            out.stderr
        );
    }
}

/// A budget above the memory the node has left is said before the program runs: the kernel
/// would swap or kill the program before rmem paged anything. A budget under it is not.
#[test]
fn a_budget_above_the_node_s_free_memory_is_warned_of() {
    if !available_below(
        900 << 30,
        "a_budget_above_the_node_s_free_memory_is_warned_of",
    ) {
        return;
    }
    let dir = scratch("budget-warning");
    let stats = dir.join("stats.json");
    for (local, warned) in [("900G", true), ("16M", false)] {
        let out = run_bounded(
            &mut rmem_run(&["--local", local], &stats, &["/bin/true"], false),
            Duration::from_secs(60),
        );
        assert!(out.status.success(), "{}", out.stderr);
        assert_eq!(
            out.stderr
                .contains("is more than the memory left to this program"),
            warned,
            "--local {local}: {}",
            out.stderr
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

const NUMPY_SCRIPT: &str = include_str!("../../../tests/py/numpy_io.py");

#[test]
fn numpy_as_nobody_matches_a_plain_run() {
    let py = Path::new("/usr/bin/python3");
    let has_numpy = Command::new(py)
        .args(["-c", "import numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        has_numpy,
        "/usr/bin/python3 lacks numpy: scripts/deps.sh installs python3-numpy"
    );
    let dir = scratch("numpy");
    let script = dir.join("np.py");
    std::fs::write(&script, NUMPY_SCRIPT).unwrap();
    let mib = "64";
    let plain = run_bounded(
        Command::new(py)
            .arg(&script)
            .arg(mib)
            .arg(dir.join("plain.bin"))
            .env("OPENBLAS_NUM_THREADS", "2"),
        Duration::from_secs(120),
    );
    assert!(plain.status.success(), "{}", plain.stderr);
    let stats = dir.join("stats.json");
    // Footprint: a, b and the file's page cache aside, about 2 x 64 MiB; 32 MiB is a quarter.
    let mut cmd = rmem_run(
        &["--local", "32M"],
        &stats,
        &[
            py.to_str().unwrap(),
            script.to_str().unwrap(),
            mib,
            dir.join("rmem.bin").to_str().unwrap(),
        ],
        true,
    );
    cmd.env("OPENBLAS_NUM_THREADS", "2")
        .env("RMEM_VERBOSE", "1");
    let out = run_bounded(&mut cmd, Duration::from_secs(240));
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.stdout, plain.stdout);
    if is_root() {
        assert!(
            out.stderr.contains("user-mode-only"),
            "nobody must run user-mode-only: {}",
            out.stderr
        );
    }
    swapped(&stats);
    let _ = std::fs::remove_dir_all(dir);
}

const SMALL_ALLOCS_SCRIPT: &str = include_str!("../../../tests/py/small_allocs.py");

#[test]
fn many_small_allocations_with_min_alloc_zero() {
    let dir = scratch("small");
    let script = dir.join("small.py");
    std::fs::write(&script, SMALL_ALLOCS_SCRIPT).unwrap();
    let n = "100000";
    // PYTHONMALLOC=malloc: CPython's small-object arenas otherwise come from mmap, not malloc.
    let plain = run_bounded(
        Command::new("/usr/bin/python3")
            .arg(&script)
            .arg(n)
            .env("PYTHONMALLOC", "malloc"),
        Duration::from_secs(60),
    );
    assert!(plain.status.success(), "{}", plain.stderr);
    let stats = dir.join("stats.json");
    let mut cmd = rmem_run(
        &["--local", "16M", "--page-size", "4K", "--min-alloc", "0"],
        &stats,
        &["/usr/bin/python3", script.to_str().unwrap(), n],
        false,
    );
    cmd.env("PYTHONMALLOC", "malloc");
    let out = run_bounded(&mut cmd, Duration::from_secs(240));
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout, plain.stdout);
    let v = swapped(&stats);
    assert!(v["local_bytes_max"].as_u64().unwrap() <= 16 << 20);
    let _ = std::fs::remove_dir_all(dir);
}

/// `--anon-mmap`: private anonymous mappings go remote and keep their meaning (munmap of a
/// part, mremap, MADV_DONTNEED, mprotect), and a managed runtime's heap (a PROT_NONE
/// reservation committed with mmap(MAP_FIXED) and mprotect, a file placed in it), while shared
/// mappings stay the kernel's; without it the same program is not paged at all. Also as
/// `nobody`.
#[test]
fn anonymous_mappings_go_remote_with_anon_mmap() {
    let dir = scratch("anon-mmap");
    let prog = build_plain("tests/c/anon_mmap.c");
    let exe = prog.to_str().unwrap();
    let plain = run_bounded(Command::new(exe).arg("48"), Duration::from_secs(60));
    assert!(plain.status.success(), "{}", plain.stderr);
    assert!(
        plain.stdout.starts_with("anon_mmap ok "),
        "{}",
        plain.stdout
    );
    for as_nobody in [false, true] {
        let stats = dir.join(format!("stats-{as_nobody}.json"));
        let out = run_bounded(
            &mut rmem_run(
                &["--local", "8M", "--page-size", "64K", "--anon-mmap"],
                &stats,
                &[exe, "48"],
                as_nobody,
            ),
            Duration::from_secs(120),
        );
        assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
        assert_eq!(out.stdout, plain.stdout);
        let v = swapped(&stats);
        assert!(v["local_bytes_max"].as_u64().unwrap() <= 8 << 20, "{v}");
    }
    // Without the option the mappings are the kernel's: nothing is paged.
    let stats = dir.join("stats-off.json");
    let out = run_bounded(
        &mut rmem_run(&["--local", "8M"], &stats, &[exe, "48"], false),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout, plain.stdout);
    assert_eq!(read_json(&stats)["swap_ins"], 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// A reservation larger than the servers' capacity is address space, not memory, and stays the
/// kernel's (ZGC's views need that); what the program makes accessible in it is then not
/// paged, and the summary says so by the reservation's size rather than blaming shared or
/// file mappings (GHC's 1 TiB heap under --anon-mmap was so reported).
#[test]
fn a_reservation_beyond_the_capacity_left_to_the_kernel_is_named() {
    let dir = scratch("big-reservation");
    let prog = build_plain("tests/c/big_reservation.c");
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(
            &["--local", "16M", "--server-capacity", "64M", "--anon-mmap"],
            &stats,
            &[prog.to_str().unwrap(), "1", "200"],
            false,
        ),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success() && out.stdout == "big_reservation ok\n",
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "memory it made accessible in the reservation of address space (1 GiB) larger \
             than the servers' capacity, which rmem left to the kernel"
        ),
        "{}",
        out.stderr
    );
    let v = read_json(&stats);
    assert_eq!(v["reservations_to_kernel"], 1, "{v}");
    assert_eq!(v["reservation_bytes_to_kernel"], 1u64 << 30, "{v}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A MAP_SHARED mapping placed with MAP_FIXED over remote memory is refused (EINVAL, said on
/// stderr) and the memory under it keeps its data through paging: the kernel would replace part
/// of the pager's mapping, and the program was stopped at the next eviction there.
#[test]
fn a_shared_mapping_fixed_over_remote_memory_is_refused() {
    let dir = scratch("shared-fixed");
    let prog = build_plain("tests/c/anon_mmap.c");
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(
            &["--local", "8M", "--anon-mmap"],
            &stats,
            &[prog.to_str().unwrap(), "32", "shared-fixed"],
            false,
        ),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.stdout.trim(), "shared-fixed refused errno 22");
    assert!(out.stderr.contains("refused with EINVAL"), "{}", out.stderr);
    swapped(&stats);
    let _ = std::fs::remove_dir_all(dir);
}

/// A program for a managed runtime's heap: arrays filled and summed twice, then a hash map of
/// small objects looked up at random.
const JAVA_HEAP: &str = r#"import java.util.*;
public class Heap {
  public static void main(String[] a) {
    int n = Integer.parseInt(a[0]);
    long[][] arrs = new long[n][];
    Random r = new Random(42);
    for (int i = 0; i < n; i++) {
      arrs[i] = new long[1 << 19];
      for (int j = 0; j < arrs[i].length; j++) arrs[i][j] = r.nextLong();
    }
    long s = 0;
    for (int k = 0; k < 2; k++) for (long[] x : arrs) for (long v : x) s += v;
    HashMap<Integer, String> m = new HashMap<>();
    for (int i = 0; i < 200000; i++) m.put(i, "v" + i);
    long h = 0;
    for (int i = 0; i < 200000; i++) h += m.get(r.nextInt(200000)).length();
    System.out.println("heap ok " + s + " " + h);
  }
}
"#;

/// The same for Node.js (V8).
const NODE_HEAP: &str = r#"const n = +process.argv[2];
let seed = 42;
const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648);
const arrs = [];
for (let i = 0; i < n; i++) {
  const a = new Float64Array(1 << 19);
  for (let j = 0; j < a.length; j++) a[j] = rnd();
  arrs.push(a);
}
let s = 0;
for (let k = 0; k < 2; k++) for (const a of arrs) for (let j = 0; j < a.length; j++) s += a[j];
const m = new Map();
for (let i = 0; i < 300000; i++) m.set(i, { v: 'x' + i });
let h = 0;
for (let i = 0; i < 300000; i++) h += m.get(rnd() % 300000).v.length;
console.log('heap ok', s, h);
"#;

/// Managed runtimes reserve their heaps inaccessible (PROT_NONE, at an address hint) and make
/// them usable with mmap(MAP_FIXED) or mprotect, place files and JIT-compiled code in the
/// reservations, and run that code while rmem pages it: with `--anon-mmap` the JVM's and V8's
/// heaps are paged (the program's resident set stays near the budget, so rmem does not say
/// that most of it was not its to page), as root and as `nobody`, with the plain run's output.
/// Before, a JVM was not paged at all, and Node.js died at start with `--anon-mmap`. With ZGC
/// (shared memory) the JVM runs unpaged, and rmem says why.
#[test]
fn java_and_node_heaps_are_paged_with_anon_mmap() {
    require("/usr/bin/javac", "default-jdk-headless");
    require("/usr/bin/node", "nodejs");
    let dir = scratch("managed");
    std::fs::write(dir.join("Heap.java"), JAVA_HEAP).unwrap();
    std::fs::write(dir.join("heap.js"), NODE_HEAP).unwrap();
    let javac = run_bounded(
        Command::new("javac")
            .arg("-d")
            .arg(&dir)
            .arg(dir.join("Heap.java")),
        Duration::from_secs(120),
    );
    assert!(javac.status.success(), "{}", javac.stderr);
    let (d, js) = (dir.to_str().unwrap(), dir.join("heap.js"));
    let programs: [&[&str]; 2] = [
        &["/usr/bin/java", "-cp", d, "Heap", "24"],
        &["/usr/bin/node", js.to_str().unwrap(), "24"],
    ];
    for prog in programs {
        let plain = run_bounded(
            Command::new(prog[0]).args(&prog[1..]),
            Duration::from_secs(120),
        );
        assert!(plain.status.success(), "{prog:?}: {}", plain.stderr);
        assert!(plain.stdout.starts_with("heap ok "), "{}", plain.stdout);
        for as_nobody in [false, true] {
            let stats = dir.join(format!("stats-{as_nobody}.json"));
            let out = run_bounded(
                &mut rmem_run(&["--local", "32M", "--anon-mmap"], &stats, prog, as_nobody),
                Duration::from_secs(300),
            );
            assert!(
                out.status.success(),
                "{prog:?} as nobody {as_nobody}: {:?}\n{}\n{}",
                out.status,
                out.stdout,
                out.stderr
            );
            assert_eq!(out.stdout, plain.stdout, "{prog:?} as nobody {as_nobody}");
            assert!(!out.stderr.contains("not rmem's to page"), "{}", out.stderr);
            swapped(&stats);
        }
    }
    // ZGC reserves views of many GiB at fixed addresses (more than the servers hold: they stay
    // the kernel's) and keeps its heap in shared memory: the JVM runs, unpaged, and rmem says
    // why. Before, it freed and reserved views in the region until killed.
    let zgc = ["/usr/bin/java", "-XX:+UseZGC", "-cp", d, "Heap", "8"];
    let plain = run_bounded(
        Command::new(zgc[0]).args(&zgc[1..]),
        Duration::from_secs(120),
    );
    assert!(plain.status.success(), "{}", plain.stderr);
    let stats = dir.join("stats-zgc.json");
    let out = run_bounded(
        &mut rmem_run(&["--local", "8M", "--anon-mmap"], &stats, &zgc, false),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{:?}\n{}", out.status, out.stderr);
    assert_eq!(out.stdout, plain.stdout);
    assert!(
        out.stderr
            .contains("shared or file mappings the program makes itself")
            && out.stderr.contains("left to the kernel"),
        "{}",
        out.stderr
    );
    assert!(
        read_json(&stats)["reservations_to_kernel"]
            .as_u64()
            .unwrap()
            > 0
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The Go toolchain: on PATH, or where the Go project's archive or Debian's golang-go put it.
fn go() -> std::path::PathBuf {
    let on_path: Vec<std::path::PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("go")).collect())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(["/usr/local/go/bin/go".into(), "/usr/lib/go/bin/go".into()])
        .find(|p| p.is_file())
        .expect("the Go toolchain is missing: install golang-go (scripts/deps.sh does)")
}

/// The peak resident set a program printed on stderr ("VmHWM: N kB"), in kB.
fn vm_hwm_kb(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .unwrap_or_else(|| panic!("no VmHWM line in {stderr}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Go programs built with cgo (the C library linked, as Go programs that resolve names or call
/// C libraries are): with `--anon-mmap` Go's heap is paged (its peak resident set stays under
/// half the plain run's), as root and as `nobody`, with the plain run's output. Unprivileged,
/// such a program was killed by SIGSEGV within its first second before: Go sets each thread's
/// signal stack in its heap with a raw system call, and once that page was paged out, the next
/// signal could not be delivered (stack.rs). A statically linked program (Go's default without
/// cgo) cannot load rmem's library: `rmem run` says so at the start and at the end.
#[test]
fn go_programs_built_with_cgo_are_paged_with_anon_mmap() {
    let dir = scratch("go");
    let bin = dir.join("heap");
    let build = run_bounded(
        Command::new(go())
            .arg("build")
            .arg("-o")
            .arg(&bin)
            .arg(repo_root().join("tests/go/heap.go"))
            .env("CGO_ENABLED", "1")
            .env("GOTOOLCHAIN", "local")
            .env("GOCACHE", target_dir().join("go-cache"))
            .env("GOPATH", target_dir().join("go-path")),
        Duration::from_secs(300),
    );
    assert!(build.status.success(), "go build: {}", build.stderr);
    let prog = [bin.to_str().unwrap(), "16"];
    let plain = run_bounded(
        Command::new(prog[0]).args(&prog[1..]),
        Duration::from_secs(120),
    );
    assert!(plain.status.success(), "{}", plain.stderr);
    assert_eq!(plain.stdout.lines().count(), 4, "{}", plain.stdout);
    let plain_kb = vm_hwm_kb(&plain.stderr);
    for as_nobody in [false, true] {
        let stats = dir.join(format!("stats-{as_nobody}.json"));
        let out = run_bounded(
            &mut rmem_run(&["--local", "32M", "--anon-mmap"], &stats, &prog, as_nobody),
            Duration::from_secs(300),
        );
        assert!(
            out.status.success(),
            "as nobody {as_nobody}: {:?}\n{}",
            out.status,
            out.stderr
        );
        assert_eq!(out.stdout, plain.stdout, "as nobody {as_nobody}");
        let kb = vm_hwm_kb(&out.stderr);
        assert!(
            kb < plain_kb / 2,
            "as nobody {as_nobody}: peak {kb} kB against {plain_kb} kB plain: not paged\n{}",
            out.stderr
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn statically_linked_programs_are_named_as_unpaged() {
    let prog = compile("tests/c/signals.c", "static-", &["-static".into()]);
    let dir = scratch("static");
    let out = run_bounded(
        &mut rmem_run(
            &["--local", "4M"],
            &dir.join("stats.json"),
            &[prog.to_str().unwrap(), "raw-altstack"],
            false,
        ),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success() && out.stdout.contains("signals: ok"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("is statically linked: rmem's library cannot be loaded into it")
            && out.stderr.contains("nothing was paged: ")
            && !out.stderr.contains("made no allocation"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Threads that take a signal stack as Go's runtime does (tests/c/signals.c "raw-altstack":
/// with every signal blocked, the one they have, or else one from mmap set by a raw system
/// call) take signals on it while paging through more than the budget, as `nobody` with
/// `--anon-mmap` (where that mmap is remote). Before, the first signal killed the thread.
#[test]
fn signal_stacks_set_by_raw_system_calls_survive_paging() {
    let prog = build_plain("tests/c/signals.c");
    let dir = scratch("sig-raw-altstack");
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(
            &["--local", "4M", "--anon-mmap"],
            &stats,
            &[prog.to_str().unwrap(), "raw-altstack"],
            true,
        ),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success() && out.stdout.contains("signals: ok"),
        "{:?}\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    swapped(&stats);
    let _ = std::fs::remove_dir_all(dir);
}

/// CPython's object arenas are 1 MiB anonymous mappings: with `--anon-mmap` a dict of many
/// small objects is paged at the default `--min-alloc`, with the plain run's output.
#[test]
fn cpython_arenas_are_paged_with_anon_mmap() {
    let dir = scratch("arenas");
    let script = dir.join("small.py");
    std::fs::write(&script, SMALL_ALLOCS_SCRIPT).unwrap();
    let n = "100000";
    let plain = run_bounded(
        Command::new("/usr/bin/python3").arg(&script).arg(n),
        Duration::from_secs(60),
    );
    assert!(plain.status.success(), "{}", plain.stderr);
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(
            &["--local", "8M", "--anon-mmap"],
            &stats,
            &["/usr/bin/python3", script.to_str().unwrap(), n],
            false,
        ),
        Duration::from_secs(240),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout, plain.stdout);
    swapped(&stats);
    let _ = std::fs::remove_dir_all(dir);
}

/// A sort-like program: `malloc` of 16 GiB, of which it touches `touch_mib` MiB, then reads
/// them back. Prints `null`, or `ok` and the address.
fn reserve_and_touch(opts: &[&str], stats: &Path, touch_mib: u64) -> Output {
    let script = format!(
        "import ctypes\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         libc.malloc.restype = ctypes.c_void_p\n\
         libc.malloc.argtypes = [ctypes.c_size_t]\n\
         p = libc.malloc(16 << 30)\n\
         if not p:\n    print('null', ctypes.get_errno()); raise SystemExit(0)\n\
         n = {touch_mib} << 20\n\
         ctypes.memset(p, 0x5a, n)\n\
         assert ctypes.string_at(p, n) == b'\\x5a' * n\n\
         print('ok', hex(p))\n"
    );
    run_bounded(
        &mut rmem_run(opts, stats, &["/usr/bin/python3", "-c", &script], false),
        Duration::from_secs(60),
    )
}

#[test]
fn a_16g_reservation_touching_a_few_mib_goes_remote_on_small_servers() {
    let dir = scratch("overcommit");
    let stats = dir.join("stats.json");
    // Two servers of 16 MiB: the reservation takes no capacity, the 8 MiB written do.
    let out = reserve_and_touch(&["--local", "4M", "--server-capacity", "16M"], &stats, 8);
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.starts_with("ok 0x"), "{}", out.stdout);
    assert!(!out.stderr.contains("local memory"), "{}", out.stderr);
    let v = swapped(&stats);
    assert!(v["bytes_written_back"].as_u64().unwrap() >= 4 << 20, "{v}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn without_overcommit_malloc_beyond_the_capacity_returns_null() {
    let dir = scratch("no-overcommit");
    let stats = dir.join("stats.json");
    let out = reserve_and_touch(
        &[
            "--local",
            "4M",
            "--server-capacity",
            "16M",
            "--no-overcommit",
        ],
        &stats,
        8,
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.stdout.trim(), format!("null {}", libc::ENOMEM));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn every_server_full_stops_the_program_naming_the_servers() {
    let dir = scratch("all-full");
    let stats = dir.join("stats.json");
    // 32 MiB written to two servers of 4 MiB.
    let out = reserve_and_touch(&["--local", "4M", "--server-capacity", "4M"], &stats, 32);
    assert_eq!(
        out.status.code(),
        Some(69),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    let err = &out.stderr;
    assert!(err.contains("every memory server is full"), "{err}");
    assert_eq!(
        err.matches(" full: capacity 4194304 bytes").count(),
        2,
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A Debian package a test needs; the test fails (never skips) without it.
fn require(path: &str, package: &str) {
    assert!(
        Path::new(path).exists(),
        "{path} is missing: install {package} (scripts/deps.sh does)"
    );
}

#[test]
fn programs_linked_with_jemalloc_or_tcmalloc_use_one_allocator() {
    require("/usr/include/jemalloc/jemalloc.h", "libjemalloc-dev");
    require(
        "/usr/include/gperftools/tcmalloc.h",
        "libgoogle-perftools-dev",
    );
    let je = compile("tests/c/jemalloc_mix.c", "je-", &["-ljemalloc".into()]);
    let tc = compile(
        "tests/c/jemalloc_mix.c",
        "tc-",
        &["-DNO_MALLOCX".into(), "-ltcmalloc".into()],
    );
    for (name, prog) in [("jemalloc", je), ("tcmalloc", tc)] {
        let dir = scratch(&format!("{name}-mix"));
        let stats = dir.join("stats.json");
        let out = run_bounded(
            &mut rmem_run(&["--local", "4M"], &stats, &[prog.to_str().unwrap()], false),
            Duration::from_secs(120),
        );
        assert!(
            out.status.success() && out.stdout.contains("jemalloc: ok"),
            "{name}: {:?}\n{}\n{}",
            out.status,
            out.stdout,
            out.stderr
        );
        swapped(&stats);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A free TCP port on loopback (the kernel's pick, released at once).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Run redis-cli against `port` with `args` (and `input` on stdin); its stdout, or None if it
/// failed (no server there yet).
fn try_redis_cli(port: u16, args: &[&str], input: Option<&[u8]>) -> Option<String> {
    use std::io::Write;
    use std::process::Stdio;
    let mut c = Command::new("redis-cli");
    c.args(["-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c
        .spawn()
        .expect("redis-cli (redis-tools) must be installed");
    let mut stdin = child.stdin.take().unwrap();
    if let Some(i) = input {
        stdin.write_all(i).unwrap();
    }
    drop(stdin);
    let out = wait_bounded(child, Duration::from_secs(30), "redis-cli");
    out.status.success().then_some(out.stdout)
}

fn redis_cli(port: u16, args: &[&str], input: Option<&[u8]>) -> String {
    try_redis_cli(port, args, input).unwrap_or_else(|| panic!("redis-cli {args:?} failed"))
}

/// A child process killed if the test fails before it was waited for.
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn redis_server_stores_and_returns_keys() {
    require("/usr/bin/redis-server", "redis-server");
    require("/usr/bin/redis-cli", "redis-tools");
    let dir = scratch("redis");
    let stats = dir.join("stats.json");
    let port = free_port();
    let mut cmd = rmem_run(
        &["--local", "4M"],
        &stats,
        &[
            "/usr/bin/redis-server",
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            dir.to_str().unwrap(),
        ],
        false,
    );
    let mut server = KillOnDrop(Some(
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let t = std::time::Instant::now();
    while try_redis_cli(port, &["ping"], None).is_none_or(|r| r.trim() != "PONG") {
        if let Some(status) = server.0.as_mut().unwrap().try_wait().unwrap() {
            let out = wait_bounded(server.0.take().unwrap(), Duration::from_secs(5), "redis");
            panic!(
                "redis-server under rmem run ended: {status:?}\n{}",
                out.stderr
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "redis-server did not answer in 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // 40 values of 300 KB: above --min-alloc, so remote, and 12 MB against a 4 MiB budget.
    let value = |i: usize| format!("{i:04}").repeat(75_000);
    for i in 0..40 {
        let v = value(i);
        redis_cli(port, &["-x", "set", &format!("k{i}")], Some(v.as_bytes()));
    }
    for i in 0..40 {
        let got = redis_cli(port, &["get", &format!("k{i}")], None);
        assert!(got.trim_end() == value(i), "key k{i} came back wrong");
    }
    redis_cli(port, &["shutdown", "nosave"], None);
    let out = wait_bounded(
        server.0.take().unwrap(),
        Duration::from_secs(30),
        "redis-server under rmem run",
    );
    assert!(out.status.success(), "{:?}\n{}", out.status, out.stderr);
    swapped(&stats);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn large_alignments_are_served_remote() {
    let prog = build_plain("tests/c/aligned_big.c");
    let dir = scratch("aligned");
    let stats = dir.join("stats.json");
    // 15 blocks of 128 KiB to 2 MiB (about 12 MiB) against a 4 MiB budget: paging shows in
    // the statistics only if they are remote.
    let out = run_bounded(
        &mut rmem_run(&["--local", "4M"], &stats, &[prog.to_str().unwrap()], false),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success() && out.stdout.contains("aligned: ok"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    swapped(&stats);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn raw_fork_children_that_reset_sigsegv_get_rmems_error() {
    let prog = build_plain("tests/c/signals.c");
    let dir = scratch("sig-fork");
    let stats = dir.join("stats.json");
    let out = run_bounded(
        &mut rmem_run(
            &["--local", "4M"],
            &stats,
            &[prog.to_str().unwrap(), "fork"],
            true,
        ),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success()
            && out.stdout.contains("children: 70 70 70")
            && out.stdout.contains("signals: ok"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(
        out.stderr
            .matches("child without rmem touched its parent's remote memory")
            .count(),
        3,
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn program_signal_handlers_coexist_with_rmem() {
    let prog = build_plain("tests/c/signals.c");
    for delivery in ["wait", "signal"] {
        let dir = scratch(&format!("sig-handlers-{delivery}"));
        let stats = dir.join("stats.json");
        let mut cmd = rmem_run(
            &["--local", "4M"],
            &stats,
            &[prog.to_str().unwrap(), "handlers"],
            true,
        );
        cmd.env("RMEM_FAULT_DELIVERY", delivery);
        let out = run_bounded(&mut cmd, Duration::from_secs(120));
        assert!(
            out.status.success() && out.stdout.contains("signals: ok"),
            "faults by {delivery}: {:?}\n{}\n{}",
            out.status,
            out.stdout,
            out.stderr
        );
        swapped(&stats);
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn stress_ng_malloc_workers_with_min_alloc_zero() {
    require("/usr/bin/stress-ng", "stress-ng");
    let dir = scratch("stress-ng");
    let stats = dir.join("stats.json");
    let mut cmd = rmem_run(
        &["--local", "16M", "--min-alloc", "0"],
        &stats,
        &[
            "/usr/bin/stress-ng",
            "--malloc",
            "2",
            "--malloc-ops",
            "200",
            "--timeout",
            "5s",
            "--temp-path",
            dir.to_str().unwrap(),
            "-v",
        ],
        true,
    );
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    // The workers are fork() children that allocate, write and free remote memory of their
    // own over their parent's: each runs to its end.
    let all = format!("{}\n{}", out.stdout, out.stderr);
    assert!(
        out.status.success() && !all.contains("terminated on signal"),
        "{all}"
    );
    assert!(
        !all.contains("exit status=70") && !all.contains("touched its parent's"),
        "{all}"
    );
    assert!(all.contains("successful run completed"), "{all}");
    let _ = std::fs::remove_dir_all(dir);
}
