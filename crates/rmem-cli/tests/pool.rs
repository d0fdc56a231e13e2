//! A memory pool end to end: a real `rmem manager`, real `rmem server --manager` processes and
//! programs under `rmem run --manager`: two programs at once with outputs identical to plain
//! runs (one as `nobody` when run as root); a server that joins mid-run and receives pages
//! while the 8-thread verifying stress runs; a lost server not dialled while gone from the
//! pool, called back once it registers again; the manager killed and restarted mid-run (the
//! programs finish, `rmem pool status` is right again within a few heartbeats) and one client
//! killed without touching the other's pages; a drain that could not finish, asked before the
//! manager restarted, finished after it; a server drained mid-run (`rmem pool drain`)
//! and another by SIGTERM, with no redundancy: zero mismatches, each server ends empty and
//! exits; the same on 64 KiB pages whose written pieces go back as byte ranges while their
//! pages move; a drain under `ec:2+1` that moves fragments as they are, none found bad, and one
//! whose server is killed at a random moment of it; a
//! disk-backed server (`--store file:`) that takes pages only once the RAM server is
//! full, and a persisted one killed and restarted mid-run without a wrong or lost page; a
//! server whose node runs short of memory (a real hog in its memory cgroup) sheds its pages
//! while the stress runs and lends again once the hog is gone (root: it makes the cgroup);
//! `rmem nbd --manager` round-trips a file; an unnamed direct region keeps every byte of the
//! regions stress while a server holding its pages is drained; `--max-remote`
//! enforced from both sides; bad
//! input (wrong token, malformed frames, an unreachable manager, a memory server taken for a
//! manager). Everything runs on loopback; every wait is bounded and every process is killed
//! when its test ends.

mod common;
use common::pool::*;
use common::*;
use std::io::Write;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests here run several programs each: one at a time, or the 2-core machines they run
/// on time them out.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `n` servers of `capacity` in the pool of `manager`, each with a lease of 10 s: short enough
/// that a killed client's pages go within the test, long enough that a machine loaded by
/// other work (the suite runs beside it) does not expire a live one.
fn servers(manager: &str, n: usize, capacity: &str) -> Vec<ServerProcess> {
    (0..n)
        .map(|_| {
            ServerProcess::start(
                TOKEN,
                &[
                    "--capacity",
                    capacity,
                    "--lease",
                    "10",
                    "--manager",
                    manager,
                ],
            )
        })
        .collect()
}

/// The 8-thread verifying stress under `rmem run --manager`, 4 KiB pages, 8 MiB local.
fn stress_in_pool(manager: &str, threads: &str, mib: &str, ops: &str) -> Child {
    let prog = build_c("tests/c/stress.c");
    run_in_pool(
        manager,
        &["--api", "--page-size", "4K", "--local", "8M"],
        &[prog.to_str().unwrap(), threads, mib, ops],
        false,
    )
}

#[test]
fn two_programs_through_a_manager_match_plain_runs() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let _servers = servers(&m.addr, 4, "256M");
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 4).unwrap();
    let (a, b) = sort_inputs("pool-sort");
    // The second program runs as nobody when the test runs as root (the unprivileged path).
    let sort = |f: &std::path::Path, nobody| {
        let prefix: &[&str] = if nobody && is_root() {
            &["runuser", "-u", "nobody", "--"]
        } else {
            &[]
        };
        sort_in_pool(prefix, &m.addr, f)
    };
    assert_sorts_match_plain([sort(&a, false), sort(&b, true)], [&a, &b]);
}

#[test]
fn a_server_that_joins_mid_run_receives_pages() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let _first = servers(&m.addr, 3, "256M");
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 3).unwrap();
    let run = stress_in_pool(&m.addr, "8", "32", "80000");
    // Once the program holds pages on the first three, a fourth joins.
    await_status(&m.addr, Duration::from_secs(30), |st| {
        st["clients"][0]["used_bytes"].as_u64().unwrap_or(0) > 1 << 20
    })
    .unwrap();
    let late = ServerProcess::start(
        TOKEN,
        &["--capacity", "256M", "--lease", "10", "--manager", &m.addr],
    );
    let joined =
        await_status(&m.addr, Duration::from_secs(60), |st| {
            st["servers"].as_array().unwrap().iter().any(|s| {
                s["addr"] == late.addr.as_str() && s["used_bytes"].as_u64().unwrap_or(0) > 0
            })
        });
    let out = wait_bounded(run, Duration::from_secs(240), "stress in the pool");
    assert_stress_ok(&out);
    joined.unwrap_or_else(|e| panic!("{e}\n{}", shown(&out)));
    assert!(
        out.stderr
            .contains(&format!("memory server {} joined the pool", late.addr)),
        "{}",
        shown(&out)
    );
    // The server's own count agrees that it holds pages of that session.
    let _ = status_json(&late.addr, TOKEN);
}

