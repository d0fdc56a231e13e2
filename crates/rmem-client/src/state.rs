//! The one owner of every page's state in the client.
//!
//! A page's state is its byte in the [`PageTable`] and, for the states that carry more,
//! one entry in a side collection: the fill of a fetch in flight, the staging slot of a
//! write-back in flight, a release that waits for either to land, a place in the reinstall
//! queue, a pin. The replacement policy holds exactly the mapped pages that are not pinned.
//! Every transition is one method here that changes the byte and whatever goes with it, so the
//! collections cannot disagree with the table and a new state (stored on k of n servers,
//! migrating, filled for a buffer) is one change in one place. The pager does the memory side
//! of each transition (map, move out, drop, write-protect) and asks this type what it means.
//!
//! Agreement is checked, not hoped for: [`PageStates::check`] asserts (in release builds too)
//! that the policy holds as many pages as were admitted and not taken back, and every victim
//! the policy offers is asserted to be mapped.

use crate::pages::{PageState, PageTable};
use crate::PageIndex;
use rmem_policy::{Admission, Policy};
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

/// A fetch in flight, or a fault waiting for a page's write-back to land.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fill {
    pub write: bool,
    pub t0: Instant,
    /// Fetched ahead by the prefetcher, and no thread has touched it yet.
    pub prefetched: bool,
    /// A sub-page fetch: only this 4 KiB piece of the page is on its way.
    pub piece: Option<u8>,
}

/// A write-back in flight: the staging slot that holds the page, and the fault that wants it
/// back meanwhile.
#[derive(Clone, Copy, Debug)]
struct Leave {
    slot: u32,
    wanted: Option<Fill>,
    /// A partial page's written pieces, written back alone (0: the whole page). The slot
    /// holds zeros elsewhere (its other pieces were dropped before it moved): it is never
    /// reinstalled, the page is fetched again ([`Landed::Refetch`]).
    pieces: u64,
    /// A partial page's written pieces, which hold memory in the slot (its other pieces are
    /// the zero page there); 0 for a whole page.
    held: u64,
    /// Where a partial page's written pieces cannot be written back alone.
    merge: Merge,
    /// The write-back landed (the servers hold the page): the slot is then not its only
    /// copy, and a reinstall with no room may leave it remote instead.
    landed: bool,
}

/// A leaving partial page's merge with the rest of its page ([`PageStates::begin_merge`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Merge {
    /// None: a whole page, or written pieces written back alone.
    No,
    /// The written pieces wait for the rest of the page, being fetched, to be written back
    /// with it, whole (a store that writes no piece alone).
    Waiting,
    /// Merged: it leaves whole, but left the budget as a partial page, so when wanted it is
    /// fetched again rather than reinstalled ([`Landed::Refetch`]).
    Done,
}

/// What the fetch of a leaving partial page's other pieces means ([`PageStates::merged`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Merged {
    /// The program freed the page meanwhile: it is untouched now; forget the server copy,
    /// free the slot, wake the threads that wait on it.
    Released { slot: u32 },
    /// Fill the pieces of `slot` not in `written` from what came, and write the page back
    /// whole from the slot: it leaves as a whole page from now on.
    Write { slot: u32, written: u64 },
}

/// What the end of a fetch or a write-back means for the page.
#[derive(Debug, PartialEq, Eq)]
pub enum Landed {
    /// The program freed the page meanwhile: it is untouched now; forget the server copy, free
    /// the staging slot if any, and wake the threads that wait on it.
    Released { slot: Option<u32> },
    /// Map the page (from the data that arrived, or from `slot`), writable if `write`; then
    /// free the slot if any.
    Map {
        write: bool,
        fill: Fill,
        slot: Option<u32>,
        /// The 4 KiB pieces already mapped (a partial page fetched whole): only the others
        /// are to be installed.
        present: u64,
    },
    /// One 4 KiB piece arrived: map it write-protected; the page is [`PageState::Partial`].
    Piece { piece: u8, fill: Fill },
    /// Written back and not wanted: it is remote now; free its slot.
    Remote { slot: u32 },
    /// A partial page's written pieces are written back, and the program wanted the page
    /// meanwhile: it is remote now; free its slot and wake the threads that wait, which fault
    /// on it again and fetch it.
    Refetch { slot: u32 },
    /// Written back and wanted: it waits in the reinstall queue.
    Queued,
    /// Written back while staying resident ([`PageStates::begin_sync`]): Clean now, or Dirty
    /// if it was written meanwhile; back in the policy either way.
    Synced { dirty: bool },
}

/// What the program's release of a page needs.
#[derive(Debug, PartialEq, Eq)]
pub enum Freed {
    /// Nothing anywhere.
    Nothing,
    /// Its server copy is to be forgotten.
    Remote,
    /// A fetch or write-back is in flight: finished when it lands ([`Landed::Released`]).
    Later,
}

/// The pieces a page holds (a bit each), those of them the program wrote (mapped writable,
/// written back alone), the one fetched last, and when (in fetches).
#[derive(Clone, Copy, Debug, Default)]
struct Part {
    mask: u64,
    written: u64,
    last: u8,
    at: u64,
}

pub struct PageStates {
    table: PageTable,
    policy: Box<dyn Policy>,
    /// Pages admitted to the policy and not taken back: what `policy.len()` must be.
    in_policy: u64,
    filling: HashMap<PageIndex, Fill>,
    leaving: HashMap<PageIndex, Leave>,
    /// Pages the program freed while an operation on them was in flight.
    released: HashSet<PageIndex>,
    /// Written-back pages the program wanted meanwhile, to be reinstalled from their slots.
    reinstall: VecDeque<PageIndex>,
    /// Pages the program pinned (mlock): never in the policy, so never evicted once mapped.
    locked: HashSet<PageIndex>,
    /// Most pages pinned at once.
    locked_max: u64,
    /// Mapped pages that were zero-filled and have no server copy, dirty or not: one that
    /// is all zeros again when evicted needs no write-back ([`PageStates::unchanged`]).
    /// Only ever mapped pages: every transition that unmaps one takes it out.
    zero_origin: HashSet<PageIndex>,
    /// The 4 KiB pieces mapped of each page that has some but is not mapped whole: a Partial
    /// page, or one being filled after it was Partial. Pages here count against the budget by
    /// their pieces (`part_pages`, `part_units`), not as whole pages, except while a whole
    /// fetch is in flight for them (`promoting`).
    parts: HashMap<PageIndex, Part>,
    /// Pages in `parts` being fetched whole: they count as whole pages.
    promoting: HashSet<PageIndex>,
    /// Pages counted by pieces, and their pieces (mapped, or in flight).
    part_pages: u64,
    part_units: u64,
    /// Partial pages leaving, and the pieces their slots hold ([`Leave::held`]).
    leave_part_pages: u64,
    leave_part_units: u64,
    /// 4 KiB pieces per page (1: no sub-page fetches).
    pieces: u64,
    /// Fetches landed so far: the clock of `Part::at`.
    fetches: u64,
}

