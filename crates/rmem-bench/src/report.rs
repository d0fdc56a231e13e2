//! What the benchmarks report, written once: the output options they share (`--json`,
//! `--plot`, `--dir`), latency percentiles, and an issue's targets evaluated in a run.

use std::path::PathBuf;
use std::time::Duration;

/// `--json FILE`: every benchmark's results as JSON.
#[derive(clap::Args, Debug)]
pub struct JsonOut {
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl JsonOut {
    /// Write `v` to the file given with `--json`, if one was.
    pub fn write(&self, v: &serde_json::Value) -> Result<(), String> {
        if let Some(p) = &self.json {
            let s = serde_json::to_string_pretty(v).expect("json");
            std::fs::write(p, s + "\n")
                .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
            println!("wrote {}", p.display());
        }
        Ok(())
    }
}

/// `--plot DIR`: the benchmarks that draw write their plots there.
#[derive(clap::Args, Debug)]
pub struct PlotOut {
    /// Write the plots into this directory, each as NAME.png and NAME.svg.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// `--dir DIR`: where a benchmark keeps files on local disk (a disk-backed server's file, the
/// references it is measured against).
#[derive(clap::Args, Debug)]
pub struct DiskDir {
    /// Directory on local disk for the benchmark's files (not a tmpfs: they stand for a disk).
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
}

/// The `q` quantile of `sorted`, in microseconds (0 when empty).
pub fn percentile_us(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// One of an issue's targets, evaluated in a benchmark's run.
pub struct Goal {
    pub what: String,
    pub value: f64,
    pub bound: f64,
    /// The value must be at least the bound (else at most).
    pub at_least: bool,
    /// None: not measured in this run.
    pub met: Option<bool>,
}

impl Goal {
    pub fn new(what: impl Into<String>, v: Option<f64>, bound: f64, at_least: bool) -> Goal {
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
pub fn print_goals(goals: &[Goal]) {
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

pub fn goals_json(goals: &[Goal]) -> Vec<serde_json::Value> {
    goals
        .iter()
        .map(|g| {
            serde_json::json!({"what": g.what, "value": g.value, "bound": g.bound,
                               "at_least": g.at_least, "met": g.met})
        })
        .collect()
}

pub fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}
