//! The per-page state machine and its compact table.
//!
//! One byte per DLM page, in chunks allocated only for pages the program has touched, so the
//! table grows with the memory in use and never with the reserved address space.

use crate::PageIndex;

/// Where a page's contents are. Transitions are checked by [`PageTable::transition`].
///
/// ```text
///  Untouched --zero-fill--> ZeroClean --write--> Dirty
///  Untouched --zero-fill(write)--> Dirty
///  Remote --fetch--> Filling --install--> Clean | Dirty(write fault)
///  Clean --write--> Dirty
///  Clean --evict--> Remote         ZeroClean --evict--> Untouched
///  Dirty --evict(move out)--> Leaving --written--> Remote
///  Dirty --evict(move out, zero-filled and all zeros again)--> Untouched
///  Leaving --fault--> LeavingWanted --written--> Clean | Dirty (reinstalled locally)
///  Partial --evict(written pieces: move out)--> Leaving --written--> Remote
///    (where pieces are not written alone, the Leaving page's rest is fetched into its slot
///    first and the page written whole: PageStates::begin_merge)
///  LeavingWanted(pieces) --written--> Remote (fetched again by the faults that wait)
///  Dirty --sync--> Syncing --written--> Clean
///  Syncing --write--> SyncingDirty --written--> Dirty
///  ForkedClean --evict(unwritten)--> Remote   ForkedZero --evict(unwritten)--> Untouched
///  ForkedClean | ForkedZero --evict(written: move out)--> Leaving
///  ForkedClean | ForkedZero --piece zeroed--> Dirty
///  any --free--> Untouched
/// ```
///
/// `Syncing` and `SyncingDirty` are a write-back of a page that stays resident: a front end
/// that holds pages in buffers (the block device's FLUSH) uses them; the pager never does.
///
/// A fork() child starts from its parent's table relabelled ([`PageTable::relabel`]): see
/// `PageStates::after_fork`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PageState {
    /// Never written: reads as zero, no copy anywhere.
    Untouched = 0,
    /// Only the server's copy exists.
    Remote = 1,
    /// A fetch is in flight.
    Filling = 2,
    /// Resident, write-protected, zero, and without a remote copy.
    ZeroClean = 3,
    /// Resident, write-protected, equal to the server's copy.
    Clean = 4,
    /// Resident and writable; the server's copy, if any, is stale.
    Dirty = 5,
    /// Moved out to staging; its write-back is in flight.
    Leaving = 6,
    /// As `Leaving`, and the program faulted on it meanwhile.
    LeavingWanted = 7,
    /// Resident, written back while staying resident (a flush); the write is in flight, and
    /// the page is out of the policy until it lands.
    Syncing = 8,
    /// As `Syncing`, and written again meanwhile: dirty once the write lands.
    SyncingDirty = 9,
    /// In a fork() child: mapped as the parent had it, clean there (equal to the server's
    /// copy), shared copy-on-write with the parent and not write-protected (the kernel drops
    /// a child's write protection). Current on the server unless the child wrote it since,
    /// which its eviction finds out (the kernel moves only pages the child wrote).
    ForkedClean = 10,
    /// As `ForkedClean` for a page the parent had zero-filled and never written: no server
    /// copy.
    ForkedZero = 11,
    /// Some 4 KiB pieces of a remote page are mapped from the server's copy, write-protected
    /// unless the program wrote them (then writable, and written back alone); the rest are
    /// not populated (a sub-page fetch: state.rs keeps which, and which were written).
    Partial = 12,
}

impl PageState {
    fn from_u8(v: u8) -> PageState {
        match v {
            0 => PageState::Untouched,
            1 => PageState::Remote,
            2 => PageState::Filling,
            3 => PageState::ZeroClean,
            4 => PageState::Clean,
            5 => PageState::Dirty,
            6 => PageState::Leaving,
            7 => PageState::LeavingWanted,
            8 => PageState::Syncing,
            9 => PageState::SyncingDirty,
            10 => PageState::ForkedClean,
            11 => PageState::ForkedZero,
            12 => PageState::Partial,
            _ => unreachable!("corrupt page state {v}"),
        }
    }

    /// Holds local memory (counts against the budget).
    pub fn is_local(self) -> bool {
        !matches!(self, PageState::Untouched | PageState::Remote)
    }

    /// Mapped in the region right now.
    pub fn is_mapped(self) -> bool {
        matches!(
            self,
            PageState::ZeroClean
                | PageState::Clean
                | PageState::Dirty
                | PageState::ForkedClean
                | PageState::ForkedZero
                | PageState::Partial
        )
    }

    /// Holds a write not yet on the servers, or whose write-back is in flight: what a
    /// durability barrier of the block cache waits for.
    pub fn holds_a_write(self) -> bool {
        matches!(
            self,
            PageState::Dirty
                | PageState::Syncing
                | PageState::SyncingDirty
                | PageState::Leaving
                | PageState::LeavingWanted
        )
    }

    /// Mapped and possibly different from any copy on a server: an eviction moves it out
    /// and writes it back (a forked page only if the child wrote it), so it needs a staging
    /// slot.
    pub fn may_be_dirty(self) -> bool {
        matches!(
            self,
            PageState::Dirty | PageState::ForkedClean | PageState::ForkedZero
        )
    }

