//! A memory pool across simulated nodes (issue 13 item 10): the manager, four memory servers
//! and the programs each in a network namespace of their own (`common::netns`: namespaces on
//! a bridge, one address each), so every page crosses a veth between "nodes" rather than
//! loopback. Two programs at once through `rmem run --manager` from a node of their own give
//! the outputs of plain runs; a server drained mid-run under the 8-thread verifying stress
//! ends empty with zero mismatches; and no loan while in debt: a node that lends, whose own
//! program then borrows from the others, sheds its loans and takes nothing while the program
//! runs, and lends again after. Needs root (says so when it skips); every wait is
//! bounded, and the namespaces, with everything left in them, go when a test ends, also on a
//! panic.

mod common;
use common::netns::{Node, Nodes};
use common::pool::*;
use common::*;
use std::sync::Mutex;
use std::time::Duration;

/// Several programs per test on 2-core machines: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A manager on the first node, a server of `capacity` on each of the next `servers` nodes,
/// all listening on their node's address; the rest of the nodes run nothing yet.
fn pool_on(nodes: &[Node], servers: usize, capacity: &str) -> (ManagerProcess, Vec<ServerProcess>) {
    let m = ManagerProcess::start_in(&nodes[0].prefix(), &format!("{}:0", nodes[0].addr), &[]);
    let s = nodes[1..=servers]
        .iter()
        .map(|n| {
            ServerProcess::start_in(
                &n.prefix(),
                TOKEN,
                &[
                    "--listen",
                    &format!("{}:0", n.addr),
                    "--capacity",
                    capacity,
                    "--lease",
                    "10",
                    "--manager",
                    &m.addr,
                ],
            )
        })
        .collect();
    await_status(&m.addr, Duration::from_secs(10), |st| {
        live_servers(st) == servers
    })
    .unwrap();
    (m, s)
}

#[test]
fn two_programs_on_another_node_match_plain_runs() {
    let _one = serial();
    let Some(nodes) = Nodes::new("pool_netns::two_programs", 6) else {
        return;
    };
    let (m, servers) = pool_on(&nodes.nodes, 4, "256M");
    for (s, n) in servers.iter().zip(&nodes.nodes[1..]) {
        assert!(s.addr.starts_with(&format!("{}:", n.addr)), "{}", s.addr);
    }
    let client = nodes.nodes[5].prefix();
    let (a, b) = sort_inputs("pool-netns-sort");
    let sort = |f: &std::path::Path| sort_in_pool(&client, &m.addr, f);
    let (ra, rb) = (sort(&a), sort(&b));
    // Both borrow from servers on other nodes while they run.
    let spread = await_status(&m.addr, Duration::from_secs(60), |st| {
        clients(st) == 2 && servers.iter().filter(|s| used_on(st, &s.addr) > 0).count() >= 2
    });
    assert_sorts_match_plain([ra, rb], [&a, &b]);
    spread.unwrap_or_else(|e| panic!("pages never on two servers: {e}"));
}

#[test]
fn a_server_drained_mid_run_across_nodes_ends_empty_with_zero_mismatches() {
    let _one = serial();
    let Some(nodes) = Nodes::new("pool_netns::drain", 6) else {
        return;
    };
    let (m, mut servers) = pool_on(&nodes.nodes, 4, "256M");
    let victim = servers[0].addr.clone();
    let run = stress_unreplicated_on(&nodes.nodes[5].prefix(), &m.addr, &[]);
    let holding = await_status(&m.addr, Duration::from_secs(60), |st| {
        used_on(st, &victim) > 1 << 20
    });
    let out = drain_under_stress(&m.addr, &victim, run);
    holding.unwrap_or_else(|e| panic!("{e}\n{}", shown(&out)));
    // The drained server exits by itself once empty, and the pool forgets nothing else.
    assert_exits_drained(&mut servers[0], Duration::from_secs(10));
    servers.remove(0);
    let st = pool_status(&m.addr).unwrap();
    assert_eq!(used_on(&st, &victim), 0, "{st}");
}

fn health<'a>(st: &'a serde_json::Value, addr: &str) -> &'a serde_json::Value {
    &server_row(st, addr)["health"]
}

