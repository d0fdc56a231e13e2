//! `rmem server`: a memory server daemon. Its log (the `log` facade) goes to stderr, one line
//! per event: `rmem-server LEVEL message`.

use rmem_proto::pool::{PoolRequest, PoolResponse, ServerBeat, SessionUse};
use rmem_proto::size::parse_size;
use rmem_server::reclaim::{self, Floor, Reclaim};
use rmem_server::{Server, ServerConfig};
use std::io::{BufRead, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on. Loopback unless told otherwise; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Most bytes of pages held for all clients together.
    #[arg(long, default_value = "4G")]
    pub capacity: String,
    /// File holding the shared-secret token (else the RMEM_TOKEN environment variable).
    #[arg(long, conflicts_with = "token_stdin")]
    pub token_file: Option<PathBuf>,
    /// Read the token as the first line of stdin, then exit when stdin reaches EOF (how
    /// `rmem run` starts servers, over ssh too: closing the pipe finalizes the server).
    #[arg(long)]
    pub token_stdin: bool,
    /// Largest frame accepted, in bytes.
    #[arg(long, default_value = "16M")]
    pub frame_max: String,
    /// Seconds a session outlives its last request (a client's heartbeats renew it); then its
    /// pages are freed. Also the longest lease a client may ask for.
    #[arg(long, default_value_t = 30.0)]
    pub lease: f64,
    /// Serve request counts, latencies and the server's status in the Prometheus text format
    /// over plain HTTP on this address (`GET /metrics`). Off unless given.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Lock the server's memory so it is never swapped out (mlockall: what is mapped now and
    /// everything mapped later). RLIMIT_MEMLOCK must allow the capacity plus 256 MiB, unless
    /// the server has CAP_IPC_LOCK.
    #[arg(long)]
    pub lock: bool,
    /// Join the pool of this manager (`rmem manager`): register, then beat every heartbeat
    /// with the capacity, the bytes used and each session's bytes. The manager may come
    /// later, go and come back: the server serves its clients meanwhile.
    #[arg(long, value_name = "HOST:PORT")]
    pub manager: Option<String>,
    /// Where pages are kept: `ram`, or `file:PATH` (a file on local disk or SSD behind a RAM
    /// cache, so the capacity may exceed the node's RAM; a slower tier that a pool fills
    /// after its RAM servers). The file is scratch (unlinked as soon as it is open) unless
    /// `file:PATH,persist`: then pages survive a restart of this server, each session's for
    /// one lease after the restart unless its client reconnects.
    #[arg(long, default_value = "ram", value_name = "ram|file:PATH[,persist]")]
    pub store: String,
    /// RAM for the most recently used pages of a `--store file:` server (0: none).
    #[arg(long, default_value = "64M", value_name = "SIZE")]
    pub store_cache: String,
    /// No loan while in debt: when the node's available memory (the server's memory cgroup
    /// when it runs in a limited one, else MemAvailable) falls below SIZE, or N% of the node's
    /// memory, take no new pages and have the pool's clients move pages off until it is back
    /// above SIZE plus an eighth; meanwhile lend only what keeps it above. Needs --manager.
    #[arg(long, value_name = "SIZE|N%", requires = "manager")]
    pub reclaim_below: Option<String>,
    /// Microseconds a connection's thread polls for the client's next request after
    /// answering one, before it sleeps (each poll that finds nothing gives the CPU to any
    /// other runnable thread, so the spin uses only idle CPU). 0: sleep at once.
    #[arg(long, default_value_t = rmem_server::SPIN_DEFAULT.as_micros() as u64, value_name = "US")]
    pub spin_us: u64,
    /// Log every client disconnect and session end, and debug lines (RMEM_LOG overrides).
    #[arg(long, short)]
    pub verbose: bool,
}

pub fn run(a: ServerArgs) -> i32 {
    match serve(a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rmem server: {e}");
            1
        }
    }
}

/// Prints log records on stderr as `PREFIX LEVEL message` (`rmem-server`, `rmem-nbd`).
struct Logger;

static LOG_PREFIX: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let prefix = LOG_PREFIX.get().copied().unwrap_or("rmem-server");
            eprintln!("{prefix} {:<5} {}", r.level(), r.args());
        }
    }
    fn flush(&self) {}
}

