//! `rmem bench`: benchmarks that print ratios measured in one run and write JSON.

use crate::launch::{fresh_token, start_local_servers};
use rmem_client::config::{Config, Placement};
use rmem_client::store::mem::MemStore;
use rmem_client::store::remote::RemoteStore;
use rmem_client::store::{Completion, PageStore};
use rmem_client::{PageIndex, Runtime};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Latency of one remote 4 KiB fault against the raw 4 KiB round trip, in one run.
    Fault(FaultArgs),
    /// Sequential scan bandwidth of a region larger than the local budget, per page size.
    Scan(ScanArgs),
    /// The workloads on local memory, rmem, and kernel swap to disk and to zram under a
    /// cgroup limit, at several local ratios and page sizes, with the network's limits.
    Suite(crate::bench_suite::SuiteArgs),
    /// Every workload pattern at several local ratios under every policy, live and simulated.
    Policies(crate::policy_bench::PoliciesArgs),
    /// Real programs (GNU sort, numpy as nobody, CPython's small objects) in transparent mode
    /// at a quarter of their footprint, against the same programs without rmem.
    Programs(crate::programs_bench::ProgramsArgs),
    /// What trapping system calls with remote buffers costs per call, unprivileged, against
    /// the same calls without rmem and with the trap off.
    Syscalls(crate::syscall_bench::SyscallsArgs),
    /// fork() then exec under rmem against without it, and multiprocessing.Pool with the fork
    /// start method against spawn over remote numpy arrays.
    Fork(crate::fork_bench::ForkArgs),
    /// What surviving a server loss costs: each redundancy layout, with and without
    /// encryption, against none (time, memory, latency), and its repair throughput.
    Redundancy(crate::redundancy_bench::RedundancyArgs),
    /// The block device (`rmem nbd`, data fitting its cache and 4x it) under fio against
    /// nbdkit's memory plugin, nbdkit's file plugin and the kernel's loop device.
    Nbd(crate::nbd_bench::NbdBenchArgs),
    /// The memory pool: a drain's and a reclaim's MB/s and the program's slowdown meanwhile,
    /// direct access by transfer size, a disk-backed server against the raw disk.
    Pool(crate::pool_bench::PoolBenchArgs),
}

#[derive(clap::Args, Debug)]
pub struct FaultArgs {
    /// Faults and round trips to time.
    #[arg(long, default_value_t = 20000)]
    pub samples: usize,
    /// Faulting threads to measure remote faults per second with, comma-separated (each
    /// touches pages of its own at random; the pager serves them all).
    #[arg(long, default_value = "1,2,4,8")]
    pub threads: String,
    /// How long each thread count runs, in seconds.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct ScanArgs {
    /// Bytes scanned.
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// Local budget as a percentage of the size.
    #[arg(long, default_value_t = 25)]
    pub local_percent: u64,
    /// Page sizes to measure, comma-separated.
    #[arg(long, default_value = "4K,16K,64K,256K,1M")]
    pub page_sizes: String,
    /// Passes over the region (the first one fills it).
    #[arg(long, default_value_t = 2)]
    pub passes: usize,
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Prefetching: on or off.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub prefetch: String,
}

pub fn run(cmd: BenchCommand) -> i32 {
    let r = match cmd {
        BenchCommand::Fault(a) => fault(a),
        BenchCommand::Scan(a) => scan(a),
        BenchCommand::Suite(a) => crate::bench_suite::run(a),
        BenchCommand::Policies(a) => crate::policy_bench::policies(a),
        BenchCommand::Programs(a) => crate::programs_bench::programs(a),
        BenchCommand::Syscalls(a) => crate::syscall_bench::syscalls(a),
        BenchCommand::Fork(a) => crate::fork_bench::fork(a),
        BenchCommand::Redundancy(a) => crate::redundancy_bench::redundancy(a),
        BenchCommand::Nbd(a) => crate::nbd_bench::nbd(a),
        BenchCommand::Pool(a) => crate::pool_bench::pool(a),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rmem bench: {e}");
            1
        }
    }
}

