//! Page stores: where pages live when they are not resident.
//!
//! The pager speaks only to [`PageStore`], never to sockets, so the same fault path runs over
//! TCP memory servers ([`remote::RemoteStore`]) or in-process memory ([`mem::MemStore`]).
//! Operations are submitted and complete later through [`PageStore::poll`], so many may be in
//! flight at once; a store decides placement (and later replication) itself.

pub mod cluster;
pub mod codec;
pub mod gf256;
pub mod mem;
pub mod remote;

use crate::PageIndex;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

/// A copy-on-write snapshot of a store's pages: what a fork() child reads (on the memory
/// servers, a session of its own; see rmem-server's session.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot(pub u128);

/// A finished operation. Page data borrows the store's receive buffer until the callback
/// returns.
#[derive(Debug)]
pub enum Completion<'a> {
    Fetched { page: PageIndex, data: &'a [u8] },
    Stored { page: PageIndex },
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot connect to memory server {server}")]
    Connect {
        server: String,
        source: std::io::Error,
    },
    #[error("memory server {server} refused the connection: {message}")]
    Refused { server: String, message: String },
    #[error("memory server {server} does not know the token: its proof of it did not match (is it the server you meant?)")]
    Impostor { server: String },
    #[error("memory server {server} closed the connection{detail}")]
    Closed { server: String, detail: String },
    #[error("memory server {server} did not answer for {secs:.1} s{detail}")]
    Timeout {
        server: String,
        secs: f64,
        detail: String,
    },
    #[error("{cause}; reconnecting for {secs:.1} s failed: {last}")]
    GaveUp {
        cause: Box<StoreError>,
        secs: f64,
        last: String,
    },
    #[error("memory server {server} lost this program's pages{detail}")]
    SessionLost { server: String, detail: String },
    #[error("memory server {server} sent a bad frame: {what}")]
    Protocol { server: String, what: String },
    #[error("memory server {server} answered {code}: {message}")]
    Server {
        server: String,
        code: rmem_proto::ErrorCode,
        message: String,
    },
    /// What to do about it depends on who wrote the page: the pager says it
    /// ([`crate::pager::PagerError::ServersFull`]).
    #[error("every memory server is full, so page {page} cannot be written back: {servers}")]
    AllFull { page: u64, servers: String },
    #[error(
        "this program may keep at most {grant_bytes} bytes on the pool's servers (its grant: \
         --max-remote, or the manager's own limit) and holds {used_bytes}, so page {page} \
         cannot be written back"
    )]
    OverGrant {
        page: u64,
        grant_bytes: u64,
        used_bytes: u64,
    },
    #[error("pool manager {manager}: {detail}")]
    Manager { manager: String, detail: String },
    #[error("memory servers lost: {servers}; {detail}")]
    Lost { servers: String, detail: String },
    #[error("{0}")]
    Layout(String),
    #[error(
        "a read of page {page} from the memory servers waits for nothing that can finish it \
         (a bug in rmem, stopped rather than hang): {detail}"
    )]
    Stuck { page: u64, detail: String },
    #[error("i/o error with memory server {server}")]
    Io {
        server: String,
        source: std::io::Error,
    },
}

/// What a store counts that the pager does not see: servers lost, pages rebuilt, pieces that
/// failed their check.
#[derive(Debug, Default)]
pub struct StoreCounters {
    /// How pages are kept: `ec:4+1, encrypted`.
    pub layout: String,
    /// Servers given up while the program ran (with redundancy it goes on).
    pub servers_lost: AtomicU64,
    /// Pages whose lost pieces were rebuilt on other servers.
    pub pages_repaired: AtomicU64,
    /// Pieces moved as they are off draining servers that still answered (erasure coding:
    /// one fragment read per fragment moved, nothing rebuilt); also in `pages_repaired`.
    pub pieces_moved: AtomicU64,
    /// Of those, pieces the server taking them copied from the draining one itself
    /// (`Request::Pull`): their bytes never crossed this client.
    pub pieces_pulled: AtomicU64,
    /// Time spent with a repair running, in microseconds.
    pub repair_us: AtomicU64,
    /// Pages whose written pieces went over their `ec:K+M` fragments as a patch (the cells
    /// they change and the parity's, read and written back).
    pub patches: AtomicU64,
    /// Patches that became whole write-backs (a member lost, late, missing the page, or an
    /// old cell failing its seal).
    pub patches_whole: AtomicU64,
    /// Pieces that came back altered, stale, another page's, or not at all.
    pub pieces_bad: AtomicU64,
    /// Reads asked of another server after a piece failed or its server was lost.
    pub failovers: AtomicU64,
    /// Reads asked of their pages' other pieces too after waiting `READ_HEDGE_AFTER` (20 ms)
    /// on a server that still answered (one late, not silent).
    pub reads_hedged: AtomicU64,
    /// Writes taken off a server that went silent or lost its link, and sent to another.
    pub writes_redirected: AtomicU64,
    /// Write-backs told to the pager as stored while one of their pieces still waited on a
    /// silent server with no other to take it.
    pub writes_released: AtomicU64,
    /// Write-backs stored with a piece fewer than the layout's because a member was silent
    /// and no other server could take its piece (repaired when it answers again).
    pub writes_degraded: AtomicU64,
}

