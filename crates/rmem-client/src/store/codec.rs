//! How a page becomes what the servers store, and back: the redundancy scheme (one copy, N
//! replicas, or K data and M parity fragments), and the seal that lets the client check what
//! comes back (AES-256-GCM with a key made here and never sent, or a checksum where pages are
//! not encrypted).
//!
//! A page written back gets a version, one more than its last. The seal covers the page's
//! index and that version (the AEAD nonce is both, so no nonce repeats under a key), so a
//! server that returns another page, an older copy of this one, or altered bytes fails the
//! check. A sealed page of 4 KiB pieces (2 to 64 of them, and K dividing their number under
//! erasure coding) is sealed piece by piece: each piece is followed by its own seal (a
//! *cell*), whose nonce or checksum seed also names the piece, so that one piece can be read
//! from a server and checked alone (a sub-page fetch), and a fragment holds whole cells.
//! Each process seals with a key of its own: a fork() child goes on from its parent's
//! versions, so under the parent's key the child and the parent would both seal, say, page 7
//! at version 4 with different contents, and GCM with a repeated nonce gives away both
//! plaintexts' XOR and the authentication key. The child keeps its ancestors' keys to open
//! what they sealed; a page's [`Stamp`] says which key and which version sealed it. The sealed page is what is replicated, or split into fragments: a fragment is
//! checked by the page it decodes to.

use super::gf256::ReedSolomon;
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// How many servers hold each page, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redundancy {
    /// One copy on one server: losing it loses the program.
    None,
    /// The same sealed page on N servers.
    Replicas(u8),
    /// The sealed page in K data fragments and M parity fragments on K+M servers; any K
    /// rebuild it.
    Ec { k: u8, m: u8 },
}

/// What sealed one stored copy of a page: its version and the key (an index into the codec's
/// keys: 0 is the first process's, each fork() generation adds one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    pub version: u32,
    pub key: u8,
}

/// What sealed each cell of one stored page: the stamp of its last write (whole, or of some
/// pieces alone: [`Codec::seal_pieces`]), and where pieces were written alone since the page
/// was last written whole, each cell's own. Every write takes the next version, so `latest`
/// tells one stored state of the page from any other.
#[derive(Clone, Debug, Default)]
pub struct Stamps {
    pub latest: Stamp,
    /// One per piece, or `None`: every cell has `latest`.
    pub cells: Option<Arc<[Stamp]>>,
}

impl Stamps {
    /// The stamp cell `i` was sealed with.
    pub fn of(&self, i: usize) -> Stamp {
        self.cells.as_ref().map_or(self.latest, |c| c[i])
    }
}

impl From<Stamp> for Stamps {
    fn from(latest: Stamp) -> Stamps {
        Stamps {
            latest,
            cells: None,
        }
    }
}

/// Most keys a codec holds: fork() generations of one encrypted program, nested.
pub const KEYS_MAX: usize = 256;

/// Most servers one page may be spread over (replicas or K+M).
pub const WIDTH_MAX: usize = 32;

impl Redundancy {
    /// `none`, `replicas:N` or `ec:K+M`.
    pub fn parse(s: &str) -> Result<Redundancy, String> {
        let bad = |why: &str| format!("{s:?}: {why} (none, replicas:N or ec:K+M)");
        if s == "none" {
            return Ok(Redundancy::None);
        }
        let num = |t: &str| match t.trim().parse::<u64>() {
            Ok(n) => u8::try_from(n)
                .ok()
                .filter(|&n| n as usize <= WIDTH_MAX)
                .ok_or_else(|| bad(&format!("at most {WIDTH_MAX} servers a page"))),
            Err(_) => Err(bad("not a number")),
        };
        let r = if let Some(n) = s.strip_prefix("replicas:") {
            Redundancy::Replicas(num(n)?)
        } else if let Some(km) = s.strip_prefix("ec:") {
            let (k, m) = km.split_once('+').ok_or_else(|| bad("ec needs K+M"))?;
            Redundancy::Ec {
                k: num(k)?,
                m: num(m)?,
            }
        } else {
            return Err(bad("unknown scheme"));
        };
        match r {
            Redundancy::Replicas(n) if n < 1 => Err(bad("at least one replica")),
            Redundancy::Ec { k, m } if k < 1 || m < 1 => Err(bad("K and M are at least 1")),
            _ if r.width() > WIDTH_MAX => Err(bad(&format!("at most {WIDTH_MAX} servers a page"))),
            _ => Ok(r),
        }
    }

    /// Servers that hold a piece of each page.
    pub fn width(self) -> usize {
        match self {
            Redundancy::None => 1,
            Redundancy::Replicas(n) => n as usize,
            Redundancy::Ec { k, m } => k as usize + m as usize,
        }
    }

    /// Pieces needed to read a page back.
    pub fn needed(self) -> usize {
        match self {
            Redundancy::None | Redundancy::Replicas(_) => 1,
            Redundancy::Ec { k, .. } => k as usize,
        }
    }

    /// Servers a page survives losing.
    pub fn tolerates(self) -> usize {
        self.width() - self.needed()
    }
}

impl fmt::Display for Redundancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Redundancy::None => write!(f, "none"),
            Redundancy::Replicas(n) => write!(f, "replicas:{n}"),
            Redundancy::Ec { k, m } => write!(f, "ec:{k}+{m}"),
        }
    }
}

/// Bytes a seal adds to a page (or, sealed by the piece, to each piece).
pub const SEAL_LEN: usize = 16;

/// A piece: what a sub-page fetch reads, and what a page sealed by the piece seals alone
/// (the pager's piece, rmem-uffd's).
pub const PIECE: usize = rmem_uffd::PIECE as usize;