/// Issue 13 item 5, second half: a node whose own `rmem run` borrows from the pool lends
/// nothing meanwhile. Node 1 runs a server that lends to the verifying stress of node 5; then
/// a stress starts on node 1 itself and places pages on the other nodes (more than node 1
/// lends: it is in debt). Node 1's server must shed everything it holds and take nothing
/// while that program runs, both programs verifying; once it ends, node 1 lends again: a new
/// program from node 5 places pages there.
#[test]
fn a_node_whose_program_borrows_sheds_its_loans_and_lends_again_after() {
    let _one = serial();
    let Some(nodes) = Nodes::new("pool_netns::debt", 6) else {
        return;
    };
    let n = &nodes.nodes;
    let (m, servers) = pool_on(n, 4, "256M");
    let lender = servers[0].addr.clone();
    let dir = scratch("pool-netns-debt");
    let (stop_other, stop_own) = (dir.join("stop-other"), dir.join("stop-own"));
    for f in [&stop_other, &stop_own] {
        let _ = std::fs::remove_file(f);
    }
    // Each runs on past its operations until its file exists.
    let (other_until, own_until) = (stop_other.to_str().unwrap(), stop_own.to_str().unwrap());
    let other = stress_unreplicated_on(&n[5].prefix(), &m.addr, &[("STRESS_UNTIL", other_until)]);
    let lent = await_status(&m.addr, Duration::from_secs(60), |st| {
        used_on(st, &lender) > 1 << 20
    });
    let lent = lent.unwrap_or_else(|e| panic!("node 1 never lent: {e}"));
    assert_eq!(health(&lent, &lender), "ok", "{lent}");
    // Node 1's own program borrows from the other nodes.
    let own = stress_unreplicated_on(&n[1].prefix(), &m.addr, &[("STRESS_UNTIL", own_until)]);
    let in_debt = await_status(&m.addr, Duration::from_secs(60), |st| {
        health(st, &lender) == "in debt"
    });
    let shed = await_status(&m.addr, Duration::from_secs(90), |st| {
        used_on(st, &lender) == 0 && health(st, &lender) == "in debt"
    });
    // It takes nothing while the program runs: still empty a few heartbeats later.
    std::thread::sleep(Duration::from_millis(10 * BEAT_MS));
    let still = pool_status(&m.addr).unwrap();
    std::fs::write(&stop_own, b"").unwrap();
    let own_out = wait_bounded(own, Duration::from_secs(240), "the borrowing node's stress");
    let lending = await_status(&m.addr, Duration::from_secs(30), |st| {
        health(st, &lender) == "ok"
    });
    // Lends again: a new program from node 5 places pages there.
    let again = stress_unreplicated_on(&n[5].prefix(), &m.addr, &[]);
    let took = await_status(&m.addr, Duration::from_secs(60), |st| {
        used_on(st, &lender) > 1 << 20
    });
    let again_out = wait_bounded(again, Duration::from_secs(240), "a stress after the debt");
    std::fs::write(&stop_other, b"").unwrap();
    let other_out = wait_bounded(other, Duration::from_secs(240), "the lent-to stress");
    let all = format!(
        "own:\n{}\nother:\n{}\nserver:\n{}\nmanager:\n{}",
        shown(&own_out),
        shown(&other_out),
        servers[0].log(),
        m.log()
    );
    in_debt.unwrap_or_else(|e| panic!("never in debt: {e}\n{all}"));
    shed.unwrap_or_else(|e| panic!("its loans never left: {e}\n{all}"));
    assert!(
        used_on(&still, &lender) == 0 && health(&still, &lender) == "in debt",
        "took pages while in debt: {still}\n{all}"
    );
    lending.unwrap_or_else(|e| panic!("never lending again: {e}\n{all}"));
    took.unwrap_or_else(|e| panic!("no pages once lending again: {e}\n{all}"));
    assert_stress_ok(&own_out);
    assert_stress_ok(&other_out);
    assert_stress_ok(&again_out);
    let moving = format!("memory server {lender} lends nothing while its node borrows");
    assert!(other_out.stderr.contains(&moving), "{all}");
    let log = servers[0].log();
    assert!(
        log.contains("borrows from other nodes: reclaiming") && log.contains("lending again"),
        "{all}"
    );
    assert!(
        m.log().contains(&format!(
            "server {lender}: reclaiming (its node is in debt)"
        )),
        "{all}"
    );
}
