//! A real multi-host run. The test builds its own small cluster: network namespaces, each
//! with a veth pair and addresses of its own (10.213.X.1 on this side, 10.213.X.2 inside), and
//! Debian's sshd running inside with a host key and a client key generated here. `rmem run
//! --hostfile` then starts its memory servers over real ssh in those namespaces. Traffic goes
//! only to those addresses. A guard removes the namespaces, veths and every process started,
//! also when a test panics. Needs root (CI runs as root); without it, the tests say loudly
//! that they skip.

mod common;
use common::*;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

/// Namespaces made by this test process so far (names and subnets must not collide).
static MADE: AtomicU32 = AtomicU32::new(0);

/// Run a setup command, bounded in time; panic with its output if it fails.
fn sh(args: &[&str]) {
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

/// One namespace: a "host" of the test cluster.
struct Host {
    netns: String,
    veth: String,
    /// The address inside the namespace: the host's name in hosts files.
    addr: String,
    sshd: Option<Child>,
}

/// The test cluster; dropping it removes everything it made.
struct Cluster {
    dir: PathBuf,
    key: PathBuf,
    hosts: Vec<Host>,
}

impl Cluster {
    /// Returns None (after saying why, loudly) where the test cannot run.
    fn new(tag: &str, with_sshd: &[bool]) -> Option<Cluster> {
        if !is_root() {
            // Straight to stderr, past the test harness's capture: a skip must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED multihost::{tag}: network namespaces and sshd need root; \
                 CI runs this as root (scripts/test.sh). Nothing was tested here."
            );
            return None;
        }
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: install openssh-server (scripts/deps.sh does)"
        );
        let dir = scratch(&format!("multihost-{tag}"));
        let mut c = Cluster {
            key: dir.join("client_key"),
            dir,
            hosts: Vec::new(),
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
        for &sshd in with_sshd {
            c.add_host(sshd);
        }
        Some(c)
    }

    fn add_host(&mut self, with_sshd: bool) {
        let pid = std::process::id();
        let k = MADE.fetch_add(1, Ordering::Relaxed);
        let in_use = String::from_utf8(
            Command::new("ip")
                .args(["-o", "addr"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let subnet = (0..200)
            .map(|i| (pid * 7 + k * 13 + i) % 200 + 20)
            .find(|x| !in_use.contains(&format!("10.213.{x}.")))
            .expect("a free 10.213.X.0/24 subnet");
        let host = Host {
            netns: format!("rmem-test-{pid}-{k}"),
            veth: format!("rmv{}x{k}", pid % 100_000),
            addr: format!("10.213.{subnet}.2"),
            sshd: None,
        };
        let peer = format!("{}n", host.veth);
        // Pushed before it exists, so the guard removes whatever part of it gets made.
        self.hosts.push(host);
        let h = self.hosts.last().unwrap();
        let (ns, veth) = (h.netns.clone(), h.veth.clone());
        sh(&["ip", "netns", "add", &ns]);
        sh(&[
            "ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer,
        ]);
        sh(&["ip", "link", "set", &peer, "netns", &ns]);
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("10.213.{subnet}.1/24"),
            "dev",
            &veth,
        ]);
        sh(&["ip", "link", "set", &veth, "up"]);
        sh(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "add",
            &format!("10.213.{subnet}.2/24"),
            "dev",
            &peer,
        ]);
        sh(&["ip", "-n", &ns, "link", "set", &peer, "up"]);
        sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        if with_sshd {
            self.start_sshd(self.hosts.len() - 1);
        }
    }

    fn start_sshd(&mut self, i: usize) {
        let d = &self.dir;
        let (ns, addr) = (self.hosts[i].netns.clone(), self.hosts[i].addr.clone());
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
        self.hosts[i].sshd = Some(child);
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
            for h in &self.hosts {
                let sshd = h.sshd.as_ref().map(|c| c.id());
                for pid in netns_pids(&h.netns) {
                    if Some(pid) != sshd {
                        left.push(format!("{pid} in {}: {}", h.netns, cmdline(pid)));
                    }
                }
            }
            for entry in std::fs::read_dir("/proc").unwrap().flatten() {
                let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                let cmd = cmdline(pid);
                if self.hosts.iter().any(|h| cmd.contains(&h.addr)) {
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

fn netns_pids(ns: &str) -> Vec<u32> {
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

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for h in &mut self.hosts {
            if let Some(mut c) = h.sshd.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            // Anything else still in the namespace (sshd sessions, servers) goes too.
            for pid in netns_pids(&h.netns) {
                // SAFETY: kill by pid; these run in a namespace this test created.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            // Deleting the host end removes its peer; deleting the namespace the rest.
            let _ = Command::new("ip").args(["link", "del", &h.veth]).status();
            let _ = Command::new("ip").args(["netns", "del", &h.netns]).status();
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
    let (a, b) = (&c.hosts[0].addr, &c.hosts[1].addr);
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
    assert!(
        out.stdout.contains("stress: ok") && out.stdout.contains("mismatches=0"),
        "{shown}"
    );
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
    let (a, dead) = (&c.hosts[0].addr, &c.hosts[1].addr);
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
/// veth of one is set down under the verifying stress for longer than the servers' lease,
/// then up again. The program goes on from the other two (no error, no mismatch), gives the
/// partitioned server up, and takes it back once it answers again.
#[test]
fn a_server_partitioned_past_its_lease_is_survived_with_redundancy() {
    const TOKEN: &str = "secret-for-the-partition-test";
    let Some(c) = Cluster::new("partition", &[false, false, false]) else {
        return;
    };
    let servers: Vec<ServerProcess> = c
        .hosts
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
    let veth = c.hosts[0].veth.clone();
    sh(&["ip", "link", "set", &veth, "down"]);
    let down = Instant::now();
    let mut child = child;
    while down.elapsed() < Duration::from_secs(5) && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let cut_while_running = child.try_wait().unwrap().is_none();
    sh(&["ip", "link", "set", &veth, "up"]);
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
    assert!(
        out.stdout.contains("stress: ok") && out.stdout.contains("mismatches=0"),
        "{what}"
    );
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
