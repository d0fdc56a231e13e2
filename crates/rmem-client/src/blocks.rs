//! The page cache's buffer front end: pages held in plain buffers instead of mapped in a
//! region, for front ends that copy bytes in and out (the block device, `rmem nbd`).
//!
//! [`BlockCache`] drives the same [`PageStates`] (state table, replacement policy, side
//! collections) and the same [`PageStore`] (the cluster layer: placement, redundancy,
//! encryption, failover, repair) and counts into the same [`Stats`] as the pager. Only the
//! memory side of each transition differs: a page's contents are in one of `--cache / page
//! size` buffers, so "map" is a copy into its buffer, "drop" returns the buffer, and a dirty
//! victim's buffer is its own staging slot until its write-back lands (reads are served from
//! it meanwhile).
//!
//! Every operation is non-blocking: it does what it can now and answers [`Step::Wait`] when
//! the page is in flight or no buffer is free yet; the caller retries after
//! [`BlockCache::poll`] reports progress. What an operation asks of the servers goes out at
//! the next [`BlockCache::flush`] or [`BlockCache::poll`]: the fetches of a large request
//! leave in one write, not in one system call each. Durability is asked with barriers:
//! [`BlockCache::sync`] starts the write-back of every dirty page of a range (the pages stay
//! cached, `Syncing`) and returns a [`Barrier`], which [`BlockCache::poll`] reports done once
//! every write applied before it is on the servers, with the store's redundancy. That takes
//! two steps: the write-backs it waits for land (the store tells them stored, and their
//! buffers are free), then the store says they are *settled* ([`PageStore::settled`]): a
//! write-back whose piece waits on a slow server is told stored once the page can be read
//! from its other pieces, so that a hung server does not hold the cache's buffers (and with
//! them every request), but a barrier still waits for that piece.

use crate::pages::PageState;
use crate::state::{Fill, Freed, Landed, PageStates};
use crate::stats::Stats;
use crate::store::{Completion, PageStore, StoreError};
use crate::PageIndex;
use rmem_policy::Policy;
use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// What an operation on one page did.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Done: the bytes were copied.
    Done,
    /// Not yet: the page is in flight or no buffer was free; what it needs was started. Retry
    /// after [`BlockCache::poll`] reports progress.
    Wait,
}

/// A request for durability: done when every write applied before it is on the servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Barrier(u64);

/// A barrier waits for `landings` more write-backs of one page to land.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    barrier: Barrier,
    landings: u8,
}

/// Everything but the store, so that the store's completion callback can update it.
struct Cache {
    states: PageStates,
    page_size: usize,
    buffers: Vec<u8>,
    free: Vec<u32>,
    buffer_of: HashMap<PageIndex, u32>,
    /// Pages whose landing barriers wait for.
    waiters: HashMap<PageIndex, Vec<Waiter>>,
    /// Barriers not done, and how many pages each still waits for.
    barriers: HashMap<Barrier, usize>,
    /// Barriers whose pages all landed, waiting for the store to settle the write-backs
    /// started before the mark taken then ([`PageStore::write_mark`]; None: not taken yet).
    settling: Vec<(Barrier, Option<u64>)>,
    done: Vec<Barrier>,
    next_barrier: u64,
    /// Pages that landed in this poll (for their waiters).
    landed: Vec<PageIndex>,
    /// Server copies to forget (pages freed while in flight).
    frees: Vec<PageIndex>,
    /// Every page written and not yet seen clean: a superset of the pages a barrier may wait
    /// for (written, or with a write-back in flight), kept so that a FLUSH visits what was
    /// written since the last one rather than every page of the cache. A page leaves it when
    /// its write-back lands with nothing newer to write, or when [`BlockCache::sync`] finds
    /// it so.
    written: BTreeSet<PageIndex>,
    stats: Arc<Stats>,
}

/// Pages of a block device cached in buffers over a page store.
pub struct BlockCache {
    store: Box<dyn PageStore>,
    c: Cache,
    /// Free buffers, plus write-backs that will free one, the evictor keeps ahead of need.
    evict_ahead: usize,
}

impl Cache {
    fn buf(&self, b: u32) -> &[u8] {
        let ps = self.page_size;
        &self.buffers[b as usize * ps..(b as usize + 1) * ps]
    }

    fn buf_mut(&mut self, b: u32) -> &mut [u8] {
        let ps = self.page_size;
        &mut self.buffers[b as usize * ps..(b as usize + 1) * ps]
    }

