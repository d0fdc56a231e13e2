//! Pages on local disk: [`DiskStore`], the file behind a disk-backed server
//! (`rmem server --store file:PATH`), with a bounded RAM cache in front of it.
//!
//! The sessions' arenas ([`crate::slab::Arena`]) still own every page's state (keys,
//! reference counts, snapshots, capacity); a disk-backed arena names, for each of its slots, a
//! slot of this file instead of a slab in RAM. This module only places units in the file,
//! reads and writes them, and rebuilds the list of live units when a persisted file is
//! reopened.
//!
//! **Layout.** A superblock ([`SUPER_BYTES`]), then extents of [`EXTENT_BYTES`], each holding
//! units of one size (a server's clients may use several unit sizes: pages, sealed pages,
//! erasure-coded fragments). An extent opens with its header (magic, unit size, slot count,
//! checksum); its slots follow, each a 64-byte slot header and the unit:
//!
//! ```text
//! slot header: magic u32 | unit_len u32 | session u128 | key u64 | seq u64 | flags u32 |
//!              reserved u32 | data_sum u64 (xxh3 of the unit) | header_sum u64 (xxh3 of the 56 bytes before)
//! ```
//!
//! The file is sparse: an extent takes disk space only as its slots are written. A unit is
//! written with one `pwrite` of header and data; a read checks both checksums, so a torn or
//! rotten slot is an error, never a wrong page.
//!
//! **Persist** (`,persist`). Every write goes to a fresh slot (copy-on-write) with a sequence
//! number higher than any before; only then is the old slot's header cleared. A crash between
//! the two leaves both, and reopening keeps the higher sequence number. A freed unit's header
//! is cleared. Reopening reads every extent and indexes a unit only if its extent header, its
//! slot header and its data verify. Units written by snapshot sessions (a `fork()` child's
//! copy-on-write view, which reads through its parent) are not restored: a snapshot's pages
//! mean nothing without its parent's at the same instant. No `fsync` per write: pages survive
//! a restart or a crash of the server process (they are in the kernel's page cache); after a
//! machine crash, units whose writes had not reached the disk fail their checksums and are
//! dropped. Without persist, the file is scratch: it is unlinked as soon as it is open, so it
//! goes away however the server ends (SIGKILL included), and writes overwrite in place.

use rmem_proto::SessionId;
use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use xxhash_rust::xxh3::xxh3_64;

/// Bytes at the start of the file: the superblock.
pub const SUPER_BYTES: u64 = 4096;
/// Bytes of one extent: its header and slots of one unit size (at least 3 of the largest).
pub const EXTENT_BYTES: u64 = 16 << 20;
/// Bytes of an extent's header, before its first slot.
const EXTENT_HEADER_BYTES: u64 = 4096;
/// Bytes of a slot's header, before its unit.
pub const SLOT_HEADER_BYTES: u64 = 64;
/// The RAM cache when `--store-cache` is not given.
pub const CACHE_BYTES_DEFAULT: u64 = 64 << 20;

const SUPER_MAGIC: &[u8; 8] = b"RMEMDISK";
const SUPER_VERSION: u32 = 1;
const EXTENT_MAGIC: &[u8; 8] = b"RMEXTENT";
const SLOT_MAGIC: u32 = u32::from_le_bytes(*b"RMSL");
/// Slot header flag: written by a snapshot session (not restored).
const SLOT_SNAPSHOT: u32 = 1;

/// Whose unit a slot holds, written into its header for a persisted store to be rebuilt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotOwner {
    pub session: SessionId,
    pub key: u64,
    /// Written by a snapshot session.
    pub snapshot: bool,
}

/// A unit found valid when a persisted store was reopened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    pub session: SessionId,
    pub key: u64,
    pub unit_len: u32,
    /// The slot's place in the file.
    pub at: SlotAt,
}

/// A slot's place: the byte offset of its header in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotAt(pub u64);

