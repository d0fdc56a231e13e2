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

/// A program stopped for longer than the lease (SIGSTOP, as Ctrl-Z, a batch scheduler's
/// suspend or a debugger stop it) sends no heartbeat, but its connections stay open: the server
/// keeps its session, and the program goes on with its data when continued. It was stopped in
/// the middle of paging (16 MiB read over and over at 4 MiB local), so requests were in flight.
#[test]
fn a_program_stopped_past_the_lease_keeps_its_memory() {
    use std::io::BufRead;
    let lease = Duration::from_secs(2);
    let server = server(&["--lease", "2"]);
    let mut child = Command::new(build_c("tests/c/touch_forever.c"))
        .args(["16", "10"])
        .env("RMEM_SERVERS", &server.addr)
        .env("RMEM_TOKEN", TOKEN)
        .env("RMEM_LOCAL", "4M")
        .env("RMEM_PAGE_SIZE", "16K")
        .env("RMEM_HEARTBEAT_MS", "500")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let first = lines
        .recv_timeout(Duration::from_secs(30))
        .expect("a first line");
    assert!(first.contains("touch_forever: filled"), "{first:?}");
    // The server probes an idle client connection (TCP keepalive) rather than drop it. ss shows
    // one timer per socket: while the server has unacknowledged data on a link (the program is
    // paging) that is the retransmit timer, `timer:(on,..)`, so each of the server's connections
    // must show `keepalive` in at least one of several looks (the program runs 10 s in all).
    let port = server.addr.rsplit(':').next().unwrap().to_string();
    let mut unseen: Option<std::collections::BTreeMap<String, String>> = None;
    let looked = Instant::now();
    while looked.elapsed() < Duration::from_secs(3) {
        let Ok(ss) = Command::new("ss")
            .args(["-t", "-n", "-o", "state", "established"])
            .output()
        else {
            break;
        };
        let text = String::from_utf8_lossy(&ss.stdout).into_owned();
        let mut now = std::collections::BTreeMap::new();
        for l in text.lines() {
            let cols: Vec<&str> = l.split_whitespace().collect();
            if cols.len() > 3 && cols[2].ends_with(&format!(":{port}")) {
                now.insert(format!("{} {}", cols[2], cols[3]), l.to_string());
            }
        }
        assert!(
            unseen.is_some() || !now.is_empty(),
            "no connection of the server's: {text}"
        );
        let left = unseen.get_or_insert_with(|| now.clone());
        left.retain(|link, _| now.get(link).is_some_and(|l| !l.contains("keepalive")));
        for (link, l) in left.iter_mut() {
            if let Some(latest) = now.get(link) {
                *l = latest.clone();
            }
        }
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    match unseen {
        None => eprintln!("ss not found: the keepalive check is skipped"),
        Some(left) => assert!(
            left.is_empty(),
            "server connections never seen with keepalive in 3 s: {:?}",
            left.values().collect::<Vec<_>>()
        ),
    }
    std::thread::sleep(Duration::from_millis(500));
    let pid = child.id() as i32;
    /// Kills the program however the test ends, so that no stopped process is left behind.
    struct KillOnDrop(i32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            // SAFETY: kill(2) of the test's child (gone already once it was waited for).
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _guard = KillOnDrop(pid);
    // SAFETY: kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let stopped = Instant::now();
    std::thread::sleep(lease * 3);
    assert!(
        !server.log().contains("lease expired"),
        "the session of a stopped program was freed: {}",
        server.log()
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(stopped.elapsed() > lease * 2);
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!(
                "touch_forever ran over 60 s after SIGCONT: {}",
                server.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Its output up to the end of the pipe (the program has exited), bounded.
    let mut rest = Vec::new();
    while let Ok(l) = lines.recv_timeout(Duration::from_secs(10)) {
        rest.push(l);
    }
    assert!(status.success(), "{status:?} {rest:?}\n{}", server.log());
    assert!(
        rest.iter()
            .any(|l| l.contains("finished without interruption")),
        "{rest:?}"
    );
    assert!(!server.log().contains("lease expired"), "{}", server.log());
}

/// The other side of keeping a stopped program's session: a client whose host is cut off and
/// never comes back (the link down, then the client killed, so its kernel's close never
/// arrives) leaves a connection open on the server. TCP keepalive and the user timeout close
/// it within 25 s of the last thing heard, and the lease (2 s here) then frees the pages.
/// Needs root (network namespaces); says so when it skips.
#[test]
fn a_cut_off_client_s_session_is_freed_after_the_keepalive_and_the_lease() {
    let Some(nodes) = common::netns::Nodes::new("sessions::cut_off_client", 1) else {
        return;
    };
    let node = &nodes.nodes[0];
    let server = ServerProcess::start_in(
        &node.prefix(),
        TOKEN,
        &[
            "--verbose",
            "--listen",
            &format!("{}:0", node.addr),
            "--lease",
            "2",
        ],
    );
    let mut child = touch_forever(&server.addr, TOKEN, 16, 120, &[]);
    std::thread::sleep(Duration::from_millis(500));
    node.cut();
    let cut = Instant::now();
    let _ = child.kill();
    let _ = child.wait();
    let line = server
        .wait_for("lease expired", Duration::from_secs(45))
        .unwrap_or_else(|| {
            panic!(
                "a cut-off client's pages were never freed: {}",
                server.log()
            )
        });
    eprintln!("freed {:?} after the cut: {line}", cut.elapsed());
    node.mend();
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