    fn release(&mut self, page: PageIndex) {
        let b = self
            .buffer_of
            .remove(&page)
            .expect("a local page has a buffer");
        self.free.push(b);
    }

    /// A store operation finished: the cache side of what it means.
    fn complete(&mut self, c: Completion<'_>) {
        match c {
            Completion::Fetched { page, data } => {
                let fill = self.states.fill_mut(page).t0;
                match self.states.fetched(page) {
                    Landed::Map { .. } => {
                        let b = self.buffer_of[&page];
                        rmem_copy::copy(self.buf_mut(b), data);
                        Stats::add(&self.stats.swap_ins, 1);
                        Stats::add(&self.stats.bytes_fetched, self.page_size as u64);
                        Stats::add(&self.stats.faults, 1);
                        self.stats.record_fault(fill.elapsed());
                    }
                    Landed::Released { .. } => {
                        self.release(page);
                        self.frees.push(page);
                    }
                    l => unreachable!("a fetch landed as {l:?}"),
                }
            }
            Completion::Stored { page } => {
                match self.states.stored(page) {
                    Landed::Remote { .. } => self.release(page),
                    Landed::Released { .. } => {
                        self.release(page);
                        self.frees.push(page);
                    }
                    // Queued: reinstalled from its own buffer after the poll. Synced: it stays.
                    Landed::Queued | Landed::Synced { .. } => {}
                    l => unreachable!("a write-back landed as {l:?}"),
                }
                if !self.states.get(page).holds_a_write() {
                    // On the servers now (a barrier's mark covers a write-back told stored but
                    // not settled): `written` stays within the pages the cache holds, FLUSH or
                    // not.
                    self.written.remove(&page);
                }
                self.landed.push(page);
            }
        }
    }

    fn finish(&mut self, barrier: Barrier) {
        let left = self
            .barriers
            .get_mut(&barrier)
            .expect("a waiting barrier is known");
        *left -= 1;
        if *left == 0 {
            self.barriers.remove(&barrier);
            self.settling.push((barrier, None));
        }
    }
}

impl BlockCache {
    /// A cache of `cache_bytes` of pages of `page_size` over `store`, evicting by `policy`.
    /// The buffers are allocated at once but zero-filled by the kernel only as they are used.
    pub fn new(
        store: Box<dyn PageStore>,
        policy: Box<dyn Policy>,
        page_size: usize,
        cache_bytes: u64,
        stats: Arc<Stats>,
    ) -> BlockCache {
        let n = (cache_bytes / page_size as u64) as usize;
        assert!(n >= 4, "the cache must hold at least 4 pages");
        assert!(n <= u32::MAX as usize, "too many cache pages");
        if let Some(c) = store.counters() {
            let layout = c.layout.clone();
            let _ = stats.store.set((c, layout));
        }
        BlockCache {
            store,
            c: Cache {
                states: PageStates::new(policy, 0),
                page_size,
                buffers: vec![0; n * page_size],
                free: (0..n as u32).rev().collect(),
                buffer_of: HashMap::new(),
                waiters: HashMap::new(),
                barriers: HashMap::new(),
                settling: Vec::new(),
                done: Vec::new(),
                next_barrier: 0,
                landed: Vec::new(),
                frees: Vec::new(),
                written: BTreeSet::new(),
                stats,
            },
            evict_ahead: (n / 64).clamp(1, 256),
        }
    }

    pub fn page_size(&self) -> usize {
        self.c.page_size
    }

    /// Pages held in buffers (cached, in flight or staged).
    pub fn local_pages(&self) -> u64 {
        self.c.states.local()
    }

    /// The state of `page` (for tests and messages).
    pub fn state(&self, page: PageIndex) -> PageState {
        self.c.states.get(page)
    }

    /// Copy `out.len()` bytes of `page` from byte `off` into `out`.
    pub fn read(
        &mut self,
        page: PageIndex,
        off: usize,
        out: &mut [u8],
    ) -> Result<Step, StoreError> {
        debug_assert!(off + out.len() <= self.c.page_size);
        match self.c.states.get(page) {
            PageState::Untouched => out.fill(0),
            PageState::Remote => {
                self.fetch(page, false)?;
                return Ok(Step::Wait);
            }
            PageState::Filling => return Ok(Step::Wait),
            // Resident, or staged or syncing: its buffer holds what the servers will hold.
            s => {
                if s.is_mapped() {
                    self.c.states.hit(page);
                }
                let b = self.c.buffer_of[&page];
                rmem_copy::copy(out, &self.c.buf(b)[off..off + out.len()]);
            }
        }
        Ok(Step::Done)
    }

