//! The client's connection layer against real memory servers (in-process) and a fake one:
//! authentication, and links killed from outside (`ss -K`, as root) while requests are in
//! flight. Every wait is bounded.

use rmem_client::config::Placement;
use rmem_client::store::remote::{RemoteStore, Timing};
use rmem_client::store::{Completion, PageStore, StoreError};
use rmem_client::PageIndex;
use rmem_proto::{auth, parse_header, Request, Response, HEADER_LEN};
use rmem_server::{Server, ServerConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

const PS: usize = 4096;
const TOKEN: &[u8] = b"test-token";

fn server(capacity_pages: u64) -> SocketAddr {
    server_with_lease(capacity_pages, rmem_server::LEASE_DEFAULT).0
}

fn server_with_lease(
    capacity_pages: u64,
    lease: Duration,
) -> (SocketAddr, std::sync::Arc<rmem_server::ServerState>) {
    let s = Server::bind(ServerConfig {
        lease,
        ..ServerConfig::loopback(capacity_pages * PS as u64, TOKEN)
    })
    .unwrap();
    let addr = s.local_addr();
    let state = s.state();
    s.spawn();
    (addr, state)
}

fn connect(addr: SocketAddr, token: &[u8]) -> Result<RemoteStore, StoreError> {
    connect_with(addr, token, Duration::from_secs(5))
}

/// A store on `addr` that reconnects for up to `reconnect`; other clocks at 5 s.
fn connect_with(
    addr: SocketAddr,
    token: &[u8],
    reconnect: Duration,
) -> Result<RemoteStore, StoreError> {
    RemoteStore::connect(
        &[addr.to_string()],
        token,
        PS,
        Placement::Priority,
        timing(reconnect),
    )
}

/// Every clock at 5 s but the reconnection window.
fn timing(reconnect: Duration) -> Timing {
    let t = Duration::from_secs(5);
    Timing {
        connect: t,
        request: t,
        heartbeat: t,
        reconnect,
    }
}

#[test]
fn a_wrong_token_is_refused_with_a_message_naming_it() {
    let addr = server(16);
    assert!(connect(addr, TOKEN).is_ok());
    let err = connect(addr, b"not-the-token")
        .err()
        .expect("accepted a wrong token");
    assert!(matches!(err, StoreError::Refused { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&addr.to_string()) && msg.contains("wrong token"),
        "{msg}"
    );
}

/// A server named twice is refused before anything is dialed: its two links would share
/// one session, each attach fencing the other, and the program would stop later with "lost
/// this program's pages". Under two names (a host name and its address) it is refused once
/// both links are up.
#[test]
fn a_server_named_twice_is_refused_at_once() {
    let (a, b) = (server(16).to_string(), server(16).to_string());
    let servers = [a.clone(), b, a.clone()];
    let timing = timing(Duration::from_secs(5));
    let err = RemoteStore::connect(&servers, TOKEN, PS, Placement::Priority, timing)
        .err()
        .expect("accepted a server twice");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("{a} is named twice (servers 1 and 3)")),
        "{msg}"
    );
    // A name and the address it resolves to: found by where the links go.
    let port = a.rsplit(':').next().unwrap();
    let servers = [a.clone(), format!("localhost:{port}")];
    let err = RemoteStore::connect(&servers, TOKEN, PS, Placement::Priority, timing)
        .err()
        .expect("accepted a server under two names");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("{a} and localhost:{port} are the same server")),
        "{msg}"
    );
}

/// A fake server on loopback for one connection: each request is answered with what
/// `answer` makes of it, until it says None or the client hangs up (then the fake closes,
/// listener and all).
fn fake_server(
    answer: impl FnMut(Request<'_>) -> Option<Response<'static>> + Send + 'static,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    fake_server_lingering(answer, Duration::ZERO)
}

/// [`fake_server`], whose listener stays open for `linger` after the connection ends,
/// taking new connections into its backlog and answering none of them (a hung host).
fn fake_server_lingering(
    mut answer: impl FnMut(Request<'_>) -> Option<Response<'static>> + Send + 'static,
    linger: Duration,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = Vec::new();
        loop {
            let mut hdr = [0u8; HEADER_LEN];
            if s.read_exact(&mut hdr).is_err() {
                break; // the client hung up
            }
            let h = parse_header(&hdr, 1 << 20).unwrap().unwrap();
            let mut body = vec![0u8; h.len as usize];
            s.read_exact(&mut body).unwrap();
            let Some(a) = answer(Request::decode(h.op, &body).unwrap()) else {
                break;
            };
            out.clear();
            a.encode(h.tag, &mut out);
            s.write_all(&out).unwrap();
        }
        drop(s);
        std::thread::sleep(linger);
    });
    (addr, fake)
}

