//! The fault path over the in-process store: no network, same pager.

use rmem_client::store::mem::MemStore;
use rmem_client::{Config, Runtime};
use std::sync::Arc;

fn runtime(page_size: usize, local_pages: u64, capacity_pages: u64) -> Runtime {
    let store = MemStore::new(page_size, capacity_pages * page_size as u64);
    runtime_on(store, page_size, local_pages)
}

/// Indices below `n`, pseudo-random from `seed` (xorshift64).
fn xorshift(mut x: u64, n: usize) -> impl FnMut() -> usize {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    }
}

fn runtime_on(store: MemStore, page_size: usize, local_pages: u64) -> Runtime {
    let config = Config {
        page_size,
        local_bytes: local_pages * page_size as u64,
        region_bytes: 1 << 32,
        ..Config::default()
    };
    Runtime::start(
        &config,
        Box::new(store),
        Box::new(|m: &str| panic!("pager failed: {m}")),
    )
    .unwrap()
}

#[test]
fn fresh_memory_is_zero_and_data_survives_eviction() {
    for ps in [4096usize, 65536] {
        let rt = runtime(ps, 8, 1024);
        let pages = 64;
        let p = rt.alloc(pages * ps).unwrap();
        // SAFETY: p points to pages*ps bytes of live rmem memory.
        let mem = unsafe { std::slice::from_raw_parts_mut(p, pages * ps) };
        assert!(
            mem.iter().step_by(997).all(|&b| b == 0),
            "fresh memory reads as zero"
        );
        for round in 0..3u8 {
            for (i, chunk) in mem.chunks_mut(ps).enumerate() {
                chunk[0] = round.wrapping_add(i as u8);
                chunk[ps - 1] = !round;
            }
            for (i, chunk) in mem.chunks(ps).enumerate() {
                assert_eq!(
                    chunk[0],
                    round.wrapping_add(i as u8),
                    "page {i} round {round}"
                );
                assert_eq!(chunk[ps - 1], !round);
            }
        }
        let s = rt.stats();
        // Back whole or by pieces (two bytes of each page: sparse use, once learnt).
        assert!(
            s.swap_outs > 0 && s.swap_ins + s.sub_page_fetches > 0,
            "{s:?}"
        );
        assert!(
            s.local_bytes_max <= 8 * ps as u64,
            "budget respected: {s:?}"
        );
        rt.free(p).unwrap();
    }
}

#[test]
fn clean_pages_are_not_written_back() {
    let ps = 4096;
    let rt = runtime(ps, 8, 1024);
    let pages = 32;
    let p = rt.alloc(pages * ps).unwrap();
    // SAFETY: live allocation of pages*ps bytes.
    let mem = unsafe { std::slice::from_raw_parts_mut(p, pages * ps) };
    for c in mem.chunks_mut(ps) {
        c[7] = 7;
    }
    let after_write = rt.stats().swap_outs;
    assert!(after_write >= (pages - 8) as u64);
    // Read-only passes: every page is evicted clean, so no more write-backs.
    for _ in 0..3 {
        for c in mem.chunks(ps) {
            // SAFETY: volatile, so the optimizer cannot merge the passes into one.
            assert_eq!(unsafe { std::ptr::read_volatile(&c[7]) }, 7);
        }
    }
    let s = rt.stats();
    assert!(
        s.swap_outs <= after_write + 8,
        "read-only passes wrote back: {s:?}"
    );
    assert!(s.swap_ins >= 3 * (pages - 8) as u64);
}

