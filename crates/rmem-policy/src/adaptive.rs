//! `adaptive`: DLM's address-order fifo that switches to a scan-resistant "stable set" when
//! the misses show the program looping over more memory than it has.
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
//! A saturating score (-32..=32) of the votes picks the mode, with hysteresis (loop mode on at
//! +16, off at -16) so that a mixed pattern does not keep throwing its stable set away:
//!
//! - **fifo mode**: exactly `fifo`, address order from the previous victim. (Fetch-order FIFO
//!   was tried first and measured worse: on STREAM at 75% local 1.6x fifo's misses, on CG at
//!   10% 1.3x. The address-order sweep keeps pages for a time unrelated to when they came,
//!   which already resists scans a little.)
//! - **loop mode**: keep the newest `guard` fetches (the pages the program works on right
//!   now: a merge's streams, a stencil's planes: resident/32, at least 2, and two per stream
//!   of consecutive misses active within the last resident-count misses, at most half the
//!   resident pages; without the streams, Himeno's dozen arrays at 60 resident pages took
//!   1.6x fifo's swap-ins live, because the victim was the current page of another array)
//!   and evict the newest
//!   *long-period* page older than them (period of at least half the resident count, or
//!   unknown; the whole resident count was measured worse, 1.19x fifo on STREAM at 75%),
//!   so everything older stays: a stable set that hits on every pass. Pages with a short
//!   period (they came back before fifo would have evicted them: CG's vector) are left to
//!   the address-order sweep. Every 64th victim in loop mode is fifo's, so a stable set that
//!   went stale (a new phase) drains; in a steady loop that costs little, because the page
//!   that would have been evicted in its place is kept for the next pass.
//!
//! Below 32 resident pages loop mode stays off (fifo's victims): the guard would be under a
//! page, and a stencil's dozen arrays no longer fit beside a stable set (Himeno's real trace
//! with 22 pages: 4.4x fifo's misses without this floor).
//!
//! Known gap: a loop whose steps each fit in memory (STREAM's copy and scale at 75% local)
//! votes "loop" too, and the stable set then costs a few misses that fifo's sweep avoids (up
//! to 1.03x fifo in the simulator; docs/benchmarks.md), and the result there is sensitive to
//! the constants (every 16th victim fifo's: 1.19x). Telling the two apart needs references to
//! resident pages, which only sampling (dropping a page and timing its cheap re-fault) gives.
//!
//! Pages fetched ahead by the prefetcher (`Admission::Prefetched`) have not been used yet, and
//! no order of eviction is right for them but "after use": in loop mode the newest long-period
//! page would be exactly the one the prefetcher just brought for the next step, and fifo's
//! sweep takes them as they come in address order. Both were measured live on Himeno at 50%
//! local: with prefetching, 2.5x the bytes fetched without it (loop mode) and 1.8x (fifo).
//! So they wait apart, in `ahead`, out of both choices, until the program has passed them: a
//! stream of misses continued beyond them (`on_passed`: the prefetcher follows the streams,
//! across pages this policy holds), or a demand miss at most `reach` pages after them (the
//! prefetcher's windows are shorter than `reach`); or until a resident count of admissions
//! later (a stream that stopped).
//! Should they ever be half the resident pages, the oldest of them is the victim.
//!
//! Selection is O(log n) on B-tree maps keyed by admission number plus fifo's bitset; per
//! page it keeps 12 bytes in arrays indexed by page, grown to the highest page admitted.

use crate::per_page::PerPage;
use crate::{Admission, PageIndex, PageSet, Policy, PolicyParams};
use std::collections::{BTreeMap, BTreeSet};

const SCORE_MAX: i32 = 32;
const REFRESH_EVERY: u64 = 64;
/// Fewest resident pages for loop mode: with fewer, a guard of 1/32 is under one page and the
/// program's current pages (a stencil's dozen arrays) no longer fit beside a stable set.
/// Measured on Himeno's trace with 22 pages: 4.4x fifo's misses without this floor.
const LOOP_PAGES_MIN: usize = 32;

