//! `rmem bench programs`: real, unmodified programs in transparent mode at a local budget of a
//! quarter of their footprint, each compared with the same program run without rmem (issue 3's
//! acceptance runs at full size): GNU sort of a large file with `--parallel=2`, a Python/numpy
//! script run as `nobody` (np.fromfile into a fresh array, a matrix-vector product on threaded
//! BLAS), and CPython building a dict of many small objects with `--min-alloc 0`.
//!
//! The footprint is the plain run's peak resident set (`wait4`'s ru_maxrss); rmem's budget is
//! `--ratio` percent of it. Output must be byte-identical to the plain run's.

use crate::report::JsonOut;
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct ProgramsArgs {
    /// Size of sort's input file, in MiB.
    #[arg(long, default_value_t = 256)]
    pub sort_mib: u64,
    /// Size of the numpy array, in MiB (the script holds two of them).
    #[arg(long, default_value_t = 512)]
    pub numpy_mib: u64,
    /// Keys of the small-allocation Python dict (0: skip it).
    #[arg(long, default_value_t = 300_000)]
    pub small_keys: u64,
    /// rmem's local budget, in percent of the plain run's peak resident set.
    #[arg(long, default_value_t = 25)]
    pub ratio: u64,
    /// DLM page size of the rmem runs.
    #[arg(long, default_value = "64K")]
    pub page_size: String,
    /// Bound on each run, in seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout_s: u64,
    #[command(flatten)]
    pub out: JsonOut,
}

const NUMPY_SCRIPT: &str = include_str!("../../../tests/py/numpy_io.py");

const SMALL_SCRIPT: &str = include_str!("../../../tests/py/small_allocs.py");

