//! `rmem bench redundancy`: what surviving a server loss costs. In one run, a STREAM-like
//! triad and uniform random read-modify-writes at a quarter of their size in local memory,
//! under each layout (`none`, `replicas:2`, `ec:4+1`, `ec:8+2`), without and with
//! encryption; for each, the time against `none`'s, the remote memory used against the data,
//! the access latency p50/p99 of the random workload (three in four accesses are faults),
//! and the repair throughput after one server is killed, against the loopback bandwidth
//! measured in the same run.
//!
//! On one machine the servers share its cores with the program, so the time ratios also
//! carry the servers' work (a layout of width W wakes W servers per page); the CPU seconds of
//! the client (program and pager) and of the servers are reported apart: on a cluster only
//! the client's are on the program's node.
//!
//! Every configuration gets fresh servers (as many as the widest layout needs, the same for
//! all), so one run's repair or leftover pages do not weigh on the next.

use crate::report::{err, percentile_us, JsonOut};
use crate::setup::xorshift;
use rmem_cli::launch::{fresh_token, start_local_servers, ServerProc};
use rmem_client::config::Config;
use rmem_client::store::codec::Redundancy;
use rmem_client::Runtime;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct RedundancyArgs {
    /// Data size of each workload.
    #[arg(long, default_value = "256M")]
    pub size: String,
    /// Local budget as a percentage of the data.
    #[arg(long, default_value_t = 25)]
    pub local_percent: u64,
    /// Page size (the unit a fault fetches and a page is coded in): `rmem run`'s default
    /// unless given.
    #[arg(long, default_value = "64K")]
    pub page_size: String,
    /// Layouts, comma-separated; the first is the one the others are compared with.
    #[arg(long, default_value = "none,replicas:2,ec:4+1,ec:8+2")]
    pub layouts: String,
    /// Encryption settings to run each layout with: `off`, `on`, or `both`.
    #[arg(long, default_value = "both", value_parser = ["off", "on", "both"])]
    pub encrypt: String,
    /// Random read-modify-writes, each timed.
    #[arg(long, default_value_t = 200_000)]
    pub updates: usize,
    /// Triad passes over the three arrays.
    #[arg(long, default_value_t = 2)]
    pub passes: usize,
    /// Repair copies through the program's client (a read and a write each), as before
    /// servers pulled them from each other: for comparison (`RMEM_PULL=0`).
    #[arg(long)]
    pub no_pull: bool,
    #[command(flatten)]
    pub out: JsonOut,
}

/// What one configuration measured.
struct Row {
    layout: Redundancy,
    encrypt: bool,
    stream_s: f64,
    random_s: f64,
    /// Bytes on the servers after the random workload's fill, over the data's bytes.
    memory: f64,
    p50_us: f64,
    p99_us: f64,
    /// MB/s rebuilt after a server was killed (None: `none`, nothing to rebuild).
    repair_mbs: Option<f64>,
    repaired: u64,
    /// Of the pieces restored, those the servers copied among themselves (`Pull`).
    pulled: u64,
    /// CPU seconds over both workloads: this process (program and pager), the servers.
    client_cpu: f64,
    server_cpu: f64,
}