/// A server lost in a pool is dialled again only while the manager offers it. Killed (the
/// program goes on under `ec:2+1`) and gone from the pool, nothing connects to its address
/// for three of the client's tries at lost servers (before, every server a run had lost was
/// dialled every 2 s for the rest of the run, each try on a thread of its own); started again
/// on its address, it registers, and the program calls it back (a fresh session there).
#[test]
fn a_lost_server_is_called_back_only_while_the_pool_offers_it() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let mut pool = servers(&m.addr, 4, "256M");
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 4).unwrap();
    let stop = scratch("pool-call-back").join("stop");
    let _ = std::fs::remove_file(&stop);
    let prog = build_c("tests/c/stress.c");
    let run = run_in_pool_env(
        &m.addr,
        &[
            "--api",
            "--page-size",
            "4K",
            "--local",
            "4M",
            "--redundancy",
            "ec:2+1",
        ],
        &[prog.to_str().unwrap(), "4", "16", "1000"],
        false,
        &[("STRESS_UNTIL", stop.to_str().unwrap())],
    );
    let lost = pool.remove(0);
    let addr = lost.addr.clone();
    let holds = |st: &serde_json::Value| {
        server_row(st, &addr)["used_bytes"].as_u64().unwrap_or(0) > 1 << 20
    };
    await_status(&m.addr, Duration::from_secs(30), holds).unwrap();
    drop(lost); // SIGKILL
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 3).unwrap();
    // The program hears it from the manager with its next beats.
    std::thread::sleep(Duration::from_millis(5 * BEAT_MS));
    // Its port, listened on by no server: what connects there is the program calling it back.
    let l = std::net::TcpListener::bind(&addr).unwrap();
    l.set_nonblocking(true).unwrap();
    let mut dialled = 0;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(6) {
        if l.accept().is_ok() {
            dialled += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(l);
    let back = ServerProcess::start(
        TOKEN,
        &[
            "--listen",
            &addr,
            "--capacity",
            "256M",
            "--lease",
            "10",
            "--manager",
            &m.addr,
        ],
    );
    // Called back at the program's next try once the manager offers it (every 2 s at most):
    // a fresh session of the program's opens there.
    let has_session = |st: &serde_json::Value| {
        server_row(st, &back.addr)["sessions"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
    };
    let called_back = await_status(&m.addr, Duration::from_secs(30), has_session);
    std::fs::write(&stop, b"").unwrap();
    let out = wait_bounded(
        run,
        Duration::from_secs(240),
        "stress in a pool losing a server",
    );
    assert_stress_ok(&out);
    assert_eq!(
        dialled,
        0,
        "a server gone from the pool was dialled\n{}",
        shown(&out)
    );
    called_back.unwrap_or_else(|e| panic!("{e}\n{}", shown(&out)));
    assert!(
        out.stderr
            .contains(&format!("memory server {addr} is back")),
        "{}",
        shown(&out)
    );
}

#[test]
fn the_manager_restarted_mid_run_is_right_again_within_a_few_heartbeats() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let addr = m.addr.clone();
    let _servers = servers(&addr, 4, "256M");
    await_status(&addr, Duration::from_secs(10), |st| live_servers(st) == 4).unwrap();
    let a = stress_in_pool(&addr, "8", "32", "60000");
    let b = stress_in_pool(&addr, "4", "16", "10000000");
    await_status(&addr, Duration::from_secs(30), |st| clients(st) == 2).unwrap();
    drop(m); // SIGKILL
    std::thread::sleep(Duration::from_millis(5 * BEAT_MS));
    assert!(pool_status(&addr).is_none(), "the manager is gone");
    let m = ManagerProcess::start(&addr, &[]);
    let t = Instant::now();
    let st = await_status(&addr, Duration::from_secs(5), |st| {
        live_servers(st) == 4
            && clients(st) == 2
            && st["clients"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["used_bytes"].as_u64().unwrap_or(0) > 0)
    })
    .unwrap();
    eprintln!(
        "pool status right again {:.2} s after the restart: {st}",
        t.elapsed().as_secs_f64()
    );
    // One client lost outright: the other's pages are untouched, and the lost one's go when
    // their leases run out.
    let mut b = b;
    b.kill().unwrap();
    let _ = b.wait();
    let out = wait_bounded(a, Duration::from_secs(240), "stress a in the pool");
    assert_stress_ok(&out);
    assert!(out.stderr.contains("is back"), "{}", shown(&out));
    await_status(&addr, Duration::from_secs(40), |st| {
        clients(st) == 0
            && st["servers"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["used_bytes"] == 0)
    })
    .unwrap();
    assert!(m.log().contains("joined"), "{}", m.log());
}

/// One server in the pool at `manager`, and [`stress_unreplicated`] holding more than 1 MiB
/// on it.
fn one_server_holding(manager: &str) -> (ServerProcess, Child) {
    let first = servers(manager, 1, "256M").remove(0);
    await_status(manager, Duration::from_secs(10), |st| live_servers(st) == 1).unwrap();
    let run = stress_holding_on(manager, &first.addr);
    (first, run)
}

/// [`stress_unreplicated`], run until `server` holds more than 1 MiB of it.
fn stress_holding_on(manager: &str, server: &str) -> Child {
    let run = stress_unreplicated(manager, &[]);
    await_status(manager, Duration::from_secs(30), |st| {
        st["servers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["addr"] == server && s["used_bytes"].as_u64().unwrap_or(0) > 1 << 20)
    })
    .unwrap();
    run
}

/// A drain asked by `rmem pool drain` outlives the manager: the server, told by an ack, says
/// it is leaving in its own beats, and a restarted manager goes on with it. The drain cannot
/// finish at first (no other server): `rmem pool drain` says so as soon as the one client
/// with pages there says why it cannot let it go, long before `--wait`; the manager is
/// killed and restarted; a second server joins; the first moves its pages there (or its
/// program frees them) and exits drained.
#[test]
fn a_drain_asked_before_the_manager_restarts_goes_on_after_it() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let addr = m.addr.clone();
    let (mut first, run) = one_server_holding(&addr);
    let t = Instant::now();
    let drain = pool_drain(&addr, &first.addr);
    assert!(!drain.status.success(), "nowhere to go: {}", shown(&drain));
    // The program holding pages there is named with its reason (the manager's view, a beat
    // old), within a few beats.
    assert!(
        drain.stderr.contains("cannot be drained now")
            && drain.stderr.contains("stress")
            && drain.stderr.contains("cannot let go: --redundancy none puts each page on 1 server, and 0 others are left"),
        "{}",
        shown(&drain)
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "the drain said so only after {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    while !first.log().contains("asked to drain") && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(first.log().contains("asked to drain"), "{}", first.log());
    drop(m); // SIGKILL
    let m = ManagerProcess::start(&addr, &[]);
    await_status(&addr, Duration::from_secs(10), |st| {
        server_row(st, &first.addr)["health"] == "draining"
    })
    .unwrap();
    let _second = servers(&addr, 1, "256M");
    assert_exits_drained(&mut first, Duration::from_secs(60));
    let out = wait_bounded(run, Duration::from_secs(240), "stress under a drain");
    assert_stress_ok(&out);
    assert!(m.log().contains("draining (it is leaving)"), "{}", m.log());
}

/// A server that goes silent with pages on it (stopped, here before the drain is asked) is
/// marked lost by the manager after three beats: `rmem pool drain` took that for "left" and
/// said "drained: no page left on it" with every page still there. It says the server went
/// silent holding them; continued, the server drains on and exits empty, and the program
/// never notices.
#[test]
fn a_server_that_goes_silent_while_draining_is_not_reported_drained() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let addr = m.addr.clone();
    let (mut first, run) = one_server_holding(&addr);
    let _second = servers(&addr, 1, "256M");
    await_status(&addr, Duration::from_secs(10), |st| live_servers(st) == 2).unwrap();
    let pid = first.child.id() as i32;
    // SAFETY: kill(2) of a server this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let drain = pool_drain_waiting(&addr, &first.addr, 2);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(
        !drain.status.success()
            && drain.stderr.contains("went silent")
            && drain.stderr.contains("not drained")
            && !drain.stdout.contains("drained"),
        "{}",
        shown(&drain)
    );
    assert_exits_drained(&mut first, Duration::from_secs(60));
    let out = wait_bounded(run, Duration::from_secs(240), "stress past a silent drain");
    assert_stress_ok(&out);
}

