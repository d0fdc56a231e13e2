//! `rmem run`: start memory servers, run a program on them, finalize, report.

use crate::launch::{self, ServerProc};
use rmem_client::config::{Config, Placement};
use rmem_proto::size::{format_size, parse_size};
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Where the memory servers come from: --servers, --hostfile, --launcher, ...
    #[command(flatten)]
    pub launch: launch::LaunchArgs,
    /// Local memory budget: most bytes of remote memory resident at once [default: the hosts
    /// file's first line, else 1G].
    #[arg(long)]
    pub local: Option<String>,
    /// The DLM page size, the unit of paging: a power of two from 4K to 4M.
    #[arg(long, default_value = "64K")]
    pub page_size: String,
    /// Replacement policy: adaptive, fifo, history or nru (docs/configuration.md).
    #[arg(long, default_value = rmem_policy::DEFAULT_POLICY)]
    pub policy: String,
    /// Placement of pages on servers: priority (fill in order), stripe (round-robin) or free
    /// (the most free memory first) [default: priority; free with --manager].
    #[arg(long)]
    pub placement: Option<String>,
    /// Only explicit allocations (rmem_alloc, dlm_alloc) go remote; without it, every
    /// allocation of at least --min-alloc bytes does (transparent mode, through LD_PRELOAD).
    #[arg(long)]
    pub api: bool,
    /// Transparent mode: smallest allocation that goes remote (0: every allocation).
    #[arg(long, default_value = "64K")]
    pub min_alloc: String,
    /// Transparent mode: also serve the program's private anonymous read-write mappings of at
    /// least --min-alloc bytes (CPython's object arenas, ...) from remote memory.
    #[arg(long)]
    pub anon_mmap: bool,
    /// Write the statistics as JSON to this file.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// `history` policy: share of the swap-in history excluded after a page's previous
    /// swap-in (the paper's reflecting history ratio).
    #[arg(long, default_value_t = 0.20)]
    pub history_ratio: f64,
    /// Record the page reference string to FILE (see docs/configuration.md): pages stay in
    /// the program's own memory, only a few mapped at once, so every change of page is seen.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Prefetch ahead of sequential and strided fault streams: on or off.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub prefetch: String,
    /// Fetch a read fault's 4 KiB piece alone where no stream of faults reaches it (random
    /// access), the rest of the page only when more of it is wanted: on or off. Works under
    /// every layout, sealed ones too where K of `ec:K+M` divides the page's 4 KiB pieces (a
    /// sealed piece is read and checked alone); elsewhere pages are fetched whole.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub sub_page: String,
    /// Strict accounting: an allocation beyond the servers' capacity fails (malloc and
    /// rmem_alloc return NULL) instead of taking capacity only when its pages are written
    /// back (overcommit, the default).
    #[arg(long)]
    pub no_overcommit: bool,
    /// Page the program's child processes too (a shell's commands, a script's subprocesses):
    /// each process that loads librmem runs its own runtime with its own budget of --local.
    /// Without it only the program rmem run starts is paged, and its children run as they
    /// would without rmem.
    #[arg(long)]
    pub children: bool,
    /// --redundancy, --encrypt, --no-encrypt.
    #[command(flatten)]
    pub layout: LayoutArgs,
    /// The program and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub program: Vec<String>,
}

/// How pages are kept on the servers: `rmem run`'s and `rmem nbd`'s options.
#[derive(clap::Args, Debug)]
pub struct LayoutArgs {
    /// How each page is kept: none (one server), replicas:N (N servers), ec:K+M (K data and M
    /// parity fragments on K+M servers), or auto: ec:K+1 with K = servers - 1 up to 4 (the
    /// largest of those dividing the page's 4 KiB pieces: 2 on four servers at 64 KiB pages)
    /// when there are 3 servers or more, else none (docs/configuration.md).
    #[arg(long, default_value = "auto")]
    pub redundancy: String,
    /// Encrypt and authenticate pages with a key made in the program and never sent
    /// (default: whenever a server is not on loopback).
    #[arg(long, conflicts_with = "no_encrypt")]
    pub encrypt: bool,
    /// Do not encrypt pages, even to servers off loopback (pages are still checked when kept
    /// on more than one server).
    #[arg(long)]
    pub no_encrypt: bool,
}

