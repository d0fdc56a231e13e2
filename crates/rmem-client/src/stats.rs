//! Statistics counted from the first fault: swap-ins, swap-outs, evictions, zero-fills and a
//! fault latency histogram. The pager is the only writer (but for what transparent mode left
//! to the kernel, counted where it decides); anyone may read a snapshot.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Latency histogram buckets: 4 per power of two of nanoseconds, up to ~2^40 ns.
const BUCKETS: usize = 4 * 41;

/// Live counters, shared between the pager (writer) and readers.
pub struct Stats {
    pub swap_ins: AtomicU64,
    pub swap_outs: AtomicU64,
    pub evictions: AtomicU64,
    pub zero_fills: AtomicU64,
    pub faults: AtomicU64,
    pub wp_faults: AtomicU64,
    pub bytes_fetched: AtomicU64,
    pub bytes_written_back: AtomicU64,
    pub local_bytes: AtomicU64,
    pub local_bytes_max: AtomicU64,
    pub select_ns_total: AtomicU64,
    pub select_ns_max: AtomicU64,
    /// Pages fetched ahead of any fault (prefetching), and those a program touched while in flight.
    pub prefetches: AtomicU64,
    pub prefetch_hits: AtomicU64,
    /// 4 KiB pieces of mapped pages that the program dropped itself (a raw madvise) and that
    /// were given zeros when touched again, as Linux gives.
    pub pieces_zeroed: AtomicU64,
    /// 4 KiB pieces found populated on a page the pager held as missing, and replaced by the
    /// page's contents. Always 0 unless something maps memory in the region behind rmem.
    pub pieces_replaced: AtomicU64,
    /// Dirty victims found holding what they were mapped with: evicted without a write-back.
    pub dirty_unchanged: AtomicU64,
    /// Faults served by fetching the faulting 4 KiB piece alone (sub-page fetches; not in
    /// `swap_ins`, which counts whole pages).
    pub sub_page_fetches: AtomicU64,
    /// Write-backs of a partial page's written 4 KiB pieces alone (in `evictions`, not in
    /// `swap_outs`, which counts whole pages; their bytes in `bytes_written_back`).
    pub sub_page_write_backs: AtomicU64,
    /// Pages wanted while their write-back was in flight and, when it landed, left remote
    /// for want of room (every other resident page in flight) and fetched again.
    pub reinstalls_refetched: AtomicU64,
    /// Reservations (inaccessible address space) larger than the servers' capacity that
    /// transparent mode left to the kernel, and their bytes: what the program later makes
    /// accessible there is not paged (GHC reserves its heap so, 1 TiB).
    pub reservations_to_kernel: AtomicU64,
    pub reservation_bytes_to_kernel: AtomicU64,
    latency: [AtomicU64; BUCKETS],
    /// Sum of every resolved fault's latency (beside its histogram): the time the program's
    /// threads waited on rmem.
    fault_ns_total: AtomicU64,
    /// The page store's own counters and its layout (`ec:4+1, encrypted`), once it starts.
    pub store: std::sync::OnceLock<(std::sync::Arc<crate::store::StoreCounters>, String)>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            swap_ins: AtomicU64::new(0),
            swap_outs: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            zero_fills: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            wp_faults: AtomicU64::new(0),
            bytes_fetched: AtomicU64::new(0),
            bytes_written_back: AtomicU64::new(0),
            local_bytes: AtomicU64::new(0),
            local_bytes_max: AtomicU64::new(0),
            select_ns_total: AtomicU64::new(0),
            select_ns_max: AtomicU64::new(0),
            prefetches: AtomicU64::new(0),
            prefetch_hits: AtomicU64::new(0),
            pieces_zeroed: AtomicU64::new(0),
            pieces_replaced: AtomicU64::new(0),
            dirty_unchanged: AtomicU64::new(0),
            sub_page_fetches: AtomicU64::new(0),
            sub_page_write_backs: AtomicU64::new(0),
            reinstalls_refetched: AtomicU64::new(0),
            reservations_to_kernel: AtomicU64::new(0),
            reservation_bytes_to_kernel: AtomicU64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
            fault_ns_total: AtomicU64::new(0),
            store: std::sync::OnceLock::new(),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < 4 {
        return ns as usize;
    }
    let log = 63 - ns.leading_zeros() as usize; // >= 2
    let sub = ((ns >> (log - 2)) & 3) as usize;
    (4 * (log - 1) + sub).min(BUCKETS - 1)
}

