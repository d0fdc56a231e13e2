//! An in-process page store: the same interface as the memory servers, for tests and
//! simulations that must not depend on the network.

use super::{Completion, PageStore, Snapshot, StoreError};
use crate::PageIndex;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

enum Done {
    Fetched(PageIndex),
    Part(PageIndex, u32, u32),
    Stored(PageIndex),
}

/// Pages kept in a map behind an `Arc`, so a test can look at what was written back.
pub struct MemStore {
    pages: Arc<Mutex<HashMap<u64, Box<[u8]>>>>,
    capacity_bytes: u64,
    page_size: usize,
    done: VecDeque<Done>,
    buf: Vec<u8>,
    /// Written pieces are stored alone ([`PageStore::part_writes`]); off, as servers that
    /// keep pages sealed by the piece, the pager must never ask to.
    part_writes: bool,
}

impl MemStore {
    pub fn new(page_size: usize, capacity_bytes: u64) -> MemStore {
        MemStore {
            pages: Arc::default(),
            capacity_bytes,
            page_size,
            done: VecDeque::new(),
            buf: vec![0; page_size],
            part_writes: true,
        }
    }

    /// As a store whose pages are sealed by the piece: pieces are read alone, never written
    /// alone (a call to [`PageStore::store_parts`] then panics).
    pub fn without_part_writes(mut self) -> MemStore {
        self.part_writes = false;
        self
    }

    /// A handle on the stored pages.
    pub fn pages(&self) -> Arc<Mutex<HashMap<u64, Box<[u8]>>>> {
        self.pages.clone()
    }
}

impl PageStore for MemStore {
    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn fetch(&mut self, page: PageIndex) -> Result<(), StoreError> {
        self.done.push_back(Done::Fetched(page));
        Ok(())
    }

    fn part_reads(&self) -> bool {
        true
    }

    fn part_writes(&self) -> bool {
        self.part_writes
    }

    fn fetch_part(&mut self, page: PageIndex, offset: u32, len: u32) -> Result<(), StoreError> {
        assert!(offset as usize + len as usize <= self.page_size);
        self.done.push_back(Done::Part(page, offset, len));
        Ok(())
    }

    fn store(&mut self, page: PageIndex, data: &[u8]) -> Result<(), StoreError> {
        assert_eq!(data.len(), self.page_size);
        let mut pages = self.pages.lock().unwrap();
        if !pages.contains_key(&page.0)
            && (pages.len() as u64 + 1) * self.page_size as u64 > self.capacity_bytes
        {
            return Err(StoreError::AllFull {
                page: page.0,
                servers: format!("in-process store (capacity {} bytes)", self.capacity_bytes),
            });
        }
        pages.insert(page.0, data.into());
        self.done.push_back(Done::Stored(page));
        Ok(())
    }

    fn store_parts(&mut self, page: PageIndex, data: &[u8], pieces: u64) -> Result<(), StoreError> {
        assert!(self.part_writes, "page {}: pieces written alone", page.0);
        assert_eq!(data.len(), self.page_size);
        let mut pages = self.pages.lock().unwrap();
        let stored = pages
            .get_mut(&page.0)
            .expect("pieces of a page never stored");
        for (at, len) in super::piece_runs(pieces) {
            stored[at..at + len].copy_from_slice(&data[at..at + len]);
        }
        self.done.push_back(Done::Stored(page));
        Ok(())
    }

    fn free(&mut self, page: PageIndex) -> Result<(), StoreError> {
        self.pages.lock().unwrap().remove(&page.0);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    fn poll(&mut self, f: &mut dyn FnMut(Completion<'_>)) -> Result<usize, StoreError> {
        let n = self.done.len();
        while let Some(d) = self.done.pop_front() {
            match d {
                Done::Fetched(page) | Done::Part(page, ..) => {
                    let (off, len) = match d {
                        Done::Part(_, off, len) => (off as usize, len as usize),
                        _ => (0, self.page_size),
                    };
                    let pages = self.pages.lock().unwrap();
                    let data = pages.get(&page.0).ok_or_else(|| StoreError::Server {
                        server: "in-process".into(),
                        code: rmem_proto::ErrorCode::NotFound,
                        message: format!("page {} was never stored", page.0),
                    })?;
                    rmem_copy::copy(&mut self.buf[..len], &data[off..off + len]);
                    drop(pages);
                    f(Completion::Fetched {
                        page,
                        data: &self.buf[..len],
                    });
                }
                Done::Stored(page) => f(Completion::Stored { page }),
            }
        }
        Ok(n)
    }

    fn wait_fds(&self, _out: &mut Vec<libc::pollfd>) {}

    fn ready(&self) -> bool {
        !self.done.is_empty()
    }

    fn tick(&mut self, _now: Instant) -> Result<(), StoreError> {
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn describe(&self) -> String {
        "in-process store".into()
    }

    /// Nothing to do: a fork() child's copy of this process's memory is the snapshot.
    fn snapshot(&mut self) -> Result<Snapshot, StoreError> {
        Ok(Snapshot(0))
    }

    /// The child's own copy of the pages (its parent's later stores stay in the parent).
    fn forked(&mut self, _snapshot: Snapshot) -> Box<dyn PageStore> {
        let pages = self.pages.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Box::new(MemStore {
            pages: Arc::new(Mutex::new(pages)),
            capacity_bytes: self.capacity_bytes,
            page_size: self.page_size,
            done: VecDeque::new(),
            buf: vec![0; self.page_size],
            part_writes: self.part_writes,
        })
    }

    fn end_snapshot(&mut self, _snapshot: Snapshot) -> Result<(), StoreError> {
        Ok(())
    }
}
