//! Helpers for tests that run the real `rmem` binary, real server processes and C programs.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn rmem() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rmem"))
}

pub fn target_dir() -> PathBuf {
    rmem().parent().unwrap().to_path_buf()
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Compile `tests/c/NAME.c` (or a path under the repo) against librmem; returns the binary.
pub fn build_c(rel: &str) -> PathBuf {
    let lib = target_dir().join("librmem.so");
    assert!(
        lib.exists(),
        "{} is missing: run `cargo build --release --workspace` first",
        lib.display()
    );
    let mut args: Vec<std::ffi::OsString> = vec!["-Wall".into(), "-I".into()];
    args.push(repo_root().join("include").into());
    args.extend(["-L".into(), target_dir().into(), "-lrmem".into()]);
    args.push(format!("-Wl,-rpath,{}", target_dir().display()).into());
    compile(rel, "", &args)
}

/// Compile a C or C++ program of the repository without librmem (to run it plain, or under
/// `rmem run`, which preloads librmem).
pub fn build_plain(rel: &str) -> PathBuf {
    compile(rel, "plain-", &[])
}

/// Compile `rel` with `extra` arguments (libraries to link, defines) into
/// target/release/c-tests/PREFIX+NAME, through a private temporary name; returns the binary.
pub fn compile(rel: &str, prefix: &str, extra: &[std::ffi::OsString]) -> PathBuf {
    let src = repo_root().join(rel);
    let out_dir = target_dir().join("c-tests");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join(format!(
        "{prefix}{}",
        src.file_stem().unwrap().to_string_lossy()
    ));
    let cc = if rel.ends_with(".cpp") { "c++" } else { "cc" };
    let tmp = tmp_output(&out);
    let status = Command::new(cc)
        .args(["-O2", "-pthread"])
        .arg(&src)
        .args(extra)
        .arg("-o")
        .arg(&tmp)
        .status()
        .expect("a C/C++ compiler must be installed (scripts/deps.sh installs it)");
    assert!(status.success(), "compiling {rel} failed");
    publish(&tmp, &out);
    out
}

/// A private path to compile `out` to: tests running at once build the same programs, and one
/// must never write the file another is executing.
pub fn tmp_output(out: &Path) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    out.with_extension(format!("tmp-{}-{n}", std::process::id()))
}

/// Move a freshly compiled program into place atomically (a running copy keeps its inode).
pub fn publish(tmp: &Path, out: &Path) {
    std::fs::rename(tmp, out)
        .unwrap_or_else(|e| panic!("{} -> {}: {e}", tmp.display(), out.display()));
}

pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Wait for a child with a deadline; kill it (and fail) if it runs over.
pub fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> Output {
    let t = Instant::now();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Output {
                status,
                stdout: o.join().unwrap(),
                stderr: e.join().unwrap(),
                elapsed: t.elapsed(),
            };
        }
        if t.elapsed() > limit {
            // Where it was, before it is killed: waiting in the kernel (and on what) or
            // running, and how loaded the machine was (a hang and a starved process read
            // the same otherwise).
            let seen = where_it_is(child.id());
            // Its whole process group (run_bounded makes one): a grandchild that lives on
            // would hold the output pipes, and reading them would wait for it forever.
            // SAFETY: kill(2) of a process group this test made.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.kill();
            let _ = child.wait();
            let gone = Instant::now();
            while !e.is_finished() && gone.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let stderr = if e.is_finished() {
                e.join().unwrap()
            } else {
                "(still held open by a process outside its group)".into()
            };
            panic!("{what} ran over {limit:?} ({seen}); stderr:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each thread of process `pid` as `name state wchan`, and the load average: for the
/// message of a process that ran over its bound.
fn where_it_is(pid: u32) -> String {
    let read = |p: String| std::fs::read_to_string(p).unwrap_or_default();
    let mut threads = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten().take(16) {
            let dir = t.path().display().to_string();
            let stat = read(format!("{dir}/stat"));
            // The state follows the command name's closing parenthesis.
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').next())
                .unwrap_or("?")
                .to_string();
            let name = read(format!("{dir}/comm")).trim().to_string();
            let wchan = read(format!("{dir}/wchan"));
            threads.push(format!("{name} {state} {wchan}"));
        }
    }
    let load = read("/proc/loadavg".into());
    format!(
        "threads: {}; load average {}",
        threads.join(", "),
        load.split(' ').take(3).collect::<Vec<_>>().join(" ")
    )
}

pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_bounded(child, limit, &what)
}