impl PageStates {
    pub fn new(policy: Box<dyn Policy>, locked_max: u64) -> PageStates {
        PageStates {
            table: PageTable::new(),
            policy,
            in_policy: 0,
            filling: HashMap::new(),
            leaving: HashMap::new(),
            released: HashSet::new(),
            reinstall: VecDeque::new(),
            locked: HashSet::new(),
            locked_max,
            zero_origin: HashSet::new(),
            parts: HashMap::new(),
            promoting: HashSet::new(),
            part_pages: 0,
            part_units: 0,
            leave_part_pages: 0,
            leave_part_units: 0,
            pieces: 1,
            fetches: 0,
        }
    }

    /// Pages may be fetched a 4 KiB piece at a time: `pieces` per page (at most 64).
    pub fn set_pieces(&mut self, pieces: u64) {
        assert!((1..=64).contains(&pieces), "{pieces} pieces per page");
        self.pieces = pieces;
    }

    /// The pieces of `page` mapped now (0 for a page not partial).
    pub fn present(&self, page: PageIndex) -> u64 {
        self.parts.get(&page).map_or(0, |p| p.mask)
    }

    /// The pieces of `page` the program wrote (0 for a page not partial).
    pub fn written_pieces(&self, page: PageIndex) -> u64 {
        self.parts.get(&page).map_or(0, |p| p.written)
    }

    /// Whether a partial page's written pieces are on their way to the servers (alone, or
    /// waiting for the rest of the page to merge with).
    pub fn pieces_leaving(&self) -> bool {
        self.leave_part_pages != 0
    }

    /// The program wrote piece `i` of a partial page (a write-protect fault on it): it is
    /// mapped writable from now on and written back alone when the page leaves.
    pub fn write_piece(&mut self, page: PageIndex, i: u8) {
        assert_eq!(self.get(page), PageState::Partial, "page {}", page.0);
        let part = self.parts.get_mut(&page).expect("a partial page's pieces");
        assert!(
            part.mask & (1 << i) != 0,
            "page {} piece {i} written but not held",
            page.0
        );
        part.written |= 1 << i;
        if !self.locked.contains(&page) {
            self.policy.on_write(page);
        }
    }

    /// Whether the program pinned `page` (mlock).
    pub fn is_locked(&self, page: PageIndex) -> bool {
        !self.locked.is_empty() && self.locked.contains(&page)
    }

    /// The piece of `page` fetched last, if it holds any, and how many fetches landed since.
    pub fn last_piece(&self, page: PageIndex) -> Option<(u8, u64)> {
        self.parts
            .get(&page)
            .filter(|p| p.mask != 0)
            .map(|p| (p.last, self.fetches - p.at))
    }

    /// The pages that hold some pieces: Partial, or being fetched after they were.
    pub fn pieced_pages(&self) -> Vec<PageIndex> {
        let mut v: Vec<PageIndex> = self.parts.keys().copied().collect();
        v.sort_unstable();
        v
    }

    pub fn get(&self, page: PageIndex) -> PageState {
        self.table.get(page)
    }

    /// Pages holding local memory: mapped, being filled, or staged; a page that holds only
    /// some 4 KiB pieces (mapped, or in its staging slot) counts as that part of a page
    /// (rounded up over all such pages).
    pub fn local(&self) -> u64 {
        let whole_leaving = self.leaving.len() as u64 - self.leave_part_pages;
        (self.resident_units() + whole_leaving * self.pieces + self.leave_part_units)
            .div_ceil(self.pieces)
    }

    /// What is mapped or being filled, in 4 KiB pieces where pages may be fetched by the
    /// piece (else in pages): the budget's exact count, where [`PageStates::resident`]
    /// rounds up.
    pub fn resident_units(&self) -> u64 {
        (self.table.local_pages() - self.leaving.len() as u64 - self.part_pages) * self.pieces
            + self.part_units
    }

    /// What dropping the mapped `page` gives back, in the units of
    /// [`PageStates::resident_units`].
    pub fn units_of(&self, page: PageIndex) -> u64 {
        match self.get(page) {
            PageState::Partial => u64::from(self.present(page).count_ones()),
            _ => self.pieces,
        }
    }

    /// Pieces per page: the unit of [`PageStates::resident_units`] (1: whole pages).
    pub fn pieces(&self) -> u64 {
        self.pieces
    }

    /// Pages mapped or being filled (rounded up, as [`PageStates::local`]).
    pub fn resident(&self) -> u64 {
        self.resident_units().div_ceil(self.pieces)
    }

    /// A one-line account, for error reports.
    pub fn describe(&self) -> String {
        format!(
            "local {} pages, policy holds {}, filling {}, leaving {}, reinstall {}, pinned {}",
            self.local(),
            self.policy.len(),
            self.filling.len(),
            self.leaving.len(),
            self.reinstall.len(),
            self.locked.len()
        )
    }

    /// Dirty victims whose write-back is in flight (each holds a staging slot).
    pub fn leaving(&self) -> usize {
        self.leaving.len()
    }

    /// Written-back pages wait to be reinstalled.
    pub fn reinstall_waiting(&self) -> bool {
        !self.reinstall.is_empty()
    }

    /// The policy's count agrees with what was admitted to it.
    pub fn check(&self) {
        assert_eq!(
            self.policy.len() as u64,
            self.in_policy,
            "the policy disagrees with the mapped pages: {}",
            self.describe()
        );
        assert!(
            self.zero_origin.len() as u64 <= self.resident(),
            "{} zero-filled pages among the mapped: {}",
            self.zero_origin.len(),
            self.describe()
        );
        // A sum over every partial page: in this module's tests and debug builds only (the
        // pager checks after each batch of events).
        if cfg!(any(test, debug_assertions)) {
            assert_eq!(
                self.part_units,
                self.parts
                    .iter()
                    .filter(|(p, _)| !self.promoting.contains(p))
                    .map(|(p, m)| {
                        let fetching = self.filling.get(p).is_some_and(|f| f.piece.is_some());
                        u64::from(m.mask.count_ones()) + u64::from(fetching)
                    })
                    .sum::<u64>(),
                "pieces counted: {}",
                self.describe()
            );
            let leaving_parts = self.leaving.values().filter(|l| l.pieces != 0);
            assert_eq!(
                (self.leave_part_pages, self.leave_part_units),
                leaving_parts.fold((0, 0), |(n, u), l| (n + 1, u + l.held)),
                "partial pages leaving: {}",
                self.describe()
            );
        }
    }