    /// Copy `data` into `page` from byte `off`.
    pub fn write(&mut self, page: PageIndex, off: usize, data: &[u8]) -> Result<Step, StoreError> {
        let step = self.write_page(page, off, data)?;
        if step == Step::Done {
            // Every page with a write a barrier must cover passes here.
            self.c.written.insert(page);
        }
        Ok(step)
    }

    fn write_page(&mut self, page: PageIndex, off: usize, data: &[u8]) -> Result<Step, StoreError> {
        let ps = self.c.page_size;
        debug_assert!(off + data.len() <= ps);
        let whole = off == 0 && data.len() == ps;
        let b = match self.c.states.get(page) {
            PageState::Untouched => {
                let Some(b) = self.take_buffer()? else {
                    return Ok(Step::Wait);
                };
                self.c.states.missed(page);
                let writable = self.c.states.zero_fill(page, true);
                debug_assert!(writable);
                self.c.buffer_of.insert(page, b);
                if !whole {
                    self.c.buf_mut(b).fill(0);
                }
                Stats::add(&self.c.stats.zero_fills, 1);
                b
            }
            PageState::Remote if whole => {
                // Its old contents do not matter: forget them rather than fetch them.
                let freed = self.c.states.free(page);
                debug_assert_eq!(freed, Freed::Remote);
                self.store.free(page)?;
                return self.write(page, off, data);
            }
            PageState::Remote => {
                self.fetch(page, true)?;
                return Ok(Step::Wait);
            }
            PageState::Filling | PageState::LeavingWanted => return Ok(Step::Wait),
            PageState::Leaving => {
                // Reinstalled from its buffer when the write-back lands, not fetched again.
                self.c.states.want(
                    page,
                    Fill {
                        write: true,
                        t0: Instant::now(),
                        prefetched: false,
                        piece: None,
                    },
                );
                return Ok(Step::Wait);
            }
            PageState::ZeroClean | PageState::Clean | PageState::Syncing => {
                // A syncing page's write in flight was copied when it was sent: the buffer
                // may change now.
                self.c.states.hit(page);
                self.c.states.dirty(page);
                self.c.buffer_of[&page]
            }
            PageState::Dirty => {
                self.c.states.hit(page);
                self.c.buffer_of[&page]
            }
            PageState::SyncingDirty => self.c.buffer_of[&page],
            PageState::ForkedClean | PageState::ForkedZero | PageState::Partial => {
                unreachable!(
                    "page {} forked or partial: the block cache never forks or maps pieces",
                    page.0
                )
            }
        };
        rmem_copy::copy(&mut self.c.buf_mut(b)[off..off + data.len()], data);
        Ok(Step::Done)
    }

    /// Zero `len` bytes of `page` from `off`. A whole page is freed (it reads as zeros and
    /// holds nothing anywhere); a part is written with zeros, or left alone if `advisory` (a
    /// trim, which may keep the old contents).
    pub fn zero(
        &mut self,
        page: PageIndex,
        off: usize,
        len: usize,
        advisory: bool,
    ) -> Result<Step, StoreError> {
        let ps = self.c.page_size;
        if off != 0 || len != ps {
            if advisory {
                return Ok(Step::Done);
            }
            let zeros = vec![0u8; len];
            return self.write(page, off, &zeros);
        }
        match self.c.states.get(page) {
            PageState::Untouched => {}
            PageState::Remote => {
                let _ = self.c.states.free(page);
                self.store.free(page)?;
            }
            PageState::ZeroClean | PageState::Clean | PageState::Dirty => {
                let freed = self.c.states.free(page);
                debug_assert_eq!(freed, Freed::Remote);
                self.c.release(page);
                self.store.free(page)?;
            }
            // In flight: freed once it lands (it is retried then).
            PageState::Filling
            | PageState::Leaving
            | PageState::LeavingWanted
            | PageState::Syncing
            | PageState::SyncingDirty => return Ok(Step::Wait),
            PageState::ForkedClean | PageState::ForkedZero | PageState::Partial => {
                unreachable!(
                    "page {} forked or partial: the block cache never forks or maps pieces",
                    page.0
                )
            }
        }
        Ok(Step::Done)
    }

