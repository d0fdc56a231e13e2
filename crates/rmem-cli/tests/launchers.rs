//! `rmem run --hostfile` with each launcher that needs no second host: local processes for
//! this host, a fake `srun` (first in PATH) that runs the server here and records its
//! arguments, and `--launcher none` with servers started by hand. The real ssh path, across
//! network namespaces, is in multihost.rs.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A directory with fake `srun` and `ssh` scripts that log their arguments to `log`.
fn fake_bin(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // srun: log, drop srun's own options (and -w's value), run the rest here.
    let srun = "#!/bin/sh\necho \"srun $*\" >> \"$FAKE_LOG\"\n\
                while [ $# -gt 0 ]; do case \"$1\" in -w) shift 2;; -*) shift;; *) break;; esac; done\n\
                exec \"$@\"\n";
    let ssh = "#!/bin/sh\necho \"ssh $*\" >> \"$FAKE_LOG\"\necho 'fake ssh: not expected' >&2\nexit 255\n";
    for (name, text) in [("srun", srun), ("ssh", ssh)] {
        let p = bin.join(name);
        std::fs::write(&p, text).unwrap();
        Command::new("chmod").arg("755").arg(&p).status().unwrap();
    }
    bin
}

/// `rmem run ARGS -- stress 2 REGION_MIB 3000` with PATH starting at the fake binaries.
fn run_stress(dir: &Path, args: &[&str], region_mib: u32, env: &[(&str, &str)]) -> Output {
    let prog = build_c("tests/c/stress.c");
    let path = format!(
        "{}:{}",
        fake_bin(dir).display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(rmem());
    cmd.arg("run")
        .arg("--api")
        .args(args)
        .args(["--page-size", "64K", "--stats-json"])
        .arg(dir.join("stats.json"))
        .arg("--")
        .arg(&prog)
        .args(["2", &region_mib.to_string(), "3000"])
        .env("PATH", path)
        .env("FAKE_LOG", dir.join("fake.log"))
        .envs(env.iter().copied());
    run_bounded(&mut cmd, Duration::from_secs(60))
}

fn assert_stress_ok(out: &Output, dir: &Path) {
    assert!(
        out.status.success() && out.stdout.contains("stress: ok"),
        "{:?}\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    let v = read_json(&dir.join("stats.json"));
    assert!(v["swap_outs"].as_u64().unwrap() > 0, "{v}");
    assert!(v["swap_ins"].as_u64().unwrap() > 0, "{v}");
}

fn fake_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("fake.log")).unwrap_or_default()
}

