//! `rmem bench programs` (also `rmem bench real`): real, unmodified third-party programs at
//! 50%, 25% and 10% of their footprint, each under rmem at its defaults (transparent mode, no
//! per-program flag) and under kernel swap to zram (lz4) and to a swap file with a cgroup v1
//! memory limit of the same size, against the same program run plain, in one run (issue 15):
//! GNU sort, numpy (matrix work and a sort, as `nobody`), sqlite3 with a large in-memory
//! database, Octave, ImageMagick (a blur, which reads its image by columns), CPython with
//! many objects, and two HPC benchmarks built here from their
//! published specifications (STREAM, Himeno; sources in `crates/rmem-bench/programs/`).
//!
//! - The footprint is the plain run's peak resident set (`wait4`'s ru_maxrss); the memory
//!   limit of a run is its share of that: rmem's `--local`, the swap runs' cgroup limit.
//! - rmem connects to two memory servers this benchmark starts (`--launcher none`), so that
//!   the resident set measured for an rmem run is the program's own, not a server's. rmem
//!   limits only what it pages (allocations of at least `--min-alloc`); the table shows how
//!   far above the limit the program's resident set went, and the JSON has it.
//! - Every run's output must be byte-identical to the plain run's. A run stopped at its time
//!   limit counts as taking that long (so its ratios are lower bounds: `>` in the table).
//! - Kernel swap needs root (swap and a cgroup); without it only rmem is measured, and the
//!   benchmark says so.

use crate::bounded::{self, run_bounded, Finished, Status};
use crate::plot;
use crate::report::{self, DiskDir, Goal, JsonOut, PlotOut};
use crate::swap::{self, SwapRig};
use serde_json::json;
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// Seconds in all: what the test suite runs.
    Tiny,
    /// Footprints of 30-250 MiB.
    Small,
    /// Footprints of 250 MiB to 1.2 GiB (docs/benchmarks.md).
    Full,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    Rmem,
    Zram,
    Disk,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Rmem => "rmem",
            System::Zram => "zram",
            System::Disk => "disk",
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct ProgramsArgs {
    /// How large the programs' data are.
    #[arg(long, value_enum, default_value_t = Size::Full)]
    pub size: Size,
    /// Memory limits, in percent of each program's footprint.
    #[arg(long, value_delimiter = ',', default_values_t = [50, 25, 10])]
    pub ratios: Vec<u64>,
    /// What to compare with the plain runs (zram and disk need root).
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = [System::Rmem, System::Zram, System::Disk])]
    pub systems: Vec<System>,
    /// Run only these programs (sort, numpy, sqlite, octave, imagemagick, python, stream, himeno).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Extra options for every `rmem run`, split at whitespace (to measure a lever against
    /// the defaults; the benchmark's figures are at the defaults).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub rmem_args: String,
    /// Plain runs of each program; ratios are against their median time.
    #[arg(long, default_value_t = 3)]
    pub plain_runs: usize,
    /// Bound on each run, in seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout_s: u64,
    /// A run is also stopped at this many times its plain run's time, but not before
    /// --min-limit-s.
    #[arg(long, default_value_t = 60.0)]
    pub max_slowdown: f64,
    /// The shortest time limit of a run, in seconds.
    #[arg(long, default_value_t = 60)]
    pub min_limit_s: u64,
    #[command(flatten)]
    pub swap: DiskDir,
    #[command(flatten)]
    pub out: JsonOut,
    #[command(flatten)]
    pub plot: PlotOut,
}

/// One program: how to run it, and what it is.
pub(crate) struct Program {
    pub(crate) name: &'static str,
    what: String,
    /// argv. `{out}` becomes the run's own output file, which the program writes (otherwise
    /// its standard output is the output compared).
    argv: Vec<String>,
    env: Vec<(&'static str, String)>,
    as_nobody: bool,
}

/// One program under one system at one ratio.
struct Run {
    system: System,
    ratio: u64,
    limit: u64,
    status: Status,
    seconds: f64,
    identical: bool,
    /// The program's peak resident set (rmem), or the cgroup's peak (kernel swap); None for
    /// an rmem run that did not end by itself (its program was never reaped by `rmem run`).
    peak: Option<u64>,
    /// Bytes brought in: rmem's fetches, or the kernel's swap-ins; None for an rmem run that
    /// wrote no statistics.
    bytes_in: Option<u64>,
    why: Option<String>,
}

impl Run {
    /// How `f` ended, `same_output` as the plain run's; peak and bytes brought in unknown.
    fn new(system: System, ratio: u64, limit: u64, f: &Finished, same_output: bool) -> Run {
        Run {
            system,
            ratio,
            limit,
            status: f.status,
            seconds: f.wall,
            identical: f.status == Status::Ok && same_output,
            peak: None,
            bytes_in: None,
            why: (f.status != Status::Ok).then(|| tail(&f.stderr)),
        }
    }