#[test]
fn pages_written_only_with_zeros_are_not_written_back() {
    for ps in [4096usize, 65536] {
        let rt = runtime(ps, 8, 1024);
        let pages = 48;
        let p = rt.alloc(pages * ps).unwrap();
        // SAFETY: live allocation of pages*ps bytes.
        let mem = unsafe { std::slice::from_raw_parts_mut(p, pages * ps) };
        // Cleared as a program clears a fresh buffer: every page written, with zeros.
        for c in mem.chunks_mut(ps) {
            // SAFETY: volatile, so the optimizer cannot drop the stores of zero.
            unsafe { std::ptr::write_bytes(c.as_mut_ptr(), 0, ps) };
            std::hint::black_box(&c[0]);
        }
        // Every fourth page gets data; one page is written and then zeroed again.
        for (i, c) in mem.chunks_mut(ps).enumerate() {
            if i % 4 == 0 {
                c[ps / 2] = i as u8 + 1;
            }
        }
        mem[ps * 5 + 100] = 9;
        mem[ps * 5 + 100] = 0;
        std::hint::black_box(&mem[ps * 5]);
        // Two more passes over everything: each page evicted and brought back.
        for _ in 0..2 {
            for (i, c) in mem.chunks(ps).enumerate() {
                // SAFETY: volatile reads of live memory, so every page is touched.
                let (v, w) = unsafe {
                    (
                        std::ptr::read_volatile(&c[ps / 2]),
                        std::ptr::read_volatile(&c[100]),
                    )
                };
                assert_eq!(v, if i % 4 == 0 { i as u8 + 1 } else { 0 }, "page {i}");
                assert_eq!(w, 0, "page {i}");
            }
        }
        let s = rt.stats();
        // The data pages are written back once each; the zero ones never (the first 8 are
        // the last evicted and may still be resident).
        assert!(s.swap_outs <= 12, "only the data pages written back: {s:?}");
        assert!(
            s.dirty_unchanged >= (pages as u64 - 12 - 8),
            "zero pages found unchanged: {s:?}"
        );
        // They were untouched again: nothing to fetch for them.
        assert!(s.swap_ins <= 2 * 12 + 8, "{s:?}");
        rt.free(p).unwrap();
    }
}

#[test]
fn threads_share_pages_without_losing_writes() {
    let ps = 4096;
    let rt = runtime(ps, 16, 4096);
    let rt = Arc::new(rt);
    let words = 128 * ps / 8;
    let p = rt.alloc(words * 8).unwrap() as usize;
    let threads = 8;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                // SAFETY: each thread only writes words i with i % threads == t.
                let mem = unsafe { std::slice::from_raw_parts_mut(p as *mut u64, words) };
                let mine: Vec<usize> = (t..words).step_by(threads).collect();
                let mut shadow = vec![0u64; mine.len()];
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                for _ in 0..20_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = (x % mine.len() as u64) as usize;
                    if x & 1 == 0 {
                        shadow[k] = x;
                        // SAFETY: volatile so the compiler keeps every access.
                        unsafe { std::ptr::write_volatile(&mut mem[mine[k]], x) };
                    } else {
                        // SAFETY: as above.
                        let v = unsafe { std::ptr::read_volatile(&mem[mine[k]]) };
                        assert_eq!(v, shadow[k], "thread {t} word {}", mine[k]);
                    }
                }
                for (k, &i) in mine.iter().enumerate() {
                    // SAFETY: as above.
                    assert_eq!(unsafe { std::ptr::read_volatile(&mem[i]) }, shadow[k]);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(rt.stats().swap_ins > 0);
}

/// Prefetching: sequential, backwards, strided and random passes from several threads keep
/// every byte, the budget holds, and a sequential pass is mostly prefetched.
#[test]
fn prefetching_keeps_data_and_budget() {
    let ps = 4096;
    let local_pages = 32;
    let config = Config {
        page_size: ps,
        local_bytes: local_pages * ps as u64,
        region_bytes: 1 << 32,
        prefetch: true,
        ..Config::default()
    };
    let store = MemStore::new(ps, 4096 * ps as u64);
    let rt = Arc::new(
        Runtime::start(
            &config,
            Box::new(store),
            Box::new(|m: &str| panic!("pager failed: {m}")),
        )
        .unwrap(),
    );
    let pages = 512;
    let p = rt.alloc(pages * ps).unwrap() as usize;
    let tag = |page: usize, round: usize| (page * 7 + round) as u8;
    let touch = |order: &[usize], round: usize| {
        // SAFETY: the allocation is pages * ps bytes; each page's first byte is only written
        // by the thread that owns the pass.
        let mem = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, pages * ps) };
        for &i in order {
            // SAFETY: volatile, so every touch faults as the program's would.
            let b = unsafe { std::ptr::read_volatile(&mem[i * ps]) };
            assert_eq!(b, tag(i, round), "page {i} round {round}");
            // SAFETY: as above.
            unsafe { std::ptr::write_volatile(&mut mem[i * ps], tag(i, round + 1)) };
        }
    };
    let fwd: Vec<usize> = (0..pages).collect();
    // SAFETY: as above.
    let mem = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, pages * ps) };
    for &i in &fwd {
        mem[i * ps] = tag(i, 0);
    }
    let before = rt.stats();
    touch(&fwd, 0);
    let s = rt.stats();
    assert!(
        s.prefetches - before.prefetches > pages as u64 / 2,
        "sequential pass mostly prefetched: {s:?}"
    );
    let back: Vec<usize> = (0..pages).rev().collect();
    touch(&back, 1);
    let strided: Vec<usize> = (0..3).flat_map(|o| (o..pages).step_by(3)).collect();
    touch(&strided, 2);
    let mut random = fwd.clone();
    let mut x = 12345u64;
    for i in (1..random.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        random.swap(i, (x % (i as u64 + 1)) as usize);
    }
    touch(&random, 3);
    // Two threads streaming through disjoint halves at once.
    let halves: Vec<Vec<usize>> = vec![(0..pages / 2).collect(), (pages / 2..pages).collect()];
    std::thread::scope(|sc| {
        for h in &halves {
            sc.spawn(|| touch(h, 4));
        }
    });
    let s = rt.stats();
    assert!(
        s.local_bytes_max <= local_pages * ps as u64,
        "budget respected: {s:?}"
    );
}

