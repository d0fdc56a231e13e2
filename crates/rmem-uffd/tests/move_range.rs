//! `Uffd::move_range` against the kernel: holes, pages shared copy-on-write with a fork()
//! child, and pages the kernel is swapping at the same moment (Linux 6.18 then reports EEXIST
//! for a page it has in fact moved).

use rmem_uffd::{Moved, Uffd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const PAGE: usize = 4096;

/// A private anonymous mapping of `pages` pages without huge pages.
fn map(pages: usize) -> u64 {
    // SAFETY: a fresh anonymous mapping; checked for failure below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: advising our own fresh mapping.
    unsafe { libc::madvise(p, pages * PAGE, libc::MADV_NOHUGEPAGE) };
    p as u64
}

fn advise(addr: u64, advice: libc::c_int) {
    // SAFETY: the callers pass pages of the test's own mappings.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, PAGE, advice) };
    assert_eq!(r, 0);
}

/// Present or swapped out, from /proc/self/pagemap.
fn populated(addr: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").unwrap();
    let mut e = [0u8; 8];
    f.read_exact_at(&mut e, addr / PAGE as u64 * 8).unwrap();
    u64::from_ne_bytes(e) & (3 << 62) != 0
}

fn open_with_move() -> Option<Uffd> {
    let uffd = Uffd::open_as(false)
        .or_else(|_| Uffd::open_as(true))
        .unwrap();
    if !uffd.has_move() {
        eprintln!("skipped: this kernel has no UFFDIO_MOVE (Linux 6.8 or later)");
        return None;
    }
    Some(uffd)
}

#[test]
fn move_range_fills_holes_with_zeros() {
    let Some(uffd) = open_with_move() else { return };
    let (src, dst) = (map(4), map(4));
    uffd.register_missing(dst, 4 * PAGE as u64).unwrap();
    // Pieces 0 and 2 written, 1 and 3 holes.
    for k in [0u64, 2] {
        // SAFETY: inside the 4-page source mapping.
        unsafe { std::ptr::write_bytes((src + k * PAGE as u64) as *mut u8, 0x5A, PAGE) };
    }
    assert_eq!(
        uffd.move_range(dst, src, 4 * PAGE as u64, false).unwrap(),
        Moved::All
    );
    for k in 0..4u64 {
        let d = dst + k * PAGE as u64;
        assert!(populated(d), "destination piece {k} missing");
        assert!(!populated(src + k * PAGE as u64), "source piece {k} left");
        let want = if k % 2 == 0 { 0x5A } else { 0 };
        // SAFETY: populated (checked above), so the read cannot block on the userfaultfd.
        let got = unsafe { std::slice::from_raw_parts(d as *const u8, PAGE) };
        assert!(got.iter().all(|&b| b == want), "piece {k}");
    }
}

/// After fork(), a page both processes map is shared copy-on-write and the kernel will not
/// move it (EBUSY). With `keep_unwritten` a range nobody wrote since the fork stays put; once
/// one piece is written the whole range moves (the shared pieces copied first), and the
/// child's copy of the page is untouched either way.
#[test]
fn move_range_copies_pieces_shared_with_a_fork_child_and_can_leave_unwritten_ones() {
    let Some(uffd) = open_with_move() else { return };
    const PIECES: u64 = 4;
    let len = PIECES * PAGE as u64;
    let (a, b, dst) = (
        map(PIECES as usize),
        map(PIECES as usize),
        map(PIECES as usize),
    );
    uffd.register_missing(dst, len).unwrap();
    for (m, v) in [(a, 0x11u8), (b, 0x22)] {
        // SAFETY: inside the test's own mappings.
        unsafe { std::ptr::write_bytes(m as *mut u8, v, len as usize) };
    }
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into `fds`.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only reads its memory, makes async-signal-safe calls and _exits.
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        let mut byte = 0u8;
        // SAFETY: waits for the parent, then checks its own copies of both ranges.
        unsafe {
            libc::read(fds[0], (&mut byte as *mut u8).cast(), 1);
            let same = |m: u64, v: u8| {
                std::slice::from_raw_parts(m as *const u8, len as usize)
                    .iter()
                    .all(|&x| x == v)
            };
            libc::_exit(if same(a, 0x11) && same(b, 0x22) { 0 } else { 1 });
        }
    }
    // Nobody wrote `a` since the fork: it stays.
    assert_eq!(
        uffd.move_range(dst, a, len, true).unwrap(),
        Moved::Unwritten
    );
    assert!(populated(a) && !populated(dst));
    // Without keep_unwritten it moves, copied.
    assert_eq!(uffd.move_range(dst, a, len, false).unwrap(), Moved::All);
    assert!(!populated(a));
    // SAFETY: populated by the move.
    let got = unsafe { std::slice::from_raw_parts(dst as *const u8, len as usize) };
    assert!(got.iter().all(|&x| x == 0x11));
    advise_all(dst, len);
    // One piece of `b` written since the fork: the whole range moves.
    // SAFETY: inside `b`.
    unsafe { ((b + 2 * PAGE as u64) as *mut u8).write(0x33) };
    assert_eq!(uffd.move_range(dst, b, len, true).unwrap(), Moved::All);
    for k in 0..PIECES {
        // SAFETY: populated by the move.
        let got = unsafe { ((dst + k * PAGE as u64) as *const u8).read() };
        assert_eq!(got, if k == 2 { 0x33 } else { 0x22 }, "piece {k}");
    }
    // SAFETY: one byte to the child's pipe, then reap it.
    let status = unsafe {
        libc::write(fds[1], [0u8].as_ptr().cast(), 1);
        let mut st = 0;
        libc::waitpid(child, &mut st, 0);
        st
    };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's copy changed"
    );
}