    /// The program missed on `page` (a fault on an untouched or remote page).
    pub fn missed(&mut self, page: PageIndex) {
        self.policy.on_miss(page);
    }

    /// The program ran over `from..to` without faulting (a fault stream continued past them).
    pub fn passed(&mut self, from: PageIndex, to: PageIndex) {
        self.policy.on_passed(from, to);
    }

    /// A front end that sees every access used the resident `page` (the block device).
    pub fn hit(&mut self, page: PageIndex) {
        if !self.locked.contains(&page) {
            self.policy.on_hit(page);
        }
    }

    /// An untouched page is zero-filled: mapped as zero, writable if the fault was a write or
    /// the page is pinned. Returns whether it is mapped writable.
    pub fn zero_fill(&mut self, page: PageIndex, write: bool) -> bool {
        let write = write || self.locked.contains(&page);
        let to = if write {
            PageState::Dirty
        } else {
            PageState::ZeroClean
        };
        self.table.transition(page, to);
        self.admit(page, Admission::ZeroFilled, write);
        self.zero_origin.insert(page);
        write
    }

    /// A fetch of a remote page starts: the whole page, or one piece (`fill.piece`). A
    /// partial page leaves the policy while its fetch is in flight; fetched whole it counts
    /// as a whole page from now on.
    pub fn begin_fill(&mut self, page: PageIndex, fill: Fill) {
        let from = self.get(page);
        if from == PageState::Partial && !self.locked.contains(&page) {
            self.policy.remove(page);
            self.in_policy -= 1;
        }
        match (fill.piece, from) {
            (None, PageState::Partial) => {
                self.part_pages -= 1;
                self.part_units -= u64::from(self.present(page).count_ones());
                self.promoting.insert(page);
            }
            (Some(i), _) => {
                assert!(
                    u64::from(i) < self.pieces && self.present(page) & (1 << i) == 0,
                    "page {} piece {i} fetched again",
                    page.0
                );
                if from == PageState::Remote {
                    self.parts.insert(page, Part::default());
                    self.part_pages += 1;
                }
                self.part_units += 1;
            }
            (None, _) => {}
        }
        self.table.transition(page, PageState::Filling);
        self.filling.insert(page, fill);
    }

    /// Piece `i` of a partial page is no longer mapped (the program dropped it with a raw
    /// madvise(2) system call): it is fetched again when touched. Not a written piece (the
    /// pager maps zeros there instead, as Linux would).
    pub fn lose_piece(&mut self, page: PageIndex, i: u8) {
        assert_eq!(self.get(page), PageState::Partial, "page {}", page.0);
        let part = self.parts.get_mut(&page).expect("a partial page's pieces");
        assert!(
            part.mask & !part.written & (1 << i) != 0,
            "page {} piece {i} not held, or written",
            page.0
        );
        part.mask &= !(1 << i);
        self.part_units -= 1;
    }

    /// A page that holds some pieces leaves `parts` (its accounting with it).
    fn leave_parts(&mut self, page: PageIndex, fill: Option<&Fill>) {
        let Some(Part { mask, .. }) = self.parts.remove(&page) else {
            return;
        };
        if !self.promoting.remove(&page) {
            self.part_pages -= 1;
            let fetching = fill.is_some_and(|f| f.piece.is_some());
            self.part_units -= u64::from(mask.count_ones()) + u64::from(fetching);
        }
    }

    /// The fill of a page being fetched (a fault on it joins the fetch).
    pub fn fill_mut(&mut self, page: PageIndex) -> &mut Fill {
        self.filling
            .get_mut(&page)
            .expect("filling page has a fill")
    }

    /// A fetched page arrived: map it, or it was freed meanwhile.
    pub fn fetched(&mut self, page: PageIndex) -> Landed {
        let fill = self
            .filling
            .remove(&page)
            .expect("fetched page was being filled");
        self.fetches += 1;
        if self.released.remove(&page) {
            self.leave_parts(page, Some(&fill));
            self.table.transition(page, PageState::Untouched);
            return Landed::Released { slot: None };
        }
        if let Some(piece) = fill.piece {
            let part = self
                .parts
                .get_mut(&page)
                .expect("a piece's page is partial");
            part.mask |= 1 << piece;
            if fill.write {
                part.written |= 1 << piece;
            }
            part.last = piece;
            part.at = self.fetches;
            self.table.transition(page, PageState::Partial);
            self.admit(page, Admission::Fetched, fill.write);
            return Landed::Piece { piece, fill };
        }
        // A prefetch nothing has touched yet is not a reference: the policy keeps it apart.
        let how = if fill.prefetched {
            Admission::Prefetched
        } else {
            Admission::Fetched
        };
        self.mapped(page, fill, None, how)
    }

    /// A page is mapped from a fetch or a staging slot: Clean or Dirty (written, or holding
    /// written pieces), admitted to the policy.
    fn mapped(&mut self, page: PageIndex, fill: Fill, slot: Option<u32>, how: Admission) -> Landed {
        let write = fill.write || self.locked.contains(&page) || self.written_pieces(page) != 0;
        let to = if write {
            PageState::Dirty
        } else {
            PageState::Clean
        };
        let present = self.present(page);
        self.leave_parts(page, None);
        self.table.transition(page, to);
        self.admit(page, how, write);
        Landed::Map {
            write,
            fill,
            slot,
            present,
        }
    }

    /// A page just mapped may be evicted from now on, unless the program pinned it.
    fn admit(&mut self, page: PageIndex, how: Admission, write: bool) {
        if !self.locked.contains(&page) {
            self.policy.insert(page, how);
            self.in_policy += 1;
            if write {
                self.policy.on_write(page);
            }
        }
    }

    /// A clean or zero page is written (a write-protect fault, or a piece the program zeroed),
    /// or a page being synced is written again.
    pub fn dirty(&mut self, page: PageIndex) {
        if self.get(page) == PageState::Syncing {
            // Out of the policy until its write lands; it learns of the write then.
            self.table.transition(page, PageState::SyncingDirty);
            return;
        }
        self.table.transition(page, PageState::Dirty);
        if !self.locked.contains(&page) {
            self.policy.on_write(page);
        }
    }

    /// Whether a mapped page was zero-filled and has no server copy.
    pub fn zero_origin(&self, page: PageIndex) -> bool {
        self.zero_origin.contains(&page)
    }

