//! rmem-policy: page replacement policies behind the [`Policy`] trait.
//!
//! Entry point: [`by_name`] (or [`by_name_with`] for tuned parameters), which builds a policy
//! from its `--policy` name. The runtime feeds a policy the events it can see: a miss on a
//! page about to come in, before any victim is chosen for it ([`Policy::on_miss`]), the page
//! becoming resident and evictable ([`Policy::insert`]),
//! a first write to a resident page ([`Policy::on_write`]), a use of a resident page where the
//! front end can see it ([`Policy::on_hit`], the block device only), a page leaving the evictable set
//! for any other reason ([`Policy::remove`]), and asks it for victims
//! ([`Policy::select_victim`]). A policy only ever returns a page it holds, and forgets it as
//! it returns it, so it can never pick a page that is in flight. The same trait drives the
//! live runtime and the offline simulator ([`sim`]), which also implements Belady's OPT.
#![forbid(unsafe_code)]

mod adaptive;
mod bitset;
mod fifo;
mod history;
mod nru;
pub mod patterns;
pub mod per_page;
pub mod sim;
pub mod trace;

pub use adaptive::Adaptive;
pub use bitset::PageSet;
pub use fifo::Fifo;
pub use history::History;
pub use nru::Nru;

/// Index of a DLM page within the client's region (address = base + index * page size).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageIndex(pub u64);

/// How a page became resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Fetched from a memory server (a swap-in).
    Fetched,
    /// Zero-filled locally: never written before.
    ZeroFilled,
    /// Fetched ahead of the program by the prefetcher: nothing has touched it yet. Policies
    /// that cannot tell take it as `Fetched`.
    Prefetched,
    /// The page was just returned by [`Policy::select_victim`] but the runtime could not evict
    /// it yet (no write-back slot): it is held again, and this is not a new reference.
    Declined,
}

/// A page replacement policy.
pub trait Policy: Send {
    /// The `--policy` name.
    fn name(&self) -> &'static str;
    /// `page` missed and is about to come in; victims chosen from now until the next miss
    /// make room for it. May be repeated for the same miss (a fault retried for room).
    fn on_miss(&mut self, _page: PageIndex) {}
    /// The program ran over the pages `from..to` (a stream of misses continued past them):
    /// those it holds were used, pages prefetched there included.
    fn on_passed(&mut self, _from: PageIndex, _to: PageIndex) {}
    /// `page` is resident and may be chosen as a victim from now on.
    fn insert(&mut self, page: PageIndex, how: Admission);
    /// `page` took its first write since it became resident.
    fn on_write(&mut self, _page: PageIndex) {}
    /// `page`, resident, was used again. Only a front end that sees every access reports
    /// this (the block device's reads and writes of cached blocks); the pager cannot, so
    /// under `rmem run` and in the simulator no policy hears of hits. No-op if not held.
    fn on_hit(&mut self, _page: PageIndex) {}
    /// `page` is no longer evictable (freed by the program). No-op if not held.
    fn remove(&mut self, page: PageIndex);
    /// Choose a victim among the held pages and forget it. `None` when none is held.
    fn select_victim(&mut self) -> Option<PageIndex>;
    /// Pages held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Names accepted by [`by_name`].
pub const POLICY_NAMES: &[&str] = &["adaptive", "fifo", "history", "nru"];

/// The default `--policy`: `adaptive` takes no more misses than fifo in every simulated
/// pattern and, live, no more swap-ins than fifo on the project's workloads (within 0.01% on
/// random access), and up to 0.4x fifo's on loops a little larger than memory
/// (docs/benchmarks.md, "Page replacement"); on the real programs of `rmem bench programs`
/// it fetches 0.5-0.86x fifo's bytes, except numpy (up to 1.15x: docs/benchmarks.md).
pub const DEFAULT_POLICY: &str = "adaptive";

/// Tunable parameters, with the defaults `rmem run` uses.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyParams {
    /// `history`: the share of the swap-in history excluded after a page's previous swap-in
    /// (the paper's reflecting history ratio, 0.20 by default).
    pub history_ratio: f64,
    /// `history`: most resident pages examined by one victim search (see [`History`]).
    pub history_scan_max: usize,
    /// `adaptive`: how far (in pages) behind a demand miss a page fetched ahead of the
    /// program counts as used (see [`Adaptive`]): the runtime sets twice the prefetcher's
    /// largest window.
    pub prefetch_reach: u64,
}

