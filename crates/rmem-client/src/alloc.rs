//! The region's allocator: hands out zeroed memory inside the region and gives pages back
//! to the servers on free.
//!
//! Large requests (at least a quarter page) get whole DLM pages, page-aligned, from a best-fit
//! free list over page runs that coalesces on free. Smaller ones come from power-of-two size
//! classes carved out of single pages; a class page is released once its last object is
//! freed. All metadata lives outside the region, so allocating never faults.

use crate::PageIndex;
use std::collections::{BTreeMap, BTreeSet, HashMap};

const CLASS_MIN: u64 = 16;

/// What a free released: pages the pager must drop (their contents no longer matter).
#[derive(Debug, PartialEq, Eq)]
pub struct Freed {
    pub first: PageIndex,
    pub count: u64,
}

#[derive(Clone, Debug)]
struct Slab {
    class: u32,
    slots: u32,
    used: u32,
    bits: Vec<u64>,
    hint: u32,
}

/// Allocation bookkeeping over `pages` DLM pages of `page_size` bytes.
#[derive(Clone, Debug)]
pub struct Allocator {
    page_size: u64,
    pages: u64,
    /// Pages below this index have been handed out at least once.
    top: u64,
    free_by_start: BTreeMap<u64, u64>,
    free_by_len: BTreeSet<(u64, u64)>,
    /// Large runs by first page (ordered, to find the run that holds an address).
    large: BTreeMap<u64, u64>,
    slabs: HashMap<u64, Slab>,
    /// Per class: pages with a free slot.
    partial: Vec<BTreeSet<u64>>,
    /// Pages in use (large runs plus slab pages).
    committed: u64,
    /// Most pages the store can hold.
    committed_max: u64,
    small_max: u64,
}

impl Allocator {
    pub fn new(page_size: u64, pages: u64, committed_max: u64) -> Allocator {
        let small_max = (page_size / 4).max(CLASS_MIN);
        let classes = (small_max / CLASS_MIN).trailing_zeros() as usize + 1;
        Allocator {
            page_size,
            pages,
            top: 0,
            free_by_start: BTreeMap::new(),
            free_by_len: BTreeSet::new(),
            large: BTreeMap::new(),
            slabs: HashMap::new(),
            partial: vec![BTreeSet::new(); classes],
            committed: 0,
            committed_max,
            small_max,
        }
    }

    /// Bytes of pages committed to allocations.
    pub fn committed_bytes(&self) -> u64 {
        self.committed * self.page_size
    }

    fn take_run(&mut self, n: u64) -> Option<u64> {
        if self.committed + n > self.committed_max {
            return None;
        }
        let start = if let Some(&(len, start)) = self.free_by_len.range((n, 0)..).next() {
            self.free_by_len.remove(&(len, start));
            self.free_by_start.remove(&start);
            if len > n {
                self.insert_free(start + n, len - n);
            }
            start
        } else {
            if self.top + n > self.pages {
                return None;
            }
            self.top += n;
            self.top - n
        };
        self.committed += n;
        Some(start)
    }

    fn insert_free(&mut self, start: u64, len: u64) {
        self.free_by_start.insert(start, len);
        self.free_by_len.insert((len, start));
    }