    /// Start writing back every dirty page of `pages` (every page cached if None); the
    /// barrier is done when every write applied before this call is on the servers.
    pub fn sync(&mut self, pages: Option<Range<u64>>) -> Result<Barrier, StoreError> {
        let id = Barrier(self.c.next_barrier);
        self.c.next_barrier += 1;
        let written = &self.c.written;
        let list: Vec<PageIndex> = match pages {
            Some(r) if r.end <= r.start => Vec::new(),
            Some(r) => written
                .range(PageIndex(r.start)..PageIndex(r.end))
                .copied()
                .collect(),
            None => written.iter().copied().collect(),
        };
        let mut count = 0;
        for p in list {
            let landings = match self.c.states.get(p) {
                PageState::Dirty => {
                    self.start_sync(p)?;
                    1
                }
                // The write in flight holds everything applied so far.
                PageState::Syncing | PageState::Leaving | PageState::LeavingWanted => 1,
                // Written since its write-back left: that one, then another.
                PageState::SyncingDirty => 2,
                // Nothing of it to wait for: a later barrier need not look at it again.
                s => {
                    debug_assert!(!s.holds_a_write());
                    self.c.written.remove(&p);
                    0
                }
            };
            if landings > 0 {
                self.c.waiters.entry(p).or_default().push(Waiter {
                    barrier: id,
                    landings,
                });
                count += 1;
            }
        }
        if count == 0 {
            self.c.settling.push((id, None));
            self.settle();
        } else {
            self.c.barriers.insert(id, count);
        }
        Ok(id)
    }

    /// Barriers whose write-backs all landed are done once the store settles them.
    fn settle(&mut self) {
        let store = &self.store;
        self.c.settling.retain_mut(|(b, mark)| {
            let m = *mark.get_or_insert_with(|| store.write_mark());
            if store.settled(m) {
                self.c.done.push(*b);
                false
            } else {
                true
            }
        });
    }

    fn start_sync(&mut self, page: PageIndex) -> Result<(), StoreError> {
        self.c.states.begin_sync(page);
        let b = self.c.buffer_of[&page];
        Stats::add(&self.c.stats.swap_outs, 1);
        Stats::add(&self.c.stats.bytes_written_back, self.c.page_size as u64);
        self.store.store(page, self.c.buf(b))
    }

    /// Barriers that became done since the last call.
    pub fn take_done(&mut self, out: &mut Vec<Barrier>) {
        out.append(&mut self.c.done);
    }

    /// Start fetching a remote page into a free buffer, if one can be had.
    fn fetch(&mut self, page: PageIndex, write: bool) -> Result<(), StoreError> {
        let Some(b) = self.take_buffer()? else {
            return Ok(());
        };
        self.c.states.missed(page);
        self.c.states.begin_fill(
            page,
            Fill {
                write,
                t0: Instant::now(),
                prefetched: false,
                piece: None,
            },
        );
        self.c.buffer_of.insert(page, b);
        self.store.fetch(page)
    }

    /// A free buffer, evicting for it: clean victims give theirs back at once, dirty ones when
    /// their write-back lands. Keeps `evict_ahead` buffers free or coming, so a burst of
    /// misses does not wait for a round trip per page, and no more: with every buffer free or
    /// coming taken, the caller waits for a write-back to land. (Evicting until a buffer is
    /// free, as it once did, wrote back the whole cache whenever every victim was dirty,
    /// pages that waiting requests wanted included; with more requests than the cache holds
    /// they were evicted again before they were written, and the device stopped answering.)
    fn take_buffer(&mut self) -> Result<Option<u32>, StoreError> {
        while self.c.free.len() + self.c.states.leaving() < self.evict_ahead {
            let Some(v) = self.c.states.take_victim(true) else {
                break;
            };
            Stats::add(&self.c.stats.evictions, 1);
            if self.c.states.get(v) == PageState::Dirty {
                let b = self.c.buffer_of[&v];
                self.c.states.begin_leave(v, b);
                Stats::add(&self.c.stats.swap_outs, 1);
                Stats::add(&self.c.stats.bytes_written_back, self.c.page_size as u64);
                self.store.store(v, self.c.buf(b))?;
            } else {
                self.c.states.dropped(v);
                self.c.release(v);
            }
        }
        let b = self.c.free.pop();
        self.c
            .stats
            .set_local_bytes(self.c.states.local() * self.c.page_size as u64);
        Ok(b)
    }