/// Adaptive fifo / stable-set replacement (module doc).
#[derive(Default)]
pub struct Adaptive {
    /// Admissions so far: the clock, counted in misses.
    seq: u64,
    /// The newest `guard` resident pages, by admission number.
    young: BTreeMap<u64, PageIndex>,
    /// The other resident pages with a long fetch period (at least half the resident count)
    /// or none known yet, by admission number: loop pages.
    long: BTreeMap<u64, PageIndex>,
    /// Every resident page, for fifo's address order.
    resident: PageSet,
    /// Just after the previous address-order victim.
    cursor: PageIndex,
    /// Per page: admission number of its last admission (0: never admitted).
    fetched_at: PerPage<u64>,
    /// Per page: its previous fetch period in misses (0: unknown).
    period: PerPage<u32>,
    /// The most recent fetch period seen, of any page.
    last_period: u32,
    score: i32,
    /// Loop mode: on at score +SCORE_MAX/2, off at -SCORE_MAX/2 (hysteresis, so that a
    /// mixed pattern does not flip modes and throw its stable set away each time).
    looping: bool,
    selections: u64,
    /// Sequential miss streams seen lately (loop mode's guard holds their current pages).
    streams: [Stream; STREAMS],
    /// Prefetched pages the program has not passed yet (their admission numbers are in
    /// `fetched_at`).
    ahead: BTreeSet<u64>,
    /// The same pages by admission number (for aging and the oldest).
    ahead_by_seq: BTreeMap<u64, PageIndex>,
    /// A demand miss marks the prefetched pages up to this many pages before it as used.
    reach: u64,
}

/// Miss streams followed to size the guard.
const STREAMS: usize = 32;

/// A run of misses on consecutive pages: a stencil's array, a merge's input, a copy's target.
#[derive(Default, Clone, Copy)]
struct Stream {
    /// Last page missed in it.
    last: u64,
    /// Admission number of that miss (0: empty slot).
    at: u64,
    /// Continued at least once (a single miss is not a stream).
    confirmed: bool,
}

impl Adaptive {
    pub fn new() -> Self {
        Self::with_reach(PolicyParams::default().prefetch_reach)
    }

    /// `reach`: how far (in pages) behind a demand miss a prefetched page counts as used; at
    /// least the prefetcher's largest window (`rmem run` gives twice it).
    pub fn with_reach(reach: u64) -> Self {
        Adaptive {
            reach: reach.max(1),
            ..Self::default()
        }
    }

    /// True while the policy keeps a stable set (the misses look like a loop).
    pub fn looping(&self) -> bool {
        self.looping
    }

    /// The newest admissions loop mode never evicts: the pages the program works on right
    /// now. At least resident/32 and 2, and two pages for each stream of consecutive misses
    /// active within the last resident-count admissions (a stencil walks a dozen arrays at
    /// once, and evicting the current page of one of them is a miss a few steps later), at
    /// most half the resident pages.
    fn guard(&self) -> usize {
        let horizon = self.seq.saturating_sub(self.len() as u64);
        let active = self
            .streams
            .iter()
            .filter(|t| t.confirmed && t.at > horizon)
            .count();
        (self.len() / 32)
            .max(2)
            .max(2 * active)
            .min((self.len() / 2).max(2))
    }

    /// Count a miss on `page` towards the streams.
    fn follow(&mut self, page: u64, now: u64) {
        if let Some(t) = self
            .streams
            .iter_mut()
            .find(|t| t.at != 0 && page > t.last && page <= t.last + 2)
        {
            *t = Stream {
                last: page,
                at: now,
                confirmed: true,
            };
            return;
        }
        let oldest = self
            .streams
            .iter_mut()
            .min_by_key(|t| t.at)
            .expect("non-empty");
        *oldest = Stream {
            last: page,
            at: now,
            confirmed: false,
        };
    }