/// One program, plain and under rmem.
struct Case {
    name: &'static str,
    size: String,
    /// argv. `{out}` becomes the run's own output file, which the program writes (otherwise
    /// its standard output is the output compared); `{scratch}` a file it may use.
    argv: Vec<String>,
    env: Vec<(&'static str, String)>,
    rmem_args: Vec<String>,
    as_nobody: bool,
}

/// How one run ended.
struct Ran {
    ok: bool,
    seconds: f64,
    max_rss: u64,
    /// Length and hash of the output: the bench holds no copy, since a forked child's peak
    /// resident set starts from its parent's and would overstate the program's footprint.
    output: (u64, u64),
    stderr: String,
}

pub fn programs(a: ProgramsArgs) -> Result<(), String> {
    let ps = rmem_proto::size::parse_size(&a.page_size).map_err(|e| e.to_string())?;
    let rmem = rmem_cli::launch::rmem_exe()?;
    let dir = std::env::temp_dir().join(format!("rmem-bench-programs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // `nobody` writes its output here too.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| e.to_string())?;
    let result = run_all(&a, ps, &rmem, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_all(a: &ProgramsArgs, ps: u64, rmem: &Path, dir: &Path) -> Result<(), String> {
    let timeout = Duration::from_secs(a.timeout_s);
    let py = "/usr/bin/python3".to_string();
    let input = dir.join("sort-input.txt");
    write_sort_input(&input, a.sort_mib << 20).map_err(|e| format!("{}: {e}", input.display()))?;
    let script = |name: &str, text: &str| -> Result<String, String> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(p.to_string_lossy().into_owned())
    };
    let mut cases = vec![Case {
        name: "sort",
        size: format!("{} MiB input", a.sort_mib),
        argv: vec![
            "sort".into(),
            "--parallel=2".into(),
            "-o".into(),
            "{out}".into(),
            input.to_string_lossy().into_owned(),
        ],
        env: vec![("LC_ALL", "C".into())],
        // GNU sort reserves a buffer sized from physical memory (16.6 GB on a 24 GiB machine)
        // and touches only what the input needs: with overcommit (the default) the servers'
        // capacity is taken only by the pages it writes, so their default capacity serves it.
        rmem_args: vec![],
        as_nobody: false,
    }];
    let np = script("np.py", NUMPY_SCRIPT)?;
    cases.push(Case {
        name: "numpy",
        size: format!("{} MiB arrays", a.numpy_mib),
        argv: vec![py.clone(), np, a.numpy_mib.to_string(), "{scratch}".into()],
        env: vec![("OPENBLAS_NUM_THREADS", "2".into())],
        rmem_args: vec![],
        // SAFETY: geteuid has no preconditions.
        as_nobody: unsafe { libc::geteuid() } == 0,
    });
    if a.small_keys > 0 {
        let small = script("small.py", SMALL_SCRIPT)?;
        cases.push(Case {
            name: "python-small",
            size: format!("{} keys", a.small_keys),
            argv: vec![py, small, a.small_keys.to_string()],
            env: vec![("PYTHONMALLOC", "malloc".into())],
            rmem_args: vec!["--min-alloc".into(), "0".into()],
            as_nobody: false,
        });
    }
    let mut rows = Vec::new();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{:<13} {:<17} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9}  output",
        "program", "size", "footprint", "local", "plain", "rmem", "ratio", "swap-ins", "swap-outs"
    );
    let mut all_ok = true;
    for c in &cases {
        let plain = run(c, dir, "plain", None, timeout)?;
        if !plain.ok {
            return Err(format!("{} failed without rmem: {}", c.name, plain.stderr));
        }
        let local = (plain.max_rss * a.ratio / 100 / ps).max(8) * ps;
        let stats = dir.join(format!("{}-stats.json", c.name));
        let mut pre = vec![
            rmem.to_string_lossy().into_owned(),
            "run".into(),
            "--local".into(),
            local.to_string(),
            "--page-size".into(),
            ps.to_string(),
            "--stats-json".into(),
            stats.to_string_lossy().into_owned(),
        ];
        pre.extend(c.rmem_args.iter().cloned());
        pre.push("--".into());
        let r = run(c, dir, "rmem", Some(pre), timeout)?;
        let v: serde_json::Value = std::fs::read_to_string(&stats)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default();
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        let identical = r.ok && r.output == plain.output;
        all_ok &= identical;
        let ratio = r.seconds / plain.seconds;
        let _ = writeln!(
            table,
            "{:<13} {:<17} {:>6} MiB {:>5} MiB {:>8.2}s {:>6.1}s {:>8.1}x {:>9} {:>9}  {}",
            c.name,
            c.size,
            plain.max_rss >> 20,
            local >> 20,
            plain.seconds,
            r.seconds,
            ratio,
            n("swap_ins"),
            n("swap_outs"),
            if identical {
                "identical".to_string()
            } else if r.ok {
                "DIFFERS".to_string()
            } else {
                let tail: Vec<&str> = r.stderr.lines().rev().take(6).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("FAILED:\n    {}", tail.join("\n    "))
            }
        );
        print!(
            "{}",
            table.lines().last().map(|l| format!("{l}\n")).unwrap()
        );
        rows.push(serde_json::json!({
            "program": c.name,
            "size": c.size,
            "as_nobody": c.as_nobody,
            "footprint_bytes": plain.max_rss,
            "local_bytes": local,
            "page_size": ps,
            "plain_seconds": plain.seconds,
            "rmem_seconds": r.seconds,
            "ratio": ratio,
            "swap_ins": n("swap_ins"),
            "swap_outs": n("swap_outs"),
            "identical": identical,
            "status": if r.ok { "ok" } else { "failed" },
        }));
    }
    println!("\n{table}");
    a.out
        .write(&serde_json::json!({ "ratio_percent": a.ratio, "results": rows }))?;
    if all_ok {
        Ok(())
    } else {
        Err("a program's output under rmem differs from its plain run, or it failed".into())
    }
}

/// Run one case, plain (`pre` None) or under `rmem run`, and read back what it wrote.
fn run(
    c: &Case,
    dir: &Path,
    tag: &str,
    pre: Option<Vec<String>>,
    limit: Duration,
) -> Result<Ran, String> {
    let out = dir.join(format!("{}-{tag}.out", c.name));
    let _ = std::fs::remove_file(&out);
    let mut argv: Vec<String> = Vec::new();
    if c.as_nobody {
        argv.extend(["runuser", "-u", "nobody", "--"].map(String::from));
    }
    argv.extend(pre.unwrap_or_default());
    let scratch = dir.join(format!("{}-{tag}.scratch", c.name));
    let writes_out = c.argv.iter().any(|s| s.contains("{out}"));
    argv.extend(c.argv.iter().map(|s| {
        s.replace("{out}", &out.to_string_lossy())
            .replace("{scratch}", &scratch.to_string_lossy())
    }));
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .envs(c.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(if writes_out {
            Stdio::null()
        } else {
            Stdio::from(std::fs::File::create(&out).map_err(|e| e.to_string())?)
        })
        .stderr(Stdio::piped())
        .process_group(0);
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", argv[0]))?;
    let pid = child.id() as i32;
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let (status, max_rss) = loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: pid is our child, not yet reaped (Child never waits for it).
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break (status, ru.ru_maxrss as u64 * 1024);
        }
        if r < 0 {
            return Err(format!("wait4: {}", std::io::Error::last_os_error()));
        }
        if t0.elapsed() > limit {
            // SAFETY: the group is our child's own.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let seconds = t0.elapsed().as_secs_f64();
    let stderr = reader.join().unwrap_or_default();
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    let output = digest(&out);
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&scratch);
    Ok(Ran {
        ok,
        seconds,
        max_rss,
        output,
        stderr,
    })
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

/// Length and hash of a file's contents (empty if it cannot be read).
fn digest(path: &Path) -> (u64, u64) {
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
