//! Starting and finalizing memory servers (`rmem run`, `rmem bench`): as local processes, over
//! ssh, with Slurm's `srun`, or not at all (`--launcher none`: servers already running).
//!
//! [`Plan::new`] turns `rmem run`'s options (and a hosts file) into the servers to use and the
//! token; [`start`] starts them all at once and waits for each to report its address. Every
//! server started gets the token on its stdin (never on a command line or in an environment
//! that ssh would have to carry) and exits when its stdin reaches EOF, so closing the pipe
//! finalizes it, also on a remote host at the far end of ssh or srun.

use crate::hostfile::{HostFile, HostLine};
use rmem_proto::size::parse_size;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// ssh's connect timeout unless `--ssh-opts` sets one (ssh keeps the first value it is given).
const SSH_CONNECT_TIMEOUT_S: u32 = 10;
/// Servers started without a hosts file, unless `--servers` says otherwise.
const SERVERS_DEFAULT: usize = 2;
/// Lines of a server's stderr kept to explain a failed start.
const STDERR_TAIL_LINES: usize = 20;
/// How long a server may take to exit after its stdin closes, and again after SIGTERM.
pub const FINALIZE_GRACE: Duration = Duration::from_secs(2);

/// How `rmem run` starts memory servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Launcher {
    /// ssh for other hosts; a local process for this host.
    Ssh,
    /// `srun` on the nodes of the Slurm allocation (or of the hosts file).
    Slurm,
    /// Start nothing: connect to servers already running at the hosts file's host:port.
    None,
}

/// Where the memory servers come from: `rmem run`'s launch options.
#[derive(clap::Args, Debug)]
pub struct LaunchArgs {
    /// Memory servers to start without a hosts file [default: 2 on loopback; with --launcher
    /// slurm, every node of the allocation but this one].
    #[arg(long, conflicts_with = "hostfile")]
    pub servers: Option<usize>,
    /// Capacity of each memory server started without a hosts file.
    #[arg(long, default_value = "4G", conflicts_with = "hostfile")]
    pub server_capacity: String,
    /// DLM hosts file: the local host and memory budget, then `HOST[:PORT] SIZE` per memory
    /// server in priority order. Sets --local unless --local is given.
    #[arg(long, value_name = "FILE")]
    pub hostfile: Option<PathBuf>,
    /// How servers are started.
    #[arg(long, value_enum, default_value = "ssh")]
    pub launcher: Launcher,
    /// Path of the rmem binary on the server hosts [default: this rmem's absolute path].
    #[arg(long, value_name = "PATH")]
    pub remote_rmem: Option<String>,
    /// Extra ssh options, split at whitespace [default: $RMEM_SSH_OPTS]. BatchMode=yes is
    /// always added, and ConnectTimeout=10 unless set here.
    #[arg(long, value_name = "OPTS", allow_hyphen_values = true)]
    pub ssh_opts: Option<String>,
    /// Extra srun options, split at whitespace [default: $RMEM_SRUN_OPTS].
    #[arg(long, value_name = "OPTS", allow_hyphen_values = true)]
    pub srun_opts: Option<String>,
    /// Seconds a server may take to start and report its address.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub start_timeout: u64,
    /// Use a pool: the memory servers come from this pool manager (`rmem manager`), placed by
    /// their free memory, and servers that join later take new pages too. Token from
    /// RMEM_TOKEN or RMEM_TOKEN_FILE.
    #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["servers", "hostfile"])]
    pub manager: Option<String>,
    /// With --manager: the most server memory this program may use (redundancy included);
    /// beyond it, as when every server is full [default: no limit].
    #[arg(long, value_name = "SIZE", requires = "manager")]
    pub max_remote: Option<String>,
}

/// How one server is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    Local,
    Ssh,
    Srun,
    /// Already running; nothing to start or finalize.
    Running,
}

/// One memory server to start (or to connect to).
#[derive(Clone, Debug)]
struct ServerSpec {
    host: HostLine,
    how: How,
}