/// Info, or debug with `--verbose`; `RMEM_LOG` (off, error, warn, info, debug, trace) wins.
fn init_log(verbose: bool) -> Result<(), String> {
    init_log_as("rmem-server", verbose)
}

/// [`init_log`] with records printed as `prefix LEVEL message`.
pub(crate) fn init_log_as(prefix: &'static str, verbose: bool) -> Result<(), String> {
    let _ = LOG_PREFIX.set(prefix);
    let level = match std::env::var("RMEM_LOG") {
        Ok(v) => v
            .parse::<log::LevelFilter>()
            .map_err(|_| format!("RMEM_LOG={v}: not off, error, warn, info, debug or trace"))?,
        Err(_) if verbose => log::LevelFilter::Debug,
        Err(_) => log::LevelFilter::Info,
    };
    // A second logger (never in this binary) would be refused; the first one stays.
    let _ = log::set_logger(&Logger);
    log::set_max_level(level);
    Ok(())
}

fn serve(a: ServerArgs) -> Result<(), String> {
    init_log(a.verbose)?;
    let capacity_bytes = parse_size(&a.capacity).map_err(|e| format!("--capacity: {e}"))?;
    let frame = parse_size(&a.frame_max).map_err(|e| format!("--frame-max: {e}"))?;
    let frame_len_max =
        u32::try_from(frame + 64).map_err(|_| "--frame-max: at most 4G".to_string())?;
    if frame < rmem_proto::PAGE_SIZE_MAX as u64 {
        return Err(format!(
            "--frame-max: must hold the largest page ({} bytes)",
            rmem_proto::PAGE_SIZE_MAX
        ));
    }
    if !(a.lease.is_finite() && (0.1..=86400.0).contains(&a.lease)) {
        return Err(format!("--lease: {} is not 0.1 to 86400 seconds", a.lease));
    }
    if a.spin_us > 1_000_000 {
        return Err(format!(
            "--spin-us: {} is over 1000000 (a second)",
            a.spin_us
        ));
    }
    let cache_bytes = parse_size(&a.store_cache).map_err(|e| format!("--store-cache: {e}"))?;
    let store = rmem_server::StoreConfig::parse(&a.store, cache_bytes)
        .map_err(|e| format!("--store: {e}"))?;
    let floor = a
        .reclaim_below
        .as_deref()
        .map(Floor::parse)
        .transpose()
        .map_err(|e| format!("--reclaim-below: {e}"))?;
    let token = token(a.token_file.as_deref(), a.token_stdin)?;
    if a.lock {
        let need = crate::lock::Need::Holding {
            held: "the capacity",
            bytes: capacity_bytes,
        };
        crate::lock::lock_memory("the server", need)?;
        log::info!("memory locked (mlockall): pages are never swapped out");
    }
    let server = Server::bind(ServerConfig {
        listen: a.listen,
        capacity_bytes,
        token: token.clone(),
        frame_len_max,
        lease: std::time::Duration::from_secs_f64(a.lease),
        verbose: a.verbose,
        store: store.clone(),
        spin: std::time::Duration::from_micros(a.spin_us),
    })
    .map_err(|e| rmem_client::error_chain(&e))?;
    let disk = store.on_disk();
    // A server lending more RAM than its node has left is swapped or killed as it fills, and
    // every page it holds goes with it.
    let short = (!disk && floor.is_none())
        .then(|| rmem_server::reclaim::short_of(capacity_bytes))
        .flatten();
    if let Some(m) = short {
        log::warn!(
            "{}: --capacity {} is more than the memory left to this server ({}, {}): as \
             clients fill it the kernel may swap it or kill it, and every page it holds with \
             it; give a smaller --capacity, --reclaim-below to shed pages when the node runs \
             short, or --store file:PATH",
            server.local_addr(),
            rmem_proto::size::format_size(capacity_bytes),
            rmem_proto::size::format_size(m.bytes),
            m.source
        );
    }
    if let Some(addr) = a.metrics {
        let bound = server
            .serve_metrics(addr)
            .map_err(|e| format!("--metrics: {}", rmem_client::error_chain(&e)))?;
        log::info!("{}: metrics on http://{bound}/metrics", server.local_addr());
    }
    if let Some(floor) = floor {
        watch_memory(floor, &server)?;
    }
    if let Some(m) = &a.manager {
        join_pool(m, &server, &token, disk)?;
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "rmem-server listening on {} capacity {capacity_bytes}{}",
        server.local_addr(),
        if disk { " tier disk" } else { "" }
    );
    let _ = out.flush();
    drop(out);
    server.run().map_err(|e| e.to_string())
}

