//! JumboMem's pseudo-NRU (Pakin and Johnson, section IV-A): recently fetched pages are kept in
//! preference to pages not recently fetched; modified pages get no extra preference.
//!
//! The pager cannot see whether a resident page was used since it came in, so there
//! "recently used" can only mean "recently fetched". Here that is one generation bit: pages
//! admitted since the last reset are *recent*, the others *old*. The block device sees every
//! use of a cached block ([`Policy::on_hit`]): a hit on an old page makes it recent again,
//! which is NRU's reference bit proper. Victims are old pages, in
//! address order from just after the previous victim (as fifo). When no old page is left,
//! every recent page becomes old at once (the reset that clears NRU's reference bits), which
//! costs O(1): the two sets are swapped.

use crate::{Admission, PageIndex, PageSet, Policy};

/// Pseudo-NRU with a fetched-recently bit.
#[derive(Default)]
pub struct Nru {
    recent: PageSet,
    old: PageSet,
    cursor: PageIndex,
}

impl Nru {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Policy for Nru {
    fn name(&self) -> &'static str {
        "nru"
    }

    fn insert(&mut self, page: PageIndex, how: Admission) {
        match how {
            // It was just taken from the old pages: it goes back where it was.
            Admission::Declined => self.old.insert(page),
            Admission::Fetched | Admission::ZeroFilled | Admission::Prefetched => {
                self.recent.insert(page)
            }
        };
    }

    fn on_hit(&mut self, page: PageIndex) {
        if self.old.remove(page) {
            self.recent.insert(page);
        }
    }

    fn remove(&mut self, page: PageIndex) {
        if !self.old.remove(page) {
            self.recent.remove(page);
        }
    }

    fn select_victim(&mut self) -> Option<PageIndex> {
        if self.old.is_empty() {
            std::mem::swap(&mut self.old, &mut self.recent);
        }
        let victim = self.old.next_cyclic(self.cursor)?;
        self.old.remove(victim);
        self.cursor = PageIndex(victim.0 + 1);
        Some(victim)
    }

    fn len(&self) -> usize {
        self.old.len() + self.recent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worked by hand: 1, 5, 6 come in; the first selection finds no old page, ages all
    /// three and takes 1 (cursor now 2). Then 3 is fetched: it is recent, so the victims are
    /// 5 and 6, where fifo would take 3 first; only then, after the next reset, 3.
    #[test]
    fn keeps_recently_fetched_pages() {
        let mut n = Nru::new();
        for p in [1, 5, 6] {
            n.insert(PageIndex(p), Admission::Fetched);
        }
        assert_eq!(n.select_victim(), Some(PageIndex(1)));
        n.insert(PageIndex(3), Admission::Fetched);
        assert_eq!(n.select_victim(), Some(PageIndex(5)));
        assert_eq!(n.select_victim(), Some(PageIndex(6)));
        assert_eq!(n.select_victim(), Some(PageIndex(3)));
        assert_eq!(n.select_victim(), None);
        assert_eq!(n.len(), 0);
    }

    /// A hit on an old page makes it recent: the next victims are the old pages not used.
    #[test]
    fn a_hit_keeps_a_page() {
        let mut n = Nru::new();
        for p in [1, 2, 3, 4] {
            n.insert(PageIndex(p), Admission::Fetched);
        }
        assert_eq!(n.select_victim(), Some(PageIndex(1)));
        n.on_hit(PageIndex(2));
        n.on_hit(PageIndex(9)); // not held: ignored
        assert_eq!(n.select_victim(), Some(PageIndex(3)));
        assert_eq!(n.select_victim(), Some(PageIndex(4)));
        assert_eq!(n.select_victim(), Some(PageIndex(2)));
        assert_eq!(n.len(), 0);
    }
}
