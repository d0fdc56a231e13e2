//! `rmem bench suite`: should I use rmem, or just add swap? The workloads run on local
//! memory, on rmem (`rmem run --api` with local memory servers), and on kernel swap to a swap
//! file and to zram (lz4) under a cgroup v1 memory limit of the same size, at several local
//! ratios and rmem page sizes. The network's limits are measured in the same run, and DLM's
//! Table II (the time of one write that causes one page swap) is reproduced per page size.
//!
//! Every run is bounded in time and killed as a process group when it runs over; kernel swap
//! sometimes OOM-kills or hangs a job under a cgroup limit, which is recorded, never retried.
//! Ctrl-C stops the suite between or during runs, and the swap setup is undone on the way out
//! ([`crate::swap::SwapRig`]).

use crate::bounded::{self, interrupted, run_bounded, Finished, Status};
use crate::limits::{self, Limits};
use crate::plot;
use crate::report::{err, percentile_us, JsonOut, PlotOut};
use crate::setup::local_setup;
use crate::swap;
use crate::workloads;
use rmem_proto::size::parse_size;
use serde_json::json;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct SuiteArgs {
    /// Small sizes, under a minute: what the test suite runs. The default.
    #[arg(long, conflicts_with = "full")]
    pub quick: bool,
    /// Real sizes (STREAM over 240 MB, the others over 64 MiB): about 20 minutes.
    #[arg(long)]
    pub full: bool,
    /// Workloads to run, comma-separated (default stream,sort).
    #[arg(long, default_value = "stream,sort")]
    pub workloads: String,
    /// Data size of every workload in MiB (default: 8 with --quick; 229 for stream and 64
    /// for the others with --full).
    #[arg(long)]
    pub size_mib: Option<u64>,
    /// Local memory as percentages of the data, comma-separated.
    #[arg(long, default_value = "100,50,25,10")]
    pub ratios: String,
    /// rmem page sizes, comma-separated.
    #[arg(long, default_value = "4K,64K,256K,1M")]
    pub page_sizes: String,
    /// Systems, comma-separated, out of local, rmem, swap-disk, swap-zram.
    #[arg(long, default_value = "local,rmem,swap-disk,swap-zram")]
    pub systems: String,
    /// Longest one run may take, in seconds (default 30 with --quick, 180 with --full).
    #[arg(long)]
    pub timeout_s: Option<u64>,
    /// Directory for the swap file.
    #[arg(long, default_value = "/var/tmp")]
    pub swap_dir: PathBuf,
    #[command(flatten)]
    pub out: JsonOut,
    // --plot DIR: one plot per workload, WORKLOAD.png and WORKLOAD.svg.
    #[command(flatten)]
    pub plots: PlotOut,
}

/// Sizes and bounds of a quick or a full run.
struct Profile {
    full: bool,
    size_mib: Option<u64>,
    timeout: Duration,
    rtt_samples: usize,
    /// Sizes the bandwidth measurements.
    scale_mib: usize,
    /// Table II: local budget in pages; the region written is four times that.
    table2_budget_pages: usize,
    table2_passes: usize,
}

impl Profile {
    fn new(a: &SuiteArgs) -> Profile {
        let full = a.full;
        Profile {
            full,
            size_mib: a.size_mib,
            timeout: Duration::from_secs(a.timeout_s.unwrap_or(if full { 180 } else { 30 })),
            rtt_samples: if full { 20000 } else { 2000 },
            scale_mib: if full { 256 } else { 64 },
            table2_budget_pages: if full { 64 } else { 16 },
            table2_passes: if full { 3 } else { 1 },
        }
    }

    fn size_mib(&self, workload: &str) -> u64 {
        match (self.size_mib, self.full, workload) {
            (Some(s), _, _) => s,
            // 10M elements per array, as the reference measurement.
            (None, true, "stream") => 229,
            (None, true, _) => 64,
            (None, false, _) => 8,
        }
    }

