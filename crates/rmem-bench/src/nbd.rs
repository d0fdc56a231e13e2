//! `rmem bench nbd`: the block device against the fastest RAM-backed NBD server there is, in
//! one run. fio (its `nbd` engine, libnbd) drives the same jobs over the same data size on
//! every target: `rmem nbd` with the data fitting its cache and with the data four times its
//! cache, nbdkit's memory plugin (the anchor every ratio is against), nbdkit's file plugin
//! on a local file, and the kernel's `loop` device over a local file (fio's libaio engine,
//! O_DIRECT; needs root, and its row says it was skipped without it). A job that fails on a
//! target is recorded `failed` with fio's message, and the run goes on. The loopback TCP
//! bandwidth and 4 KiB round trip, and rmem's own raw 4 KiB round trip to a memory server,
//! are measured in the same run for the targets of the data that does not fit.
//!
//! Every target is started first and filled once with sequential 1 MiB writes; then each job
//! runs on each target in turn, so a change in the machine's speed during the run (other
//! tenants) weighs on all targets alike. Every fio run is bounded in time; every process
//! started is stopped, and the loop device detached, on the way out.

use crate::plot;
use crate::report::{err, goals_json, percentile_us, print_goals, DiskDir, Goal, JsonOut, PlotOut};
use crate::setup::{local_setup, RawRoundTrip};
use rmem_proto::size::parse_size;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct NbdBenchArgs {
    /// Data size of every target (the export, the file, the device).
    #[arg(long, default_value = "256M")]
    pub size: String,
    /// Seconds each job runs on each target (after --ramp-s).
    #[arg(long, default_value_t = 5)]
    pub runtime_s: u64,
    /// Seconds each job runs before fio starts counting.
    #[arg(long, default_value_t = 1)]
    pub ramp_s: u64,
    /// Targets, comma-separated, out of rmem-fit, rmem-4x, nbdkit-memory, nbdkit-file, loop;
    /// nbdkit-memory (the anchor) is always run.
    #[arg(
        long,
        default_value = "rmem-fit,rmem-4x,nbdkit-memory,nbdkit-file,loop"
    )]
    pub targets: String,
    /// Jobs, comma-separated, out of randread-4k-qd1, randread-4k-qd32, randwrite-4k-qd1,
    /// randwrite-4k-qd32, read-1m, write-1m.
    #[arg(
        long,
        default_value = "randread-4k-qd1,randread-4k-qd32,randwrite-4k-qd1,randwrite-4k-qd32,read-1m,write-1m"
    )]
    pub jobs: String,
    // --dir: the files of nbdkit's file plugin and the loop device.
    #[command(flatten)]
    pub disk: DiskDir,
    #[command(flatten)]
    pub out: JsonOut,
    // --plot DIR: nbd.png and nbd.svg.
    #[command(flatten)]
    pub plots: PlotOut,
}

/// One fio job, the same on every target.
struct Job {
    name: &'static str,
    rw: &'static str,
    block: &'static str,
    /// Requests in flight per connection.
    iodepth: u32,
    /// Connections (fio jobs, each with its own NBD connection).
    connections: u32,
    /// Random 4 KiB jobs are compared by IOPS, sequential ones by MB/s.
    sequential: bool,
}

const JOBS: [Job; 6] = [
    Job {
        name: "randread-4k-qd1",
        rw: "randread",
        block: "4k",
        iodepth: 1,
        connections: 1,
        sequential: false,
    },
    Job {
        name: "randread-4k-qd32",
        rw: "randread",
        block: "4k",
        iodepth: 8,
        connections: 4,
        sequential: false,
    },
    Job {
        name: "randwrite-4k-qd1",
        rw: "randwrite",
        block: "4k",
        iodepth: 1,
        connections: 1,
        sequential: false,
    },
    Job {
        name: "randwrite-4k-qd32",
        rw: "randwrite",
        block: "4k",
        iodepth: 8,
        connections: 4,
        sequential: false,
    },
    Job {
        name: "read-1m",
        rw: "read",
        block: "1m",
        iodepth: 8,
        connections: 1,
        sequential: true,
    },
    Job {
        name: "write-1m",
        rw: "write",
        block: "1m",
        iodepth: 8,
        connections: 1,
        sequential: true,
    },
];

/// What a target is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    RmemFit,
    Rmem4x,
    NbdkitMemory,
    NbdkitFile,
    Loop,
}