impl Default for PolicyParams {
    fn default() -> Self {
        PolicyParams {
            history_ratio: 0.20,
            history_scan_max: 1024,
            prefetch_reach: 32,
        }
    }
}

/// Build a policy from its name with default parameters, or `None` if the name is unknown.
pub fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    by_name_with(name, &PolicyParams::default())
}

/// Build a policy from its name and parameters, or `None` if the name is unknown.
pub fn by_name_with(name: &str, params: &PolicyParams) -> Option<Box<dyn Policy>> {
    match name {
        "fifo" => Some(Box::new(Fifo::new())),
        "history" => Some(Box::new(History::new(
            params.history_ratio,
            params.history_scan_max,
        ))),
        "nru" => Some(Box::new(Nru::new())),
        "adaptive" => Some(Box::new(Adaptive::with_reach(params.prefetch_reach))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every policy only ever returns pages it holds, each once, and never a page in flight:
    /// a random mix of misses (in flight until admitted), admissions, first writes, frees,
    /// victims written back (in flight until acknowledged) and victims declined and put back.
    #[test]
    fn policies_only_pick_held_pages() {
        use std::collections::BTreeSet;
        for name in POLICY_NAMES {
            let mut p = by_name(name).unwrap();
            let mut held = BTreeSet::new();
            let mut filling = BTreeSet::new();
            let mut leaving = BTreeSet::new();
            let mut seen = BTreeSet::new();
            let mut x: u64 = 12345;
            for step in 0..40_000u64 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let page = PageIndex((x >> 33) % 500);
                let busy =
                    held.contains(&page) || filling.contains(&page) || leaving.contains(&page);
                match (x >> 20) % 8 {
                    0 | 1 if !busy => {
                        p.on_miss(page);
                        filling.insert(page);
                    }
                    2 | 3 => {
                        if let Some(&f) = filling.iter().next() {
                            filling.remove(&f);
                            let how = if seen.insert(f) {
                                Admission::ZeroFilled
                            } else if x.is_multiple_of(3) {
                                Admission::Prefetched
                            } else {
                                Admission::Fetched
                            };
                            p.insert(f, how);
                            held.insert(f);
                        }
                    }
                    4 => {
                        if held.contains(&page) {
                            p.on_write(page);
                        }
                        held.remove(&page);
                        p.remove(page);
                    }
                    5 => {
                        if let Some(&l) = leaving.iter().next() {
                            leaving.remove(&l);
                        }
                    }
                    6 if x.is_multiple_of(2) => {
                        // A stream passed a range, in either order, empty included.
                        let other = PageIndex((x >> 45) % 500);
                        p.on_passed(page.min(other), page.max(other));
                        p.on_passed(page, other);
                    }
                    _ => match p.select_victim() {
                        Some(v) => {
                            assert!(
                                !filling.contains(&v) && !leaving.contains(&v),
                                "{name} picked {v:?}, in flight, at step {step}"
                            );
                            assert!(
                                held.remove(&v),
                                "{name} picked {v:?} not held at step {step}"
                            );
                            if x.is_multiple_of(5) {
                                p.insert(v, Admission::Declined);
                                held.insert(v);
                            } else {
                                leaving.insert(v);
                            }
                        }
                        None => assert!(held.is_empty()),
                    },
                }
                assert_eq!(p.len(), held.len());
            }
        }
    }
}
