//! Simulated nodes for tests: network namespaces on one bridge of their own, each reached
//! through a veth pair. The bridge has 10.213.S.1 on this side (S a /24 no address here
//! uses), namespace k has 10.213.S.(k+2) and its own `lo`, so the namespaces reach each other
//! and this side reaches all of them, and traffic goes only to those addresses. Dropping
//! [`Nodes`] kills every process left in its namespaces and removes the namespaces, the
//! veths and the bridge, also when a test panics. Needs root: [`Nodes::new`] says loudly that
//! the test skips otherwise.

use super::{is_root, run_bounded};
use std::io::Write;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Sets of namespaces made by this test process so far (names and subnets must not collide).
static MADE: AtomicU32 = AtomicU32::new(0);

/// Run a setup command, bounded in time; panic with its output if it fails.
pub fn sh(args: &[&str]) {
    let out = run_bounded(
        Command::new(args[0]).args(&args[1..]),
        Duration::from_secs(20),
    );
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        out.stdout,
        out.stderr
    );
}

/// One namespace: a "node" of the test cluster.
pub struct Node {
    pub netns: String,
    /// The veth's end on this side (a port of the bridge): set it down to cut the node off.
    pub veth: String,
    /// The node's address (inside the namespace).
    pub addr: String,
}

impl Node {
    /// A command prefix that runs a command on this node: `ip netns exec NS`.
    pub fn prefix(&self) -> [&str; 4] {
        ["ip", "netns", "exec", &self.netns]
    }

    /// Cut the node off: its veth down, and no route to it from this side, so that this side
    /// fails at once (as with a link down on a host of its own) instead of waiting on ARP.
    /// The other nodes lose it too. Undone by [`Node::mend`], or when the nodes are dropped.
    pub fn cut(&self) {
        sh(&["ip", "link", "set", &self.veth, "down"]);
        let to = format!("{}/32", self.addr);
        sh(&["ip", "route", "add", "unreachable", &to]);
    }

    pub fn mend(&self) {
        let to = format!("{}/32", self.addr);
        sh(&["ip", "route", "del", "unreachable", &to]);
        sh(&["ip", "link", "set", &self.veth, "up"]);
    }
}

/// The simulated nodes; dropping them removes everything made.
pub struct Nodes {
    bridge: String,
    subnet: u32,
    made: u32,
    pub nodes: Vec<Node>,
}

impl Nodes {
    /// `n` nodes, or None (after saying why, loudly, for the test `what`) where namespaces
    /// cannot be made.
    pub fn new(what: &str, n: usize) -> Option<Nodes> {
        if !is_root() {
            // Straight to stderr, past the test harness's capture: a skip must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {what}: network namespaces need root; CI runs this as root \
                 (scripts/test.sh). Nothing was tested here."
            );
            return None;
        }
        assert!(n <= 200, "at most 200 nodes");
        let pid = std::process::id();
        let made = MADE.fetch_add(1, Ordering::Relaxed);
        let in_use = String::from_utf8(
            Command::new("ip")
                .args(["-o", "addr"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let subnet = (0..200)
            .map(|i| (pid * 7 + made * 13 + i) % 200 + 20)
            .find(|x| !in_use.contains(&format!("10.213.{x}.")))
            .expect("a free 10.213.X.0/24 subnet");
        let mut all = Nodes {
            bridge: format!("rmb{}x{made}", pid % 100_000),
            subnet,
            made,
            nodes: Vec::new(),
        };
        // Made before it exists, so the guard removes whatever part of it gets made.
        let bridge = all.bridge.clone();
        sh(&["ip", "link", "add", &bridge, "type", "bridge"]);
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("10.213.{subnet}.1/24"),
            "dev",
            &bridge,
        ]);
        sh(&["ip", "link", "set", &bridge, "up"]);
        for _ in 0..n {
            all.add();
        }
        Some(all)
    }

    /// One more node on the bridge.
    pub fn add(&mut self) -> &Node {
        let pid = std::process::id();
        let k = self.nodes.len();
        let node = Node {
            netns: format!("rmem-test-{pid}-{}-{k}", self.made),
            veth: format!("rmv{}x{}x{k}", pid % 100_000, self.made),
            addr: format!("10.213.{}.{}", self.subnet, k + 2),
        };
        let peer = format!("{}n", node.veth);
        self.nodes.push(node);
        let h = self.nodes.last().unwrap();
        let (ns, veth) = (h.netns.clone(), h.veth.clone());
        sh(&["ip", "netns", "add", &ns]);
        sh(&[
            "ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer,
        ]);
        sh(&["ip", "link", "set", &peer, "netns", &ns]);
        sh(&["ip", "link", "set", &veth, "master", &self.bridge]);
        sh(&["ip", "link", "set", &veth, "up"]);
        let addr = format!("{}/24", h.addr);
        sh(&["ip", "-n", &ns, "addr", "add", &addr, "dev", &peer]);
        sh(&["ip", "-n", &ns, "link", "set", &peer, "up"]);
        sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        self.nodes.last().unwrap()
    }

    /// Processes in the namespaces now.
    pub fn pids(&self) -> Vec<(u32, &Node)> {
        self.nodes
            .iter()
            .flat_map(|n| netns_pids(&n.netns).into_iter().map(move |p| (p, n)))
            .collect()
    }
}

pub fn netns_pids(ns: &str) -> Vec<u32> {
    Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for n in &self.nodes {
            // Anything still in the namespace (servers, programs, sshd sessions) goes.
            for pid in netns_pids(&n.netns) {
                // SAFETY: kill by pid; these run in a namespace this test created.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            // Deleting the veth's end here removes its peer; deleting the namespace the rest.
            let _ = Command::new("ip").args(["link", "del", &n.veth]).status();
            let _ = Command::new("ip").args(["netns", "del", &n.netns]).status();
            let to = format!("{}/32", n.addr);
            let _ = Command::new("ip")
                .args(["route", "del", "unreachable", &to])
                .stderr(std::process::Stdio::null())
                .status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}