    fn give_back_run(&mut self, mut start: u64, mut len: u64) {
        self.committed -= len;
        if let Some((&ps, &pl)) = self.free_by_start.range(..start).next_back() {
            if ps + pl == start {
                self.free_by_start.remove(&ps);
                self.free_by_len.remove(&(pl, ps));
                start = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.free_by_start.get(&(start + len)) {
            self.free_by_start.remove(&(start + len));
            self.free_by_len.remove(&(nl, start + len));
            len += nl;
        }
        if start + len == self.top {
            self.top = start;
        } else {
            self.insert_free(start, len);
        }
    }

    /// Allocate `size` bytes; returns the byte offset in the region and whether the memory
    /// may hold old data (a reused small slot) and must be zeroed by the caller.
    pub fn alloc(&mut self, size: u64) -> Option<(u64, bool)> {
        let size = size.max(1);
        if size > self.small_max {
            let n = size.div_ceil(self.page_size);
            let start = self.take_run(n)?;
            self.large.insert(start, n);
            return Some((start * self.page_size, false));
        }
        let class_size = size.next_power_of_two().max(CLASS_MIN);
        let class = (class_size / CLASS_MIN).trailing_zeros() as usize;
        let page = match self.partial[class].iter().next() {
            Some(&p) => p,
            None => {
                let p = self.take_run(1)?;
                let slots = (self.page_size / class_size) as u32;
                let words = (slots as usize).div_ceil(64);
                self.slabs.insert(
                    p,
                    Slab {
                        class: class as u32,
                        slots,
                        used: 0,
                        bits: vec![0; words],
                        hint: 0,
                    },
                );
                self.partial[class].insert(p);
                p
            }
        };
        let slab = self.slabs.get_mut(&page).expect("partial slab exists");
        let words = slab.bits.len();
        let mut w = slab.hint as usize;
        let slot = loop {
            let free = !slab.bits[w];
            if free != 0 {
                let s = (w * 64) as u32 + free.trailing_zeros();
                if s < slab.slots {
                    break s;
                }
            }
            w = (w + 1) % words;
            assert!(
                w != slab.hint as usize || slab.used < slab.slots,
                "partial slab has no free slot"
            );
        };
        slab.bits[(slot / 64) as usize] |= 1 << (slot % 64);
        slab.used += 1;
        slab.hint = slot / 64;
        if slab.used == slab.slots {
            self.partial[class].remove(&page);
        }
        Some((page * self.page_size + slot as u64 * class_size, true))
    }

    /// Allocate `size` bytes as whole pages whose first page index `start` satisfies
    /// `(phase + start) % align_pages == 0`: an alignment of more than one page, where `phase`
    /// is the region base's page number modulo `align_pages`. A run `align_pages - 1` pages
    /// longer is taken and its unaligned head and tail given back at once, so this can fail
    /// near capacity where a plain allocation would still fit. Returns the byte offset; the
    /// memory was never handed out before or was released on its free, so it reads as zero.
    pub fn alloc_aligned(&mut self, size: u64, align_pages: u64, phase: u64) -> Option<u64> {
        assert!(align_pages.is_power_of_two() && phase < align_pages);
        let n = size.max(1).div_ceil(self.page_size);
        let start = self.take_run(n + align_pages - 1)?;
        let aligned = (start + phase).next_multiple_of(align_pages) - phase;
        let tail = start + n + align_pages - 1 - (aligned + n);
        if tail > 0 {
            self.give_back_run(aligned + n, tail);
        }
        if aligned > start {
            self.give_back_run(start, aligned - start);
        }
        self.large.insert(aligned, n);
        Some(aligned * self.page_size)
    }

    /// Free the allocation at byte offset `off`. Returns the pages to release, or an error if
    /// `off` is not a live allocation.
    pub fn free(&mut self, off: u64) -> Result<Option<Freed>, &'static str> {
        let page = off / self.page_size;
        if off.is_multiple_of(self.page_size) {
            if let Some(n) = self.large.remove(&page) {
                self.give_back_run(page, n);
                return Ok(Some(Freed {
                    first: PageIndex(page),
                    count: n,
                }));
            }
        }
        let slab = self.slabs.get_mut(&page).ok_or("not an rmem allocation")?;
        let class_size = CLASS_MIN << slab.class;
        let in_page = off % self.page_size;
        if !in_page.is_multiple_of(class_size) {
            return Err("pointer is inside an allocation, not at its start");
        }
        let slot = (in_page / class_size) as u32;
        let bit = 1u64 << (slot % 64);
        if slab.bits[(slot / 64) as usize] & bit == 0 {
            return Err("double free");
        }
        slab.bits[(slot / 64) as usize] &= !bit;
        let was_full = slab.used == slab.slots;
        slab.used -= 1;
        let class = slab.class as usize;
        if slab.used == 0 {
            self.slabs.remove(&page);
            self.partial[class].remove(&page);
            self.give_back_run(page, 1);
            return Ok(Some(Freed {
                first: PageIndex(page),
                count: 1,
            }));
        }
        if was_full {
            self.partial[class].insert(page);
        }
        Ok(None)
    }

    /// The large allocation that holds byte offset `off`: its offset and length in bytes.
    pub fn block_of(&self, off: u64) -> Option<(u64, u64)> {
        let page = off / self.page_size;
        let (&start, &n) = self.large.range(..=page).next_back()?;
        (page < start + n).then(|| (start * self.page_size, n * self.page_size))
    }

    /// Keep the first `keep` bytes (rounded up to whole pages, at least one) of the large
    /// allocation at byte offset `off` and give back the rest, as munmap(2) or mremap(2) of
    /// its tail do. Returns the pages to release: None when nothing is given back or `off`
    /// is not a large allocation.
    pub fn shrink(&mut self, off: u64, keep: u64) -> Option<Freed> {
        if !off.is_multiple_of(self.page_size) {
            return None;
        }
        let page = off / self.page_size;
        let n = *self.large.get(&page)?;
        let kept = keep.div_ceil(self.page_size).max(1);
        if kept >= n {
            return None;
        }
        self.large.insert(page, kept);
        self.give_back_run(page + kept, n - kept);
        Some(Freed {
            first: PageIndex(page + kept),
            count: n - kept,
        })
    }

    /// Every run of pages in use (large allocations and pages of small objects), as
    /// (first page, pages).
    pub fn runs(&self) -> Vec<(PageIndex, u64)> {
        let mut runs: Vec<(PageIndex, u64)> = self
            .large
            .iter()
            .map(|(&s, &n)| (PageIndex(s), n))
            .collect();
        runs.extend(self.slabs.keys().map(|&p| (PageIndex(p), 1)));
        runs
    }

    /// Usable bytes of the allocation at `off`, if it is one.
    pub fn usable_size(&self, off: u64) -> Option<u64> {
        let page = off / self.page_size;
        if off.is_multiple_of(self.page_size) {
            if let Some(&n) = self.large.get(&page) {
                return Some(n * self.page_size);
            }
        }
        self.slabs.get(&page).map(|s| CLASS_MIN << s.class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_runs_coalesce_and_are_reused() {
        let mut a = Allocator::new(4096, 1000, 1000);
        let (x, _) = a.alloc(3 * 4096).unwrap();
        let (y, _) = a.alloc(4096 * 2).unwrap();
        assert_eq!(x, 0);
        assert_eq!(y, 3 * 4096);
        assert_eq!(
            a.free(x).unwrap(),
            Some(Freed {
                first: PageIndex(0),
                count: 3
            })
        );
        let (z, _) = a.alloc(2 * 4096).unwrap();
        assert_eq!(z, 0, "best fit reuses the freed run");
        a.free(y).unwrap();
        a.free(z).unwrap();
        assert_eq!(a.committed_bytes(), 0);
        assert_eq!(a.top, 0, "everything coalesced back to the top");
    }

    #[test]
    fn a_tail_given_back_is_reused_and_the_head_stays() {
        let mut a = Allocator::new(4096, 1000, 1000);
        let (x, _) = a.alloc(8 * 4096).unwrap();
        assert_eq!(a.block_of(x + 5 * 4096 + 7), Some((x, 8 * 4096)));
        assert_eq!(a.block_of(x + 8 * 4096), None);
        assert_eq!(
            a.shrink(x, 3 * 4096 - 100),
            Some(Freed {
                first: PageIndex(3),
                count: 5
            })
        );
        assert_eq!(a.usable_size(x), Some(3 * 4096));
        assert_eq!(a.committed_bytes(), 3 * 4096);
        assert_eq!(a.shrink(x, 3 * 4096), None, "nothing more to give back");
        let (y, _) = a.alloc(5 * 4096).unwrap();
        assert_eq!(y, 3 * 4096, "the tail is reused");
        a.free(x).unwrap();
        a.free(y).unwrap();
        assert_eq!(a.committed_bytes(), 0);
    }

    #[test]
    fn capacity_is_enforced() {
        let mut a = Allocator::new(4096, 1 << 20, 10);
        assert!(a.alloc(11 * 4096).is_none());
        assert!(a.alloc(10 * 4096).is_some());
        assert!(a.alloc(1).is_none());
    }

    #[test]
    fn small_objects_share_pages_and_release_them() {
        let mut a = Allocator::new(4096, 100, 100);
        let offs: Vec<u64> = (0..256).map(|_| a.alloc(16).unwrap().0).collect();
        assert_eq!(
            a.committed_bytes(),
            4096,
            "256 x 16 B fill exactly one page"
        );
        let more = a.alloc(16).unwrap().0;
        assert_eq!(a.committed_bytes(), 8192);
        assert_eq!(
            a.free(offs[1] + 1),
            Err("pointer is inside an allocation, not at its start")
        );
        for &o in &offs {
            assert_eq!(a.free(o).unwrap().is_some(), o == *offs.last().unwrap());
        }
        assert_eq!(a.free(offs[0]), Err("not an rmem allocation"));
        assert_eq!(
            a.free(more).unwrap(),
            Some(Freed {
                first: PageIndex(1),
                count: 1
            })
        );
        assert_eq!(a.committed_bytes(), 0);
    }

    #[test]
    fn aligned_runs_are_aligned_and_free_like_others() {
        let mut a = Allocator::new(4096, 1000, 1000);
        let (x, _) = a.alloc(4096).unwrap();
        assert_eq!(x, 0);
        // Region base at page 3 modulo 8: offset 5 pages is the first 8-page-aligned address.
        let y = a.alloc_aligned(2 * 4096, 8, 3).unwrap();
        assert_eq!(y, 5 * 4096);
        assert_eq!(
            a.committed_bytes(),
            3 * 4096,
            "head and tail were given back"
        );
        assert_eq!(a.usable_size(y), Some(2 * 4096));
        let (z, _) = a.alloc(4 * 4096).unwrap();
        assert_eq!(z, 4096, "the head is reused");
        assert_eq!(
            a.free(y).unwrap(),
            Some(Freed {
                first: PageIndex(5),
                count: 2
            })
        );
        a.free(z).unwrap();
        a.free(x).unwrap();
        assert_eq!(a.committed_bytes(), 0);
        assert_eq!(a.top, 0);
    }

    #[test]
    fn double_free_is_detected() {
        let mut a = Allocator::new(4096, 100, 100);
        let x = a.alloc(100).unwrap().0;
        let _y = a.alloc(100).unwrap().0;
        a.free(x).unwrap();
        assert_eq!(a.free(x), Err("double free"));
    }
}