/// Why a store cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot open {path}")]
    Open { path: PathBuf, source: io::Error },
    #[error("{path} is in use by another rmem server")]
    Locked { path: PathBuf },
    #[error("{path} exists and is not an rmem disk store: remove it or name another file")]
    Foreign { path: PathBuf },
    #[error("cannot read {path}")]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot write {path}")]
    Write { path: PathBuf, source: io::Error },
}

/// Slot header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SlotHeader {
    unit_len: u32,
    session: SessionId,
    key: u64,
    seq: u64,
    flags: u32,
    data_sum: u64,
}

impl SlotHeader {
    fn encode(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&SLOT_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.unit_len.to_le_bytes());
        out[8..24].copy_from_slice(&self.session.0.to_le_bytes());
        out[24..32].copy_from_slice(&self.key.to_le_bytes());
        out[32..40].copy_from_slice(&self.seq.to_le_bytes());
        out[40..44].copy_from_slice(&self.flags.to_le_bytes());
        out[44..48].copy_from_slice(&0u32.to_le_bytes());
        out[48..56].copy_from_slice(&self.data_sum.to_le_bytes());
        let sum = xxh3_64(&out[0..56]);
        out[56..64].copy_from_slice(&sum.to_le_bytes());
    }

    /// The header in `b` (64 bytes) if its magic and checksum hold.
    fn decode(b: &[u8]) -> Option<SlotHeader> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u32_at(0) != SLOT_MAGIC || u64_at(56) != xxh3_64(&b[0..56]) {
            return None;
        }
        Some(SlotHeader {
            unit_len: u32_at(4),
            session: SessionId(u128::from_le_bytes(b[8..24].try_into().expect("16 bytes"))),
            key: u64_at(24),
            seq: u64_at(32),
            flags: u32_at(40),
            data_sum: u64_at(48),
        })
    }
}

fn extent_header(unit_len: u32, slots: u32) -> [u8; 24] {
    let mut h = [0u8; 24];
    h[0..8].copy_from_slice(EXTENT_MAGIC);
    h[8..12].copy_from_slice(&unit_len.to_le_bytes());
    h[12..16].copy_from_slice(&slots.to_le_bytes());
    let sum = xxh3_64(&h[0..16]);
    h[16..24].copy_from_slice(&sum.to_le_bytes());
    h
}

/// (unit_len, slots) of a valid extent header.
fn parse_extent_header(b: &[u8]) -> Option<(u32, u32)> {
    if b.len() < 24 || &b[0..8] != EXTENT_MAGIC {
        return None;
    }
    let unit_len = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let slots = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
    let sum = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
    (sum == xxh3_64(&b[0..16])
        && rmem_proto::unit_len_ok(unit_len)
        && slots == slots_per_extent(unit_len))
    .then_some((unit_len, slots))
}

fn superblock() -> [u8; 32] {
    let mut h = [0u8; 32];
    h[0..8].copy_from_slice(SUPER_MAGIC);
    h[8..12].copy_from_slice(&SUPER_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&EXTENT_BYTES.to_le_bytes());
    let sum = xxh3_64(&h[0..24]);
    h[24..32].copy_from_slice(&sum.to_le_bytes());
    h
}

fn stride(unit_len: u32) -> u64 {
    SLOT_HEADER_BYTES + unit_len as u64
}

fn slots_per_extent(unit_len: u32) -> u32 {
    ((EXTENT_BYTES - EXTENT_HEADER_BYTES) / stride(unit_len)) as u32
}

fn extent_at(extent: u32) -> u64 {
    SUPER_BYTES + extent as u64 * EXTENT_BYTES
}

/// Slots of one unit size.
#[derive(Debug, Default)]
struct Zone {
    /// Slots written once and freed since, reused first.
    free: Vec<SlotAt>,
    /// The extent being filled and its next never-used slot.
    filling: Option<(u32, u32)>,
}

