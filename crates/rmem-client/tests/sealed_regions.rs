//! Direct regions over layouts the servers cannot serve byte ranges of (issue 13 item 8: "the
//! same redundancy and encryption as paged memory"): replicas, erasure coding and encryption,
//! through the pager's page store. Eight threads write and read random unaligned ranges over
//! stripes that share pages with their neighbours (so two threads patch one page at once),
//! each against a reference copy, then the whole region is read back against all of them. A
//! region that fills its servers gets ENOSPC for the page that does not fit and keeps the
//! others. Real servers, in-process; every run bounded by its seconds.

mod common;
use rmem_client::config::Placement;
use rmem_client::direct::DirectRegion;
use rmem_client::store::codec::Redundancy;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

const TOKEN: &[u8] = b"sealed-regions-token";
const THREADS: usize = 8;

fn config(
    servers: usize,
    redundancy: &str,
    encrypt: bool,
    page_size: usize,
) -> rmem_client::Config {
    rmem_client::Config {
        servers: (0..servers)
            .map(|_| common::server(TOKEN, 256 << 20))
            .collect(),
        token: TOKEN.to_vec(),
        page_size,
        placement: Placement::Stripe,
        redundancy: Some(Redundancy::parse(redundancy).unwrap()),
        encrypt: Some(encrypt),
        connect_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

fn rnd(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Each thread's stripe: `stripe` bytes from `t * stripe`, a length that is no multiple of
/// the page, so that neighbouring threads share the pages at their borders.
fn stress(r: &DirectRegion, stripe: u64, seconds: f64) -> Vec<Vec<u8>> {
    let page = r.page_size() as u64;
    let refs: Vec<Vec<u8>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..THREADS as u64)
            .map(|t| {
                sc.spawn(move || {
                    let base = t * stripe;
                    let mut mine = vec![0u8; stripe as usize];
                    let mut seed = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                    let until = Instant::now() + Duration::from_secs_f64(seconds);
                    let mut ops = 0u64;
                    while Instant::now() < until || ops < 64 {
                        ops += 1;
                        let len = 1 + rnd(&mut seed) % (2 * page + 17).min(stripe);
                        let off = rnd(&mut seed) % (stripe - len + 1);
                        let at = off as usize..(off + len) as usize;
                        match rnd(&mut seed) % 4 {
                            0 | 1 => {
                                let v = rnd(&mut seed) as u8;
                                let data: Vec<u8> =
                                    (0..len).map(|i| v.wrapping_add(i as u8)).collect();
                                r.write(base + off, &data).unwrap();
                                mine[at].copy_from_slice(&data);
                            }
                            2 => {
                                let mut got = vec![0xa5u8; len as usize];
                                r.read(base + off, &mut got).unwrap();
                                assert!(got == mine[at], "thread {t}: {len} bytes at {off}");
                            }
                            _ => {
                                // A list of two ranges: one written, one read.
                                let wlen = (len / 2).max(1);
                                let data = vec![rnd(&mut seed) as u8; wlen as usize];
                                r.write_ranges(&[(base + off, &data[..])]).unwrap();
                                mine[off as usize..(off + wlen) as usize].copy_from_slice(&data);
                                let mut got = vec![0u8; len as usize];
                                r.read_ranges(&mut [(base + off, &mut got[..])]).unwrap();
                                assert!(got == mine[at], "thread {t}: list at {off}");
                            }
                        }
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = vec![0u8; r.size() as usize];
    r.read(0, &mut all).unwrap();
    for (t, mine) in refs.iter().enumerate() {
        let at = t * stripe as usize;
        assert!(
            all[at..at + stripe as usize] == mine[..],
            "stripe {t} read whole differs from its reference"
        );
    }
    refs
}

#[test]
fn sealed_and_coded_layouts_keep_every_byte_from_8_threads() {
    for (servers, layout, encrypt, ps) in [
        (3, "replicas:2", true, 64 << 10),
        (3, "ec:2+1", false, 64 << 10),
        (4, "ec:2+2", true, 16 << 10),
        (2, "none", true, 4096),
    ] {
        let c = config(servers, layout, encrypt, ps);
        let stripe = (ps as u64) * 3 / 2 + 13;
        let r = DirectRegion::create(&c, stripe * THREADS as u64, None)
            .unwrap_or_else(|e| panic!("{layout}: {e}"));
        stress(&r, stripe, 1.0);
        let st = r.stats();
        assert!(st.bytes_sent.load(Relaxed) > 0 && st.bytes_fetched.load(Relaxed) > 0);
        eprintln!(
            "{layout}{}: {} requests, {} bytes fetched, {} sent",
            if encrypt { ", encrypted" } else { "" },
            st.requests.load(Relaxed),
            st.bytes_fetched.load(Relaxed),
            st.bytes_sent.load(Relaxed)
        );
    }
}

#[test]
fn a_read_of_a_sealed_page_moves_one_piece_and_a_never_written_page_nothing() {
    let c = config(3, "replicas:2", true, 64 << 10);
    let r = DirectRegion::create(&c, 1 << 20, None).unwrap();
    let mut got = [7u8; 100];
    r.read(5000, &mut got).unwrap();
    assert_eq!(got, [0u8; 100], "a never written range reads as zeros");
    assert_eq!(r.stats().requests.load(Relaxed), 0, "with no request");
    r.write(5000, &[9u8; 100]).unwrap();
    let before = r.stats().bytes_fetched.load(Relaxed);
    r.read(5000, &mut got).unwrap();
    assert_eq!(got, [9u8; 100]);
    assert_eq!(
        r.stats().bytes_fetched.load(Relaxed) - before,
        4096,
        "100 bytes inside one piece read that piece alone"
    );
}

/// A named region under a sealed layout is served by its creator: an opener (here in the same
/// process, through the socket as another process would) reads what the creator wrote and
/// writes what it reads back; a link sending a malformed request is closed and nothing else is
/// disturbed; once the creator frees the region, the opener's calls fail (EIO) saying so.
#[test]
fn a_named_region_under_a_sealed_layout_is_served_by_its_creator() {
    use std::io::{Read, Write};
    let dir = std::env::temp_dir().join(format!("rmem-sealed-regions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var("XDG_RUNTIME_DIR", &dir);
    let c = config(2, "replicas:2", true, 4096);
    let creator = DirectRegion::create(&c, 1 << 20, Some("sealed")).unwrap();
    creator.write(10_000, &[5u8; 9000]).unwrap();
    let timing = rmem_client::store::remote::Timing::of(&c);
    let opener = DirectRegion::open("sealed", timing).unwrap();
    assert_eq!((opener.size(), opener.page_size()), (1 << 20, 4096));
    let mut got = vec![0u8; 9002];
    opener.read(9_999, &mut got).unwrap();
    assert!(got[0] == 0 && got[9001] == 0 && got[1..9001].iter().all(|&b| b == 5));
    opener.write(12_345, b"from the opener").unwrap();
    assert!(opener.stats().requests.load(Relaxed) >= 4);
    // A hostile link: a request of an unknown kind. It is closed; the opener goes on.
    let mut bad =
        std::os::unix::net::UnixStream::connect(dir.join("rmem-regions/.sealed")).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    bad.write_all(&[9u8; 25]).unwrap();
    let mut sink = [0u8; 16];
    assert_eq!(
        bad.read(&mut sink).unwrap(),
        0,
        "the malformed link was not closed"
    );
    let mut back = [0u8; 15];
    creator.read(12_345, &mut back).unwrap();
    assert_eq!(&back, b"from the opener");
    opener.read(12_345, &mut back).unwrap();
    assert_eq!(&back, b"from the opener");
    // A link that sends requests faster than it reads the answers (here: never): the
    // creator stops reading it once its queue is full, and still frees the region at once.
    let mut greedy =
        std::os::unix::net::UnixStream::connect(dir.join("rmem-regions/.sealed")).unwrap();
    greedy
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut asked = 0u64;
    for op in 1..=20_000u64 {
        let mut f = Vec::with_capacity(25);
        f.extend_from_slice(&op.to_le_bytes());
        f.extend_from_slice(&(op % 256).to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&4096u32.to_le_bytes());
        f.push(0);
        if greedy.write_all(&f).is_err() {
            break; // the creator stopped reading: what is wanted
        }
        asked = op;
    }
    assert!(asked > 100, "the greedy link sent only {asked} requests");
    std::thread::sleep(Duration::from_millis(300));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(creator);
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("freeing the region waited on a link that reads nothing");
    let e = opener.read(0, &mut back).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert!(e.to_string().contains("creator"), "{e}");
    assert!(!dir.join("rmem-regions/sealed").exists());
    assert!(!dir.join("rmem-regions/.sealed").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two servers of 1 MiB each, pages of 64 KiB in two encrypted copies.
fn small_servers() -> rmem_client::Config {
    rmem_client::Config {
        servers: (0..2).map(|_| common::server(TOKEN, 1 << 20)).collect(),
        token: TOKEN.to_vec(),
        page_size: 64 << 10,
        placement: Placement::Stripe,
        redundancy: Some(Redundancy::parse("replicas:2").unwrap()),
        encrypt: Some(true),
        connect_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

#[test]
fn a_sealed_region_on_full_servers_refuses_the_write_and_keeps_what_it_had() {
    let c = small_servers();
    let r = DirectRegion::create(&c, 8 << 20, None).unwrap();
    let page = 64 << 10;
    let mut written = 0u64;
    let err = loop {
        let data = vec![(written / page) as u8 + 1; page as usize];
        match r.write(written, &data) {
            Ok(()) => written += page,
            Err(e) => break e,
        }
        assert!(written < 8 << 20, "1 MiB servers took 8 MiB");
    };
    eprintln!("after {written} bytes: {err}");
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(written > 0);
    // What was written before is still there, and the region still answers.
    for p in 0..written / page {
        let mut got = vec![0u8; page as usize];
        r.read(p * page, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == p as u8 + 1), "page {p}");
    }
}

/// Servers that fill after the region learnt their room (another client took it): the
/// servers refuse the page, so the store gives it up. The region ends (EIO on that write and
/// every later call) and says why in its own words: the pager's advice (`--no-overcommit`,
/// about a program's allocations) is no help to a region's caller.
#[test]
fn a_sealed_region_whose_servers_fill_behind_it_ends_saying_why() {
    let c = small_servers();
    let page = 64 << 10;
    let a = DirectRegion::create(&c, 8 << 20, None).unwrap();
    a.write(0, &vec![1u8; page as usize]).unwrap();
    let b = DirectRegion::create(&c, 8 << 20, None).unwrap();
    let mut taken = 0u64;
    while b.write(taken, &vec![2u8; page as usize]).is_ok() {
        taken += page;
        assert!(taken < 8 << 20, "1 MiB servers took 8 MiB");
    }
    let err = a.write(page, &vec![3u8; page as usize]).unwrap_err();
    eprintln!("after {taken} bytes taken by another region: {err}");
    let msg = err.to_string();
    assert!(
        msg.contains("every memory server is full") && !msg.contains("overcommit"),
        "{msg}"
    );
    assert_eq!(err.errno(), libc::EIO, "{err}");
    let later = a.read(0, &mut [0u8; 16]).unwrap_err();
    assert!(
        later.to_string().contains("every memory server is full"),
        "{later}"
    );
}