    /// The workload's optional argument: fewer iterations or updates where the default
    /// would take minutes at a small local ratio.
    fn extra(&self, workload: &str) -> Option<&'static str> {
        match (self.full, workload) {
            (false, "stream") => Some("2"),
            (false, "himeno") => Some("2"),
            (false, "is") => Some("1"),
            (false, "cluster") => Some("8"),
            (false, "random") => Some("20000"),
            (true, "random") => Some("200000"),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Local,
    Rmem,
    SwapDisk,
    SwapZram,
}

impl System {
    const ALL: [System; 4] = [
        System::Local,
        System::Rmem,
        System::SwapDisk,
        System::SwapZram,
    ];

    fn name(self) -> &'static str {
        match self {
            System::Local => "local",
            System::Rmem => "rmem",
            System::SwapDisk => "swap-disk",
            System::SwapZram => "swap-zram",
        }
    }
}

/// What rmem's statistics say about one run.
#[derive(Clone, Copy, Debug)]
struct RmemStats {
    swap_ins: u64,
    swap_outs: u64,
    bytes_moved: u64,
}

/// Pages by which the workloads' arrays (at most this many, each rounded up to whole pages)
/// can exceed their data size.
const ARRAY_ROUNDING_PAGES: u64 = 4;

/// The resident pages rmem gets for `ratio` percent of `data` bytes in pages of `ps`: that
/// share of the footprint in whole pages (the data, with its arrays rounded up to pages).
fn rmem_resident_pages(data: u64, ratio: u64, ps: u64) -> u64 {
    ((data.div_ceil(ps) + ARRAY_ROUNDING_PAGES) * ratio).div_ceil(100)
}

/// rmem's local budget for `resident` pages of `ps`: those, plus the staging slots the runtime
/// sets aside within its budget. So 100% means the data fits, as it does under the
/// kernel-swap limit, which likewise covers the data and the workload's own overhead.
fn rmem_budget(resident: u64, ps: u64) -> u64 {
    let writeback_max = rmem_client::Config::default().writeback_max;
    rmem_client::config::budget_for_resident(resident, writeback_max) * ps
}

/// One workload x system x local ratio x page size.
#[derive(Clone, Debug)]
struct Cell {
    workload: String,
    system: System,
    ratio_pct: u64,
    /// rmem's page; the kernel's 4 KiB page otherwise.
    page_size: u64,
    status: Status,
    /// As the workload measured itself (its timed part).
    seconds: Option<f64>,
    /// The whole process, start to exit.
    wall_seconds: Option<f64>,
    reason: Option<String>,
    rmem: Option<RmemStats>,
    /// The cgroup limit of a kernel swap run.
    limit_bytes: Option<u64>,
}

impl Cell {
    fn new(workload: &str, system: System, ratio_pct: u64, page_size: u64) -> Cell {
        Cell {
            workload: workload.to_string(),
            system,
            ratio_pct,
            page_size,
            status: Status::Skipped,
            seconds: None,
            wall_seconds: None,
            reason: None,
            rmem: None,
            limit_bytes: None,
        }
    }

    fn skipped(mut self, why: &str) -> Cell {
        self.status = Status::Skipped;
        self.reason = Some(why.to_string());
        self
    }

    fn ok_seconds(&self) -> Option<f64> {
        (self.status == Status::Ok)
            .then_some(self.seconds)
            .flatten()
    }
}

const KERNEL_PAGE: u64 = 4096;

/// Run a workload binary and fill `cell` from how it ended.
fn run_cell(
    mut cell: Cell,
    cmd: &mut Command,
    limit: Duration,
    procs: Option<&File>,
) -> (Cell, Finished) {
    let f = run_bounded(cmd, limit, procs);
    cell.status = f.status;
    cell.wall_seconds = Some(f.wall);
    match (f.status, workloads::parse_result(&cell.workload, &f.stdout)) {
        (Status::Ok, Some(r)) => cell.seconds = Some(r.seconds),
        (Status::Ok, None) => {
            cell.status = Status::Failed;
            cell.reason = Some("no result line".into());
        }
        (Status::TimedOut, _) => cell.reason = Some(format!("ran over {limit:?}")),
        (_, _) => {
            let tail: Vec<&str> = f.stderr.lines().rev().take(3).collect();
            let why: Vec<&str> = tail.into_iter().rev().collect();
            cell.reason = Some(why.join(" | "));
        }
    }
    (cell, f)
}

fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty())
}

fn page_label(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{}M", bytes >> 20)
    } else {
        format!("{}K", bytes >> 10)
    }
}

/// Everything one suite run needs to know.
struct Suite {
    profile: Profile,
    workloads: Vec<(String, PathBuf)>,
    ratios: Vec<u64>,
    page_sizes: Vec<u64>,
    systems: Vec<System>,
    cells: Vec<Cell>,
}

impl Suite {
    fn args(&self, workload: &str) -> Vec<String> {
        let mut v = vec![self.profile.size_mib(workload).to_string()];
        v.extend(self.profile.extra(workload).map(str::to_string));
        v
    }

    fn data_bytes(&self, workload: &str) -> u64 {
        self.profile.size_mib(workload) << 20
    }

    fn local(&mut self, name: &str, prog: &Path) {
        let mut cmd = Command::new(prog);
        cmd.args(self.args(name)).env_remove("RMEM_MODE");
        let cell = Cell::new(name, System::Local, 100, KERNEL_PAGE);
        let (cell, _) = run_cell(cell, &mut cmd, self.profile.timeout, None);
        self.report(&cell);
        self.cells.push(cell);
    }

    fn rmem(&mut self, name: &str, prog: &Path, dir: &Path) -> Result<(), String> {
        let data = self.data_bytes(name);
        for &ratio in &self.ratios.clone() {
            for &ps in &self.page_sizes.clone() {
                interrupted()?;
                let resident = rmem_resident_pages(data, ratio, ps);
                let cell = Cell::new(name, System::Rmem, ratio, ps);
                if resident < 8 {
                    self.cells
                        .push(cell.skipped("local budget under 8 pages of this size"));
                    continue;
                }
                let budget = rmem_budget(resident, ps);
                let stats = dir.join(format!("{name}-{ratio}-{ps}.json"));
                let mut cmd = Command::new(rmem_cli::launch::rmem_exe()?);
                cmd.args(["run", "--api", "--servers", "1", "--local"])
                    .arg(budget.to_string())
                    .arg("--page-size")
                    .arg(ps.to_string())
                    .arg("--server-capacity")
                    .arg((2 * data + (256 << 20)).to_string())
                    .arg("--stats-json")
                    .arg(&stats)
                    .arg("--")
                    .arg(prog)
                    .args(self.args(name));
                let (mut cell, _) = run_cell(cell, &mut cmd, self.profile.timeout, None);
                if let Ok(s) = std::fs::read_to_string(&stats) {
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&s) {
                        let n = |k: &str| v[k].as_u64().unwrap_or(0);
                        cell.rmem = Some(RmemStats {
                            swap_ins: n("swap_ins"),
                            swap_outs: n("swap_outs"),
                            bytes_moved: n("bytes_fetched") + n("bytes_written_back"),
                        });
                    }
                }
                self.report(&cell);
                self.cells.push(cell);
            }
        }
        Ok(())
    }

    /// Both kernel swap systems, each with its device on only while it runs.
    fn kernel_swap(&mut self, swap_dir: &Path) -> Result<(), String> {
        let wanted: Vec<System> = [System::SwapDisk, System::SwapZram]
            .into_iter()
            .filter(|s| self.systems.contains(s))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        if let Some(why) = swap::unavailable() {
            println!("  kernel swap skipped: {why}");
            self.skip(&wanted, &why);
            return Ok(());
        }
        let others = swap::existing_swaps();
        if !others.is_empty() {
            println!(
                "  note: swap already on ({}); ours has priority over it",
                others.join(", ")
            );
        }
        let mut rig = match swap::SwapRig::new(swap_dir) {
            Ok(r) => r,
            Err(e) => {
                println!("  kernel swap skipped: {e}");
                self.skip(&wanted, &e);
                return Ok(());
            }
        };
        // What a workload needs besides its data (code, libraries, stack), measured at 1 MiB
        // without a limit: the limit is this plus the local ratio of the data, as rmem's
        // budget covers the data alone.
        let mut baseline = Vec::new();
        for (_, prog) in self.workloads.clone() {
            rig.set_limit(None)?;
            rig.take_max_usage()?;
            let mut cmd = Command::new(&prog);
            cmd.arg("1").env_remove("RMEM_MODE");
            let procs = rig.procs()?;
            run_bounded(&mut cmd, self.profile.timeout, Some(&procs));
            baseline.push(rig.take_max_usage()?.saturating_sub(1 << 20));
        }
        let device_bytes = self
            .workloads
            .iter()
            .map(|(n, _)| self.data_bytes(n))
            .max()
            .unwrap_or(0)
            + (256 << 20);
        for system in wanted {
            interrupted()?;
            let on = match system {
                System::SwapDisk => rig.swap_file_on(device_bytes),
                _ => rig.zram_on(device_bytes),
            };
            if let Err(e) = on {
                let _ = rig.swap_off();
                println!("  {} skipped: {e}", system.name());
                self.skip(&[system], &e);
                continue;
            }
            for (i, (name, prog)) in self.workloads.clone().into_iter().enumerate() {
                for &ratio in &self.ratios.clone() {
                    interrupted()?;
                    let limit = self.data_bytes(&name) * ratio / 100 + baseline[i];
                    rig.set_limit(Some(limit))?;
                    let mut cmd = Command::new(&prog);
                    cmd.args(self.args(&name)).env_remove("RMEM_MODE");
                    let procs = rig.procs()?;
                    let cell = Cell::new(&name, system, ratio, KERNEL_PAGE);
                    let (mut cell, _) =
                        run_cell(cell, &mut cmd, self.profile.timeout, Some(&procs));
                    cell.limit_bytes = Some(limit);
                    self.report(&cell);
                    self.cells.push(cell);
                }
            }
            rig.swap_off()?;
        }
        Ok(())
    }

    /// Record every cell of `systems` (kernel swap: one per workload and ratio) as skipped.
    fn skip(&mut self, systems: &[System], why: &str) {
        for &system in systems {
            for (name, _) in &self.workloads {
                for &ratio in &self.ratios {
                    let cell = Cell::new(name, system, ratio, KERNEL_PAGE);
                    self.cells.push(cell.skipped(why));
                }
            }
        }
    }

    /// One progress line per run.
    fn report(&self, c: &Cell) {
        let what = match c.system {
            System::Rmem => format!("rmem-{}", page_label(c.page_size)),
            s => s.name().to_string(),
        };
        let how = match (c.status, c.seconds) {
            (Status::Ok, Some(s)) => format!("{s:.3} s"),
            (st, _) => format!("{} {}", st.name(), c.reason.as_deref().unwrap_or("")),
        };
        println!(
            "  {:<8} {:<10} {:>3}%  {how}",
            c.workload, what, c.ratio_pct
        );
    }

    fn local_seconds(&self, workload: &str) -> Option<f64> {
        self.cells
            .iter()
            .find(|c| c.workload == workload && c.system == System::Local)
            .and_then(Cell::ok_seconds)
    }

    fn find(&self, w: &str, system: System, ratio: u64, ps: u64) -> Option<&Cell> {
        self.cells.iter().find(|c| {
            c.workload == w
                && c.system == system
                && c.ratio_pct == ratio
                && (system != System::Rmem || c.page_size == ps)
        })
    }

    /// The table columns: rmem per page size, then kernel swap.
    fn columns(&self) -> Vec<(String, System, u64)> {
        let mut cols = Vec::new();
        if self.systems.contains(&System::Rmem) {
            for &ps in &self.page_sizes {
                cols.push((format!("rmem-{}", page_label(ps)), System::Rmem, ps));
            }
        }
        for s in [System::SwapDisk, System::SwapZram] {
            if self.systems.contains(&s) {
                cols.push((s.name().to_string(), s, KERNEL_PAGE));
            }
        }
        cols
    }

    fn print_table(&self, limits: &Limits) {
        let cols = self.columns();
        println!("\ntime relative to local memory (workload's own timing; - = skipped)");
        for (w, _) in &self.workloads {
            let local = self.local_seconds(w);
            println!(
                "{w} ({} MiB, local {})",
                self.profile.size_mib(w),
                local.map_or("failed".to_string(), |s| format!("{s:.3} s"))
            );
            print!("  {:>6}", "local%");
            for (label, _, _) in &cols {
                print!(" {label:>10}");
            }
            println!();
            for &ratio in &self.ratios {
                print!("  {ratio:>5}%");
                for &(_, system, ps) in &cols {
                    let text = match self.find(w, system, ratio, ps) {
                        Some(c) => match (c.ok_seconds(), local) {
                            (Some(s), Some(l)) => format!("{:.2}x", s / l),
                            (Some(s), None) => format!("{s:.2}s"),
                            _ if c.status == Status::Skipped => "-".into(),
                            _ => c.status.name().to_string(),
                        },
                        None => "-".into(),
                    };
                    print!(" {text:>10}");
                }
                println!();
            }
        }
        println!(
            "\nrmem wall time / (bytes moved / loopback bandwidth of {:.1} Gbit/s)",
            limits.loopback_gbps
        );
        for (w, _) in &self.workloads {
            for &ratio in &self.ratios {
                let mut line = format!("  {w:<8} {ratio:>3}%");
                for &ps in &self.page_sizes {
                    let r = self
                        .find(w, System::Rmem, ratio, ps)
                        .and_then(|c| network_ratio(c, limits));
                    let text = r.map_or("-".into(), |r| format!("{r:.2}x"));
                    line.push_str(&format!(" {:>5} {text:>8}", page_label(ps)));
                }
                println!("{line}");
            }
        }
    }

    fn plots(&self, dir: &Path) -> Result<(), String> {
        for (w, _) in &self.workloads {
            let Some(local) = self.local_seconds(w) else {
                continue;
            };
            let mut lines = Vec::new();
            for (label, system, ps) in self.columns() {
                let points: Vec<(f64, f64)> = self
                    .ratios
                    .iter()
                    .filter_map(|&r| {
                        let s = self.find(w, system, r, ps)?.ok_seconds()?;
                        Some((r as f64, s / local))
                    })
                    .collect();
                if !points.is_empty() {
                    lines.push(plot::Line { label, points });
                }
            }
            let title = format!(
                "{w}, {} MiB: time relative to local memory",
                self.profile.size_mib(w)
            );
            plot::write(dir, w, &title, &lines)?;
        }
        println!("wrote plots to {}", dir.display());
        Ok(())
    }
}