pub(crate) fn percentile_us(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

pub(crate) fn write_json(path: &Option<PathBuf>, v: &serde_json::Value) -> Result<(), String> {
    if let Some(p) = path {
        let s = serde_json::to_string_pretty(v).expect("json");
        std::fs::write(p, s + "\n").map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// One of an issue's targets, evaluated in a benchmark's run.
pub(crate) struct Goal {
    pub what: String,
    pub value: f64,
    pub bound: f64,
    /// The value must be at least the bound (else at most).
    pub at_least: bool,
    /// None: not measured in this run.
    pub met: Option<bool>,
}

impl Goal {
    pub(crate) fn new(what: impl Into<String>, v: Option<f64>, bound: f64, at_least: bool) -> Goal {
        Goal {
            what: what.into(),
            value: v.unwrap_or(f64::NAN),
            bound,
            at_least,
            met: v.map(|v| if at_least { v >= bound } else { v <= bound }),
        }
    }
}

/// Print `goals` as `  targets:` and one line each: value, bound, met / NOT met.
pub(crate) fn print_goals(goals: &[Goal]) {
    println!("  targets:");
    for g in goals {
        println!(
            "    {:<58} {:>8.2} {} {:<6} {}",
            g.what,
            g.value,
            if g.at_least { ">=" } else { "<=" },
            format!("{:.2}", g.bound),
            match g.met {
                Some(true) => "met",
                Some(false) => "NOT met",
                None => "not measured",
            }
        );
    }
}

pub(crate) fn goals_json(goals: &[Goal]) -> Vec<serde_json::Value> {
    goals
        .iter()
        .map(|g| {
            serde_json::json!({"what": g.what, "value": g.value, "bound": g.bound,
                               "at_least": g.at_least, "met": g.met})
        })
        .collect()
}

pub(crate) fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// One memory server process and a configuration pointing at it.
pub(crate) fn local_setup(
    page_size: usize,
    local_bytes: u64,
    capacity: u64,
) -> Result<(Vec<crate::launch::ServerProc>, Config), String> {
    let token = fresh_token();
    let servers = start_local_servers(1, capacity, &token)?;
    let config = Config {
        servers: servers.iter().map(|s| s.addr.clone()).collect(),
        token: token.into_bytes(),
        page_size,
        local_bytes,
        region_bytes: 1 << 36,
        ..Config::default()
    };
    Ok((servers, config))
}

fn fault(a: FaultArgs) -> Result<(), String> {
    // Blocks of each measurement alternate, so that a change in the machine's speed during
    // the run (other tenants, frequency) weighs on all three alike.
    const ROUNDS: usize = 10;
    let samples = a.samples.max(100);
    let block = samples.div_ceil(ROUNDS);
    let local_pages = 256u64;
    let pages = (samples as u64).max(4 * local_pages) as usize;
    let (_servers, config) = local_setup(
        PS,
        local_pages * PS as u64,
        (pages as u64 + 16) * PS as u64 * 4, // two remote runtimes
    )?;
    let mut x = 88172645463325252u64;

    // Raw round trips: the same store and transport, without userfaultfd.
    let mut raw = RawRoundTrip::connect(&config)?;
    // Faults as the program sees them: touch a page that lives on the server.
    let remote = Runtime::connect(&config).map_err(|e| rmem_client::error_chain(&e))?;
    let mut remote_faults = Faulter::new(&remote, pages, local_pages as usize, &mut x)?;
    // The same faults resolved from an in-process store: what userfaultfd and the pager
    // cost without the network.
    let in_process = Runtime::start(
        &config,
        Box::new(MemStore::new(PS, config.region_bytes)),
        Box::new(rmem_client::runtime::exit_on_fatal),
    )
    .map_err(|e| rmem_client::error_chain(&e))?;
    let mut local_faults = Faulter::new(&in_process, pages, local_pages as usize, &mut x)?;
    // The remote faults again, delivered to the pager by signal (RMEM_FAULT_DELIVERY=signal).
    let by_signal = Runtime::connect(&Config {
        fault_by_signal: true,
        ..config.clone()
    })
    .map_err(|e| rmem_client::error_chain(&e))?;
    let mut signal_faults = Faulter::new(&by_signal, pages, local_pages as usize, &mut x)?;

    let before = remote.stats();
    let (mut rtt, mut faults, mut local, mut signal) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        rtt.extend(raw.sample(block, &mut x)?);
        faults.extend(remote_faults.sample(block)?);
        local.extend(local_faults.sample(block)?);
        signal.extend(signal_faults.sample(block)?);
    }
    let swap_ins = remote.stats().swap_ins - before.swap_ins;
    let counts: Vec<usize> = a
        .threads
        .split(',')
        .map(|t| t.trim().parse().ok().filter(|&n| (1..=256).contains(&n)))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            format!(
                "--threads {:?}: thread counts 1 to 256, comma-separated",
                a.threads
            )
        })?;
    remote_faults.free()?;
    local_faults.free()?;
    signal_faults.free()?;
    let mut rates = Vec::new();
    for &n in &counts {
        rates.push((n, fault_rate(&remote, n, pages, a.seconds)?));
    }
    rtt.sort();
    faults.sort();
    local.sort();
    signal.sort();
    let (f50, f99) = (percentile_us(&faults, 0.5), percentile_us(&faults, 0.99));
    let (r50, r99) = (percentile_us(&rtt, 0.5), percentile_us(&rtt, 0.99));
    let (l50, l99) = (percentile_us(&local, 0.5), percentile_us(&local, 0.99));
    let (s50, s99) = (percentile_us(&signal, 0.5), percentile_us(&signal, 0.99));
    println!(
        "rmem bench fault: 4 KiB pages, one local memory server on loopback, \
         {samples} samples each, in {ROUNDS} alternating blocks"
    );
    println!("  raw 4 KiB round trip   p50 {r50:7.1} us   p99 {r99:7.1} us");
    println!(
        "  remote 4 KiB fault     p50 {f50:7.1} us   p99 {f99:7.1} us   ({swap_ins} swap-ins)"
    );
    println!("  in-process 4 KiB fault p50 {l50:7.1} us   p99 {l99:7.1} us   (no network)");
    println!("  remote fault by signal p50 {s50:7.1} us   p99 {s99:7.1} us   (RMEM_FAULT_DELIVERY=signal)");
    println!(
        "  fault / round trip     p50 {:5.2}x      p99 {:5.2}x   (target: p50 <= 1.50x)",
        f50 / r50,
        f99 / r99
    );
    println!(
        "  by signal / round trip p50 {:5.2}x      p99 {:5.2}x",
        s50 / r50,
        s99 / r99
    );
    let one = rates.iter().find(|r| r.0 == 1).map(|r| r.1);
    println!(
        "  remote faults per second, {} s per thread count, {} CPUs:",
        a.seconds,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for &(n, r) in &rates {
        let vs = one.map_or(String::new(), |o| format!("   {:5.2}x one thread", r / o));
        println!("    {n:3} threads {r:10.0} faults/s{vs}");
    }
    println!("    (target: 8 threads >= 3x one thread on 4 or more cores, >= 1.5x on 2)");
    write_json(
        &a.json,
        &serde_json::json!({
            "fault_us_p50": f50, "fault_us_p99": f99, "rtt_us_p50": r50, "rtt_us_p99": r99,
            "local_fault_us_p50": l50, "local_fault_us_p99": l99,
            "signal_fault_us_p50": s50, "signal_fault_us_p99": s99, "signal_ratio_p50": s50 / r50,
            "ratio_p50": f50 / r50, "samples": samples, "swap_ins": swap_ins, "page_size": PS,
            "cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
            "seconds_per_count": a.seconds,
            "faults_per_s": rates.iter().map(|&(n, r)| serde_json::json!({
                "threads": n, "faults_per_s": r,
                "vs_one_thread": one.map(|o| r / o),
            })).collect::<Vec<_>>(),
        }),
    )
}

/// Remote faults per second with `threads` threads touching `pages` pages (each its own
/// part, at random, checked) for `seconds`: the pager's swap-ins over the wall time.
fn fault_rate(rt: &Runtime, threads: usize, pages: usize, seconds: f64) -> Result<f64, String> {
    let pages = pages.max(threads * 64);
    let base = rt.alloc(pages * PS).ok_or("allocation failed")? as usize;
    let per = pages / threads;
    for p in 0..pages {
        // SAFETY: inside the allocation of pages * PS bytes.
        unsafe { (base as *mut u8).add(p * PS).write_volatile(p as u8 | 1) };
    }
    let before = rt.stats().swap_ins;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(seconds);
    let bad = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                    while Instant::now() < end {
                        for _ in 0..64 {
                            let p = t * per + (xorshift(&mut x) % per as u64) as usize;
                            // SAFETY: inside the allocation.
                            let v = unsafe { (base as *const u8).add(p * PS).read_volatile() };
                            if v != p as u8 | 1 {
                                return Some(format!(
                                    "page {p} read {v}, expected {}",
                                    p as u8 | 1
                                ));
                            }
                        }
                    }
                    None
                })
            })
            .collect();
        workers
            .into_iter()
            .find_map(|w| w.join().expect("a faulting thread"))
    });
    let elapsed = t0.elapsed().as_secs_f64();
    let faults = rt.stats().swap_ins - before;
    rt.free(base as *mut u8).map_err(err)?;
    match bad {
        Some(e) => Err(e),
        None => Ok(faults as f64 / elapsed),
    }
}