/// The token: from `--token-stdin`, `--token-file`, else `RMEM_TOKEN` (never on a command
/// line). Shared by `rmem server` and `rmem manager`.
pub(crate) fn token(file: Option<&std::path::Path>, stdin: bool) -> Result<Vec<u8>, String> {
    let token = match (file, std::env::var("RMEM_TOKEN")) {
        _ if stdin => token_from_stdin()?,
        (Some(path), _) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read --token-file {}: {e}", path.display()))?
            .trim_end()
            .as_bytes()
            .to_vec(),
        (None, Ok(t)) if !t.is_empty() => t.into_bytes(),
        _ => {
            return Err(
                "no token: give --token-file PATH, --token-stdin, or set RMEM_TOKEN (never on the command line)"
                    .into(),
            );
        }
    };
    if token.is_empty() {
        return Err("the token is empty".into());
    }
    Ok(token)
}

/// `--manager`: register with the pool's manager and beat from a thread for as long as the
/// server runs. A manager that refuses the token is an error now; one that cannot be reached
/// yet is tried again every heartbeat (a server can join at any time, the manager too).
fn join_pool(manager: &str, server: &Server, token: &[u8], disk: bool) -> Result<(), String> {
    use rmem_client::pool::{spawn_beats, ManagerConn, MANAGER_TIMEOUT};
    use rmem_client::store::StoreError;
    let conn = match ManagerConn::connect(manager, token, MANAGER_TIMEOUT) {
        Ok(c) => Some(c),
        Err(e @ StoreError::Manager { .. }) if !e.to_string().contains("cannot connect") => {
            return Err(format!("--manager: {}", rmem_client::error_chain(&e)))
        }
        Err(e) => {
            log::warn!("{}; joining when it answers", rmem_client::error_chain(&e));
            None
        }
    };
    let listen = server.local_addr();
    let state = server.state();
    let node = rmem_proto::pool::node_id();
    // Clients reach this server where the manager does when it listens on every address.
    let beat = move |toward: Option<std::net::IpAddr>| {
        let ip = match toward {
            Some(ip) if listen.ip().is_unspecified() => ip,
            _ => listen.ip(),
        };
        let st = state.status();
        let mut flags = 0;
        if LEAVING.load(Ordering::Relaxed) || DRAIN_ASKED.load(Ordering::Relaxed) {
            flags |= rmem_proto::pool::SERVER_DRAINING;
        }
        if RECLAIMING.load(Ordering::Relaxed) {
            flags |= rmem_proto::pool::SERVER_RECLAIMING;
        }
        if NODE_BORROWS.load(Ordering::Relaxed) {
            flags |= rmem_proto::pool::SERVER_RECLAIMING | rmem_proto::pool::SERVER_NODE_BORROWS;
        }
        if disk {
            flags |= rmem_proto::pool::SERVER_DISK;
        }
        PoolRequest::ServerBeat(ServerBeat {
            addr: std::net::SocketAddr::new(ip, listen.port()).to_string(),
            // What it lends now: less than --capacity while its node is short of memory.
            capacity_bytes: state.lendable_bytes().max(st.used_bytes),
            used_bytes: st.used_bytes,
            flags,
            sessions: st
                .sessions
                .iter()
                .map(|s| SessionUse {
                    session: s.id,
                    bytes: s.used_bytes,
                })
                .collect(),
            node: node.clone(),
        })
    };
    let manager_name = manager.to_string();
    let mut joined = false;
    let lending = server.state();
    let acked = move |r: PoolResponse| {
        let PoolResponse::ServerAck {
            flags,
            heartbeat_ms,
        } = r
        else {
            return;
        };
        HEARTBEAT_MS.store(u64::from(heartbeat_ms), Ordering::Relaxed);
        if !joined {
            log::info!("{listen}: joined the pool of manager {manager_name}");
            joined = true;
        }
        // No loan while in debt: the manager says when a program on this node borrows more
        // from other nodes than this node lends them. A reclaim as for memory, for as long.
        let borrows = flags & rmem_proto::pool::ACK_NODE_BORROWS != 0;
        if NODE_BORROWS.swap(borrows, Ordering::Relaxed) != borrows {
            if borrows {
                log::info!(
                    "{listen}: a program on this node borrows from other nodes: reclaiming \
                     ({} bytes lent: no new pages, the clients move theirs elsewhere)",
                    lending.used_bytes()
                );
            } else {
                log::info!("{listen}: this node no longer borrows: lending again");
            }
        }
        apply_lend_limit(&lending);
        // From now on its own beats say it is leaving: a manager restarted before the drain
        // is done learns it from them, as for a SIGTERM.
        if flags & rmem_proto::pool::ACK_DRAIN != 0 && !DRAIN_ASKED.swap(true, Ordering::Relaxed) {
            log::info!("{listen}: asked to drain: leaving once nothing is left on it");
        }
    };
    // SIGTERM in a pool: leave without loss (a drain), not at once; a second one ends it.
    // SAFETY: the handler only touches an atomic and calls _exit, both async-signal-safe.
    unsafe { libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t) };
    let drained = server.state();
    std::thread::Builder::new()
        .name("rmem-pool-leave".into())
        .spawn(move || leave_when_drained(listen, &drained))
        .map_err(|e| format!("--manager: cannot start the leave thread: {e}"))?;
    spawn_beats(
        conn,
        manager.into(),
        token.to_vec(),
        std::time::Duration::from_secs(1),
        beat,
        acked,
        |m: &str| log::warn!("{m}"),
    )
    .map_err(|e| format!("--manager: cannot start the heartbeat thread: {e}"))
}