    fn vote(&mut self, page: usize, now: u64) {
        let page = page as u64;
        let last = self.fetched_at.get(page);
        if last != 0 {
            let d = (now - last).min(u32::MAX as u64) as u32;
            // Regular: like the page's own previous period, or like the period of the re-fetch
            // just before (any page). The latter recognises a loop on its second pass, and
            // keeps recognising it while the mode switch changes every period at once.
            let own = self.period.get(page);
            let other = std::mem::replace(&mut self.last_period, d);
            let near = |p: u32| p != 0 && d.abs_diff(p) <= p / 8;
            if own != 0 || other != 0 {
                let regular = near(own) || near(other);
                self.score = if regular {
                    (self.score + 1).min(SCORE_MAX)
                } else {
                    (self.score - 1).max(-SCORE_MAX)
                };
                if self.score >= SCORE_MAX / 2 {
                    self.looping = true;
                } else if self.score <= -SCORE_MAX / 2 {
                    self.looping = false;
                }
            }
            self.period.set(page, d);
        }
        self.fetched_at.set(page, now);
    }

    /// A page leaving the guard: listed as a loop page if its period is long or unknown.
    /// Pages that came back sooner stay with fifo's sweep.
    fn file_body(&mut self, seq: u64, page: PageIndex) {
        let period = self.period.get(page.0) as usize;
        if period == 0 || 2 * period >= self.len() {
            self.long.insert(seq, page);
        }
    }

    fn rebalance(&mut self) {
        let guard = self.guard();
        while self.young.len() > guard {
            let (k, p) = self.young.pop_first().expect("non-empty");
            self.file_body(k, p);
        }
    }

    /// Forget `page` in the admission-order maps.
    fn unlist(&mut self, page: PageIndex) {
        let k = self.fetched_at.get(page.0);
        if self.long.get(&k) == Some(&page) {
            self.long.remove(&k);
        } else if self.young.get(&k) == Some(&page) {
            self.young.remove(&k);
        } else if self.ahead.remove(&page.0) {
            self.ahead_by_seq.remove(&k);
        }
    }

    /// A prefetched page joins the others by its admission number: it was used, or it
    /// waited too long.
    fn join(&mut self, page: PageIndex) {
        let seq = self.fetched_at.get(page.0);
        self.ahead.remove(&page.0);
        self.ahead_by_seq.remove(&seq);
        self.young.insert(seq, page);
    }

    /// The prefetched pages in `from..to` were used.
    fn passed(&mut self, from: u64, to: u64) {
        if from >= to {
            return;
        }
        while let Some(&q) = self.ahead.range(from..to).next() {
            self.join(PageIndex(q));
        }
    }

    /// A demand miss on `page`: the prefetched pages up to `reach` before it were used.
    fn missed(&mut self, page: PageIndex) {
        self.passed(page.0.saturating_sub(self.reach), page.0);
    }

    /// Prefetched pages a resident count of admissions old: their stream stopped.
    fn age(&mut self) {
        let horizon = self.seq.saturating_sub(self.len() as u64);
        while let Some((&k, &p)) = self.ahead_by_seq.first_key_value() {
            if k >= horizon {
                break;
            }
            self.join(p);
        }
    }

    /// The oldest prefetched page, forgotten: the victim when nothing else may go.
    fn oldest_ahead(&mut self) -> Option<PageIndex> {
        let (k, p) = self.ahead_by_seq.pop_first()?;
        debug_assert_eq!(self.fetched_at.get(p.0), k);
        self.ahead.remove(&p.0);
        self.resident.remove(p);
        Some(p)
    }

    /// fifo's address-order victim, passing over prefetched pages.
    fn sweep(&mut self) -> Option<PageIndex> {
        for _ in 0..=self.ahead.len() {
            let v = self.resident.next_cyclic(self.cursor)?;
            self.cursor = PageIndex(v.0 + 1);
            if self.ahead.contains(&v.0) {
                continue;
            }
            self.resident.remove(v);
            self.unlist(v);
            return Some(v);
        }
        self.oldest_ahead()
    }
}

