//! A server that returns altered, stale and swapped pages (a proxy in front of a real server
//! that rewrites its answers): with redundancy every lie is caught by the page's seal, the
//! page is served from the other pieces, and the lies are counted. Also servers that go
//! silent or hang (write-backs released and stored short past them; a buried server, and one
//! a pool's manager offers, dialled without holding the store). Real servers, in-process;
//! every wait is bounded.

mod common;
use rmem_client::config::Placement;
use rmem_client::store::cluster::Layout;
use rmem_client::store::codec::Redundancy;
use rmem_client::store::remote::{RemoteStore, Timing};
use rmem_client::store::{Completion, PageStore};
use rmem_client::PageIndex;
use rmem_proto::{parse_header, Op, PageKey, Request, Response, HEADER_LEN};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const PS: usize = 4096;
const TOKEN: &[u8] = b"lying-server-token";

fn server() -> String {
    common::server(TOKEN, 64 << 20)
}

/// A proxy to `real` that lies in every read answer it passes: in turn it flips a byte, sends
/// the first copy it ever saw of that key (stale), or another key's data under this key
/// (swapped). Returns its address and the count of lies told.
fn liar(real: String) -> (String, Arc<AtomicU64>) {
    proxy(real, Mode::Lie)
}

/// What a proxy does to the read answers it passes.
#[derive(Clone, Copy)]
enum Mode {
    /// Lies in every one.
    Lie,
    /// Passes them on truthfully after a delay.
    Slow(Duration),
    /// Passes them on, but the first under the tag of a request sent later: a bad frame.
    WrongTagOnce,
    /// Holds the first write answer this long, and with it everything after it: a server
    /// that hangs for a while, then goes on.
    StallWrites(Duration),
    /// The same with the first answer to a byte-range read (a piece read alone).
    StallRanges(Duration),
    /// Passes on every answer to a byte-range read after this delay: a server that answers,
    /// but late.
    SlowRanges(Duration),
    /// The same with every answer to a byte-range read or a write.
    Late(Duration),
    /// Answers every byte-range write as done without writing it (each is passed on as a
    /// read of that range, whose answer comes back as the write's): a server whose copy
    /// misses the pieces written alone over it, in order with everything else.
    SkipRanges,
}