/// A piece with its seal, as a page sealed by the piece is stored.
pub const CELL: usize = PIECE + SEAL_LEN;

/// Most pieces a page sealed by the piece has (the pager's sub-page fetches go up to 64).
const CELLS_MAX: usize = 64;

enum Seal {
    /// Nothing: the page goes as it is (one copy, not encrypted).
    Plain,
    /// An xxh3-128 of the page seeded with its index and version: catches a server's wrong,
    /// stale or damaged page, not a forger.
    Checksum,
    /// AES-256-GCM, keys made here: the server sees ciphertext and cannot forge. The last
    /// key seals; the others are ancestors' (see [`Stamp`]).
    Aead(Vec<Arc<SealKey>>),
}

/// An AES-256-GCM key, set up for AWS-LC on its first use. AWS-LC picks a key's code when
/// the key is set up, from what it found the CPU can do, and finds that out in a constructor
/// of the library it is linked into. In librmem.so that constructor runs after librmem's own,
/// which starts the runtime and makes this codec in transparent mode (`rmem run`): a key set
/// up there used AWS-LC's portable code for the whole run, and sealing and opening ran about
/// 10x slower than with the CPU's AES and carry-less multiply instructions (`aes_nohw_*` and
/// `gcm_mul64_nohw` in perf; `ec:2+1 --encrypt` 4-5x slower end to end). A page is sealed or
/// opened only once the program runs, after every constructor.
struct SealKey {
    bytes: [u8; 32],
    key: OnceLock<LessSafeKey>,
}

impl SealKey {
    fn new(bytes: &[u8; 32]) -> Arc<SealKey> {
        Arc::new(SealKey {
            bytes: *bytes,
            key: OnceLock::new(),
        })
    }

    fn get(&self) -> &LessSafeKey {
        self.key.get_or_init(|| {
            LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.bytes).expect("a 32-byte key"))
        })
    }
}

/// The seal did not match: the piece is not this page at this version.
#[derive(Debug, PartialEq, Eq)]
pub struct Unsealed;

/// A page's way to and from the servers.
pub struct Codec {
    redundancy: Redundancy,
    page_size: usize,
    seal: Seal,
    rs: Option<ReedSolomon>,
    /// Bytes each server stores per page.
    unit_len: usize,
    /// Pieces sealed one by one ([`CELL`]s), or 0: the page sealed whole.
    cells: usize,
}

impl Codec {
    /// `encrypt` makes a fresh key from the kernel's random source; pages are sealed whenever
    /// they are encrypted or kept on more than one server.
    pub fn new(page_size: usize, redundancy: Redundancy, encrypt: bool) -> std::io::Result<Codec> {
        let seal = if encrypt {
            Seal::Aead(vec![SealKey::new(&new_key()?)])
        } else if redundancy == Redundancy::None {
            Seal::Plain
        } else {
            Seal::Checksum
        };
        let by_piece = !matches!(seal, Seal::Plain) && sealed_by_piece(page_size, redundancy);
        let cells = if by_piece { page_size / PIECE } else { 0 };
        let sealed = sealed_len(page_size, &seal, cells);
        let (unit_len, rs) = match redundancy {
            Redundancy::Ec { k, m } if cells > 0 => {
                // Whole cells per fragment: a piece is read from its one data fragment.
                let rs = ReedSolomon::new(k as usize, m as usize).expect("checked K and M");
                (sealed / k as usize, Some(rs))
            }
            Redundancy::Ec { k, m } => {
                let per = sealed.div_ceil(k as usize);
                let unit = per.next_multiple_of(rmem_proto::UNIT_ALIGN as usize);
                let rs = ReedSolomon::new(k as usize, m as usize).expect("checked K and M");
                (unit.max(rmem_proto::UNIT_LEN_MIN as usize), Some(rs))
            }
            _ => (sealed, None),
        };
        Ok(Codec {
            redundancy,
            page_size,
            seal,
            rs,
            unit_len,
            cells,
        })
    }

    /// The codec a fork() child goes on with: the same, and under encryption a new sealing
    /// key (`key`, made by [`new_key`]) after this one's. `None` when the keys are
    /// [`KEYS_MAX`] deep.
    pub fn forked(&self, key: &[u8; 32]) -> Option<Codec> {
        let seal = match &self.seal {
            Seal::Plain => Seal::Plain,
            Seal::Checksum => Seal::Checksum,
            Seal::Aead(keys) if keys.len() >= KEYS_MAX => return None,
            Seal::Aead(keys) => {
                let mut keys = keys.clone();
                keys.push(SealKey::new(key));
                Seal::Aead(keys)
            }
        };
        Some(Codec {
            seal,
            rs: self.rs.clone(),
            ..*self
        })
    }

    /// The stamp the next write-back of a page last stamped `last` gets; `None` once its
    /// version would wrap (its nonce would repeat).
    pub fn next_stamp(&self, last: Stamp) -> Option<Stamp> {
        Some(Stamp {
            version: last.version.checked_add(1)?,
            key: match &self.seal {
                Seal::Aead(keys) => (keys.len() - 1) as u8,
                _ => 0,
            },
        })
    }

    pub fn redundancy(&self) -> Redundancy {
        self.redundancy
    }

