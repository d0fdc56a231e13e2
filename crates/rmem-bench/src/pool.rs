//! `rmem bench pool`: the memory pool (issue 13) in one run, against this machine's limits
//! measured in the same run (loopback bandwidth, TCP round trips, rmem's raw 4 KiB round
//! trip to a memory server, the raw disk):
//!
//! - **migration**: a real `rmem manager`, one `rmem server --manager` holding a program's
//!   pages (this process's [`Runtime`], random read-modify-writes over a working set larger
//!   than its local budget, every value checked), two more servers joining, then the real
//!   `rmem pool drain` of the first: MB/s moved against loopback, and the program's rate
//!   while the pages move against its rate before;
//! - **reclaim**: the same with the first server started `--reclaim-below` a floor under the
//!   node's available memory, then real memory pressure: this process allocates and touches
//!   memory until the node's available memory (read exactly as the server reads it) is under
//!   the floor; time until the server holds nothing, and MB/s moved. No root needed; the row
//!   says why when it could not be measured (other work moved the node's memory);
//! - **direct access**: [`DirectRegion`] reads and writes by transfer size, latency p50/p99
//!   and bandwidth, against the raw 4 KiB round trip, a TCP 64-byte round trip and loopback
//!   bandwidth;
//! - **disk**: a `rmem server --store file:` with a 4 MiB RAM cache, sequential page writes
//!   and reads through a direct region, against the same file I/O done raw (buffered, as
//!   the server does it, and to the device: fsync, then read after dropping the file's pages).
//!
//! Then the targets, met or not. Every process started is stopped on the way out.

use crate::report::{err, goals_json, percentile_us, print_goals, DiskDir, Goal, JsonOut, PlotOut};
use crate::setup::{local_setup, xorshift, RawRoundTrip};
use crate::{limits, plot};
use rmem_cli::launch::{fresh_token, start_local_servers_with};
use rmem_client::config::{Config, Placement};
use rmem_client::direct::DirectRegion;
use rmem_client::pool::ManagerConn;
use rmem_client::Runtime;
use rmem_proto::pool::{PoolRequest, PoolResponse, PoolStatus, SERVER_RECLAIMING};
use rmem_proto::size::parse_size;
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct PoolBenchArgs {
    /// Working set of the program under a drain and a reclaim.
    #[arg(long, default_value = "128M")]
    pub size: String,
    /// The program's local budget, as a percentage of its working set.
    #[arg(long, default_value_t = 25)]
    pub local_percent: u64,
    /// Page size of the program and of the direct regions.
    #[arg(long, default_value = "64K")]
    pub page_size: String,
    /// The manager's heartbeat (how soon a drain or a reclaim reaches the clients).
    #[arg(long, default_value_t = 200)]
    pub heartbeat_ms: u64,
    /// Seconds the program runs before the drain or the memory pressure, for its rate.
    #[arg(long, default_value_t = 2.0)]
    pub before_s: f64,
    /// Move a drained or reclaiming server's pages through the program's client (a read and
    /// a write each), as before servers pulled them from each other: for comparison.
    #[arg(long)]
    pub no_pull: bool,
    /// Direct-access calls timed per transfer size and direction (fewer for large sizes:
    /// at most 256 MiB moved per size).
    #[arg(long, default_value_t = 2000)]
    pub samples: usize,
    /// Direct-access transfer sizes, comma-separated.
    #[arg(long, default_value = "64,512,4K,64K,1M,4M")]
    pub sizes: String,
    /// Bytes written and read on the disk-backed server, and in the raw disk reference.
    #[arg(long, default_value = "256M")]
    pub disk_size: String,
    // --dir: the disk-backed server's file and the raw reference's.
    #[command(flatten)]
    pub disk: DiskDir,
    #[command(flatten)]
    pub out: JsonOut,
    // --plot DIR: pool.png/svg (the ratios) and pool-direct.png/svg.
    #[command(flatten)]
    pub plots: PlotOut,
}

