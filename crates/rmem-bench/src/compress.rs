//! `rmem bench compress`: would compressing pages on the wire pay (issue 15's last lever)?
//!
//! Each real program of `rmem bench programs` runs plain once to time it, then again while
//! its memory is sampled at a quarter, half and three quarters of that time: the process
//! with the largest resident set in the program's process group is stopped (SIGSTOP), its
//! private anonymous writable mappings (what rmem pages) are read through /proc/PID/mem in
//! pages of `--page-size`, and it is continued. The second run's output must equal the
//! first's. Then every sampled page that is not all zeros (rmem never moves a page never
//! written) is compressed and decompressed, one at a time on one thread, with LZ4
//! (lz4_flex, the block format) and zstd at level 1, each decompression checked against the
//! page.
//!
//! What it prints, per program and codec: the ratio (bytes in over bytes out, a page that
//! does not shrink sent as it is), microseconds to compress and to decompress a page, and
//! what compression would add to one page's fetch (decompress, less the wire time saved)
//! and write-back (compress, less the wire time saved) on a 10 and a 25 Gbit/s link.
//! Negative is faster. This measures the lever; rmem does not compress.

use crate::bounded;
use crate::programs::{self, Program, Size};
use crate::report::JsonOut;
use serde_json::json;
use std::fmt::Write as _;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct CompressArgs {
    /// How large the programs' data are (as for `rmem bench programs`).
    #[arg(long, value_enum, default_value_t = Size::Small)]
    pub size: Size,
    /// Only these programs (sort, numpy, sqlite, octave, imagemagick, python, stream, himeno).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// The unit compressed: rmem's page size.
    #[arg(long, default_value = "64K", value_parser = parse_page)]
    pub page_size: u64,
    /// Most bytes read in one sample; a larger footprint is sampled every Nth page.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub sample_max: u64,
    /// Link rates to model, in Gbit/s.
    #[arg(long, value_delimiter = ',', default_values_t = [10.0, 25.0])]
    pub gbits: Vec<f64>,
    /// Bound on each run, in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
    #[command(flatten)]
    pub out: JsonOut,
}

fn parse_size(s: &str) -> Result<u64, String> {
    rmem_proto::size::parse_size(s).map_err(|e| e.to_string())
}

fn parse_page(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v.is_power_of_two() && (4096..=4 << 20).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s}: a power of two from 4K to 4M"))
    }
}

/// When, in fractions of the plain run's time, the memory is sampled.
const SAMPLE_AT: [f64; 3] = [0.25, 0.5, 0.75];

#[derive(Clone, Copy, Debug)]
enum Codec {
    Lz4,
    Zstd1,
}

impl Codec {
    fn name(self) -> &'static str {
        match self {
            Codec::Lz4 => "lz4",
            Codec::Zstd1 => "zstd-1",
        }
    }
}

/// One codec over one program's sampled pages.
struct Coded {
    bytes_out: u64,
    /// Pages that did not shrink (sent as they are, not decompressed).
    raw_pages: u64,
    compress: Duration,
    decompress: Duration,
}

/// What was sampled of one program.
#[derive(Default)]
struct Sampled {
    /// Non-zero pages, back to back.
    data: Vec<u8>,
    zero_pages: u64,
    samples: usize,
    /// Bytes of the eligible mappings at the largest sample.
    eligible_max: u64,
}

