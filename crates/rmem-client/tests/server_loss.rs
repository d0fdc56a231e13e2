//! A server lost while write-backs wait on it, driven call by call as the pager drives the
//! store: it stops answering (a proxy in front of a real server that holds every byte), its
//! requests time out (the server is in an outage, its reads fail over), then it is gone (the
//! proxy closes its listener, so the reconnect is refused and the server is buried). Every
//! write-back still completes exactly once, through `poll`, and while one is owed the store
//! says something is in flight: otherwise the pager, with faults waiting on those pages,
//! would find nothing to wait for and stop ("pager stuck"). Real servers, in-process; every
//! wait is bounded.

mod common;
#[path = "common/proxy.rs"]
mod proxy;
use proxy::Proxy;
use rmem_client::config::Placement;
use rmem_client::store::cluster::Layout;
use rmem_client::store::codec::Redundancy;
use rmem_client::store::remote::{RemoteStore, Timing};
use rmem_client::store::{Completion, PageStore};
use rmem_client::PageIndex;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

const PS: usize = 4096;
const TOKEN: &[u8] = b"server-loss-token";
/// A request unanswered this long puts its server in an outage.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(150);

fn server() -> String {
    common::server(TOKEN, 64 << 20)
}

fn page(n: u64, round: u64) -> Vec<u8> {
    (0..PS)
        .map(|i| (n as usize * 7 + i / 8 + round as usize * 13) as u8)
        .collect()
}

/// Which of the pager's calls finds the reconnect refused and buries the server.
#[derive(Clone, Copy, Debug)]
enum BuriedBy {
    /// `tick`, as after the pager's idle sleep.
    Tick,
    /// `flush`, as after a fault. The writes it leaves to place are stored degraded in the
    /// next `poll`, with no answer to count them by: that poll must count them all the same.
    Flush,
}

/// The completions of one poll: pages stored, pages fetched with their contents.
#[derive(Default)]
struct Done {
    stored: HashMap<u64, u32>,
    fetched: HashMap<u64, Vec<u8>>,
}

impl Done {
    /// Take what `s` finished; it must count every completion it delivers (a caller waits
    /// for the next event when it says none: `rmem nbd` once hung so).
    fn poll(&mut self, s: &mut RemoteStore) {
        let mut delivered = 0;
        let counted = s
            .poll(&mut |c| {
                delivered += 1;
                match c {
                    Completion::Stored { page } => *self.stored.entry(page.0).or_default() += 1,
                    Completion::Fetched { page, data } => {
                        assert!(
                            self.fetched.insert(page.0, data.to_vec()).is_none(),
                            "page {} fetched twice",
                            page.0
                        );
                    }
                }
            })
            .unwrap();
        assert_eq!(
            counted, delivered,
            "poll's count against the completions it delivered"
        );
    }
}