impl LayoutArgs {
    /// The redundancy asked for (None: auto): `--redundancy` unless left at auto, else the
    /// hosts file's `redundancy` line; checked against the number of servers.
    pub fn redundancy(
        &self,
        plan: &launch::Plan,
    ) -> Result<Option<rmem_client::store::codec::Redundancy>, String> {
        let spec = match (self.redundancy.as_str(), &plan.redundancy) {
            ("auto", None) => return Ok(None),
            ("auto", Some(r)) => r.as_str(),
            (r, _) => r,
        };
        let servers = plan.server_count();
        let r = rmem_client::store::codec::Redundancy::parse(spec)
            .map_err(|e| format!("--redundancy {e}"))?;
        if r.width() > servers {
            return Err(format!(
                "--redundancy {r} puts each page on {} servers; there are {servers} (--servers N)",
                r.width(),
            ));
        }
        Ok(Some(r))
    }

    /// Encryption asked for (None: auto): the options, else the hosts file's `encrypt` line.
    pub fn encrypt(&self, plan: &launch::Plan) -> Option<bool> {
        match (self.encrypt, self.no_encrypt) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => plan.encrypt,
        }
    }
}

/// Exit status when rmem itself cannot run the program.
const EXIT_USAGE: i32 = 2;

static CHILD_PID: AtomicI32 = AtomicI32::new(0);
/// The last signal `rmem run` was sent (0: none since it was taken).
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::Relaxed);
    let pid = CHILD_PID.load(Ordering::Relaxed);
    // SIGINT from a terminal already reached the program (same process group); forward the
    // others, which were sent to rmem alone.
    if pid > 0 && sig != libc::SIGINT {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

fn status_code(s: ExitStatus) -> i32 {
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

fn describe(s: ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (_, Some(sig)) => format!("signal {sig}"),
        _ => "unknown status".into(),
    }
}

/// `--placement`: as given, else `free` in a pool (`--manager`), else `default`.
pub fn placement(
    given: Option<&str>,
    plan: &launch::Plan,
    default: Placement,
) -> Result<Placement, String> {
    Ok(match given {
        None if plan.manager.is_some() => Placement::Free,
        None => default,
        Some("priority") => Placement::Priority,
        Some("stripe" | "round-robin") => Placement::Stripe,
        Some("free") => Placement::Free,
        Some(p) => {
            return Err(format!(
                "--placement {p}: expected priority, stripe or free"
            ))
        }
    })
}

/// A configuration error in the words of the command's options (`names`: each variable the
/// check names, with the option that set it), not of the environment `rmem run` passes on.
pub(crate) fn as_options(e: rmem_client::config::ConfigError, names: &[(&str, &str)]) -> String {
    use rmem_client::config::ConfigError;
    match &e {
        ConfigError::Invalid { var, value, reason } => match names.iter().find(|(v, _)| v == var) {
            Some((_, option)) => format!("{option} {value}: {reason}"),
            None => e.to_string(),
        },
        _ => e.to_string(),
    }
}

/// Parse and check the configuration before starting anything.
fn check(args: &RunArgs, plan: &launch::Plan) -> Result<Config, String> {
    let size = |name: &str, v: &str| parse_size(v).map_err(|e| format!("--{name} {v}: {e}"));
    let placement = placement(args.placement.as_deref(), plan, Placement::Priority)?;
    args.layout.redundancy(plan)?;
    if rmem_policy::by_name(&args.policy).is_none() {
        return Err(format!(
            "--policy {}: known policies are {}",
            args.policy,
            rmem_policy::POLICY_NAMES.join(", ")
        ));
    }
    let c = Config {
        local_bytes: match (&args.local, plan.local_bytes) {
            (Some(l), _) => size("local", l)?,
            (None, Some(b)) => b,
            (None, None) => size("local", "1G")?,
        },
        page_size: size("page-size", &args.page_size)? as usize,
        policy: args.policy.clone(),
        placement,
        policy_params: rmem_policy::PolicyParams {
            history_ratio: args.history_ratio,
            ..Default::default()
        },
        ..Config::default()
    };
    c.validate().map_err(|e| {
        as_options(
            e,
            &[
                ("RMEM_LOCAL", "--local"),
                ("RMEM_PAGE_SIZE", "--page-size"),
                ("RMEM_HISTORY_RATIO", "--history-ratio"),
            ],
        )
    })?;
    let (host, cap) = plan.smallest_server();
    if cap < c.page_size as u64 && plan.manager.is_none() {
        return Err(format!(
            "the memory server on {host} would hold {cap} bytes: less than one page"
        ));
    }
    Ok(c)
}

/// A warning when the budget is more than the memory left to the program on this node (or in
/// its cgroup, as a batch job's): the kernel would swap the program, or kill it, before rmem
/// had to page anything, which is what rmem is there to prevent.
fn budget_warning(local_bytes: u64, from: &str) -> Option<String> {
    let a = rmem_server::reclaim::short_of(local_bytes)?;
    Some(format!(
        "warning: the local budget ({}, {from}) is more than the memory left to this program \
         ({}, {}): the kernel may swap the program or kill it before rmem pages anything; give \
         --local a size under that",
        format_size(local_bytes),
        format_size(a.bytes),
        a.source
    ))
}

pub fn run(args: RunArgs) -> i32 {
    let plan = match launch::Plan::new(&args.launch) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rmem run: {e}");
            return EXIT_USAGE;
        }
    };
    let config = match check(&args, &plan) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rmem run: {e}");
            return EXIT_USAGE;
        }
    };
    let from = match (&args.local, plan.local_bytes) {
        (Some(_), _) => "--local",
        (None, Some(_)) => "the hosts file's first line",
        (None, None) => "the default",
    };
    if let Some(w) = budget_warning(config.local_bytes, from) {
        eprintln!("rmem run: {w}");
    }
    let min_alloc = match parse_size(&args.min_alloc) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("rmem run: --min-alloc {}: {e}", args.min_alloc);
            return EXIT_USAGE;
        }
    };
    let preload = if args.api {
        None
    } else {
        match librmem_path() {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("rmem run: {e}");
                return EXIT_USAGE;
            }
        }
    };
    // The dynamic loader is what loads librmem (LD_PRELOAD): a statically linked program runs
    // without it, unpaged. Said before the run, which may be long, and again at its end.
    let unloadable = preload
        .as_ref()
        .and_then(|_| statically_linked(&args.program[0]));
    if let Some(why) = &unloadable {
        eprintln!("rmem: {why}");
    }
    let tmp = std::env::temp_dir().join(format!(
        "rmem-run-{}-{}",
        std::process::id(),
        &launch::fresh_token()[..8]
    ));
    let stats_path = match &args.stats_json {
        // Absolute: the program's child processes write theirs beside it (STATS.PID) from
        // wherever they run, and a bare file name has no directory to look for them in.
        // Made here, so that a file that cannot be written fails the run before the program
        // starts, not at its end (where the summary would take the missing file for a program
        // that paged nothing).
        Some(p) => match std::path::absolute(p).and_then(|a| {
            std::fs::File::create(&a)?;
            Ok(a)
        }) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("rmem run: --stats-json {}: {e}", p.display());
                return 1;
            }
        },
        None => {
            if let Err(e) = std::fs::create_dir_all(&tmp) {
                eprintln!("rmem run: cannot create {}: {e}", tmp.display());
                return 1;
            }
            tmp.join("stats.json")
        }
    };
    let token = &plan.token;
    let mut servers = match launch::start(&plan) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rmem run: {e}");
            let _ = std::fs::remove_dir_all(&tmp);
            return 1;
        }
    };
    let _ = std::fs::remove_file(&stats_path);
    // A child's statistics of an earlier run to the same --stats-json would be counted as this
    // run's, and the servers it said it started without would not be said again.
    for old in children_stats(&stats_path) {
        let _ = std::fs::remove_file(old);
    }
    let told = rmem_client::store::cluster::told_path(&stats_path);
    let _ = std::fs::remove_file(&told);
    let addrs: Vec<&str> = servers.iter().map(|s| s.addr.as_str()).collect();
    let mut cmd = Command::new(&args.program[0]);
    cmd.args(&args.program[1..])
        .env("RMEM_SERVERS", addrs.join(","))
        .env("RMEM_TOKEN", token)
        .env("RMEM_LOCAL", config.local_bytes.to_string())
        .env("RMEM_PAGE_SIZE", config.page_size.to_string())
        .env("RMEM_POLICY", &config.policy)
        .env("RMEM_PLACEMENT", config.placement.name())
        .env("RMEM_STATS_JSON", &stats_path)
        .env("RMEM_RUN_PID", std::process::id().to_string())
        .env("RMEM_CHILDREN", if args.children { "1" } else { "0" })
        .env(
            "RMEM_HISTORY_RATIO",
            config.policy_params.history_ratio.to_string(),
        )
        .env("RMEM_PREFETCH", &args.prefetch)
        .env("RMEM_SUB_PAGE", &args.sub_page)
        .env(
            "RMEM_OVERCOMMIT",
            if args.no_overcommit { "0" } else { "1" },
        )
        .env(
            "RMEM_REDUNDANCY",
            // Checked by check() already.
            args.layout
                .redundancy(&plan)
                .ok()
                .flatten()
                .map_or("auto".into(), |r| r.to_string()),
        )
        .env(
            "RMEM_ENCRYPT",
            match args.layout.encrypt(&plan) {
                Some(true) => "1",
                Some(false) => "0",
                None => "auto",
            },
        );
    if let Some(m) = &plan.manager {
        // The program asks the manager itself, and follows the pool from then on.
        cmd.env("RMEM_MANAGER", m);
        match plan.max_remote_bytes {
            Some(b) => cmd.env("RMEM_MAX_REMOTE", b.to_string()),
            None => cmd.env_remove("RMEM_MAX_REMOTE"),
        };
    } else {
        cmd.env_remove("RMEM_MANAGER");
    }
    match &preload {
        None => {
            cmd.env("RMEM_MODE", "api");
        }
        Some(lib) => {
            let old = std::env::var("LD_PRELOAD").unwrap_or_default();
            let new = if old.is_empty() {
                lib.display().to_string()
            } else {
                format!("{}:{old}", lib.display())
            };
            cmd.env("RMEM_MODE", "transparent")
                .env("RMEM_MIN_ALLOC", min_alloc.to_string())
                .env("LD_PRELOAD", new);
            if args.anon_mmap {
                cmd.env("RMEM_ANON_MMAP", "1");
            }
        }
    }
    if let Some(t) = &args.trace {
        let abs = std::path::absolute(t).unwrap_or_else(|_| t.clone());
        cmd.env("RMEM_TRACE", abs);
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.to_path_buf()))
    {
        // So that a program linked with -lrmem finds the librmem.so beside this rmem.
        let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
        let new = if old.is_empty() {
            dir.display().to_string()
        } else {
            format!("{}:{old}", dir.display())
        };
        cmd.env("LD_LIBRARY_PATH", new);
    }
    // SAFETY: the closure calls only async-signal-safe functions.
    unsafe {
        cmd.pre_exec(|| {
            // The program should die with us rather than run on without its servers.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rmem run: cannot run {}: {e}", args.program[0]);
            return 127;
        }
    };
    CHILD_PID.store(child.id() as i32, Ordering::Relaxed);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: installing a handler that only calls async-signal-safe functions.
        unsafe { libc::signal(sig, forward_signal as *const () as libc::sighandler_t) };
    }
    let started = Instant::now();
    // One watch for the program's run and the wait for its children: a server said ended
    // once is not said again, and its restarts are counted across both.
    let mut watch = launch::Watch::new(servers.len());
    let (status, peak) = wait_watching(&mut child, &mut servers, &plan, &mut watch);
    let elapsed = started.elapsed();
    // Its pid may be reused from now on.
    CHILD_PID.store(0, Ordering::Relaxed);
    if args.children {
        wait_for_paged_children(
            &args.program[0],
            &stats_path,
            &mut servers,
            &plan,
            &mut watch,
        );
    }
    launch::finalize_all(&mut servers, launch::FINALIZE_GRACE);
    let children = children_summary(&stats_path, args.stats_json.is_some());
    let stats = std::fs::read_to_string(&stats_path).ok();
    // Written when the runtime started and not again at the program's exit.
    let incomplete = stats
        .as_deref()
        .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
        .is_some_and(|v| v["complete"] == false);
    // The runtime's own fatal exits (69: servers lost or a failed start; 71: its descriptor
    // closed) have said why.
    let rmem_exit = matches!(
        status.code(),
        Some(rmem_client::EXIT_SERVER_LOST | rmem_client::runtime::EXIT_DESCRIPTOR_LOST)
    );
    match stats {
        Some(json) if !incomplete => {
            eprintln!("{}", summary(&json, elapsed));
            let v = serde_json::from_str(&json).unwrap_or_default();
            // Paged children's resident sets are in the peak, each within a budget of its own.
            if let Some(line) = peak
                .filter(|_| preload.is_some() && !args.children && children.is_none())
                .and_then(|p| unpaged(p, config.local_bytes, &args.min_alloc, args.anon_mmap, &v))
            {
                eprintln!("{line}");
            }
        }
        // A program ended by a signal had no exit to write them at: say that, not that
        // nothing was paged.
        _ if preload.is_some() && status.signal().is_some() => eprintln!(
            "rmem: no statistics: {} was ended by {} before it could write them",
            args.program[0],
            describe(status)
        ),
        _ if rmem_exit || children.is_some() || preload.is_none() => {}
        // Shells end so (dash calls _exit), and so does one that execs a program the library
        // is not loaded into (`bash -c ./static`: the exec'd program is the same process, and
        // a dynamically linked one would have written the statistics at its exit).
        Some(_) => eprintln!(
            "rmem: no statistics: {} ended without running its exit handlers (it called _exit \
             or _Exit, where the runtime writes them, or it exec'd a program rmem's library is \
             not loaded into: a statically linked one, as Go builds without cgo){}",
            args.program[0],
            children_note(args.children)
        ),
        // The runtime starts at the program's first allocation of --min-alloc or more: without
        // a file from it nothing was paged, which a user who asked for a budget should hear
        // about.
        None if unloadable.is_some() => eprintln!(
            "rmem: nothing was paged: {} is statically linked (see above)",
            args.program[0]
        ),
        None => eprintln!(
            "rmem: nothing was paged: {} made no allocation of --min-alloc ({}) or more{}",
            args.program[0],
            args.min_alloc,
            children_note(args.children)
        ),
    }
    if let Some(line) = children {
        eprintln!("{line}");
    }
    if args.stats_json.is_none() {
        let _ = std::fs::remove_dir_all(&tmp);
    } else {
        let _ = std::fs::remove_file(&told);
    }
    let code = status_code(status);
    if !status.success() {
        eprintln!(
            "rmem run: {} ended with {}",
            args.program[0],
            describe(status)
        );
    }
    code
}