/// A proxy to `real` that treats read answers as `mode` says. A slow honest one makes a
/// fragment read (K of K+1 suffice) decode from the liar's piece rather than always from the
/// two honest ones, however the machine is loaded.
fn proxy(real: String, mode: Mode) -> (String, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let lies = Arc::new(AtomicU64::new(0));
    let told = lies.clone();
    std::thread::spawn(move || {
        for client in l.incoming() {
            let Ok(mut client) = client else { return };
            let mut up = TcpStream::connect(&real).unwrap();
            // As the real ends do: a small answer held back by Nagle's algorithm waits for
            // the client's delayed ack (40 ms), and a read that late is hedged elsewhere.
            client.set_nodelay(true).unwrap();
            up.set_nodelay(true).unwrap();
            let (mut c2, mut u2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
            let skipped: Arc<Mutex<HashSet<u64>>> = Arc::default();
            let skipping = skipped.clone();
            std::thread::spawn(move || {
                if matches!(mode, Mode::SkipRanges) {
                    skip_ranges(&mut c2, &mut u2, &skipping);
                } else {
                    let _ = std::io::copy(&mut c2, &mut u2);
                }
                let _ = u2.shutdown(std::net::Shutdown::Both);
            });
            let told = told.clone();
            std::thread::spawn(move || {
                let mut first: HashMap<u64, Vec<u8>> = HashMap::new();
                let mut last: Option<(u64, Vec<u8>)> = None;
                let mut n = 0u64;
                let mut hdr = [0u8; HEADER_LEN];
                let mut body = Vec::new();
                let mut out = Vec::new();
                loop {
                    if up.read_exact(&mut hdr).is_err() {
                        break;
                    }
                    let h = parse_header(&hdr, u32::MAX).unwrap().unwrap();
                    body.resize(h.len as usize, 0);
                    if up.read_exact(&mut body).is_err() {
                        break;
                    }
                    out.clear();
                    match (mode, h.op, Response::decode(h.op, &body)) {
                        (Mode::Slow(delay), Op::ReadOk, Ok(Response::ReadOk { .. }))
                        | (Mode::SlowRanges(delay), Op::ReadRangeOk, _)
                        | (Mode::Late(delay), Op::ReadRangeOk | Op::WriteOk, _) => {
                            std::thread::sleep(delay);
                            out.extend_from_slice(&hdr);
                            out.extend_from_slice(&body);
                        }
                        (Mode::StallWrites(stall), Op::WriteOk, _)
                        | (Mode::StallRanges(stall), Op::ReadRangeOk, _)
                            if n == 0 =>
                        {
                            n += 1;
                            told.fetch_add(1, Relaxed);
                            std::thread::sleep(stall);
                            out.extend_from_slice(&hdr);
                            out.extend_from_slice(&body);
                        }
                        (
                            Mode::SkipRanges,
                            Op::ReadRangeOk,
                            Ok(Response::ReadRangeOk { key, offset, data }),
                        ) if skipped.lock().unwrap().remove(&h.tag) => {
                            told.fetch_add(1, Relaxed);
                            let len = data.len() as u32;
                            Response::WriteRangeOk { key, offset, len }.encode(h.tag, &mut out);
                        }
                        (Mode::WrongTagOnce, Op::ReadOk, Ok(r @ Response::ReadOk { .. })) => {
                            n += 1;
                            let tag = if n == 1 { h.tag + 1 } else { h.tag };
                            told.fetch_add(u64::from(n == 1), Relaxed);
                            r.encode(tag, &mut out);
                        }
                        (
                            Mode::Lie,
                            Op::ReadRangeOk,
                            Ok(Response::ReadRangeOk { key, offset, data }),
                        ) => {
                            // A piece read alone: altered, or another piece's bytes.
                            n += 1;
                            let lie = lie(n, key.0, data, None, &mut last);
                            told.fetch_add(1, Relaxed);
                            let data = &lie;
                            Response::ReadRangeOk { key, offset, data }.encode(h.tag, &mut out);
                        }
                        (Mode::Lie, Op::ReadOk, Ok(Response::ReadOk { key, count, data })) => {
                            let orig = first.entry(key.0).or_insert_with(|| data.to_vec());
                            n += 1;
                            let lie = lie(n, key.0, data, Some(orig), &mut last);
                            told.fetch_add(1, Relaxed);
                            let data = &lie;
                            Response::ReadOk { key, count, data }.encode(h.tag, &mut out);
                        }
                        _ => {
                            out.extend_from_slice(&hdr);
                            out.extend_from_slice(&body);
                        }
                    }
                    if client.write_all(&out).is_err() {
                        break;
                    }
                }
                let _ = client.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    (addr, lies)
}

/// Pass the client's requests from `client` to `up`, each byte-range write as a read of that
/// range (its tag put in `skipped`, for the answer to be told as the write's).
fn skip_ranges(client: &mut TcpStream, up: &mut TcpStream, skipped: &Mutex<HashSet<u64>>) {
    let mut hdr = [0u8; HEADER_LEN];
    let (mut body, mut out) = (Vec::new(), Vec::new());
    loop {
        if client.read_exact(&mut hdr).is_err() {
            return;
        }
        let h = parse_header(&hdr, u32::MAX).unwrap().unwrap();
        body.resize(h.len as usize, 0);
        if client.read_exact(&mut body).is_err() {
            return;
        }
        out.clear();
        match (h.op, Request::decode(h.op, &body)) {
            (Op::WriteRange, Ok(Request::WriteRange { key, offset, data })) => {
                skipped.lock().unwrap().insert(h.tag);
                let len = data.len() as u32;
                Request::ReadRange {
                    key: PageKey(key.0),
                    offset,
                    len,
                }
                .encode(h.tag, &mut out);
            }
            _ => {
                out.extend_from_slice(&hdr);
                out.extend_from_slice(&body);
            }
        }
        if up.write_all(&out).is_err() {
            return;
        }
    }
}

/// The `n`th lie a liar tells about `data`, key `key`'s: in turn the first copy it saw of
/// that key (`orig`, if it differs), the last answer's data under another key, or a flipped
/// byte. `last` becomes this answer.
fn lie(
    n: u64,
    key: u64,
    data: &[u8],
    orig: Option<&Vec<u8>>,
    last: &mut Option<(u64, Vec<u8>)>,
) -> Vec<u8> {
    let mut lie = data.to_vec();
    match (n % 3, orig) {
        (1, Some(orig)) if *orig != data => lie.clone_from(orig),
        (2, _) => match &*last {
            Some((k, d)) if *k != key && d.len() == lie.len() => lie.clone_from(d),
            _ => lie[7] ^= 0x40,
        },
        _ => lie[7] ^= 0x40,
    }
    *last = Some((key, data.to_vec()));
    lie
}

fn page(n: u64, round: u64) -> Vec<u8> {
    sized(n, round, PS)
}

/// Page `n` as round `round` writes it, `ps` bytes (no two 4 KiB pieces alike).
fn sized(n: u64, round: u64, ps: usize) -> Vec<u8> {
    (0..ps)
        .map(|i| (n as usize * 7 + i / 8 + round as usize * 13 + i / 4096 * 101) as u8)
        .collect()
}

/// A store over `servers` in this order (priority placement), every timeout 5 s.
fn store_on(servers: &[String], redundancy: &str, encrypt: bool) -> RemoteStore {
    store_sized(servers, redundancy, encrypt, PS)
}

/// As [`store_on`], with pages of `ps` bytes.
fn store_sized(servers: &[String], redundancy: &str, encrypt: bool, ps: usize) -> RemoteStore {
    let t = Duration::from_secs(5);
    let timing = Timing {
        connect: t,
        request: t,
        heartbeat: t,
        reconnect: t,
    };
    let layout = Layout {
        placement: Placement::Priority,
        redundancy: Redundancy::parse(redundancy).unwrap(),
        encrypt,
    };
    RemoteStore::connect_with(servers, TOKEN, ps, layout, timing).unwrap()
}

/// A store over `first` and two more servers (priority placement) that gives a lost server up
/// after 300 ms of tries (its link's other timeouts 1 s and 5 s).
fn store_burying(first: &str, redundancy: &str, encrypt: bool, ps: usize) -> RemoteStore {
    let timing = Timing {
        connect: Duration::from_secs(1),
        request: Duration::from_secs(5),
        heartbeat: Duration::from_secs(5),
        reconnect: Duration::from_millis(300),
    };
    let layout = Layout {
        placement: Placement::Priority,
        redundancy: Redundancy::parse(redundancy).unwrap(),
        encrypt,
    };
    let servers = [first.to_string(), server(), server()];
    RemoteStore::connect_with(&servers, TOKEN, ps, layout, timing).unwrap()
}

/// Store pages `0..pages` as `round` writes them, and wait until every one is stored.
fn store_all(s: &mut RemoteStore, pages: u64, round: u64) {
    store_all_sized(s, pages, round, PS)
}

/// As [`store_all`], with pages of `ps` bytes.
fn store_all_sized(s: &mut RemoteStore, pages: u64, round: u64, ps: usize) {
    store_all_sized_from(s, 0..pages, round, ps)
}

/// As [`store_all_sized`], pages `range`.
fn store_all_sized_from(s: &mut RemoteStore, range: std::ops::Range<u64>, round: u64, ps: usize) {
    let pages = range.end - range.start;
    for p in range {
        s.store(PageIndex(p), &sized(p, round, ps)).unwrap();
    }
    s.flush().unwrap();
    let (mut stored, deadline) = (0, Instant::now() + Duration::from_secs(10));
    while stored < pages {
        assert!(Instant::now() < deadline, "{stored} of {pages} stored");
        s.poll(&mut |c| stored += u64::from(matches!(c, Completion::Stored { .. })))
            .unwrap();
    }
}

/// Poll and tick `s` every few milliseconds until `done` holds (10 s at most); `what` names
/// what was awaited when it does not come, or when the store fails meanwhile.
fn pump_until(s: &mut RemoteStore, what: &str, mut done: impl FnMut(&RemoteStore) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(s) {
        assert!(Instant::now() < deadline, "never came: {what}");
        s.poll(&mut |_| {})
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        s.tick(Instant::now())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Store pages `0..pages` `rounds` times over (round r's contents `page(p, r)`) without
/// waiting, then poll until every write-back is told stored (10 s at most): how long it took.
fn store_rounds(s: &mut RemoteStore, pages: u64, rounds: u64, what: &str) -> Duration {
    let t = Instant::now();
    for round in 0..rounds {
        for p in 0..pages {
            s.store(PageIndex(p), &page(p, round)).unwrap();
        }
    }
    s.flush().unwrap();
    let (mut stored, deadline) = (0, Instant::now() + Duration::from_secs(10));
    while stored < rounds * pages {
        assert!(Instant::now() < deadline, "{what}: {stored} stored");
        s.poll(&mut |c| stored += u64::from(matches!(c, Completion::Stored { .. })))
            .unwrap();
        s.tick(Instant::now()).unwrap();
    }
    t.elapsed()
}

/// For 4.5 s (two tries or more at a hung host every 2 s), tick the store and write pages
/// `0..16` again each round from `round` on: each tick must take under 100 ms (`while_what`
/// names the hang in the failure). The next round, not done.
fn ticks_stay_short(s: &mut RemoteStore, mut round: u64, while_what: &str) -> u64 {
    let (start, mut longest) = (Instant::now(), Duration::ZERO);
    while start.elapsed() < Duration::from_millis(4500) {
        let t = Instant::now();
        s.tick(t).unwrap();
        longest = longest.max(t.elapsed());
        store_all(s, 16, round);
        round += 1;
    }
    assert!(
        longest < Duration::from_millis(100),
        "a tick took {longest:?} while {while_what}"
    );
    round
}

/// Store fresh pages from 1000 on (round 0), driving the store, until `server` holds some (10 s
/// at most, else fail saying `what`): the pages stored.
fn store_until_on(s: &mut RemoteStore, server: &str, what: &str) -> std::ops::Range<u64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let on_it = |s: &RemoteStore| {
        s.used_per_server()
            .iter()
            .find(|(name, _)| name == server)
            .map_or(0, |&(_, bytes)| bytes)
    };
    let mut fresh = 1000;
    while on_it(s) == 0 {
        assert!(Instant::now() < deadline, "{what}");
        s.store(PageIndex(fresh), &page(fresh, 0)).unwrap();
        fresh += 1;
        s.flush().unwrap();
        for _ in 0..10 {
            s.poll(&mut |_| {}).unwrap();
            s.tick(Instant::now()).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    1000..fresh
}

/// Page `p` read back, or the error that ended the read.
fn fetch_one(s: &mut RemoteStore, p: u64) -> Result<Vec<u8>, String> {
    s.fetch(PageIndex(p)).map_err(|e| e.to_string())?;
    fetched(s, p)
}

/// Every page of `0..pages` reads back whole as `round` wrote it (`ps` bytes).
fn reads_back(s: &mut RemoteStore, pages: u64, round: u64, ps: usize, what: &str) {
    for p in 0..pages {
        assert!(
            fetch_one(s, p).unwrap() == sized(p, round, ps),
            "{what}: page {p} read back wrong"
        );
    }
}

/// What the fetch of page `p` under way brings, or the error that ended it.
fn fetched(s: &mut RemoteStore, p: u64) -> Result<Vec<u8>, String> {
    let mut got = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.is_none() {
        assert!(
            Instant::now() < deadline,
            "page {p} never came; {}",
            s.describe_in_flight()
        );
        s.poll(&mut |c| {
            if let Completion::Fetched { page, data } = c {
                got = Some((page.0, data.to_vec()));
            }
        })
        .map_err(|e| e.to_string())?;
        s.tick(Instant::now()).map_err(|e| e.to_string())?;
    }
    let (gp, data) = got.unwrap();
    assert_eq!(gp, p);
    Ok(data)
}

/// 4 KiB piece `i` of page `p` read alone, or the error that ended the read.
fn fetch_piece(s: &mut RemoteStore, p: u64, i: u32) -> Result<Vec<u8>, String> {
    s.fetch_part(PageIndex(p), i * 4096, 4096)
        .map_err(|e| e.to_string())?;
    s.flush().map_err(|e| e.to_string())?;
    fetched(s, p)
}

/// Pages of 64 KiB under a seal are sealed by the 4 KiB piece, and a piece is read alone
/// (a sub-page fetch): from one copy, or from its one data fragment. A liar among the
/// servers alters or swaps the pieces it sends: each lie fails the piece's seal, and the
/// piece comes from another copy, or (its fragment being the liar's) from the page read whole
/// from the others; every piece read is right, and the lies are counted.
#[test]
fn a_piece_read_alone_is_checked_and_a_lie_served_from_other_pieces() {
    const BIG: usize = 65536;
    for (redundancy, encrypt) in [
        ("replicas:2", false),
        ("replicas:3", true),
        ("ec:2+1", false),
        ("ec:2+1", true),
    ] {
        let (lying, lies) = liar(server());
        eprintln!("{redundancy} encrypt={encrypt}");
        let mut s = store_sized(&[lying, server(), server()], redundancy, encrypt, BIG);
        assert!(s.part_reads(), "{redundancy}: pieces read alone");
        assert!(!s.part_writes(), "{redundancy}: pieces written alone");
        let counters = s.counters().unwrap();
        let pages = 6u64;
        store_all_sized(&mut s, pages, 1, BIG);
        for p in 0..pages {
            let want = sized(p, 1, BIG);
            for i in 0..16u32 {
                let got = fetch_piece(&mut s, p, i).unwrap();
                let at = i as usize * 4096;
                assert!(
                    got == want[at..at + 4096],
                    "{redundancy} encrypt={encrypt}: page {p} piece {i} wrong"
                );
            }
            assert!(
                fetch_one(&mut s, p).unwrap() == want,
                "{redundancy} encrypt={encrypt}: page {p} read whole"
            );
        }
        let (told, caught) = (lies.load(Relaxed), counters.pieces_bad.load(Relaxed));
        assert!(told >= 10, "{redundancy}: only {told} lies told");
        assert!(
            caught >= 10 && caught <= told,
            "{redundancy} encrypt={encrypt}: {told} lies told, {caught} caught, {} hedged",
            counters.reads_hedged.load(Relaxed)
        );
    }
}

/// Store `pieces` of `data` over page `p`'s copies, alone, and wait until it is stored.
fn store_pieces(s: &mut RemoteStore, p: u64, data: &[u8], pieces: u64) {
    assert!(
        s.piece_writes(PageIndex(p), pieces),
        "page {p}: pieces not written alone"
    );
    s.store_parts(PageIndex(p), data, pieces).unwrap();
    s.flush().unwrap();
    let (mut stored, deadline) = (false, Instant::now() + Duration::from_secs(10));
    while !stored {
        assert!(
            Instant::now() < deadline,
            "page {p}'s pieces {pieces:#x} never stored"
        );
        s.poll(&mut |c| stored |= matches!(c, Completion::Stored { page } if page.0 == p))
            .unwrap();
        s.tick(Instant::now()).unwrap();
    }
}

/// Pages sealed by the piece take their written pieces alone, each sealed with the page's next
/// version, the other cells keeping theirs: over each copy (`none` encrypted, `replicas:N`), or
/// under `ec:K+M` as a patch of the data fragments' cells and the parity's at their offsets. One server answers those writes as done without making them (its copy keeps
/// the old cells): every read, whole or by the piece, is the newest, the stale cells failing
/// their seals and served from another copy, and counted. A whole write afterwards stands for
/// every cell again.
#[test]
fn pieces_written_alone_read_back_newest_and_a_copy_that_missed_them_is_caught() {
    const BIG: usize = 65536;
    for (redundancy, encrypt) in [
        ("none", true),
        ("replicas:2", false),
        ("replicas:2", true),
        ("replicas:3", true),
        ("ec:2+1", false),
        ("ec:2+1", true),
        ("ec:4+1", true),
        ("ec:4+2", false),
    ] {
        eprintln!("{redundancy} encrypt={encrypt}");
        let (skipping, skipped) = proxy(server(), Mode::SkipRanges);
        let width = Redundancy::parse(redundancy).unwrap().width();
        let servers = if redundancy == "none" {
            vec![server()]
        } else {
            std::iter::once(skipping)
                .chain((0..width).map(|_| server()))
                .collect()
        };
        let mut s = store_sized(&servers, redundancy, encrypt, BIG);
        assert!(!s.part_writes(), "{redundancy}: byte ranges written alone");
        let counters = s.counters().unwrap();
        let pages = 6u64;
        store_all_sized(&mut s, pages, 1, BIG);
        let mut want: Vec<Vec<u8>> = (0..pages).map(|p| sized(p, 1, BIG)).collect();
        // Two rounds of pieces, overlapping: cells of three versions in one page.
        for (round, base) in [(2u64, 0b0000_0110_0010_0001u64), (3, 0b1000_0000_0110_0000)] {
            for (p, want) in want.iter_mut().enumerate() {
                let pieces = base.rotate_left(p as u32) & 0xffff;
                let data = sized(p as u64, round, BIG);
                store_pieces(&mut s, p as u64, &data, pieces);
                for i in (0..16).filter(|i| pieces & (1 << i) != 0) {
                    want[i * 4096..(i + 1) * 4096].copy_from_slice(&data[i * 4096..(i + 1) * 4096]);
                }
            }
        }
        for (p, want) in want.iter().enumerate() {
            let p = p as u64;
            for i in 0..16u32 {
                let got = fetch_piece(&mut s, p, i).unwrap();
                let at = i as usize * 4096;
                assert!(
                    got == want[at..at + 4096],
                    "{redundancy} encrypt={encrypt}: page {p} piece {i} wrong"
                );
            }
            assert!(
                fetch_one(&mut s, p).unwrap() == *want,
                "{redundancy} encrypt={encrypt}: page {p} read whole wrong"
            );
        }
        let (told, caught) = (skipped.load(Relaxed), counters.pieces_bad.load(Relaxed));
        if redundancy == "none" {
            assert_eq!(caught, 0, "one honest copy");
        } else {
            // With priority placement the skipping server holds every page's first copy
            // (asked first), or its first data fragment. Under erasure coding a patch over a
            // fragment that missed the last one finds its old cells failing their seals and
            // writes the page whole instead (the skipper then has it all again).
            // (Its fragment holds a K-th of the pieces: not every page's pieces touch it.)
            let least = if redundancy.starts_with("ec") {
                1
            } else {
                2 * pages
            };
            assert!(
                told >= least,
                "{redundancy}: only {told} runs of pieces skipped"
            );
            if redundancy.starts_with("ec") {
                // Some patched; under ec:2+1 (pieces 0-7 on the skipper) the second round
                // rewrites piece 5 + p for pages p <= 2, whose cell the skipper kept old:
                // its seal fails and the patch goes whole. (Under ec:4+1 and 4+2 no piece
                // the skipper holds is written twice.)
                let patched = counters.patches.load(Relaxed);
                let whole = counters.patches_whole.load(Relaxed);
                let least_whole = u64::from(redundancy.starts_with("ec:2"));
                assert!(
                    patched >= 1 && whole >= least_whole,
                    "{redundancy}: {patched} patches, {whole} made whole"
                );
            }
            assert!(
                caught >= pages,
                "{redundancy} encrypt={encrypt}: {told} writes skipped, {caught} stale reads caught"
            );
        }
        store_all_sized(&mut s, pages, 4, BIG);
        reads_back(
            &mut s,
            pages,
            4,
            BIG,
            &format!("{redundancy} encrypt={encrypt}"),
        );
    }
}

/// Under `ec:2+1` a patch reads every member's cells; one server answers byte-range reads a
/// second late (and everything else at once): each patch waiting on it becomes a whole
/// write-back (the page read from any two), told stored long before that second, and every
/// page reads back newest.
#[test]
fn a_patch_waiting_on_a_late_server_becomes_a_whole_write_back() {
    const BIG: usize = 65536;
    let late = Duration::from_secs(1);
    let (behind, _) = proxy(server(), Mode::SlowRanges(late));
    let mut s = store_sized(&[behind, server(), server()], "ec:2+1", false, BIG);
    let pages = 4u64;
    store_all_sized(&mut s, pages, 1, BIG);
    for p in 0..pages {
        let data = sized(p, 2, BIG);
        // Pieces 1 and 9: a cell of each data fragment, and the parity's at that offset.
        let t = Instant::now();
        store_pieces(&mut s, p, &data, 0b10_0000_0010);
        let took = t.elapsed();
        assert!(took < late / 2, "page {p}'s pieces took {took:?}");
        let whole = s.counters().unwrap().patches_whole.load(Relaxed);
        assert_eq!(whole, p + 1, "page {p}: patches made whole");
        let mut want = sized(p, 1, BIG);
        for i in [1usize, 9] {
            want[i * 4096..(i + 1) * 4096].copy_from_slice(&data[i * 4096..(i + 1) * 4096]);
        }
        assert!(fetch_one(&mut s, p).unwrap() == want, "page {p}");
    }
}

/// A server refuses pieces written alone over its copy when the page must be copied first
/// (shared with a fork child's snapshot) and it has no room: under `replicas:2` that copy is
/// given up and rebuilt elsewhere from the other, the write finishing on the other copy; the
/// page reads back newest, and no error reaches the program.
#[test]
fn pieces_refused_by_a_full_server_under_a_snapshot_leave_its_copy_to_be_rebuilt() {
    const BIG: usize = 65536;
    let pages = 4u64;
    // Room for the pages' copies and no more (a unit of 64 KiB cells is 65792 bytes).
    let full = common::server(TOKEN, pages * 65792);
    let mut s = store_sized(&[full, server(), server()], "replicas:2", false, BIG);
    let counters = s.counters().unwrap();
    store_all_sized(&mut s, pages, 1, BIG);
    let snap = s.snapshot().unwrap();
    let data = sized(0, 2, BIG);
    let pieces = 0b1001u64;
    store_pieces(&mut s, 0, &data, pieces);
    let mut want = sized(0, 1, BIG);
    for i in [0usize, 3] {
        want[i * 4096..(i + 1) * 4096].copy_from_slice(&data[i * 4096..(i + 1) * 4096]);
    }
    pump_until(&mut s, "the refused copy rebuilt", |_| {
        counters.pages_repaired.load(Relaxed) >= 1
    });
    assert!(fetch_one(&mut s, 0).unwrap() == want, "page 0 read whole");
    for i in 0..16u32 {
        let got = fetch_piece(&mut s, 0, i).unwrap();
        assert!(
            got == want[i as usize * 4096..(i as usize + 1) * 4096],
            "piece {i}"
        );
    }
    s.end_snapshot(snap).unwrap();
}

/// A store of `redundancy` on three servers of 64 KiB pages, the first behind a proxy in
/// `mode`, with 4 pages stored; then every 4 KiB piece read alone, one at a time, checked,
/// each in under `each_under`. The store, the proxy's count, and how long the reads took.
fn read_pieces_past(
    mode: Mode,
    redundancy: &str,
    encrypt: bool,
    each_under: Duration,
) -> (RemoteStore, Arc<AtomicU64>, Duration) {
    read_pieces_past_beside(mode, server(), redundancy, encrypt, each_under)
}

/// As [`read_pieces_past`], with `third` the third server.
fn read_pieces_past_beside(
    mode: Mode,
    third: String,
    redundancy: &str,
    encrypt: bool,
    each_under: Duration,
) -> (RemoteStore, Arc<AtomicU64>, Duration) {
    const BIG: usize = 65536;
    let (odd, count) = proxy(server(), mode);
    let mut s = store_sized(&[odd, server(), third], redundancy, encrypt, BIG);
    assert!(s.part_reads(), "{redundancy}: pieces read alone");
    let pages = 4u64;
    store_all_sized(&mut s, pages, 1, BIG);
    let started = Instant::now();
    for p in 0..pages {
        let want = sized(p, 1, BIG);
        for i in 0..16u32 {
            let t = Instant::now();
            let got = fetch_piece(&mut s, p, i).unwrap();
            let at = i as usize * 4096;
            assert!(
                got == want[at..at + 4096],
                "{redundancy}: page {p} piece {i}"
            );
            assert!(
                t.elapsed() < each_under,
                "{redundancy}: page {p} piece {i} took {:?}",
                t.elapsed()
            );
        }
    }
    (s, count, started.elapsed())
}

/// A piece read alone waits on one server (its copy, or its data fragment). That server gone
/// silent (a proxy that holds its answers 3 s) does not hold the read: after `HEDGE_AFTER` it
/// is read from the other copies or fragments, and while the server stays silent later
/// pieces are too. (Reads of byte ranges were not looked at by the hedge: under the default
/// `ec:2+1` with 64 KiB pages a hung server held every fault on its fragments until it
/// answered or was given up on, 5 s and more, with nothing said.)
#[test]
fn a_piece_read_alone_from_a_server_gone_silent_is_read_from_the_others() {
    for (redundancy, encrypt) in [("ec:2+1", true), ("replicas:2", false)] {
        let stall = Duration::from_secs(3);
        let (_, stalls, took) = read_pieces_past(
            Mode::StallRanges(stall),
            redundancy,
            encrypt,
            Duration::from_millis(1500),
        );
        assert_eq!(
            stalls.load(Relaxed),
            1,
            "{redundancy}: no piece was asked of the silent server"
        );
        assert!(took < stall, "{redundancy}: the reads took {took:?}");
    }
}

/// A piece read alone from a page a piece short (its third server down since the start, so
/// only K pieces are left) whose data fragment's server goes silent: past the hedge the read
/// becomes one of the page whole, which needs that server's fragment, and the cell read out
/// there cannot give it, so the fragment is asked there too. (The read waited for the cell's
/// answer, dropped it as a cell, and was left with nothing out: "waits for nothing that can
/// finish it", exit 69 in a chaos run with a server killed and restarted empty.)
#[test]
fn a_piece_hedged_on_a_page_a_piece_short_is_read_whole_from_what_is_left() {
    // Nothing listens there: down at the start, the layout goes on without it.
    let down = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let stall = Mode::StallRanges(Duration::from_millis(400));
    let each_under = Duration::from_secs(2);
    let (_, stalls, _) =
        read_pieces_past_beside(stall, down.to_string(), "ec:2+1", true, each_under);
    assert_eq!(stalls.load(Relaxed), 1, "the server never went silent");
}

/// A server that answers every piece read alone 80 ms late is never silent for
/// `HEDGE_AFTER` (100 ms) when read one piece at a time, so it is never slow; yet it held
/// every read of its pieces for those 80 ms (2.7 s for these 64 reads). A read that waits
/// `READ_HEDGE_AFTER` (20 ms) there is asked of the page's other pieces too, and for
/// `LAG_HOLD` (1 s) after, new reads ask that server last: every piece right, the reads
/// hedged counted, and all of them done in well under what the late server's share takes.
#[test]
fn pieces_on_a_server_late_but_never_silent_are_read_from_the_others() {
    for (redundancy, encrypt) in [("ec:2+1", true), ("replicas:2", false)] {
        let late = Mode::SlowRanges(Duration::from_millis(80));
        let (s, _, took) = read_pieces_past(late, redundancy, encrypt, Duration::from_secs(1));
        let hedged = s.counters().unwrap().reads_hedged.load(Relaxed);
        assert!(hedged >= 1, "{redundancy}: no read was hedged");
        assert!(
            took < Duration::from_millis(900),
            "{redundancy}: 64 pieces took {took:?} ({hedged} hedged)"
        );
    }
}

/// A lagging server (a read waited `READ_HEDGE_AFTER` there) holds no write-back: one whose
/// other pieces are stored is told stored (released) while its piece waits there, as on a
/// slow server, where each of these 16 write-backs waited its turn behind the ones before
/// (60 ms each: about 1 s; the server is never silent for `HEDGE_AFTER`). The late pieces
/// still land (the writes settle), and every page reads back as written.
#[test]
fn write_backs_past_a_lagging_server_are_released() {
    const BIG: usize = 65536;
    let late = Mode::Late(Duration::from_millis(60));
    let (mut s, _, _) = read_pieces_past(late, "ec:2+1", true, Duration::from_secs(1));
    let counters = s.counters().unwrap();
    assert!(counters.reads_hedged.load(Relaxed) >= 1, "no read was late");
    let t = Instant::now();
    store_all_sized(&mut s, 16, 2, BIG);
    let took = t.elapsed();
    let released = counters.writes_released.load(Relaxed);
    assert!(
        released >= 8 && took < Duration::from_millis(500),
        "16 write-backs told stored in {took:?}, {released} of them released"
    );
    let mark = s.write_mark();
    pump_until(&mut s, "the late server's pieces", |s| s.settled(mark));
    reads_back(&mut s, 16, 2, BIG, "after the late server's pieces");
}

/// A late server that is lost and comes back is looked at afresh: its new link numbers its
/// requests from 1, and a late-read look kept from the old link (the tag of the newest read
/// seen there) would pass over every read of the new one, which then waited for the slow
/// server's hedge (100 ms; none hedged as late) instead of being asked of the other pieces
/// after 20 ms.
#[test]
fn a_late_server_lost_and_back_has_its_late_reads_hedged_again() {
    const BIG: usize = 65536;
    let late = Duration::from_millis(150);
    let (behind, _) = proxy(server(), Mode::SlowRanges(late));
    let (doomed, kill) = mortal(behind, false);
    let mut s = store_burying(&doomed, "ec:2+1", true, BIG);
    let counters = s.counters().unwrap();
    // Every piece of the pages read alone (the first half of each page is the late server's
    // fragment); the slowest.
    let read_pieces = |s: &mut RemoteStore, pages: std::ops::Range<u64>| {
        let mut slowest = Duration::ZERO;
        for p in pages {
            let want = sized(p, 1, BIG);
            for i in 0..16u32 {
                let t = Instant::now();
                let got = fetch_piece(s, p, i).unwrap();
                slowest = slowest.max(t.elapsed());
                let at = i as usize * 4096;
                assert!(got == want[at..at + 4096], "page {p} piece {i}");
            }
        }
        slowest
    };
    // Written twelve times over first: the late server's link numbers its requests past 100
    // before the reads that are late there.
    for round in [0; 11].into_iter().chain([1]) {
        store_all_sized(&mut s, 8, round, BIG);
    }
    read_pieces(&mut s, 0..8);
    let hedged = counters.reads_hedged.load(Relaxed);
    assert!(hedged >= 1, "no read was hedged before the loss");
    kill.store(true, Relaxed);
    pump_until(&mut s, "the late server lost", |_| {
        counters.servers_lost.load(Relaxed) > 0
    });
    // Back: pages written now are placed on it first (priority placement). Past `LAG_HOLD`
    // since the last hedge, so that it is not still asked last for that.
    kill.store(false, Relaxed);
    std::thread::sleep(Duration::from_millis(1100));
    let on_it = |s: &RemoteStore| {
        s.used_per_server()
            .into_iter()
            .find(|(n, _)| *n == doomed)
            .map_or(0, |(_, b)| b)
    };
    // (What it held before the loss is still counted until it is back.)
    let before = on_it(&s);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut first = 1000;
    loop {
        let now = on_it(&s);
        if now > 0 && now != before {
            break;
        }
        assert!(Instant::now() < deadline, "the server never came back");
        first += 1;
        s.tick(Instant::now()).unwrap();
        store_all_sized_from(&mut s, first..first + 1, 1, BIG);
        std::thread::sleep(Duration::from_millis(20));
    }
    store_all_sized_from(&mut s, first..first + 2, 1, BIG);
    let slowest = read_pieces(&mut s, first..first + 2);
    let again = counters.reads_hedged.load(Relaxed) - hedged;
    assert!(
        again >= 1,
        "after the server came back: no read hedged, the slowest piece {slowest:?}"
    );
}

/// Write `pages` pages, read them back, write them again, read again: every read correct.
fn check(redundancy: &str, encrypt: bool) {
    check_at(redundancy, encrypt, 0);
}

/// [`check_at`] with the honest slow server `slow_ms` slow.
fn check_at(redundancy: &str, encrypt: bool, liar_at: usize) {
    check_slow(redundancy, encrypt, liar_at, 25);
}

/// [`check`] with the liar `liar_at` in the list of servers (with priority placement, the
/// piece it holds: 2 is the parity piece of ec:2+1).
fn check_slow(redundancy: &str, encrypt: bool, liar_at: usize, slow_ms: u64) {
    let (lying, lies) = liar(server());
    let (slow, _) = proxy(server(), Mode::Slow(Duration::from_millis(slow_ms)));
    let mut servers = vec![server(), slow];
    servers.insert(liar_at, lying);
    let mut s = store_on(&servers, redundancy, encrypt);
    let counters = s.counters().unwrap();
    let pages = 60u64;
    for round in 0..2 {
        store_all(&mut s, pages, round);
        for p in 0..pages {
            let data = fetch_one(&mut s, p).unwrap();
            assert!(
                data == page(p, round),
                "{redundancy}: page {p} round {round} wrong"
            );
        }
    }
    let told = lies.load(Relaxed);
    let caught = counters.pieces_bad.load(Relaxed);
    assert!(told > 10, "{redundancy}: only {told} lies told");
    assert!(
        caught > 0 && caught <= told,
        "{redundancy} encrypt={encrypt}: {told} lies told, {caught} caught"
    );
    eprintln!("{redundancy} encrypt={encrypt}: {told} lies told, {caught} caught (the rest were answers not waited for)");
}

#[test]
fn replicas_catch_every_lie_with_a_checksum() {
    check("replicas:3", false);
}

#[test]
fn replicas_catch_every_lie_encrypted() {
    check("replicas:3", true);
}

#[test]
fn fragments_catch_every_lie_encrypted() {
    check("ec:2+1", true);
}

/// The parity piece lies, the data pieces do not: a data piece read with it fails the seal
/// and is cleared to be asked again; the page still decodes from the two true ones.
#[test]
fn fragments_catch_a_lying_parity_piece_encrypted() {
    check_at("ec:2+1", true, 2);
}

/// The same with the honest data piece slower than `HEDGE_AFTER`: its read is failed over to
/// the lying parity piece, which spoils the first data piece; that one, asked again, is back
/// before the slow one, and the two in then fail together. Which of them lies cannot be told
/// from two: both were once counted bad, and the page lost ("too few of its pieces could be
/// read back") when the slow, honest piece came. The slow piece decides.
#[test]
fn fragments_catch_a_lying_parity_piece_while_a_data_piece_is_slow() {
    check_slow("ec:2+1", true, 2, 150);
}

#[test]
fn fragments_catch_every_lie_with_a_checksum() {
    check("ec:2+1", false);
}

/// Writes waiting on a server gone silent (a proxy that holds its answers 3 s, inside the 5 s
/// request timeout) are not waited for: after `HEDGE_AFTER` (100 ms) they go to a server
/// outside the page's group, which takes the silent one's place in it. Two writes of each
/// page wait there, and the newer must be what is read back, while the server is silent and
/// after it stored both late (and then freed them); writes made meanwhile avoid it. Before,
/// every write waited the 3 s.
#[test]
fn writes_waiting_on_a_server_gone_silent_go_to_another() {
    for (layout, encrypt) in [("replicas:2", false), ("ec:2+1", true)] {
        let (silent, stalls) = proxy(server(), Mode::StallWrites(Duration::from_secs(3)));
        let mut s = store_on(&[silent, server(), server(), server()], layout, encrypt);
        let counters = s.counters().unwrap();
        let pages = 24u64;
        let stalled = Instant::now();
        let took = store_rounds(&mut s, pages, 2, layout);
        assert_eq!(
            stalls.load(Relaxed),
            1,
            "{layout}: the server never went silent"
        );
        assert!(
            took < Duration::from_millis(1500),
            "{layout}: writes took {took:?}"
        );
        let redirected = counters.writes_redirected.load(Relaxed);
        assert!(
            redirected >= pages,
            "{layout}: {redirected} writes redirected"
        );
        for p in 0..pages {
            assert!(
                fetch_one(&mut s, p).unwrap() == page(p, 1),
                "{layout}: page {p}"
            );
        }
        // Still silent: a new round goes around it.
        store_all(&mut s, pages, 2);
        assert!(
            stalled.elapsed() < Duration::from_secs(3),
            "{layout}: the stall ended"
        );
        for p in 0..pages {
            assert!(
                fetch_one(&mut s, p).unwrap() == page(p, 2),
                "{layout}: page {p}"
            );
        }
        // It answers again: its late writes, and the frees behind them, change nothing read.
        while stalled.elapsed() < Duration::from_millis(3500) {
            s.poll(&mut |_| {}).unwrap();
            s.tick(Instant::now()).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        for round in 3..5 {
            store_all(&mut s, pages, round);
            for p in 0..pages {
                let data = fetch_one(&mut s, p).unwrap();
                assert!(data == page(p, round), "{layout}: page {p} round {round}");
            }
        }
    }
}

/// A server goes silent for 3 s while writes wait on it, and no server outside the pages'
/// groups could take them (replicas:2 on two servers, ec:2+1 on three: the default layout
/// gives every group every server). Each write-back is told to the pager as stored once its
/// other pieces are acknowledged and the server has been silent a moment, and reads are
/// served by the others meanwhile; the writes stay in flight on the silent link until it
/// answers them, then finish without a second completion. Before, every write waited the 3 s.
/// A front end that promises every piece stored (`rmem nbd`'s FLUSH) still waits for them:
/// the store says they are not settled until the server answers. One that never stores short
/// (`rmem nbd`) waits for the server once as much as may be released waits on it.
#[test]
fn writes_held_by_a_silent_server_without_a_spare_are_released() {
    for (layout, encrypt, others) in [("replicas:2", false, 1), ("ec:2+1", true, 2)] {
        let (silent, stalls) = proxy(server(), Mode::StallWrites(Duration::from_secs(3)));
        let servers: Vec<String> = std::iter::once(silent)
            .chain((0..others).map(|_| server()))
            .collect();
        let mut s = store_on(&servers, layout, encrypt);
        let counters = s.counters().unwrap();
        let pages = 24u64;
        let stalled = Instant::now();
        let took = store_rounds(&mut s, pages, 2, layout);
        assert_eq!(stalls.load(Relaxed), 1, "{layout}: never silent");
        assert!(
            took < Duration::from_millis(1500),
            "{layout}: writes took {took:?}"
        );
        let released = counters.writes_released.load(Relaxed);
        assert!(released >= pages, "{layout}: {released} writes released");
        assert_eq!(counters.writes_redirected.load(Relaxed), 0, "{layout}");
        for p in 0..pages {
            assert!(
                fetch_one(&mut s, p).unwrap() == page(p, 1),
                "{layout}: page {p}"
            );
        }
        assert!(
            stalled.elapsed() < Duration::from_secs(3) && s.in_flight() > 0,
            "{layout}: the released writes should still wait on the silent server"
        );
        // It answers again: the held writes finish, with no second completion.
        let (mut again, deadline) = (0, Instant::now() + Duration::from_secs(10));
        while s.in_flight() > 0 {
            assert!(
                Instant::now() < deadline,
                "{layout}: {} in flight",
                s.in_flight()
            );
            s.poll(&mut |c| again += u64::from(matches!(c, Completion::Stored { .. })))
                .unwrap();
            s.tick(Instant::now()).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(again, 0, "{layout}: a released write was completed twice");
        for round in 2..4 {
            store_all(&mut s, pages, round);
            for p in 0..pages {
                let data = fetch_one(&mut s, p).unwrap();
                assert!(data == page(p, round), "{layout}: page {p} round {round}");
            }
        }
    }
    // Released, not settled: the silent server's pieces are still waited for.
    let (silent, _) = proxy(server(), Mode::StallWrites(Duration::from_secs(2)));
    let mut s = store_on(&[silent, server()], "replicas:2", false);
    let t = Instant::now();
    let took = store_rounds(&mut s, 8, 1, "released");
    assert!(took < Duration::from_millis(1500), "stored after {took:?}");
    let mark = s.write_mark();
    assert!(
        !s.settled(mark),
        "settled while a server holding a piece is silent"
    );
    pump_until(&mut s, "settled", |s| s.settled(mark));
    assert!(
        t.elapsed() >= Duration::from_millis(1900),
        "settled after {:?}, while the server was silent",
        t.elapsed()
    );
    // Never stored short (`rmem nbd`): past what may be released (here one round), write-backs
    // wait for the server instead.
    let (silent, _) = proxy(server(), Mode::StallWrites(Duration::from_secs(2)));
    let mut s = store_on(&[silent, server()], "replicas:2", false);
    s.never_store_short();
    s.set_released_max_bytes(8 * s.unit_len() as u64);
    let counters = s.counters().unwrap();
    let took = store_rounds(&mut s, 8, 3, "never short");
    assert!(
        took >= Duration::from_millis(1900),
        "stored after {took:?}, while the server was silent"
    );
    assert_eq!(counters.writes_degraded.load(Relaxed), 0, "stored short");
}

/// A proxy to `real` that passes everything until its switch is set, then closes every link
/// and drops every new one at once (a server that died) or, with `hang`, holds every new one
/// and says nothing (a hung host). Cleared again, it passes new links once more.
fn mortal(real: String, hang: bool) -> (String, Arc<AtomicBool>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let dead = Arc::new(AtomicBool::new(false));
    let killed = dead.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for client in l.incoming() {
            let Ok(client) = client else { return };
            if killed.load(Relaxed) {
                if hang {
                    held.push(client);
                }
                continue; // dropped: closed before a word, or held silent
            }
            let up = TcpStream::connect(&real).unwrap();
            client.set_nodelay(true).unwrap();
            up.set_nodelay(true).unwrap();
            let ends = [client.try_clone().unwrap(), up.try_clone().unwrap()];
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), up.try_clone().unwrap()),
                (up, client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Both);
                });
            }
            let killed = killed.clone();
            std::thread::spawn(move || {
                while !killed.load(Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                for e in &ends {
                    let _ = e.shutdown(std::net::Shutdown::Both);
                }
            });
        }
    });
    (addr, dead)
}

/// A server silent for a while (its answers held 2 s), and no server outside the pages'
/// groups to take its pieces (replicas:2 on two, ec:2+1 on three, as the default layout
/// always is): once as much as may be released waits on its link (here one round of pages:
/// the bound is lowered from `RELEASED_MAX_BYTES`), write-backs are stored with a piece
/// fewer, not queued there, where they would wait in this client's memory and hold the
/// program. When it answers again those pages are repaired, so that losing another server
/// afterwards loses none of them.
#[test]
fn writes_past_a_silent_server_are_stored_a_piece_short_and_repaired_when_it_answers() {
    for (layout, encrypt, others) in [("replicas:2", false, 0), ("ec:2+1", true, 1)] {
        let (silent, stalls) = proxy(server(), Mode::StallWrites(Duration::from_secs(2)));
        let (doomed, kill) = mortal(server(), false);
        let servers: Vec<String> = [silent, doomed]
            .into_iter()
            .chain((0..others).map(|_| server()))
            .collect();
        let t = Duration::from_secs(5);
        let timing = Timing {
            connect: t,
            request: t,
            heartbeat: t,
            reconnect: Duration::from_millis(300),
        };
        let layout_of = Layout {
            placement: Placement::Priority,
            redundancy: Redundancy::parse(layout).unwrap(),
            encrypt,
        };
        let mut s = RemoteStore::connect_with(&servers, TOKEN, PS, layout_of, timing).unwrap();
        let counters = s.counters().unwrap();
        let pages = 32u64;
        s.set_released_max_bytes(pages * s.unit_len() as u64);
        let stalled = Instant::now();
        // Round 0 goes to every server; the silent one's pieces are released.
        store_rounds(&mut s, pages, 1, layout);
        assert_eq!(stalls.load(Relaxed), 1, "{layout}: never silent");
        // Rounds 1 and 2 while it is silent: stored past it.
        let t = Instant::now();
        store_all(&mut s, pages, 1);
        store_all(&mut s, pages, 2);
        assert!(
            t.elapsed() < Duration::from_millis(1000),
            "{layout}: {:?}",
            t.elapsed()
        );
        assert!(
            stalled.elapsed() < Duration::from_secs(2),
            "{layout}: too late"
        );
        let released = counters.writes_released.load(Relaxed);
        let degraded = counters.writes_degraded.load(Relaxed);
        assert!(
            released <= pages && degraded >= 2 * pages,
            "{layout}: {released} released, {degraded} stored a piece short"
        );
        // A front end that promises every piece stored waits for their repair.
        let mark = s.write_mark();
        assert!(!s.settled(mark), "{layout}: settled a piece short");
        for p in 0..pages {
            assert!(
                fetch_one(&mut s, p).unwrap() == page(p, 2),
                "{layout}: page {p}"
            );
        }
        // It answers again: the pages written past it are repaired.
        pump_until(&mut s, &format!("{layout}: the pages repaired"), |s| {
            counters.pages_repaired.load(Relaxed) >= pages && s.in_flight() == 0
        });
        pump_until(&mut s, &format!("{layout}: settled"), |s| s.settled(mark));
        // Another server dies: every page is still whole.
        kill.store(true, Relaxed);
        pump_until(&mut s, &format!("{layout}: the server dead"), |_| {
            counters.servers_lost.load(Relaxed) > 0
        });
        for p in 0..pages {
            let data = fetch_one(&mut s, p).unwrap_or_else(|e| panic!("{layout}: page {p}: {e}"));
            assert!(data == page(p, 2), "{layout}: page {p}");
        }
    }
}

/// A server is slow only if it has not answered, not if its answers wait unread: a pager busy
/// elsewhere for longer than `HEDGE_AFTER` (here: asleep 150 ms with writes in flight, which
/// the servers answered at once) must not take the servers for silent in its next tick and
/// store its next write-back a piece short (or redirect writes) on that account.
#[test]
fn answers_waiting_unread_do_not_make_a_server_slow() {
    let mut s = store_on(&[server(), server(), server()], "replicas:2", false);
    let counters = s.counters().unwrap();
    for round in 0..3 {
        for p in 0..4 {
            s.store(PageIndex(p), &page(p, round)).unwrap();
        }
        s.flush().unwrap();
        std::thread::sleep(Duration::from_millis(150));
        s.tick(Instant::now()).unwrap();
        s.store(PageIndex(100 + round), &page(100, round)).unwrap();
        let (mut stored, deadline) = (0, Instant::now() + Duration::from_secs(10));
        while stored < 5 {
            assert!(Instant::now() < deadline, "{stored} of 5 stored");
            s.poll(&mut |c| stored += u64::from(matches!(c, Completion::Stored { .. })))
                .unwrap();
        }
    }
    let degraded = counters.writes_degraded.load(Relaxed);
    let redirected = counters.writes_redirected.load(Relaxed);
    assert_eq!(
        (degraded, redirected),
        (0, 0),
        "stored a piece short, redirected"
    );
}

/// A buried server whose host no longer answers (it accepts connections and says nothing: a
/// hung host) is tried again beside the store, not on the thread that drives it: each try
/// (every 2 s) held that thread, and with it every fault, for up to the connect timeout
/// (100 ms before, on the pager's thread) for as long as the host stayed hung. Once the host
/// answers again the server is taken back and holds pages again.
#[test]
fn a_buried_server_that_hangs_is_tried_again_without_holding_the_store() {
    let (doomed, kill) = mortal(server(), true);
    let mut s = store_burying(&doomed, "replicas:2", false, PS);
    let counters = s.counters().unwrap();
    store_all(&mut s, 16, 0);
    kill.store(true, Relaxed);
    pump_until(&mut s, "the server buried", |_| {
        counters.servers_lost.load(Relaxed) > 0
    });
    // Two tries or more at the hung host, the store driven all along.
    let round = ticks_stay_short(&mut s, 1, "the buried server hung");
    for p in 0..16 {
        assert!(
            fetch_one(&mut s, p).unwrap() == page(p, round - 1),
            "page {p}"
        );
    }
    // The host answers again: the server is back and takes new pages (placed on the first
    // server first).
    kill.store(false, Relaxed);
    let fresh = store_until_on(&mut s, &doomed, "the server never came back");
    for p in fresh.step_by(7) {
        assert!(fetch_one(&mut s, p).unwrap() == page(p, 0), "page {p}");
    }
}

/// A server the pool's manager offers whose host hangs (it accepts and says nothing) is dialled
/// on a thread of its own, not on the store's: every try, each `REVIVE_EVERY`, held the store
/// (and every fault of the program) for the join timeout. Once it answers it joins and takes
/// new pages.
#[test]
fn an_offered_server_that_hangs_is_dialled_without_holding_the_store() {
    use rmem_client::pool::ManagerConn;
    use rmem_proto::pool::{PoolRequest, ServerBeat, UNLIMITED};
    use rmem_server::manager::{Manager, ManagerConfig};
    let m = Manager::bind(ManagerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        token: TOKEN.to_vec(),
        heartbeat: Duration::from_millis(100),
        max_remote_bytes: UNLIMITED,
    })
    .unwrap();
    let manager = m.local_addr().to_string();
    m.spawn();
    // Beats for the servers named in `beating`, as their own `--manager` would send them.
    let beating = Arc::new(std::sync::Mutex::new(vec![server(), server()]));
    let names = beating.clone();
    let at = manager.clone();
    let rounds = Arc::new(AtomicU64::new(0));
    let (beaten, stop) = (rounds.clone(), Arc::new(AtomicBool::new(false)));
    let stopped = stop.clone();
    let beats = std::thread::spawn(move || {
        let mut conns: HashMap<String, ManagerConn> = HashMap::new();
        while !stopped.load(Relaxed) {
            for addr in names.lock().unwrap().clone() {
                let c = conns.entry(addr.clone()).or_insert_with(|| {
                    ManagerConn::connect(&at, TOKEN, Duration::from_secs(5)).unwrap()
                });
                let beat = PoolRequest::ServerBeat(ServerBeat {
                    addr,
                    capacity_bytes: 64 << 20,
                    used_bytes: 0,
                    flags: 0,
                    sessions: Vec::new(),
                    node: String::new(),
                });
                c.ask(&beat, Duration::from_secs(5)).unwrap();
            }
            beaten.fetch_add(1, Relaxed);
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let config = rmem_client::Config {
        manager: Some(manager),
        token: TOKEN.to_vec(),
        page_size: PS,
        placement: Placement::Stripe,
        redundancy: Some(Redundancy::None),
        connect_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    beaten_once(&rounds);
    let mut s = RemoteStore::from_config(&config).unwrap();
    assert_eq!(
        s.used_per_server().len(),
        2,
        "the store starts on the two servers"
    );
    // A third server is offered, its host hung.
    let (hung, hang) = mortal(server(), true);
    hang.store(true, Relaxed);
    beating.lock().unwrap().push(hung.clone());
    let round = ticks_stay_short(&mut s, 0, "an offered server hung");
    assert_eq!(s.used_per_server().len(), 2, "a hung server joined");
    // Its host answers: it joins and takes new pages.
    hang.store(false, Relaxed);
    let fresh = store_until_on(&mut s, &hung, "the offered server never joined");
    for p in fresh.chain(0..16) {
        let round = if p < 1000 { round - 1 } else { 0 };
        assert!(fetch_one(&mut s, p).unwrap() == page(p, round), "page {p}");
    }
    stop.store(true, Relaxed);
    beats.join().unwrap();
}

/// Wait (5 s at most) until the heartbeat thread counting `rounds` began a round and ended it.
fn beaten_once(rounds: &AtomicU64) {
    let (from, deadline) = (
        rounds.load(Relaxed),
        Instant::now() + Duration::from_secs(5),
    );
    while rounds.load(Relaxed) < from + 2 {
        assert!(Instant::now() < deadline, "no heartbeat round");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Released write-backs leave their pieces on the silent server's link: at most
/// `RELEASED_MAX_BYTES` of them, so that a hung server cannot grow the client by all a program
/// writes meanwhile. Past it, writes wait for the server as before, and every one completes
/// once it answers.
#[test]
fn released_writes_are_bounded() {
    use rmem_client::store::cluster::RELEASED_MAX_BYTES;
    // Silent for 8 s from its first write answer: the releases are watched for 3 s after the
    // stores went out (however long a loaded machine took to send them, up to 5 s), inside it.
    let (silent, _) = proxy(server(), Mode::StallWrites(Duration::from_secs(8)));
    let mut s = store_on(&[silent, server()], "replicas:2", false);
    let counters = s.counters().unwrap();
    // Each piece is a page and its 16-byte checksum.
    let cap = RELEASED_MAX_BYTES / (PS as u64 + 16);
    let pages = cap + 512;
    let sending = Instant::now();
    for p in 0..pages {
        s.store(PageIndex(p), &page(p, 0)).unwrap();
    }
    s.flush().unwrap();
    assert!(
        sending.elapsed() < Duration::from_secs(5),
        "sending took {:?}",
        sending.elapsed()
    );
    let mut stored = 0;
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        s.poll(&mut |c| stored += u64::from(matches!(c, Completion::Stored { .. })))
            .unwrap();
        s.tick(Instant::now()).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let released = counters.writes_released.load(Relaxed);
    assert!(
        released <= cap && released + 64 >= cap,
        "{released} released against a cap of {cap} pieces"
    );
    assert_eq!(
        stored, released,
        "only the released were told stored while it was silent"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while stored < pages {
        assert!(Instant::now() < deadline, "{stored} of {pages} stored");
        s.poll(&mut |c| stored += u64::from(matches!(c, Completion::Stored { .. })))
            .unwrap();
        s.tick(Instant::now()).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    for p in (0..pages).step_by(97) {
        assert!(fetch_one(&mut s, p).unwrap() == page(p, 0), "page {p}");
    }
}

/// A server that answers a read under another request's tag is buried (a bad frame is never
/// retried), with writes sent after that read still unanswered on its link: each of them is
/// taken back exactly as it was sent and goes on with the other copy, the read fails over,
/// and every page reads back right. (Taking the bad answer's request off the link before
/// checking the answer once left the link's requests one frame out of step with their
/// bytes, and collecting them panicked.)
#[test]
fn a_bad_frame_buries_its_server_and_the_writes_behind_it_go_on() {
    let (bad, told) = proxy(server(), Mode::WrongTagOnce);
    let mut s = store_on(&[bad, server()], "replicas:2", false);
    let pages = 40u64;
    let pump = |s: &mut RemoteStore, stores: u64, fetches: u64, round: u64| {
        let (mut stored, mut fetched) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while stored < stores || fetched < fetches {
            assert!(
                Instant::now() < deadline,
                "{stored} of {stores} stored, {fetched} of {fetches} fetched"
            );
            s.poll(&mut |c| match c {
                Completion::Stored { .. } => stored += 1,
                Completion::Fetched { page: at, data } => {
                    fetched += 1;
                    assert!(data == page(at.0, round), "page {} wrong", at.0);
                }
            })
            .unwrap();
            s.tick(Instant::now()).unwrap();
        }
    };
    for p in 0..pages {
        s.store(PageIndex(p), &page(p, 0)).unwrap();
    }
    s.flush().unwrap();
    pump(&mut s, pages, 0, 0);
    // Reads, then writes queued behind them on the same links before any answer comes.
    for p in 0..pages {
        s.fetch(PageIndex(p)).unwrap();
    }
    for p in pages..2 * pages {
        s.store(PageIndex(p), &page(p, 1)).unwrap();
    }
    s.flush().unwrap();
    pump(&mut s, pages, pages, 0);
    assert_eq!(told.load(Relaxed), 1, "the bad frame was never sent");
    for p in pages..2 * pages {
        s.fetch(PageIndex(p)).unwrap();
    }
    pump(&mut s, 0, pages, 1);
}

/// One encrypted copy (`none`): a page is opened where it comes, in the link's receive
/// buffer. From an honest server every version reads back right; from one that lies, the
/// first lie ends the read with an error naming the page, and no altered byte is handed on.
#[test]
fn one_encrypted_copy_reads_back_right_and_a_lie_is_an_error() {
    let mut honest = store_on(&[server()], "none", true);
    for round in 0..3 {
        store_all(&mut honest, 20, round);
        for p in 0..20 {
            let data = fetch_one(&mut honest, p).unwrap();
            assert!(data == page(p, round), "page {p} round {round} wrong");
        }
    }
    let (lying, lies) = liar(server());
    let lying_name = lying.clone();
    let mut s = store_on(&[lying], "none", true);
    store_all(&mut s, 4, 0);
    let e = fetch_one(&mut s, 3).expect_err("a lie was handed on as the page");
    assert!(lies.load(Relaxed) >= 1, "no lie told: {e}");
    assert!(e.contains("page 3"), "{e}");
    assert_eq!(s.counters().unwrap().pieces_bad.load(Relaxed), 1, "{e}");
    assert!(
        e.contains(&format!("from {lying_name}")),
        "the liar is not named: {e}"
    );
}

/// A copy on a server that goes silent (a proxy that holds each read answer 3 s, inside the
/// 5 s request timeout: a hung or stopped host looks the same until then) is not waited for:
/// after `HEDGE_AFTER` (100 ms) the read is asked of the other copy, and the page comes from
/// it. Before, each read waited for the slow copy.
#[test]
fn a_read_from_a_server_gone_silent_is_asked_of_the_other_copy() {
    let (slow, _) = proxy(server(), Mode::Slow(Duration::from_secs(3)));
    let mut s = store_on(&[slow, server()], "replicas:2", false);
    store_all(&mut s, 4, 0);
    let counters = s.counters().unwrap();
    for p in 0..4 {
        let t = Instant::now();
        let data = fetch_one(&mut s, p).unwrap();
        assert!(data == page(p, 0), "page {p} wrong");
        let took = t.elapsed();
        assert!(took < Duration::from_secs(1), "page {p} took {took:?}");
    }
    assert!(counters.failovers.load(Relaxed) >= 1, "no read failed over");
}

/// More liars than the layout tolerates: no piece set the page can be made of is left. The
/// fetch ends, and the error says the page is lost and names the servers whose pieces failed
/// their check; it never waits forever, never hands out a page that fails its seal.
#[test]
fn more_liars_than_tolerated_lose_the_page_with_an_error_naming_them() {
    for (redundancy, encrypt) in [
        ("replicas:2", false),
        ("replicas:2", true),
        ("ec:2+1", false),
        ("ec:2+1", true),
    ] {
        eprintln!("{redundancy} encrypt={encrypt}");
        let (a, _) = liar(server());
        let (b, _) = liar(server());
        let mut s = store_on(&[a.clone(), b.clone(), server()], redundancy, encrypt);
        store_all(&mut s, 4, 1);
        for p in 0..4 {
            let e = match fetch_one(&mut s, p) {
                Ok(_) => panic!("{redundancy} encrypt={encrypt}: page {p} read from liars"),
                Err(e) => e,
            };
            assert!(
                e.contains("failed its check") && (e.contains(&a) || e.contains(&b)),
                "{redundancy} encrypt={encrypt}: page {p}: {e}"
            );
            if p == 0 {
                eprintln!("{e}");
            }
        }
    }
}