/// Upper bound of a bucket in nanoseconds.
fn bucket_upper_ns(b: usize) -> u64 {
    if b < 4 {
        return b as u64 + 1;
    }
    let log = b / 4 + 1;
    let sub = (b % 4) as u64;
    ((4 + sub + 1) << (log - 2)) - 1
}

impl Stats {
    /// Record one resolved fault's latency.
    pub fn record_fault(&self, d: Duration) {
        let ns = d.as_nanos() as u64;
        self.latency[bucket_of(ns)].fetch_add(1, Relaxed);
        self.fault_ns_total.fetch_add(ns, Relaxed);
    }

    pub fn add(counter: &AtomicU64, v: u64) {
        counter.fetch_add(v, Relaxed);
    }

    pub fn set_local_bytes(&self, bytes: u64) {
        self.local_bytes.store(bytes, Relaxed);
        if bytes > self.local_bytes_max.load(Relaxed) {
            self.local_bytes_max.store(bytes, Relaxed);
        }
    }

    pub fn record_select(&self, d: Duration) {
        let ns = d.as_nanos() as u64;
        self.select_ns_total.fetch_add(ns, Relaxed);
        if ns > self.select_ns_max.load(Relaxed) {
            self.select_ns_max.store(ns, Relaxed);
        }
    }

    fn percentile_us(&self, counts: &[u64], q: f64) -> f64 {
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, &c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_upper_ns(b) as f64 / 1000.0;
            }
        }
        bucket_upper_ns(BUCKETS - 1) as f64 / 1000.0
    }

    pub fn snapshot(&self, page_size: usize, policy: &str) -> StatsSnapshot {
        let counts: Vec<u64> = self.latency.iter().map(|a| a.load(Relaxed)).collect();
        let (c, layout) = match self.store.get() {
            Some((c, l)) => (Some(c), l.clone()),
            None => (None, String::new()),
        };
        let store =
            |f: fn(&crate::store::StoreCounters) -> &AtomicU64| c.map_or(0, |c| f(c).load(Relaxed));
        StatsSnapshot {
            layout,
            servers_lost: store(|c| &c.servers_lost),
            pages_repaired: store(|c| &c.pages_repaired),
            pieces_moved: store(|c| &c.pieces_moved),
            pieces_pulled: store(|c| &c.pieces_pulled),
            repair_s: store(|c| &c.repair_us) as f64 / 1e6,
            pieces_bad: store(|c| &c.pieces_bad),
            patches: store(|c| &c.patches),
            patches_whole: store(|c| &c.patches_whole),
            failovers: store(|c| &c.failovers),
            reads_hedged: store(|c| &c.reads_hedged),
            writes_redirected: store(|c| &c.writes_redirected),
            writes_released: store(|c| &c.writes_released),
            writes_degraded: store(|c| &c.writes_degraded),
            swap_ins: self.swap_ins.load(Relaxed),
            swap_outs: self.swap_outs.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            zero_fills: self.zero_fills.load(Relaxed),
            faults: self.faults.load(Relaxed),
            wp_faults: self.wp_faults.load(Relaxed),
            fault_us_p50: self.percentile_us(&counts, 0.50),
            fault_us_p99: self.percentile_us(&counts, 0.99),
            fault_us_max: self.percentile_us(&counts, 1.0),
            fault_wait_s: self.fault_ns_total.load(Relaxed) as f64 / 1e9,
            bytes_fetched: self.bytes_fetched.load(Relaxed),
            bytes_written_back: self.bytes_written_back.load(Relaxed),
            local_bytes_max: self.local_bytes_max.load(Relaxed),
            page_size: page_size as u64,
            policy: policy.to_string(),
            select_us_total: self.select_ns_total.load(Relaxed) as f64 / 1000.0,
            select_us_max: self.select_ns_max.load(Relaxed) as f64 / 1000.0,
            prefetches: self.prefetches.load(Relaxed),
            prefetch_hits: self.prefetch_hits.load(Relaxed),
            pieces_zeroed: self.pieces_zeroed.load(Relaxed),
            pieces_replaced: self.pieces_replaced.load(Relaxed),
            dirty_unchanged: self.dirty_unchanged.load(Relaxed),
            sub_page_fetches: self.sub_page_fetches.load(Relaxed),
            sub_page_write_backs: self.sub_page_write_backs.load(Relaxed),
            reinstalls_refetched: self.reinstalls_refetched.load(Relaxed),
            reservations_to_kernel: self.reservations_to_kernel.load(Relaxed),
            reservation_bytes_to_kernel: self.reservation_bytes_to_kernel.load(Relaxed),
        }
    }
}