/// The servers `rmem run` will use, and the token they share.
pub struct Plan {
    servers: Vec<ServerSpec>,
    /// `--manager`: the pool the servers came from (the program follows it).
    pub manager: Option<String>,
    /// `--max-remote`, in bytes.
    pub max_remote_bytes: Option<u64>,
    /// The local memory budget from the hosts file's first line.
    pub local_bytes: Option<u64>,
    /// The hosts file's `redundancy` and `encrypt` lines (the command line's options win).
    pub redundancy: Option<String>,
    pub encrypt: Option<bool>,
    pub token: String,
    local_rmem: PathBuf,
    remote_rmem: String,
    ssh_opts: Vec<String>,
    srun_opts: Vec<String>,
    start_timeout: Duration,
    verbose: bool,
    /// More arguments for each local server (benchmarks: `--manager`, `--store`).
    server_args: Vec<String>,
    /// Servers started on this host lock their memory (`rmem server --lock`).
    lock_local: bool,
}

impl Plan {
    /// Have the servers started on this host lock their memory (`rmem server --lock`): `rmem
    /// nbd --lock`, whose device may be swap on this node, where a swapped-out server page
    /// would wait on the device it backs.
    pub fn lock_local_servers(&mut self) {
        self.lock_local = true;
    }

    /// Check the launch options and resolve them into servers; starts nothing.
    pub fn new(a: &LaunchArgs) -> Result<Plan, String> {
        let local_rmem = rmem_exe()?;
        let opts = |given: &Option<String>, var: &str| -> Vec<String> {
            given
                .clone()
                .or_else(|| std::env::var(var).ok())
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        let hostfile = a
            .hostfile
            .as_deref()
            .map(HostFile::load)
            .transpose()
            .map_err(|e| e.to_string())?;
        // Servers named by a hosts file or the options first: a wrong option there is the
        // error to report, before a missing token. A manager's servers need the token.
        let named = match (&hostfile, &a.manager) {
            (_, Some(_)) => None,
            (Some(h), None) => Some(from_hostfile(h, a.launcher)?),
            (None, None) => Some(without_hostfile(a)?),
        };
        let token = match (a.launcher, &a.manager) {
            (_, Some(_)) => token_from_env("--manager")?,
            (Launcher::None, None) => token_from_env("--launcher none")?,
            _ => fresh_token(),
        };
        let servers = match (named, &a.manager) {
            (Some(servers), _) => servers,
            (None, Some(m)) => from_manager(m, token.as_bytes())?,
            (None, None) => unreachable!("servers are named when there is no manager"),
        };
        let max_remote_bytes = a
            .max_remote
            .as_deref()
            .map(|v| parse_size(v).map_err(|e| format!("--max-remote {v}: {e}")))
            .transpose()?;
        Ok(Plan {
            servers,
            manager: a.manager.clone(),
            max_remote_bytes,
            local_bytes: hostfile.as_ref().map(|h| h.local.bytes),
            redundancy: hostfile.as_ref().and_then(|h| h.redundancy.clone()),
            encrypt: hostfile.as_ref().and_then(|h| h.encrypt),
            token,
            remote_rmem: a
                .remote_rmem
                .clone()
                .unwrap_or_else(|| local_rmem.display().to_string()),
            local_rmem,
            ssh_opts: opts(&a.ssh_opts, "RMEM_SSH_OPTS"),
            srun_opts: opts(&a.srun_opts, "RMEM_SRUN_OPTS"),
            start_timeout: Duration::from_secs(a.start_timeout),
            verbose: std::env::var("RMEM_VERBOSE").is_ok_and(|v| v == "1"),
            server_args: Vec::new(),
            lock_local: false,
        })
    }

    /// How many memory servers the plan starts or names.
    pub fn server_count(&self) -> usize {
        self.servers.len()
    }

    /// `(host, bytes)` of the smallest server, to check against the page size.
    pub fn smallest_server(&self) -> (&str, u64) {
        let s = self
            .servers
            .iter()
            .min_by_key(|s| s.host.bytes)
            .expect("a plan has servers");
        (&s.host.host, s.host.bytes)
    }
}

fn from_hostfile(h: &HostFile, launcher: Launcher) -> Result<Vec<ServerSpec>, String> {
    h.servers
        .iter()
        .map(|line| {
            let how = match launcher {
                Launcher::Ssh if is_this_host(&line.host, &h.local.host) => How::Local,
                Launcher::Ssh => How::Ssh,
                Launcher::Slurm => How::Srun,
                Launcher::None if matches!(line.port, None | Some(0)) => {
                    return Err(format!(
                        "hosts file {}:{}: {}: --launcher none connects to running servers and needs their port (HOST:PORT)",
                        h.path.display(),
                        line.line,
                        line.host
                    ))
                }
                Launcher::None => How::Running,
            };
            Ok(ServerSpec {
                host: line.clone(),
                how,
            })
        })
        .collect()
}

/// The live servers a pool manager offers now (the program asks again itself, and follows
/// the pool from then on): already running, nothing to start.
fn from_manager(manager: &str, token: &[u8]) -> Result<Vec<ServerSpec>, String> {
    use rmem_client::pool::{ManagerConn, MANAGER_TIMEOUT};
    use rmem_proto::pool::{PoolRequest, PoolResponse, ROW_LOST, SERVER_DRAINING};
    let chain = |e: rmem_client::store::StoreError| rmem_client::error_chain(&e);
    let mut conn = ManagerConn::connect(manager, token, MANAGER_TIMEOUT).map_err(chain)?;
    let PoolResponse::StatusOk(st) = conn
        .ask(&PoolRequest::Status, MANAGER_TIMEOUT)
        .map_err(chain)?
    else {
        return Err(format!(
            "pool manager {manager} answered status with something else"
        ));
    };
    let specs: Vec<ServerSpec> = st
        .servers
        .iter()
        .filter(|s| s.flags & (ROW_LOST | SERVER_DRAINING) == 0)
        .filter_map(|s| {
            let (host, port) = s.addr.rsplit_once(':')?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Some(ServerSpec {
                host: HostLine {
                    host: host.to_string(),
                    port: Some(port.parse().ok()?),
                    bytes: s.capacity_bytes.saturating_sub(s.used_bytes),
                    line: 0,
                },
                how: How::Running,
            })
        })
        .collect();
    if specs.is_empty() {
        return Err(format!(
            "pool manager {manager} knows no live memory server (start some with rmem server \
             --manager {manager})"
        ));
    }
    Ok(specs)
}

fn without_hostfile(a: &LaunchArgs) -> Result<Vec<ServerSpec>, String> {
    let capacity = parse_size(&a.server_capacity)
        .map_err(|e| format!("--server-capacity {}: {e}", a.server_capacity))?;
    if a.servers == Some(0) {
        return Err("--servers must be at least 1".into());
    }
    let spec = |host: &str, how| ServerSpec {
        host: HostLine {
            host: host.to_string(),
            port: None,
            bytes: capacity,
            line: 0,
        },
        how,
    };
    match a.launcher {
        Launcher::Ssh => Ok((0..a.servers.unwrap_or(SERVERS_DEFAULT))
            .map(|_| spec("127.0.0.1", How::Local))
            .collect()),
        Launcher::None => {
            Err("--launcher none needs --hostfile naming the running servers' HOST:PORT".into())
        }
        Launcher::Slurm => {
            let list = std::env::var("SLURM_JOB_NODELIST").map_err(|_| {
                "--launcher slurm without --hostfile needs a Slurm allocation \
                 (SLURM_JOB_NODELIST is not set): run it under salloc or sbatch"
                    .to_string()
            })?;
            let me = hostname();
            let nodes: Vec<String> = expand_nodelist(&list)
                .map_err(|e| format!("SLURM_JOB_NODELIST={list}: {e}"))?
                .into_iter()
                .filter(|n| !is_this_host(n, &me))
                .collect();
            let count = a.servers.unwrap_or(nodes.len());
            if count == 0 || nodes.len() < count {
                return Err(format!(
                    "--launcher slurm: {count} memory servers wanted, but the allocation \
                     ({list}) has {} nodes other than this one ({me})",
                    nodes.len()
                ));
            }
            Ok(nodes[..count].iter().map(|n| spec(n, How::Srun)).collect())
        }
    }
}

/// The token of servers started by hand: RMEM_TOKEN, else the file named by RMEM_TOKEN_FILE.
/// `who` opens the message when neither is set.
pub fn token_from_env(who: &str) -> Result<String, String> {
    if let Ok(t) = std::env::var("RMEM_TOKEN") {
        if !t.is_empty() {
            return Ok(t);
        }
    }
    let path = std::env::var("RMEM_TOKEN_FILE").map_err(|_| {
        format!("{who}: set RMEM_TOKEN or RMEM_TOKEN_FILE to the running servers' token")
    })?;
    let t = std::fs::read_to_string(&path)
        .map_err(|e| format!("RMEM_TOKEN_FILE={path}: {e}"))?
        .trim_end()
        .to_string();
    if t.is_empty() {
        return Err(format!("RMEM_TOKEN_FILE={path}: the token is empty"));
    }
    Ok(t)
}

/// This host's name.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Whether `host` names this host: loopback, this host's name (short or full), or `local`, the
/// local host named on a hosts file's first line.
fn is_this_host(host: &str, local: &str) -> bool {
    let short = |h: &str| h.split('.').next().unwrap_or("").to_string();
    let me = hostname();
    matches!(host, "localhost" | "127.0.0.1" | "::1")
        || host == local
        || (!me.is_empty() && (host == me || short(host) == short(&me)))
}

/// Expand a Slurm node list: `node[01-03,07],login1` -> node01 node02 node03 node07 login1.
pub fn expand_nodelist(list: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.extend(expand_name(&list[start..i])?);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.extend(expand_name(&list[start..])?);
    Ok(out)
}

/// One node name with any number of bracketed ranges.
fn expand_name(name: &str) -> Result<Vec<String>, String> {
    let name = name.trim();
    if name.is_empty() {
        return Err("empty node name".into());
    }
    let Some(open) = name.find('[') else {
        if name.contains(']') {
            return Err(format!("{name:?}: ']' without '['"));
        }
        return Ok(vec![name.to_string()]);
    };
    let close = open
        + name[open..]
            .find(']')
            .ok_or_else(|| format!("{name:?}: unclosed '['"))?;
    let (prefix, ranges, rest) = (&name[..open], &name[open + 1..close], &name[close + 1..]);
    let tails = if rest.is_empty() {
        vec![String::new()]
    } else {
        expand_name(rest)?
    };
    let mut out = Vec::new();
    for range in ranges.split(',') {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let bad = || format!("{name:?}: bad range {range:?}");
        let (a, b) = (
            lo.parse::<u64>().map_err(|_| bad())?,
            hi.parse::<u64>().map_err(|_| bad())?,
        );
        if a > b || b - a >= 100_000 {
            return Err(bad());
        }
        for n in a..=b {
            for t in &tails {
                out.push(format!("{prefix}{n:0width$}{t}", width = lo.len()));
            }
        }
    }
    Ok(out)
}

/// Single-quote `s` for a POSIX shell (ssh hands the remote command to one).
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Write one forwarded line in one system call, so that `rmem run` ending meanwhile never
/// leaves half a line (eprintln! writes its pieces separately).
fn say(prefix: &str, line: &str) {
    let _ = std::io::stderr().write_all(format!("{prefix}{line}\n").as_bytes());
}

/// A server's stderr: kept for error messages until it has started, then passed on to ours.
#[derive(Default)]
struct StderrTail {
    /// (forwarding, lines kept while not forwarding)
    state: Mutex<(bool, Vec<String>)>,
}

impl StderrTail {
    fn push(&self, prefix: &str, line: String) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.0 {
            say(prefix, &line);
        } else {
            if s.1.len() == STDERR_TAIL_LINES {
                s.1.remove(0);
            }
            s.1.push(line);
        }
    }