impl Policy for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn insert(&mut self, page: PageIndex, how: Admission) {
        self.resident.insert(page);
        if how == Admission::Declined {
            // Back where it was: same admission number, no vote.
            let k = self.fetched_at.get(page.0);
            self.file_body(k, page);
            return;
        }
        self.seq += 1;
        self.vote(page.0 as usize, self.seq);
        self.follow(page.0, self.seq);
        if how == Admission::Prefetched {
            self.ahead.insert(page.0);
            self.ahead_by_seq.insert(self.seq, page);
        } else {
            self.young.insert(self.seq, page);
            self.missed(page);
        }
        self.age();
        self.rebalance();
    }

    fn on_miss(&mut self, page: PageIndex) {
        self.missed(page);
    }

    fn on_passed(&mut self, from: PageIndex, to: PageIndex) {
        self.passed(from.0, to.0);
        self.rebalance();
    }

    fn remove(&mut self, page: PageIndex) {
        if self.resident.remove(page) {
            self.unlist(page);
        }
    }

    fn select_victim(&mut self) -> Option<PageIndex> {
        self.selections += 1;
        if 2 * self.ahead.len() > self.len() {
            return self.oldest_ahead();
        }
        if self.looping
            && self.len() >= LOOP_PAGES_MIN
            && !self.selections.is_multiple_of(REFRESH_EVERY)
        {
            if let Some((_, p)) = self.long.pop_last() {
                self.resident.remove(p);
                return Some(p);
            }
        }
        self.sweep()
    }

    fn len(&self) -> usize {
        self.resident.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(a: &mut Adaptive, p: u64) {
        a.insert(PageIndex(p), Admission::Fetched);
    }

    #[test]
    fn the_guard_holds_two_pages_per_active_stream() {
        let mut a = Adaptive::new();
        // 12 arrays of 100 pages walked together, as a stencil does: 12 streams.
        for k in 0..20 {
            for arr in 0..12u64 {
                admit(&mut a, arr * 100 + k);
            }
        }
        assert_eq!(a.len(), 240);
        assert_eq!(a.guard(), 24);
        // Random admissions form no streams: once the streams age out, the guard is back
        // to resident/32.
        let mut x = 12345u64;
        for _ in 0..600 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            admit(&mut a, 10_000 + (x >> 40) % 1_000_000);
        }
        assert_eq!(a.guard(), a.len() / 32);
    }

    /// Worked by hand: pages 7, 3, 5, 1 fetched once each: fifo's address order, 1 then 3.
    #[test]
    fn fifo_until_a_loop_shows() {
        let mut a = Adaptive::new();
        for p in [7, 3, 5, 1] {
            admit(&mut a, p);
        }
        assert!(!a.looping());
        assert_eq!(a.select_victim(), Some(PageIndex(1)));
        assert_eq!(a.select_victim(), Some(PageIndex(3)));
    }

    /// Worked by hand: pages 0..40 come and go in a loop (each freed just before it is
    /// fetched again). Pass 1 admits (seq 1..40). Pass 2: page 0's period (40) has nothing to
    /// compare with; pages 1..39 match the period just seen: +39, loop mode from +16, capped
    /// at 32. Resident: 0..39 at seq 81..120; the guard is 2 (38 and 39), and the others
    /// have a long period (40, at least half the resident count), so the victim is the
    /// newest of them, 37, where fifo would take 0. Then 40..49 arrive (no votes) and 0
    /// comes back after 50 misses, not near 40 (its own period, and the last period seen):
    /// -1.
    #[test]
    fn a_loop_turns_on_the_stable_set() {
        let mut a = Adaptive::new();
        for pass in 0..3 {
            for p in 0..40 {
                if pass > 0 {
                    a.remove(PageIndex(p));
                }
                admit(&mut a, p);
            }
        }
        assert_eq!(a.score, SCORE_MAX);
        assert!(a.looping());
        assert_eq!(a.select_victim(), Some(PageIndex(37)));
        for p in 40..50 {
            admit(&mut a, p);
        }
        a.remove(PageIndex(0));
        admit(&mut a, 0);
        assert_eq!(a.score, SCORE_MAX - 1);
    }

    fn prefetch(a: &mut Adaptive, p: u64) {
        a.insert(PageIndex(p), Admission::Prefetched);
    }

    /// A loop of 0..100 in loop mode, then the program's stream at 200..: pages 208..216 come
    /// ahead of it. Neither loop mode (which takes the newest long-period page, and the
    /// prefetched ones are the newest) nor the fifo sweep takes them until the program passed
    /// them; then they are the newest used pages, loop mode's victims.
    #[test]
    fn prefetched_pages_wait_until_the_program_passed_them() {
        let mut a = Adaptive::with_reach(16);
        for pass in 0..3 {
            for p in 0..100 {
                if pass > 0 {
                    a.remove(PageIndex(p));
                }
                admit(&mut a, p);
            }
        }
        assert!(a.looping());
        for p in 200..208 {
            admit(&mut a, p);
        }
        for p in 208..216 {
            prefetch(&mut a, p);
        }
        let mut victims = Vec::new();
        for _ in 0..20 {
            let v = a.select_victim().unwrap();
            assert!(!(208..216).contains(&v.0), "took {v:?} before it was used");
            victims.push(v.0);
        }
        // Loop mode keeps the oldest (0..): its victims are the newest pages but the guard.
        assert!(victims.iter().all(|&v| v >= 50), "{victims:?}");
        // Fifo mode passes over them too.
        a.looping = false;
        a.score = -SCORE_MAX;
        for _ in 0..20 {
            let v = a.select_victim().unwrap();
            assert!(
                !(208..216).contains(&v.0),
                "fifo took {v:?} before it was used"
            );
        }
        // The program faults on 216: 208..215 were used, and may go.
        a.on_miss(PageIndex(216));
        admit(&mut a, 216);
        assert!(a.ahead.is_empty());
        let mut rest = Vec::new();
        while let Some(v) = a.select_victim() {
            rest.push(v.0);
        }
        assert!((208..216).all(|p| rest.contains(&p)));
    }

    /// A stream that crossed pages the policy holds (its stable set) faults again far beyond
    /// the pages prefetched before them: `on_passed` says it ran over them.
    #[test]
    fn a_stream_that_crossed_held_pages_used_its_prefetches() {
        let mut a = Adaptive::with_reach(4);
        for p in 0..40 {
            admit(&mut a, p);
        }
        for p in 100..104 {
            prefetch(&mut a, p);
        }
        // 104..140 are held; the next miss is at 140, far past `reach`.
        a.on_miss(PageIndex(140));
        assert_eq!(a.ahead.len(), 4);
        a.on_passed(PageIndex(99), PageIndex(140));
        assert!(a.ahead.is_empty());
    }

    /// Prefetched pages nothing used: they age into the others after a resident count of
    /// admissions, and while they are more than half the resident pages, the oldest goes.
    #[test]
    fn unused_prefetches_age_and_never_crowd_out_the_rest() {
        let mut a = Adaptive::with_reach(4);
        for p in 0..10 {
            admit(&mut a, p);
        }
        for p in 100..111 {
            prefetch(&mut a, p);
        }
        assert_eq!(a.ahead.len(), 11);
        // 11 of 21 ahead: the oldest of them is the victim.
        assert_eq!(a.select_victim(), Some(PageIndex(100)));
        assert_eq!(a.ahead.len(), 10);
        assert_eq!(a.select_victim(), Some(PageIndex(0)));
        // 19 resident, a victim for each admission: a prefetch 19 admissions old has aged.
        for p in 1000..1040 {
            admit(&mut a, p);
            let v = a.select_victim().unwrap();
            assert!(!(101..111).contains(&v.0) || a.ahead.is_empty());
        }
        assert!(a.ahead.is_empty(), "{:?}", a.ahead);
        assert_eq!(a.len(), 19);
    }

    /// Below 32 resident pages loop mode does not evict: fifo's choice.
    #[test]
    fn few_pages_stay_fifo() {
        let mut a = Adaptive::new();
        for pass in 0..3 {
            for p in 0..20 {
                if pass > 0 {
                    a.remove(PageIndex(p));
                }
                admit(&mut a, p);
            }
        }
        assert!(a.looping());
        assert_eq!(a.select_victim(), Some(PageIndex(0)));
    }
}