#[test]
fn a_server_drained_mid_run_ends_empty_and_the_program_never_notices() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let mut servers = servers(&m.addr, 4, "256M");
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 4).unwrap();
    let run = stress_holding_on(&m.addr, &servers[0].addr);
    let victim = servers[0].addr.clone();
    drain_under_stress(&m.addr, &victim, run);
    // The drained server exits by itself once empty.
    assert_exits_drained(&mut servers[0], Duration::from_secs(10));
    servers.remove(0);
    // SIGTERM to a server in a pool is a drain too: a second program runs meanwhile.
    let run = stress_holding_on(&m.addr, &servers[0].addr);
    // SAFETY: signalling our own child, not reaped yet.
    unsafe { libc::kill(servers[0].child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while servers[0].child.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = wait_bounded(
        run,
        Duration::from_secs(240),
        "stress under a SIGTERM drain",
    );
    assert_stress_ok(&out);
    let st = servers[0].child.try_wait().unwrap();
    assert_eq!(st.and_then(|s| s.code()), Some(0), "{}", servers[0].log());
    assert!(servers[0].log().contains("drained"), "{}", servers[0].log());
}

/// An unnamed direct region in a pool (issue 13 items 3 and 8: its pages go through the page
/// store, placed by the manager, with the layout a pool of four takes): the regions stress
/// (8 threads of random unaligned ranges against reference copies) while a server holding
/// its pages is drained. Every byte matches; the drained server ends empty and exits.
#[test]
fn a_direct_region_in_a_pool_keeps_every_byte_while_its_server_is_drained() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let mut servers = servers(&m.addr, 4, "256M");
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 4).unwrap();
    let prog = build_c("tests/c/regions.c");
    let run = run_in_pool(
        &m.addr,
        &["--api"],
        &[prog.to_str().unwrap(), "stress", "6000000", "6"],
        false,
    );
    let victim = servers[0].addr.clone();
    await_status(&m.addr, Duration::from_secs(30), |st| {
        server_row(st, &victim)["used_bytes"].as_u64().unwrap_or(0) > 256 << 10
    })
    .unwrap();
    let drained = pool_drain(&m.addr, &victim);
    let out = wait_bounded(run, Duration::from_secs(240), "regions under a drain");
    assert!(
        drained.status.success(),
        "{}\n{}",
        shown(&drained),
        shown(&out)
    );
    assert!(
        out.status.success() && out.stdout.lines().any(|l| l.starts_with("ok")),
        "{}",
        shown(&out)
    );
    let leaving = format!("memory server {victim} is leaving the pool");
    assert!(out.stderr.contains(&leaving), "{}", shown(&out));
    assert_exits_drained(&mut servers[0], Duration::from_secs(10));
}

