//! Drains move pages server to server (`Request::Pull`): with real servers in-process, every
//! page reads back as last written whether its move was pulled, refused and done through the
//! client, or overtaken by a write-back; the drained server ends with nothing.

use super::*;
use crate::store::PageStore;
use rmem_proto::{parse_header, Op, HEADER_LEN};
use rmem_server::{Server, ServerConfig, ServerState};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

const PS: usize = 4096;
const TOKEN: &[u8] = b"pull-test-token";

fn server() -> (String, Arc<ServerState>) {
    let s = Server::bind(ServerConfig::loopback(64 << 20, TOKEN)).unwrap();
    let (addr, state) = (s.local_addr().to_string(), s.state());
    s.spawn();
    (addr, state)
}

/// What a test proxy does besides passing frames both ways.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing else: it goes away only when its flag is set.
    Pass,
    /// Answers every pull as refused (the server behind it stored the pages, which is
    /// harmless: the client never counts on them): a server that cannot reach the one it
    /// should pull from.
    RefusePulls,
    /// Goes away the moment a pull reaches it: a taking server killed mid-drain.
    DieAtFirstPull,
    /// Holds each answer to a read 1 ms: reads stay in flight while other work goes on.
    SlowReads,
}

/// A proxy to `real`, and the flag that kills it: once set (by the test, or by the proxy
/// under [`Mode::DieAtFirstPull`]) every link through it is closed and nothing listens there
/// any more (a server killed).
fn proxy(real: String, mode: Mode) -> (String, Arc<std::sync::atomic::AtomicBool>) {
    proxy_on("127.0.0.1:0", real, mode)
}

