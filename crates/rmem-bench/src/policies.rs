//! `rmem bench policies`: every workload pattern at local ratios of 10, 25, 50 and 75% under
//! every policy. For each pattern it records the reference string with trace mode (the real
//! pager, an in-process store), replays that trace in the simulator under every policy and
//! OPT, then runs the pattern live against a memory server under each policy for swap
//! counts and times. The patterns are `rmem_policy::patterns` (page-level models of STREAM,
//! Himeno, CG, IS, Cluster 3.0, random access and merge sort), replayed on real memory:
//! each reference reads or increments the first byte of its page, and the bytes are checked
//! at the end.

use crate::report::JsonOut;
use rmem_cli::launch::{fresh_token, start_local_servers};
use rmem_cli::sim_cmd::rows_json;
use rmem_client::config::Config;
use rmem_client::Runtime;
use rmem_policy::patterns::{generate, PATTERN_NAMES};
use rmem_policy::sim::{compare, Access};
use rmem_policy::trace::Trace;
use rmem_policy::{PolicyParams, POLICY_NAMES};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct PoliciesArgs {
    /// Pages each workload touches (about).
    #[arg(long, default_value_t = 2048)]
    pub pages: u64,
    /// Page size of the live runs and traces.
    #[arg(long, default_value = "4K")]
    pub page_size: String,
    /// Local ratios in percent, comma-separated.
    #[arg(long, default_value = "10,25,50,75")]
    pub ratios: String,
    /// Workloads, comma-separated (default: all).
    #[arg(long)]
    pub workloads: Option<String>,
    /// Policies of the live runs, comma-separated (default: all).
    #[arg(long)]
    pub policies: Option<String>,
    /// Skip the live runs (simulator only).
    #[arg(long)]
    pub no_live: bool,
    /// Prefetching in the live runs: on or off. Off by default, so that the swap-ins compare
    /// the policies alone.
    #[arg(long, default_value = "off", value_parser = ["on", "off"])]
    pub prefetch: String,
    #[command(flatten)]
    pub out: JsonOut,
    /// Write the markdown tables here.
    #[arg(long)]
    pub markdown: Option<PathBuf>,
}

/// Write-back slots in live runs: the budget is the simulator's frames plus these, so that
/// the pager's resident pages equal the simulated frames.
const LIVE_SLOTS: u64 = 4;

struct Live {
    swap_ins: u64,
    swap_outs: u64,
    seconds: f64,
    select_us_total: f64,
    select_us_max: f64,
}

/// Replay `refs` on `rt`'s memory; each write increments its page's first byte. Checks the
/// bytes at the end.
fn replay(rt: &Runtime, refs: &[Access], pages: u64, ps: usize) -> Result<(), String> {
    let base = rt.alloc(pages as usize * ps).ok_or("allocation failed")?;
    let mut writes = vec![0u8; pages as usize];
    for a in refs {
        // SAFETY: a.page < pages, so the byte is inside the allocation.
        let p = unsafe { base.add(a.page.0 as usize * ps) };
        if a.write {
            // SAFETY: as above; the pager resolves the fault.
            unsafe { p.write_volatile(p.read_volatile().wrapping_add(1)) };
            writes[a.page.0 as usize] = writes[a.page.0 as usize].wrapping_add(1);
        } else {
            // SAFETY: as above.
            std::hint::black_box(unsafe { p.read_volatile() });
        }
    }
    for (i, &w) in writes.iter().enumerate() {
        // SAFETY: inside the allocation.
        let got = unsafe { base.add(i * ps).read_volatile() };
        if got != w {
            return Err(format!(
                "page {i}: byte {got}, expected {w}: data lost in paging"
            ));
        }
    }
    rt.free(base).map_err(|e| e.to_string())
}

/// Record the pattern's reference string through trace mode and read it back.
fn record(
    refs: &[Access],
    pages: u64,
    ps: usize,
    dir: &std::path::Path,
    name: &str,
) -> Result<Trace, String> {
    let path = dir.join(format!("{name}.trace"));
    let config = Config {
        page_size: ps,
        region_bytes: 1 << 36,
        ..Config::default()
    };
    let p = path.display().to_string();
    let rt = Runtime::trace(&config, &p).map_err(|e| format!("trace mode: {e}"))?;
    replay(&rt, refs, pages, ps)?;
    drop(rt); // stops the pager, which flushes the trace
    let f = std::fs::File::open(&path).map_err(|e| format!("{p}: {e}"))?;
    let t = Trace::read(std::io::BufReader::new(f)).map_err(|e| format!("{p}: {e}"))?;
    let _ = std::fs::remove_file(&path);
    Ok(t)
}

fn live(config: &Config, refs: &[Access], pages: u64) -> Result<Live, String> {
    let rt = Runtime::connect(config).map_err(|e| e.to_string())?;
    let before = rt.stats();
    let t0 = Instant::now();
    replay(&rt, refs, pages, config.page_size)?;
    let seconds = t0.elapsed().as_secs_f64();
    let s = rt.stats();
    Ok(Live {
        swap_ins: s.swap_ins - before.swap_ins,
        swap_outs: s.swap_outs - before.swap_outs,
        seconds,
        select_us_total: s.select_us_total,
        select_us_max: s.select_us_max,
    })
}