    /// Ran to its end with the right output, or to its time limit (its time a lower bound),
    /// and, under rmem, was paged: a program rmem did not page at all (its memory is in
    /// allocations under `--min-alloc` or in its own mappings) ran as plain, over its limit,
    /// which is no comparison with kernel swap.
    fn counts(&self) -> bool {
        ((self.status == Status::Ok && self.identical) || self.status == Status::TimedOut)
            && !self.unpaged()
    }

    /// rmem fetched nothing and the program stayed resident above its limit.
    fn unpaged(&self) -> bool {
        self.system == System::Rmem
            && self.bytes_in == Some(0)
            && self.peak.is_some_and(|p| p > self.limit)
    }

    fn bound(&self) -> &'static str {
        if self.status == Status::TimedOut {
            ">"
        } else {
            ""
        }
    }
}

struct Measured {
    program: Program,
    footprint: u64,
    plain: f64,
    /// Length and hash of the plain run's output.
    plain_out: (u64, u64),
    runs: Vec<Run>,
}

const SORT_INPUT: &str = "sort-input.txt";
const STREAM_C: &str = include_str!("../programs/stream.c");
const HIMENO_C: &str = include_str!("../programs/himeno.c");
const NUMPY_PY: &str = include_str!("../programs/numpy_work.py");
const OBJECTS_PY: &str = include_str!("../programs/objects.py");
const SQLITE_SQL: &str = include_str!("../programs/sqlite.sql");
const OCTAVE_M: &str = include_str!("../programs/octave.m");
const NAMES: [&str; 8] = [
    "sort",
    "numpy",
    "sqlite",
    "octave",
    "imagemagick",
    "python",
    "stream",
    "himeno",
];
/// Memory servers rmem's runs use, each with this capacity (pages are taken when written).
const SERVERS: usize = 2;
const SERVER_CAPACITY: u64 = 8 << 30;