/// Why rmem's library cannot be loaded into `program` (found as execvp would), when it is an
/// ELF executable with no program interpreter: statically linked, the dynamic loader never
/// runs and LD_PRELOAD is not read. None for a dynamic executable, a script, or a file that
/// cannot be read (the run says what is wrong with it).
fn statically_linked(program: &str) -> Option<String> {
    let path = if program.contains('/') {
        PathBuf::from(program)
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join(program))
            .find(|p| p.is_file())?
    };
    // The headers: the ELF header, and the program headers' table right after it.
    let mut elf = Vec::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(64 << 10).read_to_end(&mut elf))
        .ok()?;
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(elf.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    // 64-bit little-endian ELF (x86_64, the only target): the program headers' table.
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(0x20)? as usize, u16_at(0x36)?, u16_at(0x38)?);
    const PT_INTERP: u32 = 3;
    let interp = (0..phnum as usize)
        .map(|i| u32_at(phoff + i * phentsize as usize))
        .collect::<Option<Vec<u32>>>()?
        .contains(&PT_INTERP);
    (!interp).then(|| {
        format!(
            "{program} is statically linked: rmem's library cannot be loaded into it, so none of \
             its memory is paged (a Go program is linked so unless it uses cgo: build it with \
             CGO_ENABLED=1 and `-ldflags=-linkmode=external`, and run it with --anon-mmap)"
        )
    })
}

