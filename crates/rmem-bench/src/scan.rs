//! `rmem bench scan`: sequential scan bandwidth of a region larger than the local budget, per
//! page size.

use crate::report::{err, JsonOut};
use crate::setup::local_setup;
use rmem_client::Runtime;
use std::time::Instant;

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
    #[command(flatten)]
    pub out: JsonOut,
    /// Prefetching: on or off.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub prefetch: String,
}

pub fn scan(a: ScanArgs) -> Result<(), String> {
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
    a.out.write(&serde_json::json!({
        "size": size, "local_percent": a.local_percent, "results": rows,
    }))
}