/// What a fake server that knows the token answers to a handshake and an attach (None to
/// anything else).
fn handshake_answers() -> impl FnMut(Request<'_>) -> Option<Response<'static>> + Send + 'static {
    let mut transcript = None;
    move |req| match req {
        Request::Hello { nonce, .. } => {
            let t = auth::Transcript {
                client_nonce: nonce,
                server_nonce: [4; auth::NONCE_LEN],
                version: rmem_proto::VERSION,
                page_size: PS as u32,
            };
            transcript = Some(t);
            Some(Response::Challenge {
                nonce: t.server_nonce,
            })
        }
        Request::Auth { .. } => Some(Response::Welcome {
            version: rmem_proto::VERSION,
            frame_len_max: rmem_proto::FRAME_LEN_MAX_DEFAULT,
            capacity_bytes: 1 << 30,
            used_bytes: 0,
            proof: transcript.unwrap().proof(TOKEN, auth::Role::Server),
        }),
        Request::Attach { .. } => Some(Response::Attached {
            lease_ms: 30_000,
            flags: 0,
            session_bytes: 0,
        }),
        _ => None,
    }
}

/// A server that does not know the token but welcomes everyone is caught by its proof.
#[test]
fn a_server_without_the_token_is_not_trusted() {
    let (addr, impostor) = fake_server(|req| match req {
        Request::Hello { .. } => Some(Response::Challenge {
            nonce: [9; auth::NONCE_LEN],
        }),
        Request::Auth { .. } => Some(Response::Welcome {
            version: rmem_proto::VERSION,
            frame_len_max: rmem_proto::FRAME_LEN_MAX_DEFAULT,
            capacity_bytes: 1 << 30,
            used_bytes: 0,
            proof: [0; auth::PROOF_LEN],
        }),
        _ => None,
    });
    let err = connect(addr, TOKEN).err().expect("trusted an impostor");
    assert!(matches!(err, StoreError::Impostor { .. }), "{err:?}");
    assert!(err.to_string().contains("does not know the token"), "{err}");
    impostor.join().unwrap();
}

/// Kill every TCP connection to `port` from outside, as a network failure would (`ss -K`,
/// which needs root). False (and the caller skips) when not root.
fn kill_connections(port: u16) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: `ss -K` needs root");
        return false;
    }
    let st = std::process::Command::new("ss")
        .args(["-K", "dst", "127.0.0.1", "dport", "=", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("ss");
    assert!(st.success(), "ss -K failed");
    true
}

/// Poll until `n` completions arrived (flushing meanwhile), within 10 s; the fetched pages'
/// first bytes.
fn complete(store: &mut RemoteStore, n: usize) -> Vec<(u64, u8)> {
    let t = Instant::now();
    let mut done = 0;
    let mut fetched = Vec::new();
    while done < n {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{done} of {n} completed"
        );
        store.flush().unwrap();
        store.tick(Instant::now()).unwrap();
        done += store
            .poll(&mut |c| {
                if let Completion::Fetched { page, data } = c {
                    assert!(data.iter().all(|&b| b == data[0]), "torn page {}", page.0);
                    fetched.push((page.0, data[0]));
                }
            })
            .unwrap();
        std::thread::sleep(Duration::from_micros(100));
    }
    fetched
}

/// Links killed while writes and reads are in flight: the store reconnects by itself,
/// re-sends what was unanswered, and every page reads back as last written.
#[test]
fn requests_in_flight_survive_killed_connections() {
    let addr = server(1024);
    let mut store = connect(addr, TOKEN).unwrap();
    let pages = 256u64;
    let byte = |p: u64, round: u64| (p * 7 + round * 13) as u8 | 1;
    for round in 0..4u64 {
        for p in 0..pages {
            store.store(PageIndex(p), &[byte(p, round); PS]).unwrap();
        }
        store.flush().unwrap();
        // Kill in the middle of the writes, then again in the middle of the reads.
        if !kill_connections(addr.port()) {
            return;
        }
        let stored = complete(&mut store, pages as usize);
        assert!(stored.is_empty());
        for p in 0..pages {
            store.fetch(PageIndex(p)).unwrap();
        }
        kill_connections(addr.port());
        let mut fetched = complete(&mut store, pages as usize);
        fetched.sort();
        let want: Vec<(u64, u8)> = (0..pages).map(|p| (p, byte(p, round))).collect();
        assert_eq!(fetched, want, "round {round}");
    }
    assert!(store.reconnects() >= 4, "{} reconnects", store.reconnects());
}

