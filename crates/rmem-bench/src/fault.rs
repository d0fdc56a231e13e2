//! `rmem bench fault`: the latency of one remote 4 KiB fault against the raw 4 KiB round trip,
//! in one run, and remote faults per second by faulting threads.

use crate::report::{err, percentile_us, JsonOut};
use crate::setup::{local_setup, xorshift, RawRoundTrip, PS};
use rmem_client::config::Config;
use rmem_client::store::mem::MemStore;
use rmem_client::Runtime;
use std::time::{Duration, Instant};

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
    #[command(flatten)]
    pub out: JsonOut,
}

pub fn fault(a: FaultArgs) -> Result<(), String> {
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
    a.out.write(&serde_json::json!({
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
    }))
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