const KINDS: [(Kind, &str, &str); 5] = [
    (
        Kind::NbdkitMemory,
        "nbdkit-memory",
        "nbdkit memory (anchor)",
    ),
    (Kind::RmemFit, "rmem-fit", "rmem nbd, data fits the cache"),
    (Kind::Rmem4x, "rmem-4x", "rmem nbd, data 4x the cache"),
    (Kind::NbdkitFile, "nbdkit-file", "nbdkit file, local disk"),
    (Kind::Loop, "loop", "kernel loop, local disk"),
];

fn key(k: Kind) -> &'static str {
    KINDS.iter().find(|x| x.0 == k).expect("known").1
}

/// A started target: how fio reaches it, and what to stop at the end.
struct Target {
    kind: Kind,
    /// fio's arguments that name the target.
    fio_args: Vec<String>,
    child: Option<Child>,
    /// The loop device to detach.
    loop_dev: Option<String>,
    /// rmem nbd's statistics at exit.
    stats_json: Option<PathBuf>,
    /// The rmem cache size.
    cache: Option<u64>,
}

impl Target {
    /// Stop the process (SIGTERM, then SIGKILL after 30 s) or detach the loop device.
    fn stop(&mut self) -> Result<(), String> {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child, not reaped yet.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            loop {
                if let Some(s) = c.try_wait().map_err(err)? {
                    // nbdkit exits by the signal; rmem nbd with 0.
                    if self.kind != Kind::NbdkitMemory
                        && self.kind != Kind::NbdkitFile
                        && !s.success()
                    {
                        return Err(format!("{} exited with {s}", key(self.kind)));
                    }
                    break;
                }
                if t.elapsed() > Duration::from_secs(30) {
                    let _ = c.kill();
                    let _ = c.wait();
                    return Err(format!("{} did not stop within 30 s", key(self.kind)));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Some(d) = self.loop_dev.take() {
            let s = Command::new("losetup").arg("-d").arg(&d).status();
            if !s.is_ok_and(|s| s.success()) {
                return Err(format!("losetup -d {d} failed"));
            }
        }
        Ok(())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(d) = self.loop_dev.take() {
            let _ = Command::new("losetup").arg("-d").arg(&d).status();
        }
    }
}

/// What fio measured for one job on one target.
#[derive(Clone, Copy, Debug)]
struct Measured {
    iops: f64,
    mb_per_s: f64,
    lat_us_p50: f64,
    lat_us_p99: f64,
}

/// Wait until a Unix socket exists (both servers bind it when they listen; a connection
/// made only to test it would make nbdkit log a broken handshake).
fn wait_socket(path: &Path, child: &mut Child, what: &str) -> Result<(), String> {
    let t = Instant::now();
    while !path.exists() {
        if let Some(s) = child.try_wait().map_err(err)? {
            return Err(format!("{what} exited with {s} before listening"));
        }
        if t.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "{what} did not listen on {} in 30 s",
                path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn nbd_uri(sock: &Path) -> String {
    format!("--uri=nbd+unix:///?socket={}", sock.display())
}

/// Start a target of `size` bytes; Err(reason) if it cannot run here.
fn start(kind: Kind, size: u64, work: &Path) -> Result<Target, String> {
    let name = key(kind);
    let sock = work.join(format!("{name}.sock"));
    let file = work.join(format!("{name}.img"));
    let mut t = Target {
        kind,
        fio_args: vec!["--ioengine=nbd".into(), nbd_uri(&sock)],
        child: None,
        loop_dev: None,
        stats_json: None,
        cache: None,
    };
    let nbdkit = |args: &[&str]| {
        Command::new("nbdkit")
            .args(["--foreground", "--exit-with-parent", "--unix"])
            .arg(&sock)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start nbdkit (scripts/deps.sh installs it): {e}"))
    };
    let sparse_file = |file: &Path| {
        std::fs::File::create(file)
            .and_then(|f| f.set_len(size))
            .map_err(|e| format!("cannot create {}: {e}", file.display()))
    };
    match kind {
        Kind::NbdkitMemory => {
            t.child = Some(nbdkit(&["memory", &size.to_string()])?);
        }
        Kind::NbdkitFile => {
            sparse_file(&file)?;
            t.child = Some(nbdkit(&["file", &file.to_string_lossy()])?);
        }
        Kind::RmemFit | Kind::Rmem4x => {
            // Fits: the data and the free buffers the evictor keeps ahead (1/64 of the cache).
            let cache = if kind == Kind::RmemFit {
                size + size / 8
            } else {
                size / 4
            };
            let cache = cache.max(1 << 20) >> 12 << 12;
            let stats = work.join(format!("{name}-stats.json"));
            let log = std::fs::File::create(work.join(format!("{name}.log"))).map_err(err)?;
            let mut child = dies_with_us(&mut Command::new(rmem_cli::launch::rmem_exe()?))
                .args(["nbd", "--servers", "1", "--size", &size.to_string()])
                .args(["--cache", &cache.to_string(), "--socket"])
                .arg(&sock)
                .arg("--stats-json")
                .arg(&stats)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .map_err(|e| format!("cannot start rmem nbd: {e}"))?;
            let out = child.stdout.take().expect("piped");
            // Its first line says where it listens; the rest is drained so it never blocks.
            std::thread::spawn(
                move || {
                    for _ in BufReader::new(out).lines().map_while(Result::ok) {}
                },
            );
            t.child = Some(child);
            t.stats_json = Some(stats);
            t.cache = Some(cache);
        }
        Kind::Loop => {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return Err("skipped: the loop device needs root (losetup)".into());
            }
            sparse_file(&file)?;
            let out = Command::new("losetup")
                .args(["--find", "--show"])
                .arg(&file)
                .output()
                .map_err(|e| format!("skipped: cannot run losetup: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "skipped: losetup failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
            t.fio_args = vec![
                "--ioengine=libaio".into(),
                "--direct=1".into(),
                format!("--filename={dev}"),
            ];
            t.loop_dev = Some(dev);
            return Ok(t);
        }
    }
    let child = t.child.as_mut().expect("started");
    wait_socket(&sock, child, name)?;
    Ok(t)
}

/// `cmd`, set to be killed when the benchmark dies (a benchmark killed at its time limit
/// leaves no rmem nbd or fio behind).
fn dies_with_us(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure calls only prctl, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}

/// Run fio with `args` on `target`, bounded to `limit`; its JSON report.
fn fio(
    target: &Target,
    args: &[String],
    work: &Path,
    limit: Duration,
) -> Result<serde_json::Value, String> {
    let out = work.join("fio.json");
    let _ = std::fs::remove_file(&out);
    let mut child = dies_with_us(&mut Command::new("fio"))
        .args(args)
        .args(&target.fio_args)
        .arg("--output-format=json")
        .arg(format!("--output={}", out.display()))
        .current_dir(work)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start fio (scripts/deps.sh installs it): {e}"))?;
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(err)? {
            break s;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "fio on {} ran over {} s",
                key(target.kind),
                limit.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    // fio may put lines of its own before the JSON.
    let json = text.find('{').map_or("", |i| &text[i..]);
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| {
        format!(
            "fio on {} ({status}): no report ({e}): {}",
            key(target.kind),
            stderr.trim()
        )
    })?;
    if !status.success() || v["jobs"][0]["error"].as_i64() != Some(0) {
        return Err(format!(
            "fio on {} failed ({status}): {}",
            key(target.kind),
            stderr.trim()
        ));
    }
    Ok(v)
}

/// Fill the whole target with sequential 1 MiB writes (so that reads read real data).
fn prefill(target: &Target, size: u64, work: &Path) -> Result<f64, String> {
    let t = Instant::now();
    let args: Vec<String> = [
        "--name=prefill",
        "--rw=write",
        "--bs=1m",
        "--iodepth=8",
        &format!("--size={size}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    fio(target, &args, work, Duration::from_secs(600))?;
    Ok(size as f64 / t.elapsed().as_secs_f64() / 1e6)
}

fn run_job(
    target: &Target,
    job: &Job,
    size: u64,
    a: &NbdBenchArgs,
    work: &Path,
) -> Result<Measured, String> {
    let args: Vec<String> = vec![
        format!("--name={}", job.name),
        format!("--rw={}", job.rw),
        format!("--bs={}", job.block),
        format!("--iodepth={}", job.iodepth),
        format!("--numjobs={}", job.connections),
        format!("--size={size}"),
        "--group_reporting".into(),
        "--norandommap".into(),
        "--randrepeat=0".into(),
        "--time_based".into(),
        format!("--runtime={}", a.runtime_s.max(1)),
        format!("--ramp_time={}", a.ramp_s),
    ];
    let limit = Duration::from_secs(a.runtime_s + a.ramp_s + 120);
    let v = fio(target, &args, work, limit)?;
    let side = if job.rw.contains("read") {
        "read"
    } else {
        "write"
    };
    let r = &v["jobs"][0][side];
    let f = |x: &serde_json::Value| x.as_f64().unwrap_or(0.0);
    let pct = |q: &str| f(&r["clat_ns"]["percentile"][q]) / 1e3;
    Ok(Measured {
        iops: f(&r["iops"]),
        mb_per_s: f(&r["bw_bytes"]) / 1e6,
        lat_us_p50: pct("50.000000"),
        lat_us_p99: pct("99.000000"),
    })
}

/// One cell of the table: a target's result for a job, or why it has none.
struct Cell {
    kind: Kind,
    job: usize,
    result: Result<Measured, String>,
}

pub fn nbd(a: NbdBenchArgs) -> Result<(), String> {
    let size = parse_size(&a.size).map_err(|e| format!("--size {}: {e}", a.size))?;
    if size < 8 << 20 {
        return Err("--size must be at least 8M".into());
    }
    let size = size >> 20 << 20;
    let mut kinds = vec![Kind::NbdkitMemory];
    for t in a.targets.split(',').map(str::trim) {
        let k = KINDS
            .iter()
            .find(|x| x.1 == t)
            .ok_or_else(|| {
                format!(
                    "--targets {t}: known are rmem-fit, rmem-4x, nbdkit-memory, nbdkit-file, loop"
                )
            })?
            .0;
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    let mut jobs = Vec::new();
    for j in a.jobs.split(',').map(str::trim) {
        let i = JOBS
            .iter()
            .position(|x| x.name == j)
            .ok_or_else(|| format!("--jobs {j}: unknown job"))?;
        jobs.push(i);
    }
    let work = a
        .disk
        .dir
        .join(format!("rmem-bench-nbd-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let r = run(&a, size, &kinds, &jobs, &work);
    let _ = std::fs::remove_dir_all(&work);
    r
}

fn run(
    a: &NbdBenchArgs,
    size: u64,
    kinds: &[Kind],
    jobs: &[usize],
    work: &Path,
) -> Result<(), String> {
    // The limits first, while nothing else of this run is busy.
    let limits = crate::limits::measure(2000, 64)?;
    let (raw50, raw99) = {
        let (_servers, config) = local_setup(4096, 1 << 20, 64 << 20)?;
        let mut raw = RawRoundTrip::connect(&config)?;
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut s = raw.sample(2000, &mut x)?;
        s.sort();
        (percentile_us(&s, 0.5), percentile_us(&s, 0.99))
    };
    let loop_mbs = limits.loopback_bytes_per_s() / 1e6;
    println!(
        "rmem bench nbd: {} MiB per target, fio {} s per job (after {} s ramp); loopback \
         {:.1} Gbit/s ({loop_mbs:.0} MB/s), TCP 4 KiB round trip {:.1} us, rmem raw 4 KiB \
         round trip p50 {raw50:.1} us p99 {raw99:.1} us",
        size >> 20,
        a.runtime_s,
        a.ramp_s,
        limits.loopback_gbps,
        limits.rtt_us_p50,
    );
    let mut targets: Vec<Result<Target, String>> = Vec::new();
    for &k in kinds {
        let t = start(k, size, work);
        let t = match t {
            Ok(t) => prefill(&t, size, work).map(|mbs| {
                println!("  {:<14} ready, filled at {mbs:.0} MB/s", key(k));
                t
            }),
            Err(e) => Err(e),
        };
        if let Err(e) = &t {
            if k == Kind::NbdkitMemory || !e.starts_with("skipped") {
                return Err(format!("{}: {e}", key(k)));
            }
            println!("  {:<14} {e}", key(k));
        }
        targets.push(t);
    }
    let mut cells: Vec<Cell> = Vec::new();
    for &j in jobs {
        let job = &JOBS[j];
        for (i, t) in targets.iter().enumerate() {
            let result = match t {
                // A target that fails (a memory server lost, fio refused) is recorded as
                // failed, and the others go on.
                Ok(t) => run_job(t, job, size, a, work).map_err(|e| format!("failed: {e}")),
                Err(e) => Err(e.clone()),
            };
            cells.push(Cell {
                kind: kinds[i],
                job: j,
                result,
            });
        }
        print_job(job, &cells);
    }
    // Stop everything (rmem nbd flushes and writes its statistics).
    let mut rmem_stats = serde_json::Map::new();
    for t in targets.iter_mut().flatten() {
        if let Err(e) = t.stop() {
            println!("  warning: {e}");
        }
        if let Some(p) = &t.stats_json {
            let s = std::fs::read_to_string(p).unwrap_or_default();
            let v: serde_json::Value = serde_json::from_str(&s).unwrap_or(json!(null));
            rmem_stats.insert(
                key(t.kind).into(),
                json!({"cache_bytes": t.cache, "stats": v}),
            );
        }
    }
    let goals = goals(&cells, loop_mbs, raw50);
    print_goals(&goals);
    // What a miss adds to a hit at queue depth 1, against the raw round trip: the part of
    // the 4x case's latency rmem's own path is responsible for (the NBD hop is in both).
    let qd1 = JOBS
        .iter()
        .position(|x| x.name == "randread-4k-qd1")
        .expect("known");
    let p50 = |k: Kind| {
        cells
            .iter()
            .find(|c| c.kind == k && c.job == qd1)
            .and_then(|c| c.result.as_ref().ok().map(|m| m.lat_us_p50))
    };
    let miss_us = p50(Kind::Rmem4x)
        .zip(p50(Kind::RmemFit))
        .map(|(m, h)| m - h);
    if let Some(m) = miss_us {
        println!(
            "  randread-4k-qd1 p50, 4x cache less fits: {m:.1} us = {:.2}x the raw round trip \
             (the NBD hop alone: nbdkit memory's p50 {:.1} us)",
            m / raw50,
            p50(Kind::NbdkitMemory).unwrap_or(f64::NAN)
        );
    }
    if let Some(dir) = &a.plots.plot {
        plots(dir, &cells, jobs, kinds)?;
    }
    let results: Vec<serde_json::Value> = cells
        .iter()
        .map(|c| {
            let job = &JOBS[c.job];
            let mut v = json!({"target": key(c.kind), "job": job.name});
            match (&c.result, anchor(&cells, c.job)) {
                (Ok(m), Some(base)) => {
                    v["status"] = json!("ok");
                    v["iops"] = json!(m.iops);
                    v["mb_per_s"] = json!(m.mb_per_s);
                    v["lat_us_p50"] = json!(m.lat_us_p50);
                    v["lat_us_p99"] = json!(m.lat_us_p99);
                    v["iops_ratio"] = json!(m.iops / base.iops);
                    v["mb_per_s_ratio"] = json!(m.mb_per_s / base.mb_per_s);
                    v["lat_p50_ratio"] = json!(m.lat_us_p50 / base.lat_us_p50);
                    v["lat_p99_ratio"] = json!(m.lat_us_p99 / base.lat_us_p99);
                }
                (Err(e), _) => {
                    let failed = e.starts_with("failed");
                    v["status"] = json!(if failed { "failed" } else { "skipped" });
                    v["reason"] = json!(e);
                }
                (Ok(_), None) => unreachable!("the anchor always runs"),
            }
            v
        })
        .collect();
    let job_list: Vec<serde_json::Value> = jobs
        .iter()
        .map(|&j| {
            let job = &JOBS[j];
            json!({"name": job.name, "rw": job.rw, "block": job.block,
                   "iodepth_per_connection": job.iodepth, "connections": job.connections})
        })
        .collect();
    let goal_list = goals_json(&goals);
    a.out.write(&json!({
        "size": size, "runtime_s": a.runtime_s, "ramp_s": a.ramp_s,
        "anchor": key(Kind::NbdkitMemory),
        "loopback_gbps": limits.loopback_gbps, "loopback_mb_per_s": loop_mbs,
        "tcp_rtt_us_p50": limits.rtt_us_p50,
        "raw_rtt_us_p50": raw50, "raw_rtt_us_p99": raw99,
        "miss_over_hit_us_p50": miss_us,
        "jobs": job_list, "results": results, "targets": goal_list,
        "rmem": rmem_stats,
    }))
}

/// The anchor's result for job `j`.
fn anchor(cells: &[Cell], j: usize) -> Option<Measured> {
    cells
        .iter()
        .find(|c| c.job == j && c.kind == Kind::NbdkitMemory)
        .and_then(|c| c.result.as_ref().ok().copied())
}

fn print_job(job: &Job, cells: &[Cell]) {
    let j = JOBS.iter().position(|x| x.name == job.name).expect("known");
    let base = anchor(cells, j).expect("the anchor ran");
    println!(
        "  {} ({} {}, {} in flight on each of {} connections):",
        job.name, job.rw, job.block, job.iodepth, job.connections
    );
    println!(
        "    {:<32} {:>9} {:>8} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7}",
        "target", "IOPS", "MB/s", "p50 us", "p99 us", "x IOPS", "x MB/s", "x p50", "x p99"
    );
    for c in cells.iter().filter(|c| c.job == j) {
        let label = KINDS.iter().find(|x| x.0 == c.kind).expect("known").2;
        match &c.result {
            Ok(m) => println!(
                "    {:<32} {:>9.0} {:>8.1} {:>9.1} {:>9.1} {:>7.2} {:>7.2} {:>7.2} {:>7.2}",
                label,
                m.iops,
                m.mb_per_s,
                m.lat_us_p50,
                m.lat_us_p99,
                m.iops / base.iops,
                m.mb_per_s / base.mb_per_s,
                m.lat_us_p50 / base.lat_us_p50,
                m.lat_us_p99 / base.lat_us_p99
            ),
            Err(e) => println!("    {label:<32} {e}"),
        }
    }
}

fn goals(cells: &[Cell], loop_mbs: f64, raw_rtt_us: f64) -> Vec<Goal> {
    let get = |k: Kind, name: &str| {
        let j = JOBS.iter().position(|x| x.name == name).expect("known");
        let m = cells
            .iter()
            .find(|c| c.kind == k && c.job == j)
            .and_then(|c| c.result.as_ref().ok().copied());
        m.zip(anchor(cells, j))
    };
    let mut out = Vec::new();
    let mut goal = |what: String, v: Option<f64>, bound: f64, at_least: bool| {
        out.push(Goal::new(what, v, bound, at_least))
    };
    for name in ["randread-4k-qd32", "randwrite-4k-qd32"] {
        let v = get(Kind::RmemFit, name).map(|(m, b)| m.iops / b.iops);
        goal(format!("fits: {name} IOPS x nbdkit memory"), v, 0.8, true);
    }
    for name in ["read-1m", "write-1m"] {
        let v = get(Kind::RmemFit, name).map(|(m, b)| m.mb_per_s / b.mb_per_s);
        goal(format!("fits: {name} MB/s x nbdkit memory"), v, 0.8, true);
    }
    for name in ["read-1m", "write-1m"] {
        let v = get(Kind::Rmem4x, name).map(|(m, _)| m.mb_per_s / loop_mbs);
        goal(
            format!("4x cache: {name} MB/s x loopback bandwidth"),
            v,
            0.5,
            true,
        );
    }
    let v = get(Kind::Rmem4x, "randread-4k-qd1").map(|(m, _)| m.lat_us_p50 / raw_rtt_us);
    goal(
        "4x cache: randread-4k-qd1 p50 x raw 4 KiB round trip".into(),
        v,
        2.0,
        false,
    );
    out
}

/// nbd.png and nbd.svg: each target's throughput (IOPS for 4 KiB jobs, MB/s for 1 MiB ones)
/// against nbdkit memory's, per job.
fn plots(dir: &Path, cells: &[Cell], jobs: &[usize], kinds: &[Kind]) -> Result<(), String> {
    let groups: Vec<String> = jobs.iter().map(|&j| JOBS[j].name.to_string()).collect();
    let mut series = Vec::new();
    for &k in kinds {
        let label = KINDS.iter().find(|x| x.0 == k).expect("known").2;
        let values: Vec<Option<f64>> = jobs
            .iter()
            .map(|&j| {
                let m = cells
                    .iter()
                    .find(|c| c.kind == k && c.job == j)
                    .and_then(|c| c.result.as_ref().ok())?;
                let b = anchor(cells, j)?;
                Some(if JOBS[j].sequential {
                    m.mb_per_s / b.mb_per_s
                } else {
                    m.iops / b.iops
                })
            })
            .collect();
        series.push(plot::Bars {
            label: label.to_string(),
            values,
        });
    }
    plot::bars(
        dir,
        "nbd",
        "rmem bench nbd: throughput x nbdkit memory",
        "IOPS (4 KiB) or MB/s (1 MiB) x nbdkit memory",
        &groups,
        &series,
    )?;
    println!("wrote {}/nbd.png and nbd.svg", dir.display());
    Ok(())
}