/// The runs of consecutive pieces in `pieces` (bit `i`: the 4 KiB piece at `i * 4096`), in
/// order, as (byte offset, byte length).
pub fn piece_runs(pieces: u64) -> impl Iterator<Item = (usize, usize)> {
    const PIECE: usize = rmem_uffd::PIECE as usize;
    let mut rest = pieces;
    std::iter::from_fn(move || {
        if rest == 0 {
            return None;
        }
        let start = rest.trailing_zeros() as usize;
        let len = (rest >> start).trailing_ones() as usize;
        rest &= !(((1u128 << len) - 1) as u64) << start;
        Some((start * PIECE, len * PIECE))
    })
}

/// A place pages live when they are not resident.
pub trait PageStore: Send {
    /// Bytes of pages this client may store in all.
    fn capacity_bytes(&self) -> u64;
    /// Start fetching `page`'s contents; completes with [`Completion::Fetched`]. The request
    /// goes out at the next [`PageStore::flush`] or [`PageStore::poll`], so that the fetches
    /// of one batch (a block device request's pages, a prefetch window) leave together.
    fn fetch(&mut self, page: PageIndex) -> Result<(), StoreError>;
    /// Whether [`PageStore::fetch_part`] works: the servers keep each page as it is (no
    /// seal, no fragments), so a byte range of it can be read and trusted alone, or sealed by
    /// the 4 KiB piece, so that a piece can be (then only whole pieces are read).
    fn part_reads(&self) -> bool {
        false
    }
    /// Whether [`PageStore::store_parts`] works: a range of a page can be written over its
    /// stored copy alone (only where that copy is the page as it is).
    fn part_writes(&self) -> bool {
        false
    }
    /// Whether `page`'s written 4 KiB `pieces` go alone now ([`PageStore::store_parts`]):
    /// always where [`PageStore::part_writes`]; a store whose pages are sealed by the piece
    /// may take them page by page. Otherwise a partial page's written pieces leave with the
    /// rest of their page, fetched first.
    fn piece_writes(&self, page: PageIndex, pieces: u64) -> bool {
        let _ = (page, pieces);
        self.part_writes()
    }
    /// Start fetching `len` bytes of `page` from `offset` (where [`PageStore::part_reads`]);
    /// completes with [`Completion::Fetched`] carrying those bytes alone.
    fn fetch_part(&mut self, page: PageIndex, offset: u32, len: u32) -> Result<(), StoreError> {
        let _ = (offset, len);
        unreachable!("page {}: this store has no part reads", page.0)
    }
    /// Start storing `data` as `page`'s contents; completes with [`Completion::Stored`].
    fn store(&mut self, page: PageIndex, data: &[u8]) -> Result<(), StoreError>;
    /// Start storing the 4 KiB pieces of `data` in `pieces` (bit `i`: bytes `i * 4096` on)
    /// over `page`'s stored copies, the rest of which stay as they are (where
    /// [`PageStore::piece_writes`]: a partial page's written pieces); completes with
    /// [`Completion::Stored`]. `data` is the whole page as the client has it; its other
    /// pieces are not the page's.
    fn store_parts(&mut self, page: PageIndex, data: &[u8], pieces: u64) -> Result<(), StoreError> {
        let _ = (data, pieces);
        unreachable!("page {}: this store has no part writes", page.0)
    }
    /// Whether a fault's fetch should go out before the write-back of the victim it replaces
    /// (`fetch`, then `store`) rather than with it (`swap`): true where sending it alone
    /// costs no more, so the victim's move, seal and write overlap the fetch's round trip.
    fn fetch_ahead(&self) -> bool {
        true
    }
    /// Store `victim` and fetch `page`, sent together at the next flush.
    fn swap(&mut self, victim: PageIndex, data: &[u8], page: PageIndex) -> Result<(), StoreError> {
        self.store(victim, data)?;
        self.fetch(page)
    }
    /// Forget `page`; its space returns to the server. No completion.
    fn free(&mut self, page: PageIndex) -> Result<(), StoreError>;
    /// Push buffered requests out.
    fn flush(&mut self) -> Result<(), StoreError>;
    /// Send what is queued, then deliver finished operations to `f` without blocking. Returns how many pages completed
    /// (answers that complete nothing, such as a ping's, are not counted).
    fn poll(&mut self, f: &mut dyn FnMut(Completion<'_>)) -> Result<usize, StoreError>;
    /// Descriptors to wait on when the pager sleeps (readable, or writable with unsent data).
    fn wait_fds(&self, out: &mut Vec<libc::pollfd>);
    /// Whether the next [`PageStore::poll`] delivers completions that no descriptor of
    /// [`PageStore::wait_fds`] announces (write-backs a [`PageStore::tick`] finished, or a
    /// store with no descriptors at all): a front end about to sleep polls again instead.
    fn ready(&self) -> bool {
        false
    }
    /// Periodic upkeep: heartbeats and request deadlines.
    fn tick(&mut self, now: Instant) -> Result<(), StoreError>;
    /// How often an idle store wants [`PageStore::tick`] (to renew what it holds: a server
    /// session's lease), if it wants it at all.
    fn heartbeat(&self) -> Option<std::time::Duration> {
        None
    }
    /// Requests in flight.
    fn in_flight(&self) -> usize;
    /// A mark of the write-backs started so far, for [`PageStore::settled`].
    fn write_mark(&self) -> u64 {
        0
    }
    /// Whether every write-back started before `mark` ([`PageStore::write_mark`]) and told
    /// stored is wholly stored: a store may tell a write-back stored while a piece of it still
    /// waits on a slow server, once the page can be read from the others (the remote store's
    /// released writes); one that never does is always settled.
    fn settled(&self, mark: u64) -> bool {
        let _ = mark;
        true
    }
    /// Take a snapshot of every page as the requests submitted so far leave it, for a fork()
    /// child: later stores and frees here do not reach it. Cheap (the servers copy nothing),
    /// since most forks exec at once.
    fn snapshot(&mut self) -> Result<Snapshot, StoreError>;
    /// In a fork() child, called on its copy of its parent's store (taken while the parent's
    /// pager was parked, after [`PageStore::snapshot`]): the store the child goes on with,
    /// whose pages are `snapshot`. It may take what it needs out of the copy (the child's
    /// own memory), which is then forgotten, never dropped: its descriptors belong to the
    /// parent's pager. No I/O: a remote store connects at its first request, so a child that
    /// execs at once costs the servers nothing.
    fn forked(&mut self, snapshot: Snapshot) -> Box<dyn PageStore>;
    /// The fork() child that read `snapshot` exited or exec'd: free it.
    fn end_snapshot(&mut self, snapshot: Snapshot) -> Result<(), StoreError>;
    /// What the store has open and where, for the report of a pager that finds itself stuck.
    fn describe_in_flight(&self) -> String {
        format!("store: {} in flight", self.in_flight())
    }
    /// The store's own counters, if it keeps any.
    fn counters(&self) -> Option<Arc<StoreCounters>> {
        None
    }
    /// One line naming the servers, for logs.
    fn describe(&self) -> String;
}

#[cfg(test)]
mod tests {
    use super::piece_runs;

    #[test]
    fn piece_runs_are_the_runs_of_set_bits_in_bytes() {
        let runs = |m| piece_runs(m).collect::<Vec<_>>();
        assert_eq!(runs(0), vec![]);
        assert_eq!(runs(1), vec![(0, 4096)]);
        assert_eq!(
            runs(0b1101_0110),
            vec![(4096, 8192), (16384, 4096), (24576, 8192)]
        );
        assert_eq!(runs(u64::MAX), vec![(0, 64 * 4096)]);
        assert_eq!(runs(1 << 63), vec![(63 * 4096, 4096)]);
    }
}