/// [`proxy`] listening on `addr` (a killed proxy's, to bring its server back there).
fn proxy_on(addr: &str, real: String, mode: Mode) -> (String, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::AtomicBool;
    let l = TcpListener::bind(addr).unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let dead = Arc::new(AtomicBool::new(false));
    let flag = dead.clone();
    std::thread::spawn(move || {
        let mut links: Vec<TcpStream> = Vec::new();
        while !flag.load(Relaxed) {
            let Ok((client, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            };
            client.set_nonblocking(false).unwrap();
            let up = TcpStream::connect(&real).unwrap();
            for (from, to, upstream) in [(&client, &up, true), (&up, &client, false)] {
                let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                let dead = flag.clone();
                std::thread::spawn(move || pump(from, to, mode, upstream, &dead));
            }
            links.extend([client, up]);
        }
        for s in links {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    });
    (addr, dead)
}

/// Frames from `from` to `to` (`upstream`: the client's requests) as `mode` says.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    mode: Mode,
    upstream: bool,
    dead: &std::sync::atomic::AtomicBool,
) {
    let mut hdr = [0u8; HEADER_LEN];
    let mut body = Vec::new();
    let mut out = Vec::new();
    while from.read_exact(&mut hdr).is_ok() {
        let h = parse_header(&hdr, u32::MAX).unwrap().unwrap();
        body.resize(h.len as usize, 0);
        if from.read_exact(&mut body).is_err() {
            break;
        }
        if upstream && mode == Mode::DieAtFirstPull && h.op == Op::Pull {
            dead.store(true, Relaxed);
            break;
        }
        if !upstream && mode == Mode::SlowReads && h.op == Op::Read {
            std::thread::sleep(Duration::from_millis(1));
        }
        out.clear();
        if !upstream && mode == Mode::RefusePulls && h.op == Op::Pulled {
            rmem_proto::Response::Pulled {
                stored: 0,
                message: "the proxy refuses pulls",
            }
            .encode(h.tag, &mut out);
        } else {
            out.extend_from_slice(&hdr);
            out.extend_from_slice(&body);
        }
        if to.write_all(&out).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

fn page(n: u64, round: u64) -> Vec<u8> {
    (0..PS)
        .map(|i| (n as usize * 7 + i / 8 + round as usize * 13) as u8)
        .collect()
}

fn store_on(servers: &[String], redundancy: &str) -> RemoteStore {
    store_with(servers, redundancy, PS, true)
}

fn store_with(
    servers: &[String],
    redundancy: &str,
    page_size: usize,
    encrypt: bool,
) -> RemoteStore {
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
    RemoteStore::connect_with(servers, TOKEN, page_size, layout, timing).unwrap()
}

/// Poll until `done` says so (bounded): the completions seen on the way.
fn drive(s: &mut RemoteStore, what: &str, mut done: impl FnMut(&RemoteStore, usize) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = 0;
    while !done(s, seen) {
        assert!(Instant::now() < deadline, "{what}: not done in 20 s");
        s.poll(&mut |_| seen += 1).unwrap();
        s.tick(Instant::now()).unwrap();
    }
}

fn write_all(s: &mut RemoteStore, pages: u64, round: u64) {
    for p in 0..pages {
        s.store(PageIndex(p), &page(p, round)).unwrap();
    }
    s.flush().unwrap();
    drive(s, "write-backs", |_, seen| seen as u64 == pages);
}

/// Page `p` as the store reads it now.
fn read(s: &mut RemoteStore, p: u64) -> Vec<u8> {
    s.fetch(PageIndex(p)).unwrap();
    s.flush().unwrap();
    let mut got = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.is_none() {
        assert!(Instant::now() < deadline, "page {p} never came");
        s.poll(&mut |c| {
            if let Completion::Fetched { page, data } = c {
                got = Some((page.0, data.to_vec()));
            }
        })
        .unwrap();
    }
    let (at, data) = got.unwrap();
    assert_eq!(at, p);
    data
}

fn check_all(s: &mut RemoteStore, pages: u64, round: impl Fn(u64) -> u64) {
    for p in 0..pages {
        assert!(
            read(s, p) == page(p, round(p)),
            "page {p} is not its latest"
        );
    }
}

fn repair_done(s: &RemoteStore) -> bool {
    s.repair.started.is_none()
}

/// The drained server's pages, each piece pulled by the server taking it: none crosses the
/// client, the drained server ends empty, every page reads back (`none` and `ec:2+1`).
#[test]
fn a_drain_pulls_every_piece_server_to_server() {
    for (redundancy, pieces) in [("none", 1), ("ec:2+1", 1)] {
        let (a, a_state) = server();
        let servers = [a, server().0, server().0, server().0];
        let mut s = store_on(&servers, redundancy);
        let pages = 200;
        write_all(&mut s, pages, 0);
        let held = s.conns[0].used_bytes;
        assert!(held > 0, "{redundancy}: nothing on the first server");
        let queued = s.drain(0);
        drive(&mut s, "the drain", |s, _| repair_done(s));
        let c = s.counters().unwrap();
        assert_eq!(
            c.pieces_pulled.load(Relaxed),
            queued as u64 * pieces,
            "{redundancy}"
        );
        assert_eq!(s.conns[0].used_bytes, 0, "{redundancy}");
        check_all(&mut s, pages, |_| 0);
        // Its frees went out with the reads: the server holds nothing of the session now.
        let deadline = Instant::now() + Duration::from_secs(5);
        while a_state.used_bytes() > 0 {
            assert!(
                Instant::now() < deadline,
                "{redundancy}: the drained server kept pages"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A server that cannot pull (here a proxy refuses for it): the client says so once and
/// moves its share of the pages itself; every page reads back.
#[test]
fn a_refused_pull_moves_the_page_through_the_client() {
    let (a, a_state) = server();
    let servers = [a, proxy(server().0, Mode::RefusePulls).0];
    let mut s = store_on(&servers, "none");
    let pages = 100;
    write_all(&mut s, pages, 0);
    let queued = s.drain(0) as u64;
    assert_eq!(queued, pages);
    drive(&mut s, "the drain", |s, _| repair_done(s));
    let c = s.counters().unwrap();
    assert_eq!(c.pieces_pulled.load(Relaxed), 0);
    assert_eq!(c.pages_repaired.load(Relaxed), pages);
    assert!(
        s.pulls.refuses(1, Instant::now()),
        "the refusing server is remembered"
    );
    check_all(&mut s, pages, |_| 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while a_state.used_bytes() > 0 {
        assert!(Instant::now() < deadline, "the drained server kept pages");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A refusal holds for a while, not for the rest of the run: once it is over the server is
/// asked to pull again (here it refuses again, and is remembered from then), and every page
/// reads back.
#[test]
fn a_refused_server_is_asked_to_pull_again_after_a_while() {
    let servers = [
        server().0,
        proxy(server().0, Mode::RefusePulls).0,
        server().0,
    ];
    let mut s = store_on(&servers, "none");
    s.pulls.hold = Duration::from_millis(100);
    let pages = 60;
    write_all(&mut s, pages, 0);
    s.drain(0);
    drive(&mut s, "the first drain", |s, _| repair_done(s));
    let first = s.pulls.refused[1].expect("the refusing server is remembered");
    std::thread::sleep(Duration::from_millis(150));
    assert!(!s.pulls.refuses(1, Instant::now()), "the refusal is over");
    // The pages on the third server now have only the second to go to.
    s.drain(2);
    drive(&mut s, "the second drain", |s, _| repair_done(s));
    let again = s.pulls.refused[1].expect("refused again");
    assert!(
        again > first,
        "the second server was not asked to pull again"
    );
    assert_eq!(s.conns[2].used_bytes, 0);
    check_all(&mut s, pages, |_| 0);
}

/// Pages written back while their pulls are under way: the writes win (the pulled copies
/// are not moved to), every page reads as last written, nothing is blamed on the servers.
#[test]
fn a_page_written_while_it_is_pulled_reads_as_written() {
    for redundancy in ["none", "replicas:2", "ec:2+1"] {
        let servers: Vec<String> = (0..4).map(|_| server().0).collect();
        let mut s = store_on(&servers, redundancy);
        let pages = 120;
        write_all(&mut s, pages, 0);
        s.drain(0);
        // The first pulls go out; before their answers, every third page is written again.
        s.poll(&mut |_| {}).unwrap();
        assert!(!s.pulls.moves.is_empty(), "{redundancy}: no pull under way");
        let rewritten: Vec<u64> = (0..pages).filter(|p| p % 3 == 0).collect();
        for &p in &rewritten {
            s.store(PageIndex(p), &page(p, 1)).unwrap();
        }
        s.flush().unwrap();
        drive(&mut s, "the drain and the writes", |s, seen| {
            repair_done(s) && seen == rewritten.len()
        });
        assert!(
            s.pulls.refused.iter().all(Option::is_none),
            "{redundancy}: a pull was blamed"
        );
        assert_eq!(s.conns[0].used_bytes, 0, "{redundancy}");
        check_all(&mut s, pages, |p| u64::from(p % 3 == 0));
    }
}

/// A server taking pieces dies while it pulls them (`ec:2+1`: one loss is covered): its pulls
/// are given up with it, those pages move again (to the others), and every page reads back.
#[test]
fn a_taking_server_lost_in_the_middle_of_a_drain_loses_nothing() {
    let (a, a_state) = server();
    let servers = [
        a,
        server().0,
        server().0,
        proxy(server().0, Mode::DieAtFirstPull).0,
        server().0,
    ];
    let mut s = store_on(&servers, "ec:2+1");
    let pages = 150;
    write_all(&mut s, pages, 0);
    s.drain(0);
    drive(&mut s, "the drain", |s, _| {
        repair_done(s) && s.book.dead[3].is_some()
    });
    let c = s.counters().unwrap();
    assert_eq!(c.servers_lost.load(Relaxed), 1);
    assert!(c.pieces_pulled.load(Relaxed) > 0);
    assert_eq!(s.conns[0].used_bytes, 0);
    // Its slot stays (pages name servers by index), holding nothing for a link.
    assert_eq!(
        s.conns[3].kept_bytes(),
        0,
        "the lost server's slot keeps buffers"
    );
    check_all(&mut s, pages, |_| 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while a_state.used_bytes() > 0 {
        assert!(Instant::now() < deadline, "the drained server kept pages");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A server that starts leaving while pages are being pulled to it: they move on from it too,
/// and both leaving servers end with nothing of this client's.
#[test]
fn pages_pulled_to_a_server_that_starts_leaving_move_on() {
    let servers: Vec<String> = (0..5).map(|_| server().0).collect();
    let mut s = store_on(&servers, "none");
    let pages = 200;
    write_all(&mut s, pages, 0);
    s.drain(0);
    s.poll(&mut |_| {}).unwrap();
    let to_3 = s
        .pulls
        .moves
        .values()
        .filter(|mv| mv.to.contains(&3))
        .count();
    assert!(to_3 > 0, "no pull to the server that will leave");
    s.drain(3);
    drive(&mut s, "both drains", |s, _| repair_done(s));
    assert_eq!(s.conns[0].used_bytes, 0);
    assert_eq!(s.conns[3].used_bytes, 0, "pages pulled to it stayed");
    check_all(&mut s, pages, |_| 0);
}

/// Under `replicas:2` a lost server's copies are restored by pulls from the other copy, and
/// those copies are good: once they are in, the server that held the other copies is lost
/// too, and every page still reads back (from the pulled copies, and their own repairs).
#[test]
fn a_lost_copy_is_pulled_from_the_other_and_serves_when_that_one_is_lost_too() {
    let (a, kill_a) = proxy(server().0, Mode::Pass);
    let (b, kill_b) = proxy(server().0, Mode::Pass);
    let servers = [a, b, server().0, server().0];
    let mut s = store_on(&servers, "replicas:2");
    let pages = 120;
    write_all(&mut s, pages, 0);
    kill_b.store(true, Relaxed);
    drive(&mut s, "the repair after the first loss", |s, _| {
        s.book.dead[1].is_some() && repair_done(s)
    });
    let c = s.counters().unwrap();
    assert_eq!(
        c.pieces_pulled.load(Relaxed),
        pages,
        "every lost copy pulled"
    );
    kill_a.store(true, Relaxed);
    drive(&mut s, "the repair after the second loss", |s, _| {
        s.book.dead[0].is_some() && repair_done(s)
    });
    assert_eq!(c.servers_lost.load(Relaxed), 2);
    assert_eq!(c.pieces_bad.load(Relaxed), 0);
    check_all(&mut s, pages, |_| 0);
}

/// A taking server that runs out of room in the middle of a pull (another client filled it
/// since this one last heard its numbers) is full, not unable to pull: the rest of the drain
/// is pulled by a server with room, nothing goes through the client, and the full server is
/// not held as refusing.
#[test]
fn a_taker_that_fills_up_mid_pull_is_full_and_the_rest_is_pulled_elsewhere() {
    let (a, _) = server();
    let small = Server::bind(ServerConfig::loopback(160 * PS as u64, TOKEN)).unwrap();
    let b = small.local_addr().to_string();
    small.spawn();
    let servers = [a, b.clone(), server().0];
    let mut s = store_on(&servers, "none");
    let pages = 100;
    write_all(&mut s, pages, 0);
    // Another client takes most of the second server's room: this one's numbers for it are
    // its own (nothing placed there yet), so the drain asks it to pull first.
    let mut other = store_on(std::slice::from_ref(&b), "none");
    write_all(&mut other, 130, 1);
    let queued = s.drain(0) as u64;
    assert_eq!(queued, pages);
    drive(&mut s, "the drain", |s, _| repair_done(s));
    let c = s.counters().unwrap();
    assert_eq!(
        c.pieces_pulled.load(Relaxed),
        pages,
        "every page pulled, none through the client"
    );
    assert!(s.conns[1].full, "the server out of room is known full");
    assert!(
        !s.pulls.refuses(1, Instant::now()),
        "a full server is not held as unable to pull"
    );
    assert!(s.conns[1].used_bytes > 0 && s.conns[2].used_bytes > 0);
    assert_eq!(s.conns[0].used_bytes, 0);
    check_all(&mut s, pages, |_| 0);
}

/// Written pieces of pages being moved off a draining server (`store_parts`: byte ranges over
/// the page where it is), whether the server taking a page pulls it or the page goes through
/// the client (pulls off: read here, written there): the ranges are never lost to a copy
/// made before them, the drained server ends with nothing, and every page reads as its pieces
/// were written.
#[test]
fn pieces_written_while_their_pages_move_read_as_written() {
    const BIG: usize = 4 * PS;
    let content = |n: u64, round: u64| -> Vec<u8> {
        (0..BIG)
            .map(|i| (n as usize * 7 + i / 8 + round as usize * 13) as u8)
            .collect()
    };
    // Pieces 0 and 2 of every third page written again; the rest as first written.
    let written = 0b0101u64;
    let expected = |n: u64| -> Vec<u8> {
        let (old, new) = (content(n, 0), content(n, 1));
        if !n.is_multiple_of(3) {
            return old;
        }
        (0..BIG)
            .map(|i| {
                if written & (1 << (i / PS)) != 0 {
                    new[i]
                } else {
                    old[i]
                }
            })
            .collect()
    };
    for through_client in [false, true] {
        let (a, a_state) = server();
        let servers = [a, server().0];
        let mut s = store_with(&servers, "none", BIG, false);
        assert!(s.part_reads());
        s.pulls.off = through_client;
        let pages = 90;
        for p in 0..pages {
            s.store(PageIndex(p), &content(p, 0)).unwrap();
        }
        s.flush().unwrap();
        drive(&mut s, "write-backs", |_, seen| seen as u64 == pages);
        let on_a = (0..pages)
            .filter(|&p| s.server_of(PageIndex(p)) == Some(s.conns[0].name.as_str()))
            .count();
        assert!(on_a > 10, "{on_a} pages on the first server");
        s.drain(0);
        // The first pulls (or reads, to move through the client) go out and are done by the
        // servers; before this client has read their answers, pieces of every third page
        // are written where the page is (after the copies were made: the pulled or read
        // copies are not the page's latest).
        s.poll(&mut |_| {}).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !s.pulls.moves.is_empty() || s.repair.in_flight > 0,
            "through the client {through_client}: no move under way"
        );
        let rewritten: Vec<u64> = (0..pages).filter(|p| p % 3 == 0).collect();
        for &p in &rewritten {
            s.store_parts(PageIndex(p), &content(p, 1), written)
                .unwrap();
        }
        s.flush().unwrap();
        drive(&mut s, "the drain and the writes", |s, seen| {
            repair_done(s) && seen == rewritten.len()
        });
        assert_eq!(
            s.conns[0].used_bytes, 0,
            "through the client {through_client}"
        );
        for p in 0..pages {
            assert!(
                read(&mut s, p) == expected(p),
                "through the client {through_client}: page {p} is not as written"
            );
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while a_state.used_bytes() > 0 {
            assert!(Instant::now() < deadline, "the drained server kept pages");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A fetch with nothing out for it and no ask queued is an error naming its page at the
/// second look a second later; one whose read is out (unanswered, or answered but unread) is
/// not, however long it waits.
#[test]
fn a_fetch_that_nothing_can_finish_is_an_error_not_a_hang() {
    let (a, _sa) = server();
    let (b, _sb) = server();
    let mut s = store_with(&[a, b], "replicas:2", PS, false);
    s.store(PageIndex(3), &[7u8; PS]).unwrap();
    s.flush().unwrap();
    drive(&mut s, "the write-back", |s, _| s.book.ops.is_empty());
    // A real read, its answer left unread across three looks.
    s.fetch(PageIndex(3)).unwrap();
    s.flush().unwrap();
    let t = Instant::now();
    for i in 1..=3 {
        s.tick(t + FETCH_CHECK_EVERY * i).expect("a read is out");
    }
    drive(&mut s, "the read", |s, _| s.book.ops.is_empty());
    // A fetch nobody asked for: what a lost ask would leave.
    let op = s.book.op_id();
    let group = s.book.meta.group(3).expect("stored");
    s.book.ops.insert(
        op,
        super::Op::Fetch(Fetch {
            page: 3,
            stamps: s.book.meta.stamps(3),
            group,
            buf: Vec::new(),
            have: 0,
            asked: 0b01,
            answered: 0b01,
            bad: 0,
            gone: 0,
            all: false,
            repair: false,
            moving: 0,
            part: None,
            only: None,
            then_store: None,
        }),
    );
    // The clock goes on from the looks above (each look sets the next one's time).
    s.tick(t + FETCH_CHECK_EVERY * 4)
        .expect("first look: not yet");
    let e = s.tick(t + FETCH_CHECK_EVERY * 5).expect_err("second look");
    assert!(
        matches!(e, StoreError::Stuck { page: 3, .. }) && e.to_string().contains("page 3"),
        "{e}"
    );
}

/// A fresh server at `addr` joins; the live server at `pick` (modulo) of `live` starts
/// leaving; `live` follows.
fn join_and_drain(s: &mut RemoteStore, addr: &str, live: &mut Vec<usize>, pick: usize) {
    let c = Conn::connect(addr, TOKEN, s.book.unit(), s.session, s.timing).unwrap();
    s.join(c);
    live.push(s.conns.len() - 1);
    s.drain(live.remove(pick % live.len()));
}

/// Every drain splits the groups it touches (each page is healed from its own start), so a
/// long run in a pool whose servers come and go made groups without end: past 65,535 the
/// client panicked, and each took memory for good. The groups no page is in are freed and
/// their slots reused: through thirty drains of an `ec:4+2` pool the table stays near what
/// is in use (it reached 6,036 slots for some 700 groups in use before), and every page
/// reads back as written.
#[test]
fn groups_are_freed_as_drains_split_them() {
    let servers: Vec<String> = (0..10).map(|_| server().0).collect();
    let mut s = store_on(&servers, "ec:4+2");
    let pages = 3000;
    write_all(&mut s, pages, 0);
    let mut live: Vec<usize> = (0..10).collect();
    let (mut made, mut most) = (0, 0);
    for round in 0..30 {
        let before = s.book.groups.in_use();
        join_and_drain(&mut s, &server().0, &mut live, round * 7);
        drive(&mut s, "the drain", |s, _| repair_done(s));
        made += s.book.groups.in_use().saturating_sub(before);
        let g = &s.book.groups;
        let with_pages = g.pages.iter().filter(|&&p| p > 0).count();
        most = most.max(with_pages);
        assert!(
            g.members.len() <= 2 * GROUPS_COLLECT_MIN.max(2 * most),
            "round {round}: {} group slots for {with_pages} groups in use",
            g.members.len()
        );
    }
    assert!(
        s.book.groups.members.len() < made,
        "no slot was reused ({made} groups made)"
    );
    check_all(&mut s, pages, |_| 0);
}

/// Each read of the pager in flight, with its group's servers.
fn reads_with_groups(s: &RemoteStore) -> Vec<(u64, Members)> {
    let g = &s.book.groups;
    s.book
        .ops
        .iter()
        .filter_map(|(&op, o)| match o {
            super::Op::Fetch(fe) => Some((op, g.members[fe.group as usize].clone())),
            _ => None,
        })
        .collect()
}

/// Every page `0..pages` asked at once, then driven until each is in, no repair runs and
/// `done` says so, ticking (and so freeing groups) all the while: every page must read as
/// round 0 wrote it, and each read's group keep the servers it had when the reads went out.
/// The most groups free at once on the way.
fn read_all_through(
    s: &mut RemoteStore,
    pages: u64,
    what: &str,
    done: impl Fn(&RemoteStore) -> bool,
) -> usize {
    for p in 0..pages {
        s.fetch(PageIndex(p)).unwrap();
    }
    s.flush().unwrap();
    let started: HashMap<u64, Members> = reads_with_groups(s).into_iter().collect();
    let (mut got, mut freed) = (HashMap::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while (got.len() as u64) < pages || !repair_done(s) || !done(s) {
        assert!(Instant::now() < deadline, "{what}: not done in 20 s");
        s.poll(&mut |c| {
            if let Completion::Fetched { page: at, data } = c {
                got.insert(at.0, data == page(at.0, 0));
            }
        })
        .unwrap();
        s.tick(Instant::now()).unwrap();
        freed = freed.max(s.book.groups.free.len());
        for (op, m) in reads_with_groups(s) {
            if let Some(was) = started.get(&op) {
                assert_eq!(m, *was, "{what}: read {op}'s group changed under it");
            }
        }
    }
    let wrong: Vec<&u64> = got.iter().filter(|(_, &ok)| !ok).map(|(p, _)| p).collect();
    assert!(wrong.is_empty(), "{what}: pages read wrong: {wrong:?}");
    freed
}

/// Groups freed at every tick (`every_tick`) while drains move pages and the pager's reads
/// of every page are in flight, answers held 1 ms each: no group with a page is freed (every
/// page reads back as written, during the drains and after), and the group each read started
/// with keeps its servers under its index until the read is done. (A drain waits to move a
/// page being read, so here a read's group always keeps that page; `collect_groups` names the
/// reads' groups for the case where a page moves under a read: a server called back,
/// `forget_pieces_on`.)
#[test]
fn reads_in_flight_keep_their_groups_through_freeing() {
    let slow = || proxy(server().0, Mode::SlowReads).0;
    let servers: Vec<String> = (0..6).map(|_| slow()).collect();
    let mut s = store_on(&servers, "ec:2+1");
    s.book.groups.every_tick = true;
    let pages = 400;
    write_all(&mut s, pages, 0);
    let mut live: Vec<usize> = (0..6).collect();
    let mut freed = 0;
    for round in 0..6 {
        join_and_drain(&mut s, &slow(), &mut live, round * 5);
        // Every page asked as the drain starts: the reads and the moves overlap.
        let what = format!("round {round}");
        freed = freed.max(read_all_through(&mut s, pages, &what, |_| true));
    }
    assert!(freed > 0, "no group was ever freed: the test tests nothing");
    check_all(&mut s, pages, |_| 0);
}

/// A server called back while reads are in flight (about 190 of 200 here): the pages that
/// still name it (under `ec:2+1` on three servers none could be rebuilt elsewhere) move to
/// groups without it, under the reads, and are rebuilt onto it; groups are freed at every
/// tick meanwhile. Each read's group keeps its servers until the read is done, and every
/// page reads back, during the call back and after. (Here the rebuilt pages go back to the
/// lists they left, so an index freed under a read would come back to its own list: this
/// checks that the call back, the reads and the freeing go together, not that reads pin their
/// groups, which `collect_groups` does by naming them.)
#[test]
fn reads_and_freed_groups_go_together_through_a_call_back() {
    let (a, kill_a) = proxy(server().0, Mode::Pass);
    let slow = || proxy(server().0, Mode::SlowReads).0;
    let servers = [a.clone(), slow(), slow()];
    let mut s = store_on(&servers, "ec:2+1");
    s.book.groups.every_tick = true;
    let pages = 200;
    write_all(&mut s, pages, 0);
    kill_a.store(true, Relaxed);
    // Asked of it, the loss shows at once.
    s.fetch(PageIndex(0)).unwrap();
    s.flush().unwrap();
    drive(&mut s, "the loss", |s, seen| {
        s.book.dead[0].is_some() && seen == 1
    });
    // Back on its address (a fresh server: what it held is gone anyway); once the store dials
    // it, every page is asked at once.
    std::thread::sleep(Duration::from_millis(50));
    let _back = proxy_on(&a, server().0, Mode::Pass);
    drive(&mut s, "the call back", |s, _| s.reviving[0].is_some());
    read_all_through(&mut s, pages, "the call back", |s| s.book.dead[0].is_none());
    check_all(&mut s, pages, |_| 0);
}
