//! What each fuzz target does with one input: the same functions run under libFuzzer
//! (`cargo fuzz run TARGET`, fuzz_targets/) and in the test suite, which replays the committed
//! corpus and mutates it for a bounded time on the stable toolchain
//! (crates/rmem-cli/tests/fuzz.rs). See docs/fuzzing.md.
//!
//! Every decoder of bytes from the network is covered: frames as a server reads them
//! ([`proto_request`]) and as a client reads them ([`proto_response`], status included), the
//! server's handshake, attach and request loop against a lying client ([`server_session`]),
//! the client's handshake, attach and answer matching against a lying server
//! ([`client_session`]), the metrics endpoint's HTTP request heads ([`metrics_http`]),
//! the pool manager's messages both ways ([`pool_frames`]), and the block device's NBD
//! negotiation and requests against a real `rmem nbd` server loop ([`nbd_session`]).
#![allow(dead_code)]

use rmem_client::config::Placement;
use rmem_client::store::remote::{RemoteStore, Timing};
use rmem_client::store::{Completion, PageStore};
use rmem_client::PageIndex;
use rmem_proto::auth::{Role, Transcript, NONCE_LEN};
use rmem_proto::{
    parse_header, Header, Op, Request, Response, SessionId, FRAME_LEN_MAX_DEFAULT, HEADER_LEN,
    VERSION,
};
use rmem_server::{Server, ServerConfig};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A target: the name of its corpus folder and of its file in fuzz_targets/, and its function.
pub type Target = (&'static str, fn(&[u8]));

/// The targets.
pub const TARGETS: [Target; 7] = [
    ("proto_request", proto_request),
    ("proto_response", proto_response),
    ("server_session", server_session),
    ("client_session", client_session),
    ("metrics_http", metrics_http),
    ("pool_frames", pool_frames),
    ("nbd_session", nbd_session),
];

pub const TOKEN: &[u8] = b"fuzz-token";
pub const PAGE: usize = 4096;
/// Longest any read of an answer may wait (an input never makes a peer silent: each side
/// closes its writing half once it has sent the input).
const WAIT: Duration = Duration::from_secs(2);

/// Every whole frame at the front of `data`, in order.
fn frames(mut data: &[u8], mut f: impl FnMut(Header, &[u8])) {
    while let Ok(Some(h)) = parse_header(data, FRAME_LEN_MAX_DEFAULT) {
        let end = HEADER_LEN + h.len as usize;
        if data.len() < end {
            return;
        }
        f(h, &data[HEADER_LEN..end]);
        data = &data[end..];
    }
}

/// Frames as a server decodes them; whatever decodes must encode back to itself.
pub fn proto_request(data: &[u8]) {
    frames(data, |h, body| {
        if let Ok(req) = Request::decode(h.op, body) {
            let mut again = Vec::new();
            req.encode(h.tag, &mut again);
            let h2 = parse_header(&again, u32::MAX).unwrap().unwrap();
            assert_eq!((h2.op, h2.tag), (h.op, h.tag));
            assert_eq!(Request::decode(h2.op, &again[HEADER_LEN..]), Ok(req));
        }
    });
}

/// Frames as a client decodes them (`StatusOk` is `rmem status`'s); the same round trip.
pub fn proto_response(data: &[u8]) {
    frames(data, |h, body| {
        if let Ok(resp) = Response::decode(h.op, body) {
            let mut again = Vec::new();
            resp.encode(h.tag, &mut again);
            let h2 = parse_header(&again, u32::MAX).unwrap().unwrap();
            assert_eq!((h2.op, h2.tag), (h.op, h.tag));
            assert_eq!(Response::decode(h2.op, &again[HEADER_LEN..]), Ok(resp));
        }
    });
}

/// Frames as the pool manager and its clients decode them (`rmem_proto::pool`, both
/// directions); whatever decodes encodes back to itself.
pub fn pool_frames(data: &[u8]) {
    use rmem_proto::pool::{PoolRequest, PoolResponse};
    frames(data, |h, body| {
        let again = |encode: &dyn Fn(&mut Vec<u8>)| {
            let mut again = Vec::new();
            encode(&mut again);
            let h2 = parse_header(&again, u32::MAX).unwrap().unwrap();
            assert_eq!((h2.op, h2.tag), (h.op, h.tag));
            again
        };
        // As a manager decodes a connection of either version.
        for v in [
            rmem_proto::pool::VERSION,
            rmem_proto::pool::VERSION_NODELESS,
        ] {
            if let Ok(req) = PoolRequest::decode_for(v, h.op, body) {
                let f = again(&|o| req.encode_for(v, h.tag, o));
                assert_eq!(PoolRequest::decode_for(v, h.op, &f[HEADER_LEN..]), Ok(req));
            }
        }
        if let Ok(resp) = PoolResponse::decode(h.op, body) {
            let f = again(&|o| resp.encode(h.tag, o));
            assert_eq!(PoolResponse::decode(h.op, &f[HEADER_LEN..]), Ok(resp));
        }
    });
}

/// One in-process server (64 pages) with its metrics endpoint, for every input.
fn server() -> (SocketAddr, SocketAddr) {
    static ADDRS: OnceLock<(SocketAddr, SocketAddr)> = OnceLock::new();
    *ADDRS.get_or_init(|| {
        let server = Server::bind(ServerConfig {
            lease: Duration::from_secs(30),
            ..ServerConfig::loopback(64 * PAGE as u64, TOKEN)
        })
        .expect("bind the fuzzed server");
        let addr = server.local_addr();
        let metrics = server
            .serve_metrics("127.0.0.1:0".parse().unwrap())
            .expect("bind the metrics");
        server.spawn();
        (addr, metrics)
    })
}

fn send(sock: &mut TcpStream, frame: impl FnOnce(&mut Vec<u8>)) {
    let mut out = Vec::new();
    frame(&mut out);
    sock.write_all(&out).expect("send an honest frame");
}

/// One frame, blocking (the socket's read timeout bounds each read).
fn receive(sock: &mut TcpStream, body: &mut Vec<u8>) -> Option<Header> {
    let mut hdr = [0u8; HEADER_LEN];
    sock.read_exact(&mut hdr).ok()?;
    let h = parse_header(&hdr, FRAME_LEN_MAX_DEFAULT).ok()??;
    body.resize(h.len as usize, 0);
    sock.read_exact(body).ok()?;
    Some(h)
}

/// Send what is left of the input, close the writing half, read until the peer closes.
fn finish(mut sock: TcpStream, rest: &[u8]) {
    let _ = sock.write_all(rest);
    let _ = sock.shutdown(Shutdown::Write);
    let mut sink = [0u8; 16 * 1024];
    while matches!(sock.read(&mut sink), Ok(n) if n > 0) {}
}

fn connect(addr: SocketAddr) -> TcpStream {
    let sock = TcpStream::connect(addr).expect("connect to the fuzzed server");
    sock.set_read_timeout(Some(WAIT)).unwrap();
    sock.set_write_timeout(Some(WAIT)).unwrap();
    sock
}

/// The server against a client that is honest up to a point and then sends the input:
/// `data[0] % 4` is how far (0: not at all, 1: hello, 2: hello and auth, 3: and an attach).
pub fn server_session(data: &[u8]) {
    let Some((&stage, rest)) = data.split_first() else {
        return;
    };
    let mut sock = connect(server().0);
    let mut body = Vec::new();
    if stage % 4 >= 1 {
        let mut t = Transcript {
            client_nonce: [stage; NONCE_LEN],
            server_nonce: [0; NONCE_LEN],
            version: VERSION,
            page_size: PAGE as u32,
        };
        send(&mut sock, |o| {
            Request::Hello {
                version: VERSION,
                page_size: PAGE as u32,
                nonce: t.client_nonce,
            }
            .encode(1, o)
        });
        let h = receive(&mut sock, &mut body).expect("a challenge");
        match Response::decode(h.op, &body) {
            Ok(Response::Challenge { nonce }) => t.server_nonce = nonce,
            other => panic!("a hello was answered {other:?}"),
        }
        if stage % 4 >= 2 {
            let proof = t.proof(TOKEN, Role::Client);
            send(&mut sock, |o| Request::Auth { proof }.encode(2, o));
            let h = receive(&mut sock, &mut body).expect("a welcome");
            match Response::decode(h.op, &body) {
                Ok(Response::Welcome { proof, .. }) => {
                    assert!(t.verify(TOKEN, Role::Server, &proof), "the server's proof")
                }
                other => panic!("an auth was answered {other:?}"),
            }
        }
        if stage % 4 >= 3 {
            send(&mut sock, |o| {
                Request::Attach {
                    session: SessionId(0xF022),
                    lease_ms: 0,
                    flags: 0,
                    reserved: 0,
                }
                .encode(3, o)
            });
            let h = receive(&mut sock, &mut body).expect("an attach answer");
            assert_eq!(h.op, Op::Attached, "attach answered {:?}", h.op);
        }
    }
    finish(sock, rest);
}

/// The server's side of an honest handshake for [`client_session`]; false if the client
/// went away.
fn fake_handshake(sock: &mut TcpStream, stage: u8) -> bool {
    let mut body = Vec::new();
    let Some(h) = receive(sock, &mut body) else {
        return false;
    };
    let Ok(Request::Hello {
        version,
        page_size,
        nonce,
    }) = Request::decode(h.op, &body)
    else {
        panic!("the client opened with {:?}", h.op);
    };
    if stage == 0 {
        return false;
    }
    let t = Transcript {
        client_nonce: nonce,
        server_nonce: [0x5E; NONCE_LEN],
        version,
        page_size,
    };
    let nonce = t.server_nonce;
    send(sock, |o| Response::Challenge { nonce }.encode(h.tag, o));
    let Some(h) = receive(sock, &mut body) else {
        return false;
    };
    let Ok(Request::Auth { proof }) = Request::decode(h.op, &body) else {
        panic!("the client answered the challenge with {:?}", h.op);
    };
    assert!(t.verify(TOKEN, Role::Client, &proof), "the client's proof");
    if stage == 1 {
        return false;
    }
    let proof = t.proof(TOKEN, Role::Server);
    send(sock, |o| {
        Response::Welcome {
            version: VERSION,
            frame_len_max: FRAME_LEN_MAX_DEFAULT,
            capacity_bytes: 1 << 30,
            used_bytes: 0,
            proof,
        }
        .encode(h.tag, o)
    });
    let Some(h) = receive(sock, &mut body) else {
        return false;
    };
    assert_eq!(
        h.op,
        Op::Attach,
        "the client sent {:?} after the welcome",
        h.op
    );
    if stage == 2 {
        return false;
    }
    send(sock, |o| {
        Response::Attached {
            lease_ms: 30_000,
            flags: 0,
            session_bytes: 0,
        }
        .encode(h.tag, o)
    });
    true
}

/// The client against a server that is honest up to a point and then sends the input:
/// `data[0] % 4` picks what the input stands in for (0: the challenge, 1: the welcome, 2: the
/// attach answer, 3: the answers to two writes (tags 1, 2), a read of page 0 (tag 3), and
/// the write of page 2 and read of page 1 of a swap (tags 4, 5)). The client may fail, never panic, hang,
/// or hand the pager a page it did not ask for or of the wrong size.
pub fn client_session(data: &[u8]) {
    let Some((&stage, rest)) = data.split_first() else {
        return;
    };
    let stage = stage % 4;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let rest = rest.to_vec();
    let fake = std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(WAIT)).unwrap();
        fake_handshake(&mut sock, stage);
        finish(sock, &rest);
    });
    let timing = Timing {
        connect: WAIT,
        request: Duration::from_millis(500),
        heartbeat: Duration::from_secs(10),
        reconnect: Duration::ZERO,
    };
    if let Ok(mut store) = RemoteStore::connect(&[addr], TOKEN, PAGE, Placement::Priority, timing) {
        let run = |store: &mut RemoteStore| -> Result<(), rmem_client::store::StoreError> {
            store.store(PageIndex(0), &[1; PAGE])?;
            store.store(PageIndex(1), &[2; PAGE])?;
            store.fetch(PageIndex(0))?;
            store.swap(PageIndex(2), &[3; PAGE], PageIndex(1))?;
            let deadline = Instant::now() + 2 * WAIT;
            let mut done = 0;
            while done < 5 && Instant::now() < deadline {
                store.flush()?;
                store.poll(&mut |c| {
                    done += 1;
                    if let Completion::Fetched { page, data } = c {
                        assert!(page.0 <= 1, "fetched page {} never asked for", page.0);
                        assert_eq!(data.len(), PAGE, "a page of the wrong size");
                    }
                })?;
                store.tick(Instant::now())?;
                std::thread::sleep(Duration::from_micros(100));
            }
            assert!(done <= 5, "{done} completions for 5 operations");
            Ok(())
        };
        let _ = run(&mut store);
    }
    fake.join().expect("the fake server");
}