    /// Take what the store finished. True if anything landed (blocked operations may go on).
    pub fn poll(&mut self) -> Result<bool, StoreError> {
        let c = &mut self.c;
        let n = self.store.poll(&mut |done| c.complete(done))?;
        let mut progress = n > 0;
        while let Some((page, landed)) = self.c.states.next_reinstall(true) {
            progress = true;
            match landed {
                // Its buffer is its staging slot: nothing to copy.
                Landed::Map { .. } => {}
                Landed::Released { .. } => {
                    self.c.release(page);
                    self.c.frees.push(page);
                }
                l => unreachable!("a reinstall landed as {l:?}"),
            }
        }
        for page in std::mem::take(&mut self.c.frees) {
            self.store.free(page)?;
        }
        let landed = std::mem::take(&mut self.c.landed);
        for page in landed.iter().copied() {
            let Some(mut ws) = self.c.waiters.remove(&page) else {
                continue;
            };
            let gone = self.c.states.get(page) == PageState::Untouched;
            ws.retain_mut(|w| {
                w.landings -= 1;
                if w.landings == 0 || gone {
                    self.c.finish(w.barrier);
                    false
                } else {
                    true
                }
            });
            if !ws.is_empty() {
                // Written while its last write-back was in flight: the barrier needs another.
                if self.c.states.get(page) == PageState::Dirty {
                    self.start_sync(page)?;
                }
                self.c.waiters.insert(page, ws);
            }
        }
        self.c.landed = landed;
        self.c.landed.clear();
        // Not progress for the requests waiting on pages: a released write-back's last piece
        // settles with no completion.
        self.settle();
        if progress {
            self.c.states.check();
            self.c
                .stats
                .set_local_bytes(self.c.states.local() * self.c.page_size as u64);
        }
        Ok(progress)
    }

    /// Push requests out to the servers.
    pub fn flush(&mut self) -> Result<(), StoreError> {
        self.store.flush()
    }

    /// Operations in flight in the store.
    pub fn in_flight(&self) -> usize {
        self.store.in_flight()
    }

    /// Descriptors to wait on (the store's links).
    pub fn wait_fds(&self, out: &mut Vec<libc::pollfd>) {
        self.store.wait_fds(out)
    }

    /// Whether the store has completions for the next [`BlockCache::poll`] that no
    /// descriptor of [`BlockCache::wait_fds`] announces ([`PageStore::ready`]).
    pub fn ready(&self) -> bool {
        self.store.ready()
    }

    /// Periodic upkeep of the store (heartbeats, deadlines, repair).
    pub fn tick(&mut self, now: Instant) -> Result<(), StoreError> {
        self.store.tick(now)
    }

    /// How often the store wants [`BlockCache::tick`].
    pub fn heartbeat(&self) -> Option<std::time::Duration> {
        self.store.heartbeat()
    }

    /// One line naming the servers.
    pub fn describe(&self) -> String {
        self.store.describe()
    }