/// A point-in-time copy of the statistics, in the units the JSON report uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatsSnapshot {
    /// Pages fetched from servers.
    pub swap_ins: u64,
    /// Pages written back to servers.
    pub swap_outs: u64,
    pub evictions: u64,
    pub zero_fills: u64,
    /// Missing-page faults taken in the region (write-protect faults are counted apart).
    pub faults: u64,
    pub wp_faults: u64,
    pub fault_us_p50: f64,
    pub fault_us_p99: f64,
    /// The longest fault, to its histogram bucket's upper bound (within a fifth): how long
    /// the program was held at most, e.g. while a lost server was given up on.
    pub fault_us_max: f64,
    /// Seconds of fault latency summed over every resolved fault (threads waiting at once
    /// each count).
    pub fault_wait_s: f64,
    pub bytes_fetched: u64,
    pub bytes_written_back: u64,
    pub local_bytes_max: u64,
    pub page_size: u64,
    pub policy: String,
    pub select_us_total: f64,
    pub select_us_max: f64,
    pub prefetches: u64,
    pub prefetch_hits: u64,
    pub pieces_zeroed: u64,
    pub pieces_replaced: u64,
    /// Dirty victims that held what they were mapped with: evicted without a write-back
    /// (counted in `evictions`, not in `swap_outs`).
    pub dirty_unchanged: u64,
    /// 4 KiB pieces fetched alone (sub-page fetches), not counted in `swap_ins`.
    pub sub_page_fetches: u64,
    /// Partial pages whose written 4 KiB pieces were written back alone.
    pub sub_page_write_backs: u64,
    /// Wanted write-backs left remote when they landed, for want of room, and fetched again.
    pub reinstalls_refetched: u64,
    /// Reservations larger than the servers' capacity left to the kernel, and their bytes.
    pub reservations_to_kernel: u64,
    pub reservation_bytes_to_kernel: u64,
    /// How pages were kept (`ec:4+1, encrypted`); empty for a store without servers.
    pub layout: String,
    /// Servers lost while the program ran, pages rebuilt elsewhere and the time it took,
    /// pieces that came back wrong, reads sent to another server after one failed, writes
    /// sent to another server after theirs went silent or lost its link.
    pub servers_lost: u64,
    pub pages_repaired: u64,
    /// Of the pieces that moved, those read off their draining server as they were.
    pub pieces_moved: u64,
    /// Of those, the ones the server taking them copied itself (server to server).
    pub pieces_pulled: u64,
    pub repair_s: f64,
    pub pieces_bad: u64,
    /// Pages whose written pieces were patched over their fragments (`ec:K+M`), and of the
    /// patches those that became whole write-backs.
    pub patches: u64,
    pub patches_whole: u64,
    pub failovers: u64,
    pub reads_hedged: u64,
    pub writes_redirected: u64,
    pub writes_released: u64,
    pub writes_degraded: u64,
}

impl StatsSnapshot {
    /// The JSON report written by `--stats-json`.
    pub fn to_json(&self) -> String {
        self.json(None)
    }

    /// The report with `"complete"` first: whether it was written at the program's exit.
    pub fn to_json_complete(&self, complete: bool) -> String {
        self.json(Some(complete))
    }