/// SIGTERM to an idle server whose manager has gone: it leaves (exit 0, "drained") within a
/// few heartbeats, as with the manager up; it once waited for a manager's answer that never
/// came and took a second SIGTERM (exit 143).
#[test]
fn an_idle_server_leaves_on_sigterm_with_its_manager_gone() {
    let _one = serial();
    let mut m = ManagerProcess::start("127.0.0.1:0", &[]);
    let mut servers = servers(&m.addr, 1, "64M");
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 1).unwrap();
    let _ = m.child.kill();
    let _ = m.child.wait();
    // SAFETY: signalling our own child, not reaped yet.
    unsafe { libc::kill(servers[0].child.id() as i32, libc::SIGTERM) };
    // Its heartbeat is the manager's (BEAT_MS) or its own second: well inside 10 s.
    assert_exits_drained(&mut servers[0], Duration::from_secs(10));
    let st = servers[0].child.try_wait().unwrap();
    assert_eq!(st.and_then(|s| s.code()), Some(0), "{}", servers[0].log());
}

/// A drain while the stress runs on 64 KiB pages of one unsealed copy: random writes leave
/// partial pages whose written pieces go back as byte ranges over the pages where they are,
/// while those pages move off the draining server (pulled, or through the client). Zero
/// mismatches, and the server ends empty and exits.
#[test]
fn a_server_drained_while_written_pieces_go_back_ends_empty_and_loses_nothing() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let mut servers = servers(&m.addr, 3, "256M");
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 3).unwrap();
    let prog = stress_program();
    let prog: Vec<&str> = prog.iter().map(String::as_str).collect();
    let opts = [
        "--api",
        "--page-size",
        "64K",
        "--local",
        "8M",
        "--redundancy",
        "none",
    ];
    let run = run_in_pool_on(&[], &m.addr, &opts, &prog, &[]);
    let victim = servers[0].addr.clone();
    await_status(&m.addr, Duration::from_secs(30), |st| {
        used_on(st, &victim) > 1 << 20
    })
    .unwrap();
    let out = drain_under_stress(&m.addr, &victim, run);
    assert!(
        out.stderr.contains("written pieces of 4 KiB alone"),
        "no written pieces went back: {}",
        out.stderr
    );
    assert_exits_drained(&mut servers[0], Duration::from_secs(10));
}

/// The stress under `ec:2+1` in the pool of `manager`, its statistics to a file under a scratch
/// directory named `tag`, once every one of `servers` is live and the first holds over 1 MiB
/// of it. The running program and the path of its statistics.
fn ec_stress_on_the_first(
    manager: &str,
    servers: &[ServerProcess],
    tag: &str,
) -> (Child, std::path::PathBuf) {
    let n = servers.len();
    await_status(manager, Duration::from_secs(10), |st| live_servers(st) == n).unwrap();
    let stats = scratch(tag).join("stats.json");
    let _ = std::fs::remove_file(&stats);
    let opts = [&["--manager", manager][..], &stress_opts("ec:2+1")].concat();
    let prog = stress_program();
    let prog: Vec<&str> = prog.iter().map(String::as_str).collect();
    let run = rmem_run(&opts, &stats, &prog, false)
        .env("RMEM_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    await_status(manager, Duration::from_secs(30), |st| {
        used_on(st, &servers[0].addr) > 1 << 20
    })
    .unwrap();
    (run, stats)
}

/// Under erasure coding (a pool's default from three servers) a drained server's fragments are
/// moved as they are, read from it alone rather than rebuilt from K+1 others; every fragment
/// that moved is checked when its page is next read, so none may be found bad.
#[test]
fn an_erasure_coded_drain_moves_each_fragment_as_it_is() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let mut servers = servers(&m.addr, 4, "256M");
    let (run, stats) = ec_stress_on_the_first(&m.addr, &servers, "pool-ec-drain");
    let victim = servers[0].addr.clone();
    let out = drain_under_stress(&m.addr, &victim, run);
    assert_exits_drained(&mut servers[0], Duration::from_secs(10));
    let v = read_json(&stats);
    let moved = v["pieces_moved"].as_u64().unwrap();
    assert!(
        moved > 0,
        "no fragment was moved as it was: {v}\n{}",
        shown(&out)
    );
    assert_eq!(v["pieces_bad"].as_u64(), Some(0), "{v}\n{}", shown(&out));
    assert_eq!(v["servers_lost"].as_u64(), Some(0), "{v}\n{}", shown(&out));
    // The servers taking them copied them (server to server), and no pull failed for want
    // of a link between the servers.
    let pulled = v["pieces_pulled"].as_u64().unwrap();
    assert!(pulled > 0 && pulled <= moved, "{v}\n{}", shown(&out));
    assert!(
        !shown(&out).contains("could not copy pages"),
        "{}",
        shown(&out)
    );
    eprintln!(
        "{moved} fragments moved as they were ({pulled} pulled server to server), {} pages moved",
        v["pages_repaired"]
    );
}