    /// One line on what the cache and the store hold and wait for, for stall reports.
    pub fn describe_in_flight(&self) -> String {
        format!(
            "cache: {}, free buffers {}, barriers waiting {} on {} pages and {} on slow \
             servers' pieces; {}",
            self.c.states.describe(),
            self.c.free.len(),
            self.c.barriers.len(),
            self.c.waiters.len(),
            self.c.settling.len(),
            self.store.describe_in_flight()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;

    const PS: usize = 4096;

    fn cache(pages: u64) -> (BlockCache, Arc<Stats>) {
        let stats = Arc::new(Stats::default());
        let store = MemStore::new(PS, 1 << 30);
        let c = BlockCache::new(
            Box::new(store),
            rmem_policy::by_name("fifo").expect("fifo"),
            PS,
            pages * PS as u64,
            stats.clone(),
        );
        (c, stats)
    }

    /// Retry `f` with polls in between until it is done.
    fn until_done(c: &mut BlockCache, mut f: impl FnMut(&mut BlockCache) -> Step) {
        for _ in 0..10_000 {
            if f(c) == Step::Done {
                return;
            }
            c.flush().unwrap();
            let _ = c.poll().unwrap();
        }
        panic!("never done");
    }

    fn fill(page: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (page as usize * 31 + i * 7) as u8)
            .collect()
    }

    /// A store with answers that no descriptor announces (the in-process one has no
    /// descriptors at all) says so, so that a front end does not sleep on them (the NBD
    /// server slept up to 100 ms per answer over it).
    #[test]
    fn answers_no_descriptor_announces_are_ready() {
        let (mut c, _) = cache(4);
        assert!(!c.ready(), "nothing asked yet");
        let data = fill(0, PS);
        for p in 0..5 {
            let _ = c.write(PageIndex(p), 0, &data).unwrap();
        }
        c.flush().unwrap();
        // The fifth page's buffer waits for the first page's write-back.
        assert!(c.ready(), "a write-back is done and waits for poll");
        let mut fds = Vec::new();
        c.wait_fds(&mut fds);
        assert!(fds.is_empty(), "the in-process store has no descriptors");
        assert!(c.poll().unwrap());
        assert!(!c.ready(), "poll took every answer");
    }

    #[test]
    fn pages_beyond_the_cache_come_back_from_the_store() {
        let (mut c, stats) = cache(8);
        for p in 0..64 {
            let data = fill(p, PS);
            until_done(&mut c, |c| c.write(PageIndex(p), 0, &data).unwrap());
        }
        assert!(c.local_pages() <= 8);
        for p in (0..64).rev() {
            let mut out = vec![0xAA; 100];
            until_done(&mut c, |c| c.read(PageIndex(p), 10, &mut out).unwrap());
            assert_eq!(out, fill(p, PS)[10..110], "page {p}");
        }
        let mut out = vec![0xAA; PS];
        until_done(&mut c, |c| c.read(PageIndex(1000), 0, &mut out).unwrap());
        assert!(
            out.iter().all(|&b| b == 0),
            "an unwritten page reads as zeros"
        );
        assert!(stats.swap_ins.load(std::sync::atomic::Ordering::Relaxed) > 0);
    }

    #[test]
    fn a_partial_write_keeps_the_rest_of_a_remote_page() {
        let (mut c, _) = cache(4);
        for p in 0..16 {
            let data = fill(p, PS);
            until_done(&mut c, |c| c.write(PageIndex(p), 0, &data).unwrap());
        }
        until_done(&mut c, |c| c.write(PageIndex(0), 100, &[1, 2, 3]).unwrap());
        let mut out = vec![0; PS];
        until_done(&mut c, |c| c.read(PageIndex(0), 0, &mut out).unwrap());
        let mut want = fill(0, PS);
        want[100..103].copy_from_slice(&[1, 2, 3]);
        assert_eq!(out, want);
    }

    #[test]
    fn a_barrier_waits_for_every_dirty_page_and_zeroed_pages_read_zero() {
        let (mut c, _) = cache(16);
        for p in 0..8 {
            let data = fill(p, PS);
            until_done(&mut c, |c| c.write(PageIndex(p), 0, &data).unwrap());
        }
        let b = c.sync(None).unwrap();
        // Written again while its write-back is in flight: the barrier still completes.
        until_done(&mut c, |c| c.write(PageIndex(3), 0, &[9; 10]).unwrap());
        assert_eq!(c.state(PageIndex(3)), PageState::SyncingDirty);
        let mut done = Vec::new();
        for _ in 0..1000 {
            c.flush().unwrap();
            let _ = c.poll().unwrap();
            c.take_done(&mut done);
            if !done.is_empty() {
                break;
            }
        }
        assert_eq!(done, vec![b]);
        assert_eq!(c.state(PageIndex(0)), PageState::Clean);
        assert_eq!(c.state(PageIndex(3)), PageState::Dirty);
        until_done(&mut c, |c| c.zero(PageIndex(2), 0, PS, false).unwrap());
        assert_eq!(c.state(PageIndex(2)), PageState::Untouched);
        let mut out = vec![1; PS];
        until_done(&mut c, |c| c.read(PageIndex(2), 0, &mut out).unwrap());
        assert!(out.iter().all(|&b| b == 0));
        let b2 = c.sync(Some(0..2)).unwrap();
        c.take_done(&mut done);
        assert!(done.contains(&b2), "nothing dirty there: done at once");
    }

    /// Polls until `b` is done; how many polls that took.
    fn wait_barrier(c: &mut BlockCache, b: Barrier) -> usize {
        let mut done = Vec::new();
        for polls in 0..1000 {
            c.take_done(&mut done);
            if done.contains(&b) {
                return polls;
            }
            c.flush().unwrap();
            let _ = c.poll().unwrap();
        }
        panic!("barrier {b:?} never done");
    }

    /// A barrier visits the pages written and not yet on the servers, not every page of the
    /// cache (a FLUSH over a large cache walked all of it: 107 fsyncs a second
    /// over a full 1 GiB cache against 8,520 over 16 MiB), and still waits for every write:
    /// dirty victims whose write-back has not landed included.
    #[test]
    fn a_barrier_visits_only_what_was_written_since_and_waits_for_all_of_it() {
        let (mut c, _) = cache(8);
        for p in 0..8 {
            until_done(&mut c, |c| c.write(PageIndex(p), 0, &fill(p, PS)).unwrap());
        }
        let b = c.sync(None).unwrap();
        assert!(wait_barrier(&mut c, b) > 0, "eight write-backs to wait for");
        assert!(c.c.written.is_empty(), "landed clean: not visited again");
        let b = c.sync(None).unwrap();
        assert_eq!(wait_barrier(&mut c, b), 0, "all clean: done at once");

        // Written again, then pushed out by new pages: dirty victims in flight.
        for p in 0..8 {
            until_done(&mut c, |c| {
                c.write(PageIndex(p), 0, &fill(p + 50, PS)).unwrap()
            });
        }
        for p in 8..10 {
            let _ = c.write(PageIndex(p), 0, &fill(p + 50, PS)).unwrap();
        }
        let leaving: Vec<u64> = (0..8)
            .filter(|&p| c.state(PageIndex(p)) == PageState::Leaving)
            .collect();
        assert!(!leaving.is_empty(), "no dirty victim in flight");
        let b = c.sync(None).unwrap();
        assert!(
            wait_barrier(&mut c, b) > 0,
            "the victims' write-backs to wait for"
        );
        for p in 8..10 {
            until_done(&mut c, |c| {
                c.write(PageIndex(p), 0, &fill(p + 50, PS)).unwrap()
            });
        }
        let b = c.sync(Some(8..10)).unwrap();
        wait_barrier(&mut c, b);
        // Without a FLUSH, pages written back by eviction leave the set as they land: it
        // stays within what the cache holds.
        for p in 100..200 {
            until_done(&mut c, |c| c.write(PageIndex(p), 0, &fill(p, PS)).unwrap());
        }
        assert!(
            c.c.written.len() <= 8,
            "{} pages in the set",
            c.c.written.len()
        );
        assert_eq!(c.c.written.range(PageIndex(8)..PageIndex(10)).count(), 0);
        for p in 0..10 {
            let mut out = vec![0; PS];
            until_done(&mut c, |c| c.read(PageIndex(p), 0, &mut out).unwrap());
            assert_eq!(out, fill(p + 50, PS), "page {p}");
        }
    }

    /// Requests that together want more pages than the cache holds, retried in order after
    /// each poll as the block device does: each pass evicts only what one buffer needs, so
    /// the pages a later request waits for are not written back again before it writes them,
    /// and every request finishes. (Evicting the whole cache for one buffer once turned this
    /// into a loop writing the same pages back forever.)
    #[test]
    fn requests_wanting_more_than_the_cache_all_finish() {
        let (mut c, stats) = cache(4);
        for p in 0..4 {
            let data = fill(p, PS);
            until_done(&mut c, |c| c.write(PageIndex(p), 0, &data).unwrap());
        }
        // The first wants a page not in the cache, the second the four that are.
        let mut requests: Vec<Vec<u64>> = vec![vec![10], vec![0, 1, 2, 3]];
        let mut passes = 0;
        while requests.iter().any(|r| !r.is_empty()) {
            passes += 1;
            assert!(passes < 100, "never finished: {requests:?}");
            for r in &mut requests {
                r.retain(|&p| {
                    let data = fill(p + 100, PS);
                    c.write(PageIndex(p), 0, &data).unwrap() == Step::Wait
                });
            }
            c.flush().unwrap();
            let _ = c.poll().unwrap();
        }
        let written = stats
            .bytes_written_back
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            written <= 4 * PS as u64,
            "{} pages written back for one new page",
            written / PS as u64
        );
        for p in [0, 1, 2, 3, 10] {
            let mut out = vec![0; PS];
            until_done(&mut c, |c| c.read(PageIndex(p), 0, &mut out).unwrap());
            assert_eq!(out, fill(p + 100, PS), "page {p}");
        }
    }
}
