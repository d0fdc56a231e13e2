//! Page storage, compactly: no heap allocation per page.
//!
//! [`Arena`]: pages live in slabs of [`SLAB_BYTES`] (one page each for pages that large),
//! addressed by a 32-bit slot number with a reference count: a page shared copy-on-write by a
//! session and its snapshots (session.rs) is stored once. Freed slots go on a free list and
//! are reused first, and a slab whose last page is freed goes back to the node (its slots
//! stay on the free list and bring it back when reused). A slab is an anonymous mapping of its
//! own, populated when it is made: one system call puts all its pages in place, where touching
//! them one by one would take a page fault each (a fault is dear in a VM: pages pulled onto a
//! server arrived 1.25-1.55x faster, docs/benchmarks.md "Slabs populated when mapped"), and
//! unmapped when its last page goes, so memory a server lent and got back is the node's again.
//! A slab the node cannot map fails the store (an error, not an abort). On a disk-backed
//! server (`--store file:PATH`) an arena's slots name slots of the server's [`DiskStore`]
//! instead of slabs: the same reference counts, free list and indexes, only the bytes live
//! elsewhere.
//!
//! [`Index`]: one session's keys, each naming a slot of the arena, or a tombstone (the page was
//! freed in this session while a session it reads through still has it). A radix index: a
//! hash map from `key / 64` to a leaf of 64 entries. A client's keys are its region's page
//! numbers, allocated from the region's start, so they come in dense runs and a leaf serves 64
//! pages: the bookkeeping of a session's pages, arena and index together, is about 8.5 bytes
//! per stored page ([`Arena::overhead_bytes`] + [`Index::overhead_bytes`], the figure
//! docs/configuration.md states and a test checks). The worst case is one page per 64 keys: a
//! leaf (and its map entry) per page, about 300 bytes.

use crate::disk::{DiskStore, SlotAt, SlotOwner};
use memmap2::{MmapMut, MmapOptions};
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

/// Bytes of one slab (pages larger than this get a slab each).
pub const SLAB_BYTES: usize = 256 * 1024;
/// Keys per leaf of the index.
const LEAF_KEYS: u64 = 64;
/// What malloc keeps beside each allocation (glibc: 8 bytes of size, rounded to 16).
const MALLOC_HEADER_BYTES: usize = 16;
/// A leaf entry that is a tombstone (entries are otherwise 0 for none, or slot + 1).
const GONE: u32 = u32::MAX;

/// What a key names in one session's [`Index`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// The page is in this arena slot.
    Slot(u32),
    /// Freed here: the session has no such page, whatever a session it reads through has.
    Gone,
}

/// Where an arena's pages are.
enum Backing {
    /// In slabs of RAM.
    Ram {
        slabs: Vec<Option<MmapMut>>,
        /// Pages stored in each slab.
        slab_used: Vec<u32>,
    },
    /// In a file: each arena slot's place in it (meaningful while the slot is in use).
    Disk {
        store: Arc<DiskStore>,
        at: Vec<SlotAt>,
    },
}

/// Page slots of one page size, reference-counted.
pub struct Arena {
    page_size: usize,
    slab_slots: u32,
    backing: Backing,
    /// Slots freed, reused last-freed first.
    free: Vec<u32>,
    /// Slots at or above this were never handed out.
    next: u32,
    /// References to each slot handed out (0: free).
    refs: Vec<u32>,
    /// Slots in use.
    len: usize,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("page_size", &self.page_size)
            .field("len", &self.len)
            .field("on_disk", &matches!(self.backing, Backing::Disk { .. }))
            .finish()
    }
}

impl Arena {
    /// An arena in RAM.
    pub fn new(page_size: usize) -> Arena {
        Arena::with(
            page_size,
            Backing::Ram {
                slabs: Vec::new(),
                slab_used: Vec::new(),
            },
        )
    }

    /// An arena whose pages are in `store`.
    pub fn on_disk(page_size: usize, store: Arc<DiskStore>) -> Arena {
        Arena::with(
            page_size,
            Backing::Disk {
                store,
                at: Vec::new(),
            },
        )
    }

    fn with(page_size: usize, backing: Backing) -> Arena {
        assert!(page_size > 0);
        Arena {
            page_size,
            slab_slots: (SLAB_BYTES / page_size).max(1) as u32,
            backing,
            free: Vec::new(),
            next: 0,
            refs: Vec::new(),
            len: 0,
        }
    }