    /// A dirty victim that was zero-filled, moved out of the region, is all zeros: untouched
    /// again, as it would be after a clean drop, and nothing is written. Programs clear memory
    /// that is already zero (a `memset` after `malloc`, a buffer reset before use): such pages
    /// take neither a write-back nor server memory.
    pub fn unchanged(&mut self, v: PageIndex) {
        assert!(
            self.zero_origin.remove(&v),
            "page {} found unchanged but was not zero-filled",
            v.0
        );
        assert_eq!(self.get(v), PageState::Dirty, "unchanged page {}", v.0);
        self.table.transition(v, PageState::Untouched);
    }

    /// A dirty page is written back and stays resident (a flush of a buffer front end): out
    /// of the policy until the write lands ([`PageStates::stored`] answers
    /// [`Landed::Synced`]), so it is never chosen as a victim with a write in flight.
    pub fn begin_sync(&mut self, page: PageIndex) {
        self.zero_origin.remove(&page);
        self.table.transition(page, PageState::Syncing);
        if !self.locked.contains(&page) {
            self.policy.remove(page);
            self.in_policy -= 1;
        }
    }

    /// A victim to evict now, taken out of the policy; None if every candidate is busy
    /// (`slot_free`: whether a dirty victim could be staged).
    pub fn take_victim(&mut self, slot_free: bool) -> Option<PageIndex> {
        let v = self.policy.select_victim()?;
        self.in_policy -= 1;
        let s = self.get(v);
        assert!(
            s.is_mapped(),
            "the policy chose page {} in state {s:?}",
            v.0
        );
        if (s.may_be_dirty() || self.written_pieces(v) != 0) && !slot_free {
            // Every write-back slot is busy: keep the page and wait for an acknowledgement.
            self.policy.insert(v, Admission::Declined);
            self.in_policy += 1;
            return None;
        }
        Some(v)
    }

    /// A clean victim was dropped from the region: remote again, or untouched if it was zero.
    pub fn dropped(&mut self, v: PageIndex) {
        let to = match self.get(v) {
            PageState::Clean | PageState::ForkedClean => PageState::Remote,
            PageState::ZeroClean | PageState::ForkedZero => PageState::Untouched,
            PageState::Partial => {
                assert_eq!(
                    self.written_pieces(v),
                    0,
                    "page {} dropped with written pieces",
                    v.0
                );
                self.leave_parts(v, None);
                PageState::Remote
            }
            s => unreachable!("drop of page {} in state {s:?}", v.0),
        };
        self.zero_origin.remove(&v);
        self.table.transition(v, to);
    }

    /// In a fork() child, on its copy of its parent's states, taken while the parent's pager
    /// was parked: what each state means in the child. Clean pages are mapped in the child
    /// without write protection (`ForkedClean`, `ForkedZero`: whether the child wrote them is
    /// found out when they are evicted); dirty ones stay dirty. Fetches in flight were the
    /// parent's: those pages are remote (the child's snapshot on the servers has them), or
    /// partial where some of their pieces were mapped. Every piece mapped at the fork stays
    /// mapped in the child, and counts as written: the parent may have written it since its
    /// last write-back, and the child's writes to it are unseen (no write protection); so it is
    /// written back alone when its page leaves, and kept when the rest of the page comes.
    /// Write-backs in flight were the parent's too, and the child has its own copy of every
    /// staging slot: those pages are reinstalled from their slots as dirty pages (the
    /// write-back may not have reached the snapshot). A partial page's write-back in flight
    /// would have to be read back from the slot by the piece: the parent waits for those to
    /// land before it forks. Pins (mlock) are not inherited.
    pub fn after_fork(&mut self, now: Instant) {
        // Kept simple: a page is found all zeros again only in the process that zero-filled it.
        self.zero_origin.clear();
        self.promoting.clear();
        self.parts.retain(|_, p| {
            p.written = p.mask;
            p.mask != 0
        });
        self.part_pages = self.parts.len() as u64;
        self.part_units = self
            .parts
            .values()
            .map(|p| u64::from(p.mask.count_ones()))
            .sum();
        for page in self.pieced_pages() {
            if self.get(page) != PageState::Filling {
                continue;
            }
            // The parent's fetch of more of it: the child holds the pieces mapped.
            self.filling.remove(&page);
            if self.released.remove(&page) {
                self.leave_parts(page, None);
                self.table.transition(page, PageState::Untouched);
                continue;
            }
            self.table.transition(page, PageState::Partial);
            self.admit(page, Admission::Fetched, true);
        }
        self.table.relabel(|s| match s {
            PageState::Clean => PageState::ForkedClean,
            PageState::ZeroClean => PageState::ForkedZero,
            PageState::Filling => PageState::Remote,
            PageState::Leaving => PageState::LeavingWanted,
            s => s,
        });
        for (page, _) in std::mem::take(&mut self.filling) {
            if self.released.remove(&page) {
                self.table.transition(page, PageState::Untouched);
            }
        }
        let wanted = Fill {
            write: true,
            t0: now,
            prefetched: false,
            piece: None,
        };
        assert!(
            self.leaving.values().all(|l| l.pieces == 0),
            "written pieces in flight at a fork"
        );
        let mut leaving: Vec<PageIndex> = self.leaving.keys().copied().collect();
        leaving.sort_unstable();
        for &page in &leaving {
            // The parent's write-back may not have reached the child's snapshot: the slot
            // is the child's only sure copy.
            let l = self.leaving.get_mut(&page).expect("listed");
            (l.wanted, l.landed) = (Some(wanted), false);
        }
        self.reinstall = leaving.into();
        for page in std::mem::take(&mut self.locked) {
            if self.get(page).is_mapped() {
                self.policy.insert(page, Admission::Fetched);
                self.in_policy += 1;
            }
        }
        self.check();
    }

    /// A dirty victim, or a partial one with written pieces, was moved out into staging
    /// `slot`; its write-back starts. Returns the pieces to write back alone (0: the whole
    /// page).
    pub fn begin_leave(&mut self, v: PageIndex, slot: u32) -> u64 {
        self.zero_origin.remove(&v);
        let pieces = self.written_pieces(v);
        let mut held = 0;
        if self.get(v) == PageState::Partial {
            assert_ne!(pieces, 0, "page {} left with no written piece", v.0);
            // Its pieces not written were dropped before it moved (`Core::move_out`).
            held = u64::from(pieces.count_ones());
            self.leave_parts(v, None);
            self.leave_part_pages += 1;
            self.leave_part_units += held;
        }
        self.table.transition(v, PageState::Leaving);
        self.leaving.insert(
            v,
            Leave {
                slot,
                wanted: None,
                pieces,
                held,
                merge: Merge::No,
                landed: false,
            },
        );
        pieces
    }