/// A server killed (SIGKILL) at a random moment of its drain under `ec:2+1`: before its
/// pages move, while they move (a fragment it can no longer give turns its page's move into a
/// rebuild), or after. The program never notices: zero mismatches, nothing found bad.
#[test]
fn an_erasure_coded_server_killed_during_its_drain_loses_nothing() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let mut servers = servers(&m.addr, 5, "256M");
    let (run, stats) = ec_stress_on_the_first(&m.addr, &servers, "pool-ec-drain-kill");
    let victim = servers[0].addr.clone();
    let drain = {
        let (m, v) = (m.addr.clone(), victim.clone());
        std::thread::spawn(move || pool_drain(&m, &v))
    };
    let at = random_ms(0, 1500);
    std::thread::sleep(at);
    let _ = servers[0].child.kill();
    let out = wait_bounded(
        run,
        Duration::from_secs(240),
        "stress, its drained server killed",
    );
    let what = format!("killed {at:?} into the drain: {}", shown(&out));
    assert_stress_ok(&out);
    // The drain itself may end either way (done, or its server gone): bounded, not judged.
    let _ = drain.join();
    let v = read_json(&stats);
    assert_eq!(v["pieces_bad"].as_u64(), Some(0), "{v}\n{what}");
    assert!(v["servers_lost"].as_u64().unwrap() <= 1, "{v}\n{what}");
    eprintln!(
        "killed {at:?} into the drain: {} servers lost, {} fragments moved, {} pages moved or rebuilt",
        v["servers_lost"], v["pieces_moved"], v["pages_repaired"]
    );
}

#[test]
fn max_remote_is_enforced_by_the_grant_and_by_the_client() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &["--max-remote", "6M"]);
    let _servers = servers(&m.addr, 2, "256M");
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 2).unwrap();
    let prog = build_c("tests/c/stress.c");
    let stress = |opts: &[&str]| {
        let opts = [&["--api", "--page-size", "4K", "--local", "2M"][..], opts].concat();
        let child = run_in_pool(
            &m.addr,
            &opts,
            &[prog.to_str().unwrap(), "2", "32", "20000"],
            false,
        );
        wait_bounded(child, Duration::from_secs(120), "stress over its grant")
    };
    // The manager's cap, then the client's own smaller ask.
    for (opts, grant) in [
        (&[][..], 6u64 << 20),
        (&["--max-remote", "4M"][..], 4 << 20),
    ] {
        let out = stress(opts);
        assert_eq!(out.status.code(), Some(69), "{}", shown(&out));
        assert!(
            out.stderr
                .contains(&format!("may keep at most {grant} bytes")),
            "{}",
            shown(&out)
        );
    }
    // Within the grant, the same program runs.
    let prog_small = [prog.to_str().unwrap(), "2", "3", "20000"];
    let child = run_in_pool(
        &m.addr,
        &["--api", "--page-size", "4K", "--local", "1M"],
        &prog_small,
        false,
    );
    assert_stress_ok(&wait_bounded(child, Duration::from_secs(120), "stress"));
}

/// A server registered at an address this client cannot reach (here a port nobody listens on,
/// beaten for by the test: as a server that took its own loopback or a network this node is
/// not on for its address would be), offered while the program runs: the program goes on with
/// the other servers and says once (not at each try, every 2 s) which server it cannot reach.
/// Before, only a server offered at the start was named.
#[test]
fn an_offered_server_this_client_cannot_reach_is_named() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let _servers = servers(&m.addr, 1, "64M");
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 1).unwrap();
    let run = run_in_pool(
        &m.addr,
        &[],
        &[
            "/usr/bin/python3",
            "-c",
            "import time; b = bytearray(8 << 20); time.sleep(7); print('done', len(b))",
        ],
        false,
    );
    // Once the program is in the pool, the unreachable server joins it.
    await_status(&m.addr, Duration::from_secs(20), |st| {
        st["clients"].as_array().is_some_and(|c| !c.is_empty())
    })
    .unwrap();
    let nowhere = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (beating, at, addr) = (stop.clone(), m.addr.clone(), nowhere.clone());
    let beats = std::thread::spawn(move || {
        let mut c =
            rmem_client::pool::ManagerConn::connect(&at, TOKEN.as_bytes(), Duration::from_secs(5))
                .unwrap();
        while !beating.load(std::sync::atomic::Ordering::Relaxed) {
            let beat = rmem_proto::pool::PoolRequest::ServerBeat(rmem_proto::pool::ServerBeat {
                addr: addr.clone(),
                capacity_bytes: 64 << 20,
                used_bytes: 0,
                flags: 0,
                sessions: Vec::new(),
                node: String::new(),
            });
            c.ask(&beat, Duration::from_secs(5)).unwrap();
            std::thread::sleep(Duration::from_millis(BEAT_MS));
        }
    });
    let out = wait_bounded(
        run,
        Duration::from_secs(60),
        "a program beside an unreachable server",
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    beats.join().unwrap();
    assert!(
        out.status.success() && out.stdout.contains("done"),
        "{}",
        shown(&out)
    );
    let said = format!("memory server {nowhere}, offered by the pool's manager, cannot be reached");
    assert_eq!(out.stderr.matches(&said).count(), 1, "{}", shown(&out));
}