/// A 4 KiB piece the program drops itself with a raw madvise(MADV_DONTNEED) system call
/// (which librmem cannot see) reads as zero afterwards, as Linux gives, in a clean page and
/// in a dirty one; the rest of each page keeps its data, and so does the whole page across
/// an eviction. Before, a clean page was fetched again (old data back) and a dirty one
/// stopped the program ("vanished from the page tables").
#[test]
fn a_piece_dropped_by_a_raw_madvise_reads_as_zero() {
    dropped_piece(false);
}

/// The same with faults delivered by signal, where a write fault on a mapped page is taken
/// for a write-protect fault unless the page tables say the piece is missing.
#[test]
fn a_piece_dropped_by_a_raw_madvise_reads_as_zero_by_signal() {
    dropped_piece(true);
}

fn dropped_piece(by_signal: bool) {
    let ps = 16384;
    let config = Config {
        page_size: ps,
        local_bytes: 8 * ps as u64,
        region_bytes: 1 << 32,
        fault_by_signal: by_signal,
        // Whole pages: a piece never fetched of a partial page, dropped so, cannot be told
        // from one not fetched yet, and reads the server's copy (docs/configuration.md).
        sub_page: false,
        ..Config::default()
    };
    let rt = Runtime::start(
        &config,
        Box::new(MemStore::new(ps, 1024 * ps as u64)),
        Box::new(|m: &str| panic!("pager failed: {m}")),
    )
    .unwrap();
    let pages = 64;
    let p = rt.alloc(pages * ps).unwrap();
    // SAFETY: p points to pages*ps bytes of live rmem memory.
    let mem = unsafe { std::slice::from_raw_parts_mut(p, pages * ps) };
    for (i, c) in mem.chunks_mut(ps).enumerate() {
        c.fill(i as u8 | 1);
    }
    let drop_piece = |at: usize| {
        // SAFETY: a 4 KiB piece of our own region page; the raw system call, as a program
        // that bypasses the C library makes it.
        let r = unsafe { libc::syscall(libc::SYS_madvise, p.add(at), 4096, libc::MADV_DONTNEED) };
        assert_eq!(r, 0);
    };
    // Page 0 was evicted long ago; read it back: it is mapped clean. Drop its second piece
    // and read it: zeros.
    assert_eq!(mem[0], 1);
    drop_piece(4096);
    assert!(
        mem[4096..8192].iter().all(|&b| b == 0),
        "dropped piece reads as zero"
    );
    // Page 1, fetched by a write: dirty. Drop its third piece and write into it.
    mem[ps + 5] = 3;
    drop_piece(ps + 2 * 4096);
    mem[ps + 2 * 4096 + 1] = 4;
    let want = |i: usize| -> u8 {
        match i {
            4096..8192 => 0,
            i if i == ps + 5 => 3,
            i if i == ps + 2 * 4096 + 1 => 4,
            i if (ps + 2 * 4096..ps + 3 * 4096).contains(&i) => 0,
            i => (i / ps) as u8 | 1,
        }
    };
    // Evict both (the budget is 8 pages), then check every byte.
    for c in mem.chunks(ps).skip(2) {
        // SAFETY: volatile, so every page is really touched.
        assert_eq!(unsafe { std::ptr::read_volatile(&c[1]) }, c[0]);
    }
    for (i, &b) in mem.iter().enumerate().take(4 * ps) {
        assert_eq!(b, want(i), "byte {i}");
    }
    let s = rt.stats();
    assert!(s.pieces_zeroed >= 2, "{s:?}");
    assert_eq!(s.pieces_replaced, 0, "{s:?}");
    rt.free(p).unwrap();
}