    /// From now on, pass lines on; first the ones kept (ssh warnings and the like).
    fn forward(&self, prefix: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for line in s.1.drain(..) {
            say(prefix, &line);
        }
        s.0 = true;
    }

    fn said(&self) -> String {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1.join(" | ")
    }
}

/// A started server process (local, ssh or srun) and its pipes.
struct Started {
    child: Child,
    /// Holding it open keeps the server alive; dropping it finalizes the server.
    stdin: Option<ChildStdin>,
    stdout_lines: Receiver<String>,
    stderr: Arc<StderrTail>,
    stderr_thread: Option<JoinHandle<()>>,
}

/// A memory server `rmem run` uses: one it started (finalized on drop) or one already running.
pub struct ServerProc {
    /// host:port the client connects to.
    pub addr: String,
    spec: ServerSpec,
    started: Option<Started>,
}

impl fmt::Display for ServerProc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr = if self.addr.is_empty() {
            &self.spec.host.host
        } else {
            &self.addr
        };
        match (&self.started, self.spec.how) {
            (None, _) => write!(f, "{addr} (started by hand)"),
            (Some(s), How::Local) => write!(f, "{addr} (pid {})", s.child.id()),
            (Some(s), How::Ssh) => write!(f, "{addr} (over ssh, pid {})", s.child.id()),
            (Some(s), _) => write!(f, "{addr} (with srun, pid {})", s.child.id()),
        }
    }
}