    fn may_become(self, to: PageState) -> bool {
        use PageState::*;
        matches!(
            (self, to),
            (Untouched, ZeroClean)
                | (Untouched, Dirty)
                | (Remote, Filling)
                | (Filling, Clean)
                | (Filling, Dirty)
                | (ZeroClean, Dirty)
                | (Clean, Dirty)
                | (Clean, Remote)
                | (ZeroClean, Untouched)
                | (Dirty, Leaving)
                | (Leaving, Remote)
                | (Leaving, LeavingWanted)
                | (LeavingWanted, Clean)
                | (LeavingWanted, Dirty)
                | (Dirty, Syncing)
                | (Syncing, SyncingDirty)
                | (Syncing, Clean)
                | (SyncingDirty, Dirty)
                | (ForkedClean, Remote)
                | (ForkedClean, Leaving)
                | (ForkedClean, Dirty)
                | (ForkedZero, Leaving)
                | (ForkedZero, Dirty)
                | (Filling, Partial)
                | (Partial, Filling)
                | (Partial, Remote)
                | (Partial, Leaving)
                | (LeavingWanted, Remote)
                | (_, Untouched)
        )
    }
}

/// Pages per chunk of the per-page tables (these states, the cluster layer's locations and
/// stamps, and the replacement policies' numbers), each chunk allocated when a page in it is
/// first given something to hold. 4 Ki pages: 16 MiB of memory or device at 4 KiB pages, up to
/// 100 KiB of tables when full. Chunks of 64 Ki pages held 80 MB more after `mkfs.ext4` of a
/// 1 TiB `rmem nbd` device (189 MB against 108 MB), a file system's metadata being spread over
/// the whole device; smaller ones would make the chunk lists themselves (8 bytes a chunk, up
/// to the highest touched) the cost.
pub(crate) const CHUNK_PAGES: usize = rmem_policy::per_page::CHUNK_PAGES;

/// Page states, one byte each, in chunks of [`CHUNK_PAGES`] allocated on first touch.
#[derive(Default)]
pub struct PageTable {
    chunks: Vec<Option<Box<[u8; CHUNK_PAGES]>>>,
    /// Pages whose state holds local memory.
    local: u64,
}

impl PageTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, page: PageIndex) -> PageState {
        let c = (page.0 as usize) / CHUNK_PAGES;
        match self.chunks.get(c) {
            Some(Some(chunk)) => PageState::from_u8(chunk[(page.0 as usize) % CHUNK_PAGES]),
            _ => PageState::Untouched,
        }
    }

    /// Move `page` to `to`, asserting the transition is legal: an illegal one is a bug in the
    /// pager and would corrupt memory if it went on.
    pub fn transition(&mut self, page: PageIndex, to: PageState) {
        let from = self.get(page);
        assert!(
            from.may_become(to),
            "page {} illegal transition {from:?} -> {to:?}",
            page.0
        );
        let c = (page.0 as usize) / CHUNK_PAGES;
        if to == PageState::Untouched && !matches!(self.chunks.get(c), Some(Some(_))) {
            // Untouched already: nothing to allocate a chunk for.
            return;
        }
        if c >= self.chunks.len() {
            self.chunks.resize_with(c + 1, || None);
        }
        let chunk = self.chunks[c].get_or_insert_with(|| Box::new([0u8; CHUNK_PAGES]));
        chunk[(page.0 as usize) % CHUNK_PAGES] = to as u8;
        match (from.is_local(), to.is_local()) {
            (false, true) => self.local += 1,
            (true, false) => self.local -= 1,
            _ => {}
        }
    }

    /// Give every page the state `f` says, without the transition checks, recounting the
    /// local pages: a fork() child reading its parent's table, whose states mean something
    /// else in the child (pages mapped without write protection, fetches that were the
    /// parent's).
    pub fn relabel(&mut self, f: impl Fn(PageState) -> PageState) {
        self.local = 0;
        for chunk in self.chunks.iter_mut().flatten() {
            // Eight states at a time: most pages of a chunk are untouched (0) and stay so.
            for word in chunk.chunks_exact_mut(8) {
                if u64::from_ne_bytes(word.try_into().expect("8 bytes")) == 0 {
                    continue;
                }
                for b in word {
                    let to = f(PageState::from_u8(*b));
                    *b = to as u8;
                    self.local += u64::from(to.is_local());
                }
            }
        }
    }

    /// Pages holding local memory.
    pub fn local_pages(&self) -> u64 {
        self.local
    }

    /// Bytes of metadata held.
    pub fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * 8 + self.chunks.iter().flatten().count() * CHUNK_PAGES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untouched_by_default_and_counts_local_pages() {
        let mut t = PageTable::new();
        let p = PageIndex(5_000_000);
        assert_eq!(t.get(p), PageState::Untouched);
        t.transition(p, PageState::ZeroClean);
        t.transition(p, PageState::Dirty);
        assert_eq!(t.local_pages(), 1);
        t.transition(p, PageState::Leaving);
        t.transition(p, PageState::Remote);
        assert_eq!(t.local_pages(), 0);
        assert!(t.heap_bytes() < 200_000);
    }

    #[test]
    fn a_synced_page_stays_local() {
        let mut t = PageTable::new();
        let p = PageIndex(7);
        t.transition(p, PageState::Dirty);
        t.transition(p, PageState::Syncing);
        t.transition(p, PageState::SyncingDirty);
        t.transition(p, PageState::Dirty);
        t.transition(p, PageState::Syncing);
        t.transition(p, PageState::Clean);
        assert_eq!(t.local_pages(), 1);
    }

    #[test]
    #[should_panic(expected = "illegal transition")]
    fn illegal_transitions_panic() {
        let mut t = PageTable::new();
        t.transition(PageIndex(1), PageState::Clean);
    }
}
