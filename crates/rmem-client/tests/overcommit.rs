//! Overcommit in the store: capacity is taken when a page is written, a server that answers
//! `Full` sends the page to another one, and only when every server refused it is the store
//! full, with an error naming each server and its capacity. Real servers, in-process; every
//! wait is bounded.

mod common;
use rmem_client::config::Placement;
use rmem_client::store::remote::{RemoteStore, Timing};
use rmem_client::store::{Completion, PageStore, StoreError};
use rmem_client::PageIndex;
use std::time::{Duration, Instant};

const PS: usize = 4096;
const TOKEN: &[u8] = b"overcommit-token";

fn server(capacity_pages: u64) -> String {
    common::server(TOKEN, capacity_pages * PS as u64)
}

fn store(servers: &[String]) -> RemoteStore {
    let t = Duration::from_secs(5);
    let timing = Timing {
        connect: t,
        request: t,
        heartbeat: t,
        reconnect: t,
    };
    RemoteStore::connect(servers, TOKEN, PS, Placement::Priority, timing).unwrap()
}

fn page(n: u64) -> Vec<u8> {
    (0..PS).map(|i| (n as usize * 7 + i / 8) as u8).collect()
}

/// A completion: the page, and its data if it was fetched.
type Done = (u64, Option<Vec<u8>>);

/// Poll until `want` completions arrived (or an error), at most 10 s.
fn complete(s: &mut RemoteStore, want: usize) -> Result<Vec<Done>, StoreError> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} completions",
            got.len()
        );
        s.poll(&mut |c| match c {
            Completion::Stored { page } => got.push((page.0, None)),
            Completion::Fetched { page, data } => got.push((page.0, Some(data.to_vec()))),
        })?;
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(got)
}

#[test]
fn a_full_server_sends_pages_to_the_next_and_a_swap_is_split() {
    let (tiny, big) = (server(2), server(64));
    let mut s = store(&[tiny.clone(), big.clone()]);
    // Pages 0 and 1 fill the tiny server, which nobody knows yet: page 2's swap goes there
    // with page 0's fetch, is refused, and becomes a write to the big one and a fetch.
    for p in 0..2 {
        s.store(PageIndex(p), &page(p)).unwrap();
    }
    s.flush().unwrap();
    assert_eq!(complete(&mut s, 2).unwrap().len(), 2);
    s.swap(PageIndex(2), &page(2), PageIndex(0)).unwrap();
    let got = complete(&mut s, 2).unwrap();
    assert!(got.contains(&(2, None)), "{got:?}");
    assert!(got.contains(&(0, Some(page(0)))), "{got:?}");
    // Later pages find the tiny server full and spill as well.
    for p in 3..20 {
        s.store(PageIndex(p), &page(p)).unwrap();
    }
    s.flush().unwrap();
    assert_eq!(complete(&mut s, 17).unwrap().len(), 17);
    for p in 0..20 {
        let want = if p < 2 { &tiny } else { &big };
        assert_eq!(s.server_of(PageIndex(p)), Some(want.as_str()), "page {p}");
        s.fetch(PageIndex(p)).unwrap();
        assert_eq!(complete(&mut s, 1).unwrap(), vec![(p, Some(page(p)))]);
    }
    assert_eq!(
        s.used_per_server(),
        vec![(tiny, 2 * PS as u64), (big, 18 * PS as u64)]
    );
}

#[test]
fn every_server_full_is_an_error_naming_each_with_its_capacity() {
    let (a, b) = (server(2), server(3));
    let mut s = store(&[a.clone(), b.clone()]);
    for p in 0..6 {
        s.store(PageIndex(p), &page(p)).unwrap();
    }
    s.flush().unwrap();
    let err = complete(&mut s, 6).expect_err("six pages fit in five");
    assert!(
        matches!(err, StoreError::AllFull { page: 5, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    for want in [
        format!("{a} (server {a} full: capacity 8192 bytes"),
        format!("{b} (server {b} full: capacity 12288 bytes"),
    ] {
        assert!(msg.contains(&want), "{msg}");
    }
    // What to do about it is the pager's to say (a direct region's caller has no
    // allocations to overcommit): the store states the fact.
    assert!(!msg.contains("overcommit"), "{msg}");
    let paged = rmem_client::pager::PagerError::from(err).to_string();
    assert!(
        paged.starts_with(&msg) && paged.contains("--no-overcommit"),
        "{paged}"
    );
}
