//! `rmem nbd`: remote memory as a block device. Starts (or connects to) memory servers as
//! `rmem run` does, serves one NBD export of `--size` bytes from a page cache over them
//! (rmem-nbd), and on SIGINT or SIGTERM finishes the requests in flight, makes every
//! acknowledged write durable, ends its sessions and finalizes the servers it started.

use crate::launch;
use rmem_client::blocks::BlockCache;
use rmem_client::config::{Config, Placement};
use rmem_client::store::cluster::RemoteStore;
use rmem_client::Stats;
use rmem_nbd::proto::{self, Export};
use rmem_nbd::server::{Limits, Listener, Server};
use rmem_proto::size::parse_size;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The NBD port.
const LISTEN_DEFAULT: &str = "127.0.0.1:10809";
/// Largest request accepted (the protocol's customary maximum block size).
const REQUEST_MAX: u32 = 32 << 20;

#[derive(clap::Args, Debug)]
pub struct NbdArgs {
    /// Where the memory servers come from: --servers, --hostfile, --launcher, ...
    #[command(flatten)]
    pub launch: launch::LaunchArgs,
    /// Size of the block device (any size; a last partial block works).
    #[arg(long)]
    pub size: String,
    /// Listen on ADDR:PORT (TCP) [default: 127.0.0.1:10809 unless --socket is given].
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Listen on a Unix socket at PATH (created; removed at exit).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The export's name (clients may also ask for the default export, "").
    #[arg(long, default_value = "rmem")]
    pub name: String,
    /// Local cache: most bytes of the device held in this process at once; writes wait here
    /// until FLUSH, FUA or eviction sends them to the servers.
    #[arg(long, default_value = "256M")]
    pub cache: String,
    /// The unit of caching and of storage on the servers, announced as the preferred block
    /// size: a power of two from 4K to 4M. Requests of any size and alignment work.
    #[arg(long, default_value = "4K")]
    pub block_size: String,
    /// Replacement policy of the cache: adaptive, fifo, history or nru.
    #[arg(long, default_value = rmem_policy::DEFAULT_POLICY)]
    pub policy: String,
    /// Placement of blocks on servers: stripe (round-robin), priority (fill in order) or
    /// free (the most free memory first) [default: stripe; free with --manager].
    #[arg(long)]
    pub placement: Option<String>,
    /// --redundancy (none, replicas:N, ec:K+M, auto), --encrypt, --no-encrypt: as `rmem run`.
    #[command(flatten)]
    pub layout: crate::run_cmd::LayoutArgs,
    /// Requests one connection may have in flight before the server stops reading it.
    #[arg(long, default_value_t = 256)]
    pub requests_max: usize,
    /// Lock rmem nbd's memory, and that of the memory servers it starts on this host, so
    /// that none of it is ever swapped out (mlockall): for a device used as swap on this
    /// node, where a page of rmem nbd swapped out to its own device would wait on itself.
    /// Needs RLIMIT_MEMLOCK unlimited (each local server: its capacity plus 256 MiB), or
    /// CAP_IPC_LOCK (root).
    #[arg(long)]
    pub lock: bool,
    /// Write the statistics as JSON to this file at exit.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Log every connection.
    #[arg(long)]
    pub verbose: bool,
}

/// The write end of the pipe the signal handler wakes the server through.
static STOP_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_stop(_sig: libc::c_int) {
    let fd = STOP_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; the buffer is a valid byte.
        unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
    }
}

/// A pipe whose read end becomes readable on SIGINT or SIGTERM.
fn stop_pipe() -> Result<i32, String> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    STOP_FD.store(fds[1], Ordering::Relaxed);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only calls write(2), which is async-signal-safe.
        unsafe { libc::signal(sig, on_stop as *const () as libc::sighandler_t) };
    }
    Ok(fds[0])
}

struct Checked {
    config: Config,
    size_bytes: u64,
    cache_bytes: u64,
}