/// rmem's wall time over the time its bytes would take at loopback bandwidth.
fn network_ratio(c: &Cell, limits: &Limits) -> Option<f64> {
    let moved = c.rmem?.bytes_moved;
    (c.status == Status::Ok && moved > 0)
        .then(|| c.wall_seconds.unwrap_or(0.0) / (moved as f64 / limits.loopback_bytes_per_s()))
}

/// DLM Table II: the time of one write that causes one page swap (a dirty victim out, the
/// page in), per page size. One word is written per page over a region four times the
/// budget, in order, so under FIFO every write of the timed passes misses.
fn table2(
    page_sizes: &[u64],
    budget_pages: usize,
    passes: usize,
) -> Result<Vec<serde_json::Value>, String> {
    println!("DLM Table II: one write causing one page swap (dirty victim), one local server");
    println!(
        "  {:>6} {:>10} {:>10} {:>10} {:>10}",
        "page", "p50 us", "mean us", "swap_ins", "swap_outs"
    );
    let mut rows = Vec::new();
    for &ps in page_sizes {
        interrupted()?;
        let pages = 4 * budget_pages;
        let (_servers, config) = local_setup(
            ps as usize,
            budget_pages as u64 * ps,
            2 * pages as u64 * ps + (64 << 20),
        )?;
        let rt =
            rmem_client::Runtime::connect(&config).map_err(|e| rmem_client::error_chain(&e))?;
        let base = rt.alloc(pages * ps as usize).ok_or("allocation failed")?;
        let write = |p: usize, v: u64| {
            // SAFETY: page p < pages lies inside the allocation, which is page-aligned.
            unsafe { base.add(p * ps as usize).cast::<u64>().write_volatile(v) }
        };
        for p in 0..pages {
            write(p, p as u64);
        }
        let before = rt.stats();
        let mut times = Vec::with_capacity(pages * passes);
        for pass in 0..passes {
            for p in 0..pages {
                let t0 = Instant::now();
                write(p, (pass * pages + p) as u64);
                times.push(t0.elapsed());
            }
        }
        let after = rt.stats();
        rt.free(base).map_err(err)?;
        let mean = times.iter().map(Duration::as_secs_f64).sum::<f64>() / times.len() as f64;
        times.sort();
        let p50 = percentile_us(&times, 0.5);
        let (ins, outs) = (
            after.swap_ins - before.swap_ins,
            after.swap_outs - before.swap_outs,
        );
        println!(
            "  {:>6} {p50:>10.1} {:>10.1} {ins:>10} {outs:>10}",
            page_label(ps),
            mean * 1e6
        );
        rows.push(json!({
            "page_size": ps, "write_us_p50": p50, "write_us_mean": mean * 1e6,
            "writes": times.len(), "swap_ins": ins, "swap_outs": outs,
        }));
    }
    Ok(rows)
}

