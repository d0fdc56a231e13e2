//! A direct region's links cut under it (a proxy in front of a real server closes every
//! connection it carries, the server and its sessions stay): an unnamed region attaches
//! alone, so its links come back and the requests they carried are sent again, with every
//! byte right; a named region's links attach shared, so the cut ends it with a clear error
//! (EIO), never a hang. Real server, in-process; every wait bounded.

mod common;
#[path = "common/proxy.rs"]
mod proxy;
use proxy::Proxy;
use rmem_client::config::Placement;
use rmem_client::direct::DirectRegion;
use rmem_client::store::codec::Redundancy;
use std::time::{Duration, Instant};

const TOKEN: &[u8] = b"region-links-token";

fn config(server: &str) -> rmem_client::Config {
    rmem_client::Config {
        servers: vec![server.to_string()],
        token: TOKEN.to_vec(),
        page_size: 4096,
        placement: Placement::Stripe,
        redundancy: Some(Redundancy::None),
        encrypt: Some(false),
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

#[test]
fn an_unnamed_region_comes_back_from_cut_links_with_every_byte() {
    let proxy = Proxy::start(common::server(TOKEN, 64 << 20));
    let r = DirectRegion::create(&config(&proxy.addr), 1 << 20, None).unwrap();
    let mut mine = vec![0u8; 1 << 20];
    let mut seed = 0x1234_5678_9abc_def1u64;
    let until = Instant::now() + Duration::from_secs(3);
    let (mut cuts, mut ops) = (0, 0u64);
    while Instant::now() < until {
        // Cuts land between calls, and from another thread in the middle of one.
        if ops % 40 == 0 {
            cuts += proxy.cut();
        } else if ops % 40 == 20 {
            std::thread::scope(|sc| {
                let cutter = sc.spawn(|| {
                    std::thread::sleep(Duration::from_micros(300));
                    proxy.cut()
                });
                let mut all = vec![0u8; 1 << 20];
                r.read(0, &mut all).unwrap();
                assert!(all == mine, "the whole region read across a cut");
                cuts += cutter.join().unwrap();
            });
        }
        ops += 1;
        let len = 1 + rnd(&mut seed) % 20_000;
        let off = rnd(&mut seed) % ((1 << 20) - len + 1);
        let at = off as usize..(off + len) as usize;
        if rnd(&mut seed).is_multiple_of(2) {
            let v = rnd(&mut seed) as u8;
            let data: Vec<u8> = (0..len).map(|i| v ^ i as u8).collect();
            r.write(off, &data).unwrap();
            mine[at].copy_from_slice(&data);
        } else {
            let mut got = vec![0u8; len as usize];
            r.read(off, &mut got).unwrap();
            assert!(got == mine[at], "{len} bytes at {off} after {cuts} cuts");
        }
    }
    assert!(cuts >= 2, "the links were cut ({cuts} times)");
    let mut all = vec![0u8; 1 << 20];
    r.read(0, &mut all).unwrap();
    assert!(all == mine);
    eprintln!("{ops} calls, {cuts} links cut");
}

#[test]
fn a_named_region_ends_with_eio_when_its_link_is_cut() {
    let dir = std::env::temp_dir().join(format!("rmem-region-links-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var("XDG_RUNTIME_DIR", &dir);
    let proxy = Proxy::start(common::server(TOKEN, 64 << 20));
    let r = DirectRegion::create(&config(&proxy.addr), 1 << 20, Some("cut")).unwrap();
    r.write(100, b"before the cut").unwrap();
    assert!(proxy.cut() >= 1);
    let t = Instant::now();
    let mut buf = [0u8; 14];
    let err = loop {
        // The cut is seen at the next call (or the ticker's ping): within a few calls.
        match r.read(100, &mut buf) {
            Ok(()) => assert!(t.elapsed() < Duration::from_secs(10), "never failed"),
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));
    drop(r);
    let _ = std::fs::remove_dir_all(&dir);
}