#[test]
fn hostfile_with_this_host_starts_local_servers_and_sets_the_budget() {
    let dir = scratch("hostfile-local");
    let hosts = dir.join("hosts");
    std::fs::write(
        &hosts,
        "# local budget 2M: well below the 16 MiB footprint\n\
         localhost 2M\n\
         localhost 8M   # fills first\n\
         127.0.0.1 64M\n",
    )
    .unwrap();
    let out = run_stress(&dir, &["--hostfile", hosts.to_str().unwrap()], 16, &[]);
    assert_stress_ok(&out, &dir);
    let v = read_json(&dir.join("stats.json"));
    assert!(
        v["local_bytes_max"].as_u64().unwrap() <= 2 << 20,
        "the hosts file's budget was not used: {v}"
    );
    assert_eq!(fake_log(&dir), "", "this host must not go through ssh");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn slurm_launcher_runs_srun_per_hosts_file_line() {
    let dir = scratch("slurm-hostfile");
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, "calhost 2M\n127.0.0.1 8M\n127.0.0.2 64M\n").unwrap();
    let out = run_stress(
        &dir,
        &["--launcher", "slurm", "--hostfile", hosts.to_str().unwrap()],
        16,
        &[],
    );
    assert_stress_ok(&out, &dir);
    let log = fake_log(&dir);
    // Servers start at once, so the log is in any order.
    let mut lines: Vec<&str> = log.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{log}");
    for (line, host, cap) in [
        (lines[0], "127.0.0.1", 8 << 20),
        (lines[1], "127.0.0.2", 64 << 20),
    ] {
        let want = format!(
            "srun --nodes=1 --ntasks=1 -w {host} {} server --listen 0.0.0.0:0 --capacity {cap} --token-stdin",
            rmem().display()
        );
        assert_eq!(line, want);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn slurm_launcher_uses_the_allocation_node_list() {
    let dir = scratch("slurm-nodelist");
    // 127.0.0.0/8 is all loopback: three "nodes" that reach this host.
    let env = [("SLURM_JOB_NODELIST", "127.0.0.[2-3],127.0.0.4")];
    let out = run_stress(
        &dir,
        &[
            "--launcher",
            "slurm",
            "--servers",
            "2",
            "--server-capacity",
            "32M",
            "--srun-opts",
            "--overlap",
            "--local",
            "2M",
        ],
        16,
        &env,
    );
    assert_stress_ok(&out, &dir);
    let log = fake_log(&dir);
    let mut hosts: Vec<&str> = log
        .lines()
        .map(|l| l.split_whitespace().nth(4).unwrap_or(""))
        .collect();
    hosts.sort();
    assert_eq!(hosts, ["127.0.0.2", "127.0.0.3"], "{log}");
    assert!(log.lines().all(|l| l.contains(" --overlap ")), "{log}");

    // Without an allocation: a clear error, nothing started.
    let out = run_stress(&dir, &["--launcher", "slurm"], 16, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("SLURM_JOB_NODELIST"), "{}", out.stderr);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn none_launcher_connects_to_running_servers() {
    let dir = scratch("none");
    let token = "secret-for-the-none-launcher-test";
    let mut a = ServerProcess::start(token, &["--capacity", "8M"]);
    let mut b = ServerProcess::start(token, &["--capacity", "64M"]);
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, format!("me 2M\n{} 8M\n{} 64M\n", a.addr, b.addr)).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let args = ["--launcher", "none", "--hostfile", hosts.to_str().unwrap()];
    let out = run_stress(
        &dir,
        &args,
        16,
        &[("RMEM_TOKEN_FILE", token_file.to_str().unwrap())],
    );
    assert_stress_ok(&out, &dir);
    // Servers started by hand outlive the run.
    assert!(a.child.try_wait().unwrap().is_none() && b.child.try_wait().unwrap().is_none());

    // No token: a clear error. A line without a port: named with its line number.
    let out = run_stress(&dir, &args, 16, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("RMEM_TOKEN"), "{}", out.stderr);
    std::fs::write(&hosts, format!("me 2M\n{} 8M\nlocalhost 64M\n", a.addr)).unwrap();
    let out = run_stress(&dir, &args, 16, &[("RMEM_TOKEN", token)]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "{}:3: localhost: --launcher none",
            hosts.display()
        )),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_hosts_files_and_options_are_refused_with_the_place() {
    let dir = scratch("hostfile-bad");
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, "calhost 1G\n# servers\nmemhost1 16Q\n").unwrap();
    let h = hosts.to_str().unwrap();
    for (args, needle) in [
        (vec!["--hostfile", h], format!("{h}:3: memory size")),
        (
            vec!["--hostfile", h, "--servers", "3"],
            "cannot be used with".to_string(),
        ),
        (
            vec!["--hostfile", "/nonexistent/hosts"],
            "/nonexistent/hosts: cannot read".to_string(),
        ),
        (
            vec!["--launcher", "none"],
            "--launcher none needs --hostfile".to_string(),
        ),
    ] {
        let out = run_stress(&dir, &args, 16, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(&needle), "{args:?}: {}", out.stderr);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A memory server `rmem run` started and someone stopped (SIGSTOP, a debugger, job control)
/// ends with the run: it is continued, reads its closed stdin and exits. Stopped, it ignored the
/// closed pipe and the SIGTERM, and the run ended only after twice the 2 s grace and a SIGKILL.
#[test]
fn a_stopped_server_of_its_own_ends_with_the_run() {
    let dir = scratch("stopped-server");
    let done = dir.join("done");
    let _ = std::fs::remove_file(&done);
    let child = Command::new(rmem())
        .args(["run", "--api", "--servers", "2", "--", "sh", "-c"])
        .arg(format!("sleep 2; date +%s.%N > {}", done.display()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let servers = launched_servers(child.id(), 2);
    // SAFETY: stopping a process this test started (indirectly); it is continued or killed by
    // rmem run below.
    unsafe { libc::kill(servers[0] as i32, libc::SIGSTOP) };
    let out = wait_bounded(
        child,
        Duration::from_secs(30),
        "rmem run with a stopped server",
    );
    let ended = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(out.status.success(), "{:?}\n{}", out.status, out.stderr);
    let program_ended: f64 = std::fs::read_to_string(&done)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Twice the grace (4 s) before; a few milliseconds now.
    assert!(
        ended - program_ended < 3.0,
        "rmem run ended {:.1} s after its program\n{}",
        ended - program_ended,
        out.stderr
    );
    for s in servers {
        assert!(
            !Path::new(&format!("/proc/{s}")).exists(),
            "server {s} left running"
        );
    }
}

/// A `--stats-json` that cannot be written (no such directory) fails the run before any server
/// or the program starts; it was found only at the end, whose summary then said the program
/// had paged nothing.
#[test]
fn an_unwritable_stats_file_is_refused_before_the_program_runs() {
    let dir = scratch("stats-unwritable");
    let marker = dir.join("ran");
    let stats = dir.join("no-such-dir/stats.json");
    let out = run_bounded(
        &mut rmem_run(
            &[],
            &stats,
            &["sh", "-c", &format!("touch {}", marker.display())],
            false,
        ),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "rmem run: --stats-json {}: No such file or directory",
            stats.display()
        )),
        "{}",
        out.stderr
    );
    assert!(!marker.exists(), "the program ran: {}", out.stderr);
    let _ = std::fs::remove_dir_all(dir);
}