/// Units kept in RAM, bounded in bytes, evicted by CLOCK (second chance).
#[derive(Debug, Default)]
struct Cache {
    budget_bytes: u64,
    used_bytes: u64,
    units: HashMap<SlotAt, (Vec<u8>, bool)>,
    /// Slots in insertion order; entries of slots no longer cached are skipped.
    clock: VecDeque<SlotAt>,
}

impl Cache {
    fn get(&mut self, at: SlotAt, out: &mut Vec<u8>) -> bool {
        match self.units.get_mut(&at) {
            Some((data, referenced)) => {
                *referenced = true;
                rmem_copy::extend(out, data);
                true
            }
            None => false,
        }
    }

    fn put(&mut self, at: SlotAt, data: &[u8]) {
        let len = data.len() as u64;
        if len > self.budget_bytes {
            return;
        }
        if let Some((old, referenced)) = self.units.get_mut(&at) {
            old.clear();
            rmem_copy::extend(old, data);
            *referenced = true;
            return;
        }
        while self.used_bytes + len > self.budget_bytes {
            let Some(victim) = self.clock.pop_front() else {
                break;
            };
            match self.units.get_mut(&victim) {
                Some((_, referenced)) if *referenced => {
                    *referenced = false;
                    self.clock.push_back(victim);
                }
                Some(_) => self.remove(victim),
                None => {}
            }
        }
        self.units.insert(at, (data.to_vec(), false));
        self.used_bytes += len;
        self.clock.push_back(at);
        if self.clock.len() > 2 * self.units.len() + 64 {
            let units = &self.units;
            self.clock.retain(|a| units.contains_key(a));
        }
    }

    fn remove(&mut self, at: SlotAt) {
        if let Some((data, _)) = self.units.remove(&at) {
            self.used_bytes -= data.len() as u64;
        }
    }
}

#[derive(Debug)]
struct Inner {
    zones: HashMap<u32, Zone>,
    /// Extents never used; reused torn ones first.
    extents_spare: Vec<u32>,
    extents_next: u32,
    cache: Cache,
}

