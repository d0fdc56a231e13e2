//! A real multi-host run. The test builds its own small cluster: network namespaces on a
//! bridge of their own (`common::netns`: 10.213.S.1 on this side, 10.213.S.2 and up inside),
//! and Debian's sshd running inside with a host key and a client key generated here. `rmem run
//! --hostfile` then starts its memory servers over real ssh in those namespaces. Traffic goes
//! only to those addresses. A guard removes the namespaces, veths, the bridge and every
//! process started, also when a test panics. Needs root (CI runs as root); without it, the
//! tests say loudly that they skip.

mod common;
use common::netns::{cmdline, sh, Node, Nodes};
use common::*;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

/// The test cluster: simulated nodes (common::netns), an sshd in some. Dropping it stops the
/// sshds, then the nodes go with everything left in them.
struct Cluster {
    dir: PathBuf,
    key: PathBuf,
    sshd: Vec<Option<Child>>,
    nodes: Nodes,
}

impl Cluster {
    /// Returns None (after saying why, loudly) where the test cannot run.
    fn new(tag: &str, with_sshd: &[bool]) -> Option<Cluster> {
        let nodes = Nodes::new(&format!("multihost::{tag}"), with_sshd.len())?;
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: install openssh-server (scripts/deps.sh does)"
        );
        let dir = scratch(&format!("multihost-{tag}"));
        let mut c = Cluster {
            key: dir.join("client_key"),
            dir,
            sshd: with_sshd.iter().map(|_| None).collect(),
            nodes,
        };
        // sshd refuses to start without its privilege separation directory.
        std::fs::create_dir_all("/run/sshd").unwrap();
        for name in ["host_key", "client_key"] {
            let p = c.dir.join(name);
            let _ = std::fs::remove_file(&p);
            sh(&[
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "rmem-multihost-test",
                "-f",
                p.to_str().unwrap(),
            ]);
        }
        std::fs::copy(c.dir.join("client_key.pub"), c.dir.join("authorized_keys")).unwrap();
        for (i, &sshd) in with_sshd.iter().enumerate() {
            if sshd {
                c.start_sshd(i);
            }
        }
        Some(c)
    }

    /// The nodes ("hosts"), in the order made.
    fn hosts(&self) -> &[Node] {
        &self.nodes.nodes
    }

    fn start_sshd(&mut self, i: usize) {
        let d = &self.dir;
        let (ns, addr) = (self.hosts()[i].netns.clone(), self.hosts()[i].addr.clone());
        let config = d.join(format!("sshd_config-{i}"));
        std::fs::write(
            &config,
            format!(
                "ListenAddress {addr}\nPort 22\nHostKey {}\nPidFile {}\n\
                 AuthorizedKeysFile {}\nPermitRootLogin prohibit-password\n\
                 PubkeyAuthentication yes\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\n",
                d.join("host_key").display(),
                d.join(format!("sshd-{i}.pid")).display(),
                d.join("authorized_keys").display(),
            ),
        )
        .unwrap();
        let log = std::fs::File::create(d.join(format!("sshd-{i}.log"))).unwrap();
        // `ip netns exec` execs sshd in place: this child is sshd itself.
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, SSHD, "-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.sshd[i] = Some(child);
        let target: SocketAddr = format!("{addr}:22").parse().unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&target, Duration::from_millis(500)).is_err() {
            assert!(
                Instant::now() < end,
                "sshd in {ns} did not listen on {target}: {}",
                std::fs::read_to_string(d.join(format!("sshd-{i}.log"))).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn ssh_opts(&self) -> String {
        format!(
            "-i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
            self.key.display()
        )
    }

    /// `rmem run --api --hostfile HOSTS --ssh-opts ... ARGS -- stress ...`, bounded.
    fn run(&self, hosts: &str, args: &[&str], stress: &[&str]) -> Output {
        let file = self.dir.join("hosts");
        std::fs::write(&file, hosts).unwrap();
        let mut cmd = Command::new(rmem());
        cmd.args(["run", "--api", "--hostfile"])
            .arg(&file)
            .args(["--ssh-opts", &self.ssh_opts()])
            .args(args)
            .arg("--")
            .arg(build_c("tests/c/stress.c"))
            .args(stress)
            .env("RMEM_VERBOSE", "1");
        run_bounded(&mut cmd, Duration::from_secs(120))
    }

    /// Processes left over by a run: inside a namespace other than its sshd listener, or
    /// anywhere naming one of the namespace addresses (ssh). Waits a little for them to go.
    fn leftovers(&self) -> Vec<String> {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let mut left = Vec::new();
            for (pid, h) in self.nodes.pids() {
                let sshd = self.sshd.iter().flatten().any(|c| c.id() == pid);
                if !sshd {
                    left.push(format!("{pid} in {}: {}", h.netns, cmdline(pid)));
                }
            }
            for entry in std::fs::read_dir("/proc").unwrap().flatten() {
                let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                let cmd = cmdline(pid);
                if self.hosts().iter().any(|h| cmd.contains(&h.addr)) {
                    left.push(format!("{pid}: {cmd}"));
                }
            }
            if left.is_empty() || Instant::now() > end {
                return left;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for mut c in self.sshd.iter_mut().filter_map(Option::take) {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `held at most N pages` from the server log line forwarded from `host`, if any.
fn pages_held_on(stderr: &str, host: &str) -> Option<u64> {
    stderr
        .lines()
        .filter(|l| l.starts_with(&format!("{host}: rmem-server")))
        .find_map(|l| {
            let rest = l.split("held at most ").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        })
}

#[test]
fn servers_start_over_real_ssh_in_two_namespaces_and_both_get_pages() {
    let Some(c) = Cluster::new("two-hosts", &[true, true]) else {
        return;
    };
    let (a, b) = (&c.hosts()[0].addr, &c.hosts()[1].addr);
    let dir = c.dir.clone();
    let stats = dir.join("stats.json");
    // 32 MiB of stress data, 4 MiB local; the first server lends only 12 MiB, so priority
    // placement must spill onto the second.
    let hosts = format!(
        "# rmem multihost test\ncalhost 4M   # local budget\n{a} 12M\n{b}:0 64M # port picked by the server\n"
    );
    let out = c.run(
        &hosts,
        &[
            "--page-size",
            "64K",
            "--stats-json",
            stats.to_str().unwrap(),
        ],
        &["4", "32", "3000"],
    );
    let shown = format!("{:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    assert!(out.status.success(), "{shown}");
    assert!(stress_ok(&out.stdout), "{shown}");
    let v = read_json(&stats);
    let n = |k: &str| v[k].as_u64().unwrap();
    assert!(n("swap_ins") > 0 && n("swap_outs") > 0, "{v}");
    assert!(n("local_bytes_max") <= 4 << 20, "{v}");
    // Each server logs (RMEM_VERBOSE=1 is passed on to them as --verbose) the most pages
    // the client kept on it; both must have held some.
    for host in [a, b] {
        let held = pages_held_on(&out.stderr, host);
        assert!(held.is_some_and(|n| n > 0), "no pages on {host}: {shown}");
    }
    let left = c.leftovers();
    assert!(left.is_empty(), "processes left over: {left:?}");
}

#[test]
fn an_unreachable_host_is_named_and_the_started_servers_are_finalized() {
    // The second namespace runs no sshd: connections to it are refused.
    let Some(c) = Cluster::new("unreachable", &[true, false]) else {
        return;
    };
    let (a, dead) = (&c.hosts()[0].addr, &c.hosts()[1].addr);
    let out = c.run(
        &format!("calhost 4M\n{a} 64M\n{dead} 64M\n"),
        &[],
        &["1", "8", "100"],
    );
    let shown = format!("{:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(
        out.stderr.contains(&format!(
            "memory server on {dead} (over ssh) failed to start"
        )),
        "{shown}"
    );
    assert!(
        out.stderr.contains("Connection refused"),
        "ssh's reason: {shown}"
    );
    assert!(
        !out.stdout.contains("stress"),
        "the program must not run: {shown}"
    );
    assert!(
        out.elapsed < Duration::from_secs(15),
        "took {:?}",
        out.elapsed
    );
    let left = c.leftovers();
    assert!(left.is_empty(), "processes left over: {left:?}");

    // A host that is reachable but has no rmem where --remote-rmem says: named, with the
    // remote shell's reason.
    let out = c.run(
        &format!("calhost 4M\n{a} 64M\n"),
        &["--remote-rmem", "/nonexistent/rmem"],
        &["1", "8", "100"],
    );
    let shown = format!("{:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(
        out.stderr
            .contains(&format!("memory server on {a} (over ssh) failed to start"))
            && out.stderr.contains("/nonexistent/rmem"),
        "{shown}"
    );
    let left = c.leftovers();
    assert!(left.is_empty(), "processes left over: {left:?}");
}

/// A partition: three servers, each in a namespace of its own, pages kept as `ec:2+1`; the
/// node of one is cut off (`Node::cut`) under the verifying stress for longer than the
/// servers' lease, then mended. The program goes on from the other two (no error, no mismatch), gives the
/// partitioned server up, and takes it back once it answers again.
#[test]
fn a_server_partitioned_past_its_lease_is_survived_with_redundancy() {
    const TOKEN: &str = "secret-for-the-partition-test";
    let Some(c) = Cluster::new("partition", &[false, false, false]) else {
        return;
    };
    let servers: Vec<ServerProcess> = c
        .hosts()
        .iter()
        .map(|h| {
            ServerProcess::start_in(
                &["ip", "netns", "exec", &h.netns],
                TOKEN,
                &["--listen", &format!("{}:0", h.addr), "--lease", "2"],
            )
        })
        .collect();
    let mut hosts = String::from("me 8M\nredundancy ec:2+1\nencrypt off\n");
    for s in &servers {
        hosts += &format!("{} 128M\n", s.addr);
    }
    let file = c.dir.join("hosts");
    std::fs::write(&file, hosts).unwrap();
    let stats = c.dir.join("stats.json");
    let mut cmd = Command::new(rmem());
    cmd.args(["run", "--api", "--launcher", "none", "--page-size", "4K"])
        .arg("--hostfile")
        .arg(&file)
        .arg("--stats-json")
        .arg(&stats)
        .arg("--")
        .arg(build_c("tests/c/stress.c"))
        .args(["8", "32", "50000"])
        .env("RMEM_TOKEN", TOKEN)
        .env("RMEM_SERVER_TIMEOUT_MS", "1000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    // Cut the link once the program has pages out; keep it down past the 2 s lease.
    std::thread::sleep(Duration::from_millis(1500));
    c.hosts()[0].cut();
    let down = Instant::now();
    let mut child = child;
    while down.elapsed() < Duration::from_secs(5) && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let cut_while_running = child.try_wait().unwrap().is_none();
    c.hosts()[0].mend();
    let out = wait_bounded(child, Duration::from_secs(180), "the partitioned stress");
    let what = format!(
        "{:?} after {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status, out.elapsed, out.stdout, out.stderr
    );
    eprintln!("{what}");
    assert!(
        cut_while_running,
        "the stress ended before the partition: {what}"
    );
    assert!(out.status.success(), "{what}");
    assert!(stress_ok(&out.stdout), "{what}");
    assert!(
        out.stderr
            .contains(&format!("memory server {} lost", servers[0].addr)),
        "{what}"
    );
    let v = read_json(&stats);
    assert_eq!(v["layout"].as_str(), Some("ec:2+1"), "{v}");
    assert_eq!(v["servers_lost"].as_u64(), Some(1), "{v}\n{what}");
    drop(servers);
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}