    /// A partial victim's written pieces cannot be written back alone (the store keeps pages
    /// sealed by the piece): the rest of the page is fetched first, and the page written back
    /// whole ([`PageStates::merged`]). It stays leaving meanwhile.
    pub fn begin_merge(&mut self, page: PageIndex) {
        let l = self.leaving.get_mut(&page).expect("a leaving page");
        assert!(
            l.pieces != 0 && l.merge == Merge::No,
            "page {} merged twice",
            page.0
        );
        l.merge = Merge::Waiting;
    }

    /// Whether a fetch of `page` that landed is a merge's ([`PageStates::begin_merge`]).
    pub fn merging(&self, page: PageIndex) -> bool {
        self.leaving
            .get(&page)
            .is_some_and(|l| l.merge == Merge::Waiting)
    }

    /// The rest of a merging page came: it leaves whole from now on (its write-back lands
    /// as any page's; a fault meanwhile fetches it again then, [`Landed::Refetch`]), or it
    /// was freed.
    pub fn merged(&mut self, page: PageIndex) -> Merged {
        if self.released.remove(&page) {
            let leave = self.end_leave(page);
            self.table.transition(page, PageState::Untouched);
            return Merged::Released { slot: leave.slot };
        }
        let l = self.leaving.get_mut(&page).expect("a merging page");
        let (slot, written, held) = (l.slot, l.pieces, l.held);
        (l.merge, l.pieces, l.held) = (Merge::Done, 0, 0);
        self.leave_part_pages -= 1;
        self.leave_part_units -= held;
        Merged::Write { slot, written }
    }

    /// The program faulted on a page whose write-back is in flight.
    pub fn want(&mut self, page: PageIndex, fill: Fill) {
        let l = self
            .leaving
            .get_mut(&page)
            .expect("leaving page has a slot");
        match &mut l.wanted {
            Some(w) => w.write |= fill.write,
            None => {
                l.wanted = Some(fill);
                self.table.transition(page, PageState::LeavingWanted);
            }
        }
    }

    /// The staging slot of a page being written back (its contents until the write lands).
    pub fn slot_of(&self, page: PageIndex) -> u32 {
        self.leaving[&page].slot
    }

    /// A page's write-back landed.
    pub fn stored(&mut self, page: PageIndex) -> Landed {
        if matches!(self.get(page), PageState::Syncing | PageState::SyncingDirty) {
            return self.synced(page);
        }
        let leave = *self.leaving.get(&page).expect("stored page was leaving");
        if self.released.remove(&page) {
            self.end_leave(page);
            self.table.transition(page, PageState::Untouched);
            Landed::Released {
                slot: Some(leave.slot),
            }
        } else if leave.wanted.is_some() && (leave.pieces != 0 || leave.merge == Merge::Done) {
            // The slot holds zeros where pieces were not mapped: the page comes from the
            // server again. So does a merged page: it left as a partial page, giving back
            // only its pieces, and the room for all of it is made by the fault that fetches
            // it, as for every page that left in part.
            self.end_leave(page);
            self.table.transition(page, PageState::Remote);
            Landed::Refetch { slot: leave.slot }
        } else if leave.wanted.is_some() {
            self.leaving.get_mut(&page).expect("leaving").landed = true;
            self.reinstall.push_back(page);
            Landed::Queued
        } else {
            self.end_leave(page);
            self.table.transition(page, PageState::Remote);
            Landed::Remote { slot: leave.slot }
        }
    }

    /// A write-back is over: `page` leaves `leaving` (its accounting with it).
    fn end_leave(&mut self, page: PageIndex) -> Leave {
        let leave = self.leaving.remove(&page).expect("a leaving page");
        if leave.pieces != 0 {
            self.leave_part_pages -= 1;
            self.leave_part_units -= leave.held;
        }
        leave
    }

    /// A sync landed: the page is back in the policy, Clean or (written meanwhile) Dirty.
    fn synced(&mut self, page: PageIndex) -> Landed {
        if self.released.remove(&page) {
            self.table.transition(page, PageState::Untouched);
            return Landed::Released { slot: None };
        }
        let dirty = self.get(page) == PageState::SyncingDirty;
        self.table.transition(
            page,
            if dirty {
                PageState::Dirty
            } else {
                PageState::Clean
            },
        );
        self.admit(page, Admission::Fetched, dirty);
        Landed::Synced { dirty }
    }

    /// Whether the next reinstall needs room: not where the program freed the page meanwhile
    /// (it only gives its slot back). None waiting: false.
    pub fn next_reinstall_maps(&self) -> bool {
        self.reinstall
            .front()
            .is_some_and(|p| !self.released.contains(p))
    }

    /// The next written-back page that was wanted: map it from its slot if there is `room`
    /// for it, else, where its write-back landed, it is remote now (its copy on the servers
    /// is whole) and fetched again by the fault that wants it ([`Landed::Refetch`]); or it
    /// was freed. A fork child's page whose parent's write-back was in flight is mapped
    /// whatever the room: its slot holds the only copy the child can trust.
    pub fn next_reinstall(&mut self, room: bool) -> Option<(PageIndex, Landed)> {
        let page = self.reinstall.pop_front()?;
        let leave = self.end_leave(page);
        assert_eq!(
            leave.pieces, 0,
            "page {}: a partial leave reinstalled",
            page.0
        );
        if self.released.remove(&page) {
            self.table.transition(page, PageState::Untouched);
            return Some((
                page,
                Landed::Released {
                    slot: Some(leave.slot),
                },
            ));
        }
        let want = leave.wanted.expect("reinstalled page was wanted");
        if !room && leave.landed {
            self.table.transition(page, PageState::Remote);
            return Some((page, Landed::Refetch { slot: leave.slot }));
        }
        Some((
            page,
            self.mapped(page, want, Some(leave.slot), Admission::Fetched),
        ))
    }

    /// The program freed `page`: it becomes untouched, now or when its operation lands. Freed
    /// memory is unpinned, as munmap(2) unlocks.
    pub fn free(&mut self, page: PageIndex) -> Freed {
        // Cheap for a page never touched: a program may free a reservation of many GiB.
        let pinned = !self.locked.is_empty() && self.locked.remove(&page);
        let state = self.get(page);
        if state != PageState::Untouched {
            self.zero_origin.remove(&page);
        }
        match state {
            PageState::Untouched => Freed::Nothing,
            PageState::Remote => {
                self.table.transition(page, PageState::Untouched);
                Freed::Remote
            }
            PageState::ZeroClean
            | PageState::Clean
            | PageState::Dirty
            | PageState::ForkedClean
            | PageState::ForkedZero
            | PageState::Partial => {
                if !pinned {
                    self.policy.remove(page);
                    self.in_policy -= 1;
                }
                self.leave_parts(page, None);
                self.table.transition(page, PageState::Untouched);
                Freed::Remote
            }
            PageState::Filling
            | PageState::Leaving
            | PageState::LeavingWanted
            | PageState::Syncing
            | PageState::SyncingDirty => {
                self.released.insert(page);
                Freed::Later
            }
        }
    }