pub fn programs(a: ProgramsArgs) -> Result<(), String> {
    check_only(&a.only)?;
    if a.ratios.is_empty() || a.ratios.iter().any(|&r| r == 0 || r > 100) {
        return Err("--ratios: percentages from 1 to 100".into());
    }
    let dir = work_dir("programs")?;
    bounded::catch_interrupts();
    let result = prepare(a.size, &a.only, &dir).and_then(|progs| run_all(&a, &dir, progs));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A fresh directory for the programs' scripts, inputs and outputs, which `nobody` may write.
pub(crate) fn work_dir(tag: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("rmem-bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| e.to_string())?;
    Ok(dir)
}

/// `--only`'s names checked against the programs there are.
pub(crate) fn check_only(only: &[String]) -> Result<(), String> {
    match only.iter().find(|p| !NAMES.contains(&p.as_str())) {
        Some(p) => Err(format!("--only {p}: expected one of {}", NAMES.join(", "))),
        None => Ok(()),
    }
}

fn write_file(dir: &Path, name: &str, text: &str) -> Result<String, String> {
    let p = dir.join(name);
    std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| e.to_string())?;
    Ok(p.to_string_lossy().into_owned())
}

/// Build the C benchmarks, write the scripts and sort's input; say which tools are missing.
pub(crate) fn prepare(size: Size, only: &[String], dir: &Path) -> Result<Vec<Program>, String> {
    let (sort_mib, numpy_mib, sqlite_rows, octave_mib, py_records, stream_mib, himeno) = match size
    {
        Size::Tiny => (4, 16, 20_000, 16, 30_000, 24, ("33x33x65", 10)),
        Size::Small => (64, 128, 300_000, 96, 300_000, 192, ("97x97x193", 20)),
        Size::Full => (256, 512, 1_500_000, 384, 1_000_000, 768, ("M", 40)),
    };
    // Pixels on a side of ImageMagick's image (8 bytes a pixel at Q16, three images at once:
    // 3000 is 221 MiB at its peak, under Debian's policy.xml memory limit of 256 MiB, past
    // which ImageMagick keeps its pixels in files).
    let magick_px = match size {
        Size::Tiny => 1000,
        Size::Small => 2000,
        Size::Full => 3000,
    };
    let want = |n: &str| only.is_empty() || only.iter().any(|o| o == n);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let py = "/usr/bin/python3".to_string();
    let blas = ("OPENBLAS_NUM_THREADS", "2".to_string());
    let mut progs = Vec::new();
    let mut missing = Vec::new();
    // `check` is a shell command that succeeds when what a program needs is installed.
    let mut have = |check: &str, package: &str| {
        let ok = Command::new("sh")
            .args(["-c", check])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            missing.push(format!("{package} (`{check}` failed)"));
        }
        ok
    };
    if want("sort") {
        let input = dir.join(SORT_INPUT);
        write_sort_input(&input, sort_mib << 20)
            .map_err(|e| format!("{}: {e}", input.display()))?;
        progs.push(Program {
            name: "sort",
            what: format!("GNU sort --parallel=2, {sort_mib} MiB of text"),
            argv: vec![
                "sort".into(),
                "--parallel=2".into(),
                "-o".into(),
                "{out}".into(),
                input.to_string_lossy().into_owned(),
            ],
            env: vec![("LC_ALL", "C".into())],
            as_nobody: false,
        });
    }
    if want("numpy") && have("/usr/bin/python3 -c 'import numpy'", "python3-numpy") {
        let script = write_file(dir, "numpy_work.py", NUMPY_PY)?;
        progs.push(Program {
            name: "numpy",
            what: format!(
                "numpy as nobody: matrix @ vector, Gram matrix, np.sort; {numpy_mib} MiB"
            ),
            argv: vec![py.clone(), script, numpy_mib.to_string()],
            env: vec![blas.clone()],
            // As a user who is not root runs it (userfaultfd in user mode only).
            as_nobody: root,
        });
    }
    if want("sqlite") && have("command -v sqlite3", "sqlite3") {
        let sql = SQLITE_SQL.replace("ROWS", &sqlite_rows.to_string());
        let file = write_file(dir, "sqlite.sql", &sql)?;
        progs.push(Program {
            name: "sqlite",
            what: format!("sqlite3 :memory:, {sqlite_rows} rows, 2 indexes, join"),
            argv: vec![
                "sqlite3".into(),
                "-batch".into(),
                ":memory:".into(),
                format!(".read {file}"),
            ],
            env: vec![],
            as_nobody: false,
        });
    }
    if want("octave") && have("command -v octave-cli", "octave") {
        let script = write_file(dir, "bench.m", OCTAVE_M)?;
        progs.push(Program {
            name: "octave",
            what: format!("Octave: A * v, A' * A block, sort(A(:)); {octave_mib} MiB"),
            argv: vec![
                "octave-cli".into(),
                "-q".into(),
                "--norc".into(),
                "--no-history".into(),
                "--no-window-system".into(),
                script,
                octave_mib.to_string(),
            ],
            env: vec![blas.clone()],
            as_nobody: false,
        });
    }
    if want("imagemagick") && have("test -x /usr/bin/convert", "imagemagick") {
        progs.push(Program {
            name: "imagemagick",
            what: format!(
                "ImageMagick: a {magick_px}x{magick_px} gradient blurred (by rows, then by \
                 columns: one pixel of each row at a time) and resized"
            ),
            // Debian's own convert, by its path: a wrapper earlier in PATH is not ImageMagick.
            argv: [
                "/usr/bin/convert",
                "-size",
                &format!("{magick_px}x{magick_px}"),
                "gradient:red-blue",
                "-blur",
                "0x4",
                "-resize",
                "70%",
                "ppm:{out}",
            ]
            .map(String::from)
            .to_vec(),
            env: vec![],
            as_nobody: false,
        });
    }
    if want("python") {
        let script = write_file(dir, "objects.py", OBJECTS_PY)?;
        progs.push(Program {
            name: "python",
            what: format!("CPython: {py_records} records as dicts, sort, group, index"),
            argv: vec![py, script, py_records.to_string()],
            env: vec![],
            as_nobody: false,
        });
    }
    for (name, src, args, what) in [
        (
            "stream",
            STREAM_C,
            vec![stream_mib.to_string(), "10".into()],
            format!("STREAM, 3 malloc'd arrays, {stream_mib} MiB, 10 times"),
        ),
        (
            "himeno",
            HIMENO_C,
            vec![himeno.0.to_string(), himeno.1.to_string()],
            format!("Himeno {}, {} Jacobi iterations", himeno.0, himeno.1),
        ),
    ] {
        if !want(name) {
            continue;
        }
        let exe = compile(dir, name, src)?;
        let mut argv = vec![exe];
        argv.extend(args);
        progs.push(Program {
            name,
            what,
            argv,
            env: vec![],
            as_nobody: false,
        });
    }
    if !missing.is_empty() {
        return Err(format!(
            "not installed: {} (scripts/deps.sh installs them)",
            missing.join(", ")
        ));
    }
    Ok(progs)
}