/// The metrics endpoint's HTTP request head parsing.
pub fn metrics_http(data: &[u8]) {
    let sock = connect(server().1);
    finish(sock, data);
}

/// Blocks of the fuzzed NBD export, and of its cache: requests evict, write back and fetch.
const NBD_BLOCKS: u64 = 64;
const NBD_CACHE_BLOCKS: u64 = 8;
/// The largest request the fuzzed export takes (as `rmem nbd`'s, smaller).
const NBD_REQUEST_MAX: u32 = 1 << 20;

/// One in-process NBD server (rmem-nbd's server loop over a block cache of
/// [`NBD_CACHE_BLOCKS`] over an in-process page store), for every input.
fn nbd_server() -> SocketAddr {
    use rmem_client::blocks::BlockCache;
    use rmem_client::stats::Stats;
    use rmem_client::store::mem::MemStore;
    use rmem_nbd::proto::{self, Export};
    use rmem_nbd::server::{Limits, Listener, Server};
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fuzzed NBD server");
        let addr = listener.local_addr().unwrap();
        std::thread::Builder::new()
            .name("fuzz-nbd".into())
            .spawn(move || {
                let mut cache = BlockCache::new(
                    Box::new(MemStore::new(PAGE, NBD_BLOCKS * PAGE as u64)),
                    rmem_policy::by_name("fifo").unwrap(),
                    PAGE,
                    NBD_CACHE_BLOCKS * PAGE as u64,
                    std::sync::Arc::new(Stats::default()),
                );
                let export = Export {
                    name: "fuzz".into(),
                    description: "the fuzzed export".into(),
                    size_bytes: NBD_BLOCKS * PAGE as u64,
                    flags: proto::SERVED_FLAGS,
                    block_min: 1,
                    block_preferred: PAGE as u32,
                    block_max: NBD_REQUEST_MAX,
                };
                let mut server = Server::new(
                    &mut cache,
                    export,
                    Limits::default(),
                    vec![Listener::Tcp(listener)],
                )
                .expect("the fuzzed NBD server");
                // Never written: the server serves for the life of the process.
                let mut stop = [0; 2];
                // SAFETY: a plain pipe(2) into a local array.
                assert_eq!(unsafe { libc::pipe(stop.as_mut_ptr()) }, 0);
                server.run(stop[0]).expect("the fuzzed NBD server serves");
            })
            .expect("start the fuzzed NBD server");
        addr
    })
}

