//! The server against bad input: every malformed frame closes that one connection, and the
//! server goes on serving other clients. Each test is bounded by socket timeouts.

use rmem_proto::auth::{self, Role, Transcript};
use rmem_proto::{parse_header, ErrorCode, Op, PageKey, Request, Response, HEADER_LEN};
use rmem_server::{Server, ServerConfig, ServerState};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PS: usize = 4096;
const TOKEN: &[u8] = b"test-token";

fn server(capacity_pages: u64) -> (SocketAddr, Arc<ServerState>) {
    let s = Server::bind(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        capacity_bytes: capacity_pages * PS as u64,
        token: TOKEN.to_vec(),
        frame_len_max: rmem_proto::FRAME_LEN_MAX_DEFAULT,
        verbose: true,
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

    fn connect(addr: SocketAddr) -> Client {
        let mut c = Client {
            sock: Client::raw(addr),
            tag: 0,
        };
        let (op, body) = c.handshake(rmem_proto::VERSION, PS as u32, TOKEN);
        match Response::decode(op, &body).unwrap() {
            Response::Welcome { .. } => {}
            other => panic!("no welcome: {other:?}"),
        }
        c
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

#[test]
fn round_trip_swap_free_and_disconnect_release_memory() {
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
    drop(c);
    let t = Instant::now();
    while state.used_bytes() != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "pages not freed on disconnect"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
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
        (rmem_proto::VERSION, 3000, TOKEN),
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
    let (op, body) = c.call(Request::Read {
        key: PageKey(77),
        count: 1,
    });
    assert!(matches!(
        Response::decode(op, &body).unwrap(),
        Response::Error {
            code: ErrorCode::NotFound,
            ..
        }
    ));
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
    assert_eq!(c.call(Request::Ping).0, Op::Pong);
}