/// CPU seconds (user and system) this process has used so far.
fn self_cpu() -> f64 {
    // SAFETY: rusage is plain integers, for which zeroes are valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU seconds the processes `pids` have used so far (from /proc; 0 for one that is gone).
fn procs_cpu(pids: &[u32]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .map(|st| {
            // After the command's closing parenthesis: state is field 3; utime, stime 14, 15.
            let rest = st.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<&str> = rest.split_whitespace().collect();
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            (n(11) + n(12)) / hz
        })
        .sum()
}

pub fn redundancy(a: RedundancyArgs) -> Result<(), String> {
    let size = rmem_proto::size::parse_size(&a.size).map_err(err)?;
    let page = rmem_proto::size::parse_size(&a.page_size)
        .map_err(|e| format!("--page-size: {e}"))? as usize;
    let layouts = a
        .layouts
        .split(',')
        .map(|s| Redundancy::parse(s.trim()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--layouts: {e}"))?;
    if layouts.is_empty() {
        return Err("--layouts: none given".into());
    }
    let encrypts: &[bool] = match a.encrypt.as_str() {
        "off" => &[false],
        "on" => &[true],
        _ => &[false, true],
    };
    // One server more than the widest layout, so a killed one can be rebuilt elsewhere.
    let servers = layouts.iter().map(|l| l.width()).max().unwrap_or(1) + 1;
    let limits = crate::limits::measure(2000, 64)?;
    println!(
        "rmem bench redundancy: {} MiB per workload, {}% local, {} KiB pages, {servers} local \
         servers; loopback {:.1} Gbit/s, 4 KiB round trip {:.1} us",
        size >> 20,
        a.local_percent,
        page >> 10,
        limits.loopback_gbps,
        limits.rtt_us_p50
    );
    println!(
        "  {:<12} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9} {:>11} {:>10} {:>8}",
        "layout",
        "encrypt",
        "stream s",
        "x none",
        "random s",
        "x none",
        "memory",
        "p50 us",
        "p99 us",
        "repair MB/s",
        "cpu client",
        "servers"
    );
    let mut rows: Vec<Row> = Vec::new();
    for &layout in &layouts {
        for &encrypt in encrypts {
            let r = one(&a, size, page, servers, layout, encrypt)?;
            let base = rows.first().unwrap_or(&r);
            println!(
                "  {:<12} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>7.2}x {:>9.1} {:>9.1} {:>11} {:>9.2}s {:>7.2}s",
                r.layout.to_string(),
                if r.encrypt { "yes" } else { "no" },
                r.stream_s,
                r.stream_s / base.stream_s,
                r.random_s,
                r.random_s / base.random_s,
                r.memory,
                r.p50_us,
                r.p99_us,
                r.repair_mbs.map_or("-".into(), |m| format!("{m:.0}")),
                r.client_cpu,
                r.server_cpu
            );
            rows.push(r);
        }
    }
    let base = &rows[0];
    let loop_mbs = limits.loopback_bytes_per_s() / 1e6;
    println!(
        "  memory: bytes on the servers over the data's; repair against loopback \
         ({loop_mbs:.0} MB/s): target >= 0.5x; cpu: seconds over both workloads, of this \
         process (program and pager) and of the servers"
    );
    let transparent = transparent_rows(&a, size, servers, &layouts, encrypts)?;
    let json_rows: Vec<_> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "layout": r.layout.to_string(), "encrypt": r.encrypt,
                "stream_s": r.stream_s, "stream_ratio": r.stream_s / base.stream_s,
                "random_s": r.random_s, "random_ratio": r.random_s / base.random_s,
                "memory_ratio": r.memory, "memory_vs_base": r.memory / base.memory,
                "access_us_p50": r.p50_us, "access_us_p99": r.p99_us,
                "repair_mb_per_s": r.repair_mbs, "pages_repaired": r.repaired,
                "pieces_pulled": r.pulled,
                "repair_vs_loopback": r.repair_mbs.map(|m| m / loop_mbs),
                "client_cpu_s": r.client_cpu, "server_cpu_s": r.server_cpu,
            })
        })
        .collect();
    a.out.write(&serde_json::json!({
        "size": size, "local_percent": a.local_percent, "page_size": page, "servers": servers,
        "updates": a.updates, "passes": a.passes,
        "loopback_gbps": limits.loopback_gbps, "rtt_us_p50": limits.rtt_us_p50,
        "results": json_rows,
        "transparent": transparent,
    }))
}