/// `cc -O2` a benchmark's source, as a user builds it.
fn compile(dir: &Path, name: &str, src: &str) -> Result<String, String> {
    let c = write_file(dir, &format!("{name}.c"), src)?;
    let exe = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&c)
        .arg("-lm")
        .output()
        .map_err(|e| format!("cannot run {cc}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cc} {c} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe.to_string_lossy().into_owned())
}

fn run_all(a: &ProgramsArgs, dir: &Path, progs: Vec<Program>) -> Result<(), String> {
    let rmem = rmem_cli::launch::rmem_exe()?;
    let mut systems = a.systems.clone();
    if let Some(why) = swap::unavailable() {
        if systems.iter().any(|&s| s != System::Rmem) {
            println!("kernel swap not measured: {why}");
        }
        systems.retain(|&s| s == System::Rmem);
    } else if systems.iter().any(|&s| s != System::Rmem) {
        let others = swap::existing_swaps();
        if !others.is_empty() {
            println!(
                "note: swap already on here, left alone: {}",
                others.join(", ")
            );
        }
    }
    println!(
        "rmem bench programs ({:?}): {} program(s) plain and under {} at {:?}% of their footprint",
        a.size,
        progs.len(),
        systems
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", "),
        a.ratios
    );
    let limit_of = |plain: f64| {
        Duration::from_secs_f64(
            (plain * a.max_slowdown)
                .max(a.min_limit_s as f64)
                .min(a.timeout_s as f64),
        )
    };
    // Plain runs first: the footprints size the limits and the swap devices. Each program
    // runs plain --plain-runs times (its time is their median: a short program's time moves
    // between runs, and every ratio is against it) with the same output every time.
    let mut results = Vec::new();
    for program in progs {
        let (mut times, mut footprint, mut plain_out) = (Vec::new(), 0, None);
        for _ in 0..a.plain_runs.max(1) {
            bounded::interrupted()?;
            let (f, out) = launch(
                &program,
                dir,
                "plain",
                &[],
                Duration::from_secs(a.timeout_s),
                None,
                None,
            )?;
            if f.status != Status::Ok {
                return Err(format!(
                    "{} failed without rmem ({}): {}",
                    program.name,
                    f.status.name(),
                    tail(&f.stderr)
                ));
            }
            if plain_out.is_some_and(|o| o != out) {
                return Err(format!(
                    "{}'s output differs between two plain runs: it cannot be checked",
                    program.name
                ));
            }
            plain_out = Some(out);
            times.push(f.wall);
            footprint = footprint.max(f.max_rss);
        }
        times.sort_by(f64::total_cmp);
        let plain = times[times.len() / 2];
        println!(
            "  {:<7} plain {:>7.2} s (median of {:?}), footprint {} MiB",
            program.name,
            plain,
            times
                .iter()
                .map(|t| (t * 100.0).round() / 100.0)
                .collect::<Vec<_>>(),
            footprint >> 20
        );
        results.push(Measured {
            program,
            footprint,
            plain,
            plain_out: plain_out.expect("at least one plain run"),
            runs: Vec::new(),
        });
    }
    let extra: Vec<String> = a.rmem_args.split_whitespace().map(String::from).collect();
    let mut rig = None;
    for &system in &systems {
        if system != System::Rmem {
            let largest = results.iter().map(|m| m.footprint).max().unwrap_or(0);
            let device = largest + largest / 2 + (256 << 20);
            let r: &mut SwapRig = match &mut rig {
                Some(r) => r,
                None => rig.insert(SwapRig::new(&a.swap.dir)?),
            };
            if system == System::Zram {
                r.zram_on(device)?;
            } else {
                r.swap_file_on(device)?;
            }
        }
        for m in results.iter_mut() {
            // rmem's servers live as long as one program's runs, outside any cgroup.
            let mut servers = if system == System::Rmem {
                let token = rmem_cli::launch::fresh_token();
                let s = rmem_cli::launch::start_local_servers(SERVERS, SERVER_CAPACITY, &token)?;
                Some((s, token))
            } else {
                None
            };
            for &ratio in &a.ratios {
                bounded::interrupted()?;
                let limit = (m.footprint * ratio / 100).max(1 << 20);
                let run = match (&servers, rig.as_mut()) {
                    (Some((s, token)), _) => {
                        let rmem_run = RmemRun {
                            rmem: &rmem,
                            servers: s,
                            token,
                            extra: &extra,
                        };
                        rmem_run.run(dir, m, ratio, limit, limit_of(m.plain))?
                    }
                    (None, Some(rig)) => {
                        under_swap(rig, system, dir, m, ratio, limit, limit_of(m.plain))?
                    }
                    (None, None) => unreachable!("a swap run without its rig"),
                };
                println!(
                    "  {:<7} {:<4} {:>3}%  {}{:>8.2} s  {:>6.1}x plain  peak {:>5} MiB (limit {:>5} MiB)  in {:>8} MiB  {}",
                    m.program.name,
                    system.name(),
                    ratio,
                    run.bound(),
                    run.seconds,
                    run.seconds / m.plain,
                    run.peak.map_or("-".into(), |p| (p >> 20).to_string()),
                    limit >> 20,
                    run.bytes_in
                        .map_or("-".into(), |b| format!("{:.1}", b as f64 / (1 << 20) as f64)),
                    verdict(&run)
                );
                m.runs.push(run);
            }
            if let Some((s, _)) = servers.as_mut() {
                rmem_cli::launch::finalize_all(s, Duration::from_secs(5));
            }
        }
        if let Some(r) = rig.as_mut() {
            r.swap_off()?;
        }
    }
    drop(rig);
    report(a, &systems, &results)
}