impl ServerProc {
    /// If the process it runs in (the server, or ssh or srun for it) exited, how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.started.as_mut()?.child.try_wait().ok().flatten()
    }

    /// The process it runs in (the server, or ssh or srun for it), if this started it.
    pub fn pid(&self) -> Option<u32> {
        self.started.as_ref().map(|s| s.child.id())
    }

    /// SIGKILL it now, as a crash would (benchmarks of a server loss). Reaps it.
    pub fn kill(&mut self) {
        if let Some(s) = self.started.as_mut() {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
    }

    /// Close its stdin (the server exits at EOF, remote ones too); if it has not exited
    /// within `grace`, SIGTERM its process group, then SIGKILL it. Always reaps.
    pub fn finalize(&mut self, grace: Duration) {
        let Some(s) = self.started.as_mut() else {
            return;
        };
        drop(s.stdin.take());
        let pgid = s.child.id() as i32;
        if matches!(s.child.try_wait(), Ok(None)) {
            // A server someone stopped (SIGSTOP, a debugger, job control) would read its closed
            // stdin and each signal below only once continued: the grace would pass twice for
            // nothing before the SIGKILL. Continuing a running one changes nothing.
            // SAFETY: signalling the process group of our own child, not reaped yet (so its id
            // cannot have been reused).
            unsafe { libc::kill(-pgid, libc::SIGCONT) };
        }
        if wait_exit(&mut s.child, grace).is_none() {
            // SAFETY: signalling the process group of our own child, which is not reaped yet
            // (so its id cannot have been reused).
            unsafe { libc::kill(-pgid, libc::SIGTERM) };
            if wait_exit(&mut s.child, grace).is_none() {
                // SAFETY: as above.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                let _ = s.child.wait();
            }
        }
        // Pass on the last things it said (the pipe closes once it is gone: over ssh, once the
        // connection is torn down, which takes more than a second on a loaded machine).
        if let Some(t) = s.stderr_thread.take() {
            let end = Instant::now() + Duration::from_secs(5);
            while !t.is_finished() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }

    fn where_(&self) -> String {
        match self.spec.how {
            How::Local => "on this host".to_string(),
            How::Ssh => format!("on {} (over ssh)", self.spec.host.host),
            How::Srun => format!("on {} (with srun)", self.spec.host.host),
            How::Running => format!("at {}", self.spec.host.host),
        }
    }

    /// Wait until the server reports `rmem-server listening on ADDR`, or explain why not.
    /// `deadline` is shared by all servers of one start; `limit` is the bound it came from.
    fn await_address(&mut self, deadline: Instant, limit: Duration) -> Result<(), String> {
        let where_ = self.where_();
        let Some(s) = self.started.as_mut() else {
            return Ok(());
        };
        let mut other = Vec::new();
        let port = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match s.stdout_lines.recv_timeout(left) {
                Ok(line) => match parse_listen_line(&line) {
                    Some(a) => break a.rsplit(':').next().unwrap_or("").to_string(),
                    None => other.push(line.trim_end().to_string()),
                },
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "memory server {where_} did not report its address within {limit:?}{}",
                        said(&s.stderr.said(), &other)
                    ))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Its stdout closed: it exited. Let its last words arrive.
                    let status = wait_exit(&mut s.child, Duration::from_secs(2))
                        .map(|st| format!(" ({st})"))
                        .unwrap_or_default();
                    if let Some(t) = s.stderr_thread.as_ref() {
                        let end = Instant::now() + Duration::from_secs(1);
                        while !t.is_finished() && Instant::now() < end {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                    return Err(format!(
                        "memory server {where_} failed to start{status}{}",
                        said(&s.stderr.said(), &other)
                    ));
                }
            }
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("memory server {where_} reported a bad address"))?;
        self.addr = match self.spec.how {
            How::Local => format!("127.0.0.1:{port}"),
            _ => self.spec.host.addr(port),
        };
        s.stderr.forward(&stderr_prefix(&self.spec));
        Ok(())
    }
}