/// `rmem run` with the given options around `program`, optionally as `nobody`.
pub fn rmem_run(opts: &[&str], stats: &Path, program: &[&str], as_nobody: bool) -> Command {
    let mut c = if as_nobody && is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(rmem());
        c
    } else {
        Command::new(rmem())
    };
    c.arg("run")
        .args(opts)
        .arg("--stats-json")
        .arg(stats)
        .arg("--")
        .args(program);
    c
}

/// A pseudo-random delay in [lo, hi) ms: a different moment each run.
pub fn random_ms(lo: u64, hi: u64) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    let x = nanos.wrapping_mul(6364136223846793005).rotate_left(17);
    Duration::from_millis(lo + x % (hi - lo))
}

/// Whether the verifying stress (tests/c/stress.c) said it finished with every read right.
pub fn stress_ok(stdout: &str) -> bool {
    stdout.contains("stress: ok") && stdout.contains("mismatches=0")
}

/// The pids of the `n` memory servers `rmem run` (pid `launcher`) started, once they and the
/// program are all running (bounded: panics after 20 s).
pub fn launched_servers(launcher: u32, n: usize) -> Vec<u32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let kids = std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children"))
            .unwrap_or_default();
        let servers: Vec<u32> = kids
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .filter(|p| {
                // `rmem server ...`: its first argument, not a word of a path (the program's
                // command line may name a directory called so).
                std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.split('\0').nth(1) == Some("server"))
            })
            .collect();
        let program_running = kids.split_whitespace().count() > servers.len();
        if servers.len() == n && program_running {
            return servers;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the {n} servers and the program did not start: {kids}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `FIELD: N kB` line of a /proc file of `pid` (`status`: VmRSS, VmLck; `smaps_rollup`:
/// Locked), in KiB.
pub fn proc_kib(pid: u32, file: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/{file}:\n{text}"))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A scratch directory that anyone can write (for runs as `nobody`), under this test process's
/// scratch root.
pub fn scratch(name: &str) -> PathBuf {
    let d = scratch_root().join(name);
    std::fs::create_dir_all(&d).unwrap();
    let _ = Command::new("chmod").arg("1777").arg(&d).status();
    d
}

/// The scratch root, once made (`scratch_root`).
static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Set by the panic hook `scratch_root` installs: some test (or a thread of one) panicked.
static PANICKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The one directory (`$TMPDIR/rmem-test-PID`) every scratch directory of this test process
/// lives in. It is removed when the process exits if nothing panicked; after a failure it stays
/// for the post-mortem and its path is printed. One root, removed at exit, because scratch
/// files outlive the functions that make them (shared inputs, a pool's statistics).
pub fn scratch_root() -> &'static Path {
    ROOT.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("rmem-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let _ = Command::new("chmod").arg("1777").arg(&d).status();
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, std::sync::atomic::Ordering::SeqCst);
            default(info);
        }));
        extern "C" fn at_exit() {
            let Some(d) = ROOT.get() else { return };
            if PANICKED.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = writeln!(
                    std::io::stderr(),
                    "a test failed: its scratch files are kept in {}",
                    d.display()
                );
            } else {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        // SAFETY: at_exit is an extern "C" fn with no arguments; it does not unwind (its only
        // fallible calls return Results, which it ignores).
        assert_eq!(unsafe { libc::atexit(at_exit) }, 0);
        d
    })
}

pub fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
    .unwrap()
}

/// The statistics the program's child processes wrote beside `stats` (`STATS.PID`).
pub fn children_stats(stats: &Path) -> Vec<serde_json::Value> {
    let prefix = format!("{}.", stats.file_name().unwrap().to_string_lossy());
    std::fs::read_dir(stats.parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| read_json(&e.path()))
        .collect()
}