/// What `rmem run` users get: the pager in the program (librmem.so), not in this process as
/// in the rows above. Each layout and encryption setting runs [`PROBE_PY`] (the sequential
/// workload) and [`RANDOM_PY`] (the random one) under `rmem run --servers N --local L` (its
/// own local servers), the first timed whole, the second's updates timed by the program, each
/// against `none`'s; `None` (said on stdout) without
/// python3. Transparent mode has its own ways to be slow that an in-process store cannot
/// show: keys set up in librmem's constructor sealed with AWS-LC's portable AES for months.
fn transparent_rows(
    a: &RedundancyArgs,
    size: u64,
    servers: usize,
    layouts: &[Redundancy],
    encrypts: &[bool],
) -> Result<Option<Vec<serde_json::Value>>, String> {
    let python = std::path::Path::new("/usr/bin/python3");
    if !python.is_file() {
        println!("  under rmem run: skipped, /usr/bin/python3 not found");
        return Ok(None);
    }
    let rmem = rmem_cli::launch::rmem_exe()?;
    let local = (size * a.local_percent / 100).max(1 << 20);
    println!(
        "  under rmem run (the pager in the program, as users run it): {} passes writing and \
         checking {} MiB at --local {} MiB",
        2 * a.passes,
        size >> 20,
        local >> 20
    );
    println!(
        "  and {} random read-modify-writes of a byte over it after a write of every page (the \
         updates timed by the program)",
        a.updates
    );
    println!(
        "  {:<12} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "layout", "encrypt", "seconds", "x none", "random s", "x none"
    );
    let mut out: Vec<serde_json::Value> = Vec::new();
    let mut base = None;
    for &layout in layouts {
        for &encrypt in encrypts {
            let run = |script: &str, arg: usize| {
                let mut cmd = std::process::Command::new(&rmem);
                cmd.args(["run", "--servers", &servers.to_string()])
                    .args(["--redundancy", &layout.to_string()])
                    .args(["--local", &local.to_string()]);
                if encrypt {
                    cmd.arg("--encrypt");
                }
                cmd.arg("--")
                    .arg(python)
                    .args(["-c", script, &size.to_string(), &arg.to_string()])
                    .stdin(std::process::Stdio::null());
                let t = Instant::now();
                let o = cmd
                    .output()
                    .map_err(|e| format!("{}: {e}", rmem.display()))?;
                let secs = t.elapsed().as_secs_f64();
                let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
                if !o.status.success() || !stdout.contains("checked") {
                    return Err(format!(
                        "under rmem run, {layout}{}: {}\n{stdout}{}",
                        if encrypt { " encrypted" } else { "" },
                        o.status,
                        String::from_utf8_lossy(&o.stderr)
                    ));
                }
                Ok((secs, stdout))
            };
            let (secs, _) = run(PROBE_PY, 2 * a.passes)?;
            let (_, said) = run(RANDOM_PY, a.updates)?;
            let random = said
                .split_whitespace()
                .skip_while(|w| *w != "random")
                .nth(1)
                .and_then(|w| w.parse::<f64>().ok())
                .ok_or_else(|| format!("the random probe said {said:?}"))?;
            let (b, rb) = *base.get_or_insert((secs, random));
            println!(
                "  {:<12} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
                layout.to_string(),
                if encrypt { "yes" } else { "no" },
                secs,
                secs / b,
                random,
                random / rb
            );
            out.push(serde_json::json!({
                "layout": layout.to_string(), "encrypt": encrypt,
                "seconds": secs, "ratio": secs / b,
                "random_seconds": random, "random_ratio": random / rb,
            }));
        }
    }
    Ok(Some(out))
}