fn cell_json(c: &Cell, local: Option<f64>, limits: &Limits) -> serde_json::Value {
    let mut v = json!({
        "workload": c.workload,
        "system": c.system.name(),
        "local_ratio": c.ratio_pct as f64 / 100.0,
        "page_size": c.page_size,
        "seconds": c.ok_seconds(),
        "wall_seconds": c.wall_seconds,
        "status": c.status.name(),
        "relative": c.ok_seconds().zip(local).map(|(s, l)| s / l),
    });
    if let Some(r) = &c.reason {
        v["reason"] = json!(r);
    }
    if let Some(s) = c.rmem {
        v["swap_ins"] = json!(s.swap_ins);
        v["swap_outs"] = json!(s.swap_outs);
        v["bytes_moved"] = json!(s.bytes_moved);
        v["network_ratio"] = json!(network_ratio(c, limits));
    }
    if let Some(l) = c.limit_bytes {
        v["limit_bytes"] = json!(l);
    }
    v
}

/// The targets for STREAM at 25% local: >= 5x faster than zram, >= 20x faster than
/// disk swap, within 2x of its bytes at loopback bandwidth. Uses rmem's best page size.
fn targets(suite: &Suite, limits: &Limits) -> Option<serde_json::Value> {
    let w = "stream";
    let best = suite
        .page_sizes
        .iter()
        .filter_map(|&ps| suite.find(w, System::Rmem, 25, ps))
        .filter(|c| c.ok_seconds().is_some())
        .min_by(|a, b| a.seconds.partial_cmp(&b.seconds).expect("finite"))?;
    let rmem = best.seconds?;
    let speedup = |s: System| {
        suite
            .find(w, s, 25, KERNEL_PAGE)
            .and_then(Cell::ok_seconds)
            .map(|t| t / rmem)
    };
    let (zram, disk, net) = (
        speedup(System::SwapZram),
        speedup(System::SwapDisk),
        network_ratio(best, limits),
    );
    let fmt = |x: Option<f64>, goal: &str, met: Option<bool>| match (x, met) {
        (Some(x), Some(m)) => format!("{x:.2}x ({goal}: {})", if m { "met" } else { "NOT met" }),
        _ => format!("not measured ({goal})"),
    };
    println!(
        "\ntargets, stream at 25% local, rmem-{} {rmem:.3} s:",
        page_label(best.page_size)
    );
    println!(
        "  faster than zram swap  {}",
        fmt(zram, ">= 5x", zram.map(|x| x >= 5.0))
    );
    println!(
        "  faster than disk swap  {}",
        fmt(disk, ">= 20x", disk.map(|x| x >= 20.0))
    );
    println!(
        "  time / network bound   {}",
        fmt(net, "<= 2x", net.map(|x| x <= 2.0))
    );
    Some(json!({
        "workload": w, "local_ratio": 0.25, "rmem_page_size": best.page_size,
        "rmem_seconds": rmem, "speedup_vs_zram": zram, "speedup_vs_disk": disk,
        "network_ratio": net,
    }))
}