impl ServerProc {
    /// Start a local server this started, and which has ended, again on the address it had,
    /// so that the program's runtime, which calls lost servers back at their address, finds
    /// it there, empty, and rebuilds on it what its redundancy lost. Only a local one: a
    /// remote host whose server ended may be down, and ssh to it would hold the launcher up.
    pub fn restart(&mut self, plan: &Plan) -> Result<(), String> {
        debug_assert!(self.restartable());
        let port = self.addr.rsplit(':').next().and_then(|p| p.parse().ok());
        let mut spec = self.spec.clone();
        spec.host.port = port;
        let mut again = spawn(plan, &spec)?;
        again.await_address(Instant::now() + plan.start_timeout, plan.start_timeout)?;
        // The old one (reaped already) is dropped here.
        *self = again;
        Ok(())
    }

    /// Whether [`ServerProc::restart`] applies.
    pub fn restartable(&self) -> bool {
        self.spec.how == How::Local && self.started.is_some()
    }
}

/// Times a local server that ends is started again (each time after it ended: a server that
/// keeps dying, say killed by the OOM killer for want of memory, is then left down).
pub const RESTARTS_MAX: u32 = 3;

/// Watches the servers this started while they are used (`rmem run`'s program, `rmem nbd`):
/// says when one ends, and starts a local one again on its address, up to [`RESTARTS_MAX`]
/// times. The client calls lost servers back at their address and rebuilds onto the new,
/// empty one what the loss took from its redundancy, so a long run survives more losses than
/// its redundancy covers at once. (It never mistakes the new server for the old one: a
/// session the server does not hold is a lost server, not an empty one.)
pub struct Watch {
    /// Per server: ended for good (said once), and times started again.
    ended: Vec<bool>,
    restarts: Vec<u32>,
}