/// A server leaving the pool (a SIGTERM, or a drain the manager asked for) exits once
/// nothing has been left on it for two heartbeats in a row (clients see it leave in between,
/// so none is surprised by the closed links), whether or not the manager answers meanwhile:
/// an idle server whose manager is gone still ends on a SIGTERM. One with pages left serves on
/// until its clients have moved them (which they do when the manager tells them).
fn leave_when_drained(listen: std::net::SocketAddr, state: &rmem_server::ServerState) {
    let (mut empty_beats, mut told) = (0, false);
    loop {
        let beat = HEARTBEAT_MS.load(Ordering::Relaxed).clamp(10, 60_000);
        std::thread::sleep(std::time::Duration::from_millis(beat));
        let leaving = LEAVING.load(Ordering::Relaxed);
        if !leaving && !DRAIN_ASKED.load(Ordering::Relaxed) {
            continue;
        }
        if leaving && !told {
            log::info!(
                "{listen}: SIGTERM: leaving the pool once nothing is left on it (its clients \
                 move their pages elsewhere when the manager tells them; a second SIGTERM \
                 ends it at once, losing what it holds)"
            );
            told = true;
        }
        empty_beats = if state.used_bytes() == 0 {
            empty_beats + 1
        } else {
            0
        };
        if empty_beats >= 2 {
            log::info!("{listen}: drained, nothing left on it: exiting");
            std::process::exit(0);
        }
    }
}

/// The pool's heartbeat, as the manager last said (the server's own until it answers).
static HEARTBEAT_MS: AtomicU64 = AtomicU64::new(1000);
/// Set by the first SIGTERM to a server in a pool: its beats say it is draining.
static LEAVING: AtomicBool = AtomicBool::new(false);
/// Set by the manager's first ack that asks for a drain (`rmem pool drain`): its beats say it
/// is draining too, so that the drain outlives the manager. (Not `LEAVING`: a SIGTERM after it
/// starts a leave, it does not end the server at once.)
static DRAIN_ASKED: AtomicBool = AtomicBool::new(false);
/// Set while the node is short of memory (`--reclaim-below`): its beats say it is reclaiming.
static RECLAIMING: AtomicBool = AtomicBool::new(false);
/// What `--reclaim-below` lets the server lend now (`u64::MAX`: no limit of its own).
static MEMORY_LEND_LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);
/// Set while the manager says a program on this node borrows from other nodes (its ack's
/// `ACK_NODE_BORROWS`): the server reclaims as for memory, and its beats say why.
static NODE_BORROWS: AtomicBool = AtomicBool::new(false);