    /// Bytes each server stores per page (what the client names in `Hello`).
    pub fn unit_len(&self) -> usize {
        self.unit_len
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages go as they are: no seal, one piece (the fast path).
    pub fn plain(&self) -> bool {
        matches!(self.seal, Seal::Plain)
    }

    pub fn encrypted(&self) -> bool {
        matches!(self.seal, Seal::Aead(_))
    }

    /// The nonce of `page` at `version`, or of its piece `cell - 1` (`cell` 0: the page
    /// sealed whole). A codec seals every page one way, so the two never meet under a key.
    fn nonce(page: u64, version: u32, cell: usize) -> [u8; 12] {
        debug_assert!(page < 1 << 56, "page {page}");
        let mut n = [0u8; 12];
        n[..8].copy_from_slice(&(page | (cell as u64) << 56).to_le_bytes());
        n[8..].copy_from_slice(&version.to_le_bytes());
        n
    }

    /// The checksum of `data`, `page` at `version` (or its piece `cell - 1`, as [`Codec::nonce`]).
    fn checksum(page: u64, version: u32, cell: usize, data: &[u8]) -> [u8; SEAL_LEN] {
        let seed = page.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ u64::from(version)
            ^ (cell as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        xxhash_rust::xxh3::xxh3_128_with_seed(data, seed).to_le_bytes()
    }

    /// Pages are sealed piece by piece, so that one piece can be read and checked alone
    /// ([`Codec::cell`], [`Codec::open_piece`]).
    pub fn by_piece(&self) -> bool {
        self.cells > 0
    }

    /// Where piece `i`'s cell is stored, for a page sealed by the piece: the slot (the copy,
    /// or the data fragment) and the cell's offset in it.
    pub fn cell(&self, i: usize) -> (usize, u32) {
        assert!(i < self.cells, "piece {i} of {} cells", self.cells);
        let per = self.unit_len / CELL;
        (self.slot_of(i / per), ((i % per) * CELL) as u32)
    }

    /// Seal `piece` (its [`PIECE`] bytes) as piece `i` of `page` at `stamp` into `cell`
    /// ([`CELL`] bytes): the cell as the servers store it.
    pub fn seal_piece(&self, page: u64, stamp: Stamp, i: usize, piece: &[u8], cell: &mut [u8]) {
        assert!(i < self.cells, "piece {i} of {} cells", self.cells);
        cell[..PIECE].copy_from_slice(piece);
        self.seal_cell(page, stamp, i, cell);
    }

    /// Cells in one stored unit (a copy, or a fragment of `ec:K+M`), for a page sealed by
    /// the piece.
    pub fn cells_per_unit(&self) -> usize {
        self.unit_len / CELL
    }

    /// What the parity fragments' bytes change by when the data fragments' change by
    /// `shards`: K+M runs of `len` bytes each, the first K the data fragments' differences
    /// (XOR: zero where a fragment is unchanged), the last M filled in with the parity's. The
    /// code is linear, so the new parity is the old XOR these, and written pieces can go over
    /// fragments without the rest of their stripe.
    pub fn parity_delta(&self, shards: &mut [u8], len: usize) {
        let rs = self.rs.as_ref().expect("parity under ec:K+M");
        let mut runs: Vec<&mut [u8]> = shards.chunks_mut(len).collect();
        assert_eq!(runs.len(), self.slots());
        rs.encode(&mut runs).expect("equal runs");
    }

    /// Seal `data` (the first [`PIECE`] bytes of `cell`, its seal's room after them) as
    /// piece `i` of `page`, where it lies.
    fn seal_cell(&self, page: u64, stamp: Stamp, i: usize, cell: &mut [u8]) {
        let (data, tag) = cell.split_at_mut(PIECE);
        self.seal_in(page, stamp, i + 1, data, &mut tag[..SEAL_LEN]);
    }

    /// Seal `data` in place as `page` (`cell` 0) or its piece `cell - 1`; its seal into `tag`.
    fn seal_in(&self, page: u64, stamp: Stamp, cell: usize, data: &mut [u8], tag: &mut [u8]) {
        match &self.seal {
            Seal::Plain => {}
            Seal::Checksum => {
                tag.copy_from_slice(&Self::checksum(page, stamp.version, cell, data));
            }
            Seal::Aead(keys) => {
                let nonce = Nonce::assume_unique_for_key(Self::nonce(page, stamp.version, cell));
                let t = keys[stamp.key as usize]
                    .get()
                    .seal_in_place_separate_tag(nonce, Aad::from(&[]), data)
                    .expect("a page is far below AES-GCM's limit");
                tag.copy_from_slice(t.as_ref());
            }
        }
    }

    /// Check (and decrypt) `data` in place as `page` (`cell` 0) or its piece `cell - 1`.
    fn open_in(
        &self,
        page: u64,
        stamp: Stamp,
        cell: usize,
        data: &mut [u8],
        tag: &[u8],
    ) -> Result<(), Unsealed> {
        match &self.seal {
            Seal::Plain => Ok(()),
            Seal::Checksum => {
                if Self::checksum(page, stamp.version, cell, data)[..] == tag[..SEAL_LEN] {
                    Ok(())
                } else {
                    Err(Unsealed)
                }
            }
            Seal::Aead(keys) => {
                let key = keys.get(stamp.key as usize).ok_or(Unsealed)?.get();
                let nonce = Nonce::assume_unique_for_key(Self::nonce(page, stamp.version, cell));
                key.open_in_place_separate_tag(nonce, Aad::from(&[]), &tag[..SEAL_LEN], data)
                    .map(|_| ())
                    .map_err(|_| Unsealed)
            }
        }
    }

    /// Check (and decrypt, in place) the cell of piece `i` of `page` as stored
    /// ([`Codec::cell`]): its first [`PIECE`] bytes are then the piece.
    pub fn open_piece(
        &self,
        page: u64,
        stamp: Stamp,
        i: usize,
        cell: &mut [u8],
    ) -> Result<(), Unsealed> {
        if cell.len() != CELL || i >= self.cells {
            return Err(Unsealed);
        }
        let (data, tag) = cell.split_at_mut(PIECE);
        self.open_in(page, stamp, i + 1, data, tag)
    }

    /// Slots of `unit_len` bytes in the buffer a fetch gathers a page's pieces in (see
    /// [`Codec::decode`]): one per fragment, or one for a copy (every replica stores the same
    /// unit).
    pub fn slots(&self) -> usize {
        match self.redundancy {
            Redundancy::Ec { k, m } => k as usize + m as usize,
            _ => 1,
        }
    }

    /// The slot piece `piece` goes in.
    pub fn slot_of(&self, piece: usize) -> usize {
        match self.redundancy {
            Redundancy::Ec { .. } => piece,
            _ => 0,
        }
    }

    /// `page` sealed as `stamp`, as the servers store it, into `out` (replaced): the `width`
    /// fragments one after the other (ec), or the one unit every copy is.
    pub fn encode(&self, page: u64, stamp: Stamp, data: &[u8], out: &mut Vec<u8>) {
        assert_eq!(data.len(), self.page_size);
        out.clear();
        rmem_copy::extend(out, data);
        // Zeros only where the page is not: the seal's room, a fragment's padding and the
        // parity fragments.
        out.resize(self.slots() * self.unit_len, 0);
        let sealed = self.sealed_len();
        self.seal_unit(page, stamp, &mut out[..sealed]);
        if let Some(rs) = &self.rs {
            let mut shards: Vec<&mut [u8]> = out.chunks_mut(self.unit_len).collect();
            rs.encode(&mut shards).expect("equal shards");
        }
    }

    /// Seal a page where it lies: `sealed` is the page followed by [`SEAL_LEN`] bytes of room
    /// (none where pages go as they are), such as the frame that carries a copy, so that its
    /// bytes are not copied again to be sealed.
    /// Sealed by the piece, the pieces are spread out into their cells first (the room is
    /// all at the end).
    pub fn seal_unit(&self, page: u64, stamp: Stamp, sealed: &mut [u8]) {
        let ps = self.page_size;
        assert_eq!(sealed.len(), self.sealed_len());
        if self.cells == 0 {
            let (data, tag) = sealed.split_at_mut(ps);
            self.seal_in(page, stamp, 0, data, tag);
            return;
        }
        // Last piece first: each moves up, over room already left behind.
        for i in (1..self.cells).rev() {
            sealed.copy_within(i * PIECE..(i + 1) * PIECE, i * CELL);
        }
        for (i, cell) in sealed.chunks_exact_mut(CELL).enumerate() {
            self.seal_cell(page, stamp, i, cell);
        }
    }

    /// Bytes of a sealed page: the page and its seal's room, or its cells (the unit a copy
    /// is; a fragment of `ec` is smaller).
    pub fn sealed_len(&self) -> usize {
        sealed_len(self.page_size, &self.seal, self.cells)
    }

    /// Fill the slots of `buf` that `have` (a mask of pieces) lacks from the others: the data
    /// fragments only, or (`all`) the parity ones too. A copy's one slot is there or not.
    fn reconstruct(&self, buf: &mut [u8], have: u32, all: bool) -> Result<(), Unsealed> {
        let Some(rs) = &self.rs else {
            return if have != 0 { Ok(()) } else { Err(Unsealed) };
        };
        let (w, k) = (self.slots(), self.redundancy.needed());
        let lacking = (0..w).any(|i| have & (1 << i) == 0 && (all || i < k));
        if !lacking {
            return Ok(());
        }
        let mut shards: Vec<(&mut [u8], bool)> = buf[..w * self.unit_len]
            .chunks_mut(self.unit_len)
            .enumerate()
            .map(|(i, s)| (s, have & (1 << i) != 0))
            .collect();
        let r = if all {
            rs.reconstruct(&mut shards)
        } else {
            rs.reconstruct_data(&mut shards)
        };
        r.map_err(|_| Unsealed)
    }

    /// The page from the pieces a fetch gathered in `buf` ([`Codec::slots`] slots of
    /// `unit_len` bytes; piece i in slot [`Codec::slot_of`]`(i)`, for each bit i of `have`,
    /// at least [`Redundancy::needed`] of them), in place: missing data fragments rebuilt,
    /// the seal checked and the page decrypted, it is `buf[..page_size]`. `Err` when the seal
    /// does not match; under encryption the pieces in `buf` are then no longer what came.
    pub fn decode(
        &self,
        page: u64,
        stamps: &Stamps,
        buf: &mut [u8],
        have: u32,
    ) -> Result<(), Unsealed> {
        self.reconstruct(buf, have, false)?;
        let n = self.sealed_len();
        self.open(page, stamps, &mut buf[..n])?;
        // Sealed by the piece: gather the pieces out of their cells, first piece first (each
        // moves down, over what was read already).
        for i in 1..self.cells {
            buf.copy_within(i * CELL..i * CELL + PIECE, i * PIECE);
        }
        Ok(())
    }

    /// Every piece of the page rebuilt in `buf` (laid out as for [`Codec::decode`]) as the
    /// servers store it, sealed, and the seal checked without changing them (under
    /// encryption on a copy in `scratch`): what a repair writes. `Err` when the seal does not
    /// match; the pieces that came are unchanged either way.
    pub fn rebuild(
        &self,
        page: u64,
        stamps: &Stamps,
        buf: &mut [u8],
        have: u32,
        scratch: &mut Vec<u8>,
    ) -> Result<(), Unsealed> {
        self.reconstruct(buf, have, true)?;
        let sealed = &mut buf[..self.sealed_len()];
        if let Seal::Aead(_) = self.seal {
            // Opening decrypts in place.
            scratch.clear();
            rmem_copy::extend(scratch, sealed);
            self.open(page, stamps, scratch)
        } else {
            // Checking a checksum leaves the page as it is.
            self.open(page, stamps, sealed)
        }
    }

    /// Check (and decrypt, in place) one sealed page: sealed by the piece, every cell with
    /// its own stamp (the pieces stay in their cells).
    pub fn open(&self, page: u64, stamps: &Stamps, sealed: &mut [u8]) -> Result<(), Unsealed> {
        if self.cells == 0 {
            debug_assert!(
                stamps.cells.is_none(),
                "page {page}: cells of a page sealed whole"
            );
            let (data, tag) = sealed.split_at_mut(self.page_size);
            return self.open_in(page, stamps.latest, 0, data, tag);
        }
        if stamps.cells.as_ref().is_some_and(|c| c.len() != self.cells) {
            return Err(Unsealed);
        }
        for (i, cell) in sealed[..self.cells * CELL]
            .chunks_exact_mut(CELL)
            .enumerate()
        {
            self.open_piece(page, stamps.of(i), i, cell)?;
        }
        Ok(())
    }

    /// The pieces of `data` (a whole page) in `pieces` (bit i: piece i), each sealed into its
    /// cell as `stamp`, the cells one after the other in `out` (replaced): what
    /// [`Codec::cell`]'s places take, run by run of consecutive pieces, to write those
    /// pieces over a stored copy alone. Only a page sealed by the piece kept whole on each
    /// server (one copy, or replicas) can: a fragment's parity covers its whole stripe.
    pub fn seal_pieces(
        &self,
        page: u64,
        stamp: Stamp,
        data: &[u8],
        pieces: u64,
        out: &mut Vec<u8>,
    ) {
        assert!(
            self.cells > 0 && self.rs.is_none(),
            "page {page}: pieces sealed alone where cells are whole copies"
        );
        assert_eq!(data.len(), self.page_size);
        out.clear();
        for i in (0..self.cells).filter(|&i| pieces & (1 << i) != 0) {
            let at = out.len();
            rmem_copy::extend(out, &data[i * PIECE..(i + 1) * PIECE]);
            out.resize(at + CELL, 0);
            self.seal_cell(page, stamp, i, &mut out[at..]);
        }
    }
}

/// Whether a sealed page of `page_size` bytes kept as `redundancy` is sealed by the piece:
/// 2 to 64 pieces, and under `ec:K+M` K dividing their number (a fragment holds whole cells).
/// The default layout prefers such a K ([`crate::Config::layout`]).
pub fn sealed_by_piece(page_size: usize, redundancy: Redundancy) -> bool {
    let pieces = page_size / PIECE;
    page_size.is_multiple_of(PIECE)
        && (2..=CELLS_MAX).contains(&pieces)
        && match redundancy {
            Redundancy::Ec { k, .. } => pieces.is_multiple_of(k as usize),
            _ => true,
        }
}

/// Bytes of a sealed page: the page and its seal (none when pages go as they are), or its
/// `cells` cells.
fn sealed_len(page_size: usize, seal: &Seal, cells: usize) -> usize {
    match seal {
        Seal::Plain => page_size,
        _ if cells > 0 => cells * CELL,
        _ => page_size + SEAL_LEN,
    }
}

/// A fresh AES-256 key from the kernel's random source.
pub fn new_key() -> std::io::Result<[u8; 32]> {
    let mut key = [0u8; 32];
    getrandom::getrandom(&mut key).map_err(std::io::Error::from)?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(seed: u8) -> Vec<u8> {
        sized(4096, seed)
    }

    /// A page of `len` bytes, no two of its 4 KiB pieces alike.
    fn sized(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i / PIECE) as u8)
            .collect()
    }