fn check(a: &NbdArgs, plan: &launch::Plan) -> Result<Checked, String> {
    let size = |name: &str, v: &str| parse_size(v).map_err(|e| format!("--{name} {v}: {e}"));
    let size_bytes = size("size", &a.size)?;
    if size_bytes == 0 {
        return Err("--size must be more than 0".into());
    }
    let page_size = size("block-size", &a.block_size)? as usize;
    let cache_bytes = size("cache", &a.cache)?;
    let placement = crate::run_cmd::placement(a.placement.as_deref(), plan, Placement::Stripe)?;
    if rmem_policy::by_name(&a.policy).is_none() {
        return Err(format!(
            "--policy {}: known policies are {}",
            a.policy,
            rmem_policy::POLICY_NAMES.join(", ")
        ));
    }
    let redundancy = a.layout.redundancy(plan)?;
    let config = Config {
        local_bytes: cache_bytes,
        page_size,
        policy: a.policy.clone(),
        placement,
        redundancy,
        encrypt: a.layout.encrypt(plan),
        ..Config::default()
    };
    config.validate().map_err(|e| {
        crate::run_cmd::as_options(
            e,
            &[
                ("RMEM_LOCAL", "--cache"),
                ("RMEM_PAGE_SIZE", "--block-size"),
            ],
        )
    })?;
    if a.requests_max == 0 {
        return Err("--requests-max must be at least 1".into());
    }
    Ok(Checked {
        config,
        size_bytes,
        cache_bytes,
    })
}

pub fn run(a: NbdArgs) -> i32 {
    crate::server_cmd::init_log_as("rmem-nbd", a.verbose).ok();
    let mut plan = match launch::Plan::new(&a.launch) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rmem nbd: {e}");
            return 2;
        }
    };
    let mut checked = match check(&a, &plan) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rmem nbd: {e}");
            return 2;
        }
    };
    if a.lock {
        // Before anything is started: a limit too low costs nothing. Children are not locked
        // by this (a fork does not inherit it); the local servers lock themselves.
        let need = crate::lock::Need::Unlimited {
            why: "what it maps grows with its clients' requests, up to 128 MiB a connection",
        };
        if let Err(e) = crate::lock::lock_memory("rmem nbd", need) {
            eprintln!("rmem nbd: {e}");
            return 2;
        }
        plan.lock_local_servers();
        log::info!("memory locked (mlockall), and the servers it starts here lock theirs");
    }
    // Listen before starting anything, so a busy port costs no servers.
    let mut listeners = Vec::new();
    let mut wheres = Vec::new();
    if a.listen.is_some() || a.socket.is_none() {
        let addr = a.listen.as_deref().unwrap_or(LISTEN_DEFAULT);
        match TcpListener::bind(addr) {
            Ok(l) => {
                let local = l.local_addr().map(|x| x.to_string()).unwrap_or(addr.into());
                wheres.push(format!("nbd://{local}/{}", a.name));
                listeners.push(Listener::Tcp(l));
            }
            Err(e) => {
                eprintln!("rmem nbd: cannot listen on {addr}: {e}");
                return 1;
            }
        }
    }
    if let Some(p) = &a.socket {
        let _ = std::fs::remove_file(p);
        match UnixListener::bind(p) {
            Ok(l) => {
                wheres.push(format!("nbd+unix:///{}?socket={}", a.name, p.display()));
                listeners.push(Listener::Unix(l));
            }
            Err(e) => {
                eprintln!("rmem nbd: cannot listen on {}: {e}", p.display());
                return 1;
            }
        }
    }
    let stop = match stop_pipe() {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("rmem nbd: {e}");
            return 1;
        }
    };
    let mut servers = match launch::start(&plan) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rmem nbd: {e}");
            return 1;
        }
    };
    checked.config.servers = servers.iter().map(|s| s.addr.clone()).collect();
    checked.config.token = plan.token.clone().into_bytes();
    checked.config.manager = plan.manager.clone();
    checked.config.max_remote_bytes = plan.max_remote_bytes;
    // The servers are watched while the device serves (a local one that ends is started
    // again, as under `rmem run`), from a thread that ends with serving. That thread also
    // finalizes them: a server it started again has it as the parent whose end sends the
    // server its death signal (PR_SET_PDEATHSIG follows the thread), so it ends only after.
    let serving = std::sync::atomic::AtomicBool::new(true);
    let code = std::thread::scope(|scope| {
        let servers = &mut servers;
        let (plan, serving) = (&plan, &serving);
        scope.spawn(move || {
            let mut watch = launch::Watch::new(servers.len());
            while serving.load(std::sync::atomic::Ordering::Relaxed) {
                watch.check(servers, plan, "rmem nbd");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            launch::finalize_all(servers, launch::FINALIZE_GRACE);
        });
        let code = serve(&a, &checked, listeners, &wheres, stop);
        serving.store(false, std::sync::atomic::Ordering::Relaxed);
        code
    });
    if let Some(p) = &a.socket {
        let _ = std::fs::remove_file(p);
    }
    code
}

