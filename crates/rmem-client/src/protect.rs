//! The protection the program gave parts of the region with mprotect(2), where it is not
//! read-write: the pager needs it to evict a modified page there (`UFFDIO_MOVE` moves only
//! between writable mappings, so the page is made writable for the move and given its
//! protection back right after) and to give freed memory back read-write.

use std::collections::BTreeMap;

/// Read and write, the region's own protection (never stored).
pub const READ_WRITE: i32 = libc::PROT_READ | libc::PROT_WRITE;

/// Parts `(start, end, prot)` of a range that are not read-write, in address order.
pub type Protected = Vec<(u64, u64, i32)>;

/// Disjoint byte ranges `[start, end)` of the region and their protection, none read-write.
#[derive(Debug, Default)]
pub struct Protections {
    ranges: BTreeMap<u64, (u64, i32)>,
}

impl Protections {
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// `[start, end)` now has protection `prot`.
    pub fn set(&mut self, start: u64, end: u64, prot: i32) {
        for (s, e, p) in self.overlapping(start, end) {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, (start, p));
            }
            if e > end {
                self.ranges.insert(end, (e, p));
            }
        }
        if prot != READ_WRITE && start < end {
            self.ranges.insert(start, (end, prot));
        }
    }

    /// The stored ranges that overlap `[start, end)`, whole, in address order.
    pub fn overlapping(&self, start: u64, end: u64) -> Protected {
        let mut out = Vec::new();
        if let Some((&s, &(e, p))) = self.ranges.range(..start).next_back() {
            if e > start {
                out.push((s, e, p));
            }
        }
        out.extend(self.ranges.range(start..end).map(|(&s, &(e, p))| (s, e, p)));
        out
    }

    /// The parts of `[start, end)` that are not read-write, clipped to it.
    pub fn within(&self, start: u64, end: u64) -> Protected {
        self.overlapping(start, end)
            .into_iter()
            .map(|(s, e, p)| (s.max(start), e.min(end), p))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: i32 = libc::PROT_READ;
    const NONE: i32 = libc::PROT_NONE;

    #[test]
    fn ranges_split_merge_and_clear() {
        let mut p = Protections::default();
        p.set(100, 200, R);
        p.set(150, 160, NONE);
        assert_eq!(
            p.within(0, 1000),
            vec![(100, 150, R), (150, 160, NONE), (160, 200, R)]
        );
        assert_eq!(p.within(155, 170), vec![(155, 160, NONE), (160, 170, R)]);
        p.set(120, 180, READ_WRITE);
        assert_eq!(p.within(0, 1000), vec![(100, 120, R), (180, 200, R)]);
        assert!(p.within(120, 180).is_empty());
        p.set(0, 1000, READ_WRITE);
        assert!(p.is_empty());
    }
}