    fn json(&self, complete: Option<bool>) -> String {
        let mut s = String::from("{\n");
        if let Some(c) = complete {
            let _ = writeln!(s, "  \"complete\": {c},");
        }
        let ints = [
            ("swap_ins", self.swap_ins),
            ("swap_outs", self.swap_outs),
            ("evictions", self.evictions),
            ("zero_fills", self.zero_fills),
            ("faults", self.faults),
            ("wp_faults", self.wp_faults),
            ("bytes_fetched", self.bytes_fetched),
            ("bytes_written_back", self.bytes_written_back),
            ("local_bytes_max", self.local_bytes_max),
            ("page_size", self.page_size),
            ("prefetches", self.prefetches),
            ("prefetch_hits", self.prefetch_hits),
            ("pieces_zeroed", self.pieces_zeroed),
            ("pieces_replaced", self.pieces_replaced),
            ("dirty_unchanged", self.dirty_unchanged),
            ("sub_page_fetches", self.sub_page_fetches),
            ("sub_page_write_backs", self.sub_page_write_backs),
            ("reinstalls_refetched", self.reinstalls_refetched),
            ("reservations_to_kernel", self.reservations_to_kernel),
            (
                "reservation_bytes_to_kernel",
                self.reservation_bytes_to_kernel,
            ),
            ("servers_lost", self.servers_lost),
            ("pages_repaired", self.pages_repaired),
            ("pieces_moved", self.pieces_moved),
            ("pieces_pulled", self.pieces_pulled),
            ("pieces_bad", self.pieces_bad),
            ("patches", self.patches),
            ("patches_whole", self.patches_whole),
            ("failovers", self.failovers),
            ("reads_hedged", self.reads_hedged),
            ("writes_redirected", self.writes_redirected),
            ("writes_released", self.writes_released),
            ("writes_degraded", self.writes_degraded),
        ];
        for (k, v) in ints {
            let _ = writeln!(s, "  \"{k}\": {v},");
        }
        for (k, v) in [
            ("fault_us_p50", self.fault_us_p50),
            ("fault_us_p99", self.fault_us_p99),
            ("fault_us_max", self.fault_us_max),
            ("fault_wait_s", self.fault_wait_s),
            ("select_us_total", self.select_us_total),
            ("select_us_max", self.select_us_max),
            ("repair_s", self.repair_s),
        ] {
            let _ = writeln!(s, "  \"{k}\": {v:.3},");
        }
        let policy: String = self
            .policy
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        let layout: String = self
            .layout
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || ":+, ".contains(*c))
            .collect();
        let _ = writeln!(s, "  \"layout\": \"{layout}\",");
        let _ = writeln!(s, "  \"policy\": \"{policy}\"");
        s.push_str("}\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_bound_their_values() {
        let mut last = 0;
        for ns in [
            0u64,
            1,
            3,
            4,
            5,
            7,
            8,
            100,
            1000,
            17_000,
            1 << 30,
            u64::MAX / 2,
        ] {
            let b = bucket_of(ns);
            assert!(b >= last);
            last = b;
            if b < BUCKETS - 1 {
                assert!(
                    bucket_upper_ns(b) >= ns,
                    "ns {ns} bucket {b} upper {}",
                    bucket_upper_ns(b)
                );
            }
        }
    }

    #[test]
    fn percentiles_follow_the_recorded_latencies() {
        let s = Stats::default();
        for _ in 0..90 {
            s.record_fault(Duration::from_micros(10));
        }
        for _ in 0..10 {
            s.record_fault(Duration::from_micros(1000));
        }
        let within = |what: &str, us: f64, lo: f64, hi: f64| {
            assert!(us >= lo && us < hi, "{what} {us} us, not in [{lo}, {hi})");
        };
        within("p50", s.snapshot(4096, "fifo").fault_us_p50, 10.0, 13.0);
        s.record_fault(Duration::from_millis(2500));
        let snap = s.snapshot(4096, "fifo");
        within("max", snap.fault_us_max, 2.5e6, 3.0e6);
        within("p99", snap.fault_us_p99, 1000.0, 1300.0);
        // 90 x 10 us + 10 x 1 ms + 2.5 s, exactly (a sum, not a bucket bound).
        assert!(
            (snap.fault_wait_s - 2.5109).abs() < 1e-9,
            "{}",
            snap.fault_wait_s
        );
        assert!(snap.to_json().contains("\"fault_wait_s\": 2.511,"));
        assert!(snap.to_json().contains("\"policy\": \"fifo\""));
        assert!(!snap.to_json().contains("complete"));
        for c in [true, false] {
            let j = snap.to_json_complete(c);
            assert!(j.starts_with(&format!("{{\n  \"complete\": {c},\n")), "{j}");
        }
    }
}
