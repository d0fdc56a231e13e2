//! A memory pool across simulated nodes (issue 13 item 10): the manager, four memory servers
//! and the programs each in a network namespace of their own (`common::netns`: namespaces on
//! a bridge, one address each), so every page crosses a veth between "nodes" rather than
//! loopback. Two programs at once through `rmem run --manager` from a node of their own give
//! the outputs of plain runs; a server drained mid-run under the 8-thread verifying stress
//! ends empty with zero mismatches. Needs root (says so when it skips); every wait is
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
    let drained = pool_drain(&m.addr, &victim);
    let out = wait_bounded(run, Duration::from_secs(240), "stress under a drain");
    holding.unwrap_or_else(|e| panic!("{e}\n{}", shown(&out)));
    assert!(
        drained.status.success(),
        "{}\n{}",
        shown(&drained),
        shown(&out)
    );
    assert_stress_ok(&out);
    assert!(
        out.stderr
            .contains(&format!("memory server {victim} is leaving the pool")),
        "{}",
        shown(&out)
    );
    // The drained server exits by itself once empty, and the pool forgets nothing else.
    assert_exits_drained(&mut servers[0], Duration::from_secs(10));
    servers.remove(0);
    let st = pool_status(&m.addr).unwrap();
    assert_eq!(used_on(&st, &victim), 0, "{st}");
}