    fn v(version: u32) -> Stamp {
        Stamp { version, key: 0 }
    }

    /// The stamps of a page written whole at version 3, then its `pieces` alone at 4.
    fn written_at_4(pieces: u64) -> Stamps {
        let each: Vec<Stamp> = (0..16)
            .map(|i| if pieces & (1 << i) != 0 { v(4) } else { v(3) })
            .collect();
        Stamps {
            latest: v(4),
            cells: Some(each.into()),
        }
    }

    /// Decode a page from every piece of `units` (as `encode` wrote them), and return it.
    fn decoded(c: &Codec, page: u64, stamp: Stamp, units: &[u8]) -> Result<Vec<u8>, Unsealed> {
        let mut buf = units.to_vec();
        c.decode(page, &stamp.into(), &mut buf, (1 << c.slots()) - 1)?;
        Ok(buf[..c.page_size()].to_vec())
    }

    /// Making a codec (in librmem.so's constructor, before AWS-LC's own has looked at the
    /// CPU) sets up no AES key; the first seal does, and a fork child's key likewise waits
    /// for its first use. (A key set up first ran AWS-LC's portable code: SealKey's doc.)
    #[test]
    fn keys_are_set_up_at_their_first_use_not_with_the_codec() {
        let keys = |c: &Codec| match &c.seal {
            Seal::Aead(keys) => keys
                .iter()
                .map(|k| k.key.get().is_some())
                .collect::<Vec<_>>(),
            _ => unreachable!("encrypted"),
        };
        let c = Codec::new(4096, Redundancy::None, true).unwrap();
        assert_eq!(keys(&c), [false]);
        let mut sealed = page(3);
        sealed.resize(c.sealed_len(), 0);
        c.seal_unit(9, v(1), &mut sealed);
        assert_eq!(keys(&c), [true]);
        let child = c.forked(&[5; 32]).unwrap();
        assert_eq!(keys(&child), [true, false]);
        c.open(9, &v(1).into(), &mut sealed).unwrap();
        assert_eq!(&sealed[..4096], &page(3)[..]);
    }