pub fn policies(a: PoliciesArgs) -> Result<(), String> {
    let ps = rmem_proto::size::parse_size(&a.page_size).map_err(|e| e.to_string())? as usize;
    let ratios: Vec<u64> = a
        .ratios
        .split(',')
        .map(|r| r.trim().parse().map_err(|e| format!("--ratios {r}: {e}")))
        .collect::<Result<_, _>>()?;
    let workloads: Vec<String> = match &a.workloads {
        Some(w) => w.split(',').map(|s| s.trim().to_string()).collect(),
        None => PATTERN_NAMES.iter().map(|s| s.to_string()).collect(),
    };
    let dir = std::env::temp_dir().join(format!("rmem-bench-policies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let token = fresh_token();
    let servers = if a.no_live {
        Vec::new()
    } else {
        start_local_servers(1, (a.pages + 64) * ps as u64 * 2, &token)?
    };
    let params = PolicyParams::default();
    let live_policies: Vec<&str> = match &a.policies {
        Some(p) => p.split(',').map(str::trim).collect(),
        None => POLICY_NAMES.to_vec(),
    };
    if let Some(bad) = live_policies.iter().find(|p| !POLICY_NAMES.contains(p)) {
        return Err(format!("--policies: unknown policy {bad}"));
    }
    let mut cells = Vec::new();
    let mut sim_md = String::from("| workload | local | refs | OPT misses |");
    let mut live_md = String::from("| workload | local |");
    for p in POLICY_NAMES {
        write!(sim_md, " {p} x fifo / x OPT |").unwrap();
    }
    for p in &live_policies {
        write!(live_md, " {p} swap-ins, s |").unwrap();
    }
    sim_md += &format!("\n|---|---|---|---|{}\n", "---|".repeat(POLICY_NAMES.len()));
    live_md += &format!("\n|---|---|{}\n", "---|".repeat(live_policies.len()));
    for w in &workloads {
        let refs = generate(w, a.pages, 1).ok_or_else(|| format!("unknown workload {w}"))?;
        let pages = refs.iter().map(|r| r.page.0).max().unwrap_or(0) + 1;
        let trace = record(&refs, pages, ps, &dir, w)?;
        // A write fault after a read fault on one page is one reference: collapse them.
        let traced = trace.coarsen(trace.page_size);
        let touched = traced
            .iter()
            .map(|r| r.page.0)
            .collect::<HashSet<_>>()
            .len() as u64;
        for &pct in &ratios {
            let frames = (touched * pct / 100).max(4) as usize;
            let rows = compare(&traced, frames, &params);
            let misses = |n: &str| {
                rows.iter()
                    .find(|r| r.name == n)
                    .map_or(1, |r| r.result.misses.max(1))
            };
            let (fifo, opt) = (misses("fifo") as f64, misses("OPT") as f64);
            write!(
                sim_md,
                "| {w} | {pct}% | {} | {} |",
                traced.len(),
                opt as u64
            )
            .unwrap();
            for p in POLICY_NAMES {
                let m = misses(p) as f64;
                write!(sim_md, " {:.3} / {:.2} |", m / fifo, m / opt).unwrap();
            }
            sim_md.push('\n');
            let mut live_json = serde_json::Map::new();
            if !a.no_live {
                write!(live_md, "| {w} | {pct}% |").unwrap();
                for p in &live_policies {
                    let config = Config {
                        servers: servers.iter().map(|s| s.addr.clone()).collect(),
                        token: token.clone().into_bytes(),
                        page_size: ps,
                        local_bytes: (frames as u64 + LIVE_SLOTS) * ps as u64,
                        writeback_max: LIVE_SLOTS as usize,
                        region_bytes: 1 << 36,
                        policy: p.to_string(),
                        prefetch: a.prefetch == "on",
                        ..Config::default()
                    };
                    let l =
                        live(&config, &refs, pages).map_err(|e| format!("{w} {pct}% {p}: {e}"))?;
                    write!(live_md, " {}, {:.2} |", l.swap_ins, l.seconds).unwrap();
                    live_json.insert(
                        p.to_string(),
                        serde_json::json!({
                            "swap_ins": l.swap_ins, "swap_outs": l.swap_outs, "seconds": l.seconds,
                            "select_us_total": l.select_us_total, "select_us_max": l.select_us_max,
                        }),
                    );
                }
                live_md.push('\n');
            }
            eprintln!("rmem bench policies: {w} {pct}% done");
            cells.push(serde_json::json!({
                "workload": w, "local_percent": pct, "frames": frames, "pages_touched": touched,
                "references": traced.len(), "sim": rows_json(&rows), "live": live_json,
            }));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let md = format!(
        "Simulator (misses relative to fifo and to OPT, from traces recorded in trace mode):\n\n{sim_md}\n{}",
        if a.no_live {
            String::new()
        } else {
            format!("Live runs ({} pages, one memory server on loopback; swap-ins and seconds):\n\n{live_md}", a.page_size)
        }
    );
    println!("{md}");
    if let Some(p) = &a.markdown {
        std::fs::write(p, &md).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    a.out
        .write(&serde_json::json!({"page_size": ps, "pages": a.pages, "cells": cells}))
}