pub fn run(a: SuiteArgs) -> Result<(), String> {
    let profile = Profile::new(&a);
    // The workloads link the librmem.so beside rmem.
    let target = rmem_cli::launch::rmem_exe()?
        .parent()
        .ok_or("rmem has no directory")?
        .to_path_buf();
    let mut progs = Vec::new();
    for name in list(&a.workloads) {
        progs.push((name.to_string(), workloads::build(&target, name)?));
    }
    let ratios = list(&a.ratios)
        .map(|r| match r.parse::<u64>() {
            Ok(p) if (1..=100).contains(&p) => Ok(p),
            _ => Err(format!("--ratios {r}: expected a percentage from 1 to 100")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let page_sizes = list(&a.page_sizes)
        .map(|p| parse_size(p).map_err(|e| format!("--page-sizes {p}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let systems = list(&a.systems)
        .map(|s| {
            System::ALL
                .into_iter()
                .find(|x| x.name() == s)
                .ok_or(format!(
                    "--systems {s}: expected local, rmem, swap-disk or swap-zram"
                ))
        })
        .collect::<Result<Vec<_>, _>>()?;
    bounded::catch_interrupts();
    let mut suite = Suite {
        profile,
        workloads: progs,
        ratios,
        page_sizes,
        systems,
        cells: Vec::new(),
    };
    println!(
        "rmem bench suite ({}): {} at local {:?}%, rmem pages {}, systems {}; runs bounded to {:?}",
        if suite.profile.full { "full" } else { "quick" },
        a.workloads,
        suite.ratios,
        a.page_sizes,
        a.systems,
        suite.profile.timeout
    );
    let limits = limits::measure(suite.profile.rtt_samples, suite.profile.scale_mib)?;
    println!(
        "limits: loopback 4 KiB round trip p50 {:.1} us, loopback {:.1} Gbit/s, memcpy {:.1} Gbit/s",
        limits.rtt_us_p50, limits.loopback_gbps, limits.memcpy_gbps
    );
    let table2 = table2(
        &suite.page_sizes,
        suite.profile.table2_budget_pages,
        suite.profile.table2_passes,
    )?;
    let scratch = std::env::temp_dir().join(format!("rmem-bench-suite-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(err)?;
    let result = (|| {
        for (name, prog) in suite.workloads.clone() {
            interrupted()?;
            if suite.systems.contains(&System::Local) {
                suite.local(&name, &prog);
            }
            if suite.systems.contains(&System::Rmem) {
                suite.rmem(&name, &prog, &scratch)?;
            }
        }
        suite.kernel_swap(&a.swap_dir)
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result?;
    suite.print_table(&limits);
    let targets = targets(&suite, &limits);
    if let Some(dir) = &a.plots.plot {
        suite.plots(dir)?;
    }
    let results: Vec<serde_json::Value> = suite
        .cells
        .iter()
        .map(|c| cell_json(c, suite.local_seconds(&c.workload), &limits))
        .collect();
    a.out.write(&json!({
            "limits": {
                "rtt_us_p50": limits.rtt_us_p50,
                "loopback_gbps": limits.loopback_gbps,
                "memcpy_gbps": limits.memcpy_gbps,
            },
            "mode": if suite.profile.full { "full" } else { "quick" },
            "sizes_mib": suite.workloads.iter().map(|(w, _)| (w.clone(), json!(suite.profile.size_mib(w)))).collect::<serde_json::Map<_, _>>(),
            "results": results,
            "table2": table2,
            "targets": targets,
    }))
}