pub fn compress(a: CompressArgs) -> Result<(), String> {
    programs::check_only(&a.only)?;
    if a.gbits.is_empty() || a.gbits.iter().any(|&g| g.is_nan() || g <= 0.0) {
        return Err("--gbits: positive link rates".into());
    }
    let dir = programs::work_dir("compress")?;
    bounded::catch_interrupts();
    let result = programs::prepare(a.size, &a.only, &dir).and_then(|p| run(&a, &dir, p));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(a: &CompressArgs, dir: &Path, progs: Vec<Program>) -> Result<(), String> {
    println!(
        "rmem bench compress ({:?}): {} program(s), {} KiB pages, sampled at {:?} of their plain time",
        a.size,
        progs.len(),
        a.page_size >> 10,
        SAMPLE_AT
    );
    let limit = Duration::from_secs(a.timeout_s);
    let mut rows = Vec::new();
    let mut table = String::new();
    let rates: Vec<String> = a.gbits.iter().map(|g| format!("{g}G")).collect();
    let _ = writeln!(
        table,
        "program  pages  zero codec   ratio comp us dec us | fetch +us at {r} | write-back +us at {r} | pays below Gbit/s: fetch, write-back",
        r = rates.join(", ")
    );
    for p in &progs {
        bounded::interrupted()?;
        let (f, out) = programs::launch(p, dir, "plain", &[], limit, None, None)?;
        if f.status != bounded::Status::Ok {
            return Err(format!("{} failed: {}", p.name, f.stderr));
        }
        let plain = Duration::from_secs_f64(f.wall);
        let (s, sampled_out) = sample_run(p, dir, plain, limit, a)?;
        if sampled_out != out {
            return Err(format!(
                "{}'s output differs when its memory is sampled",
                p.name
            ));
        }
        let pages = s.data.len() as u64 / a.page_size;
        if pages == 0 {
            // Over before the first sample (or all its memory zeros): nothing to measure.
            let line = format!(
                "{:<7} not sampled: it ran {:.2} s, {} sample(s), {} zero pages",
                p.name, f.wall, s.samples, s.zero_pages
            );
            println!("  {line}");
            let _ = writeln!(table, "{line}");
            rows.push(json!({
                "program": p.name,
                "plain_seconds": f.wall,
                "samples": s.samples,
                "pages": 0,
                "zero_pages": s.zero_pages,
                "codecs": [],
            }));
            continue;
        }
        let zero_pct = 100.0 * s.zero_pages as f64 / (pages + s.zero_pages) as f64;
        let mut codecs = Vec::new();
        for codec in [Codec::Lz4, Codec::Zstd1] {
            let c = code(codec, &s.data, a.page_size as usize)?;
            let ratio = s.data.len() as f64 / c.bytes_out as f64;
            let comp_us = c.compress.as_secs_f64() * 1e6 / pages as f64;
            let dec_us = c.decompress.as_secs_f64() * 1e6 / pages as f64;
            // Bits a page saves on the wire, on average.
            let saved_bits = (s.data.len() as f64 - c.bytes_out as f64) * 8.0 / pages as f64;
            let (mut fetch, mut write, mut links) = (Vec::new(), Vec::new(), Vec::new());
            for &g in &a.gbits {
                let saved_us = saved_bits / (g * 1e3);
                fetch.push(format!("{:+.1}", dec_us - saved_us));
                write.push(format!("{:+.1}", comp_us - saved_us));
                links.push(json!({
                    "gbits": g,
                    "wire_saved_us_per_page": saved_us,
                    "fetch_delta_us": dec_us - saved_us,
                    "write_back_delta_us": comp_us - saved_us,
                }));
            }
            // The link rate at which the time saved on the wire equals the codec's time.
            let (fetch_even, write_even) =
                (saved_bits / (dec_us * 1e3), saved_bits / (comp_us * 1e3));
            let line = format!(
                "{:<7} {:>6} {:>4.0}% {:<6} {:>5.2}x {:>7.1} {:>6.1} | {} | {} | {:.1}, {:.1}",
                p.name,
                pages,
                zero_pct,
                codec.name(),
                ratio,
                comp_us,
                dec_us,
                fetch.join(", "),
                write.join(", "),
                fetch_even,
                write_even
            );
            println!("  {line}");
            let _ = writeln!(table, "{line}");
            codecs.push(json!({
                "codec": codec.name(),
                "ratio": ratio,
                "bytes_out": c.bytes_out,
                "pages_not_shrunk": c.raw_pages,
                "compress_us_per_page": comp_us,
                "decompress_us_per_page": dec_us,
                "fetch_pays_below_gbits": fetch_even,
                "write_back_pays_below_gbits": write_even,
                "links": links,
            }));
        }
        rows.push(json!({
            "program": p.name,
            "plain_seconds": f.wall,
            "samples": s.samples,
            "eligible_bytes_max": s.eligible_max,
            "pages": pages,
            "zero_pages": s.zero_pages,
            "bytes_in": s.data.len(),
            "codecs": codecs,
        }));
    }
    println!("\n{table}");
    println!(
        "+us: microseconds compression adds to one page's fetch (its decompression) or \
         write-back (its compression), less the wire time the smaller page saves; negative is \
         faster. Pays below: the link rate under which the wire time saved exceeds the codec's."
    );
    a.out.write(&json!({
        "bench": "compress",
        "size": format!("{:?}", a.size).to_lowercase(),
        "page_size": a.page_size,
        "sample_at": SAMPLE_AT,
        "gbits": a.gbits,
        "programs": rows,
    }))
}

/// Run `p` while sampling its memory at [`SAMPLE_AT`] of `plain`; what was sampled, and the
/// run's output digest.
fn sample_run(
    p: &Program,
    dir: &Path,
    plain: Duration,
    limit: Duration,
    a: &CompressArgs,
) -> Result<(Sampled, (u64, u64)), String> {
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let t0 = Instant::now();
            let mut s = Sampled::default();
            for at in SAMPLE_AT {
                let when = plain.mul_f64(at);
                while t0.elapsed() < when {
                    if done.load(Ordering::Relaxed) {
                        return Ok(s);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                let Some((pid, group)) = largest_in_child_group() else {
                    continue;
                };
                sample(pid, group, a.page_size, a.sample_max, &mut s)?;
                s.samples += 1;
            }
            Ok::<_, String>(s)
        });
        let r = programs::launch(p, dir, "sampled", &[], limit, None, None);
        done.store(true, Ordering::Relaxed);
        let s = sampler
            .join()
            .map_err(|_| "sampler panicked".to_string())??;
        let (f, out) = r?;
        if f.status != bounded::Status::Ok {
            return Err(format!(
                "{} failed while sampled ({}): {}",
                p.name,
                f.status.name(),
                f.stderr
            ));
        }
        Ok((s, out))
    })
}

