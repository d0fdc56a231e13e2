//! `rmem sim`: replay a reference trace (from `rmem run --trace`) offline under every policy
//! and Belady's OPT, for any local size.

use rmem_policy::sim::{compare, Row};
use rmem_policy::trace::Trace;
use rmem_policy::PolicyParams;
use rmem_proto::size::{format_size, parse_size};
use std::collections::HashSet;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// A trace written by `rmem run --trace`.
    #[arg(long)]
    pub trace: PathBuf,
    /// Local memory: a size (256M) or a percentage of the pages the trace touches (25%).
    #[arg(long)]
    pub local: String,
    /// Page size to simulate: the trace's own (default) or a multiple of it.
    #[arg(long)]
    pub page_size: Option<String>,
    /// `history` policy's reflecting history ratio.
    #[arg(long, default_value_t = 0.20)]
    pub history_ratio: f64,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Resident pages for `local` (a size or a percentage of `touched` pages), at least 1.
pub fn frames_for(local: &str, page_size: u64, touched: u64) -> Result<usize, String> {
    let frames = match local.strip_suffix('%') {
        Some(pct) => {
            let pct: f64 = pct
                .trim()
                .parse()
                .map_err(|e| format!("--local {local}: {e}"))?;
            (touched as f64 * pct / 100.0).round() as u64
        }
        None => parse_size(local).map_err(|e| format!("--local {local}: {e}"))? / page_size,
    };
    Ok(frames.max(1) as usize)
}

/// The table `rmem sim` prints: misses, write-backs, and ratios to fifo and to OPT.
pub fn table(rows: &[Row]) -> String {
    let misses = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .map_or(0, |r| r.result.misses)
    };
    let (fifo, opt) = (misses("fifo").max(1), misses("OPT").max(1));
    let mut out = format!(
        "{:<10} {:>12} {:>12} {:>8} {:>8}\n",
        "policy", "misses", "writebacks", "x fifo", "x OPT"
    );
    for r in rows {
        out += &format!(
            "{:<10} {:>12} {:>12} {:>8.3} {:>8.3}\n",
            r.name,
            r.result.misses,
            r.result.writebacks,
            r.result.misses as f64 / fifo as f64,
            r.result.misses as f64 / opt as f64
        );
    }
    out
}

pub fn rows_json(rows: &[Row]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            serde_json::json!({
                "policy": r.name,
                "misses": r.result.misses,
                "first_touches": r.result.first_touches,
                "writebacks": r.result.writebacks,
            })
        })
        .collect()
}

fn sim(a: SimArgs) -> Result<(), String> {
    let file = std::fs::File::open(&a.trace)
        .map_err(|e| format!("cannot open {}: {e}", a.trace.display()))?;
    let trace = Trace::read(std::io::BufReader::new(file))
        .map_err(|e| format!("cannot read {}: {e}", a.trace.display()))?;
    let ps = match &a.page_size {
        None => trace.page_size as u64,
        Some(s) => parse_size(s).map_err(|e| format!("--page-size {s}: {e}"))?,
    };
    let tps = trace.page_size as u64;
    if ps < tps || ps % tps != 0 {
        return Err(format!(
            "--page-size {}: must be a multiple of the trace's page size {}",
            format_size(ps),
            format_size(tps)
        ));
    }
    let refs = trace.coarsen(ps as u32);
    let touched = refs.iter().map(|r| r.page.0).collect::<HashSet<_>>().len() as u64;
    let frames = frames_for(&a.local, ps, touched)?;
    if !(0.0..=1.0).contains(&a.history_ratio) {
        return Err(format!(
            "--history-ratio {}: expected 0 to 1",
            a.history_ratio
        ));
    }
    let params = PolicyParams {
        history_ratio: a.history_ratio,
        ..PolicyParams::default()
    };
    println!(
        "trace {}: {} references, {} pages of {} touched ({}); local {} pages ({:.1}%)",
        a.trace.display(),
        refs.len(),
        touched,
        format_size(ps),
        format_size(touched * ps),
        frames,
        100.0 * frames as f64 / touched.max(1) as f64
    );
    let rows = compare(&refs, frames, &params);
    print!("{}", table(&rows));
    if let Some(p) = &a.json {
        let v = serde_json::json!({
            "trace": a.trace.display().to_string(),
            "page_size": ps,
            "references": refs.len(),
            "pages_touched": touched,
            "frames": frames,
            "results": rows_json(&rows),
        });
        std::fs::write(p, serde_json::to_string_pretty(&v).expect("json") + "\n")
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    Ok(())
}

pub fn run(a: SimArgs) -> i32 {
    match sim(a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rmem sim: {e}");
            2
        }
    }
}
