//! Server sessions that outlive connections, end to end: real `rmem server` processes, the
//! 8-thread verifying stress with its connections killed from outside (`ss -K`, as root),
//! and a client killed with SIGKILL whose pages the server frees when its lease runs out.
//! Every wait is bounded.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "secret-for-the-sessions-test";

fn server(args: &[&str]) -> ServerProcess {
    let mut all = vec!["--verbose"];
    all.extend_from_slice(args);
    ServerProcess::start(TOKEN, &all)
}

/// Kill every TCP connection to `port` (`ss -K`, root only); how many sockets it killed.
fn kill_connections(port: u16) -> usize {
    let out = Command::new("ss")
        .args([
            "-K",
            "-H",
            "-t",
            "dst",
            "127.0.0.1",
            "dport",
            "=",
            &port.to_string(),
        ])
        .stderr(Stdio::null())
        .output()
        .expect("ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// The 8-thread verifying stress over two servers while a thread keeps killing the
/// program's connections from outside: the client reconnects within the lease each time,
/// re-sends what was in flight, and not one word read back differs.
#[test]
fn the_stress_survives_connections_killed_from_outside() {
    if !is_root() {
        eprintln!("skipped: killing sockets with `ss -K` needs root (CI runs as root)");
        return;
    }
    let dir = scratch("sessions-kill");
    let servers = [server(&[]), server(&[])];
    let hosts = dir.join("hosts");
    std::fs::write(
        &hosts,
        format!("me 8M\n{} 64M\n{} 64M\n", servers[0].addr, servers[1].addr),
    )
    .unwrap();
    let prog = build_c("tests/c/stress.c");
    let stats = dir.join("stats.json");
    let child = Command::new(rmem())
        .args([
            "run",
            "--api",
            "--launcher",
            "none",
            "--placement",
            "stripe",
        ])
        .arg("--hostfile")
        .arg(&hosts)
        .args(["--page-size", "4K", "--stats-json"])
        .arg(&stats)
        .arg("--")
        .arg(&prog)
        .args(["8", "32", "150000"])
        .env("RMEM_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ports = [servers[0].port(), servers[1].port()];
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let killer = {
        let running = running.clone();
        std::thread::spawn(move || {
            let mut killed = 0;
            // Let the program start, then cut its links every 300 ms, both servers at once.
            std::thread::sleep(Duration::from_millis(500));
            while running.load(std::sync::atomic::Ordering::Relaxed) {
                killed += ports.iter().map(|&p| kill_connections(p)).sum::<usize>();
                std::thread::sleep(Duration::from_millis(300));
            }
            killed
        })
    };
    let out = wait_bounded(
        child,
        Duration::from_secs(240),
        "the stress under killed links",
    );
    running.store(false, std::sync::atomic::Ordering::Relaxed);
    let killed = killer.join().unwrap();
    let shown = format!(
        "{:?}\n{}\n{}\nserver logs:\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr,
        servers[0].log(),
        servers[1].log()
    );
    assert!(out.status.success(), "{shown}");
    assert!(stress_ok(&out.stdout), "{shown}");
    assert!(killed >= 4, "only {killed} sockets killed: {shown}");
    // Each killed link is a disconnect the servers saw, the client attached again each time.
    let dropped: usize = servers
        .iter()
        .map(|s| s.log().matches("disconnected").count())
        .sum();
    assert!(dropped >= 4, "{dropped} links dropped: {shown}");
    eprintln!("{killed} sockets killed, {dropped} links dropped and re-established");
    let v = read_json(&stats);
    assert!(v["swap_ins"].as_u64().unwrap() > 0, "{v}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A client killed with SIGKILL never ends its session: the server frees its pages when
/// the lease (2 s here) runs out, within the lease plus one heartbeat of the kill.
#[test]
fn a_killed_client_s_pages_are_freed_within_the_lease() {
    let lease = Duration::from_secs(2);
    let heartbeat = Duration::from_secs(1);
    let server = server(&["--lease", "2"]);
    let beat = heartbeat.as_millis().to_string();
    let mut child = touch_forever(&server.addr, TOKEN, 16, 60, &[("RMEM_HEARTBEAT_MS", &beat)]);
    // Idle for more than a lease: the heartbeats alone keep the session.
    std::thread::sleep(lease + lease / 2);
    assert!(
        !server.log().contains("lease expired"),
        "a live client lost its session: {}",
        server.log()
    );
    child.kill().unwrap();
    let killed = Instant::now();
    let _ = child.wait();
    let line = server
        .wait_for("lease expired", lease + heartbeat + Duration::from_secs(2))
        .unwrap_or_else(|| panic!("pages never freed: {}", server.log()));
    let took = killed.elapsed();
    let freed: u64 = line
        .split("freed ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(freed >= 12 << 20, "{line}");
    assert!(took <= lease + heartbeat, "freed {took:?} after the kill");
    let st = status_json(&server.addr, TOKEN);
    assert_eq!(st["used_bytes"], 0, "{st}");
    assert_eq!(st["sessions"].as_array().unwrap().len(), 0, "{st}");
}