fn serve(
    a: &NbdArgs,
    checked: &Checked,
    listeners: Vec<Listener>,
    wheres: &[String],
    stop: i32,
) -> i32 {
    let c = &checked.config;
    let (redundancy, encrypt) = c.layout();
    let mut store = match RemoteStore::from_config(c) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rmem nbd: {}", rmem_client::error_chain(&e));
            return 1;
        }
    };
    // A FLUSH answered means every piece of what it covers is stored, however long a slow
    // server takes to say so: the cache's barriers wait for the store to settle them. Past
    // what may be released, write-backs wait for a slow server rather than be stored a piece
    // short (see there why).
    store.never_store_short();
    use rmem_client::store::PageStore;
    let capacity = store.capacity_bytes();
    if capacity < checked.size_bytes {
        eprintln!(
            "rmem nbd: warning: the memory servers hold {} bytes of blocks ({redundancy}), less \
             than --size {}: writes beyond that fail once they leave the cache",
            capacity, a.size
        );
    }
    let stats = Arc::new(Stats::default());
    let policy = rmem_policy::by_name(&c.policy).expect("checked");
    let mut cache = BlockCache::new(
        Box::new(store),
        policy,
        c.page_size,
        checked.cache_bytes,
        stats.clone(),
    );
    let export = Export {
        name: a.name.clone(),
        description: format!(
            "rmem remote memory on {} ({}{})",
            cache.describe(),
            redundancy,
            if encrypt { ", encrypted" } else { "" }
        ),
        size_bytes: checked.size_bytes,
        flags: proto::SERVED_FLAGS,
        block_min: 1,
        block_preferred: c.page_size as u32,
        block_max: REQUEST_MAX,
    };
    let limits = Limits {
        requests_per_connection_max: a.requests_max,
        spin: c.spin,
        ..Limits::default()
    };
    let mut server = match Server::new(&mut cache, export, limits, listeners) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rmem nbd: {e}");
            return 1;
        }
    };
    let started = Instant::now();
    for w in wheres {
        println!("rmem nbd: serving {} bytes on {w}", checked.size_bytes);
    }
    eprintln!(
        "rmem nbd: cache {} bytes, blocks of {} bytes on {} ({}{})",
        checked.cache_bytes,
        c.page_size,
        c.servers.join(","),
        redundancy,
        if encrypt { ", encrypted" } else { "" }
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let result = server.run(stop);
    drop(server);
    let snap = stats.snapshot(c.page_size, &c.policy);
    if let Some(p) = &a.stats_json {
        if let Err(e) = std::fs::write(p, snap.to_json()) {
            eprintln!("rmem nbd: cannot write {}: {e}", p.display());
        }
    }
    // Dropping the cache ends the sessions, so the servers free the blocks now.
    drop(cache);
    match result {
        Ok(served) => {
            eprintln!(
                "rmem nbd: served {} requests on {} connections in {:.1} s; fetched {:.1} MiB, \
                 wrote back {:.1} MiB, {} servers lost",
                served.requests,
                served.connections,
                started.elapsed().as_secs_f64(),
                snap.bytes_fetched as f64 / (1 << 20) as f64,
                snap.bytes_written_back as f64 / (1 << 20) as f64,
                snap.servers_lost
            );
            0
        }
        Err(e) => {
            eprintln!("rmem nbd: stopped: {}", rmem_client::error_chain(&e));
            rmem_client::EXIT_SERVER_LOST
        }
    }
}