impl Done {
    /// Poll, flush and tick until `until` holds; `what` names the wait if it takes over 10 s.
    fn drive_until(
        &mut self,
        s: &mut RemoteStore,
        what: &str,
        mut until: impl FnMut(&Done, &RemoteStore) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !until(self, s) {
            assert!(Instant::now() < deadline, "{what}");
            self.poll(s);
            s.flush().unwrap();
            s.tick(Instant::now()).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Poll and flush for `d`, with no tick: no request times out meanwhile.
    fn poll_for(&mut self, s: &mut RemoteStore, d: Duration) {
        let t = Instant::now();
        while t.elapsed() < d {
            self.poll(s);
            s.flush().unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A store over `servers` under `redundancy`, placing by priority; requests time out after
/// [`REQUEST_TIMEOUT`], connecting gives up after `connect`, reconnecting after `reconnect`.
fn store_over(
    servers: &[String],
    redundancy: &str,
    connect: Duration,
    reconnect: Duration,
) -> RemoteStore {
    let timing = Timing {
        connect,
        request: REQUEST_TIMEOUT,
        heartbeat: Duration::from_secs(5),
        reconnect,
    };
    let layout = Layout {
        placement: Placement::Priority,
        redundancy: Redundancy::parse(redundancy).unwrap(),
        encrypt: false,
    };
    RemoteStore::connect_with(servers, TOKEN, PS, layout, timing).unwrap()
}

/// Pages `0..n` written as round 0, every write-back acknowledged.
fn write_round_0(s: &mut RemoteStore, n: u64, what: &str) {
    for p in 0..n {
        s.store(PageIndex(p), &page(p, 0)).unwrap();
    }
    s.flush().unwrap();
    Done::default().drive_until(s, &format!("{what}: first writes not stored"), |d, _| {
        d.stored.len() == n as usize
    });
}

/// `n` servers, the last behind a proxy; pages written, then written again and `read` other
/// pages fetched while the proxy stalls; it is killed, a tick finds the requests timed out,
/// and `by` buries it. Every write-back and fetch completes once, the store never says nothing
/// is in flight while one is owed, and every page reads back as last written.
fn write_backs_complete_after_a_loss(redundancy: &str, n: usize, read: u64, by: BuriedBy) {
    let proxy = Proxy::start(server());
    let mut servers: Vec<String> = (1..n).map(|_| server()).collect();
    servers.push(proxy.addr.clone());
    let what = format!("{redundancy} on {n} servers, {read} reads, buried by {by:?}");
    let mut s = store_over(
        &servers,
        redundancy,
        Duration::from_secs(1),
        Duration::from_secs(5),
    );
    let written = 64u64;
    let all = written + read;
    write_round_0(&mut s, all, &what);

    proxy.stall();
    let mut done = Done::default();
    for p in 0..written {
        s.store(PageIndex(p), &page(p, 1)).unwrap();
    }
    for p in written..all {
        s.fetch(PageIndex(p)).unwrap();
    }
    s.flush().unwrap();
    // Past the request timeout: the live servers' answers are taken, so each write-back
    // waits on the stalled server's piece alone.
    done.poll_for(&mut s, REQUEST_TIMEOUT * 2);
    // Gone before its silence is noticed, as when the process was killed meanwhile: the
    // first tick finds the timeout (an outage: reads fail over), the next call's reconnect is
    // refused and buries it.
    proxy.kill();
    s.tick(Instant::now()).unwrap();
    match by {
        BuriedBy::Tick => s.tick(Instant::now()).unwrap(),
        BuriedBy::Flush => s.flush().unwrap(),
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let owed = (written as usize - done.stored.len()) + (read as usize - done.fetched.len());
        if owed == 0 {
            break;
        }
        // What the pager checks before it calls itself stuck.
        assert!(
            s.in_flight() > 0,
            "{what}: {owed} completions owed ({} of {written} write-backs, {} of {read} \
             fetches done) and the store says nothing is in flight",
            done.stored.len(),
            done.fetched.len()
        );
        assert!(
            Instant::now() < deadline,
            "{what}: {owed} completions never came"
        );
        done.poll(&mut s);
        s.flush().unwrap();
        s.tick(Instant::now()).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        done.stored.values().all(|&k| k == 1),
        "{what}: a write-back completed twice"
    );
    for p in written..all {
        assert!(done.fetched[&p] == page(p, 0), "{what}: page {p} wrong");
    }
    // Every page back, as last written, from what is left.
    for p in 0..all {
        s.fetch(PageIndex(p)).unwrap();
    }
    s.flush().unwrap();
    let mut back = Done::default();
    back.drive_until(&mut s, &format!("{what}: pages not read back"), |d, _| {
        d.fetched.len() == all as usize
    });
    for p in 0..all {
        let round = u64::from(p < written);
        assert!(
            back.fetched[&p] == page(p, round),
            "{what}: page {p} is not round {round}"
        );
    }
    assert_eq!(
        s.counters().unwrap().servers_lost.load(Relaxed),
        1,
        "{what}"
    );
}

/// No spare server: each orphaned write is stored degraded (one piece fewer) and completes
/// at once, in the call that buried the server.
#[test]
fn ec_2_1_on_three_servers_completes_write_backs_of_a_server_buried_by_tick() {
    write_backs_complete_after_a_loss("ec:2+1", 3, 32, BuriedBy::Tick);
}

#[test]
fn ec_2_1_on_three_servers_completes_write_backs_of_a_server_buried_by_flush() {
    write_backs_complete_after_a_loss("ec:2+1", 3, 0, BuriedBy::Flush);
}

#[test]
fn replicas_2_on_two_servers_completes_write_backs_of_a_server_buried_by_tick() {
    write_backs_complete_after_a_loss("replicas:2", 2, 32, BuriedBy::Tick);
}

#[test]
fn replicas_2_on_two_servers_completes_write_backs_of_a_server_buried_by_flush() {
    write_backs_complete_after_a_loss("replicas:2", 2, 0, BuriedBy::Flush);
}

/// A spare server: the orphaned writes go there and complete on its answers.
#[test]
fn replicas_2_on_three_servers_moves_write_backs_of_a_buried_server() {
    write_backs_complete_after_a_loss("replicas:2", 3, 32, BuriedBy::Tick);
}

/// Two copies, each server behind a proxy. Both stall: the reads asked of each are asked of
/// the other too (the first server gone silent for 100 ms, or in an outage), and the second
/// is then killed. The only copy left is on the stalled server, still within its
/// reconnection window: the fetches wait for it and complete, right, once it answers again.
/// (They were taken as lost, "too few of its pieces could be read back", stopping the
/// program without naming the stalled server: a full suite run saw it when two servers were
/// killed at once.)
#[test]
fn a_read_failed_over_to_a_server_that_dies_waits_for_the_stalled_copy() {
    let (a, b) = (Proxy::start(server()), Proxy::start(server()));
    let servers = vec![a.addr.clone(), b.addr.clone()];
    let mut s = store_over(
        &servers,
        "replicas:2",
        Duration::from_millis(200),
        Duration::from_secs(10),
    );
    let pages = 16u64;
    write_round_0(&mut s, pages, "replicas:2 behind proxies");

    // Reads spread over both copies, both silent: each read is asked of the other copy.
    a.stall();
    b.stall();
    let mut done = Done::default();
    for p in 0..pages {
        s.fetch(PageIndex(p)).unwrap();
    }
    s.flush().unwrap();
    done.poll_for(&mut s, REQUEST_TIMEOUT * 2);
    s.tick(Instant::now()).unwrap();
    s.flush().unwrap();
    assert!(
        done.fetched.is_empty(),
        "{} read from stalled servers",
        done.fetched.len()
    );
    let failovers = s.counters().unwrap().failovers.load(Relaxed);
    assert!(failovers > 0, "no read failed over");
    // Gone before it answers them.
    b.kill();
    done.drive_until(&mut s, "the killed server was never buried", |_, s| {
        s.counters().unwrap().servers_lost.load(Relaxed) > 0
    });
    // The first wakes: every fetch completes from it.
    std::thread::sleep(Duration::from_millis(50));
    a.resume();
    done.drive_until(
        &mut s,
        "the fetches did not all complete after the first server woke",
        |d, _| d.fetched.len() == pages as usize,
    );
    for p in 0..pages {
        assert!(done.fetched[&p] == page(p, 0), "page {p} wrong");
    }
    assert_eq!(s.counters().unwrap().servers_lost.load(Relaxed), 1);
}

/// A page a piece short since a server was lost (here: down at the start, so every page is
/// stored on the two others) is lost with the next server, as the layout says; the error
/// names that server and says the page had already lost a piece, so that a user who sees
/// `ec:2+1` stop at what looks like its first loss learns why.
#[test]
fn a_second_loss_names_the_pieces_lost_before() {
    let proxy = Proxy::start(server());
    // Nothing listens there: down at the start, the layout goes on without it.
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let servers = vec![proxy.addr.clone(), server(), down];
    let mut s = store_over(
        &servers,
        "ec:2+1",
        Duration::from_millis(200),
        Duration::from_millis(200),
    );
    write_round_0(&mut s, 8, "ec:2+1 a piece short");
    proxy.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = 'lost: loop {
        assert!(Instant::now() < deadline, "the pages were never lost");
        for p in 0..8 {
            if let Err(e) = s.fetch(PageIndex(p)) {
                break 'lost e.to_string();
            }
        }
        if let Err(e) = s.flush().and_then(|()| s.poll(&mut |_| {}).map(drop)) {
            break 'lost e.to_string();
        }
        if let Err(e) = s.tick(Instant::now()) {
            break 'lost e.to_string();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(err.contains(&proxy.addr), "the lost server unnamed: {err}");
    assert!(
        err.contains("1 of their pieces had been lost with a server before"),
        "the earlier loss unsaid: {err}"
    );
}
