//! The server against bad input: every malformed frame closes that one connection, and the
//! server goes on serving other clients. Each test is bounded by socket timeouts.

use rmem_proto::auth::{self, Role, Transcript};
use rmem_proto::{parse_header, ErrorCode, Op, PageKey, Request, Response, SessionId, HEADER_LEN};
use rmem_server::{Server, ServerConfig, ServerState};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PS: usize = 4096;
const TOKEN: &[u8] = b"test-token";

fn server(capacity_pages: u64) -> (SocketAddr, Arc<ServerState>) {
    server_with_lease(capacity_pages, rmem_server::LEASE_DEFAULT)
}

fn server_with_lease(capacity_pages: u64, lease: Duration) -> (SocketAddr, Arc<ServerState>) {
    let s = Server::bind(ServerConfig {
        lease,
        verbose: true,
        ..ServerConfig::loopback(capacity_pages * PS as u64, TOKEN)
    })
    .unwrap();
    let addr = s.local_addr();
    let state = s.state();
    s.spawn();
    (addr, state)
}

struct Client {
    sock: TcpStream,
    tag: u64,
}

impl Client {
    fn raw(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    /// Connected, authenticated, and attached to a new session.
    fn connect(addr: SocketAddr) -> Client {
        Client::attach(addr, SessionId::random().unwrap(), 0).0
    }

    /// Connected, authenticated, and attached to `session` with `flags`; whether the
    /// session existed.
    fn attach(addr: SocketAddr, session: SessionId, flags: u32) -> (Client, bool) {
        let mut c = Client {
            sock: Client::raw(addr),
            tag: 0,
        };
        let (op, body) = c.handshake(rmem_proto::VERSION, PS as u32, TOKEN);
        match Response::decode(op, &body).unwrap() {
            Response::Welcome { .. } => {}
            other => panic!("no welcome: {other:?}"),
        }
        let (op, body) = c.call(Request::Attach {
            session,
            lease_ms: 0,
            flags,
            reserved: 0,
        });
        match Response::decode(op, &body).unwrap() {
            Response::Attached { flags, .. } => {
                let existed = flags & rmem_proto::ATTACHED_EXISTED != 0;
                (c, existed)
            }
            other => panic!("not attached: {other:?}"),
        }
    }

    /// Hello, then Auth with a proof made with `token`: the server's last answer (Challenge
    /// when it refused the hello, Welcome or Error after the proof). A Welcome's proof is
    /// checked here.
    fn handshake(&mut self, version: u16, page_size: u32, token: &[u8]) -> (Op, Vec<u8>) {
        let client_nonce = auth::nonce().unwrap();
        let (op, body) = self.call(Request::Hello {
            version,
            page_size,
            nonce: client_nonce,
        });
        let Ok(Response::Challenge { nonce }) = Response::decode(op, &body) else {
            return (op, body);
        };
        let t = Transcript {
            client_nonce,
            server_nonce: nonce,
            version,
            page_size,
        };
        let (op, body) = self.call(Request::Auth {
            proof: t.proof(token, Role::Client),
        });
        if let Ok(Response::Welcome { proof, .. }) = Response::decode(op, &body) {
            assert!(t.verify(TOKEN, Role::Server, &proof), "server proof");
        }
        (op, body)
    }

    fn send(&mut self, r: Request<'_>) {
        let mut buf = Vec::new();
        self.tag += 1;
        r.encode(self.tag, &mut buf);
        self.sock.write_all(&buf).unwrap();
    }

    fn recv(&mut self) -> (rmem_proto::Op, Vec<u8>, u64) {
        let mut hdr = [0u8; HEADER_LEN];
        self.sock.read_exact(&mut hdr).unwrap();
        let h = parse_header(&hdr, u32::MAX).unwrap().unwrap();
        let mut body = vec![0u8; h.len as usize];
        self.sock.read_exact(&mut body).unwrap();
        (h.op, body, h.tag)
    }

    /// Read one page: its bytes, or the server's error code.
    fn read(&mut self, key: u64) -> Result<Vec<u8>, ErrorCode> {
        let (op, body) = self.call(Request::Read {
            key: PageKey(key),
            count: 1,
        });
        match Response::decode(op, &body).unwrap() {
            Response::ReadOk { data, .. } => Ok(data.to_vec()),
            Response::Error { code, .. } => Err(code),
            other => panic!("{other:?}"),
        }
    }

    fn call(&mut self, r: Request<'_>) -> (rmem_proto::Op, Vec<u8>) {
        self.send(r);
        let (op, body, tag) = self.recv();
        assert_eq!(tag, self.tag);
        (op, body)
    }
}

/// The server closed this connection: a read returns EOF or an error within the timeout.
fn assert_closed(mut s: TcpStream) {
    let t = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "connection not closed"
        );
    }
}

