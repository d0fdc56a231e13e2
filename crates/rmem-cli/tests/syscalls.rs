//! Unprivileged, every system call that takes a buffer works on remote memory that is not
//! resident, whoever makes it: C library functions rmem does not wrap, glibc's own calls
//! (stdio into a setvbuf buffer, posix_spawn's exec), raw syscall(2) and Python. (sys.rs: a
//! seccomp filter traps the calls with a pointer into the region; io_uring is refused.)

mod common;
use common::*;
use std::time::Duration;

/// `rmem run` as `nobody` when root, user-mode-only userfaultfd either way; FIFO replacement
/// so that the programs' churning reliably evicts the buffers they check.
fn run_unprivileged(name: &str, program: &[&str]) -> Output {
    let dir = scratch(name);
    let stats = dir.join("stats.json");
    let mut c = rmem_run(
        &["--local", "4M", "--policy", "fifo"],
        &stats,
        program,
        true,
    );
    c.env("RMEM_UFFD_USER_MODE_ONLY", "1");
    let out = run_bounded(&mut c, Duration::from_secs(180));
    let _ = std::fs::remove_dir_all(dir);
    out
}

#[test]
fn system_calls_on_evicted_remote_buffers_work_unprivileged() {
    if !is_root() {
        eprintln!(
            "note: not root: runs as the current user (CI runs this as root, then as nobody)"
        );
    }
    let prog = build_plain("tests/c/syscalls.c");
    let out = run_unprivileged("syscalls", &[prog.to_str().unwrap(), "unprivileged"]);
    assert!(
        out.status.success()
            && out.stdout.contains("syscalls: ok")
            && out.stdout.matches("syscalls: exec ok").count() == 2,
        "{:?}\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    assert!(
        out.stderr.contains("io_uring refused (ENOSYS)"),
        "{}",
        out.stderr
    );
}

#[test]
fn python_urandom_and_file_reads_into_remote_memory_unprivileged() {
    // os.urandom allocates its result (remote at this size) and fills it with getrandom, which
    // rmem does not wrap; readinto goes through read; hashing checks the data.
    let script = r#"
import hashlib, os, tempfile
b = os.urandom(8 << 20)
assert len(b) == 8 << 20 and b.count(0) < (8 << 20) // 100, "urandom"
ballast = [bytearray(os.urandom(1 << 20)) for _ in range(16)]
d = tempfile.mkdtemp()
p = os.path.join(d, "blob")
with open(p, "wb") as f:
    f.write(b)
buf = bytearray(8 << 20)
with open(p, "rb", buffering=0) as f:
    assert f.readinto(buf) == 8 << 20
assert hashlib.sha256(buf).digest() == hashlib.sha256(b).digest(), "read back"
os.unlink(p); os.rmdir(d)
print("python syscalls: ok")
"#;
    let out = run_unprivileged("py-syscalls", &["/usr/bin/python3", "-c", script]);
    assert!(
        out.status.success() && out.stdout.contains("python syscalls: ok"),
        "{:?}\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
}

#[test]
fn the_syscall_bench_runs_at_a_tiny_size() {
    let dir = scratch("bench-syscalls");
    let json = dir.join("sys.json");
    let mut c = if is_root() {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(rmem());
        c
    } else {
        std::process::Command::new(rmem())
    };
    c.args(["bench", "syscalls", "--calls", "2000", "--json"])
        .arg(&json);
    let out = run_bounded(&mut c, Duration::from_secs(120));
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let v = read_json(&json);
    let rows = v["results"].as_array().expect("results");
    assert_eq!(rows.len(), 6, "{v}");
    for r in rows {
        let t = r["trap_ratio"].as_f64().unwrap_or(f64::NAN);
        assert!(t.is_finite() && t > 0.0, "{r}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
