//! A region's pieces served through a page store: for layouts a server cannot read or patch a
//! byte range of (a page sealed by encryption or the checksums of replicas, or erasure-coded),
//! and for a pool's servers, which come and go.
//!
//! The store ([`crate::store::cluster::RemoteStore`], the pager's) owns placement, redundancy,
//! the seals, failover and repair; this keeps only what a region adds: which pages were ever
//! written (the others read as zeros, with no request) and one page's work at a time. A page's
//! work takes every piece queued for it, in order: a read is answered from the page's bytes as
//! they are at its turn, a write patches them, and the page is stored again whole if any
//! piece wrote (read first unless it was never written or is written whole). Pieces for a page
//! at work wait for it; so two threads writing different bytes of one page never lose one
//! another's write, and a fetch never overtakes the store of the same page.
//!
//! A read alone is a part read where the store has them: the range itself where pages are
//! kept as they are, or the one 4 KiB piece holding it where pages are sealed by the piece.

use super::{answer_read, Backend, Piece, RegionError, RegionStats};
use crate::store::{Completion, PageStore, StoreError};
use crate::PageIndex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// What a page at work waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Its bytes: the whole page (or none to read: never written, or written whole).
    Page,
    /// Bytes from this offset, for its one read.
    Part(u32),
    /// Its store, for the writes' answers.
    Stored,
}

/// One page's work: its pieces, in the order they were queued, and its bytes.
struct Work {
    pieces: Vec<Piece>,
    buf: Vec<u8>,
    stage: Stage,
}

/// A region's pages in a page store (module doc).
pub(super) struct Paged {
    store: Box<dyn PageStore>,
    page_size: usize,
    /// Pages stored at least once; the others are zeros.
    written: HashSet<u64>,
    /// Pages at work.
    work: HashMap<u64, Work>,
    /// Pieces waiting for their page's work to end, by page.
    queued: HashMap<u64, VecDeque<Piece>>,
    /// Page buffers to reuse.
    spare: Vec<Vec<u8>>,
    /// Pages whose bytes are in: to answer, patch and store.
    landed: Vec<u64>,
    /// Pages whose work is over (their store or their one part read came in).
    ended: Vec<u64>,
}

/// The bytes a part read asks for to answer `len` bytes at `offset` of a page, or none (the
/// whole page then): the range itself where `exact` (pages kept as they are), else the one
/// 4 KiB piece holding it (pages sealed by the piece), if one does.
fn part_of(offset: u32, len: u32, exact: bool) -> Option<(u32, u32)> {
    const PIECE: u32 = rmem_uffd::PIECE as u32;
    if exact {
        return Some((offset, len));
    }
    let base = offset / PIECE * PIECE;
    (offset + len <= base + PIECE).then_some((base, PIECE))
}

impl Paged {
    pub(super) fn new(store: Box<dyn PageStore>, page_size: usize) -> Paged {
        Paged {
            store,
            page_size,
            written: HashSet::new(),
            work: HashMap::new(),
            queued: HashMap::new(),
            spare: Vec::new(),
            landed: Vec::new(),
            ended: Vec::new(),
        }
    }

    /// Start `page`'s work on `pieces` (none under way for it).
    fn start(
        &mut self,
        page: u64,
        pieces: Vec<Piece>,
        stats: &RegionStats,
    ) -> Result<(), StoreError> {
        let ps = self.page_size;
        let mut buf = self.spare.pop().unwrap_or_else(|| vec![0; ps]);
        let mut stage = Stage::Page;
        if !self.written.contains(&page) {
            buf.fill(0);
            self.landed.push(page);
        } else {
            match &pieces[..] {
                [p] if p.write && p.offset == 0 && p.len as usize == ps => self.landed.push(page),
                [p] if !p.write && self.store.part_reads() => {
                    // Where the store has part reads but not part writes, its pages are
                    // sealed by the piece (PageStore::part_reads).
                    match part_of(p.offset, p.len, self.store.part_writes()) {
                        Some((at, len)) => {
                            self.store.fetch_part(PageIndex(page), at, len)?;
                            stage = Stage::Part(at);
                        }
                        None => self.store.fetch(PageIndex(page))?,
                    }
                    stats.requests.fetch_add(1, Relaxed);
                }
                _ => {
                    self.store.fetch(PageIndex(page))?;
                    stats.requests.fetch_add(1, Relaxed);
                }
            }
        }
        self.work.insert(page, Work { pieces, buf, stage });
        Ok(())
    }

