//! A growable two-level bitset of page indexes with a fast cyclic "next set bit" search.

use crate::PageIndex;

/// A set of pages. Memory grows with the highest page index inserted (one bit per page plus
/// one bit per 64 pages), never with the reserved address space.
#[derive(Default, Debug, Clone)]
pub struct PageSet {
    words: Vec<u64>,
    /// Bit i set iff words[i] != 0.
    summary: Vec<u64>,
    len: usize,
}

impl PageSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, page: PageIndex) -> bool {
        let w = (page.0 / 64) as usize;
        w < self.words.len() && self.words[w] & (1 << (page.0 % 64)) != 0
    }

    /// Insert; returns false if already present.
    pub fn insert(&mut self, page: PageIndex) -> bool {
        let w = (page.0 / 64) as usize;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
            self.summary.resize(w / 64 + 1, 0);
        }
        let bit = 1u64 << (page.0 % 64);
        if self.words[w] & bit != 0 {
            return false;
        }
        self.words[w] |= bit;
        self.summary[w / 64] |= 1 << (w % 64);
        self.len += 1;
        true
    }

    /// Remove; returns false if absent.
    pub fn remove(&mut self, page: PageIndex) -> bool {
        let w = (page.0 / 64) as usize;
        let bit = 1u64 << (page.0 % 64);
        if w >= self.words.len() || self.words[w] & bit == 0 {
            return false;
        }
        self.words[w] &= !bit;
        if self.words[w] == 0 {
            self.summary[w / 64] &= !(1 << (w % 64));
        }
        self.len -= 1;
        true
    }

    /// The first member at or after `from`, without wrapping.
    pub fn next_from(&self, from: PageIndex) -> Option<PageIndex> {
        let mut w = (from.0 / 64) as usize;
        if w >= self.words.len() {
            return None;
        }
        let masked = self.words[w] & (!0u64 << (from.0 % 64));
        if masked != 0 {
            return Some(PageIndex(w as u64 * 64 + masked.trailing_zeros() as u64));
        }
        // Find the next non-empty word through the summary.
        w += 1;
        let mut s = w / 64;
        if s >= self.summary.len() {
            return None;
        }
        let mut bits = if w.is_multiple_of(64) {
            self.summary[s]
        } else {
            self.summary[s] & (!0u64 << (w % 64))
        };
        loop {
            if bits != 0 {
                let word = s * 64 + bits.trailing_zeros() as usize;
                let v = self.words[word];
                debug_assert!(v != 0, "summary out of sync");
                return Some(PageIndex(word as u64 * 64 + v.trailing_zeros() as u64));
            }
            s += 1;
            if s >= self.summary.len() {
                return None;
            }
            bits = self.summary[s];
        }
    }

    /// The first member at or after `from`, wrapping around to the lowest member.
    pub fn next_cyclic(&self, from: PageIndex) -> Option<PageIndex> {
        if self.len == 0 {
            return None;
        }
        self.next_from(from)
            .or_else(|| self.next_from(PageIndex(0)))
    }

    /// Bytes of memory this set holds.
    pub fn heap_bytes(&self) -> usize {
        (self.words.capacity() + self.summary.capacity()) * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_matches_a_btreeset() {
        let mut s = PageSet::new();
        let mut model = std::collections::BTreeSet::new();
        let mut x: u64 = 99;
        for _ in 0..50_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            let p = (x >> 35) % 300_000;
            if (x >> 10).is_multiple_of(3) {
                assert_eq!(s.remove(PageIndex(p)), model.remove(&p));
            } else {
                assert_eq!(s.insert(PageIndex(p)), model.insert(p));
            }
            let q = (x >> 5) % 310_000;
            let want = model
                .range(q..)
                .next()
                .or_else(|| model.iter().next())
                .copied();
            assert_eq!(s.next_cyclic(PageIndex(q)).map(|p| p.0), want);
            assert_eq!(s.len(), model.len());
        }
    }
}