/// The page size `rmem bench fault` measures.
const PS: usize = 4096;

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A 4 KiB read request and its answer over the client's own transport, without userfaultfd.
pub(crate) struct RawRoundTrip {
    store: RemoteStore,
    pages: u64,
}

impl RawRoundTrip {
    pub(crate) fn connect(config: &Config) -> Result<RawRoundTrip, String> {
        let mut store = RemoteStore::connect(
            &config.servers,
            &config.token,
            PS,
            Placement::Priority,
            rmem_client::store::remote::Timing::of(config),
        )
        .map_err(err)?;
        let page = vec![0xA5u8; PS];
        let pages = 1024u64;
        for p in 0..pages {
            store.store(PageIndex(p), &page).map_err(err)?;
        }
        store.flush().map_err(err)?;
        let mut stored = 0;
        while stored < pages {
            // The socket may not take every request at once: keep sending while waiting.
            store.flush().map_err(err)?;
            stored += store.poll(&mut |_| {}).map_err(err)? as u64;
        }
        let mut raw = RawRoundTrip { store, pages };
        let mut x = 1;
        raw.sample(1000, &mut x)?; // warm up
        Ok(raw)
    }

    pub(crate) fn sample(&mut self, n: usize, x: &mut u64) -> Result<Vec<Duration>, String> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let p = PageIndex(xorshift(x) % self.pages);
            let t0 = Instant::now();
            self.store.fetch(p).map_err(err)?;
            let mut got = false;
            while !got {
                self.store.flush().map_err(err)?;
                self.store
                    .poll(&mut |c| {
                        if let Completion::Fetched { data, .. } = c {
                            assert_eq!(data[0], 0xA5);
                            got = true;
                        }
                    })
                    .map_err(err)?;
            }
            out.push(t0.elapsed());
        }
        Ok(out)
    }
}