#[test]
fn bad_input_gives_a_clear_error() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let server = ServerProcess::start(TOKEN, &["--capacity", "64M", "--manager", &m.addr]);
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 1).unwrap();
    let rmem_with = |token: &str, args: &[&str]| {
        run_bounded(
            Command::new(rmem()).args(args).env("RMEM_TOKEN", token),
            Duration::from_secs(30),
        )
    };
    // A wrong token: rmem pool, rmem run and rmem server each say so.
    let out = rmem_with("wrong", &["pool", "status", "--manager", &m.addr]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("wrong token"), "{}", shown(&out));
    let out = rmem_with("wrong", &["run", "--manager", &m.addr, "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stderr.contains("wrong token"), "{}", shown(&out));
    let out = rmem_with("wrong", &["server", "--manager", &m.addr]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("wrong token"), "{}", shown(&out));
    // An unreachable manager.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let out = rmem_with(TOKEN, &["run", "--manager", &closed, "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.stderr
            .contains(&format!("pool manager {closed}: cannot connect")),
        "{}",
        shown(&out)
    );
    let out = rmem_with(TOKEN, &["pool", "status", "--manager", &closed]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("cannot connect"), "{}", shown(&out));
    // A memory server taken for a manager, and the reverse.
    let out = rmem_with(TOKEN, &["pool", "status", "--manager", &server.addr]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("protocol version"), "{}", shown(&out));
    let out = rmem_with(TOKEN, &["status", &m.addr]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.contains("not a memory server"),
        "{}",
        shown(&out)
    );
    // Malformed frames: garbage before the handshake, and a bad frame after it. Each closes
    // that connection only (logged), and the manager goes on.
    let mut raw = TcpStream::connect(&m.addr).unwrap();
    raw.write_all(&[0x47; 64]).unwrap();
    let mut sock = TcpStream::connect(&m.addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    rmem_client::store::remote::handshake_as(
        &mut sock,
        &m.addr,
        TOKEN.as_bytes(),
        rmem_proto::pool::VERSION,
        0,
        deadline,
    )
    .unwrap();
    // A server beat whose session count claims more than the frame holds.
    let mut frame = Vec::new();
    rmem_proto::pool::PoolRequest::Drain { server: "x".into() }.encode(1, &mut frame);
    frame[4] = rmem_proto::Op::PoolServerBeat as u8;
    sock.write_all(&frame).unwrap();
    let t = Instant::now();
    while !m.log().contains("truncated") && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(m.log().contains("truncated"), "{}", m.log());
    assert!(pool_status(&m.addr).is_some(), "the manager still answers");
    // A server address that is no address, from a peer of the first version (no node in its
    // beats): still spoken, its beat decoded and answered.
    let mut sock = TcpStream::connect(&m.addr).unwrap();
    rmem_client::store::remote::handshake_as(
        &mut sock,
        &m.addr,
        TOKEN.as_bytes(),
        rmem_proto::pool::VERSION_NODELESS,
        0,
        Instant::now() + Duration::from_secs(5),
    )
    .unwrap();
    let mut frame = Vec::new();
    rmem_proto::pool::PoolRequest::ServerBeat(rmem_proto::pool::ServerBeat {
        addr: "nowhere".into(),
        capacity_bytes: 1,
        used_bytes: 0,
        flags: 0,
        sessions: vec![],
        node: String::new(),
    })
    .encode_for(rmem_proto::pool::VERSION_NODELESS, 1, &mut frame);
    sock.write_all(&frame).unwrap();
    let mut body = Vec::new();
    let h = rmem_client::store::remote::read_frame(
        &mut sock,
        &m.addr,
        "answer",
        &mut body,
        1 << 20,
        Instant::now() + Duration::from_secs(5),
    )
    .unwrap();
    let answer = rmem_proto::pool::PoolResponse::decode(h.op, &body).unwrap();
    assert!(
        matches!(answer, rmem_proto::pool::PoolResponse::Error { ref message, .. } if message.contains("not HOST:PORT")),
        "{answer:?}"
    );
    // A drain of a server the pool does not have.
    let out = rmem_with(
        TOKEN,
        &["pool", "drain", "10.9.9.9:9", "--manager", &m.addr],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("no live server"), "{}", shown(&out));
}

#[test]
fn rmem_nbd_through_a_manager_round_trips_a_file() {
    let _one = serial();
    if Command::new("nbdcopy").arg("--version").output().is_err() {
        eprintln!("skipped: nbdcopy is not installed (apt-get install libnbd-bin)");
        return;
    }
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let _servers = servers(&m.addr, 3, "256M");
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 3).unwrap();
    let mut nbd = Command::new(rmem())
        .args([
            "nbd",
            "--manager",
            &m.addr,
            "--size",
            "16M",
            "--cache",
            "2M",
        ])
        .args(["--listen", "127.0.0.1:0"])
        .env("RMEM_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let line = first_line(&mut nbd);
    let log = tee_stderr(&mut nbd);
    let _nbd = Kill(nbd);
    let uri = line
        .split_whitespace()
        .find(|w| w.starts_with("nbd://"))
        .unwrap_or_else(|| panic!("{line:?} {}", log.lock().unwrap()))
        .to_string();
    let dir = scratch("pool-nbd");
    let (src, back) = (dir.join("src"), dir.join("back"));
    random_lines(&src, 400_000, 0x5DEECE66D); // about 8 MiB, 4x the cache
    let copy = |from: &str, to: &str| {
        let out = run_bounded(
            Command::new("nbdcopy").args([from, to]),
            Duration::from_secs(120),
        );
        assert!(out.status.success(), "nbdcopy {from} {to}: {}", shown(&out));
    };
    copy(src.to_str().unwrap(), &uri);
    let len = std::fs::metadata(&src).unwrap().len();
    copy(&uri, back.to_str().unwrap());
    let back_bytes = std::fs::read(&back).unwrap();
    assert!(
        back_bytes[..len as usize] == std::fs::read(&src).unwrap()[..],
        "the device gave back other bytes"
    );
    await_status(&m.addr, Duration::from_secs(10), |st| {
        st["clients"][0]["used_bytes"].as_u64().unwrap_or(0) > 4 << 20
    })
    .unwrap();
}

/// A disk-backed server in the pool: `--store file:PATH` and these arguments.
fn disk_server(manager: &str, store: &str, extra: &[&str]) -> ServerProcess {
    let args = [
        &[
            "--capacity",
            "256M",
            "--lease",
            "30",
            "--manager",
            manager,
            "--store",
            store,
            "--store-cache",
            "1M",
        ][..],
        extra,
    ]
    .concat();
    ServerProcess::start(TOKEN, &args)
}

#[test]
fn a_disk_server_takes_pages_once_the_ram_server_is_full_and_reads_them_back() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let ram = servers(&m.addr, 1, "8M").pop().unwrap();
    let file = scratch("pool-disk").join("pages.store");
    let disk = disk_server(&m.addr, &format!("file:{}", file.display()), &[]);
    assert!(!file.exists(), "a scratch store is unlinked once open");
    let st = await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 2).unwrap();
    let tier = |addr: &str| {
        st["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["addr"] == addr)
            .map(|s| s["tier"].clone())
    };
    assert_eq!(tier(&ram.addr), Some("ram".into()), "{st}");
    assert_eq!(tier(&disk.addr), Some("disk".into()), "{st}");
    let text = run_bounded(
        Command::new(rmem())
            .args(["pool", "status", "--manager", &m.addr])
            .env("RMEM_TOKEN", TOKEN),
        Duration::from_secs(20),
    );
    assert!(
        text.stdout
            .lines()
            .any(|l| l.contains(&disk.addr) && l.contains(" disk ")),
        "{}",
        text.stdout
    );
    // 48 MiB of verified data, 8 MiB of it local: the RAM server's 8 MiB fill first, the rest
    // goes to disk (a 1 MiB cache: most reads come from the file).
    let run = stress_in_pool(&m.addr, "8", "48", "60000");
    let seen = await_status(&m.addr, Duration::from_secs(120), |st| {
        used_on(st, &disk.addr) > 8 << 20 && used_on(st, &ram.addr) > 7 << 20
    });
    let out = wait_bounded(run, Duration::from_secs(240), "stress on a disk server");
    assert_stress_ok(&out);
    let seen = seen.unwrap_or_else(|e| panic!("{e}\n{}", shown(&out)));
    eprintln!(
        "ram server {} bytes, disk server {} bytes",
        used_on(&seen, &ram.addr),
        used_on(&seen, &disk.addr)
    );
    assert!(!disk.log().contains("ERROR"), "{}", disk.log());
}