    #[test]
    fn parses_and_names_every_scheme() {
        for s in ["none", "replicas:2", "ec:4+1", "ec:8+2"] {
            assert_eq!(Redundancy::parse(s).unwrap().to_string(), s);
        }
        for s in [
            "",
            "replicas:0",
            "ec:4",
            "ec:0+1",
            "ec:4+0",
            "raid5",
            "ec:30+3",
        ] {
            assert!(Redundancy::parse(s).is_err(), "{s}");
        }
        assert_eq!(Redundancy::parse("ec:4+2").unwrap().tolerates(), 2);
        // A number too large for the layout is named as such, not as "not a number".
        for s in ["ec:300+2", "replicas:40", "replicas:99999999999"] {
            let e = Redundancy::parse(s).unwrap_err();
            assert!(e.contains("at most 32 servers"), "{s}: {e}");
        }
        assert!(Redundancy::parse("ec:x+2")
            .unwrap_err()
            .contains("not a number"));
    }

    #[test]
    fn every_scheme_reads_back_what_it_wrote_from_any_enough_pieces() {
        // 4 KiB pages are sealed whole; 64 KiB ones by the piece, except under ec:3+1 (3
        // does not divide 16 pieces).
        for (ps, r) in [4096, 65536].into_iter().flat_map(|ps| {
            ["none", "replicas:3", "ec:4+1", "ec:4+2", "ec:8+2", "ec:3+1"].map(|r| (ps, r))
        }) {
            for encrypt in [false, true] {
                let c = Codec::new(ps, Redundancy::parse(r).unwrap(), encrypt).unwrap();
                assert_eq!(
                    c.by_piece(),
                    ps == 65536 && (r != "none" || encrypt) && r != "ec:3+1",
                    "{ps} {r} encrypt={encrypt}"
                );
                assert!(rmem_proto::unit_len_ok(c.unit_len() as u32), "{ps} {r}");
                let data = sized(ps, 7);
                let mut units = Vec::new();
                c.encode(9, v(3), &data, &mut units);
                let w = c.slots();
                assert_eq!(units.len(), w * c.unit_len());
                if encrypt {
                    assert_ne!(&units[..4096], &data[..], "{r}: ciphertext");
                }
                let lose = if w > 1 { c.redundancy().tolerates() } else { 0 };
                for first in 0..w {
                    // The pieces lost hold garbage: neither call may read them.
                    let mut have = (1u32 << w) - 1;
                    let mut buf = units.clone();
                    for i in 0..lose {
                        let s = (first + i) % w;
                        have &= !(1 << s);
                        buf[s * c.unit_len()..(s + 1) * c.unit_len()].fill(0xA5);
                    }
                    let mut rebuilt = buf.clone();
                    c.rebuild(9, &v(3).into(), &mut rebuilt, have, &mut Vec::new())
                        .unwrap();
                    assert_eq!(rebuilt, units, "{r} encrypt={encrypt} rebuilt from {first}");
                    c.decode(9, &v(3).into(), &mut buf, have).unwrap();
                    assert_eq!(
                        &buf[..ps],
                        &data[..],
                        "{r} encrypt={encrypt} without {lose} from {first}"
                    );
                }
            }
        }
    }