    /// An empty arena like this one (same page size, same backing).
    fn emptied(&self) -> Arena {
        match &self.backing {
            Backing::Ram { .. } => Arena::new(self.page_size),
            Backing::Disk { store, .. } => Arena::on_disk(self.page_size, store.clone()),
        }
    }

    /// Free every slot at once (the last session of a family ended).
    pub fn clear(&mut self) {
        if let Backing::Disk { store, at } = &self.backing {
            for (slot, &r) in self.refs.iter().enumerate() {
                if r > 0 {
                    store.free(at[slot], self.page_size as u32);
                }
            }
        }
        *self = self.emptied();
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Slots in use (pages stored, each once however many sessions share it).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn place(&self, slot: u32) -> (usize, usize) {
        let at = (slot % self.slab_slots) as usize * self.page_size;
        ((slot / self.slab_slots) as usize, at)
    }

    /// Append the page in `slot` (which must be in use) to `out`; on an error (a disk-backed
    /// arena's read failed or its checksum did not hold) `out` is as it was.
    pub fn read(&self, slot: u32, out: &mut Vec<u8>) -> io::Result<()> {
        debug_assert!(self.refs[slot as usize] > 0);
        match &self.backing {
            Backing::Ram { slabs, .. } => {
                let (slab, at) = self.place(slot);
                let slab = slabs[slab].as_ref().expect("a used slot's slab");
                rmem_copy::extend(out, &slab[at..at + self.page_size]);
                Ok(())
            }
            Backing::Disk { store, at } => {
                store.read(at[slot as usize], self.page_size as u32, out)
            }
        }
    }

    /// Append `len` bytes at `offset` of `slot`'s page to `out` (within the page): only those
    /// bytes are copied from RAM; a disk-backed page is read whole, then cut to the range.
    pub fn read_range(
        &self,
        slot: u32,
        offset: usize,
        len: usize,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        assert!(offset + len <= self.page_size, "range within the page");
        match &self.backing {
            Backing::Ram { slabs, .. } => {
                let (slab, at) = self.place(slot);
                let slab = slabs[slab].as_ref().expect("a used slot's slab");
                rmem_copy::extend(out, &slab[at + offset..at + offset + len]);
                Ok(())
            }
            Backing::Disk { .. } => {
                let start = out.len();
                self.read(slot, out)?;
                out.copy_within(start + offset..start + offset + len, start);
                out.truncate(start + len);
                Ok(())
            }
        }
    }

    /// References to `slot`.
    pub fn refs(&self, slot: u32) -> u32 {
        self.refs[slot as usize]
    }

    /// Store `data` (one page) of `owner` in a new slot, with one reference. On an error
    /// (disk full, an I/O error) nothing is stored.
    pub fn alloc(&mut self, data: &[u8], owner: SlotOwner) -> io::Result<u32> {
        assert_eq!(data.len(), self.page_size);
        let on_disk = match &self.backing {
            Backing::Disk { store, .. } => Some(store.write_new(owner, data)?),
            Backing::Ram { .. } => None,
        };
        let slot = self.take_slot()?;
        match (&mut self.backing, on_disk) {
            (Backing::Disk { at, .. }, Some(place)) => at[slot as usize] = place,
            _ => self.write_ram(slot, data),
        }
        Ok(slot)
    }

    /// Overwrite the page of `slot`, which only one reference may name. On an error the slot
    /// holds no valid page any more: the caller must release it.
    pub fn write(&mut self, slot: u32, data: &[u8], owner: SlotOwner) -> io::Result<()> {
        assert_eq!(data.len(), self.page_size);
        assert_eq!(self.refs[slot as usize], 1, "write to a shared slot {slot}");
        match &mut self.backing {
            Backing::Ram { .. } => self.write_ram(slot, data),
            Backing::Disk { store, at } => {
                at[slot as usize] = store.overwrite(at[slot as usize], owner, data)?;
            }
        }
        Ok(())
    }

    fn write_ram(&mut self, slot: u32, data: &[u8]) {
        let (slab, at) = self.place(slot);
        let Backing::Ram { slabs, .. } = &mut self.backing else {
            unreachable!("a RAM arena");
        };
        let slab = slabs[slab].as_mut().expect("a used slot's slab");
        rmem_copy::copy(&mut slab[at..at + self.page_size], data);
    }

    /// A slot with one reference for the page a reopened store found at `place`.
    pub fn adopt(&mut self, place: SlotAt) -> u32 {
        let slot = self.take_slot().expect("a disk-backed arena maps no slab");
        let Backing::Disk { at, .. } = &mut self.backing else {
            panic!("adopt into a RAM arena");
        };
        at[slot as usize] = place;
        slot
    }

    /// Overwrite `data.len()` bytes at `offset` of the page of `slot`, which only one
    /// reference may name (a byte-range write): in place in RAM, read, patched and written
    /// as a whole on disk (a slot's checksum covers the page). On an error the slot holds no
    /// valid page any more: the caller must release it.
    pub fn write_at(
        &mut self,
        slot: u32,
        offset: usize,
        data: &[u8],
        owner: SlotOwner,
    ) -> io::Result<()> {
        assert!(
            offset + data.len() <= self.page_size,
            "range within the page"
        );
        assert_eq!(self.refs[slot as usize], 1, "write to a shared slot {slot}");
        match &self.backing {
            Backing::Ram { .. } => {
                let (slab, at) = self.place(slot);
                let Backing::Ram { slabs, .. } = &mut self.backing else {
                    unreachable!("a RAM arena");
                };
                let slab = slabs[slab].as_mut().expect("a used slot's slab");
                rmem_copy::copy(&mut slab[at + offset..at + offset + data.len()], data);
                Ok(())
            }
            Backing::Disk { .. } => {
                let mut page = Vec::with_capacity(self.page_size);
                self.read(slot, &mut page)?;
                rmem_copy::copy(&mut page[offset..offset + data.len()], data);
                self.write(slot, &page, owner)
            }
        }
    }

    /// One more reference to `slot` (a snapshot shares the page).
    pub fn share(&mut self, slot: u32) {
        let r = &mut self.refs[slot as usize];
        assert!(*r > 0, "share of free slot {slot}");
        *r = r.checked_add(1).expect("at most 2^32 references to a page");
    }

    /// Drop one reference to `slot`; true if that was the last and the slot is free again.
    pub fn release(&mut self, slot: u32) -> bool {
        let r = &mut self.refs[slot as usize];
        assert!(*r > 0, "slot {slot} released twice");
        *r -= 1;
        if *r > 0 {
            return false;
        }
        self.len -= 1;
        if let Backing::Disk { store, at } = &self.backing {
            store.free(at[slot as usize], self.page_size as u32);
        }
        if self.len == 0 {
            // Nothing left: start over, with no free list to keep.
            *self = self.emptied();
            return true;
        }
        let (slab, _) = self.place(slot);
        if let Backing::Ram { slabs, slab_used } = &mut self.backing {
            slab_used[slab] -= 1;
            if slab_used[slab] == 0 {
                slabs[slab] = None;
            }
        }
        self.free.push(slot);
        true
    }

    /// A free slot, with one reference; its slab mapped if it was not. An error (the node
    /// has no memory to map a slab) takes no slot.
    fn take_slot(&mut self) -> io::Result<u32> {
        let slot = match self.free.last() {
            Some(&s) => s,
            None => self.next,
        };
        let (slab, _) = self.place(slot);
        let bytes = self.slab_slots as usize * self.page_size;
        match &mut self.backing {
            Backing::Ram { slabs, slab_used } => {
                if slab == slabs.len() {
                    slabs.push(None);
                    slab_used.push(0);
                }
                if slabs[slab].is_none() {
                    slabs[slab] = Some(MmapOptions::new().len(bytes).populate().map_anon()?);
                }
                slab_used[slab] += 1;
            }
            Backing::Disk { at, .. } => {
                if slot as usize == at.len() {
                    at.push(SlotAt(0));
                }
            }
        }
        if self.free.pop().is_none() {
            self.next = slot.checked_add(1).expect("at most 2^32 pages per arena");
            self.refs.push(0);
        }
        self.refs[slot as usize] = 1;
        self.len += 1;
        Ok(slot)
    }

    /// Bytes this arena holds beyond its pages' own: the slab table, the reference counts, the
    /// free list, and the unused slots of live slabs.
    /// On disk: the table of places instead of the slabs.
    pub fn overhead_bytes(&self) -> usize {
        let common = self.refs.capacity() * 4 + self.free.capacity() * 4;
        match &self.backing {
            Backing::Ram { slabs, slab_used } => {
                let live_slabs = slabs.iter().flatten().count();
                common
                    + slabs.capacity() * std::mem::size_of::<Option<MmapMut>>()
                    + slab_used.capacity() * 4
                    + (live_slabs * self.slab_slots as usize - self.len) * self.page_size
            }
            Backing::Disk { at, .. } => common + at.capacity() * 8,
        }
    }
}

/// Entries of 64 consecutive keys: 0 = none, [`GONE`], or slot + 1.
struct Leaf {
    used: u32,
    entries: [u32; LEAF_KEYS as usize],
}

/// One session's keys.
#[derive(Default)]
pub struct Index {
    leaves: HashMap<u64, Box<Leaf>>,
    /// Entries that are slots.
    slots: usize,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("slots", &self.slots)
            .field("leaves", &self.leaves.len())
            .finish()
    }
}