    /// `page`'s bytes are in its buffer: answer its reads, patch in its writes, and store it
    /// if any wrote.
    fn landed(&mut self, page: u64, stats: &RegionStats) -> Result<(), StoreError> {
        let w = self.work.get_mut(&page).expect("a page at work");
        for p in &w.pieces {
            let at = p.offset as usize..(p.offset + p.len) as usize;
            if p.write {
                // SAFETY: the caller's buffer, `len` bytes from `buf`, borrowed while it waits.
                let data = unsafe { std::slice::from_raw_parts(p.buf.0, p.len as usize) };
                w.buf[at].copy_from_slice(data);
            } else {
                answer_read(p, &w.buf[at]);
            }
        }
        w.pieces.retain(|p| p.write);
        if w.pieces.is_empty() {
            self.ended.push(page);
            return Ok(());
        }
        let fits = self.written.contains(&page)
            || (self.written.len() as u64 + 1) * self.page_size as u64
                <= self.store.capacity_bytes();
        if !fits {
            // Refused here rather than by the servers: a store that learns it from their
            // answers has sent the page already, and can only give up on it (the pager's
            // end). What the servers said they had room for at connect time, with the
            // layout's copies and seals; room others take later is still found by answers.
            let why = format!(
                "the memory servers are full: this region's {} pages take the {} bytes of \
                 pages they had room for, and a new page does not fit",
                self.written.len(),
                self.store.capacity_bytes()
            );
            for p in w.pieces.drain(..) {
                p.job.answered(Some(RegionError::NoRoom(why.clone())));
            }
            self.ended.push(page);
            return Ok(());
        }
        match self.store.store(PageIndex(page), &w.buf) {
            Ok(()) => {}
            Err(e @ (StoreError::AllFull { .. } | StoreError::OverGrant { .. })) => {
                // Refused before anything was sent: the page stays as it was stored, and
                // these writes fail alone (ENOSPC); the region goes on.
                let why = e.to_string();
                for p in w.pieces.drain(..) {
                    p.job.answered(Some(RegionError::NoRoom(why.clone())));
                }
                self.ended.push(page);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        w.stage = Stage::Stored;
        self.written.insert(page);
        stats.requests.fetch_add(1, Relaxed);
        stats.bytes_sent.fetch_add(self.page_size as u64, Relaxed);
        Ok(())
    }

    /// `page`'s work is over: answer its writes, and start what waited for it.
    fn end(&mut self, page: u64, stats: &RegionStats) -> Result<(), StoreError> {
        let w = self.work.remove(&page).expect("a page at work");
        for p in w.pieces {
            p.job.answered(None);
        }
        self.spare.push(w.buf);
        if let Some(q) = self.queued.remove(&page) {
            self.start(page, q.into(), stats)?;
        }
        Ok(())
    }

    /// Work through what came in until nothing is left to do without an answer.
    fn advance(&mut self, stats: &RegionStats) -> Result<(), StoreError> {
        while !self.landed.is_empty() || !self.ended.is_empty() {
            for page in std::mem::take(&mut self.landed) {
                self.landed(page, stats)?;
            }
            for page in std::mem::take(&mut self.ended) {
                self.end(page, stats)?;
            }
        }
        Ok(())
    }
}

impl Backend for Paged {
    fn submit(&mut self, p: Piece, stats: &RegionStats) -> Result<(), RegionError> {
        if let Some(q) = self.queued.get_mut(&p.page) {
            q.push_back(p);
        } else if self.work.contains_key(&p.page) {
            self.queued.insert(p.page, VecDeque::from([p]));
        } else {
            self.start(p.page, vec![p], stats)?;
            self.advance(stats)?;
        }
        Ok(())
    }

    fn inflight_bytes(&self) -> u64 {
        (self.work.len() * self.page_size) as u64
    }

    fn busy(&self) -> bool {
        !self.work.is_empty()
    }

    fn flush(&mut self, _now: Instant) -> Result<(), RegionError> {
        Ok(self.store.flush()?)
    }

    fn pollfds(&self, out: &mut Vec<libc::pollfd>) {
        self.store.wait_fds(out);
    }

    fn take_answers(&mut self, _now: Instant, stats: &RegionStats) -> Result<usize, RegionError> {
        let (work, landed, ended) = (&mut self.work, &mut self.landed, &mut self.ended);
        let n = self.store.poll(&mut |c| match c {
            Completion::Fetched { page, data } => {
                let Some(w) = work.get_mut(&page.0) else {
                    return;
                };
                stats.bytes_fetched.fetch_add(data.len() as u64, Relaxed);
                match w.stage {
                    Stage::Page => {
                        w.buf.copy_from_slice(data);
                        landed.push(page.0);
                    }
                    Stage::Part(at) => {
                        let p = &w.pieces[0];
                        let from = (p.offset - at) as usize;
                        answer_read(p, &data[from..from + p.len as usize]);
                        w.pieces.clear();
                        ended.push(page.0);
                    }
                    Stage::Stored => {}
                }
            }
            Completion::Stored { page } => {
                if work.get(&page.0).is_some_and(|w| w.stage == Stage::Stored) {
                    ended.push(page.0);
                }
            }
        })?;
        self.advance(stats)?;
        Ok(n)
    }

    fn tick(&mut self, now: Instant) -> Result<(), RegionError> {
        Ok(self.store.tick(now)?)
    }

    fn wants_polling(&self) -> bool {
        self.store.in_flight() > 0
    }

    fn drain(&mut self) -> Vec<Piece> {
        let mut all: Vec<Piece> = self.work.drain().flat_map(|(_, w)| w.pieces).collect();
        all.extend(self.queued.drain().flat_map(|(_, q)| q));
        all
    }

    /// Dropping the store ends its sessions (RemoteStore's drop).
    fn end_sessions(&mut self) {}
}
