//! The cluster layer: pages on a set of memory servers, each page whole on one, replicated on
//! N, or in K+M erasure-coded fragments (see [`codec`]); placement, overcommit, failover and
//! background repair. The links themselves are [`remote::Conn`]'s.
//!
//! Per page the store keeps two things, in chunks allocated as pages are first written: the
//! group of servers that holds its pieces (an index into a table of distinct server lists,
//! two bytes) and, when pages are sealed, its version (four bytes). Piece i of a page is on
//! member i of its group, under the page's index as key.
//!
//! A server given up (its link could not be re-established within the reconnect window, it
//! lost the session, or it broke the protocol) is buried: with redundancy, its unanswered
//! reads are asked of other members, its unanswered writes are placed on another server, and
//! every page with a piece there is queued for repair: read from the survivors and the
//! missing pieces written (the same version, so the same bytes) to servers outside the group,
//! a few pages at a time, between the program's own requests. Without redundancy, or when a
//! page is left with fewer pieces than it needs, the loss is an error naming every server
//! lost.
//!
//! At a fork() ([`PageStore::snapshot`]) every live server takes a copy-on-write snapshot of
//! this client's session, queued behind the requests already sent to it; the child's store
//! ([`PageStore::forked`]) is this one's placement and versions (taken over, not copied: the
//! child's copy of this process is what it reads from), the same codec with a sealing key of
//! its own under encryption (see [`codec::Stamp`]: each page's versions go on from the
//! parent's in both processes, so one key would repeat nonces), and one
//! connection per server, unlinked until first used, to that server's snapshot. A buried
//! server has no snapshot and stays buried in the child.
//!
//! The server list is owned here and only grows: the servers named at the start, and in a
//! pool (a [`PoolLink`] to the manager) every server the manager offers later, each joined by
//! [`RemoteStore::join`] as the first ones were. A server's index never changes, so the
//! groups that name it stay valid; a joined server takes new pages (and repairs) as any other.
//! In a pool the client also never places beyond its grant: a new page that would take more
//! is refused as when every server is full.
//!
//! [`codec`]: super::codec
//! [`remote::Conn`]: super::remote::Conn

use super::codec::{self, Codec, Redundancy, Stamp, Stamps, CELL, PIECE};
use super::remote::{self, Answer, Conn, Kind, Orphan, Timing};
use super::{Completion, PageStore, Snapshot, StoreCounters, StoreError};
use crate::config::{Config, Placement};
use crate::pool::PoolLink;
use crate::PageIndex;
use rmem_proto::pool::{
    ServerUse, SERVER_DISK, SERVER_DRAINING, SERVER_NODE_BORROWS, SERVER_RECLAIMING, UNLIMITED,
};
use rmem_proto::{PageKey, Request, SessionId};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How pages are laid out over the servers.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub placement: Placement,
    pub redundancy: Redundancy,
    /// Seal pages with AES-256-GCM under a key made in this process.
    pub encrypt: bool,
}

/// Most servers one client can address (a group member is 16 bits).
pub const SERVERS_MAX: usize = u16::MAX as usize - 1;
/// Pages being repaired at once: few enough that the program's own faults keep most of the
/// links. (Measured at 64 KiB pages: 256 rebuilt no faster with the program idle, and 4
/// while it ran made a drain half as fast: docs/benchmarks.md.)
pub const REPAIR_WINDOW: usize = 32;
/// Keys per pull (`Request::Pull`), and pieces being pulled by one server at once: a pull
/// holds that server's answers to this client's other requests (the program's faults) until
/// it is done, so few are queued there (two pulls of 16 pages of 64 KiB: a fault waits a
/// few milliseconds at most), while every server taking pieces pulls at once.
pub const PULL_KEYS: usize = 16;
pub const PULL_PER_SERVER: usize = 2 * PULL_KEYS;
/// A server that failed a pull moves its share through this client for this long, then is
/// asked to pull again (it may have been full, or cut off from the other server, for a while).
pub const PULL_REFUSAL_HOLD: Duration = Duration::from_secs(30);
/// A buried server is tried again this often (on a thread of its own, with the connect
/// timeout), so that one that comes back takes new pages: first [`REVIVE_FIRST`] after the
/// loss, then twice as long each time up to this.
const REVIVE_EVERY: Duration = Duration::from_secs(2);
/// The first try at a server just lost. `rmem run` and `rmem nbd` start a local server that
/// ended again at once, empty: the sooner it is back, the sooner the pages its loss left a
/// piece short are rebuilt onto it, and the shorter the time a second loss would take them
/// (a first try 2 s after the loss left five servers under `ec:4+1` exposed 2 s longer).
const REVIVE_FIRST: Duration = Duration::from_millis(250);
/// How often a front end ticks the store while a repair runs.
const REPAIR_TICK: Duration = Duration::from_millis(10);
/// How often a dial calling back a lost server is looked at.
const DIAL_LOOK: Duration = Duration::from_millis(50);
/// A server slow for this long or longer is named on stderr when it answers again (with the
/// write-backs stored with a piece fewer meanwhile); shorter silences are only counted.
const SLOW_TOLD_AFTER: Duration = Duration::from_secs(1);
/// How often the store looks for a fetch that nothing can finish
/// ([`RemoteStore::check_fetches`]); one seen so at two looks in a row is an error.
const FETCH_CHECK_EVERY: Duration = Duration::from_secs(1);
/// A process starting under a layout that outlives a loss waits no longer than this for a
/// server that does not answer, once enough others have ([`dial_all`]). A live server on a
/// network answers within milliseconds.
const START_GRACE: Duration = Duration::from_secs(1);
/// Connecting to a server the manager offers gives up after this long (on a thread of its
/// own: the pager goes on meanwhile), and is tried again after [`REVIVE_EVERY`].
const JOIN_TIMEOUT: Duration = Duration::from_millis(250);
/// Most bytes of pieces of released write-backs ([`RemoteStore::release_held_writes`]) left
/// waiting on slow servers' links: past it, write-backs wait for those servers as before
/// (each piece is kept on its link until answered, so that a hung server does not grow this
/// client's memory by a write-heavy program's whole output).
pub const RELEASED_MAX_BYTES: u64 = 32 << 20;

/// Pages per chunk of [`Meta`]'s tables: the same as the page states'.
const CHUNK: usize = crate::pages::CHUNK_PAGES;
/// Fetch buffers kept for reuse.
const BUFS_KEPT: usize = 64;
/// A group member that is no server: a piece not stored (fewer servers left than the
/// redundancy puts a page on); repaired when one comes back.
const NONE: u16 = u16::MAX;

/// Where each page's pieces are and which version they hold.
#[derive(Default)]
struct Meta {
    /// Group index + 1; 0: nothing stored.
    groups: Vec<Option<Box<[u32]>>>,
    /// Each page's latest stamp (its last write's, whole or of pieces).
    stamps: Vec<Option<Box<[Stamp]>>>,
    /// The cells' own stamps of pages whose pieces were written alone since they were last
    /// written whole ([`PageStore::store_parts`] over pages sealed by the piece): a page in
    /// few places, so kept apart from the chunks.
    cells: HashMap<u64, Arc<[Stamp]>>,
}

impl Meta {
    fn group(&self, page: u64) -> Option<GroupId> {
        match self.groups.get(page as usize / CHUNK) {
            Some(Some(c)) => c[page as usize % CHUNK].checked_sub(1),
            _ => None,
        }
    }

    fn set_group(&mut self, page: u64, g: Option<GroupId>) {
        let c = page as usize / CHUNK;
        if g.is_none() && !matches!(self.groups.get(c), Some(Some(_))) {
            // Nothing stored there already.
            return;
        }
        if c >= self.groups.len() {
            self.groups.resize_with(c + 1, || None);
        }
        let ch = self.groups[c].get_or_insert_with(|| vec![0; CHUNK].into_boxed_slice());
        ch[page as usize % CHUNK] = g.map_or(0, |g| g + 1);
    }

    fn stamp(&self, page: u64) -> Stamp {
        match self.stamps.get(page as usize / CHUNK) {
            Some(Some(c)) => c[page as usize % CHUNK],
            _ => Stamp::default(),
        }
    }

    /// What sealed each of `page`'s cells.
    fn stamps(&self, page: u64) -> Stamps {
        Stamps {
            latest: self.stamp(page),
            cells: self.cells.get(&page).cloned(),
        }
    }

    /// `page` was written whole as `v`.
    fn set_stamp(&mut self, page: u64, v: Stamp) {
        if !self.cells.is_empty() {
            self.cells.remove(&page);
        }
        self.set_latest(page, v);
    }

    /// `page`'s pieces in `pieces` (of `n`) were written alone as `v`; its other cells keep
    /// theirs.
    fn set_pieces(&mut self, page: u64, v: Stamp, pieces: u64, n: usize) {
        let before = self.stamps(page);
        let each: Arc<[Stamp]> = (0..n)
            .map(|i| {
                if pieces & (1 << i) != 0 {
                    v
                } else {
                    before.of(i)
                }
            })
            .collect();
        self.cells.insert(page, each);
        self.set_latest(page, v);
    }

    /// `page` is no longer stored: its cells' stamps go (its latest stays, so that its next
    /// write takes a version none of its cells had).
    fn forget_cells(&mut self, page: u64) {
        if !self.cells.is_empty() {
            self.cells.remove(&page);
        }
    }

    fn set_latest(&mut self, page: u64, v: Stamp) {
        let c = page as usize / CHUNK;
        if c >= self.stamps.len() {
            self.stamps.resize_with(c + 1, || None);
        }
        let ch =
            self.stamps[c].get_or_insert_with(|| vec![Stamp::default(); CHUNK].into_boxed_slice());
        ch[page as usize % CHUNK] = v;
    }

    /// Every page with a group, in order.
    fn located(&self) -> impl Iterator<Item = (u64, GroupId)> + '_ {
        self.groups.iter().enumerate().flat_map(|(c, ch)| {
            ch.iter().flat_map(move |ch| {
                ch.iter().enumerate().filter_map(move |(i, &g)| {
                    g.checked_sub(1).map(|g| ((c * CHUNK + i) as u64, g))
                })
            })
        })
    }
}

/// A group's index in [`Groups`]. Not a `u16`: a page's group is healed server by server
/// from the page's own start ([`RemoteStore::heal`]), so every loss or drain splits the groups
/// it touches, and a long run in a changing pool names far more than 65,535 of them (thirty
/// drains of an `ec:4+2` pool of 10 servers holding 3,000 pages made 6,036, about 700 of them
/// in use; a large memory spread over 16 servers could have more than 65,535 in use at once).
type GroupId = u32;

/// Slots in use past which groups no page and no operation names are first freed
/// ([`Groups::collect`]); after each collection, twice those left in use.
const GROUPS_COLLECT_MIN: usize = 1024;

/// The distinct server lists pages are placed on, interned, with how many pages use each.
/// A group no page is in and no operation in flight names is freed now and then (its slot
/// reused by the next new list), so the table follows the groups in use, not every group a
/// long run ever made.
#[derive(Default)]
struct Groups {
    /// Each slot's servers; empty for a free slot (a group has at least one member).
    members: Vec<Members>,
    index: HashMap<Members, GroupId>,
    pages: Vec<u64>,
    free: Vec<GroupId>,
    /// Slots in use at which [`RemoteStore::collect_groups`] next frees what it can.
    collect_at: usize,
    /// Tests: free what can be at every tick.
    #[cfg(test)]
    every_tick: bool,
}

impl Groups {
    fn intern(&mut self, m: &[u16]) -> GroupId {
        debug_assert!(!m.is_empty(), "a group of no server");
        if let Some(&g) = self.index.get(m) {
            return g;
        }
        let g = match self.free.pop() {
            Some(g) => {
                self.members[g as usize] = m.into();
                g
            }
            None => {
                let g = GroupId::try_from(self.members.len())
                    .ok()
                    .filter(|&g| g < GroupId::MAX)
                    .expect("fewer than 2^32 - 1 server groups in use");
                self.members.push(m.into());
                self.pages.push(0);
                g
            }
        };
        self.index.insert(m.into(), g);
        g
    }

    /// Slots that name a group.
    fn in_use(&self) -> usize {
        self.members.len() - self.free.len()
    }

    fn due(&self) -> bool {
        #[cfg(test)]
        if self.every_tick {
            return true;
        }
        self.in_use() >= self.collect_at.max(GROUPS_COLLECT_MIN)
    }

    /// Free every group no page is in and `named` does not name (the groups operations in
    /// flight hold). The caller holds no group of its own meanwhile: a freed index is the
    /// next new group's.
    fn collect(&mut self, named: impl IntoIterator<Item = GroupId>) {
        let mut keep = vec![false; self.members.len()];
        for g in named {
            keep[g as usize] = true;
        }
        for (g, kept) in keep.into_iter().enumerate() {
            if self.pages[g] == 0 && !kept && !self.members[g].is_empty() {
                let m = std::mem::take(&mut self.members[g]);
                self.index.remove(&m);
                self.free.push(g as GroupId);
            }
        }
        self.collect_at = 2 * self.in_use();
    }
}

/// A fetch: pieces asked, answered, found bad, and those in.
struct Fetch {
    page: u64,
    /// What sealed the page's cells when the fetch began (writes sent after it are on the
    /// same links, behind its reads).
    stamps: Stamps,
    group: GroupId,
    /// The pieces in, each in its slot (`Codec::decode`); empty for unsealed pages, which
    /// are handed on as they come.
    buf: Vec<u8>,
    /// Pieces in `buf`.
    have: u32,
    asked: u32,
    answered: u32,
    bad: u32,
    /// Pieces on a server that was given up and has come back since this read began: its
    /// fresh session holds none of them, so they are neither asked nor waited for there.
    gone: u32,
    /// A seal failed with enough pieces in: ask every piece, try without each.
    all: bool,
    repair: bool,
    /// A move off draining servers that still answer (erasure coding): only these pieces
    /// are read, from their own servers, and written elsewhere as they are. A piece that
    /// cannot be read turns it into a repair (0): rebuilt from any pieces.
    moving: u32,
    /// A sub-page fetch: `len` bytes at `offset`, a 4 KiB piece, read alone where pages go
    /// as they are or are sealed by the piece ([`Codec::by_piece`]: its cell is read).
    part: Option<(u32, u32)>,
    /// A sub-page fetch whose piece could not be read alone (under erasure coding it is in
    /// one data fragment, whose server failed it): the page is read whole, and only this
    /// piece handed on.
    only: Option<u8>,
    /// A patch that could not be made ([`Patch`]): once read, the page takes these written
    /// pieces (a mask, and each piece in order) and is written back whole, not handed on.
    then_store: Option<Box<(u64, Vec<u8>)>>,
}

/// Written pieces of a page under `ec:K+M` going alone ([`PageStore::store_parts`]): each
/// member's bytes over the cells the pieces change are read (the data fragments' cells of
/// those pieces; the parity fragments' at the same offsets), then written back changed: the
/// pieces' new cells, and the parity XOR the code of the cells' differences
/// ([`Codec::parity_delta`]). One read and one write per member, of a few cells where the
/// page whole would be K fragments read and K+M written. A member that cannot be read (lost,
/// missing the page, an old cell that fails its seal) turns it into a whole write-back: the
/// page read whole from any K, the pieces put in, written as any page.
struct Patch {
    page: u64,
    group: GroupId,
    /// What sealed the page's cells before: the old cells read are checked with it.
    old: Stamps,
    pieces: u64,
    /// The written pieces, in order, [`PIECE`] bytes each.
    data: Vec<u8>,
    /// Per member, the cells read and rewritten: (first, count) in its unit; `None`: none.
    spans: Vec<Option<(usize, usize)>>,
    /// Per member, those cells once they came.
    got: Vec<Vec<u8>>,
    /// Members whose cells are still to come.
    waiting: u32,
}

/// What a fetch is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// The pager's: the page decoded and handed on.
    Page,
    /// A repair: every piece rebuilt sealed, those that moved written where they go.
    Repair,
    /// A move of the pieces in the mask, as they are (see [`Fetch::moving`]).
    Move(u32),
}