/// Reads of pages that live in the store, each a fault: pages written once, then touched
/// in a random order that comes round again only after far more pages than the budget.
struct Faulter<'a> {
    rt: &'a Runtime,
    base: *mut u8,
    order: Vec<usize>,
    next: usize,
}

impl<'a> Faulter<'a> {
    fn new(
        rt: &'a Runtime,
        pages: usize,
        local_pages: usize,
        x: &mut u64,
    ) -> Result<Faulter<'a>, String> {
        let base = rt.alloc(pages * PS).ok_or("allocation failed")?;
        for p in 0..pages {
            // SAFETY: inside the allocation of pages * PS bytes.
            unsafe { base.add(p * PS).write_volatile(p as u8 | 1) };
        }
        let mut order: Vec<usize> = (0..pages).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, (xorshift(x) % (i as u64 + 1)) as usize);
        }
        let mut f = Faulter {
            rt,
            base,
            order,
            next: 0,
        };
        // The first touches may hit pages still resident from the fill.
        f.sample(local_pages)?;
        Ok(f)
    }

    fn sample(&mut self, n: usize) -> Result<Vec<Duration>, String> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let p = self.order[self.next];
            self.next = (self.next + 1) % self.order.len();
            let t0 = Instant::now();
            // SAFETY: inside the allocation.
            let v = unsafe { self.base.add(p * PS).read_volatile() };
            let d = t0.elapsed();
            if v != (p as u8 | 1) {
                return Err(format!("page {p} read {v}, expected {}", p as u8 | 1));
            }
            out.push(d);
        }
        Ok(out)
    }

    fn free(self) -> Result<(), String> {
        self.rt.free(self.base).map_err(err)
    }
}