#[test]
fn a_persisted_disk_server_killed_and_restarted_mid_run_loses_no_page() {
    let _one = serial();
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let file = scratch("pool-disk-persist").join("pages.store");
    let _ = std::fs::remove_file(&file);
    let store = format!("file:{},persist", file.display());
    let disk = disk_server(&m.addr, &store, &[]);
    await_status(&m.addr, Duration::from_secs(10), |st| live_servers(st) == 1).unwrap();
    // The client waits out the restart: reconnecting goes on for up to 30 s (the lease).
    let prog = build_c("tests/c/stress.c");
    let mut cmd = rmem_run(
        &[
            "--manager",
            &m.addr,
            "--api",
            "--page-size",
            "4K",
            "--local",
            "4M",
            "--redundancy",
            "none",
        ],
        &scratch("pool-disk-persist").join("stats.json"),
        &[prog.to_str().unwrap(), "4", "24", "40000"],
        false,
    );
    let run = cmd
        .env("RMEM_TOKEN", TOKEN)
        .env("RMEM_RECONNECT_MS", "30000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    await_status(&m.addr, Duration::from_secs(60), |st| {
        used_on(st, &disk.addr) > 8 << 20
    })
    .unwrap();
    let addr = disk.addr.clone();
    drop(disk); // SIGKILL: nothing flushed or said on the way out
    assert!(file.exists(), "a persisted store stays");
    // The client's next reconnect finds nothing listening (it gave up at once on a refused
    // reconnect before the server said it persists: a CI run restarted it too late).
    std::thread::sleep(Duration::from_secs(1));
    let back = disk_server(&m.addr, &store, &["--listen", &addr]);
    assert_eq!(back.addr, addr);
    let restored = back.wait_for("restored", Duration::from_secs(30));
    let out = wait_bounded(run, Duration::from_secs(240), "stress across a restart");
    assert_stress_ok(&out);
    let restored = restored.unwrap_or_else(|| panic!("{}\n{}", back.log(), shown(&out)));
    assert!(restored.contains("of 1 sessions"), "{restored}");
    drop(back);
    let _ = std::fs::remove_file(&file);
}

/// A memory cgroup (v1) with a limit, made beside this test's own and removed when dropped:
/// the simulated node of a server and the programs that compete with it for memory.
struct MemCgroup {
    dir: std::path::PathBuf,
}