/// The kernel's swap-ins so far (pages), from /proc/vmstat.
fn pswpin() -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("pswpin ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// One program's runs under rmem: the `rmem` to run, the servers it connects to.
struct RmemRun<'a> {
    rmem: &'a Path,
    servers: &'a [rmem_cli::launch::ServerProc],
    token: &'a str,
    /// --rmem-args.
    extra: &'a [String],
}

impl RmemRun<'_> {
    /// `m` under `rmem run --local LIMIT` on the servers (`--launcher none`), bounded by `bound`.
    fn run(
        &self,
        dir: &Path,
        m: &Measured,
        ratio: u64,
        limit: u64,
        bound: Duration,
    ) -> Result<Run, String> {
        let mut text = format!("localhost {limit}\n");
        for srv in self.servers {
            let _ = writeln!(text, "{} {SERVER_CAPACITY}", srv.addr);
        }
        let hosts = write_file(dir, "hosts", &text)?;
        let stats = dir.join(format!("{}-stats.json", m.program.name));
        let _ = std::fs::remove_file(&stats);
        let mut pre = vec![
            self.rmem.to_string_lossy().into_owned(),
            "run".into(),
            "--launcher".into(),
            "none".into(),
            "--hostfile".into(),
            hosts,
            "--local".into(),
            limit.to_string(),
            "--stats-json".into(),
            stats.to_string_lossy().into_owned(),
        ];
        pre.extend(self.extra.iter().cloned());
        pre.push("--".into());
        let env = [("RMEM_TOKEN", self.token.to_string())];
        let (f, out) = launch(&m.program, dir, "rmem", &pre, bound, Some(&env), None)?;
        let v: serde_json::Value = std::fs::read_to_string(&stats)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default();
        let mut run = Run::new(System::Rmem, ratio, limit, &f, out == m.plain_out);
        // A program `rmem run` did not reap (stopped at its limit, killed) has no peak of its
        // own in `rmem run`'s usage.
        if matches!(f.status, Status::Ok | Status::Failed) {
            run.peak = Some(f.max_rss);
        }
        run.bytes_in = v["bytes_fetched"].as_u64();
        Ok(run)
    }
}

