//! What several benchmarks start from: one memory server on loopback with a configuration
//! pointing at it, the raw 4 KiB round trip to it (the reference of `fault`, `nbd` and
//! `pool`), the random numbers that pick pages, and workers: this binary run again (under
//! `rmem run` or not) to measure from inside a program.

use crate::report::err;
use rmem_cli::launch::{fresh_token, start_local_servers, ServerProc};
use rmem_client::config::{Config, Placement};
use rmem_client::store::remote::RemoteStore;
use rmem_client::store::{Completion, PageStore};
use rmem_client::PageIndex;
use std::process::Command;
use std::time::{Duration, Instant};

/// The page size of the raw round trip (and of `rmem bench fault`).
pub const PS: usize = 4096;

/// One memory server process and a configuration pointing at it.
pub fn local_setup(
    page_size: usize,
    local_bytes: u64,
    capacity: u64,
) -> Result<(Vec<ServerProc>, Config), String> {
    let token = fresh_token();
    let servers = start_local_servers(1, capacity, &token)?;
    let config = Config {
        servers: servers.iter().map(|s| s.addr.clone()).collect(),
        token: token.into_bytes(),
        page_size,
        local_bytes,
        region_bytes: 1 << 36,
        ..Config::default()
    };
    Ok((servers, config))
}

/// The next of a xorshift64 sequence (nonzero seed).
pub fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A 4 KiB read request and its answer over the client's own transport, without userfaultfd.
pub struct RawRoundTrip {
    store: RemoteStore,
    pages: u64,
}

impl RawRoundTrip {
    pub fn connect(config: &Config) -> Result<RawRoundTrip, String> {
        let mut store = RemoteStore::connect(
            &config.servers,
            &config.token,
            PS,
            Placement::Priority,
            rmem_client::store::remote::Timing::of(config),
        )
        .map_err(err)?;
        let page = vec![0xA5u8; PS];
        let pages = 1024u64;
        for p in 0..pages {
            store.store(PageIndex(p), &page).map_err(err)?;
        }
        store.flush().map_err(err)?;
        let mut stored = 0;
        while stored < pages {
            // The socket may not take every request at once: keep sending while waiting.
            store.flush().map_err(err)?;
            stored += store.poll(&mut |_| {}).map_err(err)? as u64;
        }
        let mut raw = RawRoundTrip { store, pages };
        let mut x = 1;
        raw.sample(1000, &mut x)?; // warm up
        Ok(raw)
    }

    pub fn sample(&mut self, n: usize, x: &mut u64) -> Result<Vec<Duration>, String> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let p = PageIndex(xorshift(x) % self.pages);
            let t0 = Instant::now();
            self.store.fetch(p).map_err(err)?;
            let mut got = false;
            while !got {
                self.store.flush().map_err(err)?;
                self.store
                    .poll(&mut |c| {
                        if let Completion::Fetched { data, .. } = c {
                            assert_eq!(data[0], 0xA5);
                            got = true;
                        }
                    })
                    .map_err(err)?;
            }
            out.push(t0.elapsed());
        }
        Ok(out)
    }
}

/// Run a worker (`rmem-bench BENCH --worker ...`), parse the JSON line it prints.
pub fn worker_json(c: &mut Command) -> Result<serde_json::Value, String> {
    let out = c.output().map_err(|e| format!("{c:?}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with('{'));
    match (out.status.success(), line) {
        (true, Some(l)) => serde_json::from_str(l).map_err(|e| format!("worker output: {e}")),
        _ => Err(format!(
            "worker failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}