    /// Pin `pages` (mlock): out of the policy. Returns the pinned pages that are mapped
    /// write-protected and must become writable (the kernel may write a pinned page on its
    /// own), now Dirty; None (nothing pinned) when the pins would exceed their bound.
    pub fn lock(
        &mut self,
        pages: impl Iterator<Item = PageIndex> + Clone,
    ) -> Option<Vec<PageIndex>> {
        let new = pages.clone().filter(|p| !self.locked.contains(p)).count() as u64;
        if self.locked.len() as u64 + new > self.locked_max {
            return None;
        }
        let mut writable = Vec::new();
        for p in pages {
            if !self.locked.insert(p) {
                continue;
            }
            let s = self.get(p);
            if s.is_mapped() {
                self.policy.remove(p);
                self.in_policy -= 1;
            }
            if matches!(s, PageState::ZeroClean | PageState::Clean) {
                self.table.transition(p, PageState::Dirty);
                writable.push(p);
            }
        }
        Some(writable)
    }

    /// Unpin `pages` (munlock): mapped ones go back to the policy.
    pub fn unlock(&mut self, pages: impl Iterator<Item = PageIndex>) {
        for p in pages {
            if self.locked.remove(&p) && self.get(p).is_mapped() {
                self.policy.insert(p, Admission::Fetched);
                self.in_policy += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states() -> PageStates {
        PageStates::new(rmem_policy::by_name("fifo").expect("fifo"), 4)
    }

    fn fill(write: bool) -> Fill {
        Fill {
            write,
            t0: Instant::now(),
            prefetched: false,
            piece: None,
        }
    }

    #[test]
    fn a_page_released_in_flight_lands_untouched() {
        let mut s = states();
        let p = PageIndex(3);
        assert!(!s.zero_fill(p, false));
        assert_eq!(s.take_victim(true), Some(p));
        s.dropped(p);
        assert_eq!(s.get(p), PageState::Untouched);
        s.zero_fill(p, true);
        assert_eq!(s.take_victim(true), Some(p));
        s.begin_leave(p, 7);
        s.want(p, fill(false));
        assert_eq!(s.free(p), Freed::Later);
        assert_eq!(s.stored(p), Landed::Released { slot: Some(7) });
        assert_eq!(s.get(p), PageState::Untouched);
        assert_eq!(s.local(), 0);
        s.check();
    }

    #[test]
    fn pinned_pages_stay_out_of_the_policy() {
        let mut s = states();
        let (a, b) = (PageIndex(1), PageIndex(2));
        s.zero_fill(a, false);
        s.zero_fill(b, false);
        assert_eq!(s.lock([a].into_iter()), Some(vec![a]));
        assert_eq!(s.get(a), PageState::Dirty);
        s.check();
        assert_eq!(s.take_victim(true), Some(b));
        assert_eq!(s.take_victim(true), None);
        s.unlock([a].into_iter());
        assert_eq!(s.take_victim(true), Some(a));
        assert!(
            s.lock((10..20).map(PageIndex)).is_none(),
            "beyond the bound"
        );
        s.check();
    }

    #[test]
    fn a_wanted_write_back_is_reinstalled_from_its_slot() {
        let mut s = states();
        let p = PageIndex(9);
        s.zero_fill(p, true);
        assert_eq!(s.take_victim(true), Some(p));
        s.begin_leave(p, 1);
        assert_eq!(s.stored(p), Landed::Remote { slot: 1 });
        s.begin_fill(p, fill(false));
        assert!(matches!(s.fetched(p), Landed::Map { write: false, .. }));
        s.dirty(p);
        assert_eq!(s.take_victim(true), Some(p));
        s.begin_leave(p, 2);
        s.want(p, fill(true));
        assert_eq!(s.stored(p), Landed::Queued);
        let (q, l) = s.next_reinstall(true).expect("queued");
        assert_eq!(q, p);
        assert!(matches!(
            l,
            Landed::Map {
                write: true,
                slot: Some(2),
                ..
            }
        ));
        assert_eq!(s.get(p), PageState::Dirty);
        s.check();
    }

    /// A queued reinstall the program freed meanwhile maps nothing, so the pager makes no room
    /// for it; one still wanted does.
    #[test]
    fn a_freed_reinstall_needs_no_room() {
        let mut s = states();
        let (p, q) = (PageIndex(9), PageIndex(10));
        for page in [p, q] {
            s.zero_fill(page, true);
        }
        for (page, slot) in [(p, 1), (q, 2)] {
            assert_eq!(s.take_victim(true), Some(page));
            s.begin_leave(page, slot);
            s.want(page, fill(false));
            assert_eq!(s.stored(page), Landed::Queued);
        }
        assert_eq!(s.free(p), Freed::Later);
        assert!(!s.next_reinstall_maps(), "freed: nothing to map");
        assert_eq!(
            s.next_reinstall(false),
            Some((p, Landed::Released { slot: Some(1) }))
        );
        assert!(s.next_reinstall_maps(), "still wanted");
        assert!(matches!(
            s.next_reinstall(true),
            Some((_, Landed::Map { .. }))
        ));
        assert!(!s.next_reinstall_maps(), "none waiting");
        s.check();
    }

    #[test]
    fn a_wanted_write_back_with_no_room_is_fetched_again() {
        let mut s = states();
        let p = PageIndex(9);
        s.zero_fill(p, true);
        assert_eq!(s.take_victim(true), Some(p));
        s.begin_leave(p, 3);
        s.want(p, fill(false));
        assert_eq!(s.stored(p), Landed::Queued);
        assert!(s.reinstall_waiting());
        assert_eq!(s.local(), 1, "its slot still holds it");
        assert_eq!(
            s.next_reinstall(false),
            Some((p, Landed::Refetch { slot: 3 }))
        );
        assert!(!s.reinstall_waiting());
        assert_eq!(s.get(p), PageState::Remote);
        assert_eq!(s.local(), 0, "neither mapped nor staged");
        s.check();
    }

    #[test]
    fn after_a_fork_clean_pages_are_forked_fetches_remote_and_write_backs_reinstalled() {
        let mut s = states();
        // fifo evicts in address order: the victims below are taken lowest first.
        let [zero, dirty, leaving, clean, filling, freed_filling, pinned] =
            [1, 2, 3, 4, 5, 6, 7].map(PageIndex);
        s.zero_fill(zero, false);
        s.zero_fill(dirty, true);
        s.zero_fill(pinned, false);
        assert!(s.lock([pinned].into_iter()).is_some());
        s.zero_fill(leaving, true);
        // Make `clean` Clean: written, evicted, fetched back.
        s.zero_fill(clean, true);
        for v in [zero, dirty, leaving, clean] {
            assert_eq!(s.take_victim(true), Some(v));
            if v == zero {
                s.dropped(v);
                s.zero_fill(zero, false);
            } else {
                s.begin_leave(v, v.0 as u32);
                if v != leaving {
                    s.stored(v);
                }
            }
        }
        s.begin_fill(clean, fill(false));
        s.fetched(clean);
        s.begin_fill(dirty, fill(true));
        s.fetched(dirty);
        for p in [filling, freed_filling] {
            // Remote, as after a write-back (the policy never held them).
            for to in [PageState::Dirty, PageState::Leaving, PageState::Remote] {
                s.table.transition(p, to);
            }
            s.begin_fill(p, fill(false));
        }
        assert_eq!(s.free(freed_filling), Freed::Later);
        s.after_fork(Instant::now());
        assert_eq!(s.get(clean), PageState::ForkedClean);
        assert_eq!(s.get(zero), PageState::ForkedZero);
        assert_eq!(s.get(dirty), PageState::Dirty);
        assert_eq!(s.get(pinned), PageState::Dirty, "pinned pages are dirty");
        assert_eq!(s.get(filling), PageState::Remote);
        assert_eq!(s.get(freed_filling), PageState::Untouched);
        assert_eq!(s.get(leaving), PageState::LeavingWanted);
        // Mapped: clean, zero, dirty, pinned; staged: leaving.
        assert_eq!((s.resident(), s.local()), (4, 5));
        // Mapped from its slot even with no room: the parent's write-back may not have
        // reached the child's snapshot, so the server copy cannot be fetched instead.
        let (q, l) = s.next_reinstall(false).expect("the staged page");
        assert_eq!(q, leaving);
        assert!(matches!(
            l,
            Landed::Map {
                write: true,
                slot: Some(3),
                ..
            }
        ));
        // Every mapped page, the formerly pinned one too, may be evicted now.
        let mut victims = Vec::new();
        while let Some(v) = s.take_victim(true) {
            victims.push(v);
        }
        victims.sort_unstable();
        assert_eq!(victims, vec![zero, dirty, leaving, clean, pinned]);
        s.dropped(clean);
        s.dropped(zero);
        assert_eq!(
            (s.get(clean), s.get(zero)),
            (PageState::Remote, PageState::Untouched)
        );
    }

    fn piece(i: u8) -> Fill {
        Fill {
            piece: Some(i),
            ..fill(false)
        }
    }

    /// A remote page, as after a write-back.
    fn remote(s: &mut PageStates, p: PageIndex) {
        s.zero_fill(p, true);
        assert_eq!(s.take_victim(true), Some(p));
        s.begin_leave(p, 0);
        assert_eq!(s.stored(p), Landed::Remote { slot: 0 });
    }

    #[test]
    fn pieces_count_against_the_budget_by_the_piece_until_the_page_comes_whole() {
        let mut s = states();
        s.set_pieces(16);
        let (a, b) = (PageIndex(1), PageIndex(2));
        remote(&mut s, a);
        remote(&mut s, b);
        assert_eq!(s.local(), 0);
        s.begin_fill(a, piece(3));
        assert_eq!(s.local(), 1, "one piece in flight rounds up to a page");
        assert!(matches!(s.fetched(a), Landed::Piece { piece: 3, .. }));
        assert_eq!((s.get(a), s.present(a)), (PageState::Partial, 1 << 3));
        s.begin_fill(b, piece(0));
        s.fetched(b);
        assert_eq!(s.local(), 1, "two pieces of two pages are one page's worth");
        s.check();
        // A second piece: out of the policy while in flight.
        s.begin_fill(a, piece(9));
        assert_eq!(
            s.take_victim(true),
            Some(b),
            "the page in flight is no victim"
        );
        s.dropped(b);
        assert_eq!((s.get(b), s.present(b)), (PageState::Remote, 0));
        s.fetched(a);
        assert_eq!(s.present(a), (1 << 3) | (1 << 9));
        assert_eq!(s.last_piece(a).map(|(l, _)| l), Some(9));
        s.check();
        // Fetched whole: mapped around the two pieces, a whole page from then on.
        s.begin_fill(a, fill(true));
        assert_eq!(s.local(), 1);
        match s.fetched(a) {
            Landed::Map {
                write: true,
                present,
                ..
            } => assert_eq!(present, (1 << 3) | (1 << 9)),
            l => panic!("{l:?}"),
        }
        assert_eq!((s.get(a), s.present(a)), (PageState::Dirty, 0));
        assert_eq!(s.local(), 1);
        s.check();
    }

    #[test]
    fn a_partial_page_freed_keeps_no_pieces() {
        let mut s = states();
        s.set_pieces(16);
        let (a, b, c) = (PageIndex(1), PageIndex(2), PageIndex(3));
        for p in [a, b, c] {
            remote(&mut s, p);
            s.begin_fill(p, piece(1));
            s.fetched(p);
        }
        assert_eq!(s.free(a), Freed::Remote);
        assert_eq!((s.get(a), s.present(a)), (PageState::Untouched, 0));
        // Freed with a piece in flight: untouched when it lands.
        s.begin_fill(b, piece(2));
        assert_eq!(s.free(b), Freed::Later);
        assert_eq!(s.fetched(b), Landed::Released { slot: None });
        assert_eq!(s.local(), 1, "c's piece");
        s.check();
    }

    /// A fork child keeps every piece mapped at the fork, written (its writes to them are
    /// unseen, and the parent's may not be on the servers): partial pages stay partial, and so
    /// do pages whose fetch (the parent's) was in flight where they held pieces; a page whose
    /// first piece was on its way is remote. Each leaves with its pieces written alone.
    #[test]
    fn a_fork_child_keeps_the_pieces_mapped_at_the_fork_as_written() {
        let mut s = states();
        s.set_pieces(16);
        let (a, b, c, d, e) = (
            PageIndex(1),
            PageIndex(2),
            PageIndex(3),
            PageIndex(4),
            PageIndex(5),
        );
        for p in [a, b, c, d, e] {
            remote(&mut s, p);
        }
        for p in [a, b, c, d] {
            s.begin_fill(p, piece(1));
            s.fetched(p);
        }
        s.begin_fill(a, piece(6));
        s.fetched(a);
        s.write_piece(a, 6);
        s.begin_fill(b, fill(false)); // fetched whole
        s.begin_fill(c, piece(2)); // one more piece
        s.begin_fill(d, piece(3));
        assert_eq!(s.free(d), Freed::Later); // freed meanwhile
        s.begin_fill(e, piece(0)); // its first piece
        s.check();
        s.after_fork(Instant::now());
        assert_eq!((s.get(a), s.present(a)), (PageState::Partial, 0b100_0010));
        assert_eq!(s.written_pieces(a), 0b100_0010);
        for p in [b, c] {
            assert_eq!((s.get(p), s.present(p)), (PageState::Partial, 0b10));
            assert_eq!(s.written_pieces(p), 0b10);
        }
        assert_eq!((s.get(d), s.present(d)), (PageState::Untouched, 0));
        assert_eq!((s.get(e), s.present(e)), (PageState::Remote, 0));
        assert_eq!((s.resident_units(), s.local()), (4, 1));
        s.check();
        // All three are victims (in the policy), each with written pieces to write alone.
        let mut left = Vec::new();
        while let Some(v) = s.take_victim(true) {
            left.push(v);
            let written = s.written_pieces(v);
            assert_eq!((written & 0b10, s.begin_leave(v, 0)), (0b10, written));
        }
        left.sort_unstable();
        assert_eq!(left, vec![a, b, c]);
        assert!(s.pieces_leaving());
        s.check();
    }

    /// Written pieces: a partial page with some is a victim that needs a slot, leaves with
    /// them alone to write (its slot counts as the pieces it holds, the rest being the zero
    /// page), and wanted meanwhile it is fetched again, never reinstalled from the slot.
    #[test]
    fn a_partial_page_with_written_pieces_leaves_with_them_and_is_fetched_again() {
        let mut s = states();
        s.set_pieces(16);
        let (a, b) = (PageIndex(1), PageIndex(2));
        remote(&mut s, a);
        remote(&mut s, b);
        s.begin_fill(a, piece(2));
        s.fetched(a);
        s.begin_fill(a, piece(5));
        s.fetched(a);
        s.write_piece(a, 5);
        // Fetched for a write: mapped writable and written.
        s.begin_fill(
            b,
            Fill {
                write: true,
                ..piece(7)
            },
        );
        s.fetched(b);
        assert_eq!((s.written_pieces(a), s.written_pieces(b)), (1 << 5, 1 << 7));
        assert!(!s.pieces_leaving());
        assert_eq!(s.local(), 1, "three pieces");
        assert_eq!(
            s.take_victim(false),
            None,
            "no slot, no victim with written pieces"
        );
        // a, declined, went to the back.
        assert_eq!(s.take_victim(true), Some(b));
        assert_eq!(s.begin_leave(b, 0), 1 << 7);
        assert_eq!(s.get(b), PageState::Leaving);
        assert!(s.pieces_leaving());
        assert_eq!(
            (s.resident_units(), s.local()),
            (2, 1),
            "a's two pieces, and b's one in its slot"
        );
        s.check();
        s.want(b, fill(false));
        assert_eq!(s.stored(b), Landed::Refetch { slot: 0 });
        assert!(!s.pieces_leaving());
        assert_eq!((s.get(b), s.present(b)), (PageState::Remote, 0));
        assert_eq!((s.resident_units(), s.local()), (2, 1));
        // A whole fetch over a written piece maps the page dirty.
        s.begin_fill(a, fill(false));
        assert!(matches!(s.fetched(a), Landed::Map { write: true, .. }));
        assert_eq!((s.get(a), s.written_pieces(a)), (PageState::Dirty, 0));
        s.check();
    }

    /// Where pieces cannot be written alone, a partial victim's written pieces wait in its
    /// slot for the rest of the page: then it leaves whole (fetched again if wanted, as a
    /// partial page that left is), or, freed meanwhile, is released.
    #[test]
    fn a_merged_page_leaves_whole() {
        let mut s = states();
        s.set_pieces(16);
        let (a, b) = (PageIndex(1), PageIndex(2));
        for p in [a, b] {
            remote(&mut s, p);
            s.begin_fill(p, piece(3));
            s.fetched(p);
            s.write_piece(p, 3);
        }
        assert_eq!(s.take_victim(true), Some(a));
        assert_eq!(s.begin_leave(a, 0), 1 << 3);
        s.begin_merge(a);
        assert!(s.merging(a) && s.pieces_leaving());
        assert_eq!(
            (s.resident_units(), s.local()),
            (1, 1),
            "b's piece; a's in its slot"
        );
        s.want(a, fill(false));
        assert_eq!(
            s.merged(a),
            Merged::Write {
                slot: 0,
                written: 1 << 3
            }
        );
        assert!(!s.merging(a));
        assert_eq!(s.local(), 2, "a whole in its slot now");
        s.check();
        assert_eq!(s.stored(a), Landed::Refetch { slot: 0 });
        assert_eq!((s.get(a), s.local()), (PageState::Remote, 1));
        // Freed while its rest is on the way: released when it comes.
        assert_eq!(s.take_victim(true), Some(b));
        s.begin_leave(b, 1);
        s.begin_merge(b);
        assert_eq!(s.free(b), Freed::Later);
        assert_eq!(s.merged(b), Merged::Released { slot: 1 });
        assert_eq!(s.get(b), PageState::Untouched);
        assert!(!s.pieces_leaving());
        s.check();
    }

    #[test]
    #[should_panic(expected = "fetched again")]
    fn a_piece_held_is_never_fetched_again() {
        let mut s = states();
        s.set_pieces(16);
        let a = PageIndex(1);
        remote(&mut s, a);
        s.begin_fill(a, piece(4));
        s.fetched(a);
        s.begin_fill(a, piece(4));
    }

    #[test]
    fn a_synced_page_stays_out_of_the_policy_until_it_lands() {
        let mut s = states();
        let (a, b) = (PageIndex(1), PageIndex(2));
        s.zero_fill(a, true);
        s.zero_fill(b, true);
        s.begin_sync(a);
        s.check();
        assert_eq!(
            s.take_victim(true),
            Some(b),
            "a page in flight is never a victim"
        );
        assert_eq!(s.take_victim(true), None);
        s.dirty(a);
        assert_eq!(s.get(a), PageState::SyncingDirty);
        assert_eq!(s.stored(a), Landed::Synced { dirty: true });
        assert_eq!(s.get(a), PageState::Dirty);
        s.begin_sync(a);
        assert_eq!(s.stored(a), Landed::Synced { dirty: false });
        assert_eq!(s.get(a), PageState::Clean);
        s.dirty(a);
        s.begin_sync(a);
        assert_eq!(s.free(a), Freed::Later, "freed with its write in flight");
        assert_eq!(s.stored(a), Landed::Released { slot: None });
        assert_eq!(s.get(a), PageState::Untouched);
        assert_eq!(
            s.local(),
            1,
            "b, the victim taken above, is not evicted yet"
        );
        s.check();
    }
}