    /// A copy sealed where its frame holds it is the unit `encode` makes, and opens.
    #[test]
    fn a_copy_sealed_in_place_is_the_encoded_unit() {
        for (ps, redundancy, encrypt) in [4096, 65536].into_iter().flat_map(|ps| {
            [("none", true), ("replicas:2", false), ("replicas:2", true)].map(|(r, e)| (ps, r, e))
        }) {
            let c = Codec::new(ps, Redundancy::parse(redundancy).unwrap(), encrypt).unwrap();
            let (data, stamp) = (sized(ps, 5), v(3));
            let mut units = Vec::new();
            c.encode(9, stamp, &data, &mut units);
            let mut frame = data.clone();
            frame.resize(c.sealed_len(), 0);
            c.seal_unit(9, stamp, &mut frame);
            assert_eq!(frame, units, "{redundancy} encrypt={encrypt}");
            assert_eq!(decoded(&c, 9, stamp, &frame).unwrap(), data);
        }
    }

    #[test]
    fn another_page_an_old_version_or_a_changed_byte_fails_the_seal() {
        for (ps, r, encrypt) in [4096, 65536].into_iter().flat_map(|ps| {
            [
                ("replicas:2", false),
                ("replicas:2", true),
                ("ec:4+1", true),
                ("none", true),
            ]
            .map(|(r, e)| (ps, r, e))
        }) {
            let c = Codec::new(ps, Redundancy::parse(r).unwrap(), encrypt).unwrap();
            let mut units = Vec::new();
            c.encode(9, v(3), &sized(ps, 1), &mut units);
            let all = (1u32 << c.slots()) - 1;
            assert_eq!(decoded(&c, 10, v(3), &units), Err(Unsealed), "{r}");
            assert_eq!(decoded(&c, 9, v(2), &units), Err(Unsealed), "{r}");
            let mut bad = units.clone();
            bad[100] ^= 1;
            assert_eq!(decoded(&c, 9, v(3), &bad), Err(Unsealed), "{r}");
            // A repair checks the seal too, and leaves what came as it was.
            let mut buf = bad.clone();
            let mut scratch = Vec::new();
            assert_eq!(
                c.rebuild(9, &v(3).into(), &mut buf, all, &mut scratch),
                Err(Unsealed)
            );
            assert_eq!(buf, bad, "{r}");
            assert_eq!(
                c.rebuild(10, &v(3).into(), &mut buf, all, &mut scratch),
                Err(Unsealed)
            );
        }
    }