/// librmem.so (which transparent mode preloads and `rmem cc` links): beside this rmem binary, or in ../lib.
pub(crate) fn librmem_path() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the rmem binary: {e}"))?;
    let dir = exe.parent().ok_or("the rmem binary has no directory")?;
    let candidates = [dir.join("librmem.so"), dir.join("../lib/librmem.so")];
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            format!(
                "librmem.so not found beside {} (looked in {}); build it with cargo build --release",
                exe.display(),
                candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            )
        })
}

/// The end of a "no statistics" line: whether the program's children were paged.
fn children_note(children: bool) -> &'static str {
    if children {
        ", nor did its child processes"
    } else {
        " (its child processes, as a shell's commands, are paged only with --children)"
    }
}

/// What to tell a user whose program's peak resident set (`peak` bytes) was far above its
/// budget: the memory was not rmem's to page (small allocations, the program's own
/// mappings), so the budget did not bound it. Allowed above the budget: the program's code
/// and libraries, rmem's own buffers and small allocations, 64 MiB or the budget again.
/// `anon_mmap`: whether the program's private anonymous mappings were remote already;
/// `stats`: the program's statistics, which count the reservations it left to the kernel.
fn unpaged(
    peak: u64,
    local: u64,
    min_alloc: &str,
    anon_mmap: bool,
    stats: &serde_json::Value,
) -> Option<String> {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let n = |k: &str| stats[k].as_u64().unwrap_or(0);
    let own = match n("reservations_to_kernel") {
        _ if !anon_mmap => {
            "mappings the program makes itself: --min-alloc 0 and --anon-mmap page those".into()
        }
        0 => "shared or file mappings the program makes itself, which rmem cannot page".into(),
        r => format!(
            "shared or file mappings the program makes itself, or memory it made accessible in \
             {} ({:.0} GiB{}) larger than the servers' capacity, which rmem left to the kernel",
            if r == 1 {
                "the reservation of address space".to_string()
            } else {
                format!("the {r} reservations of address space")
            },
            n("reservation_bytes_to_kernel") as f64 / (1u64 << 30) as f64,
            if r == 1 { "" } else { " in all" }
        ),
    };
    (peak > local + (64u64 << 20).max(local)).then(|| {
        format!(
            "rmem: the program's peak resident set was {:.0} MiB against --local {:.0} MiB: most \
             of it was not rmem's to page (allocations under --min-alloc {min_alloc}, or {own})",
            mib(peak),
            mib(local)
        )
    })
}