/// `m` under kernel swap (the rig's device on) with a cgroup limit of `limit`.
fn under_swap(
    rig: &mut SwapRig,
    system: System,
    dir: &Path,
    m: &Measured,
    ratio: u64,
    limit: u64,
    bound: Duration,
) -> Result<Run, String> {
    rig.set_limit(Some(limit))?;
    rig.take_max_usage()?;
    let before = pswpin();
    let procs = rig.procs()?;
    let (f, out) = launch(
        &m.program,
        dir,
        system.name(),
        &[],
        bound,
        None,
        Some(&procs),
    )?;
    let mut run = Run::new(system, ratio, limit, &f, out == m.plain_out);
    run.peak = Some(rig.take_max_usage()?);
    rig.set_limit(None)?;
    run.bytes_in = Some(pswpin().saturating_sub(before) * 4096);
    Ok(run)
}

fn verdict(r: &Run) -> String {
    match (r.status, r.identical) {
        (Status::Ok, true) => "identical".into(),
        (Status::Ok, false) => "OUTPUT DIFFERS".into(),
        (s, _) => format!(
            "{}{}",
            s.name(),
            r.why
                .as_deref()
                .filter(|w| !w.is_empty())
                .map(|w| format!(": {w}"))
                .unwrap_or_default()
        ),
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Run `p` (under `pre`, in the cgroup behind `procs`), bounded; its output's length and hash.
pub(crate) fn launch(
    p: &Program,
    dir: &Path,
    tag: &str,
    pre: &[String],
    limit: Duration,
    env: Option<&[(&str, String)]>,
    procs: Option<&std::fs::File>,
) -> Result<(Finished, (u64, u64)), String> {
    let out: PathBuf = dir.join(format!("{}-{tag}.out", p.name));
    let _ = std::fs::remove_file(&out);
    let mut argv: Vec<String> = Vec::new();
    if p.as_nobody {
        argv.extend(["runuser", "-u", "nobody", "--"].map(String::from));
    }
    argv.extend(pre.iter().cloned());
    argv.extend(
        p.argv
            .iter()
            .map(|s| s.replace("{out}", &out.to_string_lossy())),
    );
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .current_dir(dir)
        .envs(p.env.iter().map(|(k, v)| (k, v)))
        .envs(env.unwrap_or_default().iter().map(|(k, v)| (k, v)));
    let f = run_bounded(&mut cmd, limit, procs);
    let digest = if p.argv.iter().any(|s| s.contains("{out}")) {
        let d = digest_file(&out);
        let _ = std::fs::remove_file(&out);
        d
    } else {
        digest_bytes(f.stdout.as_bytes())
    };
    Ok((f, digest))
}

/// `m`'s run under `s` at `r`%.
fn get(m: &Measured, s: System, r: u64) -> Option<&Run> {
    m.runs.iter().find(|x| x.system == s && x.ratio == r)
}

/// Times relative to plain, the comparisons, their geometric means, the targets; JSON, plots.
fn report(a: &ProgramsArgs, systems: &[System], results: &[Measured]) -> Result<(), String> {
    let mut table = String::new();
    let _ = writeln!(
        table,
        "\ntime relative to plain (> : stopped at its limit, so at least; L: rmem paged none of it, \
         it stayed local above its limit); output checked against plain"
    );
    let _ = write!(table, "{:<8} {:>9} {:>8}", "program", "footprint", "plain");
    for &r in &a.ratios {
        for s in systems {
            let _ = write!(table, " {:>11}", format!("{}@{r}%", s.name()));
        }
    }
    table.push('\n');
    for m in results {
        let _ = write!(
            table,
            "{:<8} {:>5} MiB {:>7.2}s",
            m.program.name,
            m.footprint >> 20,
            m.plain
        );
        for &r in &a.ratios {
            for &s in systems {
                let cell = get(m, s, r).map_or("-".to_string(), |x| {
                    let mark = match (x.status, x.identical) {
                        _ if x.unpaged() => " L",
                        (Status::Ok, true) | (Status::TimedOut, _) => "",
                        (Status::Ok, false) => " DIFF",
                        _ => " FAIL",
                    };
                    format!("{}{:.1}x{mark}", x.bound(), x.seconds / m.plain)
                });
                let _ = write!(table, " {cell:>11}");
            }
        }
        table.push('\n');
    }
    // Geometric means over the programs that ran to the end (or to their time limit, as a
    // lower bound) under every compared system at a ratio: the same programs in every mean.
    let geo = |v: &[f64]| {
        (!v.is_empty()).then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
    };
    let mut means = Vec::new();
    let _ = writeln!(
        table,
        "\ngeometric means over the programs that completed (or hit their limit) under every system"
    );
    for &r in &a.ratios {
        let (common, left_out): (Vec<&Measured>, Vec<&Measured>) = results.iter().partition(|m| {
            systems
                .iter()
                .all(|&s| get(m, s, r).is_some_and(|x| x.counts()))
        });
        let mut line = format!("  at {r:>3}%:");
        let mut mean_of = |what: String, v: Vec<f64>, line: &mut String| {
            if let Some(g) = geo(&v) {
                let _ = write!(line, "  {what} {g:.2}x");
                means.push(json!({"ratio": r, "what": what, "geomean": g, "programs": v.len()}));
            }
        };
        for &s in systems {
            let v = common
                .iter()
                .map(|m| get(m, s, r).unwrap().seconds / m.plain)
                .collect();
            mean_of(format!("{}/plain", s.name()), v, &mut line);
        }
        for s in [System::Zram, System::Disk] {
            if systems.contains(&s) && systems.contains(&System::Rmem) {
                let v = common
                    .iter()
                    .map(|m| {
                        get(m, s, r).unwrap().seconds / get(m, System::Rmem, r).unwrap().seconds
                    })
                    .collect();
                mean_of(format!("{}/rmem", s.name()), v, &mut line);
            }
        }
        if !left_out.is_empty() {
            let names: Vec<&str> = left_out.iter().map(|m| m.program.name).collect();
            let _ = write!(
                line,
                "  (left out, failed or not paged somewhere: {})",
                names.join(", ")
            );
        }
        let _ = writeln!(table, "{line}");
    }
    let _ = writeln!(
        table,
        "\nrmem's peak resident set against its limit (rmem pages allocations of at least --min-alloc)"
    );
    for m in results {
        let _ = write!(table, "  {:<8}", m.program.name);
        for &r in &a.ratios {
            if let Some(x) = get(m, System::Rmem, r) {
                let _ = write!(
                    table,
                    "  {r:>3}%: {:>5} / {:>5} MiB",
                    x.peak.map_or("-".into(), |p| (p >> 20).to_string()),
                    x.limit >> 20
                );
            }
        }
        table.push('\n');
    }
    print!("{table}");
    let mean = |r: u64, what: &str| {
        means
            .iter()
            .find(|m| m["ratio"] == r && m["what"] == what)
            .and_then(|m| m["geomean"].as_f64())
    };
    let mut goals = Vec::new();
    if a.ratios.contains(&25) && systems.contains(&System::Rmem) {
        if systems.contains(&System::Zram) {
            // A zram run that failed (OOM-killed) counts as slower than a completed rmem run;
            // an rmem run that paged nothing is no win.
            let slower = results.iter().all(|m| {
                matches!((get(m, System::Zram, 25), get(m, System::Rmem, 25)),
                    (Some(z), Some(r)) if r.status == Status::Ok && !r.unpaged()
                        && (z.seconds > r.seconds || !z.counts()))
            });
            goals.push(Goal::new(
                "25%: every program faster under rmem than zram (1 = yes)",
                Some(if slower { 1.0 } else { 0.0 }),
                1.0,
                true,
            ));
            goals.push(Goal::new(
                "25%: geomean zram / rmem",
                mean(25, "zram/rmem"),
                2.0,
                true,
            ));
        }
        if systems.contains(&System::Disk) {
            goals.push(Goal::new(
                "25%: geomean disk swap / rmem",
                mean(25, "disk/rmem"),
                5.0,
                true,
            ));
        }
        if let Some(m) = results.iter().find(|m| m.program.name == "sort") {
            goals.push(Goal::new(
                "25%: GNU sort under rmem / plain",
                get(m, System::Rmem, 25).map(|x| x.seconds / m.plain),
                20.0,
                false,
            ));
        }
    }
    if a.ratios.contains(&50) && systems.contains(&System::Rmem) {
        goals.push(Goal::new(
            "50%: geomean rmem / plain",
            mean(50, "rmem/plain"),
            3.0,
            false,
        ));
    }
    if !goals.is_empty() {
        report::print_goals(&goals);
    }
    let programs: Vec<serde_json::Value> = results
        .iter()
        .map(|m| {
            json!({
                "program": m.program.name,
                "what": m.program.what,
                "as_nobody": m.program.as_nobody,
                "footprint_bytes": m.footprint,
                "plain_seconds": m.plain,
                "runs": m.runs.iter().map(|x| json!({
                    "system": x.system.name(),
                    "ratio_percent": x.ratio,
                    "limit_bytes": x.limit,
                    "status": x.status.name(),
                    "seconds": x.seconds,
                    "relative_to_plain": x.seconds / m.plain,
                    "identical": x.identical,
                    "peak_bytes": x.peak,
                    "bytes_in": x.bytes_in,
                    "why": x.why,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    a.out.write(&json!({
        "size": format!("{:?}", a.size).to_lowercase(),
        "ratios_percent": a.ratios,
        "systems": systems.iter().map(|s| s.name()).collect::<Vec<_>>(),
        "rmem_args": a.rmem_args,
        "programs": programs,
        "geomeans": means,
        "goals": report::goals_json(&goals),
    }))?;
    if let Some(d) = &a.plot.plot {
        let groups: Vec<String> = results.iter().map(|m| m.program.name.to_string()).collect();
        for &r in &a.ratios {
            let series: Vec<plot::Bars> = systems
                .iter()
                .map(|&s| plot::Bars {
                    label: s.name().to_string(),
                    values: results
                        .iter()
                        .map(|m| {
                            get(m, s, r)
                                .filter(|x| x.counts())
                                .map(|x| x.seconds / m.plain)
                        })
                        .collect(),
                })
                .collect();
            plot::bars(
                d,
                &format!("programs-{r}"),
                &format!("Real programs at {r}% of their footprint: time relative to plain"),
                "time / plain",
                &groups,
                &series,
            )?;
        }
    }
    let bad: Vec<String> = results
        .iter()
        .flat_map(|m| {
            m.runs
                .iter()
                .filter(|x| x.status == Status::Ok && !x.identical)
                .map(move |x| {
                    format!(
                        "{} under {} at {}%",
                        m.program.name,
                        x.system.name(),
                        x.ratio
                    )
                })
        })
        .collect();
    let rmem_failed: Vec<String> = results
        .iter()
        .flat_map(|m| {
            m.runs
                .iter()
                .filter(|x| {
                    x.system == System::Rmem
                        && x.status != Status::Ok
                        && x.status != Status::TimedOut
                })
                .map(move |x| format!("{} at {}%", m.program.name, x.ratio))
        })
        .collect();
    if !bad.is_empty() {
        return Err(format!(
            "output differs from the plain run: {}",
            bad.join(", ")
        ));
    }
    if !rmem_failed.is_empty() {
        return Err(format!("failed under rmem: {}", rmem_failed.join(", ")));
    }
    Ok(())
}

/// `bytes` of deterministic random text lines, as a user's data file would be.
fn write_sort_input(path: &Path, bytes: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let (mut written, mut i) = (0u64, 0u64);
    while written < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let line = format!("{x:016x} {i}\n");
        w.write_all(line.as_bytes())?;
        written += line.len() as u64;
        i += 1;
    }
    w.flush()?;
    // Readable by `nobody`.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

fn digest_bytes(b: &[u8]) -> (u64, u64) {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(b);
    (b.len() as u64, h.finish())
}

/// Length and hash of a file's contents (empty if it cannot be read).
fn digest_file(path: &Path) -> (u64, u64) {
    use std::hash::Hasher;
    use std::io::Read;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut len = 0u64;
    if let Ok(mut f) = std::fs::File::open(path) {
        let mut buf = vec![0u8; 1 << 20];
        while let Ok(n) = f.read(&mut buf) {
            if n == 0 {
                break;
            }
            h.write(&buf[..n]);
            len += n as u64;
        }
    }
    (len, h.finish())
}
