//! Swap-in history (Midorikawa et al., "A page replacement algorithm using swap-in history",
//! section 3): DLM's address-order FIFO that will not evict the pages which came in right
//! after the previous swap-in of the page now missing, on the bet that they are needed again
//! soon, as they were last time.
//!
//! Data structures, as in the paper's Fig. 5:
//! - a cyclic array of swapped-in page numbers (`hist`), one entry per admission, sized to the
//!   number of pages in use;
//! - per page, the array index of its previous swap-in (`prev`).
//!
//! On a miss of page P, the `reflect = ratio x array size` entries that follow P's previous
//! swap-in are excluded as victims; victims are otherwise chosen as fifo does, in address
//! order from just after the previous victim. P is then registered at the array's write
//! position.
//!
//! Where this differs from the paper, and why:
//! - The paper sizes the array to all DLM pages, known at start. Here the array grows by one
//!   slot each time a page is admitted for the first time. Before the first wrap it simply
//!   grows at the end; after a wrap the new, empty slot is appended behind the oldest entries,
//!   so the history holds up to one extra stale entry per page added late. Programs that
//!   allocate up front (all the paper's) see exactly the paper's array.
//! - First-touch zero-fills are admissions too, and are recorded: for the reference pattern
//!   a first touch is a swap-in like any other (DLM fetched such pages from the server).
//! - The search is bounded (`scan_max` resident pages, 1024 by default). Paper Table 3 shows
//!   the unbounded search going around the whole page array when most resident pages are
//!   excluded (3.6 ms max against 0.01 ms mean). At the bound, or after a full wrap, the
//!   first candidate - the page fifo would have chosen - is the victim: the exclusion is a
//!   hint, and a miss on a hinted page costs one fetch while a stalled pager costs them all.

use crate::per_page::PerPage;
use crate::{Admission, PageIndex, PageSet, Policy};

const EMPTY: u64 = u64::MAX;
const NONE: u32 = u32::MAX;

/// Swap-in history replacement.
pub struct History {
    ratio: f64,
    scan_max: usize,
    resident: PageSet,
    cursor: PageIndex,
    /// Pages ever admitted: the array is sized to these.
    known: PageSet,
    /// The cyclic swap-in history (page numbers, `EMPTY` where nothing was written yet).
    hist: Vec<u64>,
    /// Where the next swap-in is written.
    pos: usize,
    /// Per page: index of its previous swap-in in `hist`, or `NONE`.
    prev: PerPage<u32>,
    /// Per page: the exclusion generation that excludes it; `excluded(p)` iff equal to `gen`.
    stamp: PerPage<u32>,
    gen: u32,
}

impl History {
    /// `ratio`: the reflecting history ratio (the paper's built-in value is 0.20).
    /// `scan_max`: most resident pages one victim search examines.
    pub fn new(ratio: f64, scan_max: usize) -> History {
        assert!(
            (0.0..=1.0).contains(&ratio),
            "history ratio {ratio} not in 0..=1"
        );
        History {
            ratio,
            scan_max: scan_max.max(1),
            resident: PageSet::new(),
            cursor: PageIndex(0),
            known: PageSet::new(),
            hist: Vec::new(),
            pos: 0,
            prev: PerPage::new(NONE),
            stamp: PerPage::new(0),
            gen: 1,
        }
    }

    fn excluded(&self, page: PageIndex) -> bool {
        self.stamp.get(page.0) == self.gen
    }

    /// Record a swap-in of `page` at the write position.
    fn register(&mut self, page: PageIndex) {
        if self.hist.len() < self.known.len() {
            // Before the first wrap this is where `pos` writes; after it, the new slot lies
            // behind the oldest entries (module doc).
            self.hist.push(EMPTY);
        }
        if self.pos >= self.hist.len() {
            self.pos = 0;
        }
        self.hist[self.pos] = page.0;
        self.prev.set(page.0, self.pos as u32);
        self.pos += 1;
    }

    /// Entries of the history excluded after one previous swap-in.
    pub fn reflect(&self) -> usize {
        (self.ratio * self.hist.len() as f64) as usize
    }
}