/// What a store sends its servers.
#[derive(Clone, Copy)]
enum Outgoing<'a> {
    /// The pieces as the servers keep them ([`Codec::encode`]), or a page that goes as it is.
    Units(&'a [u8]),
    /// A page of a layout of one copy, to seal as `stamp` in the frame that carries it:
    /// copied once, into the frame, and sealed there.
    ToSeal { data: &'a [u8], stamp: Stamp },
}

struct Store {
    page: u64,
    stamp: Stamp,
    waiting: u32,
    repair: bool,
    /// Told to the pager as stored while pieces still waited on slow servers
    /// ([`RemoteStore::release_held_writes`]): their answers finish it without a second word.
    released: bool,
    /// A partial page's written pieces ([`PageStore::store_parts`]): byte ranges over its
    /// copies, one `WriteRange` per run of pieces and member, not answered yet (0: pieces of
    /// the layout).
    ranges: u32,
}

enum Op {
    Fetch(Fetch),
    Store(Store),
    Patch(Patch),
}

/// Work an answer leaves for the links.
enum Todo {
    Ask(u64),
    Place {
        op: u64,
        piece: u8,
        unit: Vec<u8>,
        refused: Option<usize>,
    },
    /// A repair's read checked: write the pieces that moved, from `units` (each piece in
    /// `have` in its slot, as the servers store it: every piece after a rebuild).
    RepairWrite {
        page: u64,
        stamp: Stamp,
        units: Vec<u8>,
        have: u32,
        /// The read's operation: writes started after it are not in `units`.
        read: u64,
    },
    /// A repair's writes are all acknowledged.
    Repaired,
    /// A write of pieces alone over a replica (`piece`: the member) whose server was lost.
    LostRange {
        op: u64,
        piece: u8,
    },
    /// A patch's cells are all in: write them changed.
    PatchWrite(u64),
    /// A patch cannot be made: write the page whole.
    PatchFailed(u64),
    /// A page read whole for a patch that could not be made, its pieces put in: store it.
    StoreWhole {
        page: u64,
        data: Vec<u8>,
    },
    /// A server answered a pull: the first `stored` keys of `batch` are stored there.
    Pulled {
        batch: u64,
        stored: usize,
        why: String,
    },
}

/// A page whose pieces on draining servers the servers that will hold them pull
/// (`Request::Pull`). Until every pull is answered the page stays where it was: it is read
/// there, and a write-back meanwhile goes where any write goes (the pulled copies are then not
/// its latest: `superseded`, and it does not move; nor does a page moved or freed meanwhile,
/// which its group tells: [`RemoteStore::overtaken`]).
struct PullMove {
    /// The group it leaves, and the members it takes when every pull succeeded.
    from: GroupId,
    to: Box<[u16]>,
    /// The pieces being pulled.
    moving: u32,
    /// Pieces not answered yet; pieces not stored.
    waiting: u32,
    failed: u32,
    superseded: bool,
}

/// A group's servers, piece by piece.
type Members = Box<[u16]>;

/// One `Pull` request: its server, and the (page, piece) of each key, in order.
struct PullBatch {
    dst: u16,
    src: u16,
    items: Vec<(u64, u8)>,
}

/// A server that has answered nothing for this long while a request waits is slow: reads
/// waiting on it are asked of the page's other pieces too (a hung host, or one stopped,
/// would otherwise hold them for the whole request timeout, `RMEM_SERVER_TIMEOUT_MS`). A
/// hundred times a fault's usual wait on this machine; one asked again needlessly costs one
/// more read.
const HEDGE_AFTER: Duration = Duration::from_millis(100);

/// A read that has waited this long on a server that is not slow (it answers, but late: a
/// server stopped and continued in turn, starved of CPU, or behind a backlog on its link) is
/// asked of the page's other pieces too, and for [`LAG_HOLD`] after new reads ask that
/// server last and its write-backs are released as a slow server's are (told stored once
/// their other pieces are): a server never silent for [`HEDGE_AFTER`] would otherwise hold
/// every read of its pieces, and every write-back's staging slot, for as long as it lags (a
/// program at a fifth of its speed: docs/benchmarks.md, "A server late but never silent"). A
/// thousand times a read's usual wait here, and five times this VM's worst p99 of a round
/// trip; one asked needlessly costs one more read.
const READ_HEDGE_AFTER: Duration = Duration::from_millis(20);

/// How long new reads ask a server last after a read waited [`READ_HEDGE_AFTER`] there.
const LAG_HOLD: Duration = Duration::from_secs(1);

/// Per server: the reads that wait on it too long while it is not slow (see
/// [`READ_HEDGE_AFTER`]).
#[derive(Clone, Copy, Default)]
struct Lag {
    /// The tag of the newest request the late-read hedge has looked at there.
    looked: u64,
    /// When a read there was last asked elsewhere for waiting too long.
    last: Option<Instant>,
    /// Within [`LAG_HOLD`] of `last` (refreshed by each hedge): new reads ask it last, and
    /// its write-backs are released.
    lagging: bool,
}

/// Moves server to server, for drains (see [`PullMove`]).
struct Pulls {
    /// Off (`RMEM_PULL=0`): every move goes through this client.
    off: bool,
    moves: HashMap<u64, PullMove>,
    batches: HashMap<u64, PullBatch>,
    next_batch: u64,
    /// Servers a pull failed on while its source still answered (they cannot reach it, or do
    /// not know the token), and until when their pages move through this client instead: a
    /// link comes back, so they are asked to pull again after `hold`. (A server that stopped
    /// for want of room is not here: it is marked full, and the pages go elsewhere.)
    refused: Vec<Option<Instant>>,
    /// How long a refusal holds: [`PULL_REFUSAL_HOLD`].
    hold: Duration,
    /// Pieces each server is pulling now.
    taking: Vec<usize>,
}

impl Default for Pulls {
    fn default() -> Pulls {
        Pulls {
            off: false,
            moves: HashMap::new(),
            batches: HashMap::new(),
            next_batch: 0,
            refused: Vec::new(),
            hold: PULL_REFUSAL_HOLD,
            taking: Vec::new(),
        }
    }
}

impl Pulls {
    /// Whether server `s` failed a pull less than `hold` before `now`.
    fn refuses(&self, s: usize, now: Instant) -> bool {
        self.refused
            .get(s)
            .copied()
            .flatten()
            .is_some_and(|until| now < until)
    }
}

#[derive(Default)]
struct Repair {
    queue: VecDeque<u64>,
    waiting: Vec<u64>,
    in_flight: usize,
    started: Option<Instant>,
    pages: u64,
    /// Pages left with fewer pieces than the redundancy's, for want of servers.
    degraded: u64,
    /// Pages queued that needed nothing by their turn: freed, or written anew (on live
    /// servers) since they were queued.
    unneeded: u64,
    /// Only catching up on a short silence of a server ([`RemoteStore::catch_up`]): not said
    /// on stderr when done.
    quiet: bool,
}

/// A page's writes in flight (write-backs and repairs), and the newest write-back among them
/// or finished while any was in flight: a write (or repair) started before that one is
/// superseded, and its pieces are not placed anew (after a refusal, or its server buried or
/// gone slow): the newer write-back writes every piece, and an older piece placed after it
/// would put old bytes where the page is read, which a page of one unsealed copy cannot show.
/// A repair is no write-back here: it writes only the pieces it rebuilt, from a read that
/// came after every write-back before it, so a write-back older than a repair still places
/// its pieces. Kept while any write of the page is in flight, so a write-back that finished
/// first still supersedes an older write that waits on a slow server.
#[derive(Default)]
struct Writes {
    newest: u64,
    in_flight: u32,
}

/// Everything the answers change, apart from the links.
struct Book {
    /// Shared with fork() children (the same key: they read what this process sealed).
    codec: Arc<Codec>,
    meta: Meta,
    groups: Groups,
    ops: HashMap<u64, Op>,
    next_op: u64,
    /// Pages with an operation of the pager's in flight.
    busy: HashMap<u64, u64>,
    /// Pages with writes in flight ([`Writes`]).
    writing: HashMap<u64, Writes>,
    /// While a repair or drain runs: the last write of pieces over each page where it is
    /// ([`PageStore::store_parts`]), by operation. A move that read the page through this
    /// client before it is stale (the page's group does not change, so nothing else tells).
    parted: HashMap<u64, u64>,
    /// Servers given up, and why.
    dead: Vec<Option<String>>,
    /// Servers leaving the pool (a drain): still read, never given new pieces; their pages
    /// move elsewhere like a repair whose source is still there.
    draining: Vec<bool>,
    /// Servers that answered nothing for [`HEDGE_AFTER`] while a request waited, or whose
    /// link is down and being reopened: alive, still read (and their reads hedged), but new
    /// write-backs go elsewhere while another server can take them, and those waiting on
    /// them are redirected ([`RemoteStore::redirect_writes`]). Since when each has been slow.
    /// Refreshed on every poll, once the answers are read (not in tick: see there); only with
    /// redundancy (a page of one copy cannot be read without its server anyway).
    slow: Vec<Option<Instant>>,
    /// Per server, the tag of the newest request the hedge has looked at while the server is
    /// slow or lagging ([`Conn::newest_tag`]): each poll looks only at what was sent since, so
    /// a silent link holding thousands of write-backs costs nothing per poll. 0 on turning
    /// slow, and for every slow server when one stops being slow or a server joins or comes
    /// back (all looked at again: what could be moved or released may have changed).
    hedged: Vec<u64>,
    /// Write-backs (not repairs, not released) with pieces waiting on slow or lagging links,
    /// by operation (oldest first), with those pieces: the candidates for
    /// [`RemoteStore::release_held_writes`], filled as the hedge sees them.
    slow_held: std::collections::BTreeMap<u64, u32>,
    /// Per server: reads that waited too long there while it answered ([`Lag`]).
    lag: Vec<Lag>,
    /// A write-back was stored with a piece fewer since the last catch-up, because a member
    /// was slow and no prompt server could take its piece ([`RemoteStore::degrade`]): its page
    /// is repaired when a slow server answers again ([`RemoteStore::catch_up`]).
    short_since_catch_up: bool,
    /// Bytes of the pieces released write-backs still wait for ([`RELEASED_MAX_BYTES`]).
    released_bytes: u64,
    /// The released write-backs not yet wholly stored, by operation id (oldest first): what
    /// [`PageStore::settled`] looks at.
    released_ops: std::collections::BTreeSet<u64>,
    /// Write-backs stored a piece short ([`RemoteStore::degrade`]) whose page may still be
    /// made whole, by (at most) their operation id, with the page: also what
    /// [`PageStore::settled`] looks at ([`RemoteStore::settle_short_writes`] forgets them).
    short_writes: std::collections::BTreeMap<u64, u64>,
    /// The most of them ([`RELEASED_MAX_BYTES`] unless a test sets it).
    released_max: u64,
    /// Fetch buffers to reuse (`Codec::slots` units each).
    bufs: Vec<Vec<u8>>,
    /// A sealed page's copy, to check a repair's seal on.
    scratch: Vec<u8>,
    counters: Arc<StoreCounters>,
}

/// Pages on a set of memory servers.
pub struct RemoteStore {
    conns: Vec<Conn>,
    book: Book,
    placement: Placement,
    token: Vec<u8>,
    timing: Timing,
    session: SessionId,
    units: Vec<u8>,
    todo: Vec<Todo>,
    /// Servers that refused a page (`Full`) until it is stored.
    refusals: HashMap<u64, Vec<usize>>,
    repair: Repair,
    pulls: Pulls,
    next_revive: Instant,
    /// The wait before the next try at buried servers ([`REVIVE_FIRST`] doubling up to
    /// [`REVIVE_EVERY`]; back to the first at each loss).
    revive_wait: Duration,
    /// Fetches that had nothing out for them at the last check, and when the next is due
    /// ([`RemoteStore::check_fetches`]).
    idle_fetches: std::collections::HashSet<u64>,
    next_fetch_check: Instant,
    /// Per server, a try to reach it again in flight ([`RemoteStore::revive`]).
    reviving: Vec<Option<mpsc::Receiver<Result<Conn, StoreError>>>>,
    /// The codec the fork() child of the latest snapshot seals with (its own key: see
    /// [`Stamp`]), made in [`PageStore::snapshot`] where failing is an answer; the child
    /// takes it from its copy of this store.
    child_codec: Option<Arc<Codec>>,
    /// Write-backs finished where no completion can be delivered: in `tick`, a server buried
    /// there (or in `flush`) left its unanswered writes to be placed, and with no spare
    /// server each is stored degraded at once. Delivered by the next `poll`; until then they
    /// count as in flight.
    finished: Vec<u64>,
    /// The pool this client is in, if any: where new servers come from, and its grant.
    pool: Option<Pool>,
    /// Past [`RELEASED_MAX_BYTES`], write-backs may be stored a piece short of the layout
    /// ([`RemoteStore::degrade`]); off where a front end would rather wait for a slow server
    /// than have pages a piece short ([`RemoteStore::never_store_short`]).
    store_short: bool,
}

/// A client's part of a pool, as the store follows it.
struct Pool {
    link: PoolLink,
    /// The manager's answer last acted on.
    epoch: u64,
    /// The most bytes this client may place on servers ([`UNLIMITED`]: no limit).
    grant_bytes: u64,
    /// Offered servers that could not be joined, and when to try again.
    retry: HashMap<String, Instant>,
    /// Offered servers being dialled, each on a thread of its own: the link, once open, is
    /// taken on a later call (a connect on the pager's thread held every fault for up to
    /// [`JOIN_TIMEOUT`] every [`REVIVE_EVERY`] while an offered server's host hung).
    joining: HashMap<String, mpsc::Receiver<Result<Conn, StoreError>>>,
    /// Draining servers this client cannot let go (too few others for its layout), and why:
    /// said once on stderr, and in every beat (`ServerUse::kept`) for `rmem pool drain`.
    stuck: HashMap<String, String>,
    /// Offered servers this client could not reach: said once, until it joins.
    unreachable: std::collections::HashSet<String>,
}

/// Whether a fetched piece is decoded in the link's input buffer, where it came, rather than
/// copied into the fetch's buffer first: a copy (one slot) the pager asked for (`for_pager`);
/// a repair keeps what came as it came, and fragments are gathered to be decoded together.
/// The cells a mask of them spans: (first, count), or `None` for none.
fn cells_of(mask: u64) -> Option<(usize, usize)> {
    (mask != 0).then(|| {
        let first = mask.trailing_zeros() as usize;
        (first, 64 - mask.leading_zeros() as usize - first)
    })
}

fn opened_where_it_comes(codec: &Codec, for_pager: bool) -> bool {
    codec.slots() == 1 && for_pager
}

/// Say that pool server `addr` could not be reached (`e`). Said once per server until it
/// joins: a server that registered an address this client cannot reach (its own loopback, a
/// network this node is not on) otherwise takes no page from it, and nothing says why.
fn say_unreachable(addr: &str, e: &StoreError) {
    crate::tell!(
        "rmem: memory server {addr}, offered by the pool's manager, cannot be reached from \
         here ({e}); tried again every {} s",
        REVIVE_EVERY.as_secs()
    );
}

/// Open a link to `server` in `session` on a thread of its own (named `thread`), so that a host
/// that is down or hangs holds nobody: the link, or why it could not be opened, comes through
/// the receiver (closed if the receiver is gone by then). None: no thread to be had now (the
/// caller tries again later).
fn dial_apart(
    thread: &str,
    server: &str,
    token: &[u8],
    unit: usize,
    session: SessionId,
    timing: Timing,
) -> Option<mpsc::Receiver<Result<Conn, StoreError>>> {
    let (done, dialing) = mpsc::channel();
    let (server, token) = (server.to_string(), token.to_vec());
    let dial = move || {
        let _ = done.send(Conn::connect(&server, &token, unit, session, timing));
    };
    std::thread::Builder::new()
        .name(thread.into())
        .spawn(dial)
        .ok()
        .map(|_| dialing)
}

/// Connect to each of `servers` in `session`, all at once (each on a thread of its own), and
/// give each one's link or error, in order. Every dial is waited for, each bounded by the
/// connect timeout, except that with `enough` (a layout that outlives losing servers) the
/// start waits past [`START_GRACE`] only while fewer than `enough` links are in: a host that
/// is down or hangs then holds each new process up for that long, not for the connect
/// timeout (a shell script's every command paid it), and comes back timed out (the store
/// buries it and tries it again every [`REVIVE_EVERY`]).
fn dial_all(
    servers: &[String],
    token: &[u8],
    unit: usize,
    session: SessionId,
    timing: Timing,
    enough: Option<usize>,
) -> Vec<Result<Conn, StoreError>> {
    let start = Instant::now();
    let (done, dialed) = mpsc::channel();
    let mut got: Vec<Option<Result<Conn, StoreError>>> = servers.iter().map(|_| None).collect();
    for (i, s) in servers.iter().enumerate() {
        let (done, server, key) = (done.clone(), s.clone(), token.to_vec());
        let dial = move || {
            let _ = done.send((i, Conn::connect(&server, &key, unit, session, timing)));
        };
        if std::thread::Builder::new()
            .name("rmem-connect".into())
            .spawn(dial)
            .is_err()
        {
            // No thread to be had: dial here.
            got[i] = Some(Conn::connect(s, token, unit, session, timing));
        }
    }
    drop(done);
    // Each dial ends by itself within the connect timeout; the second is slack.
    let last = start + timing.connect + Duration::from_secs(1);
    loop {
        let ok = got.iter().filter(|g| matches!(g, Some(Ok(_)))).count();
        if got.iter().all(Option::is_some) {
            break;
        }
        let until = match enough {
            Some(n) if ok >= n => (start + START_GRACE).min(last),
            _ => last,
        };
        let Some(left) = until.checked_duration_since(Instant::now()) else {
            break;
        };
        match dialed.recv_timeout(left) {
            Ok((i, r)) => got[i] = Some(r),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let waited = start.elapsed().as_secs_f64();
    got.into_iter()
        .zip(servers)
        .map(|(g, s)| {
            g.unwrap_or_else(|| {
                Err(StoreError::Timeout {
                    server: s.clone(),
                    secs: waited,
                    detail: " connecting at start".into(),
                })
            })
        })
        .collect()
}

/// Beside the run's statistics (`RMEM_STATS_JSON`), the servers a process of the run said it
/// started without ([`RemoteStore::say_down_at_start`]); `rmem run` removes it.
pub fn told_path(stats: &std::path::Path) -> std::path::PathBuf {
    let mut p = stats.as_os_str().to_owned();
    p.push(".unreachable");
    p.into()
}

/// Of `names`, those `path` does not list yet, added to it (under an exclusive lock: the
/// run's processes start at once). Any error reading or writing it: all of them (said
/// again rather than not at all).
fn not_told_yet(path: &std::path::Path, names: &[&str]) -> Vec<String> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let all = || names.iter().map(|n| n.to_string()).collect();
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
    else {
        return all();
    };
    // SAFETY: flock on a descriptor this function owns; released when `f` closes.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return all();
    }
    let mut text = String::new();
    if f.rewind().is_err() || f.read_to_string(&mut text).is_err() {
        return all();
    }
    let fresh: Vec<String> = names
        .iter()
        .filter(|n| !text.lines().any(|l| l == **n))
        .map(|n| n.to_string())
        .collect();
    let add: String = fresh.iter().map(|n| format!("{n}\n")).collect();
    if f.write_all(add.as_bytes()).is_err() {
        return all();
    }
    fresh
}

fn bit(piece: usize) -> u32 {
    1 << piece
}

impl Book {
    fn unit(&self) -> usize {
        self.codec.unit_len()
    }

    fn alive(&self, s: u16) -> bool {
        s != NONE && self.dead[s as usize].is_none()
    }

    /// Whether server `s` may be given pieces: alive and not draining.
    fn placeable(&self, s: u16) -> bool {
        self.alive(s) && !self.draining[s as usize]
    }

    /// Whether server `s` may be given pieces and answers: placeable and not slow.
    fn prompt(&self, s: u16) -> bool {
        self.placeable(s) && !self.slow(s)
    }

    fn slow(&self, s: u16) -> bool {
        self.slow[s as usize].is_some()
    }

    /// Whether new reads ask server `s` last: slow, or lagging ([`READ_HEDGE_AFTER`]).
    fn read_last(&self, s: u16) -> bool {
        self.slow(s) || self.lag[s as usize].lagging
    }

    fn op_id(&mut self) -> u64 {
        self.next_op += 1;
        self.next_op
    }

    /// An answer from server `s`.
    fn answer(
        &mut self,
        s: usize,
        a: Answer<'_>,
        f: &mut dyn FnMut(Completion<'_>),
        todo: &mut Vec<Todo>,
    ) {
        match a {
            Answer::Read { op, piece, data } => {
                if let Some(Op::Patch(pa)) = self.ops.get_mut(&op) {
                    let m = piece as usize;
                    match pa.spans[m] {
                        Some((_, n)) if pa.waiting & bit(m) != 0 && data.len() == n * CELL => {
                            rmem_copy::extend(&mut pa.got[m], data);
                            pa.waiting &= !bit(m);
                            if pa.waiting == 0 {
                                todo.push(Todo::PatchWrite(op));
                            }
                        }
                        _ => todo.push(Todo::PatchFailed(op)),
                    }
                    return;
                }
                let Some(Op::Fetch(fe)) = self.ops.get_mut(&op) else {
                    return; // late: the page was read from other pieces
                };
                let p = piece as usize;
                if fe.part.is_none() && data.len() != self.codec.unit_len() {
                    // A cell read for this fetch before it was made a read of the whole page:
                    // no answer to what it asks now (that server's whole fragment was asked
                    // too, where the page needs it: see `ask`).
                    return;
                }
                fe.answered |= bit(p);
                if let Some((offset, len)) = fe.part.filter(|_| !self.codec.plain()) {
                    // A piece's cell, checked alone.
                    let i = offset as usize / PIECE;
                    if self
                        .codec
                        .open_piece(fe.page, fe.stamps.of(i), i, data)
                        .is_ok()
                    {
                        let page = fe.page;
                        self.ops.remove(&op);
                        self.unbusy(page, op);
                        f(Completion::Fetched {
                            page: PageIndex(page),
                            data: &data[..len as usize],
                        });
                    } else {
                        fe.bad |= bit(p);
                        self.counters.pieces_bad.fetch_add(1, Relaxed);
                        todo.push(Todo::Ask(op));
                    }
                    return;
                }
                if self.codec.plain() && fe.repair {
                    // A move off a draining server: write it where it goes.
                    let (page, stamp) = (fe.page, fe.stamps.latest);
                    self.ops.remove(&op);
                    let mut units = self.take_buf();
                    rmem_copy::copy(&mut units, data);
                    todo.push(Todo::RepairWrite {
                        page,
                        stamp,
                        units,
                        have: 1,
                        read: op,
                    });
                    return;
                }
                if self.codec.plain() {
                    let page = fe.page;
                    self.ops.remove(&op);
                    self.unbusy(page, op);
                    f(Completion::Fetched {
                        page: PageIndex(page),
                        data,
                    });
                    return;
                }
                let (unit, slot) = (self.codec.unit_len(), self.codec.slot_of(p));
                if fe.have & !bit(p) != 0 && self.codec.slots() == 1 {
                    return; // a second copy: the first is being decoded
                }
                fe.have |= bit(p);
                if opened_where_it_comes(&self.codec, !fe.repair) {
                    self.try_decode(op, Some(data), f, todo);
                    return;
                }
                rmem_copy::copy(&mut fe.buf[slot * unit..(slot + 1) * unit], data);
                self.try_decode(op, None, f, todo);
            }
            Answer::Missing { op, piece } => {
                if let Some(Op::Patch(_)) = self.ops.get(&op) {
                    todo.push(Todo::PatchFailed(op));
                }
                if let Some(Op::Fetch(fe)) = self.ops.get_mut(&op) {
                    fe.answered |= bit(piece as usize);
                    fe.bad |= bit(piece as usize);
                    self.counters.pieces_bad.fetch_add(1, Relaxed);
                    todo.push(Todo::Ask(op));
                }
            }
            Answer::Written { op, piece } => self.written(op, piece as usize, f, todo),
            Answer::Full { op, piece, unit } => todo.push(Todo::Place {
                op,
                piece,
                unit,
                refused: Some(s),
            }),
            Answer::Pulled { batch, stored, why } => todo.push(Todo::Pulled {
                batch,
                stored: stored as usize,
                why: why.to_string(),
            }),
        }
    }

    fn written(
        &mut self,
        op: u64,
        piece: usize,
        f: &mut dyn FnMut(Completion<'_>),
        todo: &mut Vec<Todo>,
    ) {
        let Some(Op::Store(st)) = self.ops.get_mut(&op) else {
            return;
        };
        if st.ranges > 0 {
            // Pieces written alone, to every member: done with the last range's answer (such
            // a write is never released).
            st.ranges -= 1;
            if st.ranges > 0 {
                return;
            }
            st.waiting = 0;
        }
        if st.released && st.waiting & bit(piece) != 0 {
            self.released_bytes -= self.codec.unit_len() as u64;
        }
        st.waiting &= !bit(piece);
        if st.waiting != 0 {
            return;
        }
        let (page, repair, released) = (st.page, st.repair, st.released);
        self.ops.remove(&op);
        if released {
            self.released_ops.remove(&op);
        }
        if let Some(w) = self.writing.get_mut(&page) {
            w.in_flight -= 1;
            if w.in_flight == 0 {
                self.writing.remove(&page);
            }
        }
        if repair {
            todo.push(Todo::Repaired);
        } else if !released {
            self.unbusy(page, op);
            f(Completion::Stored {
                page: PageIndex(page),
            });
        }
    }

    /// `op` on `page` is done: the page is no longer busy, unless it is busy with another
    /// operation of the pager's since.
    fn unbusy(&mut self, page: u64, op: u64) {
        if self.busy.get(&page) == Some(&op) {
            self.busy.remove(&page);
        }
    }

    /// A fetch buffer: one reused, or a new one.
    fn take_buf(&mut self) -> Vec<u8> {
        let len = self.codec.slots() * self.codec.unit_len();
        let mut b = self.bufs.pop().unwrap_or_default();
        b.resize(len, 0);
        b
    }

    /// Keep a fetch buffer for the next fetch (a few: as many as fetches overlap).
    fn give_buf(&mut self, b: Vec<u8>) {
        if self.bufs.len() < BUFS_KEPT && !b.is_empty() {
            self.bufs.push(b);
        }
    }

    /// A fetch with a new piece in: decode when enough are (a repair: rebuild every piece);
    /// a bad seal asks for more. The pieces are in the fetch's buffer, or `came` is the one
    /// that came, where it came ([`opened_where_it_comes`]): it is opened there.
    fn try_decode(
        &mut self,
        op: u64,
        mut came: Option<&mut [u8]>,
        f: &mut dyn FnMut(Completion<'_>),
        todo: &mut Vec<Todo>,
    ) {
        let needed = self.codec.redundancy().needed();
        let Some(Op::Fetch(fe)) = self.ops.get_mut(&op) else {
            return;
        };
        if fe.moving != 0 {
            // A move: its pieces go as they came (a later fetch checks their seal).
            if fe.have & fe.moving == fe.moving {
                self.counters
                    .pieces_moved
                    .fetch_add(u64::from(fe.moving.count_ones()), Relaxed);
                let Some(Op::Fetch(fe)) = self.ops.remove(&op) else {
                    unreachable!()
                };
                todo.push(Todo::RepairWrite {
                    page: fe.page,
                    stamp: fe.stamps.latest,
                    units: fe.buf,
                    have: fe.have,
                    read: op,
                });
            }
            return;
        }
        let outstanding = (fe.asked & !fe.answered) != 0;
        // Every piece was asked after a bad seal: try once all are in. A data piece cleared
        // after a bad seal is to be asked again: until it is back, the pieces here are not
        // all there are, and a subset failing says nothing of them.
        let (all, asked, gone) = (fe.all, fe.asked, fe.gone);
        let few = (fe.have.count_ones() as usize) < needed;
        let members = &self.groups.members[fe.group as usize];
        let waiting = all
            && (outstanding
                || (0..members.len())
                    .any(|i| (asked | gone) & bit(i) == 0 && self.alive(members[i])));
        if few || waiting {
            if !outstanding {
                // Nothing more comes unless asked: ask, or end the fetch (`ask` says why).
                todo.push(Todo::Ask(op));
            }
            return;
        }
        let Some(Op::Fetch(fe)) = self.ops.get_mut(&op) else {
            unreachable!()
        };
        let codec = &self.codec;
        let (page, stamps) = (fe.page, fe.stamps.clone());
        let pieces = match came.as_deref_mut() {
            Some(came) => came,
            None => &mut fe.buf[..],
        };
        let ok = if !fe.all {
            // In place: a repair leaves the pieces as they came whatever the seal says; a
            // fetch decrypts them, so under encryption a bad seal leaves the data fragments
            // to be asked again.
            let r = if fe.repair {
                codec.rebuild(page, &stamps, pieces, fe.have, &mut self.scratch)
            } else {
                codec.decode(page, &stamps, pieces, fe.have)
            };
            if r.is_err() && !fe.repair && codec.encrypted() && needed > 1 {
                let data = (1u32 << needed) - 1;
                let spoilt = fe.have & data;
                fe.have &= !spoilt;
                fe.asked &= !spoilt;
                fe.answered &= !spoilt;
            }
            r.is_ok()
        } else {
            // Without each piece in turn, on a copy: the bad one is then known. Exactly K
            // pieces are tried as they are instead (leaving one out leaves too few): a data
            // piece cleared after a bad seal (above) and asked again may not be back yet, and
            // the K here be good ones (a lying parity piece got a good data piece cleared);
            // decoded, every one of K is checked.
            let mut found = false;
            let mut copy = std::mem::take(&mut self.scratch);
            let mut spare = Vec::new();
            let each = (0..32).filter(|&i| fe.have & bit(i) != 0).map(Some);
            let as_they_are = fe.have.count_ones() as usize == needed;
            for leave in std::iter::once(None).filter(|_| as_they_are).chain(each) {
                let have = leave.map_or(fe.have, |i| fe.have & !bit(i));
                if (have.count_ones() as usize) < needed {
                    continue;
                }
                copy.clear();
                rmem_copy::extend(&mut copy, &fe.buf);
                let r = if fe.repair {
                    codec.rebuild(page, &stamps, &mut copy, have, &mut spare)
                } else {
                    codec.decode(page, &stamps, &mut copy, have)
                };
                if r.is_ok() {
                    std::mem::swap(&mut fe.buf, &mut copy);
                    fe.have = have;
                    if let Some(i) = leave {
                        fe.bad |= bit(i);
                        self.counters.pieces_bad.fetch_add(1, Relaxed);
                    }
                    found = true;
                    break;
                }
            }
            self.scratch = copy;
            found
        };
        if ok {
            let Some(Op::Fetch(fe)) = self.ops.remove(&op) else {
                unreachable!()
            };
            if fe.repair {
                todo.push(Todo::RepairWrite {
                    page,
                    stamp: stamps.latest,
                    units: fe.buf,
                    have: (1u32 << self.codec.redundancy().width()) - 1,
                    read: op,
                });
            } else if let Some(then) = fe.then_store {
                // A patch that could not be made: the page with its written pieces, whole.
                let pieces = came.as_deref().unwrap_or(&fe.buf);
                let ps = self.codec.page_size();
                let mut data = pieces[..ps].to_vec();
                let (mask, written) = *then;
                for (n, i) in (0..64).filter(|i| mask & (1 << i) != 0).enumerate() {
                    data[i * PIECE..(i + 1) * PIECE]
                        .copy_from_slice(&written[n * PIECE..(n + 1) * PIECE]);
                }
                todo.push(Todo::StoreWhole { page, data });
                self.give_buf(fe.buf);
            } else {
                self.unbusy(page, op);
                let pieces = came.as_deref().unwrap_or(&fe.buf);
                let data = match fe.only {
                    Some(i) => &pieces[i as usize * PIECE..(i as usize + 1) * PIECE],
                    None => &pieces[..self.codec.page_size()],
                };
                f(Completion::Fetched {
                    page: PageIndex(page),
                    data,
                });
                self.give_buf(fe.buf);
            }
            return;
        }
        // Whether a piece not in, not bad and not gone may still come, from a live server.
        let more = match self.ops.get(&op) {
            Some(Op::Fetch(fe)) => {
                let seen = fe.have | fe.bad | fe.gone;
                let members = &self.groups.members[fe.group as usize];
                (0..members.len()).any(|i| seen & bit(i) == 0 && self.alive(members[i]))
            }
            _ => unreachable!(),
        };
        let Some(Op::Fetch(fe)) = self.ops.get_mut(&op) else {
            unreachable!()
        };
        if needed == 1 {
            // A replica that fails its seal: it is bad; ask another.
            fe.bad |= fe.have;
            self.counters
                .pieces_bad
                .fetch_add(u64::from(fe.have.count_ones()), Relaxed);
            fe.have = 0;
        } else if !fe.all {
            fe.all = true;
        } else {
            // Every subset failed. Exactly K pieces in (a data piece cleared after a bad seal
            // came back with the liar still here, while an honest piece's read was failed
            // over): which one is bad cannot be told, and a piece still to come decides
            // (leaving each out then finds it). With none to come, or more than K in, nothing
            // here is this page.
            if !more || fe.have.count_ones() as usize > needed {
                fe.bad |= fe.have;
                fe.have = 0;
            }
        }
        todo.push(Todo::Ask(op));
    }
}

impl RemoteStore {
    /// Connect to every server, in order, and open one new session (a random id) on each,
    /// each page whole on one server, not sealed.
    pub fn connect(
        servers: &[String],
        token: &[u8],
        page_size: usize,
        placement: Placement,
        timing: Timing,
    ) -> Result<RemoteStore, StoreError> {
        let layout = Layout {
            placement,
            redundancy: Redundancy::None,
            encrypt: false,
        };
        RemoteStore::connect_with(servers, token, page_size, layout, timing)
    }

    /// [`RemoteStore::connect`] with redundancy and encryption. The first failure is
    /// returned; sessions already opened are ended.
    pub fn connect_with(
        servers: &[String],
        token: &[u8],
        page_size: usize,
        layout: Layout,
        timing: Timing,
    ) -> Result<RemoteStore, StoreError> {
        let store = RemoteStore::open(servers, token, page_size, layout, timing, None)?;
        store.say_down_at_start(None);
        Ok(store)
    }

    /// Say on stderr which servers this store starts without (down at start: see `open`),
    /// but not again what another process of the same run said: `told` (a file beside the
    /// run's `RMEM_STATS_JSON`) lists those said, one per line. Each exec of a launcher
    /// (pyenv's shim execs about seven times) and each command of a script under `rmem run
    /// --children` starts a runtime of its own, and each said the same line.
    fn say_down_at_start(&self, told: Option<&std::path::Path>) {
        let down: Vec<(&str, &str)> = (0..self.conns.len())
            .filter_map(|s| Some((self.conns[s].name.as_str(), self.book.dead[s].as_deref()?)))
            .collect();
        if down.is_empty() {
            return;
        }
        let names: Vec<&str> = down.iter().map(|(n, _)| *n).collect();
        let fresh = match told {
            Some(path) => not_told_yet(path, &names),
            None => names.iter().map(|n| n.to_string()).collect(),
        };
        let said: Vec<String> = down
            .iter()
            .filter(|(n, _)| fresh.iter().any(|f| f == n))
            .map(|(n, why)| format!("{n} ({why})"))
            .collect();
        if said.is_empty() {
            return;
        }
        crate::tell!(
            "rmem: memory servers unreachable at start: {}; the program starts without them \
             (--redundancy {} outlives their loss), each tried again every {} s",
            said.join("; "),
            self.book.codec.redundancy(),
            REVIVE_EVERY.as_secs()
        );
    }

    /// The store `config` names: its servers, or those of its pool manager (then this store
    /// follows the pool: servers that join take new pages; the client's grant bounds what it
    /// places). The layout is `config`'s, over the servers it starts with.
    pub fn from_config(config: &Config) -> Result<RemoteStore, StoreError> {
        let Some(manager) = &config.manager else {
            let (redundancy, encrypt) = config.layout();
            let layout = Layout {
                placement: config.placement,
                redundancy,
                encrypt,
            };
            let mut store = RemoteStore::open(
                &config.servers,
                &config.token,
                config.page_size,
                layout,
                Timing::of(config),
                None,
            )?;
            let told = config
                .stats_json
                .as_ref()
                .map(|p| told_path(std::path::Path::new(p)));
            store.say_down_at_start(told.as_deref());
            store.pulls.off = !config.pull;
            return Ok(store);
        };
        let io = |e| StoreError::Io {
            server: manager.clone(),
            source: e,
        };
        let session = SessionId::random().map_err(io)?;
        let max = config.max_remote_bytes.unwrap_or(UNLIMITED);
        let link = PoolLink::start(manager, &config.token, session, client_name(), max)?;
        let view = link.view();
        let servers: Vec<String> = view
            .servers
            .iter()
            .filter(|s| s.takes_pages())
            .map(|s| s.addr.clone())
            .collect();
        if servers.is_empty() {
            return Err(StoreError::Manager {
                manager: manager.clone(),
                detail: "knows no live memory server with room (rmem server --manager adds \
                         one)"
                    .into(),
            });
        }
        let c = Config {
            servers,
            ..config.clone()
        };
        let (redundancy, encrypt) = c.layout();
        let layout = Layout {
            placement: c.placement,
            redundancy,
            encrypt,
        };
        let mut store = RemoteStore::open(
            &c.servers,
            &c.token,
            c.page_size,
            layout,
            Timing::of(&c),
            Some(link),
        )?;
        store.pulls.off = !c.pull;
        Ok(store)
    }

    /// Open a session on every server of `servers` (in a pool, those that answer: the
    /// manager's list may name one that just went away).
    fn open(
        servers: &[String],
        token: &[u8],
        page_size: usize,
        layout: Layout,
        timing: Timing,
        pool: Option<PoolLink>,
    ) -> Result<RemoteStore, StoreError> {
        assert!(servers.len() <= SERVERS_MAX, "too many servers");
        if let Some((i, s)) = servers
            .iter()
            .enumerate()
            .find(|(i, s)| servers[..*i].contains(s))
        {
            // Two links in one session would fence each other.
            return Err(StoreError::Layout(format!(
                "memory server {s} is named twice (servers {} and {}): name each server once",
                servers.iter().position(|x| x == s).expect("found") + 1,
                i + 1
            )));
        }
        let w = layout.redundancy.width();
        let io = |e| StoreError::Io {
            server: "(none)".into(),
            source: e,
        };
        let codec = Codec::new(page_size, layout.redundancy, layout.encrypt).map_err(io)?;
        let session = match &pool {
            Some(p) => p.session(),
            None => SessionId::random().map_err(io)?,
        };
        let mut store = RemoteStore {
            book: Book {
                released_bytes: 0,
                released_ops: Default::default(),
                short_writes: Default::default(),
                released_max: RELEASED_MAX_BYTES,
                bufs: Vec::new(),
                scratch: Vec::new(),
                codec: Arc::new(codec),
                meta: Meta::default(),
                groups: Groups::default(),
                ops: HashMap::new(),
                next_op: 0,
                busy: HashMap::new(),
                writing: HashMap::new(),
                parted: HashMap::new(),
                dead: Vec::new(),
                draining: Vec::new(),
                slow: Vec::new(),
                hedged: Vec::new(),
                slow_held: Default::default(),
                lag: Vec::new(),
                short_since_catch_up: false,
                counters: Arc::new(StoreCounters {
                    layout: format!(
                        "{}{}",
                        layout.redundancy,
                        if layout.encrypt { ", encrypted" } else { "" }
                    ),
                    ..StoreCounters::default()
                }),
            },
            conns: Vec::new(),
            placement: layout.placement,
            token: token.to_vec(),
            timing,
            session,
            units: Vec::new(),
            todo: Vec::new(),
            refusals: HashMap::new(),
            repair: Repair::default(),
            pulls: Pulls::default(),
            next_revive: Instant::now(),
            revive_wait: REVIVE_FIRST,
            idle_fetches: Default::default(),
            next_fetch_check: Instant::now() + FETCH_CHECK_EVERY,
            reviving: Vec::new(),
            child_codec: None,
            finished: Vec::new(),
            pool: None,
            store_short: true,
        };
        let unit = store.book.unit();
        let mut unreachable = std::collections::HashSet::new();
        let tolerates = layout.redundancy.tolerates();
        // With a layout that outlives a loss, the start waits for a server that hangs only
        // until enough others answered and START_GRACE passed.
        let enough = (tolerates > 0 && pool.is_none()).then(|| layout.redundancy.needed());
        let dialed = dial_all(servers, token, unit, session, timing, enough);
        for (s, dial) in servers.iter().zip(dialed) {
            match dial {
                Ok(c) => store.join(c),
                Err(e) if pool.is_some() => {
                    say_unreachable(s, &e);
                    unreachable.insert(s.clone());
                }
                Err(e) if tolerates > 0 && remote::down_at_start(&e) => {
                    // As if lost at once: a program that starts after its parent lost a
                    // server (a shell script, a launcher that execs) goes on as the parent
                    // does, and the server is tried again every REVIVE_EVERY.
                    store.join(Conn::unreachable(s, token, unit, session, timing));
                    *store.book.dead.last_mut().expect("just joined") =
                        Some(crate::error_chain(&e));
                }
                Err(e) => return Err(e),
            }
        }
        // Two names for one server (a host name and its address) are caught where the links
        // are: its pieces would share one server, silently short of the layout's copies.
        for i in 0..store.conns.len() {
            let Some(at) = store.conns[i].peer_addr() else {
                continue;
            };
            if let Some(j) = (0..i).find(|&j| store.conns[j].peer_addr() == Some(at)) {
                return Err(StoreError::Layout(format!(
                    "memory servers {} and {} are the same server ({at}): name each server once",
                    store.conns[j].name, store.conns[i].name
                )));
            }
        }
        if store.conns.len() < w {
            return Err(StoreError::Layout(format!(
                "--redundancy {} puts each page on {w} servers; there are {}",
                layout.redundancy,
                store.conns.len()
            )));
        }
        // Servers down at start, under a layout that outlives losing them.
        let lost = store.book.dead.iter().filter(|d| d.is_some()).count();
        if lost > 0 {
            let needed = layout.redundancy.needed();
            if store.conns.len() - lost < needed {
                return Err(StoreError::Lost {
                    servers: store.dead_list(),
                    detail: format!(
                        "--redundancy {} needs {needed} servers answering to store a page; \
                         {lost} of {} are unreachable",
                        layout.redundancy,
                        store.conns.len()
                    ),
                });
            }
            store
                .book
                .counters
                .servers_lost
                .fetch_add(lost as u64, Relaxed);
        }
        if let Some(link) = &pool {
            for offer in link.view().servers {
                if let Some(c) = store.conns.iter_mut().find(|c| c.name == offer.addr) {
                    c.disk = offer.flags & SERVER_DISK != 0;
                }
            }
        }
        store.pool = pool.map(|link| Pool {
            epoch: link.epoch(),
            grant_bytes: link.view().grant_bytes,
            link,
            retry: HashMap::new(),
            joining: HashMap::new(),
            stuck: Default::default(),
            unreachable,
        });
        Ok(store)
    }

    /// Add a connected server to the list: it takes new pages from now on. Its index is
    /// the list's length and never changes.
    fn join(&mut self, conn: Conn) {
        assert!(self.conns.len() < SERVERS_MAX, "too many servers");
        self.conns.push(conn);
        self.book.dead.push(None);
        self.book.draining.push(false);
        self.book.slow.push(None);
        self.book.hedged.push(0);
        self.book.lag.push(Lag::default());
        // Writes that could go nowhere else before may go to it.
        self.book.hedged.fill(0);
        self.reviving.push(None);
    }

    /// Act on what the pool's manager last said: join the servers it offers that this store
    /// lacks, take the free memory it reports for placement and the grant, and tell it what
    /// this client uses where (sent with the next beat).
    fn follow_pool(&mut self, now: Instant) {
        let Some(pool) = &mut self.pool else {
            return;
        };
        let uses = self
            .conns
            .iter()
            .zip(&self.book.dead)
            .filter(|(_, d)| d.is_none())
            .map(|(c, _)| ServerUse {
                server: c.name.clone(),
                bytes: c.used_bytes,
                kept: pool.stuck.get(&c.name).cloned().unwrap_or_default(),
            })
            .collect();
        pool.link.report(uses);
        self.take_joins();
        let Some(pool) = &mut self.pool else {
            return;
        };
        let epoch = pool.link.epoch();
        let retry_due = pool.retry.values().any(|&t| t <= now);
        if epoch == pool.epoch && !retry_due {
            return;
        }
        pool.epoch = epoch;
        let view = pool.link.view();
        pool.grant_bytes = view.grant_bytes;
        // A server no longer offered is not tried again (a later offer dials at once).
        pool.retry
            .retain(|addr, _| view.servers.iter().any(|o| o.addr == *addr));
        // Offered servers that take pages and this client has not joined yet (and could
        // reach): a drain they could take waits for them rather than being told it cannot go.
        let joinable = view
            .servers
            .iter()
            .filter(|o| {
                o.takes_pages()
                    && !pool.unreachable.contains(&o.addr)
                    && !self.conns.iter().any(|c| c.name == o.addr)
            })
            .count();
        for offer in view.servers {
            if let Some(s) = self.conns.iter().position(|c| c.name == offer.addr) {
                // What the server has free now, and what of it this client holds.
                let c = &mut self.conns[s];
                c.capacity_bytes = offer.free_bytes.saturating_add(c.used_bytes);
                c.disk = offer.flags & SERVER_DISK != 0;
                // Draining (leaving) or reclaiming (its node is short of memory, for as long
                // as the flag is set): both move its pages off, as a repair.
                let reclaiming = offer.flags & SERVER_RECLAIMING != 0;
                let draining = offer.flags & SERVER_DRAINING != 0 || reclaiming;
                let others = (0..self.conns.len() as u16)
                    .filter(|&x| x as usize != s && self.book.placeable(x))
                    .count();
                let width = self.book.codec.redundancy().width();
                if !draining && self.book.draining[s] && self.book.dead[s].is_none() {
                    // Its reclaim is over (or a restarted manager forgot a drain): it takes
                    // pages again; moves still queued for it are skipped.
                    self.book.draining[s] = false;
                    self.pool
                        .as_mut()
                        .expect("checked")
                        .stuck
                        .remove(&offer.addr);
                    crate::tell!(
                        "rmem: memory server {} lends again; it takes new pages",
                        offer.addr
                    );
                    continue;
                }
                if draining && !self.book.draining[s] && self.book.dead[s].is_none() {
                    let pool = self.pool.as_mut().expect("checked");
                    if others < width {
                        // Pages could not be placed at all without it: it stays (the drain
                        // never completes; rmem pool drain says so), unless offered servers
                        // not joined yet make room: then it goes once they are (a later
                        // view), and no beat says it cannot meanwhile.
                        if others + joinable >= width {
                            pool.stuck.remove(&offer.addr);
                        } else if !pool.stuck.contains_key(&offer.addr) {
                            let what = if reclaiming {
                                "shed its pages"
                            } else {
                                "leave"
                            };
                            let why = format!(
                                "--redundancy {} puts each page on {width} server{}, and \
                                 {others} other{} left",
                                self.book.codec.redundancy(),
                                if width == 1 { "" } else { "s" },
                                if others == 1 { " is" } else { "s are" }
                            );
                            crate::tell!("rmem: memory server {} cannot {what}: {why}", offer.addr);
                            pool.stuck.insert(offer.addr.clone(), why);
                        }
                        continue;
                    }
                    // (Servers joined since it could not: it leaves now.)
                    pool.stuck.remove(&offer.addr);
                    let queued = self.drain(s);
                    let why = if offer.flags & SERVER_NODE_BORROWS != 0 {
                        "lends nothing while its node borrows (reclaiming)"
                    } else if reclaiming {
                        "is short of memory (reclaiming)"
                    } else {
                        "is leaving the pool"
                    };
                    crate::tell!(
                        "rmem: memory server {} {why}; moving the {queued} pages it holds to \
                         the others",
                        offer.addr
                    );
                }
                continue;
            }
            let pool = self.pool.as_mut().expect("checked");
            let due = pool.retry.get(&offer.addr).is_none_or(|&t| t <= now);
            if !offer.takes_pages()
                || !due
                || pool.joining.contains_key(&offer.addr)
                || self.conns.len() >= SERVERS_MAX
            {
                continue;
            }
            // Tried again after REVIVE_EVERY unless it joins meanwhile (then forgotten).
            pool.retry.insert(offer.addr.clone(), now + REVIVE_EVERY);
            let mut timing = self.timing;
            timing.connect = JOIN_TIMEOUT;
            let unit = self.book.unit();
            if let Some(dialing) = dial_apart(
                "rmem-join",
                &offer.addr,
                &self.token,
                unit,
                self.session,
                timing,
            ) {
                pool.joining.insert(offer.addr, dialing);
            }
        }
    }

    /// Take the links to offered servers that opened since the last call: each joins, unless
    /// the manager has since stopped offering it as a server to place on (gone, leaving, or
    /// short of memory), or this store is full of servers. A failed dial is tried again once
    /// due (its retry time was set when it started).
    fn take_joins(&mut self) {
        let Some(pool) = &mut self.pool else {
            return;
        };
        let (mut opened, mut failed) = (Vec::new(), Vec::new());
        pool.joining
            .retain(|addr, dialing| match dialing.try_recv() {
                Err(mpsc::TryRecvError::Empty) => true,
                Ok(Ok(c)) => {
                    opened.push((addr.clone(), c));
                    false
                }
                // A failed dial, or a thread that ended without a word: due again at its retry.
                Ok(Err(e)) => {
                    failed.push((addr.clone(), e));
                    false
                }
                Err(mpsc::TryRecvError::Disconnected) => false,
            });
        for (addr, e) in failed {
            if pool.unreachable.insert(addr.clone()) {
                say_unreachable(&addr, &e);
            }
        }
        if opened.is_empty() {
            return;
        }
        let view = pool.link.view();
        for (addr, mut c) in opened {
            let offer = view.servers.iter().find(|o| o.addr == addr);
            let Some(offer) = offer.filter(|o| o.takes_pages()) else {
                // Not offered for new pages any more: the link closes; a later offer dials
                // again.
                continue;
            };
            if self.conns.len() >= SERVERS_MAX || self.conns.iter().any(|k| k.name == addr) {
                continue;
            }
            c.set_timing(self.timing);
            c.disk = offer.flags & SERVER_DISK != 0;
            crate::tell!(
                "rmem: memory server {addr} joined the pool; it takes new pages{}",
                if c.disk {
                    " (on disk: once the RAM servers are full)"
                } else {
                    ""
                }
            );
            let pool = self.pool.as_mut().expect("checked");
            pool.retry.remove(&addr);
            pool.unreachable.remove(&addr);
            self.join(c);
            // Pages left short of pieces for want of servers can be whole again.
            self.queue_repairs(|b, m| m.iter().any(|&x| !b.placeable(x)));
        }
    }

    /// Whether one more page fits in this client's grant.
    fn within_grant(&self, page: u64) -> Result<(), StoreError> {
        let grant_bytes = self.pool.as_ref().map_or(UNLIMITED, |p| p.grant_bytes);
        if grant_bytes == UNLIMITED {
            return Ok(());
        }
        let used_bytes: u64 = self.conns.iter().map(|c| c.used_bytes).sum();
        let need = (self.book.codec.redundancy().width() * self.book.unit()) as u64;
        if used_bytes.saturating_add(need) > grant_bytes {
            return Err(StoreError::OverGrant {
                page,
                grant_bytes,
                used_bytes,
            });
        }
        Ok(())
    }

    /// This client's session id (the same on every server it started with).
    pub fn session(&self) -> SessionId {
        self.session
    }

    /// Links re-established so far, over all servers.
    pub fn reconnects(&self) -> u64 {
        self.conns.iter().map(|c| c.reconnects).sum()
    }

    /// The server holding `page`'s first piece, if any (for messages and tests).
    pub fn server_of(&self, page: PageIndex) -> Option<&str> {
        let g = self.book.meta.group(page.0)?;
        Some(self.conns[self.book.groups.members[g as usize][0] as usize].name())
    }

    /// Bytes placed on each server by this client.
    pub fn used_per_server(&self) -> Vec<(String, u64)> {
        self.conns
            .iter()
            .map(|c| (c.name.clone(), c.used_bytes))
            .collect()
    }

    /// Bytes each server stores per page.
    pub fn unit_len(&self) -> usize {
        self.book.unit()
    }

    /// Servers for a page that has none: `width` distinct live servers in placement order
    /// from the page's start, not known to be full first; else any that has not refused it.
    /// `spread`: the page's start is its own (as under stripe) whatever the placement, so that
    /// the pages of a lost or draining server are rebuilt over all the others at once, not
    /// all onto the next one in line.
    fn choose(&self, page: u64, keep: &[u16], spread: bool) -> Result<Vec<u16>, StoreError> {
        let n = self.conns.len();
        let w = self.book.codec.redundancy().width();
        let start = match self.placement {
            Placement::Priority | Placement::Free if !spread => 0,
            _ => (page % n as u64) as usize,
        };
        let refused = self.refusals.get(&page).map_or(&[][..], |r| r.as_slice());
        let mut order: Vec<u16> = (0..n)
            .map(|i| ((start + i) % n) as u16)
            .filter(|&s| self.book.placeable(s) && !refused.contains(&(s as usize)))
            .filter(|s| !keep.contains(s))
            .collect();
        if self.placement == Placement::Free {
            // Servers with room for a unit first, of those the RAM tier first (a disk-backed
            // server only when the RAM servers are full), then the most free memory (spread:
            // the page's start, since what a server last said it has free is the same for
            // every page of a rebuild).
            let unit = self.book.unit() as u64;
            let key = |s: &u16| {
                let c = &self.conns[*s as usize];
                let free = c.capacity_bytes.saturating_sub(c.used_bytes);
                let most = if spread { 0 } else { free };
                (c.full || free < unit, c.disk, std::cmp::Reverse(most))
            };
            order.sort_by_key(key);
        }
        // Servers with room before full ones, and slow ones last of all (stable: the order
        // above holds within each).
        order.sort_by_key(|&s| (self.book.slow(s), self.conns[s as usize].full));
        let mut out: Vec<u16> = keep.to_vec();
        for &s in &order {
            if out.len() == w {
                break;
            }
            out.push(s);
        }
        if out.len() == w {
            return Ok(out);
        }
        if self.book.dead.iter().any(Option::is_some) && refused.is_empty() {
            // Fewer servers left than a page is spread over: store what can be, as long as
            // it can be read back; the rest is repaired when a server comes back.
            if out.len() >= self.book.codec.redundancy().needed() {
                out.resize(w, NONE);
                return Ok(out);
            }
            return Err(self.too_few());
        }
        Err(StoreError::AllFull {
            page,
            servers: self
                .conns
                .iter()
                .map(|c| match c.refused_why.as_str() {
                    "" => format!("{} (capacity {} bytes)", c.name, c.server_capacity_bytes),
                    // Its own words: past its capacity (which it names), or no memory or
                    // disk for the page.
                    why => format!("{} ({why})", c.name),
                })
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    fn too_few(&self) -> StoreError {
        StoreError::Lost {
            servers: self.dead_list(),
            detail: format!(
                "--redundancy {} needs {} servers for a page; {} of {} are left",
                self.book.codec.redundancy(),
                self.book.codec.redundancy().width(),
                self.book.dead.iter().filter(|d| d.is_none()).count(),
                self.conns.len()
            ),
        }
    }

    fn dead_list(&self) -> String {
        self.book
            .dead
            .iter()
            .enumerate()
            .filter_map(|(s, d)| d.as_ref().map(|d| format!("{} ({d})", self.conns[s].name)))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Move `page` from group `old` to `new`: its servers' byte counts, the groups' page
    /// counts, and frees on the live servers it leaves. Nothing is sent to the servers it
    /// joins (the caller writes there).
    fn relocate(&mut self, page: u64, old: Option<GroupId>, new: Option<GroupId>) {
        if old == new {
            return;
        }
        let unit = self.book.unit() as u64;
        let members = |g: Option<GroupId>, b: &Book| {
            g.map(|g| b.groups.members[g as usize].to_vec())
                .unwrap_or_default()
        };
        let (was, now) = (members(old, &self.book), members(new, &self.book));
        for &s in was.iter().filter(|&&s| s != NONE) {
            let c = &mut self.conns[s as usize];
            c.used_bytes = c.used_bytes.saturating_sub(unit);
            if !now.contains(&s) && self.book.dead[s as usize].is_none() {
                c.full = false;
                c.frees.push(PageKey(page));
            }
        }
        for &s in now.iter().filter(|&&s| s != NONE) {
            self.conns[s as usize].used_bytes += unit;
        }
        if let Some(g) = old {
            self.book.groups.pages[g as usize] -= 1;
        }
        if let Some(g) = new {
            self.book.groups.pages[g as usize] += 1;
        }
        self.book.meta.set_group(page, new);
        if new.is_none() {
            self.book.meta.forget_cells(page);
        }
    }

    /// The group to write `page` to: its own while every member lives; else its live members
    /// kept and the dead replaced; a new one for a page with none. `prompt`: a write of
    /// every piece, which also leaves slow members where a prompt server can take their
    /// piece (a repair writes only the pieces it rebuilt).
    fn target(&mut self, page: u64, prompt: bool) -> Result<(GroupId, u32), StoreError> {
        let old = self.book.meta.group(page);
        let members = match old {
            Some(g) => {
                let m = self.book.groups.members[g as usize].clone();
                let b = &self.book;
                if m.iter()
                    .all(|&s| if prompt { b.prompt(s) } else { b.placeable(s) })
                {
                    return Ok((g, 0));
                }
                let mut healed = self.heal(page, &m, prompt)?;
                if prompt {
                    self.degrade(page, &mut healed);
                }
                if *healed == *m {
                    return Ok((g, 0)); // slow members, and no prompt server to take over
                }
                healed
            }
            None => {
                self.within_grant(page)?;
                let mut chosen = self.choose(page, &[], false)?;
                self.degrade(page, &mut chosen);
                chosen
            }
        };
        let g = self.book.groups.intern(&members);
        let changed = match old {
            Some(o) => {
                let om = &self.book.groups.members[o as usize];
                (0..members.len())
                    .filter(|&i| om[i] != members[i])
                    .fold(0, |acc, i| acc | bit(i))
            }
            None => (1u32 << members.len()) - 1,
        };
        self.relocate(page, old, Some(g));
        Ok((g, changed))
    }

    /// `members` with every dead or draining one replaced by a live server outside the group
    /// and, with `prompt`, every slow one by a prompt server outside it where there is one.
    fn heal(&self, page: u64, members: &[u16], prompt: bool) -> Result<Vec<u16>, StoreError> {
        let b = &self.book;
        let slow = |s: u16| prompt && b.placeable(s) && !b.prompt(s);
        let keep: Vec<u16> = members
            .iter()
            .copied()
            .filter(|&s| b.placeable(s) && !slow(s))
            .collect();
        // Best first (`choose` puts slow servers last); a slow member chosen stays in its
        // own place, not another's.
        let fresh = self.choose(page, &keep, true)?;
        let mut extra = fresh[keep.len()..]
            .iter()
            .copied()
            .filter(|s| !members.contains(s))
            .peekable();
        let mut healed = members.to_vec();
        for h in healed.iter_mut().filter(|s| !b.placeable(**s)) {
            *h = extra.next().unwrap_or(NONE);
        }
        for h in healed.iter_mut().filter(|s| slow(**s)) {
            if let Some(s) = extra.next_if(|&s| s != NONE && b.prompt(s)) {
                *h = s;
            }
        }
        Ok(healed)
    }

    /// Leave out of a write-back's `members` the slow ones that [`RemoteStore::heal`] kept (no
    /// prompt server could take their piece), once what already waits on the slow links is
    /// as much as may be released ([`RELEASED_MAX_BYTES`]), and where its prompt members hold
    /// enough pieces to read the page: the page is stored with a piece fewer (as when too few
    /// servers are left) and repaired once a slow server answers again
    /// ([`RemoteStore::catch_up`]). Until that bound the piece goes to the slow server and the
    /// write-back is released ([`RemoteStore::release_held_writes`]): a page whose piece waits
    /// on a link is whole as soon as its server answers, where a page stored short stays short
    /// until its repair, which needs every other piece; a server lost in that time (one that
    /// was stopped too, or killed while the repair read from it) would lose the pages that a
    /// pause of another had left short. Past the bound, a piece sent to a hung server would
    /// hold the program until answered; with `ec:K+1` on K+1 servers, the default layout,
    /// there is never a spare to send it to instead. The slow server is told to free its older
    /// copy, behind what it was sent before. Not where a front end holds writes until every
    /// piece is stored (`rmem nbd`).
    fn degrade(&mut self, page: u64, members: &mut [u16]) {
        let b = &self.book;
        let slow = |s: u16| b.placeable(s) && b.slow(s);
        let short = members.iter().filter(|&&s| slow(s)).count() as u64;
        if !self.store_short || short == 0 {
            return;
        }
        // What the slow links hold now, and this write's pieces there.
        let held: u64 = (0..self.conns.len() as u16)
            .filter(|&x| b.slow(x))
            .map(|x| self.conns[x as usize].held_bytes())
            .sum();
        if held + short * b.unit() as u64 <= b.released_max {
            return;
        }
        let prompt = members.iter().filter(|&&s| b.prompt(s)).count();
        if prompt < b.codec.redundancy().needed() {
            return;
        }
        for m in members.iter_mut() {
            if slow(*m) {
                *m = NONE;
            }
        }
        self.book.short_since_catch_up = true;
        self.book.counters.writes_degraded.fetch_add(1, Relaxed);
        // The write-back's operation is the next one made (none is made before it is sent).
        let op = self.book.next_op + 1;
        self.book.short_writes.insert(op, page);
    }

    /// Write the pieces of `page` in `mask` to their group's members.
    fn send_pieces(&mut self, op: u64, page: u64, g: GroupId, mask: u32, out: Outgoing<'_>) {
        let unit = self.book.unit();
        let members = self.book.groups.members[g as usize].clone();
        let replicated = !matches!(self.book.codec.redundancy(), Redundancy::Ec { .. });
        for (i, &s) in members.iter().enumerate() {
            if mask & bit(i) == 0 || s == NONE {
                continue;
            }
            let kind = Kind::Write {
                op,
                piece: i as u8,
                key: page,
            };
            let units = match out {
                Outgoing::Units(units) => units,
                Outgoing::ToSeal { data, stamp } => {
                    let codec = &self.book.codec;
                    let pad = codec.sealed_len() - data.len();
                    let sealed =
                        self.conns[s as usize].submit_write_in_place(page, data, pad, kind);
                    codec.seal_unit(page, stamp, sealed);
                    continue;
                }
            };
            let data = if replicated {
                &units[..unit]
            } else {
                &units[i * unit..(i + 1) * unit]
            };
            self.conns[s as usize].submit(
                Request::Write {
                    key: PageKey(page),
                    count: 1,
                    data,
                },
                kind,
            );
        }
    }

    /// Start writing `data` as `page`: a new version, its pieces to its group.
    fn start_store(&mut self, page: u64, data: &[u8]) -> Result<u64, StoreError> {
        self.supersede(page);
        let (g, _) = self.target(page, true)?;
        let stamp = if self.book.codec.plain() {
            Stamp::default()
        } else {
            let v = self.next_stamp(page)?;
            self.book.meta.set_stamp(page, v);
            v
        };
        let codec = &self.book.codec;
        let all = (1u32 << codec.redundancy().width()) - 1;
        if codec.plain() {
            return Ok(self.send_store(page, g, stamp, all, Outgoing::Units(data), false));
        }
        if codec.redundancy().width() == 1 {
            // One copy: sealed in the frame that carries it, so copied once.
            let out = Outgoing::ToSeal { data, stamp };
            return Ok(self.send_store(page, g, stamp, all, out, false));
        }
        let mut units = std::mem::take(&mut self.units);
        codec.encode(page, stamp, data, &mut units);
        let op = self.send_store(page, g, stamp, all, Outgoing::Units(&units), false);
        self.units = units;
        Ok(op)
    }

    /// Start a [`Patch`] of `page` (in group `g`) for its written `pieces` of `data`: read
    /// each member's cells that they change.
    fn start_patch(&mut self, page: u64, data: &[u8], pieces: u64, g: GroupId) {
        let codec = &self.book.codec;
        let (k, w, per) = (
            codec.redundancy().needed(),
            codec.slots(),
            codec.cells_per_unit(),
        );
        let written: Vec<usize> = (0..64).filter(|i| pieces & (1 << i) != 0).collect();
        let mut spans = vec![None; w];
        let mut offsets = 0u64;
        for (j, span) in spans.iter_mut().enumerate().take(k) {
            let at: u64 = written
                .iter()
                .filter(|&&i| i / per == j)
                .fold(0, |m, &i| m | 1 << (i % per));
            *span = cells_of(at);
            offsets |= at;
        }
        for span in spans.iter_mut().skip(k) {
            *span = cells_of(offsets);
        }
        let mut kept = Vec::with_capacity(written.len() * PIECE);
        for &i in &written {
            rmem_copy::extend(&mut kept, &data[i * PIECE..(i + 1) * PIECE]);
        }
        let op = self.begin_part_write(page);
        let members = self.book.groups.members[g as usize].clone();
        let mut waiting = 0;
        for (m, span) in spans.iter().enumerate() {
            let Some((first, n)) = *span else { continue };
            let (offset, len) = ((first * CELL) as u32, (n * CELL) as u32);
            self.read_range(members[m], op, m, page, offset, len);
            waiting |= bit(m);
        }
        let old = self.book.meta.stamps(page);
        self.book.ops.insert(
            op,
            Op::Patch(Patch {
                page,
                group: g,
                old,
                pieces,
                data: kept,
                spans,
                got: vec![Vec::new(); w],
                waiting,
            }),
        );
        self.book.busy.insert(page, op);
    }

    /// Patch `op`'s cells are in: check the old cells of its pieces, seal the new ones with
    /// the page's next version, patch the parity by the code of their differences, and write
    /// each member's cells back over it (`op` becomes the store of them).
    fn patch_write(&mut self, op: u64) -> Result<(), StoreError> {
        let Some(Op::Patch(mut pa)) = self.book.ops.remove(&op) else {
            return Ok(());
        };
        let page = pa.page;
        let members = self.book.groups.members[pa.group as usize].clone();
        let placed = self.book.meta.group(page) == Some(pa.group)
            && members.iter().all(|&s| self.book.alive(s));
        if !placed {
            return self.whole_after_patch(op, pa);
        }
        let stamp = self.next_stamp(page)?;
        let mut old = std::mem::take(&mut self.book.scratch);
        let codec = &self.book.codec;
        let (k, w, per) = (
            codec.redundancy().needed(),
            codec.slots(),
            codec.cells_per_unit(),
        );
        let written: Vec<usize> = (0..64).filter(|i| pa.pieces & (1 << i) != 0).collect();
        let mut diffs = vec![0u8; written.len() * CELL];
        let mut bad = false;
        for (n, &i) in written.iter().enumerate() {
            let (j, o) = (i / per, i % per);
            let first = pa.spans[j].expect("a span over each written piece").0;
            let at = (o - first) * CELL;
            let cell = &mut pa.got[j][at..at + CELL];
            old.clear();
            rmem_copy::extend(&mut old, cell);
            if codec.open_piece(page, pa.old.of(i), i, &mut old).is_err() {
                bad = true;
                break;
            }
            let diff = &mut diffs[n * CELL..(n + 1) * CELL];
            diff.copy_from_slice(cell);
            codec.seal_piece(page, stamp, i, &pa.data[n * PIECE..(n + 1) * PIECE], cell);
            for (d, c) in diff.iter_mut().zip(cell.iter()) {
                *d ^= c;
            }
        }
        self.book.scratch = old;
        if bad {
            // A lying or damaged data fragment: its change cannot be worked out from it.
            self.book.counters.pieces_bad.fetch_add(1, Relaxed);
            return self.whole_after_patch(op, pa);
        }
        let mut shards = vec![0u8; w * CELL];
        let offsets = written.iter().fold(0u64, |m, &i| m | 1 << (i % per));
        for o in (0..per).filter(|o| offsets & (1 << o) != 0) {
            shards.fill(0);
            for (n, &i) in written.iter().enumerate().filter(|(_, &i)| i % per == o) {
                let j = i / per;
                shards[j * CELL..(j + 1) * CELL].copy_from_slice(&diffs[n * CELL..(n + 1) * CELL]);
            }
            codec.parity_delta(&mut shards, CELL);
            for p in k..w {
                let first = pa.spans[p].expect("a span over each parity fragment").0;
                let at = (o - first) * CELL;
                let from = &shards[p * CELL..(p + 1) * CELL];
                for (g, d) in pa.got[p][at..at + CELL].iter_mut().zip(from) {
                    *g ^= d;
                }
            }
        }
        let (mut ranges, mut waiting) = (0, 0);
        for (m, span) in pa.spans.iter().enumerate() {
            let Some((first, _)) = *span else { continue };
            self.write_range(members[m], op, m, page, first * CELL, &pa.got[m]);
            ranges += 1;
            waiting |= bit(m);
        }
        let cells = self.book.codec.page_size() / PIECE;
        self.book.meta.set_pieces(page, stamp, pa.pieces, cells);
        self.part_write_sent(page, op, stamp, waiting, ranges);
        self.book.counters.patches.fetch_add(1, Relaxed);
        Ok(())
    }

    /// A write of pieces alone over `page` (alone, or a patch's) begins: a pull of the page
    /// under way is not its latest, and a repair's read sent before it does not have it. Its
    /// operation.
    fn begin_part_write(&mut self, page: u64) -> u64 {
        self.supersede(page);
        let op = self.book.op_id();
        if self.repair.started.is_some() {
            self.book.parted.insert(page, op);
        }
        op
    }

    /// Write `bytes` at `offset` of server `s`'s piece (`member` of the group) of `page`, for
    /// store `op`.
    fn write_range(
        &mut self,
        s: u16,
        op: u64,
        member: usize,
        page: u64,
        offset: usize,
        bytes: &[u8],
    ) {
        self.conns[s as usize].submit(
            Request::WriteRange {
                key: PageKey(page),
                offset: offset as u32,
                data: bytes,
            },
            Kind::WriteRange {
                op,
                piece: member as u8,
                key: page,
                offset: offset as u32,
            },
        );
    }

    /// Store `op` of pieces alone over `page` is sent: `ranges` answers to come from the
    /// members in `waiting`.
    fn part_write_sent(&mut self, page: u64, op: u64, stamp: Stamp, waiting: u32, ranges: u32) {
        self.book.ops.insert(
            op,
            Op::Store(Store {
                page,
                stamp,
                waiting,
                repair: false,
                released: false,
                ranges,
            }),
        );
        let w = self.book.writing.entry(page).or_default();
        w.in_flight += 1;
        w.newest = op;
    }

    /// Patch `op` (`pa`) cannot be made: read the page whole, put its pieces in, and write it
    /// back whole (`Fetch::then_store`). A page freed meanwhile needs nothing.
    fn whole_after_patch(&mut self, op: u64, pa: Patch) -> Result<(), StoreError> {
        if self.book.meta.group(pa.page).is_none() {
            self.book.unbusy(pa.page, op);
            self.finished.push(pa.page);
            return Ok(());
        }
        self.book.counters.patches_whole.fetch_add(1, Relaxed);
        let read = self.start_fetch(pa.page, Purpose::Page)?;
        if let Some(Op::Fetch(fe)) = self.book.ops.get_mut(&read) {
            fe.then_store = Some(Box::new((pa.pieces, pa.data)));
        }
        self.book.busy.insert(pa.page, read);
        Ok(())
    }

    /// The stamp `page`'s next write (whole or of pieces) seals with.
    fn next_stamp(&self, page: u64) -> Result<Stamp, StoreError> {
        self.book
            .codec
            .next_stamp(self.book.meta.stamp(page))
            .ok_or_else(|| {
                StoreError::Layout(format!(
                    "page {page} was written back 2^32 times; its seal's nonce would repeat"
                ))
            })
    }

    /// Write the pieces of `page` that moved (a repair, or a move off a draining server):
    /// from `units`, every piece as the servers store it, sealed as `stamp` (the version the
    /// page has: the same bytes).
    fn start_repair_store(
        &mut self,
        page: u64,
        stamp: Stamp,
        units: &[u8],
    ) -> Result<u64, StoreError> {
        let (g, changed) = self.target(page, false)?;
        Ok(self.send_store(page, g, stamp, changed, Outgoing::Units(units), true))
    }

    /// Send the pieces in `mask` of `page` to group `g`'s members (those that are servers)
    /// and wait for them as one store.
    fn send_store(
        &mut self,
        page: u64,
        g: GroupId,
        stamp: Stamp,
        mask: u32,
        out: Outgoing<'_>,
        repair: bool,
    ) -> u64 {
        let real = self.book.groups.members[g as usize]
            .iter()
            .enumerate()
            .filter(|&(_, &s)| s != NONE)
            .fold(0, |m, (i, _)| m | bit(i));
        let mask = mask & real;
        let op = self.book.op_id();
        self.send_pieces(op, page, g, mask, out);
        self.book.ops.insert(
            op,
            Op::Store(Store {
                page,
                stamp,
                waiting: mask,
                repair,
                released: false,
                ranges: 0,
            }),
        );
        if mask == 0 {
            // Only a repair has nothing to send (a write healed the page meanwhile); a
            // write-back always has servers (`target` gives at least `needed`).
            assert!(repair, "page {page}: a write-back with no server to go to");
            // Nothing moved (a repair raced with a write that healed the page).
            self.todo.push(Todo::Repaired);
            self.book.ops.remove(&op);
            return op;
        }
        let w = self.book.writing.entry(page).or_default();
        w.in_flight += 1;
        if !repair {
            w.newest = op;
        }
        op
    }

    /// The group `page` is stored on, to `what` it (a pager's request for a page it never
    /// stored is a bug, reported as the store's).
    fn group_of(&self, page: u64, what: &str) -> Result<GroupId, StoreError> {
        self.book
            .meta
            .group(page)
            .ok_or_else(|| StoreError::Protocol {
                server: "(none)".into(),
                what: format!("page {page} has no remote copy to {what}"),
            })
    }

    /// Start reading `page` from its group: one copy, or K+1 fragments (late binding: the
    /// first K decode it).
    fn start_fetch(&mut self, page: u64, purpose: Purpose) -> Result<u64, StoreError> {
        let g = self.group_of(page, "fetch")?;
        let codec = &self.book.codec;
        let buf = if codec.plain() || opened_where_it_comes(codec, purpose == Purpose::Page) {
            Vec::new()
        } else {
            self.book.take_buf()
        };
        let op = self.book.op_id();
        self.book.ops.insert(
            op,
            Op::Fetch(Fetch {
                page,
                stamps: self.book.meta.stamps(page),
                group: g,
                buf,
                have: 0,
                asked: 0,
                answered: 0,
                bad: 0,
                gone: 0,
                all: false,
                repair: purpose != Purpose::Page,
                moving: match purpose {
                    Purpose::Move(m) => m,
                    _ => 0,
                },
                part: None,
                only: None,
                then_store: None,
            }),
        );
        self.ask(op)?;
        Ok(op)
    }

    /// Ask the pieces a fetch still needs from live members: up to K+1 (1 for a copy) in
    /// flight, or every piece once a seal failed. No piece left to ask, none in flight, and
    /// too few in: the page is lost.
    fn ask(&mut self, op: u64) -> Result<(), StoreError> {
        let r = self.book.codec.redundancy();
        let Some(Op::Fetch(fe)) = self.book.ops.get(&op) else {
            return Ok(());
        };
        let (page, g) = (fe.page, fe.group);
        let members = self.book.groups.members[g as usize].clone();
        if fe.moving != 0 {
            let (moving, asked) = (fe.moving, fe.asked);
            let failed = moving & fe.answered & !fe.have != 0;
            let gone = (0..members.len()).any(|i| {
                moving & bit(i) != 0 && (!self.book.alive(members[i]) || fe.gone & bit(i) != 0)
            });
            let Some(Op::Fetch(fe)) = self.book.ops.get_mut(&op) else {
                unreachable!()
            };
            if !failed && !gone {
                let new = moving & !asked;
                fe.asked |= new;
                for i in (0..members.len()).filter(|&i| new & bit(i) != 0) {
                    self.read_piece(members[i], op, i, page);
                }
                return Ok(());
            }
            // A source lost or without its piece: rebuild from any pieces instead.
            fe.moving = 0;
        }
        let ec_part = match self.book.ops.get(&op) {
            Some(Op::Fetch(Fetch {
                part: Some((offset, _)),
                asked,
                answered,
                gone,
                ..
            })) if !self.book.codec.plain() && matches!(r, Redundancy::Ec { .. }) => {
                Some((*offset as usize / PIECE, *asked, *answered, *gone))
            }
            _ => None,
        };
        if let Some((i, asked, answered, gone)) = ec_part {
            // A piece is in one data fragment: its cell is asked there alone. Where that
            // server failed it, is gone, or is slow or lagging (silent, its link down, or its
            // reads late: `hedge`), the page is read whole instead, from the others first, and
            // the piece handed on.
            let (slot, _) = self.book.codec.cell(i);
            let s = members[slot];
            let ask = asked & bit(slot) == 0
                && self.book.alive(s)
                && !self.book.read_last(s)
                && gone & bit(slot) == 0;
            let in_flight = asked & !answered & bit(slot) != 0;
            let buf = (!ask && !in_flight).then(|| self.book.take_buf());
            let Some(Op::Fetch(fe)) = self.book.ops.get_mut(&op) else {
                unreachable!()
            };
            if ask {
                fe.asked |= bit(slot);
                self.read_piece(s, op, slot, page);
                return Ok(());
            }
            if in_flight {
                return Ok(());
            }
            fe.part = None;
            fe.only = Some(i as u8);
            fe.buf = buf.expect("taken above");
            if (fe.bad | fe.gone | fe.have) & bit(slot) == 0 {
                // Its cell read went elsewhere (the server slow or lagging: `hedge`), and
                // what is still out there is a cell, not the fragment a whole read needs: that
                // server may be asked for its fragment, last, as any slow one. (Left asked, a
                // page a piece short waited for the cell's answer, dropped it, and was left
                // with nothing out.)
                fe.asked &= !bit(slot);
                fe.answered &= !bit(slot);
            }
        }
        let Some(Op::Fetch(fe)) = self.book.ops.get(&op) else {
            unreachable!()
        };
        let have = fe.have.count_ones() as usize;
        let outstanding = (fe.asked & !fe.answered).count_ones() as usize;
        let want = if fe.all {
            usize::MAX
        } else {
            let spare = usize::from(r.tolerates() > 0 && r.needed() > 1);
            (r.needed() + spare).saturating_sub(have + outstanding)
        };
        // Spread copies' reads over the replicas; fragments start with the data ones.
        let start = match r {
            Redundancy::Replicas(n) => (page % u64::from(n)) as usize,
            _ => 0,
        };
        let mut asked = Vec::new();
        // Servers in an outage (a link down, or not answered on since), slow or lagging last.
        let order = (0..members.len()).map(|i| (start + i) % members.len());
        let shaky = |i: &usize| {
            let s = members[*i];
            s != NONE && (self.conns[s as usize].in_outage() || self.book.read_last(s))
        };
        let (shaky, steady): (Vec<usize>, Vec<usize>) = order.partition(shaky);
        let steady_n = steady.len();
        for (n, i) in steady.into_iter().chain(shaky).enumerate() {
            if asked.len() >= want {
                break;
            }
            // The spare read goes to a steady server only: on a slow one it would wait there,
            // and pile up while the server is silent.
            if n >= steady_n && !fe.all && have + outstanding + asked.len() >= r.needed() {
                break;
            }
            let s = members[i];
            if fe.asked & bit(i) != 0 || !self.book.alive(s) || fe.gone & bit(i) != 0 {
                continue;
            }
            asked.push(i);
        }
        if asked.is_empty() && outstanding == 0 {
            // A read failed over from a server in an outage or gone silent (`hedge`)
            // is still pending there: with nothing else left, wait for it. The server answers
            // (once relinked), or is given up on (then this is asked again, and the page lost
            // naming it too).
            let waiting = (0..members.len())
                .filter(|&i| {
                    fe.asked & fe.answered & bit(i) != 0
                        && (fe.have | fe.bad | fe.gone) & bit(i) == 0
                        && self.book.alive(members[i])
                })
                .fold(0, |m, i| m | bit(i));
            if waiting != 0 {
                let Some(Op::Fetch(fe)) = self.book.ops.get_mut(&op) else {
                    unreachable!()
                };
                fe.answered &= !waiting;
                return Ok(());
            }
            // Name the servers whose pieces failed their check: with none lost, they are
            // why the page is gone.
            let bad: Vec<&str> = (0..members.len())
                .filter(|&i| fe.bad & bit(i) != 0 && members[i] != NONE)
                .map(|i| self.conns[members[i] as usize].name.as_str())
                .collect();
            let bad = if bad.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} failed its check (altered, stale or another page's), from {}",
                    bad.len(),
                    bad.join(", ")
                )
            };
            let earlier = self.lost_before(&members);
            let dead = self.dead_list();
            // The fetch ends here: a late answer to it, or a call after this error, finds
            // nothing to work on (it would report this page again, for another's call).
            self.book.ops.remove(&op);
            self.book.unbusy(page, op);
            return Err(StoreError::Lost {
                servers: if dead.is_empty() { "none".into() } else { dead },
                detail: format!(
                    "page {page}: too few of its pieces could be read back ({r}{bad}{earlier})"
                ),
            });
        }
        if fe.asked != 0 && !asked.is_empty() {
            self.book.counters.failovers.fetch_add(1, Relaxed);
        }
        let Some(Op::Fetch(fe)) = self.book.ops.get_mut(&op) else {
            unreachable!()
        };
        for &i in &asked {
            fe.asked |= bit(i);
        }
        for i in asked {
            self.read_piece(members[i], op, i, page);
        }
        Ok(())
    }

    /// Ask server `s` for `len` bytes at `offset` of its piece `piece` of `page`, for `op`.
    fn read_range(&mut self, s: u16, op: u64, piece: usize, page: u64, offset: u32, len: u32) {
        self.conns[s as usize].submit(
            Request::ReadPart {
                key: PageKey(page),
                offset,
                len,
            },
            Kind::ReadRange {
                op,
                piece: piece as u8,
                key: page,
                offset,
                len,
            },
        );
    }

    /// Ask server `s` for piece `piece` of `page`, for fetch `op`.
    fn read_piece(&mut self, s: u16, op: u64, piece: usize, page: u64) {
        if let Some(Op::Fetch(Fetch {
            part: Some((offset, len)),
            ..
        })) = self.book.ops.get(&op)
        {
            let codec = &self.book.codec;
            let (offset, len) = if codec.plain() {
                (*offset, *len)
            } else {
                (codec.cell(*offset as usize / PIECE).1, CELL as u32)
            };
            self.read_range(s, op, piece, page, offset, len);
            return;
        }
        self.conns[s as usize].submit(
            Request::Read {
                key: PageKey(page),
                count: 1,
            },
            Kind::Read {
                op,
                piece: piece as u8,
                key: page,
            },
        );
    }

    /// Put piece `piece` of store `op` on another server: its server refused it (`Full`) or
    /// was buried. A page freed or written again meanwhile needs nothing (the newer write's
    /// own piece is placed in its turn).
    fn place(
        &mut self,
        op: u64,
        piece: u8,
        unit: Vec<u8>,
        refused: Option<usize>,
        f: &mut dyn FnMut(Completion<'_>),
    ) -> Result<(), StoreError> {
        let Some(Op::Store(st)) = self.book.ops.get(&op) else {
            return Ok(());
        };
        let (page, stamp) = (st.page, st.stamp);
        if st.ranges > 0 {
            // Written pieces go over the page where it is; its server refuses them only
            // where the page must be copied first (shared with a fork child's snapshot) and
            // it has no room for the copy. With enough pieces on the others, that server's
            // piece is given up (it misses the change) and rebuilt from them elsewhere, as a
            // lost one.
            if let (Some(g), Some(r)) = (self.book.meta.group(page), refused) {
                let mut members = self.book.groups.members[g as usize].to_vec();
                let others = (0..members.len())
                    .filter(|&i| i != piece as usize && self.book.alive(members[i]))
                    .count();
                let needed = self.book.codec.redundancy().needed();
                if members[piece as usize] == r as u16 && others >= needed {
                    members[piece as usize] = NONE;
                    let ng = self.book.groups.intern(&members);
                    self.relocate(page, Some(g), Some(ng));
                    self.repair.queue.push_back(page);
                    self.repair.started.get_or_insert_with(Instant::now);
                    self.repair.quiet = false;
                }
                if members[piece as usize] == NONE {
                    // (Its other ranges refused too find it given up already.)
                    self.book.written(op, piece as usize, f, &mut self.todo);
                    return Ok(());
                }
            }
            let server = refused.map_or_else(|| "(none)".into(), |s| self.conns[s].name.clone());
            return Err(StoreError::AllFull {
                page,
                servers: format!("{server} has no room to copy the page it holds"),
            });
        }
        let current = self.book.meta.group(page);
        let superseded = self.book.writing.get(&page).is_some_and(|w| w.newest > op);
        let same = current.is_some()
            && !superseded
            && (self.book.codec.plain() || self.book.meta.stamp(page) == stamp);
        if !same {
            self.book.written(op, piece as usize, f, &mut self.todo);
            return Ok(());
        }
        let g = current.expect("checked");
        let mut members = self.book.groups.members[g as usize].to_vec();
        let from = members[piece as usize];
        if let Some(s) = refused {
            self.refusals.entry(page).or_default().push(s);
        }
        let others: Vec<u16> = members
            .iter()
            .copied()
            .enumerate()
            .filter(|&(i, _)| i != piece as usize)
            .map(|(_, s)| s)
            .collect();
        let others: Vec<u16> = others.into_iter().filter(|&s| s != NONE).collect();
        let mut chosen = self.choose(page, &others, false)?;
        chosen.retain(|&s| s != NONE);
        members[piece as usize] = if chosen.len() > others.len() {
            chosen.pop().expect("one more")
        } else {
            NONE
        };
        let ng = self.book.groups.intern(&members);
        // The refusing or dead server holds nothing of it: no free there.
        let unit_len = self.book.unit() as u64;
        if from != NONE {
            let c = &mut self.conns[from as usize];
            c.used_bytes = c.used_bytes.saturating_sub(unit_len);
        }
        self.book.groups.pages[g as usize] -= 1;
        self.book.groups.pages[ng as usize] += 1;
        self.book.meta.set_group(page, Some(ng));
        let to = members[piece as usize];
        if to == NONE {
            // Nowhere to put it: the page is stored degraded, repaired when a server returns.
            self.book.written(op, piece as usize, f, &mut self.todo);
            return Ok(());
        }
        self.conns[to as usize].used_bytes += unit_len;
        self.send_piece(to, op, piece, page, &unit);
        Ok(())
    }

    /// Write piece `piece` of store `op`, `unit` as the servers keep it, to server `to`.
    fn send_piece(&mut self, to: u16, op: u64, piece: u8, page: u64, unit: &[u8]) {
        self.conns[to as usize].submit(
            Request::Write {
                key: PageKey(page),
                count: 1,
                data: unit,
            },
            Kind::Write {
                op,
                piece,
                key: page,
            },
        );
    }

    /// For an error that loses pages of group `members`: the pieces they had lost with a
    /// server before (their places name none), which is why one more loss was too many, as
    /// when a second server dies while the first one's pieces are rebuilt. Empty if none.
    fn lost_before(&self, members: &[u16]) -> String {
        let r = self.book.codec.redundancy();
        match (
            members.iter().filter(|&&m| m == NONE).count(),
            self.repair.started,
        ) {
            (0, _) => String::new(),
            (n, Some(t)) => format!(
                "; {n} of their pieces had been lost with a server before and were still to be \
                 rebuilt (the repair had rebuilt {} pages in {:.1} s, {} to go): a loss before \
                 the repair ends is more than {r} covers",
                self.repair.pages,
                t.elapsed().as_secs_f64(),
                self.repair.queue.len() + self.repair.in_flight
            ),
            (n, None) => format!(
                "; {n} of their pieces had been lost with a server before, with no server to \
                 rebuild them on since"
            ),
        }
    }

    /// Give server `s` up. Without redundancy that is the end (the error is returned);
    /// with it, its requests go to the others and its pages are queued for repair.
    fn bury(&mut self, s: usize, cause: StoreError) -> Result<(), StoreError> {
        if self.book.draining[s] && self.conns[s].used_bytes == 0 {
            // A drained server that went away holding nothing of ours: not a loss.
            self.book.dead[s] = Some("drained".into());
            let _ = self.conns[s].take_orphans();
            return Ok(());
        }
        if self.book.codec.redundancy().tolerates() == 0 {
            return Err(cause);
        }
        let name = self.conns[s].name.clone();
        self.book.dead[s] = Some(cause.to_string());
        self.book.counters.servers_lost.fetch_add(1, Relaxed);
        let needed = self.book.codec.redundancy().needed();
        for (g, m) in self.book.groups.members.iter().enumerate() {
            let alive = m.iter().filter(|&&x| self.book.alive(x)).count();
            if self.book.groups.pages[g] > 0 && alive < needed {
                return Err(StoreError::Lost {
                    servers: self.dead_list(),
                    detail: format!(
                        "{} pages had fewer than {needed} of their pieces left (--redundancy \
                         {}{})",
                        self.book.groups.pages[g],
                        self.book.codec.redundancy(),
                        self.lost_before(m)
                    ),
                });
            }
        }
        let queued = self.queue_repairs(|_, m| m.contains(&(s as u16)));
        // None queued: it held nothing, or every page it held was written anew without it
        // while it was silent (stored a piece short, repaired when a server comes back).
        let rebuild = match queued {
            0 => "no page has a piece on it to rebuild".to_string(),
            n => format!("rebuilding the {n} pages it held on the other servers"),
        };
        crate::tell!(
            "rmem: memory server {name} lost ({cause}); the program goes on (--redundancy {}), \
             {rebuild}",
            self.book.codec.redundancy()
        );
        self.repair.started.get_or_insert_with(Instant::now);
        for Orphan { kind, unit } in self.conns[s].take_orphans() {
            match kind {
                Kind::Read { op, piece, .. } => self.lost_read(op, piece),
                Kind::Write { op, piece, .. } => self.todo.push(Todo::Place {
                    op,
                    piece,
                    unit: unit.expect("a write's piece"),
                    refused: None,
                }),
                Kind::Pull { batch } => self.todo.push(Todo::Pulled {
                    batch,
                    stored: 0,
                    why: "the server was lost".into(),
                }),
                Kind::Free | Kind::Ping | Kind::Snapshot | Kind::EndSnapshot => {}
                // A sub-page fetch's.
                Kind::ReadRange { op, piece, .. } => self.lost_read(op, piece),
                // Pieces written alone over a replica (one copy alone has no redundancy, so
                // never here): they are lost with the rest of it, and the page, which names
                // this server, was queued for repair above; the survivors' answers finish
                // the write.
                Kind::WriteRange { op, piece, .. } => self.todo.push(Todo::LostRange { op, piece }),
            }
        }
        self.revive_wait = REVIVE_FIRST;
        self.next_revive = Instant::now() + self.revive_wait;
        Ok(())
    }

    /// Queue for repair every page whose group `hit` picks; how many. The repair clock starts.
    fn queue_repairs(&mut self, hit: impl Fn(&Book, &[u16]) -> bool) -> usize {
        let book = &self.book;
        let hit: Vec<bool> = book.groups.members.iter().map(|m| hit(book, m)).collect();
        let before = self.repair.queue.len();
        let pages = book.meta.located().filter(|&(_, g)| hit[g as usize]);
        self.repair.queue.extend(pages.map(|(p, _)| p));
        let queued = self.repair.queue.len() - before;
        if queued > 0 {
            self.repair.started.get_or_insert_with(Instant::now);
            self.repair.quiet = false;
        }
        queued
    }

    fn lost_read(&mut self, op: u64, piece: u8) {
        if let Some(Op::Patch(_)) = self.book.ops.get(&op) {
            self.todo.push(Todo::PatchFailed(op));
        }
        if let Some(Op::Fetch(fe)) = self.book.ops.get_mut(&op) {
            fe.answered |= bit(piece as usize);
            self.todo.push(Todo::Ask(op));
        }
    }

    /// Server `s`'s call returned `r`: an error buries it.
    fn check(&mut self, s: usize, r: Result<(), StoreError>) -> Result<(), StoreError> {
        match r {
            Ok(()) => Ok(()),
            Err(e) => self.bury(s, e),
        }
    }

    /// Work the answers left, until none is left.
    fn settle(&mut self, f: &mut dyn FnMut(Completion<'_>)) -> Result<(), StoreError> {
        // In order: pieces refused in order are placed again in that order.
        while !self.todo.is_empty() {
            let mut batch = std::mem::take(&mut self.todo).into_iter();
            while let Some(t) = batch.next() {
                if let Err(e) = self.settle_one(t, f) {
                    // One operation's error (a page lost) ends only that one: the others'
                    // work is kept, in order, for the next call.
                    let since = std::mem::take(&mut self.todo);
                    self.todo = batch.chain(since).collect();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn settle_one(&mut self, t: Todo, f: &mut dyn FnMut(Completion<'_>)) -> Result<(), StoreError> {
        {
            match t {
                Todo::Ask(op) => self.ask(op)?,
                Todo::Place {
                    op,
                    piece,
                    unit,
                    refused,
                } => self.place(op, piece, unit, refused, f)?,
                Todo::RepairWrite {
                    page,
                    stamp,
                    units,
                    have,
                    read,
                } => {
                    // The pieces that will move must be among those in hand (a move's: another
                    // server may have started draining since it was read).
                    let covered = self.book.meta.group(page).is_some_and(|g| {
                        let m = &self.book.groups.members[g as usize];
                        (0..m.len()).all(|i| have & bit(i) != 0 || self.book.placeable(m[i]))
                    });
                    // Pieces written over the page where it is after this read was sent (on the
                    // same link, so the read has them not) are not in hand either.
                    let parted = self.book.parted.get(&page).is_some_and(|&w| w > read);
                    let unchanged = covered
                        && self.book.meta.stamp(page) == stamp
                        && !self.book.busy.contains_key(&page)
                        && !parted;
                    if unchanged {
                        self.start_repair_store(page, stamp, &units)?;
                    }
                    self.book.give_buf(units);
                    if !unchanged {
                        self.repair.in_flight -= 1;
                        self.repair.queue.push_back(page);
                    }
                }
                Todo::PatchWrite(op) => self.patch_write(op)?,
                Todo::PatchFailed(op) => {
                    if let Some(Op::Patch(pa)) = self.book.ops.remove(&op) {
                        self.whole_after_patch(op, pa)?;
                    }
                }
                Todo::StoreWhole { page, data } => {
                    let op = self.start_store(page, &data)?;
                    self.book.busy.insert(page, op);
                }
                Todo::LostRange { op, piece } => {
                    self.book.written(op, piece as usize, f, &mut self.todo);
                }
                Todo::Repaired => {
                    self.repair.in_flight -= 1;
                    self.repair.pages += 1;
                    self.book.counters.pages_repaired.fetch_add(1, Relaxed);
                }
                Todo::Pulled { batch, stored, why } => self.pulled(batch, stored, &why),
            }
        }
        Ok(())
    }

    /// What answers, outages and burials left: failed-over reads, writes to place again,
    /// repairs; then out with the requests.
    fn work(&mut self, f: &mut dyn FnMut(Completion<'_>)) -> Result<(), StoreError> {
        if !self.todo.is_empty() || self.repair.started.is_some() {
            self.settle(f)?;
            self.repair_step()?;
            self.settle(f)?;
            self.flush()?;
        }
        Ok(())
    }

    /// Start repairs up to the window; say when the last is done.
    fn repair_step(&mut self) -> Result<(), StoreError> {
        if self.repair.started.is_none() {
            return Ok(());
        }
        let mut later = std::mem::take(&mut self.repair.waiting);
        let mut pulls: HashMap<(u16, u16), Vec<(u64, u8)>> = HashMap::new();
        while let Some(page) = self.repair.queue.pop_front() {
            let Some(g) = self.book.meta.group(page) else {
                self.repair.unneeded += 1;
                continue;
            };
            let m = &self.book.groups.members[g as usize];
            if m.iter().all(|&s| self.book.placeable(s)) {
                self.repair.unneeded += 1;
                continue;
            }
            // No live server outside the group: it stays degraded until one comes back.
            let spare = (0..self.conns.len() as u16)
                .any(|s| self.book.placeable(s) && !m.contains(&s) && !self.conns[s as usize].full);
            if !spare {
                self.repair.degraded += 1;
                continue;
            }
            if self.book.busy.contains_key(&page) || self.pulls.moves.contains_key(&page) {
                later.push(page);
                continue;
            }
            match self.pull_move(page, g) {
                Some((to, _)) if !self.may_take(g, &to) => {
                    self.repair.queue.push_front(page);
                    break;
                }
                Some((to, from)) => {
                    self.start_pull(page, g, to, &from, &mut pulls);
                    continue;
                }
                None if self.repair.in_flight >= REPAIR_WINDOW => {
                    self.repair.queue.push_front(page);
                    break;
                }
                None => {}
            }
            let m = &self.book.groups.members[g as usize];
            self.repair.in_flight += 1;
            let purpose = match self.movable(m) {
                0 => Purpose::Repair,
                moving => Purpose::Move(moving),
            };
            self.start_fetch(page, purpose)?;
        }
        self.send_pulls(pulls);
        self.repair.queue.extend(later.drain(..));
        self.repair.waiting = later;
        if self.repair.queue.is_empty() && self.repair.in_flight == 0 && self.pulls.moves.is_empty()
        {
            let t = self.repair.started.take().expect("checked");
            let secs = t.elapsed().as_secs_f64();
            self.book
                .counters
                .repair_us
                .fetch_add((secs * 1e6) as u64, Relaxed);
            let short = if self.repair.degraded > 0 {
                format!(
                    "; {} pages keep fewer pieces than --redundancy {} until a server returns",
                    self.repair.degraded,
                    self.book.codec.redundancy()
                )
            } else {
                String::new()
            };
            let unneeded = match self.repair.unneeded {
                0 => String::new(),
                n => format!(" ({n} more needed nothing: freed or written anew since)"),
            };
            if !std::mem::take(&mut self.repair.quiet) {
                crate::tell!(
                    "rmem: repair done: {} pages {} in {secs:.2} s{unneeded}{short}",
                    self.repair.pages,
                    if self.book.draining.iter().any(|&d| d) {
                        "rebuilt or moved"
                    } else {
                        "rebuilt"
                    }
                );
            }
            self.repair.pages = 0;
            self.repair.degraded = 0;
            self.repair.unneeded = 0;
            self.book.parted.clear();
        }
        Ok(())
    }

    /// Where `page` (in group `g`) can be healed by pulls: the members it would have, and for
    /// each new one the server it pulls its piece from (the member it replaces, when that one
    /// is leaving but answers; under `replicas:N`, for a member lost or never stored, another
    /// copy). `None` where the page must go through this client: pulls off, a member that
    /// cannot be read from (in an outage, or lost under erasure coding: a rebuild), or a
    /// server that would take a piece full, in an outage or failed a pull before.
    fn pull_move(&self, page: u64, g: GroupId) -> Option<(Members, Members)> {
        if self.pulls.off {
            return None;
        }
        let m = &self.book.groups.members[g as usize];
        let now = Instant::now();
        let usable = |s: u16| {
            self.book.alive(s)
                && !self.conns[s as usize].in_outage()
                && self.conns[s as usize].peer_addr().is_some()
                && !self.pulls.refuses(s as usize, now)
        };
        let copies = matches!(self.book.codec.redundancy(), Redundancy::Replicas(_));
        // Every member still there must answer; a lost one only where another copy is its
        // piece.
        if !m
            .iter()
            .all(|&s| usable(s) || (copies && !self.book.alive(s)))
        {
            return None;
        }
        let copy = m.iter().copied().find(|&s| usable(s))?;
        let to = self.heal(page, m, false).ok()?;
        let mut from = m.to_vec();
        for i in (0..m.len()).filter(|&i| to[i] != m[i]) {
            if !usable(to[i]) || self.conns[to[i] as usize].full {
                return None;
            }
            if !usable(m[i]) {
                from[i] = copy;
            }
        }
        Some((to.into_boxed_slice(), from.into_boxed_slice()))
    }

    /// Whether every server that would take a piece of a page in group `g` (to members `to`)
    /// may pull one more now ([`PULL_PER_SERVER`]).
    fn may_take(&self, g: GroupId, to: &[u16]) -> bool {
        let m = &self.book.groups.members[g as usize];
        (0..m.len())
            .filter(|&i| to[i] != m[i])
            .all(|i| self.pulls.taking.get(to[i] as usize).copied().unwrap_or(0) < PULL_PER_SERVER)
    }

    /// Start moving `page` server to server: each piece that moves joins the pull of its
    /// (taker, holder) pair in `pulls`, the holder of piece `i` being `from[i]`.
    fn start_pull(
        &mut self,
        page: u64,
        g: GroupId,
        to: Box<[u16]>,
        from: &[u16],
        pulls: &mut HashMap<(u16, u16), Vec<(u64, u8)>>,
    ) {
        let m = &self.book.groups.members[g as usize];
        let mut moving = 0;
        for i in (0..m.len()).filter(|&i| to[i] != m[i]) {
            moving |= bit(i);
            pulls
                .entry((to[i], from[i]))
                .or_default()
                .push((page, i as u8));
            let t = to[i] as usize;
            if self.pulls.taking.len() <= t {
                self.pulls.taking.resize(t + 1, 0);
            }
            self.pulls.taking[t] += 1;
        }
        self.pulls.moves.insert(
            page,
            PullMove {
                from: g,
                to,
                moving,
                waiting: moving,
                failed: 0,
                superseded: false,
            },
        );
    }

    /// Send the pulls gathered by [`RemoteStore::start_pull`], [`PULL_KEYS`] keys a request.
    fn send_pulls(&mut self, pulls: HashMap<(u16, u16), Vec<(u64, u8)>>) {
        // Within half the time a request may wait: the pull is answered, whatever it found,
        // before its link would count as lost.
        let deadline_ms = u32::try_from((self.timing.request / 2).as_millis())
            .unwrap_or(u32::MAX)
            .max(1);
        for ((dst, src), items) in pulls {
            // The address this client is connected to, not its name: the server taking the
            // pieces connects there without resolving anything. (`pull_move` saw the link up,
            // and nothing was read or written since.)
            let from = self.conns[src as usize]
                .peer_addr()
                .expect("a link checked by pull_move")
                .to_string();
            let session = self.conns[src as usize].session();
            for chunk in items.chunks(PULL_KEYS) {
                self.pulls.next_batch += 1;
                let batch = self.pulls.next_batch;
                self.conns[dst as usize].submit(
                    Request::Pull {
                        from: &from,
                        session,
                        deadline_ms,
                        keys: chunk.iter().map(|&(p, _)| PageKey(p)).collect(),
                    },
                    Kind::Pull { batch },
                );
                self.pulls.batches.insert(
                    batch,
                    PullBatch {
                        dst,
                        src,
                        items: chunk.to_vec(),
                    },
                );
            }
        }
    }

    /// A write-back of `page` started: a pull of it under way is not its latest (the write
    /// may go to the group it is pulled from, when that server was called back meanwhile).
    fn supersede(&mut self, page: u64) {
        if self.pulls.moves.is_empty() {
            return;
        }
        if let Some(mv) = self.pulls.moves.get_mut(&page) {
            mv.superseded = true;
        }
    }

    /// Whether `page`, being pulled as `mv` says, was written, moved or freed since: then
    /// the pulled copies are not the page.
    fn overtaken(&self, page: u64, mv: &PullMove) -> bool {
        mv.superseded || self.book.meta.group(page) != Some(mv.from)
    }

    /// The answer to pull `batch` (0 stored: its server was lost): each page whose pulls
    /// are all answered moves, or goes back to the repair queue.
    fn pulled(&mut self, batch: u64, stored: usize, why: &str) {
        let Some(b) = self.pulls.batches.remove(&batch) else {
            return;
        };
        let (dst, src) = (b.dst as usize, b.src as usize);
        self.pulls.taking[dst] -= b.items.len();
        // A page written, moved or freed meanwhile is no one's fault (its old copy may be
        // freed before the pull reads it), and the key the pull stopped at is one of those not
        // stored (the server reads runs of consecutive keys at once): blamed only when none of
        // those was overtaken. A server that cannot pull fails again at its next pull.
        let blamed = stored < b.items.len()
            && b.items[stored..].iter().all(|(page, _)| {
                self.pulls
                    .moves
                    .get(page)
                    .is_some_and(|mv| !self.overtaken(*page, mv))
            });
        // A server with no room left pulled what fitted: it is full (whatever else happened to
        // the pages meanwhile), not unable to pull, and the rest is placed elsewhere (pulled
        // there where another server has room) instead of being written through this client
        // to the same full server.
        if stored < b.items.len() && why == rmem_proto::PULLED_FULL {
            self.conns[dst].full = true;
        } else if blamed
            && self.book.alive(b.dst)
            && self.book.alive(b.src)
            && !self.conns[src].in_outage()
        {
            if self.pulls.refused.len() <= dst {
                self.pulls.refused.resize(dst + 1, None);
            }
            let now = Instant::now();
            if !self.pulls.refuses(dst, now) {
                crate::tell!(
                    "rmem: memory server {} could not copy pages from {} ({why}); they move \
                     through this client instead for the next {} s",
                    self.conns[dst].name,
                    self.conns[src].name,
                    self.pulls.hold.as_secs()
                );
            }
            self.pulls.refused[dst] = Some(now + self.pulls.hold);
        }
        for (k, &(page, piece)) in b.items.iter().enumerate() {
            let Some(mv) = self.pulls.moves.get_mut(&page) else {
                continue;
            };
            mv.waiting &= !bit(piece as usize);
            if k >= stored {
                mv.failed |= bit(piece as usize);
            }
            if mv.waiting == 0 {
                let mv = self.pulls.moves.remove(&page).expect("there");
                self.finish_pull(page, mv);
            }
        }
    }

    /// Every pull of `page` answered: it moves to the members pulled to, unless a pull
    /// failed or it was written or moved meanwhile; then the copies pulled are freed where
    /// the page does not live now, and the page goes back to the repair queue.
    fn finish_pull(&mut self, page: u64, mv: PullMove) {
        let now = self.book.meta.group(page);
        if !self.overtaken(page, &mv) && mv.failed == 0 {
            let n = u64::from(mv.moving.count_ones());
            let g = self.book.groups.intern(&mv.to);
            self.relocate(page, Some(mv.from), Some(g));
            if !mv.to.iter().all(|&s| self.book.placeable(s)) {
                // A server it went to started leaving (or was lost) while it was pulled: the
                // drain's queue was made without this page, so it goes back on it.
                self.repair.queue.push_back(page);
            }
            self.book.counters.pieces_moved.fetch_add(n, Relaxed);
            self.book.counters.pieces_pulled.fetch_add(n, Relaxed);
            self.book.counters.pages_repaired.fetch_add(1, Relaxed);
            self.repair.pages += 1;
            return;
        }
        let lives: Vec<u16> =
            now.map_or_else(Vec::new, |g| self.book.groups.members[g as usize].to_vec());
        for i in (0..mv.to.len()).filter(|&i| (mv.moving & !mv.failed) & bit(i) != 0) {
            let t = mv.to[i];
            if self.book.alive(t) && !lives.contains(&t) {
                self.conns[t as usize].frees.push(PageKey(page));
            }
        }
        self.repair.queue.push_back(page);
    }

    /// The pieces of a group that need only move, as they are: those on draining servers
    /// that still answer, when every other member stays. Erasure coding only (a copy is one
    /// read anyway): a drain reads one fragment per fragment moved instead of K+1 and
    /// rebuilds nothing. 0: rebuild (a member is lost, or none moves).
    fn movable(&self, m: &[u16]) -> u32 {
        if self.book.codec.slots() < 2 {
            return 0;
        }
        let mut moving = 0;
        for (i, &s) in m.iter().enumerate() {
            if self.book.placeable(s) {
                continue;
            }
            if !self.book.alive(s) || self.conns[s as usize].in_outage() {
                return 0;
            }
            moving |= bit(i);
        }
        moving
    }

    /// Free the groups no page is in and nothing in flight names, once enough have been made
    /// since the last time ([`Groups::collect`]). Called where no group is held in a local:
    /// the named ones are those reads and patches started with and those pulls leave.
    fn collect_groups(&mut self) {
        if !self.book.groups.due() {
            return;
        }
        let ops = self.book.ops.values().filter_map(|op| match op {
            Op::Fetch(fe) => Some(fe.group),
            Op::Patch(pa) => Some(pa.group),
            Op::Store(_) => None,
        });
        let moves = self.pulls.moves.values().map(|mv| mv.from);
        self.book.groups.collect(ops.chain(moves));
    }

    /// Server `s` is leaving: no new pieces go there, and every page with a piece there is
    /// queued to move (by pulls where they can, see [`PullMove`]); how many.
    fn drain(&mut self, s: usize) -> usize {
        self.book.draining[s] = true;
        self.queue_repairs(|_, m| m.contains(&(s as u16)))
    }

    /// Whether a server was given up (not one that left after a drain).
    fn any_lost(&self) -> bool {
        (0..self.conns.len()).any(|s| self.book.dead[s].is_some() && !self.book.draining[s])
    }

    /// A fetch finishes only on an answer to a read sent for it, or is asked again from the
    /// work queue: one with neither would wait forever, and the program with it (a fault
    /// that never returns). Such a state is a bug in this file (the class of a hang found
    /// under lying servers), so it is an error naming the fetch, not a hang: a fetch with no
    /// read out on any link and no ask queued, at two looks [`FETCH_CHECK_EVERY`] apart.
    fn check_fetches(&mut self, now: Instant) -> Result<(), StoreError> {
        if now < self.next_fetch_check {
            return Ok(());
        }
        self.next_fetch_check = now + FETCH_CHECK_EVERY;
        if !self.book.ops.values().any(|op| matches!(op, Op::Fetch(_))) {
            self.idle_fetches.clear();
            return Ok(());
        }
        let mut live: std::collections::HashSet<u64> = self
            .conns
            .iter()
            .zip(&self.book.dead)
            .filter(|(_, d)| d.is_none())
            .flat_map(|(c, _)| c.pending_read_ops())
            .collect();
        live.extend(self.todo.iter().filter_map(|t| match t {
            Todo::Ask(op) => Some(*op),
            _ => None,
        }));
        let idle: std::collections::HashSet<u64> = self
            .book
            .ops
            .iter()
            .filter(|(op, o)| matches!(o, Op::Fetch(_)) && !live.contains(op))
            .map(|(&op, _)| op)
            .collect();
        if let Some(&op) = idle.iter().find(|op| self.idle_fetches.contains(op)) {
            let Some(Op::Fetch(fe)) = self.book.ops.get(&op) else {
                unreachable!("listed as a fetch")
            };
            return Err(StoreError::Stuck {
                page: fe.page,
                detail: format!(
                    "fetch {op}: pieces asked {:#b}, answered {:#b}, in {:#b}, bad {:#b}, \
                     gone {:#b}; {}",
                    fe.asked,
                    fe.answered,
                    fe.have,
                    fe.bad,
                    fe.gone,
                    self.describe_in_flight()
                ),
            });
        }
        self.idle_fetches = idle;
        Ok(())
    }

    /// Try buried servers again now and then: one that answers takes new pages (a fresh
    /// session: whatever it kept of the old one is not trusted). Each try opens its link on a
    /// thread of its own (as a reconnect does), taken here on a later call once open: a
    /// connect on this thread held the pager (and every fault) for up to the connect timeout
    /// every [`REVIVE_EVERY`] for as long as a buried server's host stayed down or hung.
    fn revive(&mut self, now: Instant) {
        for s in 0..self.conns.len() {
            let Some(dialing) = &self.reviving[s] else {
                continue;
            };
            // A thread that ended without a word (it cannot, short of a panic) is a failed try:
            // the next is due after REVIVE_EVERY.
            let Ok(opened) = (match dialing.try_recv() {
                Err(mpsc::TryRecvError::Empty) => continue,
                got => got,
            }) else {
                self.reviving[s] = None;
                continue;
            };
            self.reviving[s] = None;
            // A drained server left on purpose: it is not called back.
            let (Ok(mut c), true) = (
                opened,
                self.book.dead[s].is_some() && !self.book.draining[s],
            ) else {
                continue;
            };
            c.set_timing(self.timing);
            let name = c.name.clone();
            crate::tell!("rmem: memory server {name} is back; it takes new pages");
            self.forget_pieces_on(s as u16);
            self.conns[s] = c;
            self.book.dead[s] = None;
            self.book.draining[s] = false;
            // A new link numbers its requests from 1 again: the late-read hedge's look (a tag
            // of the old link) would skip them, and the old lag is not this server's now.
            self.book.lag[s] = Lag::default();
            // Writes waiting on a slow server may go to it now.
            self.book.hedged.fill(0);
            self.queue_repairs(|b, m| m.iter().any(|&x| !b.placeable(x)));
        }
        if now < self.next_revive || !self.any_lost() {
            return;
        }
        self.next_revive = now + self.revive_wait;
        self.revive_wait = (self.revive_wait * 2).min(REVIVE_EVERY);
        // In a pool, a lost server is called back only while the manager offers it for pages:
        // one gone from the pool (killed, its host down) is not dialled, where every server a
        // run had ever lost cost a thread and a connect every REVIVE_EVERY for the rest of the
        // run (a pool whose servers come and go); one that registers again is dialled at the
        // next try. (While the manager cannot be reached its last word stands.)
        let offered: Option<std::collections::HashSet<String>> = self.pool.as_ref().map(|p| {
            let view = p.link.view();
            let offers = view.servers.into_iter().filter(|o| o.takes_pages());
            offers.map(|o| o.addr).collect()
        });
        for s in 0..self.conns.len() {
            if self.book.dead[s].is_none() || self.book.draining[s] || self.reviving[s].is_some() {
                continue;
            }
            if offered
                .as_ref()
                .is_some_and(|o| !o.contains(&self.conns[s].name))
            {
                continue;
            }
            let Ok(session) = SessionId::random() else {
                return;
            };
            let (name, unit) = (&self.conns[s].name, self.book.unit());
            self.reviving[s] =
                dial_apart("rmem-revive", name, &self.token, unit, session, self.timing);
        }
    }

    /// Server `s`, lost, answers again, in a fresh session: the pieces it held are gone.
    /// Every page that still names it gets no server in its place, so that the repair
    /// rebuilds those pieces (on it or elsewhere) instead of taking the page for whole and
    /// reading nothing there. (Pages named it until their next write-back, and the next loss
    /// of another member found too few pieces of a page the runtime thought whole.)
    fn forget_pieces_on(&mut self, s: u16) {
        let book = &mut self.book;
        // Reads in flight keep the group they started with: they must not ask `s` for its
        // piece now that it lives again (it answers that it has no such page: taken for a bad
        // piece, a round trip lost), nor wait there for the answer to one asked before it was
        // given up (that request went with the old link).
        for op in book.ops.values_mut() {
            if let Op::Fetch(fe) = op {
                let m = &book.groups.members[fe.group as usize];
                fe.gone |= (0..m.len())
                    .filter(|&i| m[i] == s)
                    .fold(0, |acc, i| acc | bit(i));
            }
        }
        let mut to = HashMap::new();
        for g in 0..book.groups.members.len() {
            let m = &book.groups.members[g];
            if m.contains(&s) {
                let m: Vec<u16> = m.iter().map(|&x| if x == s { NONE } else { x }).collect();
                to.insert(g as GroupId, book.groups.intern(&m));
            }
        }
        let pages: Vec<(u64, GroupId)> = book
            .meta
            .located()
            .filter(|(_, g)| to.contains_key(g))
            .collect();
        for (page, g) in pages {
            self.relocate(page, Some(g), Some(to[&g]));
        }
    }

    fn each_live(
        &mut self,
        mut call: impl FnMut(&mut Conn) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        for s in 0..self.conns.len() {
            if self.book.dead[s].is_some() {
                continue;
            }
            let r = call(&mut self.conns[s]);
            self.check(s, r)?;
        }
        Ok(())
    }

    /// A server in an outage, or silent for [`HEDGE_AFTER`], is slow (with redundancy): the
    /// reads waiting on it are asked of the page's other pieces now, not after the request
    /// timeout and the reconnection window (where another piece can be asked; an answer that
    /// comes later is ignored, or used if the page is still wanted), and the writes waiting
    /// on it go to other servers ([`RemoteStore::redirect_writes`]).
    fn hedge(&mut self) {
        if self.book.codec.redundancy().tolerates() == 0 {
            return;
        }
        let now = Instant::now();
        let mut answers_again = Vec::new();
        let mut fewer = false;
        for s in 0..self.conns.len() {
            let c = &self.conns[s];
            let slow = self.book.dead[s].is_none()
                && (c.in_outage() || c.silent_for(now).is_some_and(|t| t >= HEDGE_AFTER));
            let was = self.book.slow[s];
            fewer |= !slow && was.is_some();
            self.book.slow[s] = match (slow, was) {
                (true, None) => {
                    self.book.hedged[s] = 0;
                    Some(now)
                }
                (true, since) => since,
                (false, Some(since)) if self.book.dead[s].is_none() => {
                    answers_again.push((s, now - since));
                    None
                }
                (false, _) => None,
            };
        }
        if fewer {
            // Pieces held on a server no longer slow are no reason to release a write, and a
            // read or write that had nowhere else to go may have now: look at all again.
            self.book.slow_held.clear();
            self.book.hedged.fill(0);
        }
        if !answers_again.is_empty() {
            self.catch_up(&answers_again);
        }
        for s in 0..self.conns.len() {
            // A lagging server's writes are released as a slow one's are, but not moved: it
            // answers, only late (its late reads are `hedge_late_reads`'s).
            let slow = self.book.slow(s as u16);
            let lagging = self.book.lag[s].lagging && self.book.dead[s].is_none();
            if !slow && !lagging {
                continue;
            }
            let (after, newest) = (self.book.hedged[s], self.conns[s].newest_tag());
            if after == newest {
                continue; // nothing sent there since the last look
            }
            self.book.hedged[s] = newest;
            let writes = self.conns[s].pending_writes(after);
            let moved = if slow {
                self.redirect_writes(s, &writes)
            } else {
                Vec::new()
            };
            for &(at, op, piece, _) in &writes {
                if moved.binary_search(&at).is_ok() {
                    continue;
                }
                self.held_on_slow(op, piece);
            }
            if slow {
                let reads: Vec<(u64, u8)> = self.conns[s].pending_reads(after).collect();
                for (op, piece) in reads {
                    self.ask_elsewhere(op, piece);
                }
            }
        }
        self.hedge_late_reads(now);
        self.release_held_writes();
    }

    /// Reads that waited [`READ_HEDGE_AFTER`] on a server that is not slow are asked of their
    /// pages' other pieces too, and the server is lagging for [`LAG_HOLD`] (`hedge` then
    /// releases its write-backs as a slow server's). Each read is looked at once
    /// (`Lag::looked`, requests being sent in the order of their tags).
    fn hedge_late_reads(&mut self, now: Instant) {
        let due = now.checked_sub(READ_HEDGE_AFTER);
        for s in 0..self.conns.len() {
            if self.book.dead[s].is_some() {
                continue;
            }
            if let (Some(due), false) = (due, self.book.slow(s as u16)) {
                // (A slow server's reads are all asked elsewhere by `hedge` already.)
                let (late, looked) = self.conns[s].reads_sent_by(self.book.lag[s].looked, due);
                self.book.lag[s].looked = looked;
                for (op, piece) in late {
                    if self.ask_elsewhere(op, piece) {
                        self.book.lag[s].last = Some(now);
                        self.book.counters.reads_hedged.fetch_add(1, Relaxed);
                    }
                }
            }
            let lag = &mut self.book.lag[s];
            lag.lagging = lag
                .last
                .is_some_and(|t| now.saturating_duration_since(t) < LAG_HOLD);
        }
    }

    /// Write `op`'s `piece` waits on a slow or lagging server: a candidate for release, if it
    /// is a write-back (not a repair) not released yet.
    fn held_on_slow(&mut self, op: u64, piece: u8) {
        if let Some(Op::Store(st)) = self.book.ops.get(&op) {
            if !st.repair && !st.released {
                *self.book.slow_held.entry(op).or_default() |= bit(piece as usize);
            }
        }
    }

    /// Read `piece` of fetch `op` waits on a slow or lagging server: ask the page's other
    /// pieces too, where there is another to ask (the answer that comes later is ignored, or
    /// used if the page is still wanted). Whether it was asked elsewhere.
    fn ask_elsewhere(&mut self, op: u64, piece: u8) -> bool {
        if let Some(Op::Patch(pa)) = self.book.ops.get(&op) {
            // A patch needs every member's cells: late, it becomes a whole write-back, whose
            // read is of any K.
            if pa.waiting & bit(piece as usize) == 0 {
                return false;
            }
            self.todo.push(Todo::PatchFailed(op));
            return true;
        }
        let Some(Op::Fetch(fe)) = self.book.ops.get(&op) else {
            return false;
        };
        if fe.answered & bit(piece as usize) != 0 {
            return false;
        }
        let members = &self.book.groups.members[fe.group as usize];
        let other = members.iter().enumerate().any(|(i, &m)| {
            fe.asked & bit(i) == 0 && self.book.alive(m) && !self.conns[m as usize].in_outage()
        });
        if !other {
            return false; // nothing else to ask: wait for this server
        }
        if let Some(Op::Fetch(fe)) = self.book.ops.get_mut(&op) {
            fe.answered |= bit(piece as usize);
        }
        self.todo.push(Todo::Ask(op));
        true
    }

    /// Forget the write-backs stored a piece short ([`RemoteStore::degrade`]) whose pages are
    /// whole again (repaired, or written anew in full) or gone, oldest first; and all of them
    /// once no server is slow and no repair runs: nothing will make those pages whole before
    /// a server comes back (a slow server buried with no spare to take its pieces), and
    /// [`PageStore::settled`] must not wait for that.
    fn settle_short_writes(&mut self) {
        let b = &mut self.book;
        if b.short_writes.is_empty() {
            return;
        }
        let idle = self.repair.queue.is_empty()
            && self.repair.in_flight == 0
            && !b.slow.iter().any(Option::is_some);
        if idle {
            b.short_writes.clear();
            return;
        }
        while let Some((_, &page)) = b.short_writes.first_key_value() {
            let whole = b
                .meta
                .group(page)
                .is_none_or(|g| b.groups.members[g as usize].iter().all(|&s| b.placeable(s)));
            if !whole {
                return;
            }
            b.short_writes.pop_first();
        }
    }

    /// Write-backs still waiting on slow servers (no prompt server took them: see
    /// [`RemoteStore::redirect_writes`]) whose every other piece is acknowledged, and enough
    /// pieces to read the page from (K, or one copy), are told to the pager as stored (through
    /// `finished`), so that a server that hangs holds the program for [`HEDGE_AFTER`], not for
    /// the request timeout and the reconnect window: with `ec:K+1` on K+1 servers (the
    /// default layout) there is never a spare to redirect to. Until the slow server answers,
    /// the page has a piece fewer than its layout; the write stays in flight there (the link
    /// keeps it, and re-sends it on a reconnect), and should that server refuse it or be
    /// buried, the piece is placed again or rebuilt as any other. Reads ask it last meanwhile.
    fn release_held_writes(&mut self) {
        let r = self.book.codec.redundancy();
        let width = r.width() as u32;
        let unit = self.book.codec.unit_len() as u64;
        if self.book.released_bytes + unit > self.book.released_max {
            // Full: no write can be released before some of those are answered (a hedge is
            // on every poll, and a silent server's link holds thousands of writes).
            return;
        }
        // The writes with pieces on slow servers, oldest first (`hedge` keeps the list).
        let (mut done, mut release) = (Vec::new(), Vec::new());
        let mut bytes = self.book.released_bytes;
        for (&op, &on_slow) in &self.book.slow_held {
            let Some(Op::Store(st)) = self.book.ops.get(&op) else {
                done.push(op); // finished
                continue;
            };
            let waiting = st.waiting;
            if waiting & !on_slow != 0 || ((width - waiting.count_ones()) as usize) < r.needed() {
                continue; // its other pieces are not all in yet (or too few can be)
            }
            let more = unit * u64::from(waiting.count_ones());
            if bytes + more > self.book.released_max {
                break; // the rest wait for their servers
            }
            bytes += more;
            release.push(op);
        }
        self.book.released_bytes = bytes;
        for op in release {
            let Some(Op::Store(st)) = self.book.ops.get_mut(&op) else {
                unreachable!("op {op} was just looked at");
            };
            st.released = true;
            let page = st.page;
            self.book.released_ops.insert(op);
            self.book.unbusy(page, op);
            self.finished.push(page);
            self.book.counters.writes_released.fetch_add(1, Relaxed);
            done.push(op);
        }
        for op in done {
            self.book.slow_held.remove(&op);
        }
    }

    /// Servers that were slow answer again (each with how long it was slow): the pages stored
    /// with a piece fewer meanwhile ([`RemoteStore::degrade`]) are repaired, their missing
    /// pieces written where a repair puts them (most likely back on those servers). Said on
    /// stderr when a server was slow for [`SLOW_TOLD_AFTER`] or more; a shorter blip is only
    /// counted.
    fn catch_up(&mut self, answers_again: &[(usize, Duration)]) {
        if !std::mem::take(&mut self.book.short_since_catch_up) {
            return;
        }
        let running = self.repair.started.is_some();
        let queued = self.queue_repairs(|b, m| m.iter().any(|&x| !b.placeable(x)));
        let told: Vec<(&str, f64)> = answers_again
            .iter()
            .filter(|&&(_, t)| t >= SLOW_TOLD_AFTER)
            .map(|&(s, t)| (self.conns[s].name.as_str(), t.as_secs_f64()))
            .collect();
        if queued == 0 {
            return; // the pages were written again whole meanwhile, or freed
        }
        if !running {
            self.repair.quiet = told.is_empty();
        }
        let who = match told.as_slice() {
            [] => return,
            [(name, t)] => format!("memory server {name} answers again after {t:.1} s of silence"),
            many => format!(
                "memory servers {} answer again after {} s of silence",
                many.iter().map(|m| m.0).collect::<Vec<_>>().join(", "),
                many.iter()
                    .map(|m| format!("{:.1}", m.1))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        crate::tell!(
            "rmem: {who}; restoring --redundancy {} on the {queued} pages written with a piece \
             fewer meanwhile",
            self.book.codec.redundancy()
        );
    }

    /// No write-back is stored a piece short because a server is slow: past
    /// [`RELEASED_MAX_BYTES`] of released writes, new ones wait for the slow server (or its
    /// burial) instead. `rmem nbd`'s choice: a page stored short is lost, and with it the
    /// whole store, if another server dies before the slow one answers again and the page is
    /// repaired, where a write-back that waits is still whole in the front end's cache; and a
    /// block device's FLUSH waits for the slow server either way (see [`PageStore::settled`]).
    /// The pager cannot wait (a program's memory access has no error to return), so it
    /// stores short.
    pub fn never_store_short(&mut self) {
        self.store_short = false;
    }

    /// At most `bytes` of pieces of released write-backs wait on slow links at a time
    /// ([`RELEASED_MAX_BYTES`] by default); past it, write-backs are stored a piece short
    /// ([`RemoteStore::degrade`]). For tests, which cannot afford to write the default's worth.
    pub fn set_released_max_bytes(&mut self, bytes: u64) {
        self.book.released_max = bytes;
    }

    /// Each write waiting on slow server `s` whose piece is still `s`'s to hold goes to a
    /// prompt server outside the page's group instead, where there is one: the page's group
    /// takes that server in `s`'s place, `s` is told to free the page after the write it
    /// was sent (so whatever `s` stores late, it drops), and the write counts as stored
    /// when the new server says so. Writes of one page go in the order they were sent, all
    /// to the same server, so it ends with the newest. A page a newer write already took
    /// elsewhere is left alone: its old write is superseded (see [`RemoteStore::place`]).
    /// Without a prompt server the writes wait for `s`, as before. `writes` are those of
    /// `s`'s waiting writes to look at ([`Conn::pending_writes`]: the hedge passes those sent
    /// since its last look); returns the positions of those moved, ascending.
    fn redirect_writes(&mut self, s: usize, writes: &[(usize, u64, u8, u64)]) -> Vec<usize> {
        let width = self.book.codec.redundancy().width();
        let prompt = (0..self.conns.len())
            .filter(|&x| self.book.prompt(x as u16))
            .count();
        if prompt < width {
            return Vec::new(); // no page of this layout can leave `s` for a prompt server
        }
        let mut moved: HashMap<(u64, u8), u16> = HashMap::new();
        let mut taken = Vec::new();
        for &(at, op, piece, page) in writes {
            if !matches!(self.book.ops.get(&op), Some(Op::Store(_))) {
                continue;
            }
            let to = match moved.get(&(page, piece)) {
                Some(&to) => to,
                None => {
                    let Some(g) = self.book.meta.group(page) else {
                        continue;
                    };
                    let mut members = self.book.groups.members[g as usize].to_vec();
                    if members.get(piece as usize) != Some(&(s as u16)) {
                        continue;
                    }
                    let others: Vec<u16> = members
                        .iter()
                        .copied()
                        .filter(|&m| m != s as u16 && m != NONE)
                        .collect();
                    let chosen = self.choose(page, &others, false).ok();
                    let Some(to) = chosen
                        .and_then(|c| c.get(others.len()).copied())
                        .filter(|&t| t != NONE && self.book.prompt(t))
                    else {
                        continue;
                    };
                    members[piece as usize] = to;
                    let ng = self.book.groups.intern(&members);
                    // Frees the page on `s`, queued behind the write it was sent.
                    self.relocate(page, Some(g), Some(ng));
                    moved.insert((page, piece), to);
                    to
                }
            };
            taken.push((at, op, piece, page, to));
        }
        let at: Vec<usize> = taken.iter().map(|t| t.0).collect();
        if taken.is_empty() {
            return at;
        }
        let units = self.conns[s].redirect_writes(&at);
        self.book
            .counters
            .writes_redirected
            .fetch_add(taken.len() as u64, Relaxed);
        for ((_, op, piece, page, to), unit) in taken.into_iter().zip(units) {
            self.send_piece(to, op, piece, page, &unit);
        }
        at
    }

    /// Which pages a buried server's loss left to repair, and whether one is running (for
    /// tests and messages).
    pub fn repairing(&self) -> usize {
        self.repair.queue.len() + self.repair.in_flight
    }
}

impl PageStore for RemoteStore {
    fn capacity_bytes(&self) -> u64 {
        let r = self.book.codec.redundancy();
        // What the servers said (saturating: a lying one may say u64::MAX).
        let raw = self
            .conns
            .iter()
            .fold(0u64, |sum, c| sum.saturating_add(c.capacity_bytes));
        let grant = self.pool.as_ref().map_or(UNLIMITED, |p| p.grant_bytes);
        let per_page = (r.width() * self.book.unit()) as u128;
        (raw.min(grant) as u128 * self.book.codec.page_size() as u128 / per_page) as u64
    }

    fn write_mark(&self) -> u64 {
        // Operation ids count up from here: every released write-back started before this
        // has a smaller one.
        self.book.next_op + 1
    }

    fn settled(&self, mark: u64) -> bool {
        self.book.released_ops.first().is_none_or(|&op| op >= mark)
            && self
                .book
                .short_writes
                .first_key_value()
                .is_none_or(|(&op, _)| op >= mark)
    }

    fn fetch(&mut self, page: PageIndex) -> Result<(), StoreError> {
        let op = self.start_fetch(page.0, Purpose::Page)?;
        self.book.busy.insert(page.0, op);
        Ok(())
    }

    /// Where every page is one unsealed copy (`none`, not encrypted), a range of it read
    /// alone is what the page holds there; where pages are sealed by the piece, a piece's
    /// cell is read from one copy or its data fragment and checked alone.
    fn part_reads(&self) -> bool {
        self.book.codec.plain() || self.book.codec.by_piece()
    }

    /// Only one unsealed copy is written a range at a time: a seal covers a whole piece's
    /// cell, and parity a whole fragment. (Pieces sealed alone go over copies: see
    /// [`PageStore::piece_writes`].)
    fn part_writes(&self) -> bool {
        self.book.codec.plain()
    }

    /// A page sealed by the piece takes its written pieces alone, each sealed with the
    /// page's next version (its cells keep their own: [`Meta::set_pieces`]), while every
    /// member of its group is prompt (where a write-back of the whole page would go too): over
    /// each copy (`none` encrypted, `replicas:N`), or under `ec:K+M` as a [`Patch`] of the
    /// cells they change, where they are at most half the page's (more, and the patch reads
    /// more than the page: its parity's cells too). A member lost, leaving or slow has the page
    /// written whole instead, which places it anew.
    fn piece_writes(&self, page: PageIndex, pieces: u64) -> bool {
        let codec = &self.book.codec;
        if codec.plain() {
            return true;
        }
        if !codec.by_piece() {
            return false;
        }
        let cells = codec.page_size() / PIECE;
        if codec.redundancy().needed() > 1 && pieces.count_ones() as usize * 2 > cells {
            return false;
        }
        self.book.meta.group(page.0).is_some_and(|g| {
            let m = &self.book.groups.members[g as usize];
            m.iter().all(|&s| self.book.prompt(s))
        })
    }

    fn fetch_part(&mut self, page: PageIndex, offset: u32, len: u32) -> Result<(), StoreError> {
        assert!(self.part_reads(), "part reads of pages sealed whole");
        assert!(
            self.book.codec.plain()
                || ((offset as usize).is_multiple_of(PIECE) && len as usize == PIECE),
            "page {}: {len} bytes at {offset} of a page sealed by the piece",
            page.0
        );
        let op = self.book.op_id();
        let g = self.group_of(page.0, "fetch")?;
        self.book.ops.insert(
            op,
            Op::Fetch(Fetch {
                page: page.0,
                stamps: self.book.meta.stamps(page.0),
                group: g,
                buf: Vec::new(),
                have: 0,
                asked: 0,
                answered: 0,
                bad: 0,
                gone: 0,
                all: false,
                repair: false,
                moving: 0,
                part: Some((offset, len)),
                only: None,
                then_store: None,
            }),
        );
        self.ask(op)?;
        self.book.busy.insert(page.0, op);
        Ok(())
    }

    fn store(&mut self, page: PageIndex, data: &[u8]) -> Result<(), StoreError> {
        debug_assert_eq!(data.len(), self.book.codec.page_size());
        let op = self.start_store(page.0, data)?;
        self.book.busy.insert(page.0, op);
        Ok(())
    }

    /// A fetch of one copy (`none`, `replicas:N`) is one small frame to one server. A fetch of
    /// fragments asks K+1 servers, and sent ahead it wakes each of them twice (for the fetch,
    /// then for the write-back) where `swap` sends both in one write per link: measured on
    /// ec:4+1, that cost more than the overlap saved (docs/benchmarks.md, "A fault's fetch
    /// ahead of its victim").
    fn fetch_ahead(&self) -> bool {
        self.book.codec.redundancy().needed() == 1
    }

    /// Each run of written pieces is one `WriteRange` to each of the page's servers, where
    /// the page stays: the bytes as they are (one plain copy), or the pieces' cells sealed
    /// with the page's next version (see [`PageStore::piece_writes`]). A move of the page
    /// under way is not its latest then: a pull is superseded here, and a move through this
    /// client finds the page busy when its read comes back (`Todo::RepairWrite`), so it moves
    /// later, from a read sent after these writes on the same link.
    fn store_parts(&mut self, page: PageIndex, data: &[u8], pieces: u64) -> Result<(), StoreError> {
        assert!(
            self.piece_writes(page, pieces),
            "page {}: pieces written alone where they cannot be",
            page.0
        );
        debug_assert_eq!(data.len(), self.book.codec.page_size());
        let g = self.group_of(page.0, "write pieces of")?;
        if self.book.codec.redundancy().needed() > 1 {
            self.start_patch(page.0, data, pieces, g);
            return Ok(());
        }
        let members = self.book.groups.members[g as usize].clone();
        let plain = self.book.codec.plain();
        if plain && !self.book.alive(members[0]) {
            return Err(StoreError::Lost {
                servers: self.dead_list(),
                detail: format!("page {} was on it", page.0),
            });
        }
        let stamp = if plain {
            Stamp::default()
        } else {
            let v = self.next_stamp(page.0)?;
            let n = self.book.codec.page_size() / PIECE;
            self.book
                .codec
                .seal_pieces(page.0, v, data, pieces, &mut self.units);
            self.book.meta.set_pieces(page.0, v, pieces, n);
            v
        };
        let op = self.begin_part_write(page.0);
        let (mut ranges, mut waiting) = (0, 0);
        for (i, &s) in members.iter().enumerate() {
            if !self.book.alive(s) {
                continue; // a piece not stored: the page is degraded, and repaired as such
            }
            let mut sealed = 0;
            let units = std::mem::take(&mut self.units);
            for (at, len) in super::piece_runs(pieces) {
                let (offset, bytes) = if plain {
                    (at, &data[at..at + len])
                } else {
                    let n = len / PIECE * CELL;
                    sealed += n;
                    (at / PIECE * CELL, &units[sealed - n..sealed])
                };
                self.write_range(s, op, i, page.0, offset, bytes);
                ranges += 1;
            }
            self.units = units;
            waiting |= bit(i);
        }
        assert!(ranges > 0, "page {}: no written piece to store", page.0);
        self.part_write_sent(page.0, op, stamp, waiting, ranges);
        self.book.busy.insert(page.0, op);
        Ok(())
    }

    fn free(&mut self, page: PageIndex) -> Result<(), StoreError> {
        let old = self.book.meta.group(page.0);
        self.relocate(page.0, old, None);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        let now = Instant::now();
        self.each_live(|c| c.flush(now))
    }

    fn poll(&mut self, f: &mut dyn FnMut(Completion<'_>)) -> Result<usize, StoreError> {
        // What is delivered is counted, wherever it comes from: an answer, or the work that
        // answers and burials leave (a write stored degraded at once when its server was
        // buried here), which no answer counts. Counting answers instead once left `rmem
        // nbd` with requests waiting for buffers that such a write-back had freed, and no
        // further event to retry them on.
        self.flush()?;
        let mut n = 0;
        let mut f = |c: Completion<'_>| {
            n += 1;
            f(c)
        };
        let now = Instant::now();
        for s in 0..self.conns.len() {
            if self.book.dead[s].is_some() || self.conns[s].pending.is_empty() {
                continue;
            }
            let (book, todo, refusals) = (&mut self.book, &mut self.todo, &mut self.refusals);
            let r = self.conns[s].poll(
                &mut |a| {
                    if let (Answer::Written { op, .. }, false) = (&a, refusals.is_empty()) {
                        if let Some(Op::Store(st)) = book.ops.get(op) {
                            refusals.remove(&st.page);
                        }
                    }
                    book.answer(s, a, &mut f, todo)
                },
                now,
            );
            if let Err(e) = r {
                self.bury(s, e)?;
            }
        }
        self.hedge();
        self.settle_short_writes();
        // Write-backs finished in `tick`, and those released just now (see
        // `release_held_writes`): nothing else may wake the pager for them before its next tick.
        for page in std::mem::take(&mut self.finished) {
            f(Completion::Stored {
                page: PageIndex(page),
            });
        }
        self.work(&mut f)?;
        Ok(n)
    }

    fn wait_fds(&self, out: &mut Vec<libc::pollfd>) {
        for (s, c) in self.conns.iter().enumerate() {
            if self.book.dead[s].is_none() {
                out.extend(c.pollfd());
            }
        }
    }

    fn ready(&self) -> bool {
        !self.finished.is_empty()
    }

    fn tick(&mut self, now: Instant) -> Result<(), StoreError> {
        self.each_live(|c| c.tick(now))?;
        self.collect_groups();
        // No `hedge` here: it judges a server by how long it has been silent, and answers may
        // wait unread in its socket (the pager was away); `poll`, which every front end calls
        // on each pass, hedges after reading them.
        self.revive(now);
        self.follow_pool(now);
        // No one to hand a completion to here: a write-back that finishes is kept for the
        // next poll. A fetch finishes only on an answer, and answers are taken only by poll.
        let mut finished = std::mem::take(&mut self.finished);
        let r = self.work(&mut |c| match c {
            Completion::Stored { page } => finished.push(page.0),
            Completion::Fetched { page, .. } => {
                unreachable!("page {} fetched outside poll", page.0)
            }
        });
        self.finished = finished;
        r?;
        self.check_fetches(now)
    }

    fn heartbeat(&self) -> Option<Duration> {
        let h = (0..self.conns.len())
            .filter(|&s| self.book.dead[s].is_none())
            .map(|s| self.conns[s].heartbeat())
            .min();
        // A repair wants ticks often; a buried server when its next call back is due, and
        // while one is dialled, to see it answer.
        let due = if self.repair.started.is_some() {
            REPAIR_TICK
        } else if !self.any_lost() {
            return h;
        } else if self.reviving.iter().any(Option::is_some) {
            DIAL_LOOK
        } else {
            let left = self.next_revive.saturating_duration_since(Instant::now());
            left.max(Duration::from_millis(1))
        };
        Some(h.map_or(due, |h| h.min(due)))
    }

    /// Requests on the links, and work a server's loss left that the next poll completes
    /// (writes to place again, write-backs finished).
    fn in_flight(&self) -> usize {
        let requests: usize = self.conns.iter().map(|c| c.pending.len()).sum();
        requests + self.todo.len() + self.finished.len()
    }

    fn describe_in_flight(&self) -> String {
        let (mut fetches, mut stores, mut repairs) = (0, 0, 0);
        let mut some = Vec::new();
        for op in self.book.ops.values() {
            match op {
                Op::Fetch(fe) if fe.repair => repairs += 1,
                Op::Store(st) if st.repair => repairs += 1,
                Op::Fetch(fe) => {
                    fetches += 1;
                    if some.len() < 4 {
                        some.push(format!(
                            "{} (pieces asked {:#b}, answered {:#b}, in {:#b}, bad {:#b}{})",
                            fe.page,
                            fe.asked,
                            fe.answered,
                            fe.have,
                            fe.bad,
                            if fe.all { ", every piece asked" } else { "" }
                        ));
                    }
                }
                Op::Store(st) => {
                    stores += 1;
                    if some.len() < 4 {
                        some.push(format!("{} (pieces {:#b} unanswered)", st.page, st.waiting));
                    }
                }
                Op::Patch(pa) => {
                    stores += 1;
                    if some.len() < 4 {
                        some.push(format!(
                            "{} (a patch, cells {:#b} to come)",
                            pa.page, pa.waiting
                        ));
                    }
                }
            }
        }
        let servers = self
            .conns
            .iter()
            .enumerate()
            .map(|(s, c)| {
                let state = if self.book.dead[s].is_some() {
                    " lost"
                } else if c.in_outage() {
                    " in an outage"
                } else {
                    ""
                };
                format!("{}{state} {}", c.name, c.pending.len())
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "store: {fetches} fetches, {stores} write-backs and {repairs} repair steps open{}, \
             {} pages busy, {} to settle, {} finished to deliver; requests per server: {servers}",
            if some.is_empty() {
                String::new()
            } else {
                format!(" (of pages {})", some.join(", "))
            },
            self.book.busy.len(),
            self.todo.len(),
            self.finished.len()
        )
    }

    fn describe(&self) -> String {
        self.conns
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn counters(&self) -> Option<Arc<StoreCounters>> {
        Some(self.book.counters.clone())
    }

    /// A new session on every live server, a snapshot of this one after the requests queued
    /// there so far (a server applies a connection's requests in order), sent now: the fork
    /// goes on meanwhile, and the child's attach waits for it. The pager has no page of the
    /// child's in flight that the snapshot would need: a write-back still unanswered is
    /// written again by the child from its own copy of the staging slot.
    fn snapshot(&mut self) -> Result<Snapshot, StoreError> {
        let io = |e| StoreError::Io {
            server: "(none)".into(),
            source: e,
        };
        let session = SessionId::random().map_err(io)?;
        let key = codec::new_key().map_err(io)?;
        let child = self.book.codec.forked(&key).ok_or_else(|| {
            StoreError::Layout(format!(
                "encrypted pages {} fork() generations deep: no key left for another",
                codec::KEYS_MAX
            ))
        })?;
        self.child_codec = Some(Arc::new(child));
        let now = Instant::now();
        self.each_live(|c| {
            // The frees first: the snapshot need not keep those pages.
            c.flush(now)?;
            c.submit(Request::Snapshot { session }, Kind::Snapshot);
            c.flush(now)
        })?;
        Ok(Snapshot(session.0))
    }

    fn forked(&mut self, snapshot: Snapshot) -> Box<dyn PageStore> {
        let session = SessionId(snapshot.0);
        let counters = Arc::new(StoreCounters {
            layout: self.book.counters.layout.clone(),
            ..StoreCounters::default()
        });
        let mut child = RemoteStore {
            conns: self.conns.iter().map(|c| c.forked(session)).collect(),
            book: Book {
                codec: self
                    .child_codec
                    .take()
                    .expect("snapshot() made the child's codec"),
                // What the parent's pages are on and at: the child's copy, taken over.
                meta: std::mem::take(&mut self.book.meta),
                groups: std::mem::take(&mut self.book.groups),
                ops: HashMap::new(),
                next_op: 0,
                busy: HashMap::new(),
                writing: HashMap::new(),
                parted: HashMap::new(),
                dead: self.book.dead.clone(),
                draining: self.book.draining.clone(),
                slow: vec![None; self.conns.len()],
                hedged: vec![0; self.conns.len()],
                slow_held: Default::default(),
                lag: vec![Lag::default(); self.conns.len()],
                short_since_catch_up: false,
                released_bytes: 0,
                released_ops: Default::default(),
                short_writes: Default::default(),
                released_max: RELEASED_MAX_BYTES,
                bufs: Vec::new(),
                scratch: Vec::new(),
                counters,
            },
            placement: self.placement,
            token: self.token.clone(),
            timing: self.timing,
            session,
            units: Vec::new(),
            todo: Vec::new(),
            refusals: HashMap::new(),
            repair: Repair::default(),
            pulls: Pulls {
                off: self.pulls.off,
                ..Pulls::default()
            },
            next_revive: Instant::now(),
            revive_wait: REVIVE_FIRST,
            idle_fetches: Default::default(),
            next_fetch_check: Instant::now() + FETCH_CHECK_EVERY,
            reviving: self.conns.iter().map(|_| None).collect(),
            child_codec: None,
            // The parent's finished write-backs are the parent's: the child reinstalls those
            // pages from its copy of the staging slots (PageStates::after_fork).
            finished: Vec::new(),
            // The pool is the parent's to follow: the child goes on with the servers its
            // snapshot is on (a drained server keeps the child's snapshot until it ends).
            pool: None,
            store_short: true,
        };
        // A page whose group lost a server is as degraded in the snapshot as here: the child
        // rebuilds its own copy (the parent's repairs reach only the parent's session).
        child.queue_repairs(|b, m| m.iter().any(|&x| !b.alive(x)));
        Box::new(child)
    }

    fn end_snapshot(&mut self, snapshot: Snapshot) -> Result<(), StoreError> {
        let session = SessionId(snapshot.0);
        for s in 0..self.conns.len() {
            if self.book.dead[s].is_none() {
                self.conns[s].submit(Request::EndSnapshot { session }, Kind::EndSnapshot);
            }
        }
        self.flush()
    }
}

impl Drop for RemoteStore {
    /// A clean exit ends the sessions, so servers free the pages now.
    fn drop(&mut self) {
        for s in 0..self.conns.len() {
            if self.book.dead[s].is_none() {
                self.conns[s].end_session();
            }
        }
    }
}

/// How this client is named to the pool's manager: `PROGRAM (pid N) on HOST`.
fn client_name() -> String {
    let program = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!(
        "{} (pid {}) on {}",
        program.trim(),
        std::process::id(),
        host.trim()
    )
}

#[cfg(test)]
#[path = "cluster_pulls_test.rs"]
mod pulls_test;

#[cfg(test)]
mod groups_test {
    use super::*;

    /// More distinct groups than a `u16` names are interned; those no page is in and nothing
    /// names are freed, and their slots go to new groups; a list interned again is the same
    /// group.
    #[test]
    fn groups_past_u16_are_named_and_freed_ones_reused() {
        let mut g = Groups::default();
        let n = 70_000u32;
        let list = |i: u32| [(i >> 16) as u16, i as u16, 7];
        for i in 0..n {
            assert_eq!(g.intern(&list(i)), i);
        }
        assert_eq!(g.intern(&list(65_535)), 65_535);
        g.pages[1] = 3;
        g.collect([2, 69_999]);
        assert_eq!(g.in_use(), 3);
        assert_eq!(g.collect_at, 6);
        assert_eq!(g.intern(&list(1)), 1, "a group with pages keeps its index");
        let reused = g.intern(&[9, 9, 9]);
        assert!(reused < n && ![1, 2, 69_999].contains(&reused));
        assert_eq!(&*g.members[reused as usize], &[9, 9, 9]);
        assert_eq!(g.intern(&[9, 9, 9]), reused);
        assert!(
            g.members[0].is_empty() || reused == 0,
            "freed slots are emptied"
        );
        assert_eq!(
            g.members.len(),
            n as usize,
            "no slot added while some were free"
        );
    }
}