impl MemCgroup {
    /// Why not, when it cannot be made here.
    fn new(limit_bytes: u64) -> Result<MemCgroup, String> {
        if !is_root() {
            return Err("not root".into());
        }
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let path = own
            .lines()
            .find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, c, p) = (f.next()?, f.next()?, f.next()?);
                c.split(',').any(|c| c == "memory").then(|| p.to_string())
            })
            .ok_or("no cgroup v1 memory controller for this process")?;
        let base = std::path::Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
        if !base.join("memory.limit_in_bytes").exists() {
            return Err(format!("{} is not a memory cgroup", base.display()));
        }
        let dir = base.join(format!("rmem-reclaim-test-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = MemCgroup { dir };
        std::fs::write(
            cg.dir.join("memory.limit_in_bytes"),
            limit_bytes.to_string(),
        )
        .map_err(|e| format!("setting its limit: {e}"))?;
        Ok(cg)
    }

    /// A command prefix that puts the command into the cgroup, then runs it.
    fn prefix(&self) -> Vec<String> {
        let procs = self.dir.join("cgroup.procs");
        vec![
            "sh".into(),
            "-c".into(),
            format!("echo $$ > {} && exec \"$0\" \"$@\"", procs.display()),
        ]
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Its processes are this test's children, killed as their owners drop; wait for them.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// A process's resident memory (VmRSS), in bytes.
fn rss_bytes(pid: u32) -> u64 {
    proc_kib(pid, "status", "VmRSS") << 10
}

/// Issue 13, "no loan while in debt": a server lends from a node (a 256 MiB memory cgroup)
/// with a floor of 96 MiB; the 8-thread verifying stress puts its pages there; then a real
/// hog of 160 MiB starts in the same cgroup. The server must say it reclaims, its pages must
/// move to the other servers (it ends holding nothing) while the stress runs and verifies,
/// and once the hog is gone it lends again.
#[test]
fn a_node_short_of_memory_sheds_its_loans_and_lends_again_when_it_has_memory() {
    let _one = serial();
    let cg = match MemCgroup::new(256 << 20) {
        Ok(cg) => cg,
        Err(why) => {
            eprintln!(
                "skipped: needs root and a cgroup v1 memory controller to make the node's \
                 cgroup ({why}); CI runs as root"
            );
            return;
        }
    };
    let m = ManagerProcess::start("127.0.0.1:0", &[]);
    let _others = servers(&m.addr, 2, "64M");
    let prefix = cg.prefix();
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let lender = ServerProcess::start_in(
        &prefix,
        TOKEN,
        &[
            "--capacity",
            "1G",
            "--lease",
            "10",
            "--manager",
            &m.addr,
            "--reclaim-below",
            "96M",
        ],
    );
    let addr = lender.addr.clone();
    // It offers what keeps its node above the floor: more than the others' 64M, far less
    // than its capacity.
    await_status(&m.addr, Duration::from_secs(10), |st| {
        let cap = server_row(st, &addr)["capacity_bytes"]
            .as_u64()
            .unwrap_or(0);
        live_servers(st) == 3 && cap > 64 << 20 && cap < 256 << 20
    })
    .unwrap();
    let stop = scratch("pool-reclaim").join("stop");
    let _ = std::fs::remove_file(&stop);
    let run = stress_unreplicated(&m.addr, &[("STRESS_UNTIL", stop.to_str().unwrap())]);
    let held = |st: &serde_json::Value| server_row(st, &addr)["used_bytes"].as_u64().unwrap_or(0);
    let before = await_status(&m.addr, Duration::from_secs(60), |st| held(st) > 16 << 20);
    let before = before.unwrap_or_else(|e| panic!("{e}\nserver: {}", lender.log()));
    let rss_before = rss_bytes(lender.child.id());
    // The node's own program wants its memory.
    let hog_bin = build_plain("tests/c/hog.c");
    let mut hog = Command::new(prefix[0])
        .args(&prefix[1..])
        .arg(&hog_bin)
        .arg("160")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let said = first_line(&mut hog);
    assert!(said.starts_with("hog: 160 MiB"), "{said:?}");
    let shown_reclaiming = await_status(&m.addr, Duration::from_secs(20), |st| {
        server_row(st, &addr)["health"] == "reclaiming"
    });
    let shed = await_status(&m.addr, Duration::from_secs(90), |st| held(st) == 0);
    // The memory itself went back to the node, not only the count (slabs are unmapped).
    let rss_shed = rss_bytes(lender.child.id());
    let running = matches!(hog.try_wait(), Ok(None));
    drop(hog.stdin.take());
    let hog_status = hog.wait().unwrap();
    let lending = await_status(&m.addr, Duration::from_secs(30), |st| {
        let s = server_row(st, &addr);
        s["health"] == "ok" && s["capacity_bytes"].as_u64().unwrap_or(0) > 64 << 20
    });
    std::fs::write(&stop, b"").unwrap();
    let out = wait_bounded(run, Duration::from_secs(240), "stress under a reclaim");
    let log = lender.log();
    let all = format!("{}\nserver:\n{log}\nbefore: {before}", shown(&out));
    shown_reclaiming.unwrap_or_else(|e| panic!("never reclaiming: {e}\n{all}"));
    shed.unwrap_or_else(|e| panic!("pages not moved off: {e}\n{all}"));
    assert!(
        running && hog_status.success(),
        "the hog: {hog_status:?}\n{all}"
    );
    assert!(
        rss_shed + (12 << 20) < rss_before,
        "the server's RSS went from {rss_before} to {rss_shed} bytes only\n{all}"
    );
    lending.unwrap_or_else(|e| panic!("never lending again: {e}\n{all}"));
    assert_stress_ok(&out);
    let moving = format!("memory server {addr} is short of memory (reclaiming)");
    assert!(out.stderr.contains(&moving), "{all}");
    assert!(
        log.contains("reclaiming") && log.contains("lending again"),
        "{all}"
    );
    assert!(
        m.log().contains(&format!("server {addr}: reclaiming")),
        "{}",
        m.log()
    );
}
