//! One session's pages, stored compactly: no heap allocation per page.
//!
//! Pages live in slabs of [`SLAB_BYTES`] (one page each for pages that large), addressed by a
//! 32-bit slot number; freed slots go on a free list and are reused first, and a slab whose
//! last page is freed goes back to the allocator (its slots stay on the free list and bring
//! it back when reused). A key finds its slot through a radix index: a hash map from
//! `key / 64` to a leaf of 64 slot numbers. A client's keys are its region's page numbers,
//! allocated from the region's start, so they come in dense runs and a leaf serves 64 pages:
//! the bookkeeping is about 4.5 bytes per stored page ([`PageSlots::overhead_bytes`], the
//! figure docs/configuration.md states and a test checks). The worst case is one page per 64
//! keys: a leaf (and its map entry) per page, about 300 bytes.

use std::collections::HashMap;

/// Bytes of one slab (pages larger than this get a slab each).
pub const SLAB_BYTES: usize = 256 * 1024;
/// Keys per leaf of the index.
const LEAF_KEYS: u64 = 64;
/// What malloc keeps beside each allocation (glibc: 8 bytes of size, rounded to 16).
const MALLOC_HEADER_BYTES: usize = 16;

/// Slot numbers (plus one; 0 = no page) of 64 consecutive keys.
struct Leaf {
    used: u32,
    slots: [u32; LEAF_KEYS as usize],
}

/// Pages of one page size, by key.
pub struct PageSlots {
    page_size: usize,
    slab_slots: u32,
    slabs: Vec<Option<Box<[u8]>>>,
    /// Pages stored in each slab.
    slab_used: Vec<u32>,
    /// Slots freed, reused last-freed first.
    free: Vec<u32>,
    /// Slots at or above this were never handed out.
    next: u32,
    index: HashMap<u64, Box<Leaf>>,
    len: usize,
}

impl std::fmt::Debug for PageSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageSlots")
            .field("page_size", &self.page_size)
            .field("len", &self.len)
            .field("slabs", &self.slabs.iter().flatten().count())
            .finish()
    }
}

impl PageSlots {
    pub fn new(page_size: usize) -> PageSlots {
        assert!(page_size > 0);
        PageSlots {
            page_size,
            slab_slots: (SLAB_BYTES / page_size).max(1) as u32,
            slabs: Vec::new(),
            slab_used: Vec::new(),
            free: Vec::new(),
            next: 0,
            index: HashMap::new(),
            len: 0,
        }
    }

