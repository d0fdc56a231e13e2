//! `rmem server --lock`: the server's memory is locked (mlockall), and a RLIMIT_MEMLOCK too
//! small for its capacity is refused at start with the limit named. A capacity beyond the
//! node's free memory is warned of. (The memory per stored
//! page is counted exactly by rmem-server's slab.rs test.) Every wait is bounded.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

const TOKEN: &str = "server-memory-token";

/// Kilobytes of the process's locked memory (VmLck).
fn locked_kib(pid: u32) -> u64 {
    proc_kib(pid, "status", "VmLck")
}

#[test]
fn lock_refuses_a_memlock_limit_below_the_capacity_and_names_it() {
    // As root, the limit is lowered for `nobody`, who lacks CAP_IPC_LOCK.
    let script = format!(
        "ulimit -l 64 && exec {} server --lock --capacity 1G",
        rmem().display()
    );
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--", "sh", "-c", &script]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", &script]);
        c
    };
    let out = run_bounded(cmd.env("RMEM_TOKEN", TOKEN), Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("--lock: RLIMIT_MEMLOCK is 65536 bytes")
            && out.stderr.contains("ulimit -l unlimited"),
        "{}",
        out.stderr
    );
    assert!(!out.stdout.contains("listening"), "{}", out.stdout);
}

#[test]
fn a_locked_server_locks_its_memory_and_serves() {
    if !is_root() {
        // Unprivileged, only a limit raised by an administrator would let it start.
        eprintln!("not root: --lock needs CAP_IPC_LOCK or a large RLIMIT_MEMLOCK; checked the refusal only");
        return;
    }
    let server = ServerProcess::start(TOKEN, &["--lock", "--capacity", "64M"]);
    assert!(
        server
            .wait_for("memory locked", Duration::from_secs(5))
            .is_some(),
        "{}",
        server.log()
    );
    // Everything it maps is locked: at least its binary and its threads' stacks.
    assert!(locked_kib(server.child.id()) > 1024);
    let st = status_json(&server.addr, TOKEN);
    assert_eq!(st["capacity_bytes"], 64u64 << 20, "{st}");
}

/// A server whose node gives it no memory for a new slab (its address space capped with
/// prlimit here) refuses the page and says why, rather than aborting: the program's error
/// names the server and its reason, and the server goes on serving, the pages it took kept.
#[test]
fn a_server_without_memory_for_a_page_refuses_it_and_goes_on() {
    let server =
        ServerProcess::start_in(&["prlimit", "--as=300000000"], TOKEN, &["--capacity", "4G"]);
    let dir = scratch("no-memory");
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, format!("me 8M\n{} 4G\n", server.addr)).unwrap();
    let stats = dir.join("stats.json");
    let script = "b = bytearray(600 << 20)\n\
                  for i in range(0, len(b), 4096): b[i] = 1\n\
                  print('all touched')\n";
    let hostfile = hosts.to_str().unwrap();
    let opts = ["--hostfile", hostfile, "--launcher", "none"];
    let program = ["/usr/bin/python3", "-c", script];
    let out = run_bounded(
        rmem_run(&opts, &stats, &program, false).env("RMEM_TOKEN", TOKEN),
        Duration::from_secs(60),
    );
    let what = format!("{}\n{}\n{}", out.stdout, out.stderr, server.log());
    assert_eq!(out.status.code(), Some(69), "{what}");
    let a = &server.addr;
    assert!(
        out.stderr.contains("every memory server is full")
            && out
                .stderr
                .contains(&format!("{a} (server {a} cannot store page"))
            && out.stderr.contains("in its memory"),
        "{what}"
    );
    assert!(
        server
            .wait_for("cannot store it in its memory", Duration::from_secs(5))
            .is_some(),
        "{what}"
    );
    let st = status_json(&server.addr, TOKEN);
    assert!(st["used_bytes"].as_u64().unwrap() > 0, "{st}\n{what}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A capacity beyond what the node has left is warned of at start (the kernel would swap or
/// kill the server as it fills); a smaller one, or a disk-backed server, is not.
#[test]
fn a_capacity_above_the_node_s_free_memory_is_warned_of() {
    if !available_below(
        900 << 30,
        "a_capacity_above_the_node_s_free_memory_is_warned_of",
    ) {
        return;
    }
    let dir = scratch("capacity-warning");
    let store = format!("file:{}", dir.join("pages").display());
    for (args, warned) in [
        (vec!["--capacity", "900G"], true),
        (vec!["--capacity", "64M"], false),
        (vec!["--capacity", "900G", "--store", store.as_str()], false),
    ] {
        let s = ServerProcess::start(TOKEN, &args);
        // Logged at start, before the address line start() waited for: a second is plenty
        // for its reader to have it.
        let line = s.wait_for(
            "is more than the memory left to this server",
            Duration::from_secs(if warned { 10 } else { 1 }),
        );
        assert_eq!(line.is_some(), warned, "{args:?}: {}", s.log());
    }
    let _ = std::fs::remove_dir_all(dir);
}