fn advise_all(addr: u64, len: u64) {
    // SAFETY: a range of the test's own mappings.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_DONTNEED) };
    assert_eq!(r, 0);
}

#[path = "../../../tests/rust/swap_file.rs"]
mod swap_file;
use swap_file::SwapFile;

/// The race that made Linux 6.18 report EEXIST for a moved page: the source page is paged
/// out, and another thread faults it back in while it is being moved. Every move must
/// succeed and carry the page's contents.
#[test]
fn move_range_survives_the_source_being_swapped_meanwhile() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to turn on a swap file of its own (CI runs as root)");
        return;
    }
    let Some(uffd) = open_with_move() else { return };
    let _swap = SwapFile::on(64 << 20);
    const PAGES: usize = 64;
    let (src, dst) = (map(PAGES), map(PAGES));
    uffd.register_missing(dst, (PAGES * PAGE) as u64).unwrap();
    let target = Arc::new(AtomicU64::new(0));
    let go = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let toucher = {
        let (target, go, stop) = (target.clone(), go.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                if go.load(Ordering::Acquire) {
                    let a = target.load(Ordering::Acquire);
                    // SAFETY: a page of the source mapping; unregistered, so a read after the
                    // move just maps a zero page.
                    unsafe { std::ptr::read_volatile(a as *const u8) };
                    go.store(false, Ordering::Release);
                }
                std::hint::spin_loop();
            }
        })
    };
    for i in 0..3000u64 {
        let k = i % PAGES as u64;
        let (s, d) = (src + k * PAGE as u64, dst + k * PAGE as u64);
        // SAFETY: a page of the source mapping.
        unsafe {
            std::ptr::write_bytes(s as *mut u8, (i % 251) as u8 | 1, PAGE);
            (s as *mut u64).write(i);
        }
        advise(s, libc::MADV_PAGEOUT);
        target.store(s, Ordering::Release);
        go.store(true, Ordering::Release);
        for _ in 0..(i % 200) * 10 {
            std::hint::spin_loop();
        }
        let moved = uffd
            .move_range(d, s, PAGE as u64, false)
            .unwrap_or_else(|e| panic!("move {i}: {e}: {:?}", std::error::Error::source(&e)));
        assert_eq!(moved, Moved::All);
        while go.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        assert!(
            populated(d),
            "move {i}: destination missing after a successful move"
        );
        // SAFETY: populated (checked above), so the read cannot block on the userfaultfd.
        let got = unsafe { std::slice::from_raw_parts(d as *const u8, PAGE) };
        assert_eq!(
            u64::from_ne_bytes(got[..8].try_into().unwrap()),
            i,
            "move {i}"
        );
        assert!(
            got[8..].iter().all(|&b| b == (i % 251) as u8 | 1),
            "move {i}"
        );
        advise(d, libc::MADV_DONTNEED);
        advise(s, libc::MADV_DONTNEED);
    }
    stop.store(true, Ordering::Release);
    toucher.join().unwrap();
}