    /// Pages stored.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slot(&self, key: u64) -> Option<u32> {
        let leaf = self.index.get(&(key / LEAF_KEYS))?;
        leaf.slots[(key % LEAF_KEYS) as usize].checked_sub(1)
    }

    fn place(&self, slot: u32) -> (usize, usize) {
        let at = (slot % self.slab_slots) as usize * self.page_size;
        ((slot / self.slab_slots) as usize, at)
    }

    pub fn contains(&self, key: u64) -> bool {
        self.slot(key).is_some()
    }

    /// `key`'s page, if stored.
    pub fn get(&self, key: u64) -> Option<&[u8]> {
        let (slab, at) = self.place(self.slot(key)?);
        let slab = self.slabs[slab].as_ref().expect("a used slot's slab");
        Some(&slab[at..at + self.page_size])
    }

    /// Store `data` (one page) as `key`'s page; true if the key was new.
    pub fn put(&mut self, key: u64, data: &[u8]) -> bool {
        assert_eq!(data.len(), self.page_size);
        let (new, slot) = match self.slot(key) {
            Some(slot) => (false, slot),
            None => (true, self.take_slot()),
        };
        let (slab, at) = self.place(slot);
        let slab = self.slabs[slab].as_mut().expect("a used slot's slab");
        slab[at..at + self.page_size].copy_from_slice(data);
        if new {
            let leaf = self.index.entry(key / LEAF_KEYS).or_insert_with(|| {
                Box::new(Leaf {
                    used: 0,
                    slots: [0; LEAF_KEYS as usize],
                })
            });
            leaf.used += 1;
            leaf.slots[(key % LEAF_KEYS) as usize] = slot + 1;
            self.len += 1;
        }
        new
    }

    /// Forget `key`'s page; whether it was stored.
    pub fn remove(&mut self, key: u64) -> bool {
        let Some(leaf) = self.index.get_mut(&(key / LEAF_KEYS)) else {
            return false;
        };
        let Some(slot) = leaf.slots[(key % LEAF_KEYS) as usize].checked_sub(1) else {
            return false;
        };
        leaf.slots[(key % LEAF_KEYS) as usize] = 0;
        leaf.used -= 1;
        if leaf.used == 0 {
            self.index.remove(&(key / LEAF_KEYS));
        }
        self.len -= 1;
        if self.len == 0 {
            // Nothing left: start over, with no free list to keep.
            *self = PageSlots::new(self.page_size);
            return true;
        }
        let (slab, _) = self.place(slot);
        self.slab_used[slab] -= 1;
        if self.slab_used[slab] == 0 {
            self.slabs[slab] = None;
        }
        self.free.push(slot);
        true
    }

    fn take_slot(&mut self) -> u32 {
        let slot = self.free.pop().unwrap_or_else(|| {
            let s = self.next;
            self.next = s.checked_add(1).expect("at most 2^32 pages per session");
            s
        });
        let (slab, _) = self.place(slot);
        if slab == self.slabs.len() {
            self.slabs.push(None);
            self.slab_used.push(0);
        }
        let bytes = self.slab_slots as usize * self.page_size;
        // Zeroed by calloc: fresh mappings are not touched until a page is written.
        self.slabs[slab].get_or_insert_with(|| vec![0u8; bytes].into_boxed_slice());
        self.slab_used[slab] += 1;
        slot
    }

    /// Bytes this store holds beyond its pages' own: the index (map buckets, leaves, malloc's
    /// header of each), the slab table, the free list, and the unused slots of live slabs.
    pub fn overhead_bytes(&self) -> usize {
        // std's map (hashbrown): buckets a power of two at most 7/8 full, a control byte
        // each plus a group's worth (16).
        let cap = self.index.capacity();
        let buckets = if cap == 0 {
            0
        } else {
            (cap * 8 / 7).next_power_of_two()
        };
        let bucket = std::mem::size_of::<(u64, Box<Leaf>)>() + 1;
        let leaf = std::mem::size_of::<Leaf>() + MALLOC_HEADER_BYTES;
        let live_slabs = self.slabs.iter().flatten().count();
        buckets * bucket
            + if cap == 0 { 0 } else { 16 }
            + self.index.len() * leaf
            + self.slabs.capacity() * std::mem::size_of::<Option<Box<[u8]>>>()
            + self.slab_used.capacity() * 4
            + self.free.capacity() * 4
            + live_slabs * MALLOC_HEADER_BYTES
            + (live_slabs * self.slab_slots as usize - self.len) * self.page_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(ps: usize, key: u64) -> Vec<u8> {
        (0..ps).map(|i| (key as usize * 31 + i) as u8).collect()
    }

    #[test]
    fn pages_round_trip_and_freed_slabs_go_back() {
        let ps = 4096;
        let mut s = PageSlots::new(ps);
        let n = 1000u64;
        for k in 0..n {
            assert!(s.put(k * 3, &page(ps, k)));
        }
        assert!(!s.put(0, &page(ps, 7)));
        assert_eq!(s.get(0).unwrap(), &page(ps, 7)[..]);
        for k in 1..n {
            assert_eq!(s.get(k * 3).unwrap(), &page(ps, k)[..], "key {}", k * 3);
        }
        assert!(s.get(1).is_none() && !s.remove(1));
        // Free the first half: their slabs are released, the rest stay readable.
        for k in 0..n / 2 {
            assert!(s.remove(k * 3));
        }
        assert_eq!(s.len(), (n / 2) as usize);
        let live = s.slabs.iter().flatten().count();
        assert!(live <= (n / 2) as usize / 64 + 2, "{live} slabs live");
        for k in n / 2..n {
            assert_eq!(s.get(k * 3).unwrap(), &page(ps, k)[..]);
        }
        // Freed slots are reused before new ones.
        let next = s.next;
        for k in 0..n / 2 {
            s.put(1_000_000 + k, &page(ps, k));
        }
        assert_eq!(s.next, next);
        for k in 0..n / 2 {
            assert_eq!(s.get(1_000_000 + k).unwrap(), &page(ps, k)[..]);
        }
        for k in (n / 2..n)
            .map(|k| k * 3)
            .chain(1_000_000..1_000_000 + n / 2)
        {
            assert!(s.remove(k));
        }
        assert!(s.is_empty() && s.slabs.is_empty() && s.free.is_empty());
    }

    /// The figure docs/configuration.md states: at most 16 bytes per stored 4 KiB page beyond
    /// the page, for a client's dense keys.
    #[test]
    fn bookkeeping_is_at_most_16_bytes_per_4k_page() {
        let ps = 4096;
        let data = vec![1u8; ps];
        for n in [64u64 * 1024, 100_000, 250_000] {
            let mut s = PageSlots::new(ps);
            for k in 0..n {
                s.put(k, &data);
            }
            let per_page = s.overhead_bytes() as f64 / n as f64;
            assert!(per_page <= 16.0, "{n} pages: {per_page:.2} bytes each");
            eprintln!("{n} pages of 4 KiB: {per_page:.2} bytes of bookkeeping each");
        }
    }
}