/// A `rmem server` started by hand on loopback (`RMEM_TOKEN` = token, more `args`), its
/// address, and its stderr as it comes. Killed when dropped.
pub struct ServerProcess {
    pub child: Child,
    pub addr: String,
    log: Arc<Mutex<String>>,
}

impl ServerProcess {
    pub fn start(token: &str, args: &[&str]) -> ServerProcess {
        ServerProcess::start_in(&[], token, args)
    }

    /// `rmem server ARGS` run through `prefix` (e.g. `ip netns exec NS`).
    pub fn start_in(prefix: &[&str], token: &str, args: &[&str]) -> ServerProcess {
        let mut cmd = match prefix {
            [] => Command::new(rmem()),
            [first, rest @ ..] => {
                let mut c = Command::new(first);
                c.args(rest).arg(rmem());
                c
            }
        };
        cmd.arg("server").args(args);
        let (child, addr, log) = start_daemon(cmd, token, "rmem-server");
        ServerProcess { child, addr, log }
    }

    pub fn port(&self) -> u16 {
        self.addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// What it wrote on stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Wait up to `limit` for a log line containing `needle`; the line.
    pub fn wait_for(&self, needle: &str, limit: Duration) -> Option<String> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Some(l) = self.log().lines().find(|l| l.contains(needle)) {
                return Some(l.to_string());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tests/c/touch_forever.c` on `servers` with the runtime's environment set directly (no
/// `rmem run`): MIB of remote memory filled (16K pages, 4M local) before this returns, then
/// touched for up to SECONDS. `env` adds to or overrides the environment.
pub fn touch_forever(
    servers: &str,
    token: &str,
    mib: u32,
    seconds: u32,
    env: &[(&str, &str)],
) -> Child {
    let prog = build_c("tests/c/touch_forever.c");
    let mut child = Command::new(&prog)
        .args([mib.to_string(), seconds.to_string()])
        .env("RMEM_SERVERS", servers)
        .env("RMEM_TOKEN", token)
        .env("RMEM_LOCAL", "4M")
        .env("RMEM_PAGE_SIZE", "16K")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let line = first_line(&mut child);
    assert!(line.contains("touch_forever: filled"), "{line:?}");
    child
}

/// `rmem status SERVER --json`, parsed.
pub fn status_json(server: &str, token: &str) -> serde_json::Value {
    let out = run_bounded(
        Command::new(rmem())
            .args(["status", server, "--json"])
            .env("RMEM_TOKEN", token),
        Duration::from_secs(20),
    );
    assert!(out.status.success(), "rmem status: {}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// Start `cmd` (an rmem daemon: `rmem server`, `rmem manager`) with `RMEM_TOKEN` = token and
/// wait for its first line, `NAME listening on ADDR ...`: the child, ADDR, and its stderr as it
/// comes.
pub fn start_daemon(
    mut cmd: Command,
    token: &str,
    name: &str,
) -> (Child, String, Arc<Mutex<String>>) {
    let mut child = cmd
        .env("RMEM_TOKEN", token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut child);
    let addr = line
        .strip_prefix(&format!("{name} listening on "))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address: {line:?}"))
        .to_string();
    let log = tee_stderr(&mut child);
    (child, addr, log)
}

/// A child's (piped) stderr passed on to ours and kept, as it comes.
pub fn tee_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    let sink = log.clone();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("{l}");
            let mut s = sink.lock().unwrap();
            s.push_str(&l);
            s.push('\n');
        }
    });
    log
}

/// Whether this node has less than `bytes` available (`MemAvailable`), so that a test asking
/// for that much is over it; else says loudly that `what` is skipped.
pub fn available_below(bytes: u64, what: &str) -> bool {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no MemAvailable in {meminfo}"));
    let below = kib * 1024 < bytes;
    if !below {
        eprintln!("SKIPPED {what}: this node has {bytes} bytes or more available, more than the test asks");
    }
    below
}

/// The first line a child writes on its (piped) stdout.
pub fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line
}

#[path = "../../../../tests/rust/swap_file.rs"]
mod swap_file;
#[allow(unused_imports)] // used by some of the test crates that include this module
pub use swap_file::SwapFile;

pub mod netns;
pub mod pool;