/// mprotect through the runtime: dirty pages made read-only (one in part: the region's
/// mapping is split inside a page) are written back and fetched again with their data and
/// their protection; memory freed read-only is read-write again.
/// Scattered reads fetch single 4 KiB pieces (sub-page fetches); pieces count against the
/// budget by their size; a piece dropped by a raw madvise, writes to partial pages and
/// threads faulting on the same pages at once never lose or invent a byte.
#[test]
fn scattered_reads_fetch_pieces_and_every_byte_stays_right() {
    const PS: usize = 65536;
    const PAGES: usize = 512;
    let (ps, pages, local) = (PS, PAGES, 32);
    let rt = runtime(ps, local, 1024);
    let p = rt.alloc(pages * ps).unwrap() as usize;
    let word = |i: usize| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mem = |p: usize| {
        // SAFETY: p points to pages*ps bytes of live rmem memory, read and written as u64
        // words at offsets the threads below split between them for writes.
        unsafe { std::slice::from_raw_parts_mut(p as *mut u64, PAGES * PS / 8) }
    };
    for (i, w) in mem(p).iter_mut().enumerate() {
        *w = word(i);
    }
    // Once pages 400.. are read through (a stream: whole pages), most pages below are long
    // evicted and no fault stream is near them: a read there brings one piece. Find one (the
    // policy may keep some of them; the pager counts a fetch just after it wakes the thread).
    let m = mem(p);
    let sum = m[400 * ps / 8..]
        .iter()
        .fold(0u64, |a, &w| a.wrapping_add(w));
    assert_ne!(sum, 0);
    let at = (10..90)
        .step_by(7)
        .map(|page| page * ps + 5 * 4096)
        .find(|&at| {
            let before = rt.stats().sub_page_fetches;
            assert_eq!(m[at / 8], word(at / 8));
            let t = std::time::Instant::now();
            while t.elapsed().as_millis() < 100 {
                if rt.stats().sub_page_fetches > before {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            false
        })
        .expect("a scattered read fetches a piece");
    // Dropped by a raw madvise system call, the piece is fetched again (not zeros: a piece
    // never fetched cannot be told from a dropped one, so neither reads as zeros).
    // SAFETY: a 4 KiB piece of our own region page; the raw system call.
    let r = unsafe { libc::syscall(libc::SYS_madvise, p + at, 4096, libc::MADV_DONTNEED) };
    assert_eq!(r, 0);
    assert_eq!(
        m[at / 8 + 3],
        word(at / 8 + 3),
        "a dropped piece comes back"
    );
    let words = pages * ps / 8;
    let threads: Vec<_> = (0..4usize)
        .map(|t| {
            std::thread::spawn(move || {
                let m = mem(p);
                let mut x = 0x1234_5678u64 + t as u64;
                for n in 0..20_000usize {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = (x as usize) % words;
                    if n % 64 == 0 && i % 4 == t {
                        // This thread's words only: a write to a partial page.
                        m[i] = !word(i);
                        m[i] = word(i);
                    } else {
                        assert_eq!(m[i], word(i), "word {i} (thread {t}, read {n})");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for (i, &w) in m.iter().enumerate().step_by(509) {
        assert_eq!(w, word(i), "word {i}");
    }
    let s = rt.stats();
    assert!(
        s.sub_page_fetches > 1000,
        "scattered reads fetch pieces: {s:?}"
    );
    assert!(
        s.local_bytes_max <= local * ps as u64,
        "budget respected: {s:?}"
    );
}

/// A word read and then written back (a load and a store, as `x[i] += 1` often compiles, or a
/// hash table's update) at random: the page's first fault is a read, which fetches its 4 KiB
/// piece alone; the write right after makes that piece writable (no fetch), and when the page
/// leaves only its written pieces are written back, over the server's copy. Every word stays
/// right.
#[test]
fn random_read_then_write_fetches_and_writes_back_pieces() {
    const PS: usize = 65536;
    const PAGES: usize = 1024;
    // An eighth of the pages local, 2048 pieces: the 6000 updates' pieces overflow it
    // (a quarter, 4096 pieces, left about 250 partial pages to leave once random faults
    // stopped fetching whole pages next to earlier faults).
    let rt = runtime(PS, 128, 2048);
    let p = rt.alloc(PAGES * PS).unwrap() as *mut u64;
    let words = PAGES * PS / 8;
    for i in 0..words {
        // SAFETY: i < words, within the allocation.
        unsafe { p.add(i).write(i as u64) };
    }
    let before = rt.stats();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let updates = 6000;
    for _ in 0..updates {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x % words as u64) as usize;
        // SAFETY: i < words. The value passes through black_box so that the load and the
        // store stay two instructions (LLVM folds a volatile load and store into one `add`).
        unsafe {
            let w = p.add(i);
            let v = std::hint::black_box(w.read_volatile());
            w.write_volatile(v + (1 << 40));
        }
    }
    let s = rt.stats();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut count = std::collections::HashMap::new();
    for _ in 0..updates {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *count.entry((x % words as u64) as usize).or_insert(0u64) += 1;
    }
    for i in (0..words).step_by(101).chain(count.keys().copied()) {
        let want = i as u64 + (count.get(&i).copied().unwrap_or(0) << 40);
        // SAFETY: i < words.
        assert_eq!(unsafe { p.add(i).read() }, want, "word {i}");
    }
    let d = |a: u64, b: u64| a - b;
    let ins = d(s.swap_ins, before.swap_ins);
    let pieces = d(s.sub_page_fetches, before.sub_page_fetches);
    assert!(ins + pieces > 4000, "the updates miss: {s:?}");
    // Before pieces could be written, a write made the page whole: every update fetched and
    // wrote back 64 KiB (after a piece, until writes were learnt to follow reads).
    assert!(
        pieces > 2 * ins,
        "{pieces} pieces fetched for {ins} whole pages: {s:?}"
    );
    let piece_outs = d(s.sub_page_write_backs, before.sub_page_write_backs);
    assert!(
        piece_outs > 500,
        "{piece_outs} pieces written back alone: {s:?}"
    );
    // Each sends its written pieces, a few, never the whole page.
    let piece_bytes = d(s.bytes_written_back, before.bytes_written_back)
        - d(s.swap_outs, before.swap_outs) * PS as u64;
    assert!(
        piece_bytes < piece_outs * 8 * 4096,
        "{piece_bytes} bytes for {piece_outs} partial pages' written pieces: {s:?}"
    );
}

/// Where pieces are read alone but never written alone (servers that keep pages sealed by the
/// piece), scattered reads and read-modify-writes fetch pieces as they do elsewhere; a partial
/// victim with written pieces fetches the rest of its page as it leaves and is written back
/// whole. Every word stays right; no piece is written alone (the store panics if asked).
#[test]
fn pieces_read_alone_but_never_written_alone() {
    const PS: usize = 65536;
    const PAGES: usize = 1024;
    let store = MemStore::new(PS, 2048 * PS as u64).without_part_writes();
    let rt = runtime_on(store, PS, 128);
    let p = rt.alloc(PAGES * PS).unwrap() as *mut u64;
    let words = PAGES * PS / 8;
    for i in 0..words {
        // SAFETY: i < words, within the allocation.
        unsafe { p.add(i).write(i as u64) };
    }
    let half = words / 2;
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15, half);
    let before = rt.stats();
    for _ in 0..3000 {
        let i = next();
        // SAFETY: i < words.
        assert_eq!(unsafe { p.add(i).read_volatile() }, i as u64, "word {i}");
    }
    let reads = rt.stats();
    let pieces = reads.sub_page_fetches - before.sub_page_fetches;
    assert!(
        pieces > 2000,
        "{pieces} pieces fetched by the reads: {reads:?}"
    );
    let mut count = std::collections::HashMap::new();
    let updates = 6000;
    for _ in 0..updates {
        let i = half + next();
        *count.entry(i).or_insert(0u64) += 1;
        // SAFETY: i < words. Two instructions, as in the test above.
        unsafe {
            let w = p.add(i);
            let v = std::hint::black_box(w.read_volatile());
            w.write_volatile(v + (1 << 40));
        }
    }
    for i in (0..words).step_by(101).chain(count.keys().copied()) {
        let want = i as u64 + (count.get(&i).copied().unwrap_or(0) << 40);
        // SAFETY: i < words.
        assert_eq!(unsafe { p.add(i).read() }, want, "word {i}");
    }
    let s = rt.stats();
    assert_eq!(s.sub_page_write_backs, 0, "{s:?}");
    let (ins, pieces, outs) = (
        s.swap_ins - reads.swap_ins,
        s.sub_page_fetches - reads.sub_page_fetches,
        s.swap_outs - reads.swap_outs,
    );
    // The faults fetch pieces; the pages leave whole, each fetched once more as it does.
    assert!(
        pieces > updates / 2 && ins < pieces / 4 && outs > 500,
        "the updates fetched {ins} whole pages and {pieces} pieces, wrote back {outs}: {s:?}"
    );
    let rest = s.bytes_fetched - reads.bytes_fetched - pieces * 4096 - ins * PS as u64;
    assert!(
        rest >= outs / 2 * PS as u64,
        "{rest} bytes fetched for the rest of {outs} pages written back: {s:?}"
    );
}

/// Where pages fetched for a read are written soon after, a read fault maps its page writable
/// (no write-protect fault for the write that follows); when the program then only reads,
/// that is unlearnt and its pages leave clean again, not written back. Whole pages only
/// (`--sub-page off`), so that every fault fetches a page and every victim is one.
#[test]
fn writes_after_reads_are_learnt_and_unlearnt() {
    const PS: usize = 65536;
    const PAGES: usize = 1024;
    let config = Config {
        page_size: PS,
        local_bytes: 256 * PS as u64,
        region_bytes: 1 << 32,
        sub_page: false,
        ..Config::default()
    };
    let store = MemStore::new(PS, 2048 * PS as u64);
    let rt = Runtime::start(
        &config,
        Box::new(store),
        Box::new(|m: &str| panic!("pager failed: {m}")),
    )
    .unwrap();
    let p = rt.alloc(PAGES * PS).unwrap() as *mut u64;
    let words = PAGES * PS / 8;
    for i in 0..words {
        // SAFETY: i < words, within the allocation.
        unsafe { p.add(i).write(i as u64) };
    }
    let mut next = xorshift(0x2545_F491_4F6C_DD1D, words);
    let before = rt.stats();
    for _ in 0..6000 {
        let i = next();
        // SAFETY: i < words; black_box keeps the load and the store two instructions.
        unsafe {
            let w = p.add(i);
            let v = std::hint::black_box(w.read_volatile());
            w.write_volatile(v + (1 << 40));
        }
    }
    let s = rt.stats();
    let (ins, wp) = (s.swap_ins - before.swap_ins, s.wp_faults - before.wp_faults);
    assert!(ins > 4000, "the updates miss: {s:?}");
    // Without the rule every update took a write-protect fault after its fetch.
    assert!(
        wp * 4 < ins,
        "{wp} write-protect faults for {ins} pages: {s:?}"
    );
    let before = rt.stats();
    let mut sum = 0u64;
    for _ in 0..20_000 {
        // SAFETY: the index is below words.
        sum = sum.wrapping_add(unsafe { p.add(next()).read_volatile() });
    }
    assert_ne!(sum, 0);
    let s = rt.stats();
    let (ins, outs) = (s.swap_ins - before.swap_ins, s.swap_outs - before.swap_outs);
    assert!(ins > 10_000, "the reads miss: {s:?}");
    // The 256 resident pages the updates dirtied, and the guesses before unlearning; without
    // unlearning nearly every page read would be written back.
    assert!(
        outs < 256 + ins / 10,
        "{outs} pages written back for {ins} read: {s:?}"
    );
    for i in (0..words).step_by(4099) {
        // SAFETY: i < words.
        let w = unsafe { p.add(i).read() };
        assert_eq!(w & ((1 << 40) - 1), i as u64, "word {i}");
    }
}

#[test]
fn protection_is_kept_across_eviction() {
    let ps = 16384;
    let rt = runtime(ps, 8, 1024);
    let pages = 64;
    let p = rt.alloc(pages * ps).unwrap();
    // SAFETY: p points to pages*ps bytes of live rmem memory.
    let mem = unsafe { std::slice::from_raw_parts_mut(p, pages * ps) };
    for (i, c) in mem.chunks_mut(ps).enumerate() {
        c.fill(i as u8 | 1);
    }
    let (ro, ro_end) = (p as u64 + 4096, p as u64 + 3 * ps as u64);
    rt.protect(ro, ro_end - ro, libc::PROT_READ).unwrap();
    // Whether the mapping at `a` is read-write, by /proc/self/maps.
    let writable = |a: u64| {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().any(|l| {
            let (range, rest) = l.split_once(' ').unwrap();
            let (s, e) = range.split_once('-').unwrap();
            let (s, e) = (
                u64::from_str_radix(s, 16).unwrap(),
                u64::from_str_radix(e, 16).unwrap(),
            );
            s <= a && a < e && rest.starts_with("rw")
        })
    };
    for _ in 0..2 {
        // Evict everything, then read it all back.
        for c in mem.chunks(ps) {
            // SAFETY: volatile, so every page is touched.
            assert_eq!(unsafe { std::ptr::read_volatile(&c[1]) }, c[0]);
        }
        for (i, c) in mem.chunks(ps).enumerate() {
            assert!(c.iter().all(|&b| b == i as u8 | 1), "page {i}");
        }
        assert!(writable(p as u64), "before the range");
        assert!(!writable(ro), "read-only range kept");
        assert!(!writable(ro_end - 1), "read-only range kept");
        assert!(writable(ro_end), "after the range");
    }
    assert!(rt.stats().swap_outs >= pages as u64 - 8);
    rt.free(p).unwrap();
    let q = rt.alloc(pages * ps).unwrap();
    assert_eq!(q, p, "the same pages again");
    assert!(writable(ro), "freed memory is read-write again");
    rt.free(q).unwrap();
}

/// mlock through the runtime: pinned pages stay resident while everything else is evicted,
/// pinning beyond the budget fails with ENOMEM and pins nothing, unpinned pages leave again.
#[test]
fn pinned_pages_stay_resident_within_the_budget() {
    let ps = 16384;
    let rt = runtime(ps, 16, 1024);
    let pages = 64;
    let p = rt.alloc(pages * ps).unwrap();
    // SAFETY: p points to pages*ps bytes of live rmem memory.
    let mem = unsafe { std::slice::from_raw_parts_mut(p, pages * ps) };
    let resident = |from: usize, n: usize| {
        let mut v = vec![0u8; n * ps / 4096];
        // SAFETY: mincore reads page tables of our own mapping into v (one byte per piece).
        let r = unsafe { libc::mincore(p.add(from * ps).cast(), n * ps, v.as_mut_ptr()) };
        assert_eq!(r, 0);
        v.iter().filter(|&&b| b & 1 != 0).count() * 4096 / ps
    };
    let sweep = |mem: &mut [u8], tag: u8| {
        for c in mem.chunks_mut(ps) {
            c[9] = tag;
        }
    };
    sweep(mem, 1);
    rt.lock(p as u64, 4 * ps as u64, true, true).unwrap();
    assert_eq!(
        rt.lock(p as u64, 16 * ps as u64, true, true),
        Err(libc::ENOMEM)
    );
    for tag in 2..4 {
        sweep(mem, tag);
        assert_eq!(resident(0, 4), 4, "pinned pages resident");
        assert!(resident(4, 12) < 12, "a refused lock pinned nothing");
    }
    rt.lock(p as u64, 4 * ps as u64, false, false).unwrap();
    sweep(mem, 4);
    sweep(mem, 5);
    assert_eq!(resident(0, 4), 0, "unpinned pages evicted");
    assert!(mem.chunks(ps).all(|c| c[9] == 5));
    let s = rt.stats();
    assert!(s.local_bytes_max <= 16 * ps as u64, "{s:?}");
    rt.free(p).unwrap();
}

/// Cell `c` of row `r` of a matrix with rows of `row` bytes.
fn cell(row: usize, r: usize, c: usize) -> u64 {
    ((r * row / 8 + c) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A matrix of `rows` rows of `row` bytes in rmem memory, every cell written ([`cell`]): its
/// address.
fn matrix(rt: &Runtime, ps: usize, row: usize, rows: usize) -> usize {
    let p = rt.alloc((rows * row).div_ceil(ps) * ps).unwrap() as usize;
    for r in 0..rows {
        for c in 0..row / 8 {
            // SAFETY: inside the allocation (row r, cell c), 8-byte aligned.
            unsafe { ((p + r * row + c * 8) as *mut u64).write(cell(row, r, c)) };
        }
    }
    p
}

/// An image read by columns (ImageMagick's blur: one pixel of each row, column after column)
/// faults down the pages in order, a stream, but uses a few pieces of each page. The pieces
/// a column touches fit the budget and serve the columns after it; fetched whole (and
/// prefetched whole, as a stream's pages are elsewhere), each column brought the whole image
/// again. Every pixel reads right, and the columns bring little more than their pieces.
#[test]
fn an_image_read_by_columns_fetches_pieces_not_the_image_per_column() {
    const PS: usize = 65536;
    // Rows of 16000 bytes (2000 pixels of 8 bytes): four or five rows per page.
    const ROW: usize = 16000;
    const ROWS: usize = 1024;
    const COLUMNS: usize = 24;
    // A quarter of the image's pages local: the 1024 pieces (4 MiB) a column touches fit, the
    // image (250 pages) does not.
    let local = 96;
    let rt = runtime(PS, local, 1024);
    let p = matrix(&rt, PS, ROW, ROWS);
    let at = |r: usize, c: usize| (p + r * ROW + c * 8) as *mut u64;
    let before = rt.stats();
    for c in 0..COLUMNS {
        for r in 0..ROWS {
            // SAFETY: as above.
            let v = unsafe { at(r, c).read() };
            assert_eq!(v, cell(ROW, r, c), "row {r} column {c}");
        }
    }
    let s = rt.stats();
    let fetched = s.bytes_fetched - before.bytes_fetched;
    let image = (ROWS * ROW) as u64;
    assert!(
        fetched < 2 * image,
        "{COLUMNS} columns fetched {fetched} bytes, the image is {image}: {s:?}"
    );
    assert!(s.local_bytes_max <= local * PS as u64, "{s:?}");
    rt.free(p as *mut u8).unwrap();
}

/// A matrix-vector product as OpenBLAS computes it: four rows at a time, each read in order,
/// rows of 23 KiB (under a page), so a page's first faults land on pieces away from one
/// another (four rows' starts) and look sparse. The rows are read whole: as half of a page's
/// pieces come it is made whole, which says so, and the stream of faults down the matrix then
/// fetches (and prefetches) whole pages; taken for sparse, every page came piece by piece.
#[test]
fn rows_read_four_at_a_time_come_as_whole_pages() {
    const PS: usize = 65536;
    const ROW: usize = 2896 * 8;
    const ROWS: usize = 1024;
    let rt = runtime(PS, 64, 1024);
    let p = matrix(&rt, PS, ROW, ROWS);
    let at = |r: usize, c: usize| (p + r * ROW + c * 8) as *mut u64;
    for pass in 0..3 {
        let before = rt.stats();
        for r in (0..ROWS).step_by(4) {
            for c in 0..2896 {
                for k in r..r + 4 {
                    // SAFETY: as above.
                    let v = unsafe { at(k, c).read() };
                    assert_eq!(v, cell(ROW, k, c), "row {k} cell {c}");
                }
            }
        }
        let s = rt.stats();
        let pieces = s.sub_page_fetches - before.sub_page_fetches;
        let whole = s.swap_ins - before.swap_ins;
        if pass > 0 {
            assert!(
                pieces * 4 < whole,
                "pass {pass}: {pieces} pieces and {whole} whole pages fetched: {s:?}"
            );
        }
    }
    rt.free(p as *mut u8).unwrap();
}