/// The transparent rows' program: SIZE bytes, one byte per 4 KiB written then checked, PASSES
/// times over (each a new value), then "checked".
const PROBE_PY: &str = "import sys
n, passes = int(sys.argv[1]), int(sys.argv[2])
b = bytearray(n)
for r in range(passes):
    for i in range(0, n, 4096):
        b[i] = (i // 4096 + r) & 255
    for i in range(0, n, 4096):
        assert b[i] == (i // 4096 + r) & 255, (r, i)
print('checked')
";

/// The transparent rows' second program: SIZE bytes, one byte per 4 KiB written (every page
/// then has a copy on the servers), then UPDATES read-modify-writes of a random byte, timed
/// here; each updated byte checked against a replay of the updates; "random SECONDS checked".
const RANDOM_PY: &str = "import sys, time, random
n, updates = int(sys.argv[1]), int(sys.argv[2])
b = bytearray(n)
b[0::4096] = b'\\x01' * len(range(0, n, 4096))
r = random.Random(7)
t = time.perf_counter()
for _ in range(updates):
    i = r.randrange(n)
    b[i] = (b[i] + 1) & 255
s = time.perf_counter() - t
r = random.Random(7)
want = {}
for _ in range(updates):
    i = r.randrange(n)
    want[i] = want.get(i, 1 if i % 4096 == 0 else 0) + 1
for i, v in want.items():
    assert b[i] == v & 255, (i, b[i], v)
print('random %.6f checked' % s)
";

/// One layout and encryption setting on fresh servers: both workloads, then a server killed.
fn one(
    a: &RedundancyArgs,
    size: u64,
    page: usize,
    servers: usize,
    layout: Redundancy,
    encrypt: bool,
) -> Result<Row, String> {
    let token = fresh_token();
    // Room for the data at the widest overhead (ec:1+M or replicas), spread over the servers.
    let capacity = (size * 3 / servers as u64).max(64 << 20) + (64 << 20);
    let mut procs = start_local_servers(servers, capacity, &token)?;
    let local = (size * a.local_percent / 100).max(1 << 20);
    let config = Config {
        servers: procs.iter().map(|s| s.addr.clone()).collect(),
        token: token.into_bytes(),
        page_size: page,
        local_bytes: local,
        region_bytes: 1 << 36,
        redundancy: Some(layout),
        encrypt: Some(encrypt),
        pull: !a.no_pull,
        ..Config::default()
    };
    let pids: Vec<u32> = procs.iter().filter_map(ServerProc::pid).collect();
    let rt = Runtime::connect(&config).map_err(|e| rmem_client::error_chain(&e))?;
    let (c0, s0) = (self_cpu(), procs_cpu(&pids));
    let stream_s = stream(&rt, size, a.passes)?;
    let (random_s, lat, memory, mem) = random(&rt, size, a.updates, &procs, &config)?;
    let (client_cpu, server_cpu) = (self_cpu() - c0, procs_cpu(&pids) - s0);
    let (repair_mbs, repaired, pulled) = if layout.tolerates() > 0 {
        let (mbs, n, pulled) = repair(&rt, &mut procs[0])?;
        (Some(mbs), n, pulled)
    } else {
        (None, 0, 0)
    };
    rt.free(mem).map_err(err)?;
    drop(rt);
    for p in &mut procs {
        p.finalize(Duration::from_secs(2));
    }
    Ok(Row {
        layout,
        encrypt,
        stream_s,
        random_s,
        memory,
        p50_us: percentile_us(&lat, 0.5),
        p99_us: percentile_us(&lat, 0.99),
        repair_mbs,
        repaired,
        pulled,
        client_cpu,
        server_cpu,
    })
}

/// STREAM's triad `a = b + 3c` over three arrays of `size / 3` bytes, `passes` times after
/// a fill; checked; freed. Seconds of the triads.
fn stream(rt: &Runtime, size: u64, passes: usize) -> Result<f64, String> {
    let n = (size / 3 / 8) as usize;
    let mut arrays = Vec::new();
    for _ in 0..3 {
        let p = rt.alloc(n * 8).ok_or("allocation failed")? as *mut u64;
        // SAFETY: the allocation holds n u64s; the three do not overlap.
        arrays.push(unsafe { std::slice::from_raw_parts_mut(p, n) });
    }
    let [x, y, z] = &mut arrays[..] else {
        unreachable!()
    };
    for i in 0..n {
        y[i] = i as u64;
        z[i] = 2 * i as u64;
    }
    let t0 = Instant::now();
    for _ in 0..passes {
        for i in 0..n {
            x[i] = y[i].wrapping_add(3 * z[i]);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    for (i, v) in x.iter().enumerate().step_by(509) {
        if *v != 7 * i as u64 {
            return Err(format!("stream: element {i} is {v}, expected {}", 7 * i));
        }
    }
    for arr in arrays {
        rt.free(arr.as_mut_ptr().cast()).map_err(err)?;
    }
    Ok(secs)
}

/// Uniform random read-modify-writes of 8-byte words over `size` bytes, each timed; checked
/// against a local log of what was written. Seconds, the sorted latencies, the bytes on the
/// servers over the data's (measured after the fill), and the region (kept for the repair).
fn random(
    rt: &Runtime,
    size: u64,
    updates: usize,
    procs: &[ServerProc],
    config: &Config,
) -> Result<(f64, Vec<Duration>, f64, *mut u8), String> {
    let words = (size / 8) as usize;
    let base = rt.alloc(size as usize).ok_or("allocation failed")?;
    // SAFETY: the allocation holds `words` u64s.
    let mem = unsafe { std::slice::from_raw_parts_mut(base as *mut u64, words) };
    for (i, w) in mem.iter_mut().enumerate() {
        *w = i as u64;
    }
    // The servers' use once it settles: the fill's last write-backs and the frees of the
    // stream arrays before it may still be on their way (two readings 50 ms apart agree).
    let used_now = || -> Result<u64, String> {
        Ok(procs
            .iter()
            .map(|p| rmem_cli::status_cmd::query(&p.addr, &config.token, Duration::from_secs(10)))
            .collect::<Result<Vec<_>, _>>()?
            .iter()
            .map(|s| s.used_bytes)
            .sum())
    };
    let mut used = used_now()?;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(50));
        let again = used_now()?;
        if again == used {
            break;
        }
        used = again;
    }
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut lat = Vec::with_capacity(updates);
    let t0 = Instant::now();
    for _ in 0..updates {
        let i = (xorshift(&mut x) % words as u64) as usize;
        let t = Instant::now();
        // SAFETY: i < words.
        unsafe {
            let p = mem.as_mut_ptr().add(i);
            p.write_volatile(p.read_volatile().wrapping_add(1u64 << 40));
        }
        lat.push(t.elapsed());
    }
    let secs = t0.elapsed().as_secs_f64();
    // Check: every word is its index plus (its updates << 40).
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut count = std::collections::HashMap::new();
    for _ in 0..updates {
        *count
            .entry((xorshift(&mut x) % words as u64) as usize)
            .or_insert(0u64) += 1;
    }
    for (i, w) in mem.iter().enumerate().step_by(97) {
        let want = (i as u64).wrapping_add(count.get(&i).copied().unwrap_or(0) << 40);
        if *w != want {
            return Err(format!("random: word {i} is {w:#x}, expected {want:#x}"));
        }
    }
    lat.sort();
    Ok((secs, lat, used as f64 / size as f64, base))
}

/// Kill `victim` and wait for the pages it held to be rebuilt on the others: MB/s of pages
/// rebuilt (page bytes, not fragment bytes), how many, and how many pieces were pulled.
fn repair(rt: &Runtime, victim: &mut ServerProc) -> Result<(f64, u64, u64), String> {
    let before = rt.stats();
    victim.kill();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let s = rt.stats();
        if s.repair_s > before.repair_s {
            let n = s.pages_repaired - before.pages_repaired;
            let secs = s.repair_s - before.repair_s;
            let pulled = s.pieces_pulled - before.pieces_pulled;
            return Ok((n as f64 * s.page_size as f64 / secs / 1e6, n, pulled));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "repair not done after 300 s ({} pages rebuilt)",
                s.pages_repaired - before.pages_repaired
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