impl Watch {
    pub fn new(servers: usize) -> Watch {
        Watch {
            ended: vec![false; servers],
            restarts: vec![0; servers],
        }
    }

    /// Look once; what ended and what was started again goes to stderr, from `who`.
    pub fn check(&mut self, servers: &mut [ServerProc], plan: &Plan, who: &str) {
        let each = servers
            .iter_mut()
            .zip(&mut self.ended)
            .zip(&mut self.restarts);
        for ((s, ended), n) in each {
            if *ended {
                continue;
            }
            let Some(st) = s.exited() else {
                continue;
            };
            let what = format!("memory server {s} ended ({st}) while in use");
            if !s.restartable() || *n == RESTARTS_MAX {
                eprintln!("{who}: {what}");
                *ended = true;
                continue;
            }
            *n += 1;
            match s.restart(plan) {
                Ok(()) => {
                    eprintln!("{who}: {what}; started again as {s} (restart {n} of {RESTARTS_MAX})")
                }
                Err(e) => {
                    eprintln!("{who}: {what}; not started again: {e}");
                    *ended = true;
                }
            }
        }
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.finalize(FINALIZE_GRACE);
    }
}

/// `; it said: ...` from what a failed server printed, or nothing.
fn said(stderr: &str, stdout: &[String]) -> String {
    let mut parts: Vec<&str> = stdout.iter().map(String::as_str).collect();
    if !stderr.is_empty() {
        parts.push(stderr);
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("; it said: {}", parts.join(" | "))
    }
}

/// What a remote server's forwarded stderr lines start with: the host they come from.
fn stderr_prefix(spec: &ServerSpec) -> String {
    match spec.how {
        How::Local => String::new(),
        _ => format!("{}: ", spec.host.host),
    }
}