/// A `rmem manager` this benchmark started: stopped (stdin closed, then killed) on drop.
struct ManagerProc {
    addr: String,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl ManagerProc {
    fn start(token: &str, heartbeat_ms: u64) -> Result<ManagerProc, String> {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(rmem_cli::launch::rmem_exe()?);
        cmd.args(["manager", "--listen", "127.0.0.1:0", "--token-stdin"])
            .args(["--heartbeat-ms", &heartbeat_ms.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        // SAFETY: the closure calls only prctl, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            })
        };
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start rmem manager: {e}"))?;
        let mut stdin = child.stdin.take().expect("piped");
        let _ = writeln!(stdin, "{token}").and_then(|()| stdin.flush());
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        // Drain the rest so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let mut m = ManagerProc {
            addr: String::new(),
            child,
            stdin: Some(stdin),
        };
        m.addr = first
            .strip_prefix("rmem-manager listening on ")
            .map(|a| a.trim().to_string())
            .ok_or_else(|| format!("rmem manager did not start: {first:?}"))?;
        Ok(m)
    }
}

impl Drop for ManagerProc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let t = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() {
            if t.elapsed() > Duration::from_secs(5) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn pool_status(manager: &str, token: &str) -> Result<PoolStatus, String> {
    let t = Duration::from_secs(5);
    let chain = |e: rmem_client::store::StoreError| rmem_client::error_chain(&e);
    let mut conn = ManagerConn::connect(manager, token.as_bytes(), t).map_err(chain)?;
    match conn.ask(&PoolRequest::Status, t).map_err(chain)? {
        PoolResponse::StatusOk(st) => Ok(st),
        other => Err(format!("manager answered status with {:?}", other.op())),
    }
}

/// Poll the pool's status every 20 ms until `ok` holds, for at most `limit`.
fn await_status(
    manager: &str,
    token: &str,
    limit: Duration,
    what: &str,
    ok: impl Fn(&PoolStatus) -> bool,
) -> Result<(), String> {
    let t = Instant::now();
    loop {
        if ok(&pool_status(manager, token)?) {
            return Ok(());
        }
        if t.elapsed() > limit {
            return Err(format!("{what}: not within {} s", limit.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Bytes the pool says `server` holds (0 once it has left).
fn held(st: &PoolStatus, server: &str) -> u64 {
    st.servers
        .iter()
        .find(|s| s.addr == server)
        .map_or(0, |s| s.used_bytes)
}

/// The program: random read-modify-writes of one word per page over `pages` pages at
/// `base`, each value checked against the count of writes to its page kept in local
/// memory; runs until `stop`, counting operations in `ops`.
fn program(
    base: usize,
    pages: usize,
    page: usize,
    writes: &mut [u32],
    ops: &AtomicU64,
    stop: &AtomicBool,
) -> Result<(), String> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    while !stop.load(Relaxed) {
        {
            let p = (xorshift(&mut x) % pages as u64) as usize;
            let w = (base + p * page) as *mut u64;
            let want = (p as u64) << 32 | u64::from(writes[p]);
            // SAFETY: inside the program's allocation of pages * page bytes.
            let v = unsafe { w.read_volatile() };
            if v != want {
                return Err(format!("page {p} read {v:#x}, expected {want:#x}"));
            }
            writes[p] += 1;
            // SAFETY: as above.
            unsafe { w.write_volatile(want + 1) };
        }
        ops.fetch_add(1, Relaxed);
    }
    Ok(())
}

/// What a drain or a reclaim measured.
#[derive(Clone, Copy, Debug, Default)]
struct Move {
    /// From the trigger (the drain asked, the node under its floor) to the server empty.
    wall_s: f64,
    /// The client's own time moving (from the notice to the last page moved).
    move_s: f64,
    bytes: u64,
    /// Program operations per second before the trigger, from the trigger to the server
    /// empty, and while the client moved pages (sampled every 5 ms: a move of a few
    /// milliseconds gives a rough figure).
    ops_before: f64,
    ops_during: f64,
    ops_moving: f64,
}

impl Move {
    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.move_s.max(1e-9) / 1e6
    }
    fn wall_mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.wall_s.max(1e-9) / 1e6
    }
    /// The program's rate before over its rate from the trigger to the server empty.
    fn slowdown(&self) -> f64 {
        self.ops_before / self.ops_during.max(1e-9)
    }
    /// The same over its rate while the client moved pages (None: it made no progress).
    fn slowdown_moving(&self) -> Option<f64> {
        (self.ops_moving > 0.0).then(|| self.ops_before / self.ops_moving)
    }
    fn to_json(self, loop_mbs: f64) -> serde_json::Value {
        json!({
            "bytes_moved": self.bytes, "wall_s": self.wall_s, "move_s": self.move_s,
            "mb_per_s": self.mb_per_s(), "wall_mb_per_s": self.wall_mb_per_s(),
            "x_loopback": self.mb_per_s() / loop_mbs,
            "program_ops_per_s_before": self.ops_before,
            "program_ops_per_s_during": self.ops_during,
            "program_ops_per_s_while_moving": self.ops_moving,
            "program_slowdown": self.slowdown(),
            "program_slowdown_while_moving": self.slowdown_moving(),
        })
    }
}

/// How the pages are made to leave the first server.
enum Trigger {
    /// `rmem pool drain SERVER` (the real command).
    Drain,
    /// Memory taken on this node until its available memory is under `floor_bytes`.
    Pressure { floor_bytes: u64, cap_bytes: u64 },
}

/// A manager, a first server (with `first_args`) holding the program's pages, two more
/// joining; then `trigger` while the program runs, until the first server holds nothing.
fn migrate(
    a: &PoolBenchArgs,
    size: u64,
    page: usize,
    first_args: &[String],
    trigger: Trigger,
) -> Result<Move, String> {
    let token = fresh_token();
    let m = ManagerProc::start(&token, a.heartbeat_ms)?;
    let pool_args = |extra: &[String]| {
        let mut v: Vec<String> = ["--manager", &m.addr]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend_from_slice(extra);
        v
    };
    let capacity = size * 2 + (16 << 20);
    let mut first = start_local_servers_with(1, capacity, &token, &pool_args(first_args))?;
    let first_addr = first[0].addr.clone();
    // Generous: a loaded machine delays every process.
    let wait = Duration::from_secs(30).max(Duration::from_millis(a.heartbeat_ms) * 20);
    let up =
        |n: usize| move |st: &PoolStatus| st.servers.iter().filter(|s| s.flags == 0).count() >= n;
    await_status(&m.addr, &token, wait, "the first server in the pool", up(1))?;
    let config = Config {
        manager: Some(m.addr.clone()),
        placement: Placement::Free,
        token: token.clone().into_bytes(),
        page_size: page,
        local_bytes: (size * a.local_percent / 100).max(8 * page as u64),
        region_bytes: 1 << 36,
        pull: !a.no_pull,
        ..Config::default()
    };
    let rt = Runtime::connect(&config).map_err(|e| rmem_client::error_chain(&e))?;
    let pages = (size / page as u64) as usize;
    let base = rt.alloc(pages * page).ok_or("allocation failed")? as usize;
    for p in 0..pages {
        // SAFETY: inside the allocation of pages * page bytes.
        unsafe { ((base + p * page) as *mut u64).write_volatile((p as u64) << 32) };
    }
    let mut writes = vec![0u32; pages];
    // Two more servers; the program's client joins them.
    let others = start_local_servers_with(2, capacity, &token, &pool_args(&[]))?;
    let names: Vec<String> = others.iter().map(|s| s.addr.clone()).collect();
    await_status(
        &m.addr,
        &token,
        wait,
        "the client joining the new servers",
        |st| {
            names.iter().all(|n| {
                st.servers
                    .iter()
                    .any(|s| &s.addr == n && !s.sessions.is_empty())
            })
        },
    )?;
    let ops = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        let worker = s.spawn(|| {
            let r = program(base, pages, page, &mut writes, &ops, &stop);
            stop.store(true, Relaxed);
            r
        });
        let r = measure_move(a, &m.addr, &token, &first_addr, &rt, &ops, &stop, trigger);
        stop.store(true, Relaxed);
        let w = worker
            .join()
            .map_err(|_| "the program panicked".to_string())?;
        w.map_err(|e| format!("the program read a wrong value: {e}"))?;
        r
    });
    rt.free(base as *mut u8).map_err(err)?;
    drop(rt);
    for s in first.iter_mut() {
        s.kill();
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn measure_move(
    a: &PoolBenchArgs,
    manager: &str,
    token: &str,
    server: &str,
    rt: &Runtime,
    ops: &AtomicU64,
    stop: &AtomicBool,
    trigger: Trigger,
) -> Result<Move, String> {
    // The program's rate before.
    let t0 = Instant::now();
    let o0 = ops.load(Relaxed);
    std::thread::sleep(Duration::from_secs_f64(a.before_s.max(0.1)));
    let ops_before = (ops.load(Relaxed) - o0) as f64 / t0.elapsed().as_secs_f64();
    let held_before = held(&pool_status(manager, token)?, server);
    if held_before == 0 {
        return Err(format!("{server} holds none of the program's pages"));
    }
    let before = rt.stats();
    let mut hog: Vec<Vec<u8>> = Vec::new();
    let mut drain: Option<Child> = None;
    match trigger {
        Trigger::Drain => {
            drain = Some(
                Command::new(rmem_cli::launch::rmem_exe()?)
                    .args(["pool", "drain", server, "--manager", manager])
                    .args(["--wait", "120"])
                    .env("RMEM_TOKEN", token)
                    .stdout(Stdio::null())
                    .spawn()
                    .map_err(|e| format!("cannot run rmem pool drain: {e}"))?,
            )
        }
        Trigger::Pressure {
            floor_bytes,
            cap_bytes,
        } => {
            let st = pool_status(manager, token)?;
            if st.servers.iter().any(|s| s.flags & SERVER_RECLAIMING != 0) {
                return Err(
                    "skipped: the server reclaimed before the memory pressure (other work on \
                     the node took its memory)"
                        .into(),
                );
            }
            // Take memory 64 MiB at a time (touched, so it is really used) until the node
            // is under the floor by a little.
            let mut taken = 0u64;
            while available()? + (16 << 20) > floor_bytes {
                if taken >= cap_bytes {
                    return Err(format!(
                        "skipped: {} MiB taken and the node's available memory still above \
                         the floor (other work freed memory)",
                        taken >> 20
                    ));
                }
                hog.push(vec![0x5Au8; 64 << 20]);
                taken += 64 << 20;
            }
        }
    }
    let triggered = Instant::now();
    // Sample the program and the client's moves until the server holds nothing.
    let mut samples: Vec<(Instant, u64, u64)> = Vec::new();
    let mut last_status = Instant::now();
    let limit = Duration::from_secs(120);
    let wall_s = loop {
        let now = Instant::now();
        samples.push((now, ops.load(Relaxed), rt.stats().pages_repaired));
        if stop.load(Relaxed) {
            return Err("the program stopped".into());
        }
        if now - last_status >= Duration::from_millis(20) {
            last_status = now;
            if held(&pool_status(manager, token)?, server) == 0 {
                break triggered.elapsed().as_secs_f64();
            }
        }
        if triggered.elapsed() > limit {
            return Err(format!(
                "{server} did not empty within {} s",
                limit.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if let Some(mut d) = drain {
        let st = d.wait().map_err(err)?;
        if !st.success() {
            return Err(format!("rmem pool drain {server} failed ({st})"));
        }
    }
    drop(hog);
    // The client's repair time is counted when its last move is done.
    let t = Instant::now();
    let mut after = rt.stats();
    while after.repair_s <= before.repair_s && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
        after = rt.stats();
    }
    let moved = after.pages_repaired - before.pages_repaired;
    // While pages moved: from the sample before the first move to the first with them all.
    let i0 = samples
        .iter()
        .position(|s| s.2 > before.pages_repaired)
        .map_or(0, |i| i.saturating_sub(1));
    let i1 = samples
        .iter()
        .position(|s| s.2 >= after.pages_repaired)
        .unwrap_or(samples.len() - 1)
        .max(i0 + 1)
        .min(samples.len() - 1);
    let rate = |x: (Instant, u64, u64), y: (Instant, u64, u64)| {
        (y.1 - x.1) as f64 / (y.0 - x.0).as_secs_f64().max(1e-9)
    };
    Ok(Move {
        wall_s,
        move_s: after.repair_s - before.repair_s,
        bytes: moved * after.page_size,
        ops_before,
        ops_during: rate(samples[0], samples[samples.len() - 1]),
        ops_moving: rate(samples[i0], samples[i1]),
    })
}

/// The node's available memory, read as `rmem server --reclaim-below` reads it.
fn available() -> Result<u64, String> {
    Ok(rmem_server::reclaim::available()?.bytes)
}

/// One transfer size of the direct-access measurement.
struct Direct {
    bytes: usize,
    calls: usize,
    read_us_p50: f64,
    read_us_p99: f64,
    read_mb_per_s: f64,
    write_us_p50: f64,
    write_us_p99: f64,
    write_mb_per_s: f64,
}

/// `calls` timed calls of `f(offset)`, at random offsets aligned to the transfer size
/// (at most a 4 KiB alignment); their latencies sorted, and MB/s over the whole.
fn timed(
    calls: usize,
    bytes: usize,
    region: u64,
    x: &mut u64,
    mut f: impl FnMut(u64) -> Result<(), String>,
) -> Result<(Vec<Duration>, f64), String> {
    let align = bytes.min(4096) as u64;
    let slots = (region - bytes as u64) / align + 1;
    let mut lat = Vec::with_capacity(calls);
    let t0 = Instant::now();
    for _ in 0..calls {
        let off = xorshift(x) % slots * align;
        let t = Instant::now();
        f(off)?;
        lat.push(t.elapsed());
    }
    let secs = t0.elapsed().as_secs_f64();
    lat.sort();
    Ok((lat, (calls * bytes) as f64 / secs / 1e6))
}

fn direct(config: &Config, sizes: &[usize], samples: usize) -> Result<Vec<Direct>, String> {
    let largest = *sizes.iter().max().expect("sizes checked");
    let region_bytes = (largest as u64 * 8).max(64 << 20);
    let region = DirectRegion::create(config, region_bytes, None).map_err(err)?;
    // Every page written once, so reads read stored pages.
    let chunk = vec![0x3Cu8; 4 << 20];
    let mut off = 0;
    while off < region_bytes {
        let n = chunk.len().min((region_bytes - off) as usize);
        region.write(off, &chunk[..n]).map_err(err)?;
        off += n as u64;
    }
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut out = Vec::new();
    for &bytes in sizes {
        let calls = samples.min(((256usize << 20) / bytes).max(20));
        let mut buf = vec![0xC3u8; bytes];
        let (w, write_mbs) = timed(calls, bytes, region_bytes, &mut x, |o| {
            region.write(o, &buf).map_err(err)
        })?;
        let (r, read_mbs) = timed(calls, bytes, region_bytes, &mut x, |o| {
            region.read(o, &mut buf).map_err(err)
        })?;
        if buf.iter().any(|&b| b != 0xC3 && b != 0x3C) {
            return Err(format!("a {bytes}-byte read returned bytes never written"));
        }
        out.push(Direct {
            bytes,
            calls,
            read_us_p50: percentile_us(&r, 0.5),
            read_us_p99: percentile_us(&r, 0.99),
            read_mb_per_s: read_mbs,
            write_us_p50: percentile_us(&w, 0.5),
            write_us_p99: percentile_us(&w, 0.99),
            write_mb_per_s: write_mbs,
        });
    }
    Ok(out)
}

/// Sequential MB/s of writing then reading `bytes` through a direct region on a disk-backed
/// server whose RAM cache is 4 MiB.
fn disk_server(token: &str, page: usize, bytes: u64, dir: &Path) -> Result<(f64, f64), String> {
    let file = dir.join(format!("rmem-bench-pool-{}.store", std::process::id()));
    let args = [
        "--store".to_string(),
        format!("file:{}", file.display()),
        "--store-cache".into(),
        "4M".into(),
    ];
    let servers = start_local_servers_with(1, bytes * 2, token, &args)?;
    let config = Config {
        servers: servers.iter().map(|s| s.addr.clone()).collect(),
        token: token.as_bytes().to_vec(),
        page_size: page,
        ..Config::default()
    };
    let region = DirectRegion::create(&config, bytes, None).map_err(err)?;
    let mut chunk: Vec<u8> = (0..4usize << 20).map(|i| (i * 7 + 1) as u8).collect();
    let t = Instant::now();
    for off in (0..bytes).step_by(chunk.len()) {
        region.write(off, &chunk).map_err(err)?;
    }
    let write = bytes as f64 / t.elapsed().as_secs_f64() / 1e6;
    let t = Instant::now();
    for off in (0..bytes).step_by(chunk.len()) {
        chunk.fill(0);
        region.read(off, &mut chunk).map_err(err)?;
        if chunk[12345] != (12345usize * 7 + 1) as u8 {
            return Err(format!(
                "the disk-backed server read back wrong bytes at {off}"
            ));
        }
    }
    let read = bytes as f64 / t.elapsed().as_secs_f64() / 1e6;
    Ok((write, read))
}

/// The raw disk: MB/s of writing `bytes` to a file in 1 MiB writes (buffered), of the same
/// with its fsync, of reading it back from the page cache, and of reading it again after
/// its pages are dropped (fadvise DONTNEED: from the device).
fn raw_disk(bytes: u64, dir: &Path) -> Result<[f64; 4], String> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let path = dir.join(format!("rmem-bench-pool-{}.raw", std::process::id()));
    let r = (|| {
        let mut f = std::fs::File::create(&path).map_err(err)?;
        let chunk: Vec<u8> = (0..1usize << 20).map(|i| (i * 13 + 5) as u8).collect();
        let t = Instant::now();
        for _ in 0..bytes >> 20 {
            f.write_all(&chunk).map_err(err)?;
        }
        let buffered = t.elapsed().as_secs_f64();
        f.sync_all().map_err(err)?;
        let synced = t.elapsed().as_secs_f64();
        let mut buf = vec![0u8; 1 << 20];
        let mut read_all = |f: &mut std::fs::File| -> Result<f64, String> {
            use std::io::Seek;
            f.seek(std::io::SeekFrom::Start(0)).map_err(err)?;
            let t = Instant::now();
            let mut n = 0u64;
            loop {
                let k = f.read(&mut buf).map_err(err)?;
                if k == 0 {
                    break;
                }
                n += k as u64;
            }
            if n != bytes >> 20 << 20 {
                return Err(format!("read {n} bytes of {}", path.display()));
            }
            Ok(t.elapsed().as_secs_f64())
        };
        let mut f = std::fs::File::open(&path).map_err(err)?;
        let cached = read_all(&mut f)?;
        // SAFETY: an advice on our own open file.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let device = read_all(&mut f)?;
        let mb = (bytes >> 20 << 20) as f64 / 1e6;
        Ok([mb / buffered, mb / synced, mb / cached, mb / device])
    })();
    let _ = std::fs::remove_file(&path);
    r
}

pub fn pool(a: PoolBenchArgs) -> Result<(), String> {
    let size = parse_size(&a.size).map_err(|e| format!("--size {}: {e}", a.size))?;
    let page = parse_size(&a.page_size).map_err(|e| format!("--page-size: {e}"))? as usize;
    let disk_bytes = parse_size(&a.disk_size).map_err(|e| format!("--disk-size: {e}"))?;
    let disk_bytes = (disk_bytes >> 22 << 22).max(4 << 20);
    let sizes = a
        .sizes
        .split(',')
        .map(|s| parse_size(s.trim()).map(|v| v as usize))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--sizes: {e}"))?;
    if sizes.is_empty() || sizes.iter().any(|&s| s == 0 || s > 64 << 20) {
        return Err("--sizes: 1 byte to 64M each".into());
    }
    if size < 16 * page as u64 {
        return Err("--size: at least 16 pages".into());
    }
    if !(10..=1000).contains(&a.heartbeat_ms) {
        return Err("--heartbeat-ms: 10 to 1000".into());
    }
    // The limits first, while nothing else of this run is busy; the best of three, as one
    // short measurement on a loaded machine can catch a stall.
    let mut lim = limits::measure(2000, 64)?;
    for _ in 0..2 {
        let again = limits::measure(2000, 64)?;
        if again.loopback_gbps > lim.loopback_gbps {
            lim = again;
        }
    }
    let loop_mbs = lim.loopback_bytes_per_s() / 1e6;
    let tcp64 = limits::tcp_rtt_us_p50(2000, 64)?;
    let (_raw_servers, raw_config) = local_setup(4096, 1 << 20, 64 << 20)?;
    let (raw50, raw99) = {
        let mut raw = RawRoundTrip::connect(&raw_config)?;
        let mut s = raw.sample(2000, &mut 0x2545_F491_4F6C_DD1Du64)?;
        s.sort();
        (percentile_us(&s, 0.5), percentile_us(&s, 0.99))
    };
    println!(
        "rmem bench pool: loopback {:.1} Gbit/s ({loop_mbs:.0} MB/s), TCP round trip 4 KiB \
         {:.1} us, 64 B {tcp64:.1} us, rmem raw 4 KiB round trip p50 {raw50:.1} us p99 \
         {raw99:.1} us; {} CPUs, load average {}",
        lim.loopback_gbps,
        lim.rtt_us_p50,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        load_average()
    );

    println!(
        "  migration: a {} MiB working set, {}% local, {} KiB pages, manager heartbeat {} ms",
        size >> 20,
        a.local_percent,
        page >> 10,
        a.heartbeat_ms
    );
    let drain = migrate(&a, size, page, &[], Trigger::Drain)?;
    print_move("rmem pool drain", &drain, loop_mbs);

    // The floor: far enough under the node's available memory for the server to lend the
    // working set (it keeps floor + margin/2 free), close enough for a hog to cross it.
    let avail0 = available()?;
    let reclaim = {
        // floor + margin/2 (an eighth of the floor) + room = what is available now.
        let room = 2 * size + (256 << 20);
        let floor = avail0.saturating_sub(room) / 17 * 16;
        let cap = (avail0 / 2).min(avail0.saturating_sub(floor) + (1 << 30));
        if floor < 256 << 20 {
            Err(format!(
                "skipped: the node has {} MiB available, too little to set a floor under it",
                avail0 >> 20
            ))
        } else {
            println!(
                "  reclaim: --reclaim-below {} MiB (available {} MiB), memory taken by this \
                 process until the node is under it",
                floor >> 20,
                avail0 >> 20
            );
            let args = ["--reclaim-below".to_string(), floor.to_string()];
            migrate(
                &a,
                size,
                page,
                &args,
                Trigger::Pressure {
                    floor_bytes: floor,
                    cap_bytes: cap,
                },
            )
        }
    };
    match &reclaim {
        Ok(r) => print_move("reclaim (--reclaim-below)", r, loop_mbs),
        Err(e) if e.starts_with("skipped") => println!("    reclaim {e}"),
        Err(e) => return Err(format!("reclaim: {e}")),
    }

    let (_servers, config) = local_setup(page, 1 << 20, 1 << 30)?;
    let rows = direct(&config, &sizes, a.samples)?;
    println!(
        "  direct access (rmem_read/rmem_write), one server, {} KiB pages, one call at a time:",
        page >> 10
    );
    println!(
        "    {:>8} {:>6} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9} {:>8} {:>8}",
        "bytes",
        "calls",
        "read p50",
        "read p99",
        "MB/s",
        "write p50",
        "write p99",
        "MB/s",
        "rd xRTT",
        "rd xloop"
    );
    for d in &rows {
        println!(
            "    {:>8} {:>6} {:>7.1} us {:>7.1} us {:>9.1} {:>7.1} us {:>7.1} us {:>9.1} {:>8.2} {:>8.3}",
            d.bytes,
            d.calls,
            d.read_us_p50,
            d.read_us_p99,
            d.read_mb_per_s,
            d.write_us_p50,
            d.write_us_p99,
            d.write_mb_per_s,
            d.read_us_p50 / raw50,
            d.read_mb_per_s / loop_mbs
        );
    }

    let token = fresh_token();
    std::fs::create_dir_all(&a.disk.dir).map_err(|e| format!("{}: {e}", a.disk.dir.display()))?;
    let (dw, dr) = disk_server(&token, page, disk_bytes, &a.disk.dir)?;
    let [raw_w, raw_ws, raw_rc, raw_rd] = raw_disk(disk_bytes, &a.disk.dir)?;
    println!(
        "  disk-backed server (--store file: in {}, --store-cache 4M), {} MiB sequential in \
         4 MiB calls:",
        a.disk.dir.display(),
        disk_bytes >> 20
    );
    println!(
        "    write {dw:.0} MB/s: {:.2}x raw buffered writes ({raw_w:.0} MB/s), {:.2}x raw \
         writes + fsync ({raw_ws:.0} MB/s)",
        dw / raw_w,
        dw / raw_ws
    );
    println!(
        "    read  {dr:.0} MB/s: {:.2}x raw reads from the page cache ({raw_rc:.0} MB/s), \
         {:.2}x raw reads from the device ({raw_rd:.0} MB/s)",
        dr / raw_rc,
        dr / raw_rd
    );

    let find = |b: usize| rows.iter().find(|d| d.bytes == b);
    let reclaim_ok = reclaim.as_ref().ok();
    let goals = [
        Goal::new(
            "drain MB/s x loopback bandwidth",
            Some(drain.mb_per_s() / loop_mbs),
            0.5,
            true,
        ),
        Goal::new(
            "reclaim MB/s x loopback bandwidth",
            reclaim_ok.map(|r| r.mb_per_s() / loop_mbs),
            0.5,
            true,
        ),
        Goal::new(
            "program slowdown, drain asked to server empty",
            Some(drain.slowdown()),
            1.5,
            false,
        ),
        Goal::new(
            "program slowdown while the client moved pages",
            drain.slowdown_moving(),
            1.5,
            false,
        ),
        Goal::new(
            "64 B rmem_read p50 x raw 4 KiB round trip",
            find(64).map(|d| d.read_us_p50 / raw50),
            1.3,
            false,
        ),
        Goal::new(
            "4 MiB rmem_read MB/s x loopback bandwidth",
            find(4 << 20).map(|d| d.read_mb_per_s / loop_mbs),
            0.7,
            true,
        ),
    ];
    print_goals(&goals);
    if let Some(dir) = &a.plots.plot {
        plots(dir, &goals, &rows, loop_mbs)?;
    }
    let direct_json: Vec<serde_json::Value> = rows
        .iter()
        .map(|d| {
            json!({
                "bytes": d.bytes, "calls": d.calls,
                "read_us_p50": d.read_us_p50, "read_us_p99": d.read_us_p99,
                "read_mb_per_s": d.read_mb_per_s,
                "write_us_p50": d.write_us_p50, "write_us_p99": d.write_us_p99,
                "write_mb_per_s": d.write_mb_per_s,
                "read_p50_x_raw_rtt": d.read_us_p50 / raw50,
                "read_p50_x_tcp_rtt_64": d.read_us_p50 / tcp64,
                "read_x_loopback": d.read_mb_per_s / loop_mbs,
                "write_x_loopback": d.write_mb_per_s / loop_mbs,
            })
        })
        .collect();
    let reclaim_json = match &reclaim {
        Ok(r) => r.to_json(loop_mbs),
        Err(e) => json!({"skipped": e}),
    };
    a.out.write(&json!({
        "size": size, "local_percent": a.local_percent, "page_size": page,
        "heartbeat_ms": a.heartbeat_ms,
        "cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "load_average": load_average(),
        "loopback_gbps": lim.loopback_gbps, "loopback_mb_per_s": loop_mbs,
        "tcp_rtt_us_p50": lim.rtt_us_p50, "tcp_rtt_64_us_p50": tcp64,
        "raw_rtt_us_p50": raw50, "raw_rtt_us_p99": raw99,
        "drain": drain.to_json(loop_mbs),
        "reclaim": reclaim_json,
        "direct": direct_json,
        "disk": {
            "bytes": disk_bytes, "dir": a.disk.dir.display().to_string(), "store_cache_bytes": 4 << 20,
            "write_mb_per_s": dw, "read_mb_per_s": dr,
            "raw_write_buffered_mb_per_s": raw_w, "raw_write_fsync_mb_per_s": raw_ws,
            "raw_read_cached_mb_per_s": raw_rc, "raw_read_device_mb_per_s": raw_rd,
            "write_x_raw_buffered": dw / raw_w, "write_x_raw_fsync": dw / raw_ws,
            "read_x_raw_cached": dr / raw_rc, "read_x_raw_device": dr / raw_rd,
        },
        "targets": goals_json(&goals),
    }))
}

fn print_move(what: &str, m: &Move, loop_mbs: f64) {
    println!(
        "    {what}: {} MiB moved in {:.2} s by the client = {:.0} MB/s = {:.2}x loopback; \
         {:.2} s from the trigger to the server empty ({:.0} MB/s)",
        m.bytes >> 20,
        m.move_s,
        m.mb_per_s(),
        m.mb_per_s() / loop_mbs,
        m.wall_s,
        m.wall_mb_per_s()
    );
    println!(
        "    program: {:.0} ops/s before, {:.0} from the trigger to the server empty: {:.2}x \
         slower; {:.0} while the client moved pages ({})",
        m.ops_before,
        m.ops_during,
        m.slowdown(),
        m.ops_moving,
        m.slowdown_moving()
            .map_or("no progress".into(), |x| format!("{x:.2}x slower"))
    );
}

/// `/proc/loadavg`'s three averages.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// pool.png/svg: each target's ratio (a line at 1); pool-direct.png/svg: direct reads and
/// writes by transfer size against loopback bandwidth.
fn plots(dir: &Path, goals: &[Goal], rows: &[Direct], loop_mbs: f64) -> Result<(), String> {
    let groups: Vec<String> = [
        "drain",
        "reclaim",
        "slowdown",
        "slowdown moving",
        "64 B p50",
        "4 MiB read",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let series = [
        plot::Bars {
            label: "measured (x reference)".into(),
            values: goals
                .iter()
                .map(|g| Some(g.value).filter(|v| v.is_finite()))
                .collect(),
        },
        plot::Bars {
            label: "target".into(),
            values: goals.iter().map(|g| Some(g.bound)).collect(),
        },
    ];
    plot::bars(
        dir,
        "pool",
        "rmem bench pool: the issue's targets",
        "ratio to the reference",
        &groups,
        &series,
    )?;
    let groups: Vec<String> = rows.iter().map(|d| size_label(d.bytes)).collect();
    let series = [
        plot::Bars {
            label: "rmem_read MB/s x loopback".into(),
            values: rows
                .iter()
                .map(|d| Some(d.read_mb_per_s / loop_mbs))
                .collect(),
        },
        plot::Bars {
            label: "rmem_write MB/s x loopback".into(),
            values: rows
                .iter()
                .map(|d| Some(d.write_mb_per_s / loop_mbs))
                .collect(),
        },
    ];
    plot::bars(
        dir,
        "pool-direct",
        "rmem bench pool: direct access, one call at a time",
        "MB/s x loopback bandwidth",
        &groups,
        &series,
    )?;
    println!(
        "wrote {0}/pool.png, pool.svg, pool-direct.png and pool-direct.svg",
        dir.display()
    );
    Ok(())
}

fn size_label(b: usize) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