fn scan(a: ScanArgs) -> Result<(), String> {
    let size = rmem_proto::size::parse_size(&a.size).map_err(err)?;
    let mut rows = Vec::new();
    println!(
        "rmem bench scan: sequential read+write of {} MiB, local {}%, {} passes",
        size >> 20,
        a.local_percent,
        a.passes
    );
    println!(
        "  {:>8} {:>10} {:>10} {:>10} {:>10}",
        "page", "MB/s", "swap_ins", "swap_outs", "seconds"
    );
    for ps_s in a.page_sizes.split(',') {
        let ps = rmem_proto::size::parse_size(ps_s).map_err(err)? as usize;
        let local = (size * a.local_percent / 100).max(8 * ps as u64) / ps as u64 * ps as u64;
        let (_servers, mut config) = local_setup(ps, local, size * 2 + (64 << 20))?;
        config.prefetch = a.prefetch == "on";
        let rt = Runtime::connect(&config).map_err(|e| rmem_client::error_chain(&e))?;
        let words = size as usize / 8;
        let base = rt.alloc(size as usize).ok_or("allocation failed")? as *mut u64;
        // SAFETY: the allocation holds `words` u64s.
        let mem = unsafe { std::slice::from_raw_parts_mut(base, words) };
        for (i, w) in mem.iter_mut().enumerate().step_by(512) {
            *w = i as u64;
        }
        let before = rt.stats();
        let t0 = Instant::now();
        let mut sum = 0u64;
        for pass in 0..a.passes {
            // Read every word; write one word per 4 KiB so every page is dirty.
            for (i, w) in mem.iter_mut().enumerate() {
                sum = sum.wrapping_add(*w);
                if i % 512 == 0 {
                    *w = i as u64 + pass as u64 + 1;
                }
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let after = rt.stats();
        std::hint::black_box(sum);
        let mbs = (size as f64 * a.passes as f64) / secs / 1e6;
        println!(
            "  {:>8} {:>10.0} {:>10} {:>10} {:>10.3}",
            ps_s,
            mbs,
            after.swap_ins - before.swap_ins,
            after.swap_outs - before.swap_outs,
            secs
        );
        rows.push(serde_json::json!({
            "page_size": ps, "mb_per_s": mbs, "seconds": secs,
            "swap_ins": after.swap_ins - before.swap_ins, "swap_outs": after.swap_outs - before.swap_outs,
        }));
        rt.free(base.cast()).map_err(err)?;
    }
    write_json(
        &a.json,
        &serde_json::json!({"size": size, "local_percent": a.local_percent, "results": rows}),
    )
}