/// An NBD option as a client sends it.
fn nbd_option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    use rmem_nbd::proto::IHAVEOPT;
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// NBD_OPT_GO or NBD_OPT_INFO's data: the export `name` and these info requests.
fn nbd_info_data(name: &[u8], infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name);
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// An NBD transmission request as a client sends it (a write's payload follows).
fn nbd_request(out: &mut Vec<u8>, flags: u16, command: u16, cookie: u64, offset: u64, len: u32) {
    use rmem_nbd::proto::REQUEST_MAGIC;
    out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&command.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// An honest client's negotiation up to transmission (with structured replies if asked);
/// every answer is checked. Returns the socket, ready for requests.
fn nbd_negotiate(structured: bool) -> TcpStream {
    use rmem_nbd::proto::*;
    let mut sock = connect(nbd_server());
    sock.set_nodelay(true).unwrap();
    let mut greeting = [0u8; 18];
    sock.read_exact(&mut greeting).expect("the NBD greeting");
    assert_eq!(
        greeting[..16],
        [NBDMAGIC.to_be_bytes(), IHAVEOPT.to_be_bytes()].concat()
    );
    let mut out = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    if structured {
        nbd_option(&mut out, OPT_STRUCTURED_REPLY, &[]);
    }
    nbd_option(&mut out, OPT_GO, &nbd_info_data(b"", &[INFO_BLOCK_SIZE]));
    sock.write_all(&out).expect("send the negotiation");
    // Option replies until GO's ACK: magic, option, type, length, data.
    let mut acks = 0;
    while acks < 1 + usize::from(structured) {
        let mut head = [0u8; 20];
        sock.read_exact(&mut head).expect("an option reply");
        assert_eq!(head[..8], REPLY_MAGIC_OPT.to_be_bytes());
        let kind = u32::from_be_bytes(head[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(head[16..20].try_into().unwrap());
        let mut data = vec![0u8; len as usize];
        sock.read_exact(&mut data).expect("an option reply's data");
        match kind {
            REP_ACK => acks += 1,
            REP_INFO => {}
            other => panic!("an honest negotiation was answered {other:#x}: {data:?}"),
        }
    }
    sock
}

/// After an input: a fresh honest client writes a block and reads it back. The server must
/// still serve (what one connection sends never disturbs another) and give back its bytes.
fn nbd_probe(seed: u8) {
    use rmem_nbd::proto::{Command, SIMPLE_REPLY_MAGIC};
    let mut sock = nbd_negotiate(false);
    // The last block: inputs may write it too, but each input's connection is over by now.
    let offset = (NBD_BLOCKS - 1) * PAGE as u64 + 100;
    let block: Vec<u8> = (0..1000u32).map(|i| (i as u8) ^ seed).collect();
    // The read goes once the write is answered: requests in flight together may be served
    // in any order (the protocol's rule, and this server's).
    let reply = |sock: &mut TcpStream, cookie: u64, len: usize| {
        let mut head = [0u8; 16];
        sock.read_exact(&mut head)
            .expect("a reply to the probe: the server stopped serving");
        assert_eq!(head[..4], SIMPLE_REPLY_MAGIC.to_be_bytes());
        let error = u32::from_be_bytes(head[4..8].try_into().unwrap());
        assert_eq!(error, 0, "the probe's request {cookie:#x} failed");
        assert_eq!(
            head[8..16],
            cookie.to_be_bytes(),
            "a reply to a request not sent"
        );
        let mut data = vec![0u8; len];
        sock.read_exact(&mut data).expect("the probe's read");
        data
    };
    let mut out = Vec::new();
    nbd_request(
        &mut out,
        0,
        Command::Write.code(),
        0xB1,
        offset,
        block.len() as u32,
    );
    out.extend_from_slice(&block);
    sock.write_all(&out).expect("send the probe's write");
    reply(&mut sock, 0xB1, 0);
    out.clear();
    nbd_request(
        &mut out,
        0,
        Command::Read.code(),
        0xB2,
        offset,
        block.len() as u32,
    );
    sock.write_all(&out).expect("send the probe's read");
    assert_eq!(
        reply(&mut sock, 0xB2, block.len()),
        block,
        "the probe read back other bytes"
    );
    let mut out = Vec::new();
    nbd_request(&mut out, 0, Command::Disc.code(), 0xB3, 0, 0);
    finish(sock, &out);
}

/// The NBD server (`rmem nbd`'s loop, over a cache small enough that requests evict) against a
/// client honest up to a point, then the input: `data[0] % 4` is how far (0: nothing, the
/// input follows the greeting; 1: the client flags, the input is options; 2: negotiated, the
/// input is requests; 3: the same with structured replies). Then a fresh client must still be
/// served and read back what it wrote ([`nbd_probe`]).
pub fn nbd_session(data: &[u8]) {
    use rmem_nbd::proto::*;
    let Some((&stage, rest)) = data.split_first() else {
        return;
    };
    let sock = match stage % 4 {
        0 | 1 => {
            let mut sock = connect(nbd_server());
            let mut greeting = [0u8; 18];
            sock.read_exact(&mut greeting).expect("the NBD greeting");
            if stage % 4 == 1 {
                let flags = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
                sock.write_all(&flags.to_be_bytes())
                    .expect("send the client flags");
            }
            sock
        }
        s => nbd_negotiate(s == 3),
    };
    finish(sock, rest);
    nbd_probe(stage);
}

/// One exchange of each kind for [`nbd_session`], each behind its stage byte.
fn nbd_seeds() -> Vec<Vec<u8>> {
    use rmem_nbd::proto::*;
    let flags = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes();
    let mut options = Vec::new();
    nbd_option(&mut options, OPT_LIST, &[]);
    nbd_option(
        &mut options,
        OPT_INFO,
        &nbd_info_data(b"fuzz", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
    );
    nbd_option(&mut options, OPT_STARTTLS, &[]);
    nbd_option(&mut options, 42, b"unknown");
    nbd_option(&mut options, OPT_INFO, &nbd_info_data(b"other", &[]));
    nbd_option(&mut options, OPT_STRUCTURED_REPLY, &[]);
    let mut go = options.clone();
    nbd_option(&mut go, OPT_GO, &nbd_info_data(b"fuzz", &[INFO_BLOCK_SIZE]));
    let mut export_name = Vec::new();
    nbd_option(&mut export_name, OPT_EXPORT_NAME, b"");
    let mut abort = Vec::new();
    nbd_option(&mut abort, OPT_ABORT, &[]);
    // Requests: writes aligned and not, with FUA; reads across blocks; flush, trim,
    // write-zeroes, an unknown command, a request past the end, then a disconnect.
    let page = PAGE as u64;
    let mut reqs = Vec::new();
    nbd_request(&mut reqs, 0, Command::Write.code(), 1, 0, 4096);
    reqs.extend(std::iter::repeat_n(0x5A, 4096));
    nbd_request(
        &mut reqs,
        CMD_FLAG_FUA,
        Command::Write.code(),
        2,
        3 * page + 7,
        5000,
    );
    reqs.extend(std::iter::repeat_n(0xC3, 5000));
    nbd_request(&mut reqs, 0, Command::Read.code(), 3, 2 * page, 3 * 4096);
    nbd_request(&mut reqs, 0, Command::Flush.code(), 4, 0, 0);
    nbd_request(&mut reqs, 0, Command::Trim.code(), 5, 10 * page, 2 * 4096);
    nbd_request(
        &mut reqs,
        CMD_FLAG_NO_HOLE,
        Command::WriteZeroes.code(),
        6,
        20 * page + 1,
        100,
    );
    nbd_request(&mut reqs, 0, Command::Read.code(), 7, 20 * page, 4096);
    nbd_request(&mut reqs, 0, 5, 8, 0, 0); // NBD_CMD_CACHE: not served
    nbd_request(
        &mut reqs,
        0,
        Command::Read.code(),
        9,
        NBD_BLOCKS * page - 10,
        20,
    );
    // Touch more blocks than the cache holds: evictions, write-backs and fetches.
    for b in 0..2 * NBD_CACHE_BLOCKS {
        nbd_request(
            &mut reqs,
            0,
            Command::Write.code(),
            100 + b,
            (30 + b) * page,
            16,
        );
        reqs.extend(std::iter::repeat_n(b as u8, 16));
    }
    for b in 0..2 * NBD_CACHE_BLOCKS {
        nbd_request(
            &mut reqs,
            0,
            Command::Read.code(),
            200 + b,
            (30 + b) * page,
            16,
        );
    }
    let mut disc = Vec::new();
    nbd_request(&mut disc, 0, Command::Disc.code(), 10, 0, 0);
    let cat = |parts: &[&[u8]]| parts.concat();
    vec![
        cat(&[&[0], &flags, &go, &reqs, &disc]),
        cat(&[&[0], &flags, &export_name, &reqs]),
        cat(&[&[0], &[0, 0, 0, 1], &abort]),
        cat(&[&[1], &options, &abort]),
        cat(&[&[1], &go, &reqs, &disc]),
        cat(&[&[2], &reqs, &disc]),
        cat(&[&[3], &reqs, &disc]),
    ]
}

/// The committed seed corpus (fuzz/corpus/TARGET/seed-N), one valid exchange of each kind:
/// written by `cargo test --release -p rmem-cli --test fuzz -- --ignored write_seed_corpus`.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    use rmem_proto::{PageKey, ServerStatus, SessionStatus, ATTACH_EXCLUSIVE};
    let page = vec![0xA5u8; PAGE];
    let frame = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut o = Vec::new();
        f(&mut o);
        o
    };
    let hello = frame(&|o| {
        Request::Hello {
            version: VERSION,
            page_size: PAGE as u32,
            nonce: [7; NONCE_LEN],
        }
        .encode(1, o)
    });
    let requests = [
        hello.clone(),
        frame(&|o| Request::Auth { proof: [9; 32] }.encode(2, o)),
        frame(&|o| {
            Request::Attach {
                session: SessionId(0xF022),
                lease_ms: 1000,
                flags: ATTACH_EXCLUSIVE,
                reserved: 0,
            }
            .encode(3, o)
        }),
        frame(&|o| {
            Request::Write {
                key: PageKey(5),
                count: 1,
                data: &page,
            }
            .encode(4, o)
        }),
        frame(&|o| {
            Request::Read {
                key: PageKey(5),
                count: 1,
            }
            .encode(5, o)
        }),
        frame(&|o| {
            Request::Swap {
                write_key: PageKey(6),
                read_key: PageKey(5),
                data: &page,
            }
            .encode(6, o)
        }),
        frame(&|o| {
            Request::Free {
                keys: vec![PageKey(5), PageKey(6)],
            }
            .encode(7, o)
        }),
        frame(&|o| Request::Ping.encode(8, o)),
        frame(&|o| {
            // Nobody listens on port 1: the server's pull fails at once.
            Request::Pull {
                from: "127.0.0.1:1",
                session: SessionId(0xF022),
                deadline_ms: 50,
                keys: vec![PageKey(5), PageKey(6)],
            }
            .encode(12, o)
        }),
        frame(&|o| Request::Status.encode(9, o)),
        frame(&|o| {
            Request::Snapshot {
                session: SessionId(0xF0F0),
            }
            .encode(11, o)
        }),
        frame(&|o| {
            Request::EndSnapshot {
                session: SessionId(0xF0F0),
            }
            .encode(12, o)
        }),
        frame(&|o| {
            Request::WriteRange {
                key: PageKey(9),
                offset: 4090,
                data: &page[..6],
            }
            .encode(13, o)
        }),
        frame(&|o| {
            Request::ReadRange {
                key: PageKey(9),
                offset: 4000,
                len: 96,
            }
            .encode(14, o)
        }),
        frame(&|o| Request::EndSession.encode(10, o)),
    ];
    let status = ServerStatus {
        capacity_bytes: 1 << 30,
        used_bytes: 8192,
        lease_ms: 30_000,
        sessions_total: 1,
        sessions: vec![SessionStatus {
            id: SessionId(0xF022),
            used_bytes: 8192,
            lease_age_ms: 10,
            connections: 1,
        }],
    };
    let responses = [
        frame(&|o| {
            Response::Challenge {
                nonce: [3; NONCE_LEN],
            }
            .encode(1, o)
        }),
        frame(&|o| {
            Response::Welcome {
                version: VERSION,
                frame_len_max: FRAME_LEN_MAX_DEFAULT,
                capacity_bytes: 1 << 30,
                used_bytes: 0,
                proof: [4; 32],
            }
            .encode(2, o)
        }),
        frame(&|o| {
            Response::Attached {
                lease_ms: 30_000,
                flags: 1,
                session_bytes: 4096,
            }
            .encode(0, o)
        }),
        frame(&|o| Response::StatusOk(status.clone()).encode(9, o)),
        frame(&|o| Response::SessionEnded { freed_bytes: 8192 }.encode(10, o)),
        frame(&|o| {
            Response::Error {
                code: rmem_proto::ErrorCode::Full,
                message: "server full",
            }
            .encode(4, o)
        }),
        frame(&|o| Response::SnapshotOk { created: true }.encode(11, o)),
        frame(&|o| {
            Response::ReadRangeOk {
                key: PageKey(9),
                offset: 4000,
                data: &page[..96],
            }
            .encode(14, o)
        }),
        frame(&|o| {
            Response::WriteRangeOk {
                key: PageKey(9),
                offset: 4090,
                len: 6,
            }
            .encode(13, o)
        }),
        frame(&|o| {
            Response::Pulled {
                stored: 1,
                message: "cannot connect to 127.0.0.1:1",
            }
            .encode(15, o)
        }),
    ];
    // What client_session's honest server would answer to its five requests (then other
    // answers, for proto_response).
    let answers = [
        frame(&|o| {
            Response::WriteOk {
                key: PageKey(0),
                count: 1,
            }
            .encode(1, o)
        }),
        frame(&|o| {
            Response::WriteOk {
                key: PageKey(1),
                count: 1,
            }
            .encode(2, o)
        }),
        frame(&|o| {
            Response::ReadOk {
                key: PageKey(0),
                count: 1,
                data: &page,
            }
            .encode(3, o)
        }),
        frame(&|o| {
            Response::WriteOk {
                key: PageKey(2),
                count: 1,
            }
            .encode(4, o)
        }),
        frame(&|o| {
            Response::ReadOk {
                key: PageKey(1),
                count: 1,
                data: &page,
            }
            .encode(5, o)
        }),
        frame(&|o| {
            Response::SwapOk {
                read_key: PageKey(1),
                data: &page,
            }
            .encode(6, o)
        }),
        frame(&|o| {
            Response::Pong {
                used_bytes: 0,
                capacity_bytes: 1,
            }
            .encode(7, o)
        }),
        frame(&|o| Response::FreeOk { count: 2 }.encode(8, o)),
    ];
    let staged = |stage: u8, frames: &[Vec<u8>]| {
        let mut d = vec![stage];
        frames.iter().for_each(|f| d.extend_from_slice(f));
        d
    };
    let mut out = vec![
        ("proto_request", requests.concat()),
        ("proto_response", responses.concat()),
        ("proto_response", answers.concat()),
        ("server_session", staged(0, &requests[..1])),
        ("server_session", staged(1, &requests[1..2])),
        ("server_session", staged(2, &requests[2..3])),
        ("server_session", staged(3, &requests[3..])),
        ("client_session", staged(0, &responses[..1])),
        ("client_session", staged(1, &responses[1..2])),
        ("client_session", staged(2, &responses[2..3])),
        ("client_session", staged(3, &answers[..5])),
        ("client_session", staged(3, &responses[5..6])),
        (
            "metrics_http",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
        ("metrics_http", b"POST / HTTP/1.0\n\n".to_vec()),
    ];
    for r in &requests {
        out.push(("proto_request", r.clone()));
    }
    out.extend(pool_seeds().into_iter().map(|f| ("pool_frames", f)));
    out.extend(nbd_seeds().into_iter().map(|f| ("nbd_session", f)));
    for r in responses.iter().chain(&answers) {
        out.push(("proto_response", r.clone()));
    }
    out
}

/// One frame of each of the pool manager's messages.
fn pool_seeds() -> Vec<Vec<u8>> {
    use rmem_proto::pool::*;
    let uses = vec![ServerUse {
        server: "127.0.0.1:7000".into(),
        bytes: 8192,
        kept: "--redundancy ec:4+1 puts each page on 5 servers, and 4 others are left".into(),
    }];
    let sessions = vec![SessionUse {
        session: SessionId(0xF022),
        bytes: 8192,
    }];
    let requests = [
        PoolRequest::ServerBeat(ServerBeat {
            addr: "127.0.0.1:7000".into(),
            capacity_bytes: 1 << 30,
            used_bytes: 8192,
            flags: 0,
            sessions: sessions.clone(),
            node: "fuzz/net:4026531840".into(),
        }),
        PoolRequest::ClientBeat(ClientBeat {
            session: SessionId(0xF022),
            name: "stress (pid 1) on fuzz".into(),
            max_remote_bytes: UNLIMITED,
            uses: uses.clone(),
            node: "fuzz/net:4026531840".into(),
        }),
        PoolRequest::Status,
        PoolRequest::Drain {
            server: "127.0.0.1:7000".into(),
        },
    ];
    let responses = [
        PoolResponse::ServerAck {
            heartbeat_ms: 1000,
            flags: 0,
        },
        PoolResponse::ClientAck {
            heartbeat_ms: 1000,
            grant_bytes: 1 << 30,
            servers: vec![ServerOffer {
                addr: "127.0.0.1:7000".into(),
                capacity_bytes: 1 << 30,
                free_bytes: 1 << 29,
                flags: 0,
            }],
        },
        PoolResponse::StatusOk(PoolStatus {
            heartbeat_ms: 1000,
            servers: vec![ServerRow {
                addr: "127.0.0.1:7000".into(),
                capacity_bytes: 1 << 30,
                used_bytes: 8192,
                flags: ROW_LOST,
                beat_age_ms: 5,
                sessions,
            }],
            clients: vec![ClientRow {
                session: SessionId(0xF022),
                name: "stress".into(),
                max_remote_bytes: UNLIMITED,
                grant_bytes: UNLIMITED,
                beat_age_ms: 3,
                uses,
            }],
        }),
        PoolResponse::DrainOk,
    ];
    let mut out: Vec<Vec<u8>> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let mut f = Vec::new();
        r.encode(i as u64, &mut f);
        out.push(f);
    }
    for (i, r) in responses.iter().enumerate() {
        let mut f = Vec::new();
        r.encode(i as u64, &mut f);
        out.push(f);
    }
    let all = out.concat();
    out.push(all);
    out
}