/// A server that is gone for good (nothing listens on its port any more: its process, and
/// with it the session, is gone): the store gives up at once rather than waiting out its
/// reconnect window, and the error names the server and what happened to the link.
#[test]
fn a_server_gone_for_good_is_reported_at_once() {
    // A fake server that knows the token: handshake, attach, then it takes one write and
    // vanishes with its listener.
    let (addr, fake) = fake_server(handshake_answers());
    let window = Duration::from_millis(300);
    let mut store = connect_with(addr, TOKEN, window).unwrap();
    store.store(PageIndex(5), &[1; PS]).unwrap();
    store.flush().unwrap();
    fake.join().unwrap();
    let start = Instant::now();
    let err = loop {
        assert!(start.elapsed() < Duration::from_secs(5), "never gave up");
        let r = store
            .flush()
            .and_then(|()| store.poll(&mut |_| {}))
            .and_then(|_| store.tick(Instant::now()));
        if let Err(e) = r {
            break e;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(start.elapsed() < window, "{:?}", start.elapsed());
    let msg = err.to_string();
    assert!(matches!(err, StoreError::GaveUp { .. }), "{err:?}");
    assert!(
        msg.contains(&format!("memory server {addr}"))
            && msg.contains("page 5 was being written back")
            && msg.contains("reconnecting for")
            && msg.contains("connection refused"),
        "{msg}"
    );
}

/// A host that stops answering (its listener still takes connections, nothing answers on
/// them: hung, or cut off behind a firewall that lets the handshake through) is reconnected
/// to on a thread of the store's own: no call into the store waits for it (the pager serves
/// other faults meanwhile), and at the end of the window the store gives up saying what the
/// last attempt met. Before, the pager's own thread waited out each connection attempt,
/// here the whole window.
#[test]
fn reconnecting_to_a_host_that_does_not_answer_never_holds_the_caller() {
    let window = Duration::from_secs(2);
    let (addr, fake) = fake_server_lingering(handshake_answers(), window * 2);
    let mut store = connect_with(addr, TOKEN, window).unwrap();
    store.store(PageIndex(5), &[1; PS]).unwrap();
    store.flush().unwrap();
    let start = Instant::now();
    let mut longest = Duration::ZERO;
    let err = loop {
        assert!(start.elapsed() < window * 3, "never gave up");
        let call = Instant::now();
        let r = store
            .flush()
            .and_then(|()| store.poll(&mut |_| {}))
            .and_then(|_| store.tick(Instant::now()));
        longest = longest.max(call.elapsed());
        if let Err(e) = r {
            break e;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let msg = err.to_string();
    assert!(matches!(err, StoreError::GaveUp { .. }), "{err:?}");
    assert!(
        longest < window / 4,
        "a call waited {longest:?} for a reconnection ({msg})"
    );
    assert!(
        start.elapsed() >= window / 2,
        "{:?}: {msg}",
        start.elapsed()
    );
    assert!(
        msg.contains(&format!("memory server {addr}"))
            && msg.contains("reconnecting for")
            && msg.contains("waiting for its challenge"),
        "{msg}"
    );
    fake.join().unwrap();
}

/// An idle store keeps its session by heartbeats alone, however short the server's lease:
/// its pings come at most a third of the lease apart even when told to ping rarely, and it
/// asks to be ticked that often. Its clean end frees the pages at once.
#[test]
fn heartbeats_keep_an_idle_session_within_a_short_lease() {
    let lease = Duration::from_millis(300);
    let (addr, state) = server_with_lease(64, lease);
    let mut store = connect(addr, TOKEN).unwrap(); // heartbeat asked: 5 s
    let beat = store.heartbeat().expect("a store with a lease wants ticks");
    assert!(beat <= lease / 3, "{beat:?}");
    for p in 0..4 {
        store.store(PageIndex(p), &[p as u8 + 1; PS]).unwrap();
    }
    complete(&mut store, 4);
    // Idle for five leases, ticked as asked.
    let t = Instant::now();
    while t.elapsed() < 5 * lease {
        std::thread::sleep(beat);
        store.tick(Instant::now()).unwrap();
        store.poll(&mut |_| {}).unwrap();
    }
    assert_eq!(state.used_bytes(), 4 * PS as u64, "the session expired");
    for p in 0..4 {
        store.fetch(PageIndex(p)).unwrap();
    }
    let mut got = complete(&mut store, 4);
    got.sort();
    assert_eq!(got, vec![(0, 1), (1, 2), (2, 3), (3, 4)]);
    drop(store);
    assert_eq!(state.used_bytes(), 0, "a clean end keeps the pages");
    assert!(state.sessions().is_empty());
}

/// A pool manager of an older protocol version (here 0x0102: no reasons in the uses) refuses
/// the newer `Hello` with a version mismatch; the client connects again in the next older
/// version, and speaks it both ways: its beats leave out the reasons, and the manager's
/// status, encoded for that version, decodes.
#[test]
fn a_pool_manager_of_an_older_version_is_spoken_to_in_it() {
    use rmem_client::pool::ManagerConn;
    use rmem_proto::pool::{self, PoolRequest, PoolResponse, PoolStatus};
    let old = pool::VERSION_NODE;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let fake = std::thread::spawn(move || {
        let mut heard = Vec::new();
        for _ in 0..2 {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut transcript = None;
            loop {
                let mut hdr = [0u8; HEADER_LEN];
                if s.read_exact(&mut hdr).is_err() {
                    break;
                }
                let h = parse_header(&hdr, 1 << 20).unwrap().unwrap();
                let mut body = vec![0u8; h.len as usize];
                s.read_exact(&mut body).unwrap();
                let mut out = Vec::new();
                match Request::decode(h.op, &body) {
                    Ok(Request::Hello { version, nonce, .. }) => {
                        heard.push(version);
                        if version != old {
                            Response::Error {
                                code: rmem_proto::ErrorCode::VersionMismatch,
                                message: "not spoken here",
                            }
                            .encode(h.tag, &mut out);
                            s.write_all(&out).unwrap();
                            break;
                        }
                        let t = auth::Transcript {
                            client_nonce: nonce,
                            server_nonce: [4; auth::NONCE_LEN],
                            version: old,
                            page_size: 0,
                        };
                        transcript = Some(t);
                        Response::Challenge {
                            nonce: t.server_nonce,
                        }
                        .encode(h.tag, &mut out);
                    }
                    Ok(Request::Auth { .. }) => Response::Welcome {
                        version: old,
                        frame_len_max: rmem_proto::FRAME_LEN_MAX_DEFAULT,
                        capacity_bytes: 0,
                        used_bytes: 0,
                        proof: transcript.unwrap().proof(TOKEN, auth::Role::Server),
                    }
                    .encode(h.tag, &mut out),
                    // A pool request: decoded as the old version has it, answered in it.
                    _ => {
                        let req = PoolRequest::decode_for(old, h.op, &body).unwrap();
                        let uses = match req {
                            PoolRequest::ClientBeat(b) => b.uses,
                            _ => Vec::new(),
                        };
                        let status = PoolStatus {
                            heartbeat_ms: 100,
                            servers: Vec::new(),
                            clients: vec![pool::ClientRow {
                                session: rmem_proto::SessionId(1),
                                name: "x".into(),
                                max_remote_bytes: pool::UNLIMITED,
                                grant_bytes: pool::UNLIMITED,
                                beat_age_ms: 0,
                                uses,
                            }],
                        };
                        PoolResponse::StatusOk(status).encode_for(old, h.tag, &mut out);
                    }
                }
                s.write_all(&out).unwrap();
            }
        }
        heard
    });
    let mut c = ManagerConn::connect(&addr, TOKEN, Duration::from_secs(5)).unwrap();
    let beat = PoolRequest::ClientBeat(pool::ClientBeat {
        session: rmem_proto::SessionId(1),
        name: "x".into(),
        max_remote_bytes: pool::UNLIMITED,
        uses: vec![pool::ServerUse {
            server: "a:1".into(),
            bytes: 4096,
            kept: "a reason the old version has no room for".into(),
        }],
        node: "n".into(),
    });
    let answer = c.ask(&beat, Duration::from_secs(5)).unwrap();
    let PoolResponse::StatusOk(st) = answer else {
        panic!("{answer:?}")
    };
    let u = &st.clients[0].uses[0];
    assert_eq!(
        (u.server.as_str(), u.bytes, u.kept.as_str()),
        ("a:1", 4096, "")
    );
    drop(c);
    assert_eq!(fake.join().unwrap(), vec![pool::VERSION, old]);
}