fn decode(v: u32) -> Option<Entry> {
    match v {
        0 => None,
        GONE => Some(Entry::Gone),
        s => Some(Entry::Slot(s - 1)),
    }
}

impl Index {
    pub fn new() -> Index {
        Index::default()
    }

    /// Keys that name a slot (pages this session holds itself).
    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn get(&self, key: u64) -> Option<Entry> {
        let leaf = self.leaves.get(&(key / LEAF_KEYS))?;
        decode(leaf.entries[(key % LEAF_KEYS) as usize])
    }

    /// Name `entry` under `key`; the entry it replaces.
    pub fn set(&mut self, key: u64, entry: Entry) -> Option<Entry> {
        let leaf = self.leaves.entry(key / LEAF_KEYS).or_insert_with(|| {
            Box::new(Leaf {
                used: 0,
                entries: [0; LEAF_KEYS as usize],
            })
        });
        let e = &mut leaf.entries[(key % LEAF_KEYS) as usize];
        let old = decode(*e);
        *e = match entry {
            Entry::Gone => GONE,
            Entry::Slot(s) => {
                assert!(s < GONE - 1, "slot {s} out of range");
                s + 1
            }
        };
        if old.is_none() {
            leaf.used += 1;
        }
        self.slots += usize::from(matches!(entry, Entry::Slot(_)));
        self.slots -= usize::from(matches!(old, Some(Entry::Slot(_))));
        old
    }