/// Set the server's lend limit from both reasons to lend less: nothing while its node
/// borrows, else what its node's memory allows. Both the reclaim thread and the beat thread
/// call it; the lock keeps one from writing a limit computed before the other's change.
fn apply_lend_limit(state: &rmem_server::ServerState) {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    state.set_lend_limit(if NODE_BORROWS.load(Ordering::Relaxed) {
        0
    } else {
        MEMORY_LEND_LIMIT.load(Ordering::Relaxed)
    });
}

extern "C" fn on_sigterm(_: libc::c_int) {
    if LEAVING.swap(true, Ordering::Relaxed) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(128 + libc::SIGTERM) };
    }
}

/// `--reclaim-below`: read the node's memory every `reclaim::SAMPLE_EVERY` from a thread and
/// lend accordingly (rmem_server::reclaim decides; this applies it). Freed pages must give the
/// node its memory back or a reclaim would never end: slabs are mappings of their own,
/// unmapped when their last page goes (rmem_server::slab), and malloc_trim returns what the
/// heaps keep free while a reclaim goes on.
fn watch_memory(floor: Floor, server: &Server) -> Result<(), String> {
    let first = reclaim::available().map_err(|e| format!("--reclaim-below: {e}"))?;
    let floor_bytes = floor.bytes(first.total_bytes);
    if floor_bytes >= first.total_bytes {
        return Err(format!(
            "--reclaim-below: {floor_bytes} bytes is all the memory of {} ({} bytes)",
            first.source, first.total_bytes
        ));
    }
    log::info!(
        "{}: lending while {} has more than {floor_bytes} bytes available (now {})",
        server.local_addr(),
        first.source,
        first.bytes
    );
    let state = server.state();
    let me = server.local_addr();
    std::thread::Builder::new()
        .name("rmem-reclaim".into())
        .spawn(move || {
            let mut r = Reclaim::new(floor);
            let mut trimmed_at = u64::MAX;
            let mut warned = false;
            loop {
                match reclaim::available() {
                    Ok(a) => {
                        warned = false;
                        let used = state.used_bytes();
                        let d = r.step(a.bytes, a.total_bytes, used);
                        MEMORY_LEND_LIMIT.store(d.lend_limit_bytes, Ordering::Relaxed);
                        apply_lend_limit(&state);
                        let was = RECLAIMING.swap(d.reclaiming, Ordering::Relaxed);
                        let floor_bytes = r.floor.bytes(a.total_bytes);
                        if d.reclaiming && !was {
                            log::info!(
                                "{me}: {} has {} bytes available, below the floor of {floor_bytes}: \
                                 reclaiming ({used} bytes lent: no new pages, the clients move \
                                 theirs elsewhere)",
                                a.source,
                                a.bytes
                            );
                        } else if was && !d.reclaiming {
                            log::info!(
                                "{me}: {} has {} bytes available again: lending again ({used} bytes \
                                 lent)",
                                a.source,
                                a.bytes
                            );
                        }
                        if d.reclaiming && used < trimmed_at {
                            // SAFETY: malloc_trim only returns free heap memory to the system.
                            unsafe { libc::malloc_trim(0) };
                            trimmed_at = used;
                        } else if !d.reclaiming {
                            trimmed_at = u64::MAX;
                        }
                    }
                    Err(e) if !warned => {
                        log::warn!("{me}: --reclaim-below: {e}; lending as before meanwhile");
                        warned = true;
                    }
                    Err(_) => {}
                }
                std::thread::sleep(reclaim::SAMPLE_EVERY);
            }
        })
        .map(drop)
        .map_err(|e| format!("--reclaim-below: cannot start its thread: {e}"))
}

/// The first line of stdin is the token; a thread then exits the process when stdin reaches
/// EOF, so that whoever started the server (rmem run, ssh, srun) stops it by closing the pipe.
fn token_from_stdin() -> Result<Vec<u8>, String> {
    let mut line = String::new();
    let n = std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("--token-stdin: cannot read stdin: {e}"))?;
    if n == 0 {
        return Err("--token-stdin: stdin closed before a token arrived".into());
    }
    std::thread::Builder::new()
        .name("rmem-stdin-eof".into())
        .spawn(|| {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin().lock();
            loop {
                match stdin.read(&mut sink) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            std::process::exit(0);
        })
        .map_err(|e| format!("--token-stdin: cannot start the stdin watcher: {e}"))?;
    Ok(line.trim_end().as_bytes().to_vec())
}
