//! `adaptive`: fetch-order FIFO that switches to a scan-resistant "stable set" when the misses
//! show the program looping over more memory than it has.
//!
//! What a user-level runtime can learn cheaply is the order of its misses. For each page we
//! keep the miss number of its last admission, so on a re-fetch we know the page's fetch
//! period (misses since its previous fetch), and we remember the period before that.
//!
//! - A program that loops over more data than fits (STREAM, stencils, the matrix in CG, the
//!   distance matrix in clustering, merge passes) re-fetches each page with the same period
//!   every time. Recency is then worthless (fifo and LRU miss on every page of the loop) and
//!   the best one can do (OPT) is keep a fixed subset resident and cycle the rest through a
//!   few frames.
//! - Any other pattern (random access, a moving working set) gives periods that vary.
//!
//! So each re-fetch votes: its period within 1/8 of the page's previous period, or of the
//! period of the re-fetch just before (of any page), is "regular".
//! A saturating score (-32..=32) of the votes picks the mode:
//!
//! - **fifo mode** (score <= 0): evict the page fetched longest ago.
//! - **loop mode** (score > 0): keep the newest `guard` fetches (the pages the program works
//!   on right now: a merge's streams, a stencil's planes) and evict the newest page older than
//!   them, so everything older stays: a stable set of `resident - guard` pages that hit on
//!   every pass. Every 16th victim in loop mode is the oldest page instead, so a stable set
//!   that went stale (a new phase) drains; in a steady loop that costs nothing, because the
//!   page that would have been evicted in its place is kept for the next pass.
//!
//! Selection is O(log n) on two B-tree maps keyed by admission number; per page it keeps
//! 12 bytes in arrays indexed by page, grown to the highest page admitted.

use crate::{Admission, PageIndex, Policy};
use std::collections::BTreeMap;

const SCORE_MAX: i32 = 32;
const REFRESH_EVERY: u64 = 16;

/// Adaptive fifo / stable-set replacement (module doc).
#[derive(Default)]
pub struct Adaptive {
    /// Admissions so far: the clock, counted in misses.
    seq: u64,
    /// The newest `guard` resident pages, by admission number.
    young: BTreeMap<u64, PageIndex>,
    /// The other resident pages, by admission number.
    body: BTreeMap<u64, PageIndex>,
    /// Per page: admission number of its last admission (0: never admitted).
    fetched_at: Vec<u64>,
    /// Per page: its previous fetch period in misses (0: unknown).
    period: Vec<u32>,
    /// The most recent fetch period seen, of any page.
    last_period: u32,
    score: i32,
    selections: u64,
}

impl Adaptive {
    pub fn new() -> Self {
        Self::default()
    }

    /// True while the policy keeps a stable set (the misses look like a loop).
    pub fn looping(&self) -> bool {
        self.score > 0
    }

    fn guard(&self) -> usize {
        ((self.young.len() + self.body.len()) / 32).max(2)
    }

    fn vote(&mut self, page: usize, now: u64) {
        if page >= self.fetched_at.len() {
            self.fetched_at.resize(page + 1, 0);
            self.period.resize(page + 1, 0);
        }
        let last = self.fetched_at[page];
        if last != 0 {
            let d = (now - last).min(u32::MAX as u64) as u32;
            // Regular: like the page's own previous period, or like the period of the re-fetch
            // just before (any page). The latter recognises a loop on its second pass, and
            // keeps recognising it while the mode switch changes every period at once.
            let own = self.period[page];
            let other = std::mem::replace(&mut self.last_period, d);
            let near = |p: u32| p != 0 && d.abs_diff(p) <= p / 8;
            if own != 0 || other != 0 {
                let regular = near(own) || near(other);
                self.score = if regular {
                    (self.score + 1).min(SCORE_MAX)
                } else {
                    (self.score - 1).max(-SCORE_MAX)
                };
            }
            self.period[page] = d;
        }
        self.fetched_at[page] = now;
    }

    fn rebalance(&mut self) {
        let guard = self.guard();
        while self.young.len() > guard {
            let (k, p) = self.young.pop_first().expect("non-empty");
            self.body.insert(k, p);
        }
    }
}

impl Policy for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn insert(&mut self, page: PageIndex, how: Admission) {
        if how == Admission::Declined {
            // Back where it was: same admission number, no vote.
            let k = self.fetched_at[page.0 as usize];
            self.body.insert(k, page);
            return;
        }
        self.seq += 1;
        self.vote(page.0 as usize, self.seq);
        self.young.insert(self.seq, page);
        self.rebalance();
    }

    fn remove(&mut self, page: PageIndex) {
        let Some(&k) = self.fetched_at.get(page.0 as usize) else {
            return;
        };
        if self.body.get(&k) == Some(&page) {
            self.body.remove(&k);
        } else if self.young.get(&k) == Some(&page) {
            self.young.remove(&k);
        }
    }

    fn select_victim(&mut self) -> Option<PageIndex> {
        self.selections += 1;
        let newest_old = self.looping() && self.selections % REFRESH_EVERY != 0;
        let picked = if newest_old {
            self.body.pop_last()
        } else {
            self.body.pop_first()
        };
        picked.or_else(|| self.young.pop_first()).map(|(_, p)| p)
    }

    fn len(&self) -> usize {
        self.young.len() + self.body.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(a: &mut Adaptive, p: u64) {
        a.insert(PageIndex(p), Admission::Fetched);
    }

    /// Worked by hand: pages 7, 3, 5, 1 fetched once each: fifo by fetch order, 7 then 3.
    #[test]
    fn fifo_by_fetch_order_by_default() {
        let mut a = Adaptive::new();
        for p in [7, 3, 5, 1] {
            admit(&mut a, p);
        }
        assert!(!a.looping());
        assert_eq!(a.select_victim(), Some(PageIndex(7)));
        assert_eq!(a.select_victim(), Some(PageIndex(3)));
    }

    /// Worked by hand: pages 0..4 come and go in a loop (each freed just before it is fetched
    /// again). Pass 1 admits (seq 1..4). Pass 2: page 0's period 4 has nothing to compare
    /// with; pages 1, 2, 3 match the period just seen (4): +3. Pass 3: each page's period
    /// matches its own: +4, score 7, loop mode. Resident now: 0, 1, 2, 3 at seq 9..12;
    /// the guard is 2 (2 and 3), so the victim is the newest older page, 1, where fifo mode
    /// would take 0. A page with a period that changed (0 after 7 misses, not 4) votes -1.
    #[test]
    fn a_loop_turns_on_the_stable_set() {
        let mut a = Adaptive::new();
        for pass in 0..3 {
            for p in 0..4 {
                if pass > 0 {
                    a.remove(PageIndex(p));
                }
                admit(&mut a, p);
            }
        }
        assert_eq!(a.score, 7);
        assert_eq!(a.select_victim(), Some(PageIndex(1)));
        for p in [9, 10, 11] {
            admit(&mut a, p);
        }
        a.remove(PageIndex(0));
        admit(&mut a, 0);
        assert_eq!(a.score, 6);
    }
}