    /// Sealed by the piece, each piece is read from where [`Codec::cell`] says and checked
    /// alone; another piece's cell, another page's, an older version's, or a changed byte
    /// fails, as a whole page does.
    #[test]
    fn a_piece_is_read_and_checked_alone() {
        for r in ["none", "replicas:2", "ec:4+1", "ec:8+2", "ec:2+1"] {
            for encrypt in [false, true] {
                if r == "none" && !encrypt {
                    continue; // plain: read as it is
                }
                let c = Codec::new(65536, Redundancy::parse(r).unwrap(), encrypt).unwrap();
                assert!(c.by_piece(), "{r}");
                let data = sized(65536, 4);
                let mut units = Vec::new();
                c.encode(9, v(3), &data, &mut units);
                let cell_at = |i: usize| {
                    let (slot, off) = c.cell(i);
                    let at = slot * c.unit_len() + off as usize;
                    units[at..at + CELL].to_vec()
                };
                for i in 0..16 {
                    let mut cell = cell_at(i);
                    c.open_piece(9, v(3), i, &mut cell).unwrap();
                    assert_eq!(
                        &cell[..PIECE],
                        &data[i * PIECE..(i + 1) * PIECE],
                        "{r} encrypt={encrypt} piece {i}"
                    );
                    let other = (i + 1) % 16;
                    for (page, stamp, piece, bad) in [
                        (9, v(3), other, None),
                        (10, v(3), i, None),
                        (9, v(2), i, None),
                        (9, v(3), i, Some(17)),
                        (9, v(3), i, Some(PIECE + 3)),
                    ] {
                        let mut cell = cell_at(i);
                        if let Some(b) = bad {
                            cell[b] ^= 1;
                        }
                        assert_eq!(
                            c.open_piece(page, stamp, piece, &mut cell),
                            Err(Unsealed),
                            "{r} encrypt={encrypt} piece {i} as page {page} piece {piece} \
                             {stamp:?} byte {bad:?}"
                        );
                    }
                }
                // Two cells swapped: the page no longer opens.
                let (a, b) = (c.cell(0), c.cell(1));
                let (a, b) = (
                    a.0 * c.unit_len() + a.1 as usize,
                    b.0 * c.unit_len() + b.1 as usize,
                );
                let mut swapped = units.clone();
                swapped[a..a + CELL].copy_from_slice(&units[b..b + CELL]);
                swapped[b..b + CELL].copy_from_slice(&units[a..a + CELL]);
                assert_eq!(decoded(&c, 9, v(3), &swapped), Err(Unsealed), "{r}");
            }
        }
    }

    /// Pieces sealed alone at a newer version, written over a stored copy, open with each
    /// cell's own stamp; the page as written before them, or the copy without them (a server
    /// that missed those writes), does not.
    #[test]
    fn pieces_written_alone_open_with_their_own_stamps_and_a_stale_copy_fails() {
        for r in ["none", "replicas:2"] {
            for encrypt in [false, true] {
                if r == "none" && !encrypt {
                    continue;
                }
                let c = Codec::new(65536, Redundancy::parse(r).unwrap(), encrypt).unwrap();
                let old = sized(65536, 4);
                let mut unit = Vec::new();
                c.encode(9, v(3), &old, &mut unit);
                let stale = unit.clone();
                let mut new = sized(65536, 5);
                let pieces: u64 = 0b110_0100; // 2, 5, 6
                let mut cells = Vec::new();
                c.seal_pieces(9, v(4), &new, pieces, &mut cells);
                assert_eq!(cells.len(), 3 * CELL);
                let mut at = 0;
                for (run, len) in crate::store::piece_runs(pieces) {
                    let (slot, off) = c.cell(run / PIECE);
                    assert_eq!(slot, 0);
                    let n = len / PIECE * CELL;
                    unit[off as usize..off as usize + n].copy_from_slice(&cells[at..at + n]);
                    at += n;
                }
                let stamps = written_at_4(pieces);
                for i in (0..16).filter(|i| pieces & (1 << i) == 0) {
                    new[i * PIECE..(i + 1) * PIECE]
                        .copy_from_slice(&old[i * PIECE..(i + 1) * PIECE]);
                }
                let mut buf = unit.clone();
                c.decode(9, &stamps, &mut buf, 1).unwrap();
                assert!(buf[..65536] == new[..], "{r} encrypt={encrypt}");
                let (_, off) = c.cell(5);
                let mut cell = unit[off as usize..off as usize + CELL].to_vec();
                c.open_piece(9, stamps.of(5), 5, &mut cell).unwrap();
                assert!(cell[..PIECE] == new[5 * PIECE..6 * PIECE]);
                for (what, stamps, bytes) in [
                    ("the copy without the pieces", stamps.clone(), &stale),
                    ("every cell as the old version", v(3).into(), &unit),
                    ("every cell as the new version", v(4).into(), &unit),
                ] {
                    let mut buf = bytes.clone();
                    assert_eq!(
                        c.decode(9, &stamps, &mut buf, 1),
                        Err(Unsealed),
                        "{r} encrypt={encrypt}: {what}"
                    );
                }
            }
        }
    }