/// A well-behaved client still gets full service.
fn assert_serves(addr: SocketAddr) {
    let mut c = Client::connect(addr);
    let page = vec![0x3Cu8; PS];
    assert_eq!(
        c.call(Request::Write {
            key: PageKey(1),
            count: 1,
            data: &page
        })
        .0,
        rmem_proto::Op::WriteOk
    );
    let (op, body) = c.call(Request::Read {
        key: PageKey(1),
        count: 1,
    });
    match Response::decode(op, &body).unwrap() {
        Response::ReadOk { data, .. } => assert_eq!(data, &page[..]),
        other => panic!("{other:?}"),
    }
}

/// Used bytes fall to `bytes` within `limit`.
fn wait_used(state: &ServerState, bytes: u64, limit: Duration, what: &str) {
    let t = Instant::now();
    while state.used_bytes() != bytes {
        assert!(
            t.elapsed() < limit,
            "{what}: {} bytes used after {limit:?}",
            state.used_bytes()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn round_trip_swap_free_and_session_end_release_memory() {
    let (addr, state) = server(64);
    let mut c = Client::connect(addr);
    let a = vec![1u8; PS];
    let b = vec![2u8; PS];
    c.call(Request::Write {
        key: PageKey(10),
        count: 1,
        data: &a,
    });
    let (op, body) = c.call(Request::Swap {
        write_key: PageKey(11),
        read_key: PageKey(10),
        data: &b,
    });
    match Response::decode(op, &body).unwrap() {
        Response::SwapOk { read_key, data } => {
            assert_eq!(read_key, PageKey(10));
            assert_eq!(data, &a[..]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(state.used_bytes(), 2 * PS as u64);
    let (op, body) = c.call(Request::Free {
        keys: vec![PageKey(10), PageKey(99)],
    });
    assert_eq!(
        Response::decode(op, &body).unwrap(),
        Response::FreeOk { count: 1 }
    );
    assert_eq!(state.used_bytes(), PS as u64);
    let (op, body) = c.call(Request::EndSession);
    assert_eq!(
        Response::decode(op, &body).unwrap(),
        Response::SessionEnded {
            freed_bytes: PS as u64
        }
    );
    assert_eq!(state.used_bytes(), 0);
    assert!(state.sessions().is_empty());
    // The ended session refuses further requests.
    let (op, body) = c.call(Request::Ping);
    assert!(matches!(
        Response::decode(op, &body).unwrap(),
        Response::Error {
            code: ErrorCode::SessionLost,
            ..
        }
    ));
    assert_closed(c.sock);
}

/// A session outlives its connection: a client that reconnects within the lease finds its
/// pages; once nobody renews the lease, they are freed.
#[test]
fn a_session_outlives_its_connection_until_its_lease_ends() {
    let lease = Duration::from_millis(600);
    let (addr, state) = server_with_lease(64, lease);
    let id = SessionId::random().unwrap();
    let (mut c, existed) = Client::attach(addr, id, 0);
    assert!(!existed);
    let page = vec![0x77u8; PS];
    assert_eq!(
        c.call(Request::Write {
            key: PageKey(3),
            count: 1,
            data: &page
        })
        .0,
        Op::WriteOk
    );
    drop(c);
    // Renewed by each request of a new connection for two leases: never freed.
    let (mut c, existed) = Client::attach(addr, id, rmem_proto::ATTACH_EXCLUSIVE);
    assert!(existed);
    let t = Instant::now();
    while t.elapsed() < 2 * lease {
        assert_eq!(c.call(Request::Ping).0, Op::Pong);
        std::thread::sleep(lease / 4);
    }
    assert_eq!(c.read(3), Ok(page.clone()));
    let listed = state.sessions();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].id, listed[0].used_bytes), (id, PS as u64));
    // Silence with the connection open (a client stopped, or in a debugger): kept.
    std::thread::sleep(3 * lease);
    assert_eq!(
        state.used_bytes(),
        PS as u64,
        "a silent client's session was freed"
    );
    assert_eq!(c.read(3), Ok(page));
    // The connection closed: freed within the lease and the reaper's period.
    drop(c);
    wait_used(&state, 0, lease + lease, "lease expiry");
    assert!(state.sessions().is_empty());
    // Attaching again makes a new, empty session.
    let (mut c, existed) = Client::attach(addr, id, 0);
    assert!(!existed);
    assert_eq!(c.read(3), Err(ErrorCode::NotFound));
}

/// Two connections attached to one session see the same pages; an exclusive attach fences
/// the others, so nothing they still send lands afterwards.
#[test]
fn two_connections_on_one_session_share_pages_and_an_exclusive_attach_fences() {
    let (addr, state) = server(64);
    let id = SessionId::random().unwrap();
    let (mut a, _) = Client::attach(addr, id, 0);
    let (mut b, existed) = Client::attach(addr, id, 0);
    assert!(existed);
    let read = |c: &mut Client, key| c.read(key).unwrap()[0];
    for (writer, key, byte) in [(&mut a, 1, 0xA1u8), (&mut b, 2, 0xB2u8)] {
        let (op, _) = writer.call(Request::Write {
            key: PageKey(key),
            count: 1,
            data: &[byte; PS],
        });
        assert_eq!(op, Op::WriteOk);
    }
    assert_eq!((read(&mut a, 2), read(&mut b, 1)), (0xB2, 0xA1));
    assert_eq!(state.used_bytes(), 2 * PS as u64);
    assert_eq!(state.sessions()[0].connections, 2);
    let (mut c, existed) = Client::attach(addr, id, rmem_proto::ATTACH_EXCLUSIVE);
    assert!(existed);
    for old in [a, b] {
        let mut old = old;
        let (op, body) = old.call(Request::Write {
            key: PageKey(1),
            count: 1,
            data: &[0xEE; PS],
        });
        assert!(matches!(
            Response::decode(op, &body).unwrap(),
            Response::Error {
                code: ErrorCode::SessionLost,
                ..
            }
        ));
        assert_closed(old.sock);
    }
    assert_eq!(read(&mut c, 1), 0xA1, "a fenced write landed");
    // A different page size cannot attach the session.
    let mut d = Client {
        sock: Client::raw(addr),
        tag: 0,
    };
    assert_eq!(
        d.handshake(rmem_proto::VERSION, 2 * PS as u32, TOKEN).0,
        Op::Welcome
    );
    d.send(Request::Attach {
        session: id,
        lease_ms: 0,
        flags: 0,
        reserved: 0,
    });
    assert_closed(d.sock);
}

#[test]
fn garbage_truncated_and_oversized_frames_close_only_that_connection() {
    let (addr, _) = server(64);
    let mut good = Client::connect(addr);
    let cases: Vec<Vec<u8>> = vec![
        vec![0x47; 64], // garbage
        {
            let mut v = Vec::new();
            Request::Ping.encode(1, &mut v);
            v[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
            v
        }, // oversized
        {
            let mut v = Vec::new();
            Request::Read {
                key: PageKey(1),
                count: 1,
            }
            .encode(1, &mut v);
            v[4] = 0x7E;
            v
        }, // unknown op
        {
            let mut v = Vec::new();
            Request::Ping.encode(1, &mut v);
            v[5] = 1;
            v
        }, // reserved bits
    ];
    for bytes in cases {
        let mut s = Client::raw(addr);
        s.write_all(&bytes).unwrap();
        assert_closed(s);
        assert_serves(addr);
    }
    // Truncated: a header promising a body that never comes, then EOF.
    let mut s = Client::raw(addr);
    let mut v = Vec::new();
    Request::Hello {
        version: rmem_proto::VERSION,
        page_size: PS as u32,
        nonce: [0; auth::NONCE_LEN],
    }
    .encode(0, &mut v);
    s.write_all(&v[..v.len() - 3]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_closed(s);
    // Malformed after a good handshake: write data of the wrong length.
    let mut c = Client::connect(addr);
    c.send(Request::Write {
        key: PageKey(1),
        count: 2,
        data: &[0u8; PS],
    });
    assert_closed(c.sock);
    // A page request before attach, and unknown attach flags, close the connection.
    for req in [
        Request::Read {
            key: PageKey(1),
            count: 1,
        },
        Request::Attach {
            session: SessionId(1),
            lease_ms: 0,
            flags: 1 << 7,
            reserved: 0,
        },
        Request::Attach {
            session: SessionId(1),
            lease_ms: 0,
            flags: 0,
            reserved: 1,
        },
    ] {
        let mut c = Client {
            sock: Client::raw(addr),
            tag: 0,
        };
        assert_eq!(
            c.handshake(rmem_proto::VERSION, PS as u32, TOKEN).0,
            Op::Welcome
        );
        c.send(req);
        assert_closed(c.sock);
    }
    // The first client never noticed.
    assert_eq!(good.call(Request::Ping).0, rmem_proto::Op::Pong);
    assert_serves(addr);
}

#[test]
fn wrong_token_version_or_page_size_are_refused() {
    let (addr, _) = server(64);
    for (version, page_size, token) in [
        (rmem_proto::VERSION, PS as u32, &b"wrong"[..]),
        (rmem_proto::VERSION + 1, PS as u32, TOKEN),
        // Units are a multiple of 8 bytes from 64 to a largest page and its seal.
        (rmem_proto::VERSION, 3001, TOKEN),
        (rmem_proto::VERSION, 32, TOKEN),
        (rmem_proto::VERSION, 8 << 20, TOKEN),
    ] {
        let mut c = Client {
            sock: Client::raw(addr),
            tag: 0,
        };
        let (op, body) = c.handshake(version, page_size, token);
        match Response::decode(op, &body).unwrap() {
            Response::Error { code, message } => {
                assert!(matches!(
                    code,
                    ErrorCode::Unauthorized | ErrorCode::VersionMismatch | ErrorCode::BadRequest
                ));
                if code == ErrorCode::Unauthorized {
                    assert!(message.contains("wrong token"), "{message}");
                }
            }
            other => panic!("accepted {other:?}"),
        }
        assert_closed(c.sock);
    }
    // Auth without a Hello, and a second Hello instead of Auth, are refused.
    let mut c = Client {
        sock: Client::raw(addr),
        tag: 0,
    };
    c.send(Request::Auth {
        proof: [0; auth::PROOF_LEN],
    });
    assert_closed(c.sock);
    let mut c = Client {
        sock: Client::raw(addr),
        tag: 0,
    };
    let hello = Request::Hello {
        version: rmem_proto::VERSION,
        page_size: PS as u32,
        nonce: [5; auth::NONCE_LEN],
    };
    assert_eq!(c.call(hello.clone()).0, Op::Challenge);
    c.send(hello);
    assert_closed(c.sock);
    // A request before hello is refused too.
    let mut s = Client::raw(addr);
    let mut v = Vec::new();
    Request::Read {
        key: PageKey(0),
        count: 1,
    }
    .encode(1, &mut v);
    s.write_all(&v).unwrap();
    assert_closed(s);
    assert_serves(addr);
}

#[test]
fn a_full_server_refuses_new_pages_and_keeps_the_old() {
    let (addr, state) = server(4);
    let mut c = Client::connect(addr);
    for k in 0..4u64 {
        let page = vec![k as u8; PS];
        assert_eq!(
            c.call(Request::Write {
                key: PageKey(k),
                count: 1,
                data: &page
            })
            .0,
            rmem_proto::Op::WriteOk
        );
    }
    let (op, body) = c.call(Request::Write {
        key: PageKey(4),
        count: 1,
        data: &[9u8; PS],
    });
    match Response::decode(op, &body).unwrap() {
        Response::Error {
            code: ErrorCode::Full,
            message,
        } => assert!(message.contains("full"), "{message}"),
        other => panic!("{other:?}"),
    }
    // Overwriting needs no new space.
    assert_eq!(
        c.call(Request::Write {
            key: PageKey(2),
            count: 1,
            data: &[7u8; PS]
        })
        .0,
        rmem_proto::Op::WriteOk
    );
    for k in 0..4u64 {
        let (op, body) = c.call(Request::Read {
            key: PageKey(k),
            count: 1,
        });
        match Response::decode(op, &body).unwrap() {
            Response::ReadOk { data, .. } => assert_eq!(data[0], if k == 2 { 7 } else { k as u8 }),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(state.used_bytes(), 4 * PS as u64);
    assert_eq!(c.read(77), Err(ErrorCode::NotFound));
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (addr, _) = server(2048);
    let mut c = Client::connect(addr);
    let first = c.tag + 1;
    let mut buf = Vec::new();
    for k in 0..1000u64 {
        Request::Write {
            key: PageKey(k),
            count: 1,
            data: &[k as u8; PS],
        }
        .encode(first + k, &mut buf);
    }
    for k in 0..1000u64 {
        Request::Read {
            key: PageKey(k),
            count: 1,
        }
        .encode(first + 1000 + k, &mut buf);
    }
    let writer = {
        let mut s = c.sock.try_clone().unwrap();
        std::thread::spawn(move || s.write_all(&buf).unwrap())
    };
    for i in 0..2000u64 {
        let (op, body, tag) = c.recv();
        assert_eq!(tag, first + i);
        if i >= 1000 {
            match Response::decode(op, &body).unwrap() {
                Response::ReadOk { key, data, .. } => {
                    assert_eq!(key.0, i - 1000);
                    assert!(data.iter().all(|&b| b == (i - 1000) as u8));
                }
                other => panic!("{other:?}"),
            }
        }
    }
    writer.join().unwrap();
}

/// Someone who recorded a client's whole handshake (its Hello and its Auth, byte for byte)
/// and replays it gets a fresh challenge and is refused: the recorded proof was for another
/// server nonce. The token never appears in the recording.
#[test]
fn a_recorded_handshake_replayed_is_refused() {
    let (addr, _) = server(64);
    let mut c = Client {
        sock: Client::raw(addr),
        tag: 0,
    };
    let client_nonce = [0x11; auth::NONCE_LEN];
    let hello = Request::Hello {
        version: rmem_proto::VERSION,
        page_size: PS as u32,
        nonce: client_nonce,
    };
    let (op, body) = c.call(hello.clone());
    let Response::Challenge { nonce: first } = Response::decode(op, &body).unwrap() else {
        panic!("{op:?}");
    };
    let recorded_auth = Request::Auth {
        proof: Transcript {
            client_nonce,
            server_nonce: first,
            version: rmem_proto::VERSION,
            page_size: PS as u32,
        }
        .proof(TOKEN, Role::Client),
    };
    assert_eq!(c.call(recorded_auth.clone()).0, Op::Welcome);
    let mut recording = Vec::new();
    hello.encode(1, &mut recording);
    recorded_auth.encode(2, &mut recording);
    assert!(
        !recording.windows(TOKEN.len()).any(|w| w == TOKEN),
        "the token crossed the network"
    );
    for _ in 0..3 {
        let mut r = Client {
            sock: Client::raw(addr),
            tag: 0,
        };
        let (op, body) = r.call(hello.clone());
        let Response::Challenge { nonce } = Response::decode(op, &body).unwrap() else {
            panic!("{op:?}");
        };
        assert_ne!(nonce, first, "the server's nonce repeated");
        let (op, body) = r.call(recorded_auth.clone());
        match Response::decode(op, &body).unwrap() {
            Response::Error {
                code: ErrorCode::Unauthorized,
                ..
            } => {}
            other => panic!("replay accepted: {other:?}"),
        }
        assert_closed(r.sock);
    }
    // The original connection is unaffected.
    let attach = Request::Attach {
        session: SessionId(9),
        lease_ms: 0,
        flags: 0,
        reserved: 0,
    };
    assert_eq!(c.call(attach).0, Op::Attached);
}

/// A client that sends its hello a byte every 300 ms (each read well within a per-read
/// timeout) is closed when the handshake's deadline passes, not held for as long as it
/// trickles; other clients are served meanwhile.
#[test]
fn a_handshake_trickled_a_byte_at_a_time_is_cut_off_at_its_deadline() {
    let (addr, _) = server(64);
    let mut hello = Vec::new();
    Request::Hello {
        version: rmem_proto::VERSION,
        page_size: PS as u32,
        nonce: [3; auth::NONCE_LEN],
    }
    .encode(1, &mut hello);
    let mut slow = Client::raw(addr);
    slow.set_read_timeout(Some(rmem_server::HANDSHAKE_TIMEOUT * 3))
        .unwrap();
    let mut writer = slow.try_clone().unwrap();
    let started = Instant::now();
    std::thread::spawn(move || {
        for b in hello {
            std::thread::sleep(Duration::from_millis(300));
            if writer.write_all(&[b]).is_err() {
                return;
            }
        }
    });
    assert_serves(addr);
    let mut buf = [0u8; 64];
    let got = slow.read(&mut buf);
    let took = started.elapsed();
    assert!(matches!(got, Ok(0) | Err(_)), "{got:?}");
    assert!(
        took >= rmem_server::HANDSHAKE_TIMEOUT - Duration::from_millis(100)
            && took < rmem_server::HANDSHAKE_TIMEOUT + Duration::from_secs(2),
        "closed after {took:?}"
    );
}

/// What a `Pull` answered.
fn pull(c: &mut Client, from: SocketAddr, session: SessionId, keys: &[u64]) -> (u32, String) {
    let (op, body) = c.call(Request::Pull {
        from: &from.to_string(),
        session,
        deadline_ms: 2000,
        keys: keys.iter().map(|&k| PageKey(k)).collect(),
    });
    match Response::decode(op, &body).unwrap() {
        Response::Pulled { stored, message } => (stored, message.to_string()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_pull_copies_pages_from_another_server_and_says_what_it_could_not() {
    let (src, src_state) = server(64);
    let (dst, dst_state) = server(6);
    let id = SessionId::random().unwrap();
    let (mut owner, _) = Client::attach(src, id, 0);
    for key in [1u64, 2, 3, 7, 20] {
        let (op, _) = owner.call(Request::Write {
            key: PageKey(key),
            count: 1,
            data: &[key as u8; PS],
        });
        assert_eq!(op, Op::WriteOk);
    }
    let (mut c, _) = Client::attach(dst, id, 0);
    // Consecutive and scattered keys, all there.
    assert_eq!(pull(&mut c, src, id, &[1, 2, 3, 7]), (4, String::new()));
    for key in [1u64, 2, 3, 7] {
        assert_eq!(c.read(key).unwrap(), vec![key as u8; PS], "page {key}");
    }
    // The owner's session there is as it was: one attachment of its own more (the peek's),
    // its pages, and nothing created by a peek at a session that is not there.
    assert_eq!(src_state.used_bytes(), 5 * PS as u64);
    let (stored, why) = pull(&mut c, src, SessionId(12345), &[1]);
    assert_eq!(stored, 0);
    assert!(why.contains("refused"), "{why}");
    assert!(src_state
        .sessions()
        .iter()
        .all(|s| s.id != SessionId(12345)));
    // A key the other server does not hold: the ones before it are stored (a run of
    // consecutive keys is read at once: one of them missing stores none of that run).
    let (stored, why) = pull(&mut c, src, id, &[20, 22, 7]);
    assert_eq!(stored, 1, "{why}");
    assert!(why.contains("refused"), "{why}");
    assert_eq!(c.read(20).unwrap(), vec![20; PS]);
    // Nobody there, and this server full (6 pages: 5 held, the pulls of 1 and 2 overwrite).
    let dead = TcpStream::connect(src).unwrap().local_addr().unwrap();
    let (stored, why) = pull(&mut c, dead, id, &[1]);
    assert_eq!(stored, 0);
    assert!(why.contains("cannot connect"), "{why}");
    // A name is not resolved (a request would wait on DNS): addresses only.
    let (op, body) = c.call(Request::Pull {
        from: &format!("localhost:{}", src.port()),
        session: id,
        deadline_ms: 2000,
        keys: vec![PageKey(1)],
    });
    match Response::decode(op, &body).unwrap() {
        Response::Pulled { stored, message } => {
            assert_eq!(stored, 0);
            assert!(message.contains("not an IP address"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let (stored, why) = pull(&mut c, src, id, &[1, 2, 3, 7, 20]);
    assert_eq!(stored, 5, "overwrites need no room: {why}");
    let (op, _) = owner.call(Request::Write {
        key: PageKey(30),
        count: 2,
        data: &[30; 2 * PS],
    });
    assert_eq!(op, Op::WriteOk);
    let (stored, why) = pull(&mut c, src, id, &[30, 31]);
    assert_eq!((stored, why.as_str()), (1, "this server is full"));
    assert_eq!(dst_state.used_bytes(), 6 * PS as u64);
    // The owner's exclusive attach fences the peek: the next pull opens a new link.
    assert_eq!(pull(&mut c, src, id, &[1]), (1, String::new()));
    let (mut owner2, _) = Client::attach(src, id, rmem_proto::ATTACH_EXCLUSIVE);
    assert!(owner.read(1).is_err(), "the old attachment is fenced");
    let (op, _) = owner2.call(Request::Write {
        key: PageKey(2),
        count: 1,
        data: &[0x77; PS],
    });
    assert_eq!(op, Op::WriteOk);
    assert_eq!(pull(&mut c, src, id, &[2]), (1, String::new()));
    assert_eq!(c.read(2).unwrap(), vec![0x77; PS]);
}

/// A proxy to `real` whose first connection is cut once it has passed `reads` read answers
/// (a link to another server that fails in the middle of a pull); later connections pass
/// everything.
fn cutting_proxy(real: SocketAddr, reads: usize) -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for (n, client) in l.incoming().enumerate() {
            let Ok(mut client) = client else { return };
            let mut up = TcpStream::connect(real).unwrap();
            let (mut c2, mut u2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut u2);
                let _ = u2.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || {
                let mut passed = 0;
                let mut hdr = [0u8; HEADER_LEN];
                let mut body = Vec::new();
                loop {
                    if up.read_exact(&mut hdr).is_err() {
                        break;
                    }
                    let h = parse_header(&hdr, u32::MAX).unwrap().unwrap();
                    body.resize(h.len as usize, 0);
                    if up.read_exact(&mut body).is_err() {
                        break;
                    }
                    if h.op == Op::ReadOk {
                        if n == 0 && passed == reads {
                            break;
                        }
                        passed += 1;
                    }
                    if client.write_all(&hdr).is_err() || client.write_all(&body).is_err() {
                        break;
                    }
                }
                let _ = client.shutdown(std::net::Shutdown::Both);
                let _ = up.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    addr
}

/// A kept link to the other server that fails in the middle of a pull (the pages of its
/// first run stored, then the link cut): the keys not stored yet are asked again over a
/// fresh link, and the pull stores them all. (It answered the part stored and why the link
/// failed, and the client moved the rest itself, and for 30 s every page that server took.)
#[test]
fn a_pull_whose_link_fails_midway_goes_on_over_a_fresh_one() {
    let (src, _) = server(64);
    let (dst, _) = server(64);
    let id = SessionId::random().unwrap();
    let (mut owner, _) = Client::attach(src, id, 0);
    for key in [1u64, 2, 3, 7] {
        let (op, _) = owner.call(Request::Write {
            key: PageKey(key),
            count: 1,
            data: &[key as u8; PS],
        });
        assert_eq!(op, Op::WriteOk);
    }
    // The first link passes two read answers: one for the pull that opens it (kept), one
    // for the first run of the next pull; the second run's is cut.
    let via = cutting_proxy(src, 2);
    let (mut c, _) = Client::attach(dst, id, 0);
    assert_eq!(pull(&mut c, via, id, &[1]), (1, String::new()));
    assert_eq!(pull(&mut c, via, id, &[2, 3, 7]), (3, String::new()));
    for key in [1u64, 2, 3, 7] {
        assert_eq!(c.read(key).unwrap(), vec![key as u8; PS], "page {key}");
    }
}