impl Policy for History {
    fn name(&self) -> &'static str {
        "history"
    }

    fn on_miss(&mut self, page: PageIndex) {
        self.gen = self.gen.wrapping_add(1);
        if self.gen == 0 {
            self.stamp.reset();
            self.gen = 1;
        }
        let i = self.prev.get(page.0);
        if i == NONE {
            return;
        }
        let n = self.hist.len();
        for k in 1..=self.reflect().min(n - 1) {
            let q = self.hist[(i as usize + k) % n];
            if q != EMPTY {
                self.stamp.set(q, self.gen);
            }
        }
    }

    fn insert(&mut self, page: PageIndex, how: Admission) {
        self.resident.insert(page);
        if how != Admission::Declined {
            self.known.insert(page);
            self.register(page);
        }
    }

    fn remove(&mut self, page: PageIndex) {
        self.resident.remove(page);
    }

    fn select_victim(&mut self) -> Option<PageIndex> {
        let first = self.resident.next_cyclic(self.cursor)?;
        let mut c = first;
        let mut victim = first;
        for _ in 0..self.scan_max {
            if !self.excluded(c) {
                victim = c;
                break;
            }
            c = self.resident.next_cyclic(PageIndex(c.0 + 1))?;
            if c == first {
                break; // Wrapped: every resident page is excluded.
            }
        }
        self.resident.remove(victim);
        self.cursor = PageIndex(victim.0 + 1);
        Some(victim)
    }

    fn len(&self) -> usize {
        self.resident.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fifo;

    fn admit(h: &mut History, pages: &[u64]) {
        for &p in pages {
            h.on_miss(PageIndex(p));
            h.insert(PageIndex(p), Admission::Fetched);
        }
    }

    /// The paper's Fig. 5 situation, worked by hand. Ten pages in use, ratio 0.3, so
    /// reflect = 3. Swap-ins 5,0,3,9,7,1,2,4,6,8 fill the array (indexes 0..9, page 5 at 0).
    /// Page 5 leaves; when it misses again, entries 1..=3 (pages 0, 3, 9) are excluded, so
    /// from cursor 0 the victims are 1 and 2 rather than fifo's 0 and 1. Page 5 is then
    /// written at index 0 (the array wrapped). Then page 1 misses: its previous swap-in is at
    /// index 5, so entries 6, 7, 8 (pages 2, 4, 6) are excluded; the cursor is at 3 and 3 is
    /// not excluded: victim 3. Then page 2 misses: index 6, excluding 4, 6, 8, so from
    /// cursor 4 the victim is 5 (4 excluded).
    #[test]
    fn excludes_the_pages_after_the_previous_swap_in() {
        let mut h = History::new(0.3, 1024);
        admit(&mut h, &[5, 0, 3, 9, 7, 1, 2, 4, 6, 8]);
        assert_eq!(h.reflect(), 3);
        h.remove(PageIndex(5));
        h.on_miss(PageIndex(5));
        assert_eq!(h.select_victim(), Some(PageIndex(1)));
        assert_eq!(h.select_victim(), Some(PageIndex(2)));
        h.insert(PageIndex(5), Admission::Fetched);
        assert_eq!(h.hist[0], 5);
        h.on_miss(PageIndex(1));
        assert_eq!(h.select_victim(), Some(PageIndex(3)));
        h.insert(PageIndex(1), Admission::Fetched);
        h.on_miss(PageIndex(2));
        assert_eq!(h.select_victim(), Some(PageIndex(5)));
    }

    /// When every resident page is excluded the search wraps once and takes fifo's choice.
    #[test]
    fn all_excluded_falls_back_to_fifo_choice() {
        let mut h = History::new(1.0, 1024);
        admit(&mut h, &[9, 1, 2, 3]);
        h.remove(PageIndex(9));
        h.on_miss(PageIndex(9)); // excludes 1, 2, 3: everything resident
        assert_eq!(h.select_victim(), Some(PageIndex(1)));
    }

    /// The search bound: with scan_max 2 and pages 1, 2, 3 excluded, 4 is not reached.
    #[test]
    fn search_is_bounded() {
        let mut h = History::new(0.6, 2);
        admit(&mut h, &[9, 1, 2, 3, 4]);
        h.remove(PageIndex(9));
        h.on_miss(PageIndex(9)); // reflect = 3: excludes 1, 2, 3
        assert_eq!(h.select_victim(), Some(PageIndex(1)));
        let mut h = History::new(0.6, 1024);
        admit(&mut h, &[9, 1, 2, 3, 4]);
        h.remove(PageIndex(9));
        h.on_miss(PageIndex(9));
        assert_eq!(h.select_victim(), Some(PageIndex(4)));
    }

    /// With ratio 0 nothing is excluded: exactly fifo.
    #[test]
    fn ratio_zero_is_fifo() {
        let mut h = History::new(0.0, 1024);
        let mut f = Fifo::new();
        let mut x: u64 = 7;
        let mut held = std::collections::BTreeSet::new();
        for _ in 0..5000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            let p = PageIndex((x >> 33) % 200);
            if held.len() < 50 {
                if held.insert(p) {
                    h.on_miss(p);
                    h.insert(p, Admission::Fetched);
                    f.insert(p, Admission::Fetched);
                }
            } else {
                let v = h.select_victim();
                assert_eq!(v, f.select_victim());
                held.remove(&v.unwrap());
            }
        }
    }
}