/// Wait for the program, saying when a server this started ends before it. Whether the
/// program can go on without that server is its runtime's call, not this launcher's: under a
/// `--redundancy` that covers the loss it goes on (and rebuilds), otherwise the runtime stops
/// it within its lease, naming every lost server, with exit status 69. (This once stopped the
/// program two seconds after any of its servers died, so `rmem run --servers 4` lost the run
/// that its default then, `ec:3+1`, had kept.) Returns the program's status and its peak resident
/// set in bytes (its and its waited-for children's, from `wait4`).
fn wait_watching(
    child: &mut std::process::Child,
    servers: &mut [ServerProc],
    plan: &launch::Plan,
    watch: &mut launch::Watch,
) -> (ExitStatus, Option<u64>) {
    let pid = child.id() as libc::pid_t;
    loop {
        let mut raw = 0;
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waiting for our own child, with valid out-pointers.
        let r = unsafe { libc::wait4(pid, &mut raw, libc::WNOHANG, &mut usage) };
        if r == pid {
            let peak = (usage.ru_maxrss.max(0) as u64) << 10;
            return (ExitStatus::from_raw(raw), Some(peak));
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                eprintln!("rmem run: waiting for the program failed: {e}");
                let _ = child.kill();
                let s = child.wait().expect("wait after kill");
                return (s, None);
            }
        }
        watch.check(servers, plan, "rmem run");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Child processes that are paged and still run once the program has ended (one it started in
/// the background, a daemon): their memory is on the servers, so the servers stay until they
/// end. A signal to `rmem run` meanwhile goes to them.
fn wait_for_paged_children(
    program: &str,
    stats: &std::path::Path,
    servers: &mut [ServerProc],
    plan: &launch::Plan,
    watch: &mut launch::Watch,
) {
    let mut told = false;
    loop {
        let live = live_paged_children(stats);
        if live.is_empty() {
            return;
        }
        if !told {
            let pids: Vec<String> = live.iter().map(|p| p.to_string()).collect();
            eprintln!(
                "rmem run: {program} ended; waiting for {} paged child process{} still running \
                 (pid {}): their memory is on the servers",
                live.len(),
                if live.len() == 1 { "" } else { "es" },
                pids.join(", ")
            );
            told = true;
        }
        let sig = SIGNALLED.swap(0, Ordering::Relaxed);
        if sig != 0 {
            for &pid in &live {
                // SAFETY: kill with a live pid read from /proc just now.
                unsafe { libc::kill(pid, sig) };
            }
        }
        watch.check(servers, plan, "rmem run");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pids of the program's paged child processes that still run: those whose statistics
/// file says their runtime started and has not written its exit's, and that are neither gone
/// nor zombies.
fn live_paged_children(stats: &std::path::Path) -> Vec<libc::pid_t> {
    children_stats(stats)
        .into_iter()
        .filter_map(|path| {
            let pid: libc::pid_t = path.extension()?.to_str()?.parse().ok()?;
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()?;
            if v["complete"] != false {
                return None;
            }
            // "pid (comm) S ...": the state follows the last ')'.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            (!matches!(state, 'Z' | 'X')).then_some(pid)
        })
        .collect()
}

/// The statistics files of the program's child processes: `STATS.PID` beside `stats`.
fn children_stats(stats: &std::path::Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (stats.parent(), stats.file_name()) else {
        return Vec::new();
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix(&prefix)
                .is_some_and(|pid| pid.parse::<u32>().is_ok())
        })
        .map(|e| e.path())
        .collect()
}

/// One line for the statistics of the program's child processes, if any wrote them: each
/// writes `STATS.PID`, a fork() child (its runtime counts from the fork) at its exit, one
/// started with `--children` also when its runtime starts.
fn children_summary(stats: &std::path::Path, kept: bool) -> Option<String> {
    let (mut procs, mut faults, mut fetched, mut written) = (0u64, 0u64, 0u64, 0u64);
    let mut waited = 0.0;
    for path in children_stats(stats) {
        let Some(v) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        else {
            continue;
        };
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        procs += 1;
        faults += n("faults");
        fetched += n("bytes_fetched");
        written += n("bytes_written_back");
        waited += v["fault_wait_s"].as_f64().unwrap_or(0.0);
    }
    (procs > 0).then(|| {
        format!(
            "rmem: {procs} child process{} paged too, each in a --local of its own: {faults} \
             faults, fetched {:.1} MiB, wrote back {:.1} MiB, {waited:.2} s waited{}",
            if procs == 1 { "" } else { "es" },
            fetched as f64 / (1 << 20) as f64,
            written as f64 / (1 << 20) as f64,
            if kept {
                format!(" (statistics in {}.PID)", stats.display())
            } else {
                String::new()
            }
        )
    })
}

/// The statistics summary printed at the end of a run.
fn summary(json: &str, elapsed: Duration) -> String {
    let v: serde_json::Value = match serde_json::from_str(json) {
        Ok(v) => v,
        Err(e) => return format!("rmem: unreadable statistics ({e})"),
    };
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let replaced = match n("pieces_replaced") {
        0 => String::new(),
        r => format!(
            "\nrmem: {r} pieces of 4 KiB were found mapped in pages rmem held as missing and \
             were replaced (something maps memory in rmem's region behind it: please report)"
        ),
    };
    let unchanged = match n("dirty_unchanged") {
        0 => String::new(),
        u => format!(" ({u} of them zero pages, not written back)"),
    };
    let pieces = match n("sub_page_fetches") {
        0 => String::new(),
        p => format!(", {p} pieces of 4 KiB"),
    };
    // Prefetched pages are swapped in without a fault of their own: say so, or the swap-ins
    // can read as more than the faults they break down.
    let prefetched = match n("prefetches") {
        0 => String::new(),
        p => format!(", {p} of them prefetched"),
    };
    let written = match n("sub_page_write_backs") {
        0 => String::new(),
        w => format!(" (and {w} pages' written pieces of 4 KiB alone)"),
    };
    format!(
        "rmem: {:.2} s, {} faults ({} swap-ins{prefetched}{pieces}, {} zero-fills), {} swap-outs{written}, {} evictions{unchanged}\n\
         rmem: fetched {:.1} MiB, wrote back {:.1} MiB, local max {:.1} MiB, page {} KiB, policy {}\n\
         rmem: fault latency p50 {:.1} us, p99 {:.1} us, max {:.1} ms, {:.2} s waited in all{replaced}",
        elapsed.as_secs_f64(),
        n("faults"),
        n("swap_ins"),
        n("zero_fills"),
        n("swap_outs"),
        n("evictions"),
        mib(n("bytes_fetched")),
        mib(n("bytes_written_back")),
        mib(n("local_bytes_max")),
        n("page_size") / 1024,
        v["policy"].as_str().unwrap_or("?"),
        f("fault_us_p50"),
        f("fault_us_p99"),
        f("fault_us_max") / 1000.0,
        f("fault_wait_s"),
    )
}