/// Wait up to `limit` for `child` to exit.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Start every server of `plan` at once, then wait for each to report its address. On any
/// failure, the error names the host (with what it or ssh said), and the servers already
/// started are finalized (dropped) before this returns.
pub fn start(plan: &Plan) -> Result<Vec<ServerProc>, String> {
    let mut procs = Vec::with_capacity(plan.servers.len());
    let deadline = Instant::now() + plan.start_timeout;
    let mut result = Ok(());
    for spec in &plan.servers {
        match spawn(plan, spec) {
            Ok(p) => procs.push(p),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    for p in procs.iter_mut() {
        if result.is_err() {
            break;
        }
        result = p.await_address(deadline, plan.start_timeout);
    }
    match result {
        Ok(()) => Ok(procs),
        Err(e) => {
            finalize_all(&mut procs, FINALIZE_GRACE);
            Err(e)
        }
    }
}

/// Finalize every server; all stdins are closed first, so remote servers stop in parallel.
pub fn finalize_all(servers: &mut [ServerProc], grace: Duration) {
    for s in servers.iter_mut() {
        if let Some(started) = s.started.as_mut() {
            drop(started.stdin.take());
        }
    }
    for s in servers.iter_mut() {
        s.finalize(grace);
    }
}

/// The command that runs one server: rmem itself, or ssh or srun running it on its host.
fn server_command(plan: &Plan, spec: &ServerSpec) -> Command {
    let any = if spec.host.host.contains(':') {
        "[::]"
    } else {
        "0.0.0.0"
    };
    let listen = match spec.how {
        How::Local => "127.0.0.1",
        _ => any,
    };
    let mut args = vec![
        "server".to_string(),
        "--listen".into(),
        format!("{listen}:{}", spec.host.port.unwrap_or(0)),
        "--capacity".into(),
        spec.host.bytes.to_string(),
        "--token-stdin".into(),
    ];
    if plan.verbose {
        args.push("--verbose".into());
    }
    args.extend(plan.server_args.iter().cloned());
    if plan.lock_local && spec.how == How::Local {
        args.push("--lock".into());
    }
    match spec.how {
        How::Local => {
            let mut c = Command::new(&plan.local_rmem);
            c.args(&args);
            c
        }
        How::Ssh => {
            let mut c = Command::new("ssh");
            c.args(["-T", "-o", "BatchMode=yes"])
                .args(&plan.ssh_opts)
                .args(["-o", &format!("ConnectTimeout={SSH_CONNECT_TIMEOUT_S}")])
                .arg(&spec.host.host);
            // ssh joins its arguments into one string for the remote shell: quote each.
            let remote: Vec<String> = std::iter::once(plan.remote_rmem.as_str())
                .chain(args.iter().map(String::as_str))
                .map(shell_quote)
                .collect();
            c.arg(remote.join(" "));
            c
        }
        How::Srun => {
            let mut c = Command::new("srun");
            c.args(["--nodes=1", "--ntasks=1", "-w", &spec.host.host])
                .args(&plan.srun_opts)
                .arg(&plan.remote_rmem)
                .args(&args);
            c
        }
        How::Running => unreachable!("servers started by hand are not started"),
    }
}

/// Start one server's process and hand it the token; returns before it reports its address.
fn spawn(plan: &Plan, spec: &ServerSpec) -> Result<ServerProc, String> {
    let mut proc_ = ServerProc {
        addr: String::new(),
        spec: spec.clone(),
        started: None,
    };
    if spec.how == How::Running {
        proc_.addr = spec.host.addr(spec.host.port.expect("checked in the plan"));
        return Ok(proc_);
    }
    let mut cmd = server_command(plan, spec);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure only calls async-signal-safe functions (setpgid, prctl).
    unsafe {
        cmd.pre_exec(|| {
            // Own process group: a Ctrl-C for the program does not kill the servers (or their
            // ssh) under it; the launcher finalizes them after the program is gone.
            libc::setpgid(0, 0);
            // If the launcher dies without finalizing, they follow it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd.spawn().map_err(|e| {
        format!(
            "cannot start a memory server {}: cannot run {program}: {e}",
            proc_.where_()
        )
    })?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    // A server that died at once shows up as a missing address line, with its reason.
    let _ = writeln!(stdin, "{}", plan.token).and_then(|()| stdin.flush());
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr_pipe = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Every line until the address goes to the launcher; then keep draining so the server
        // never blocks on a full pipe.
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
            if tx.send(std::mem::take(&mut line)).is_err() {
                let _ = std::io::copy(&mut r, &mut std::io::sink());
                return;
            }
        }
    });
    let stderr = Arc::new(StderrTail::default());
    let tail = stderr.clone();
    let prefix = stderr_prefix(spec);
    let stderr_thread = std::thread::spawn(move || {
        let mut r = BufReader::new(stderr_pipe);
        let mut buf = Vec::new();
        while r.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            let line = String::from_utf8_lossy(&buf).trim_end().to_string();
            tail.push(&prefix, line);
            buf.clear();
        }
        let _ = r.read_to_end(&mut buf);
    });
    proc_.started = Some(Started {
        child,
        stdin: Some(stdin),
        stdout_lines: rx,
        stderr,
        stderr_thread: Some(stderr_thread),
    });
    Ok(proc_)
}