/// One file of units; shared by every session's arena on a disk-backed server.
#[derive(Debug)]
pub struct DiskStore {
    file: File,
    path: PathBuf,
    persist: bool,
    seq: AtomicU64,
    inner: Mutex<Inner>,
    /// Tests: every write fails as on a full disk.
    #[cfg(test)]
    pub(crate) fail_writes: std::sync::atomic::AtomicBool,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DiskStore {
    /// Open the store at `path`. Scratch (`persist` false): created empty (an earlier rmem
    /// store there is overwritten, any other file refused) and unlinked at once. Persist: a
    /// store there is reopened and its valid units returned, else one is created.
    pub fn open(
        path: &Path,
        persist: bool,
        cache_bytes: u64,
    ) -> Result<(DiskStore, Vec<Restored>), OpenError> {
        let p = || path.to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|source| OpenError::Open { path: p(), source })?;
        file.try_lock()
            .map_err(|_| OpenError::Locked { path: p() })?;
        let len = file
            .metadata()
            .map_err(|source| OpenError::Read { path: p(), source })?
            .len();
        let mut sb = [0u8; 32];
        let ours =
            len >= SUPER_BYTES && file.read_exact_at(&mut sb, 0).is_ok() && sb == superblock();
        if len > 0 && !ours {
            return Err(OpenError::Foreign { path: p() });
        }
        let store = DiskStore {
            file,
            path: p(),
            persist,
            seq: AtomicU64::new(1),
            #[cfg(test)]
            fail_writes: Default::default(),
            inner: Mutex::new(Inner {
                zones: HashMap::new(),
                extents_spare: Vec::new(),
                extents_next: 0,
                cache: Cache {
                    budget_bytes: cache_bytes,
                    ..Cache::default()
                },
            }),
        };
        let write_err = |source| OpenError::Write { path: p(), source };
        if !persist {
            std::fs::remove_file(path).map_err(write_err)?;
        }
        if !persist || len == 0 {
            store.file.set_len(0).map_err(write_err)?;
            store
                .file
                .write_all_at(&superblock(), 0)
                .map_err(write_err)?;
            store.file.set_len(SUPER_BYTES).map_err(write_err)?;
            return Ok((store, Vec::new()));
        }
        let restored = store
            .rebuild(len)
            .map_err(|source| OpenError::Read { path: p(), source })?;
        Ok((store, restored))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn persist(&self) -> bool {
        self.persist
    }

    /// Read every extent of a persisted file: its valid units, the newest of each key.
    fn rebuild(&self, len: u64) -> io::Result<Vec<Restored>> {
        let mut inner = lock(&self.inner);
        let extents = len.saturating_sub(SUPER_BYTES).div_ceil(EXTENT_BYTES) as u32;
        inner.extents_next = extents;
        let mut found: HashMap<(SessionId, u64), (u64, Restored)> = HashMap::new();
        let mut stale = Vec::new();
        let mut buf = Vec::new();
        let mut seq_max = 0;
        for e in 0..extents {
            let start = extent_at(e);
            let n = EXTENT_BYTES.min(len - start) as usize;
            buf.resize(n, 0);
            self.file.read_exact_at(&mut buf, start)?;
            let Some((unit_len, slots)) = parse_extent_header(&buf) else {
                inner.extents_spare.push(e);
                continue;
            };
            let zone = inner.zones.entry(unit_len).or_default();
            for i in 0..slots {
                let off = EXTENT_HEADER_BYTES + i as u64 * stride(unit_len);
                let at = SlotAt(start + off);
                let off = off as usize;
                let whole = off + stride(unit_len) as usize <= n;
                let header = whole
                    .then(|| SlotHeader::decode(&buf[off..off + 64]))
                    .flatten()
                    .filter(|h| {
                        h.unit_len == unit_len
                            && xxh3_64(&buf[off + 64..off + 64 + unit_len as usize]) == h.data_sum
                    });
                let Some(h) = header else {
                    zone.free.push(at);
                    continue;
                };
                seq_max = seq_max.max(h.seq);
                if h.flags & SLOT_SNAPSHOT != 0 {
                    stale.push((at, unit_len));
                    continue;
                }
                let r = Restored {
                    session: h.session,
                    key: h.key,
                    unit_len,
                    at,
                };
                match found.insert((h.session, h.key), (h.seq, r)) {
                    Some((seq, older)) if seq > h.seq => {
                        stale.push((at, unit_len));
                        found.insert((h.session, h.key), (seq, older));
                    }
                    Some((_, older)) => stale.push((older.at, older.unit_len)),
                    None => {}
                }
            }
        }
        self.seq.store(seq_max + 1, Ordering::Relaxed);
        drop(inner);
        for (at, unit_len) in stale {
            self.free(at, unit_len);
        }
        let mut v: Vec<Restored> = found.into_values().map(|(_, r)| r).collect();
        v.sort_by_key(|r| r.at);
        Ok(v)
    }

    /// A slot for a unit of `unit_len` bytes (a new extent when none is free).
    fn take(&self, unit_len: u32) -> io::Result<SlotAt> {
        let mut inner = lock(&self.inner);
        let zone = inner.zones.entry(unit_len).or_default();
        if let Some(at) = zone.free.pop() {
            return Ok(at);
        }
        let slots = slots_per_extent(unit_len);
        if let Some((e, next)) = zone.filling {
            if next < slots {
                zone.filling = Some((e, next + 1));
                return Ok(SlotAt(
                    extent_at(e) + EXTENT_HEADER_BYTES + next as u64 * stride(unit_len),
                ));
            }
        }
        let e = match inner.extents_spare.pop() {
            Some(e) => e,
            None => {
                let e = inner.extents_next;
                inner.extents_next = e.checked_add(1).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::StorageFull, "2^32 extents in use")
                })?;
                e
            }
        };
        let header = extent_header(unit_len, slots);
        if let Err(err) = self.file.write_all_at(&header, extent_at(e)) {
            inner.extents_spare.push(e);
            return Err(err);
        }
        let zone = inner.zones.get_mut(&unit_len).expect("made above");
        zone.filling = Some((e, 1));
        Ok(SlotAt(extent_at(e) + EXTENT_HEADER_BYTES))
    }

    fn give_back(&self, at: SlotAt, unit_len: u32) {
        let mut inner = lock(&self.inner);
        inner.cache.remove(at);
        inner.zones.entry(unit_len).or_default().free.push(at);
    }

    fn put(&self, at: SlotAt, owner: SlotOwner, data: &[u8]) -> io::Result<()> {
        #[cfg(test)]
        if self.fail_writes.load(Ordering::Relaxed) {
            return Err(io::Error::from(io::ErrorKind::StorageFull));
        }
        let mut buf = vec![0u8; SLOT_HEADER_BYTES as usize + data.len()];
        SlotHeader {
            unit_len: data.len() as u32,
            session: owner.session,
            key: owner.key,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            flags: if owner.snapshot { SLOT_SNAPSHOT } else { 0 },
            data_sum: xxh3_64(data),
        }
        .encode(&mut buf[..SLOT_HEADER_BYTES as usize]);
        rmem_copy::copy(&mut buf[SLOT_HEADER_BYTES as usize..], data);
        self.file.write_all_at(&buf, at.0)?;
        lock(&self.inner).cache.put(at, data);
        Ok(())
    }

    /// Write `data` (one unit) to a new slot for `owner`.
    pub fn write_new(&self, owner: SlotOwner, data: &[u8]) -> io::Result<SlotAt> {
        let unit_len = data.len() as u32;
        let at = self.take(unit_len)?;
        if let Err(e) = self.put(at, owner, data) {
            // What the failed write left there is not a valid unit (or an old one nobody
            // names): the slot is reused as free.
            self.give_back(at, unit_len);
            return Err(e);
        }
        Ok(at)
    }

    /// Replace the unit in slot `at` with `data`; the slot that holds it now (a new one when
    /// persisting: the old is cleared only after the new is written). On an error the old
    /// unit is gone (scratch) or intact (persist); either way the caller drops it.
    pub fn overwrite(&self, at: SlotAt, owner: SlotOwner, data: &[u8]) -> io::Result<SlotAt> {
        if !self.persist {
            if let Err(e) = self.put(at, owner, data) {
                lock(&self.inner).cache.remove(at);
                return Err(e);
            }
            return Ok(at);
        }
        let new = self.write_new(owner, data)?;
        self.free(at, data.len() as u32);
        Ok(new)
    }

    /// Append the unit of slot `at` (`unit_len` bytes) to `out`, checked against its
    /// checksums; `out` is as it was on an error.
    pub fn read(&self, at: SlotAt, unit_len: u32, out: &mut Vec<u8>) -> io::Result<()> {
        if lock(&self.inner).cache.get(at, out) {
            return Ok(());
        }
        let start = out.len();
        out.resize(start + stride(unit_len) as usize, 0);
        let checked = self
            .file
            .read_exact_at(&mut out[start..], at.0)
            .and_then(|()| {
                let h = SlotHeader::decode(&out[start..start + 64]);
                let data = &out[start + 64..];
                match h {
                    Some(h) if h.unit_len == unit_len && h.data_sum == xxh3_64(data) => Ok(()),
                    _ => Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the unit at offset {} of {} fails its checksum",
                            at.0,
                            self.path.display()
                        ),
                    )),
                }
            });
        if let Err(e) = checked {
            out.truncate(start);
            return Err(e);
        }
        out.drain(start..start + 64);
        lock(&self.inner).cache.put(at, &out[start..]);
        Ok(())
    }

    /// The slot `at` holds nothing from now on; a persisted store clears its header so that a
    /// reopen does not find the unit again.
    pub fn free(&self, at: SlotAt, unit_len: u32) {
        if self.persist {
            if let Err(e) = self.file.write_all_at(&[0u8; 64], at.0) {
                log::warn!(
                    "{}: cannot clear the freed slot at offset {}: {e} (a restart may find its old unit again)",
                    self.path.display(),
                    at.0
                );
            }
        }
        self.give_back(at, unit_len);
    }

    /// Bytes of units in the RAM cache.
    pub fn cached_bytes(&self) -> u64 {
        lock(&self.inner).cache.used_bytes
    }

    /// Flush the file to the disk (a persisted server that stops).
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh directory under the temporary directory, removed when dropped unless the test is
    /// failing (then kept for the post-mortem).
    pub(crate) struct Dir(PathBuf);

    impl std::ops::Deref for Dir {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    pub(crate) fn dir() -> Dir {
        let d = std::env::temp_dir().join(format!(
            "rmem-disk-test-{}-{:x}",
            std::process::id(),
            rand_u64()
        ));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn rand_u64() -> u64 {
        use std::hash::{BuildHasher, RandomState};
        RandomState::new().hash_one(std::time::Instant::now())
    }

    fn owner(session: u128, key: u64) -> SlotOwner {
        SlotOwner {
            session: SessionId(session),
            key,
            snapshot: false,
        }
    }

    fn unit(len: usize, v: u64) -> Vec<u8> {
        (0..len).map(|i| (v as usize * 131 + i) as u8).collect()
    }

    fn read(s: &DiskStore, at: SlotAt, len: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![7u8; 3];
        s.read(at, len as u32, &mut out)?;
        assert_eq!(&out[..3], &[7, 7, 7], "appended after what was there");
        Ok(out.split_off(3))
    }

    #[test]
    fn units_round_trip_overwrite_and_free_through_a_small_cache() {
        let d = dir();
        let path = d.join("store");
        // A cache of 3 units: most reads go to the file.
        let (s, restored) = DiskStore::open(&path, false, 3 * 4096).unwrap();
        assert!(restored.is_empty());
        assert!(!path.exists(), "scratch: unlinked once open");
        let n = 5000u64; // more than one extent of 4 KiB units
        let ats: Vec<SlotAt> = (0..n)
            .map(|k| s.write_new(owner(1, k), &unit(4096, k)).unwrap())
            .collect();
        assert!(s.cached_bytes() <= 3 * 4096);
        // Another unit size in its own extent.
        let small = s.write_new(owner(1, 1 << 40), &unit(72, 9)).unwrap();
        for k in (0..n).rev() {
            assert_eq!(read(&s, ats[k as usize], 4096).unwrap(), unit(4096, k));
        }
        assert_eq!(read(&s, small, 72).unwrap(), unit(72, 9));
        // Overwrite in place (scratch) and free; a freed slot is reused first.
        let at = s.overwrite(ats[3], owner(1, 3), &unit(4096, 333)).unwrap();
        assert_eq!(at, ats[3]);
        assert_eq!(read(&s, at, 4096).unwrap(), unit(4096, 333));
        s.free(ats[10], 4096);
        assert_eq!(s.write_new(owner(1, 99), &unit(4096, 99)).unwrap(), ats[10]);
        // A corrupted unit is an error, never data.
        let mut byte = [0u8; 1];
        s.file.read_exact_at(&mut byte, ats[20].0 + 100).unwrap();
        s.file
            .write_all_at(&[byte[0] ^ 1], ats[20].0 + 100)
            .unwrap();
        lock(&s.inner).cache.remove(ats[20]);
        let e = read(&s, ats[20], 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        drop(s);
    }

    #[test]
    fn a_persisted_store_reopens_with_the_newest_unit_of_each_key_and_ignores_torn_slots() {
        let d = dir();
        let path = d.join("store");
        let (s, _) = DiskStore::open(&path, true, 1 << 20).unwrap();
        let a: Vec<SlotAt> = (0..100)
            .map(|k| s.write_new(owner(1, k), &unit(4096, k)).unwrap())
            .collect();
        let b = s.write_new(owner(2, 0), &unit(4104, 50)).unwrap();
        // Copy-on-write: a new slot, the old one cleared.
        let a5 = s.overwrite(a[5], owner(1, 5), &unit(4096, 555)).unwrap();
        assert_ne!(a5, a[5]);
        s.free(a[6], 4096);
        // A snapshot's unit is not restored.
        let snap = SlotOwner {
            snapshot: true,
            ..owner(3, 0)
        };
        s.write_new(snap, &unit(4096, 3)).unwrap();
        // A crash between the new slot and the clearing of the old: both are there.
        let a7 = s.write_new(owner(1, 7), &unit(4096, 777)).unwrap();
        // A torn write: key 8's new unit half written over a fresh slot.
        let torn = s.write_new(owner(1, 8), &unit(4096, 888)).unwrap();
        s.file
            .write_all_at(&[0u8; 2048], torn.0 + 64 + 2048)
            .unwrap();
        // And key 9's only unit torn: it is dropped, not returned wrong.
        s.file.write_all_at(&[1u8; 10], a[9].0 + 64).unwrap();
        s.sync().unwrap();
        assert!(
            DiskStore::open(&path, true, 0).is_err(),
            "a second server is refused"
        );
        drop(s);
        let (s, restored) = DiskStore::open(&path, true, 1 << 20).unwrap();
        let by_key: HashMap<(u128, u64), Restored> = restored
            .iter()
            .map(|r| ((r.session.0, r.key), *r))
            .collect();
        assert_eq!(restored.len(), 100 - 2 + 1, "keys 6 and 9 are gone");
        assert!(!by_key.contains_key(&(1, 6)) && !by_key.contains_key(&(1, 9)));
        assert!(!by_key.keys().any(|k| k.0 == 3), "no snapshot unit");
        let get = |sess, key| {
            let r = by_key[&(sess, key)];
            read(&s, r.at, r.unit_len as usize).unwrap()
        };
        assert_eq!(get(1, 5), unit(4096, 555));
        assert_eq!(get(1, 7), unit(4096, 777));
        assert_eq!(by_key[&(1, 7)].at, a7);
        assert_eq!(
            get(1, 8),
            unit(4096, 8),
            "the torn newer unit lost to the old"
        );
        assert_eq!(get(2, 0), unit(4104, 50));
        assert_eq!(by_key[&(2, 0)].at, b);
        for k in (0..100).filter(|k| ![5, 6, 7, 8, 9].contains(k)) {
            assert_eq!(get(1, k), unit(4096, k), "key {k}");
        }
        // New writes go on after the restored ones with higher sequence numbers.
        let again = s.overwrite(by_key[&(1, 5)].at, owner(1, 5), &unit(4096, 5555));
        again.unwrap();
        drop(s);
        let (s, restored) = DiskStore::open(&path, true, 0).unwrap();
        let r = restored
            .iter()
            .find(|r| r.session.0 == 1 && r.key == 5)
            .unwrap();
        assert_eq!(read(&s, r.at, 4096).unwrap(), unit(4096, 5555));
        assert_eq!(restored.len(), 99);
        drop(s);
    }

    #[test]
    fn a_path_that_cannot_be_created_or_is_foreign_says_so() {
        let d = dir();
        let e = DiskStore::open(&d.join("no/such/dir/store"), false, 0).unwrap_err();
        assert!(matches!(e, OpenError::Open { .. }), "{e}");
        let foreign = d.join("notes.txt");
        std::fs::write(&foreign, b"precious").unwrap();
        let e = DiskStore::open(&foreign, false, 0).unwrap_err();
        assert!(matches!(e, OpenError::Foreign { .. }), "{e}");
        assert_eq!(std::fs::read(&foreign).unwrap(), b"precious");
    }
}