/// Fields of /proc/PID/stat after the command: (state, ppid, pgrp).
fn stat_of(pid: i32) -> Option<(char, i32, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut f = s[s.rfind(')')? + 2..].split(' ');
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgrp = f.next()?.parse().ok()?;
    Some((state, ppid, pgrp))
}

/// The process with the largest resident set in the process group that a child of this
/// process leads (`bounded::run_bounded` puts each program in its own group), and the group.
fn largest_in_child_group() -> Option<(i32, i32)> {
    let me = std::process::id() as i32;
    let pids: Vec<i32> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let stats: Vec<(i32, (char, i32, i32))> = pids
        .iter()
        .filter_map(|&p| Some((p, stat_of(p)?)))
        .collect();
    let leaders: Vec<i32> = stats
        .iter()
        .filter(|(p, (_, ppid, pgrp))| *ppid == me && pgrp == p)
        .map(|(p, _)| *p)
        .collect();
    stats
        .iter()
        .filter(|(_, (state, _, pgrp))| leaders.contains(pgrp) && *state != 'Z')
        .filter_map(|(p, (_, _, group))| {
            let m = std::fs::read_to_string(format!("/proc/{p}/statm")).ok()?;
            let resident: u64 = m.split(' ').nth(1)?.parse().ok()?;
            Some((resident, *p, *group))
        })
        .max()
        .map(|(_, p, group)| (p, group))
}

/// The private anonymous writable mappings of `pid` (what rmem pages), page-aligned.
fn anon_mappings(pid: i32, page: u64) -> Vec<(u64, u64)> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let (_off, _dev, inode) = (f.next()?, f.next()?, f.next()?);
            let path = f.next().unwrap_or("");
            if !perms.starts_with("rw") || !perms.ends_with('p') || inode != "0" {
                return None;
            }
            if !(path.is_empty() || path == "[heap]") {
                return None;
            }
            let (s, e) = range.split_once('-')?;
            let (s, e) = (
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            );
            let (s, e) = (s.next_multiple_of(page), e / page * page);
            (e > s).then_some((s, e))
        })
        .collect()
}