    /// Forget `key`; the entry it had.
    pub fn remove(&mut self, key: u64) -> Option<Entry> {
        let leaf = self.leaves.get_mut(&(key / LEAF_KEYS))?;
        let e = &mut leaf.entries[(key % LEAF_KEYS) as usize];
        let old = decode(*e)?;
        *e = 0;
        leaf.used -= 1;
        if leaf.used == 0 {
            self.leaves.remove(&(key / LEAF_KEYS));
        }
        self.slots -= usize::from(matches!(old, Entry::Slot(_)));
        Some(old)
    }

    /// Every (key, entry), in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (u64, Entry)> + '_ {
        self.leaves.iter().flat_map(|(&hi, leaf)| {
            leaf.entries
                .iter()
                .enumerate()
                .filter_map(move |(i, &v)| decode(v).map(|e| (hi * LEAF_KEYS + i as u64, e)))
        })
    }

    /// Bytes of the index: map buckets, leaves and malloc's header of each.
    pub fn overhead_bytes(&self) -> usize {
        // std's map (hashbrown): buckets a power of two at most 7/8 full, a control byte
        // each plus a group's worth (16).
        let cap = self.leaves.capacity();
        let buckets = if cap == 0 {
            0
        } else {
            (cap * 8 / 7).next_power_of_two()
        };
        let bucket = std::mem::size_of::<(u64, Box<Leaf>)>() + 1;
        let leaf = std::mem::size_of::<Leaf>() + MALLOC_HEADER_BYTES;
        buckets * bucket + if cap == 0 { 0 } else { 16 } + self.leaves.len() * leaf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(ps: usize, key: u64) -> Vec<u8> {
        (0..ps).map(|i| (key as usize * 31 + i) as u8).collect()
    }

    fn owner(key: u64) -> SlotOwner {
        SlotOwner {
            session: rmem_proto::SessionId(1),
            key,
            snapshot: false,
        }
    }

    /// A session's pages as the session layer keeps them: an index over its own arena.
    fn put(a: &mut Arena, ix: &mut Index, key: u64, data: &[u8]) {
        match ix.get(key) {
            Some(Entry::Slot(s)) => a.write(s, data, owner(key)).unwrap(),
            _ => {
                let s = a.alloc(data, owner(key)).unwrap();
                ix.set(key, Entry::Slot(s));
            }
        }
    }

    fn read(a: &Arena, slot: u32) -> Vec<u8> {
        let mut out = Vec::new();
        a.read(slot, &mut out).unwrap();
        out
    }

    fn get(a: &Arena, ix: &Index, key: u64) -> Option<Vec<u8>> {
        match ix.get(key)? {
            Entry::Slot(s) => Some(read(a, s)),
            Entry::Gone => None,
        }
    }

    fn live_slabs(a: &Arena) -> usize {
        match &a.backing {
            Backing::Ram { slabs, .. } => slabs.iter().flatten().count(),
            Backing::Disk { .. } => 0,
        }
    }

    fn remove(a: &mut Arena, ix: &mut Index, key: u64) -> bool {
        match ix.remove(key) {
            Some(Entry::Slot(s)) => a.release(s),
            _ => false,
        }
    }

    #[test]
    fn pages_round_trip_and_freed_slabs_go_back() {
        let ps = 4096;
        let (mut a, mut ix) = (Arena::new(ps), Index::new());
        let n = 1000u64;
        for k in 0..n {
            put(&mut a, &mut ix, k * 3, &page(ps, k));
        }
        put(&mut a, &mut ix, 0, &page(ps, 7));
        assert_eq!(get(&a, &ix, 0).unwrap(), page(ps, 7));
        for k in 1..n {
            assert_eq!(get(&a, &ix, k * 3).unwrap(), page(ps, k), "key {}", k * 3);
        }
        assert!(get(&a, &ix, 1).is_none() && !remove(&mut a, &mut ix, 1));
        // Free the first half: their slabs are released, the rest stay readable.
        for k in 0..n / 2 {
            assert!(remove(&mut a, &mut ix, k * 3));
        }
        assert_eq!((a.len(), ix.slots()), ((n / 2) as usize, (n / 2) as usize));
        let live = live_slabs(&a);
        assert!(live <= (n / 2) as usize / 64 + 2, "{live} slabs live");
        for k in n / 2..n {
            assert_eq!(get(&a, &ix, k * 3).unwrap(), page(ps, k));
        }
        // Freed slots are reused before new ones.
        let next = a.next;
        for k in 0..n / 2 {
            put(&mut a, &mut ix, 1_000_000 + k, &page(ps, k));
        }
        assert_eq!(a.next, next);
        for k in 0..n / 2 {
            assert_eq!(get(&a, &ix, 1_000_000 + k).unwrap(), page(ps, k));
        }
        for k in (n / 2..n)
            .map(|k| k * 3)
            .chain(1_000_000..1_000_000 + n / 2)
        {
            assert!(remove(&mut a, &mut ix, k));
        }
        assert!(a.is_empty() && live_slabs(&a) == 0 && a.free.is_empty());
        assert!(ix.leaves.is_empty());
    }

    #[test]
    fn a_shared_slot_is_freed_with_its_last_reference_and_tombstones_are_not_pages() {
        let ps = 4096;
        let mut a = Arena::new(ps);
        let s = a.alloc(&page(ps, 1), owner(1)).unwrap();
        a.share(s);
        assert_eq!(a.refs(s), 2);
        assert!(!a.release(s), "one reference is left");
        assert_eq!(read(&a, s), page(ps, 1));
        assert!(a.release(s));
        assert!(a.is_empty());
        let mut ix = Index::new();
        assert_eq!(ix.set(5, Entry::Gone), None);
        assert_eq!(ix.slots(), 0);
        assert_eq!(ix.set(5, Entry::Slot(3)), Some(Entry::Gone));
        assert_eq!(ix.slots(), 1);
        assert_eq!(ix.set(70, Entry::Gone), None);
        let mut all: Vec<_> = ix.entries().collect();
        all.sort_by_key(|e| e.0);
        assert_eq!(all, vec![(5, Entry::Slot(3)), (70, Entry::Gone)]);
        assert_eq!(ix.remove(5), Some(Entry::Slot(3)));
        assert_eq!(ix.remove(70), Some(Entry::Gone));
        assert!(ix.leaves.is_empty() && ix.slots() == 0);
    }

    /// The figure docs/configuration.md states: at most 16 bytes per stored 4 KiB page beyond
    /// the page, for a client's dense keys.
    #[test]
    fn bookkeeping_is_at_most_16_bytes_per_4k_page() {
        let ps = 4096;
        let data = vec![1u8; ps];
        for n in [64u64 * 1024, 100_000, 250_000] {
            let (mut a, mut ix) = (Arena::new(ps), Index::new());
            for k in 0..n {
                put(&mut a, &mut ix, k, &data);
            }
            let per_page = (a.overhead_bytes() + ix.overhead_bytes()) as f64 / n as f64;
            assert!(per_page <= 16.0, "{n} pages: {per_page:.2} bytes each");
            eprintln!("{n} pages of 4 KiB: {per_page:.2} bytes of bookkeeping each");
        }
    }
}