/// The benchmarks' binary (crates/rmem-bench), installed beside `rmem`, which runs it as
/// `rmem bench`.
pub const BENCH_BIN: &str = "rmem-bench";

/// The `rmem` executable that local servers run as (`rmem server`): this program, unless it
/// is [`BENCH_BIN`], which starts them with the `rmem` beside it.
pub fn rmem_exe() -> Result<PathBuf, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the rmem executable: {e}"))?;
    if exe.file_name().is_some_and(|n| n != BENCH_BIN) {
        return Ok(exe);
    }
    let rmem = exe.with_file_name("rmem");
    if rmem.is_file() {
        Ok(rmem)
    } else {
        Err(format!("there is no rmem beside {}", exe.display()))
    }
}

/// A fresh random token, hex-encoded.
pub fn fresh_token() -> String {
    let mut b = [0u8; 32];
    // SAFETY: getrandom fills the buffer we own.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    assert_eq!(n, b.len() as isize, "getrandom failed");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Start `count` servers on loopback, each with `capacity` bytes, sharing `token`. On any
/// failure the ones started are finalized.
pub fn start_local_servers(
    count: usize,
    capacity: u64,
    token: &str,
) -> Result<Vec<ServerProc>, String> {
    start_local_servers_with(count, capacity, token, &[])
}

/// [`start_local_servers`] with `args` added to each server's command line (`--manager M`,
/// `--store file:PATH`, ...).
pub fn start_local_servers_with(
    count: usize,
    capacity: u64,
    token: &str,
    args: &[String],
) -> Result<Vec<ServerProc>, String> {
    let local_rmem = rmem_exe()?;
    let spec = ServerSpec {
        host: HostLine {
            host: "127.0.0.1".into(),
            port: None,
            bytes: capacity,
            line: 0,
        },
        how: How::Local,
    };
    start(&Plan {
        servers: vec![spec; count],
        manager: None,
        max_remote_bytes: None,
        local_bytes: None,
        redundancy: None,
        encrypt: None,
        token: token.to_string(),
        remote_rmem: local_rmem.display().to_string(),
        local_rmem,
        ssh_opts: Vec::new(),
        srun_opts: Vec::new(),
        start_timeout: Duration::from_secs(10),
        verbose: false,
        server_args: args.to_vec(),
        lock_local: false,
    })
}

/// `rmem-server listening on ADDR ...` -> ADDR.
pub fn parse_listen_line(line: &str) -> Option<String> {
    line.strip_prefix("rmem-server listening on ")?
        .split_whitespace()
        .next()
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_slurm_node_lists() {
        let e = |s: &str| expand_nodelist(s).unwrap();
        assert_eq!(
            e("node[01-03,07]"),
            ["node01", "node02", "node03", "node07"]
        );
        assert_eq!(e("login1,gpu[8-10]"), ["login1", "gpu8", "gpu9", "gpu10"]);
        assert_eq!(
            e("r[1-2]n[09-10],x"),
            ["r1n09", "r1n10", "r2n09", "r2n10", "x"]
        );
        assert_eq!(e("127.0.0.[1-2]"), ["127.0.0.1", "127.0.0.2"]);
        for bad in ["", "node[1-", "node[3-1]", "node[a]", "n]", "a,,b"] {
            assert!(expand_nodelist(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn quotes_for_the_remote_shell() {
        assert_eq!(shell_quote("/opt/rmem"), "'/opt/rmem'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn loopback_and_the_first_line_are_this_host() {
        assert!(is_this_host("localhost", "calhost"));
        assert!(is_this_host("127.0.0.1", "calhost"));
        assert!(is_this_host("calhost", "calhost"));
        assert!(is_this_host(&hostname(), "calhost"));
        assert!(!is_this_host("10.213.0.2", "calhost"));
    }
}