/// Stop `pid`'s process group, read every `step`th page of `pid`'s anonymous memory into
/// `s`, continue the group. The whole group: `runuser` (the programs run as `nobody`) stops
/// itself when its child stops and would not continue.
fn sample(pid: i32, group: i32, page: u64, max: u64, s: &mut Sampled) -> Result<(), String> {
    // SAFETY: kill has no memory-safety preconditions; the group is our child's.
    if unsafe { libc::kill(-group, libc::SIGSTOP) } != 0 {
        return Ok(()); // gone already
    }
    let end = Instant::now() + Duration::from_secs(2);
    while stat_of(pid).is_some_and(|(st, _, _)| st != 'T') && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    let r = read_pages(pid, page, max, s);
    // SAFETY: as above.
    unsafe { libc::kill(-group, libc::SIGCONT) };
    r
}

fn read_pages(pid: i32, page: u64, max: u64, s: &mut Sampled) -> Result<(), String> {
    let maps = anon_mappings(pid, page);
    let eligible: u64 = maps.iter().map(|(a, b)| b - a).sum();
    s.eligible_max = s.eligible_max.max(eligible);
    let step = eligible.div_ceil(max.max(page)).max(1);
    let Ok(mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return Ok(()); // exited meanwhile
    };
    let mut buf = vec![0u8; page as usize];
    let mut n = 0u64;
    for (start, end) in maps {
        let mut at = start;
        while at < end {
            if n.is_multiple_of(step) && mem.read_exact_at(&mut buf, at).is_ok() {
                if buf.iter().all(|&b| b == 0) {
                    s.zero_pages += 1;
                } else {
                    s.data.extend_from_slice(&buf);
                }
            }
            n += 1;
            at += page;
        }
    }
    Ok(())
}

/// Compress each page of `data` with `codec` (timed alone), then decompress each that shrank
/// (timed alone) and check it.
fn code(codec: Codec, data: &[u8], page: usize) -> Result<Coded, String> {
    let bound =
        lz4_flex::block::get_maximum_output_size(page).max(zstd::zstd_safe::compress_bound(page));
    let mut out = vec![0u8; bound];
    let mut zc = zstd::bulk::Compressor::new(1).map_err(|e| e.to_string())?;
    let mut zd = zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?;
    let mut pack = |p: &[u8], out: &mut [u8]| -> Result<usize, String> {
        match codec {
            Codec::Lz4 => lz4_flex::block::compress_into(p, out).map_err(|e| e.to_string()),
            Codec::Zstd1 => zc.compress_to_buffer(p, out).map_err(|e| e.to_string()),
        }
    };
    let t = Instant::now();
    for p in data.chunks_exact(page) {
        pack(p, &mut out)?;
    }
    let compress = t.elapsed();
    // Again, untimed, keeping what shrank.
    let mut packed: Vec<Option<Vec<u8>>> = Vec::with_capacity(data.len() / page);
    for p in data.chunks_exact(page) {
        let n = pack(p, &mut out)?;
        packed.push((n < page).then(|| out[..n].to_vec()));
    }
    let bytes_out = packed
        .iter()
        .map(|c| c.as_ref().map_or(page, Vec::len) as u64)
        .sum();
    let raw_pages = packed.iter().filter(|p| p.is_none()).count() as u64;
    let mut back = vec![0u8; page];
    let mut decompress = Duration::ZERO;
    for (p, c) in data.chunks_exact(page).zip(&packed) {
        let Some(c) = c else { continue };
        let t = Instant::now();
        let n = match codec {
            Codec::Lz4 => lz4_flex::block::decompress_into(c, &mut back).map_err(|e| e.to_string()),
            Codec::Zstd1 => zd
                .decompress_to_buffer(c, &mut back[..])
                .map_err(|e| e.to_string()),
        }?;
        decompress += t.elapsed();
        if n != page || back != p {
            return Err(format!("{} did not give a page back", codec.name()));
        }
    }
    Ok(Coded {
        bytes_out,
        raw_pages,
        compress,
        decompress,
    })
}