    /// Under `ec:K+M`, pieces sealed alone into their data fragments' cells and the parity
    /// patched by the code of the cells' differences make the stripe the page with those
    /// pieces: decoded from any K fragments (a data fragment left out rebuilt from the
    /// patched parity), each cell opening with its own stamp.
    #[test]
    fn a_stripe_patched_by_the_pieces_differences_decodes_from_any_k() {
        for (r, encrypt) in [
            ("ec:2+1", false),
            ("ec:4+1", true),
            ("ec:4+2", false),
            ("ec:8+2", true),
        ] {
            let c = Codec::new(65536, Redundancy::parse(r).unwrap(), encrypt).unwrap();
            let (k, w, per, unit) = (
                c.redundancy().needed(),
                c.slots(),
                c.cells_per_unit(),
                c.unit_len(),
            );
            let old = sized(65536, 4);
            let mut units = Vec::new();
            c.encode(9, v(3), &old, &mut units);
            let new = sized(65536, 5);
            let pieces: u64 = 0b0100_0000_0010_0011; // 0, 1, 5, 14
            let mut want = old.clone();
            let mut diffs = vec![0u8; w * CELL * per];
            for i in (0..16).filter(|i| pieces & (1 << i) != 0) {
                want[i * PIECE..(i + 1) * PIECE].copy_from_slice(&new[i * PIECE..(i + 1) * PIECE]);
                let (slot, off) = c.cell(i);
                let at = slot * unit + off as usize;
                let mut cell = vec![0u8; CELL];
                c.seal_piece(9, v(4), i, &new[i * PIECE..(i + 1) * PIECE], &mut cell);
                // The difference, at its offset's row of shards.
                let row = (i % per) * w * CELL;
                for (n, d) in diffs[row + slot * CELL..row + (slot + 1) * CELL]
                    .iter_mut()
                    .enumerate()
                {
                    *d = units[at + n] ^ cell[n];
                }
                units[at..at + CELL].copy_from_slice(&cell);
            }
            for o in 0..per {
                let row = &mut diffs[o * w * CELL..(o + 1) * w * CELL];
                c.parity_delta(row, CELL);
                for p in k..w {
                    let at = p * unit + o * CELL;
                    for (n, d) in row[p * CELL..(p + 1) * CELL].iter().enumerate() {
                        units[at + n] ^= d;
                    }
                }
            }
            let stamps = written_at_4(pieces);
            let all = (1u32 << w) - 1;
            for left_out in 0..w {
                let mut buf = units.clone();
                // What a fetch has of the piece left out: nothing it may use.
                buf[left_out * unit..(left_out + 1) * unit].fill(0);
                c.decode(9, &stamps, &mut buf, all & !(1 << left_out))
                    .unwrap_or_else(|_| panic!("{r}: fragment {left_out} left out"));
                assert!(
                    buf[..65536] == want[..],
                    "{r} encrypt={encrypt}: fragment {left_out} left out"
                );
            }
        }
    }

    #[test]
    fn a_forked_codec_seals_with_its_own_key_and_opens_its_parents_pages() {
        let parent = Codec::new(4096, Redundancy::parse("replicas:2").unwrap(), true).unwrap();
        let child = parent.forked(&new_key().unwrap()).unwrap();
        let mut old = Vec::new();
        parent.encode(9, v(3), &page(1), &mut old);
        assert_eq!(
            decoded(&child, 9, v(3), &old).unwrap(),
            page(1),
            "the parent's page, opened by the child"
        );
        // Both go on to version 4 of page 9 with different contents.
        let (ps, cs) = (
            parent.next_stamp(v(3)).unwrap(),
            child.next_stamp(v(3)).unwrap(),
        );
        assert_eq!((ps, cs), (v(4), Stamp { version: 4, key: 1 }));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        parent.encode(9, ps, &page(2), &mut a);
        child.encode(9, cs, &page(3), &mut b);
        // Under one key and nonce, ciphertext XOR would be plaintext XOR (the keystream
        // cancels): not so under two keys.
        let xor = |x: &[u8], y: &[u8]| x.iter().zip(y).map(|(p, q)| p ^ q).collect::<Vec<_>>();
        assert_ne!(xor(&a[..4096], &b[..4096]), xor(&page(2), &page(3)));
        assert_eq!(
            decoded(&parent, 9, cs, &b),
            Err(Unsealed),
            "the parent has no key of its child's"
        );
        assert_eq!(decoded(&child, 9, cs, &b).unwrap(), page(3));
        let mut deep = child;
        for _ in 2..KEYS_MAX {
            deep = deep.forked(&[7; 32]).unwrap();
        }
        assert!(deep.forked(&[7; 32]).is_none(), "{KEYS_MAX} keys at most");
        let plain = Codec::new(4096, Redundancy::None, false).unwrap();
        assert_eq!(plain.next_stamp(v(1)), Some(v(2)));
        assert_eq!(plain.next_stamp(v(u32::MAX)), None);
    }

    #[test]
    fn overhead_is_the_scheme_and_a_seal() {
        let ec = Codec::new(4096, Redundancy::parse("ec:4+1").unwrap(), true).unwrap();
        assert_eq!(ec.unit_len(), 1032); // (4096 + 16) / 4, to 8 bytes
        assert!(rmem_proto::unit_len_ok(ec.unit_len() as u32));
        let plain = Codec::new(65536, Redundancy::None, false).unwrap();
        assert!(plain.plain());
        assert_eq!(plain.unit_len(), 65536);
    }
}
