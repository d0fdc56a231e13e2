//! The client against a hostile memory server: a server in this test that speaks the real
//! handshake (rmem-proto's challenge and response), stores the pages it is given, and then
//! answers the program's reads wrongly: garbage, a page of the wrong size, a frame cut short,
//! a length past the limit, another request's tag, another page's key and data, or nothing at
//! all; on new links, a handshake that never comes or comes a byte at a time. Each time the
//! program (`tests/c/touch_forever.c`, which checks every word it reads) must stop with
//! status 69 and `rmem: fatal: ...` naming the server, within the timeouts set here: never a
//! crash, a hang, or a wrong word. Every wait is bounded.

mod common;
use common::*;
use rmem_proto::auth::{self, Role, Transcript};
use rmem_proto::{
    parse_header, PageKey, Request, Response, FRAME_LEN_MAX_DEFAULT, HEADER_LEN, VERSION,
};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TOKEN: &str = "secret-for-the-hostile-server-test";
const PAGE: usize = 16 * 1024;

/// What the server does instead of answering a read (a `Read`, or a `Swap`'s read half).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Misbehavior {
    /// 64 bytes of noise in place of the answer.
    Garbage,
    /// A well-framed `ReadOk` with one byte less than a page.
    ShortPage,
    /// A header whose length promises a page, 100 bytes of it, then the link closes.
    Truncated,
    /// A header whose length is past the frame limit the server announced.
    Oversized,
    /// The server announced no frame limit (u32::MAX) and sends a 1 GiB frame header.
    BeyondBuffer,
    /// The answer, with the tag of a request sent later.
    WrongTag,
    /// The right tag, but another page's key and contents.
    OtherPage,
    /// No answer at all; the link stays open.
    Stall,
    /// No answer on the first link; on every new link, no challenge after the hello.
    StallThenSilentHandshake,
    /// No answer on the first link; on every new link, the challenge one byte every 300 ms.
    StallThenTrickledHandshake,
}

/// The test's server: a listener thread and a thread per link.
struct Hostile {
    addr: String,
    links: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Store {
    pages: HashMap<u64, Vec<u8>>,
    sessions: HashSet<u128>,
}

impl Hostile {
    fn start(how: Misbehavior) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let links = Arc::new(AtomicUsize::new(0));
        let store = Arc::new(Mutex::new(Store::default()));
        let counter = links.clone();
        std::thread::spawn(move || {
            for sock in listener.incoming() {
                let Ok(sock) = sock else { return };
                let link = counter.fetch_add(1, Ordering::SeqCst);
                let store = store.clone();
                std::thread::spawn(move || serve(sock, how, link, &store));
            }
        });
        Hostile { addr, links }
    }
}

fn read_frame(sock: &mut TcpStream, body: &mut Vec<u8>) -> Option<rmem_proto::Header> {
    let mut hdr = [0u8; HEADER_LEN];
    sock.read_exact(&mut hdr).ok()?;
    let h = parse_header(&hdr, FRAME_LEN_MAX_DEFAULT).unwrap().unwrap();
    body.resize(h.len as usize, 0);
    sock.read_exact(body).ok()?;
    Some(h)
}

fn send(sock: &mut TcpStream, tag: u64, r: Response<'_>) {
    let mut out = Vec::new();
    r.encode(tag, &mut out);
    let _ = sock.write_all(&out);
}

/// Swallow whatever the client sends until it closes the link.
fn drain(mut sock: TcpStream) {
    let mut buf = [0u8; 4096];
    while matches!(sock.read(&mut buf), Ok(n) if n > 0) {}
}

fn serve(mut sock: TcpStream, how: Misbehavior, link: usize, store: &Mutex<Store>) {
    let mut body = Vec::new();
    let Some(h) = read_frame(&mut sock, &mut body) else {
        return;
    };
    let Ok(Request::Hello {
        version,
        page_size,
        nonce,
    }) = Request::decode(h.op, &body)
    else {
        return;
    };
    let t = Transcript {
        client_nonce: nonce,
        server_nonce: auth::nonce().unwrap(),
        version,
        page_size,
    };
    let mut challenge = Vec::new();
    Response::Challenge {
        nonce: t.server_nonce,
    }
    .encode(h.tag, &mut challenge);
    match how {
        Misbehavior::StallThenSilentHandshake if link > 0 => return drain(sock),
        Misbehavior::StallThenTrickledHandshake if link > 0 => {
            for b in challenge {
                std::thread::sleep(Duration::from_millis(300));
                if sock.write_all(&[b]).is_err() {
                    return;
                }
            }
            return drain(sock);
        }
        _ => sock.write_all(&challenge).unwrap(),
    }
    let Some(h) = read_frame(&mut sock, &mut body) else {
        return;
    };
    let Ok(Request::Auth { proof }) = Request::decode(h.op, &body) else {
        return;
    };
    assert!(t.verify(TOKEN.as_bytes(), Role::Client, &proof));
    let frame_len_max = match how {
        Misbehavior::BeyondBuffer => u32::MAX,
        _ => FRAME_LEN_MAX_DEFAULT,
    };
    send(
        &mut sock,
        h.tag,
        Response::Welcome {
            version: VERSION,
            frame_len_max,
            capacity_bytes: 1 << 30,
            used_bytes: 0,
            proof: t.proof(TOKEN.as_bytes(), Role::Server),
        },
    );
    while let Some(h) = read_frame(&mut sock, &mut body) {
        let req = Request::decode(h.op, &body).unwrap();
        let mut part = None;
        let read = match req {
            Request::Attach { session, .. } => {
                let existed = !store.lock().unwrap().sessions.insert(session.0);
                let flags = if existed {
                    rmem_proto::ATTACHED_EXISTED
                } else {
                    0
                };
                let attached = Response::Attached {
                    lease_ms: 30_000,
                    flags,
                    session_bytes: 0,
                };
                send(&mut sock, h.tag, attached);
                continue;
            }
            Request::Write { key, count, data } => {
                assert_eq!(count, 1);
                store.lock().unwrap().pages.insert(key.0, data.to_vec());
                send(&mut sock, h.tag, Response::WriteOk { key, count });
                continue;
            }
            Request::Ping => {
                let pong = Response::Pong {
                    used_bytes: 0,
                    capacity_bytes: 1 << 30,
                };
                send(&mut sock, h.tag, pong);
                continue;
            }
            Request::Free { keys } => {
                let count = keys.len() as u32;
                send(&mut sock, h.tag, Response::FreeOk { count });
                continue;
            }
            Request::EndSession => {
                send(&mut sock, h.tag, Response::SessionEnded { freed_bytes: 0 });
                continue;
            }
            Request::Read { key, .. } => key,
            // A sub-page fetch: the same misbehaviors, on the part asked.
            Request::ReadPart { key, offset, len } => {
                part = Some((offset as usize, len as usize));
                key
            }
            Request::Swap {
                write_key,
                read_key,
                data,
            } => {
                store
                    .lock()
                    .unwrap()
                    .pages
                    .insert(write_key.0, data.to_vec());
                read_key
            }
            other => panic!("unexpected {other:?}"),
        };
        let op = h.op;
        let page = store.lock().unwrap().pages.get(&read.0).cloned();
        let page = page.unwrap_or_else(|| vec![0; PAGE]);
        let asked = |page: &[u8]| match part {
            Some((o, l)) => page[o..o + l].to_vec(),
            None => page.to_vec(),
        };
        let page = asked(&page);
        let offset = part.map_or(0, |(o, _)| o as u32);
        let mut out = Vec::new();
        match how {
            Misbehavior::Garbage => out.extend((0..64u32).map(|i| (i * 37 + 11) as u8)),
            Misbehavior::ShortPage => answer((op, offset), h.tag, read, &page[1..], &mut out),
            Misbehavior::Truncated => {
                answer((op, offset), h.tag, read, &page, &mut out);
                out.truncate(HEADER_LEN + 100);
                let _ = sock.write_all(&out);
                return;
            }
            Misbehavior::Oversized | Misbehavior::BeyondBuffer => {
                answer((op, offset), h.tag, read, &page, &mut out);
                let len = match how {
                    Misbehavior::Oversized => FRAME_LEN_MAX_DEFAULT + 1,
                    _ => 1 << 30,
                };
                out[0..4].copy_from_slice(&len.to_le_bytes());
            }
            Misbehavior::WrongTag => answer((op, offset), h.tag + 1, read, &page, &mut out),
            Misbehavior::OtherPage => {
                let (key, other) = {
                    let s = store.lock().unwrap();
                    let (k, p) = s.pages.iter().find(|(&k, _)| k != read.0).unwrap();
                    (PageKey(*k), asked(p))
                };
                answer((op, offset), h.tag, key, &other, &mut out);
            }
            Misbehavior::Stall
            | Misbehavior::StallThenSilentHandshake
            | Misbehavior::StallThenTrickledHandshake => return drain(sock),
        }
        if sock.write_all(&out).is_err() {
            return;
        }
    }
}

/// The answer to a read, a part read or a swap (`op`) of `key`, with `data`.
fn answer(
    (op, offset): (rmem_proto::Op, u32),
    tag: u64,
    key: PageKey,
    data: &[u8],
    out: &mut Vec<u8>,
) {
    let r = match op {
        rmem_proto::Op::Swap => Response::SwapOk {
            read_key: key,
            data,
        },
        rmem_proto::Op::ReadPart => Response::ReadRangeOk { key, offset, data },
        _ => Response::ReadOk {
            key,
            count: 1,
            data,
        },
    };
    r.encode(tag, out);
}

/// Run `touch_forever` (8 MiB through 4 MiB of local memory, 16 KiB pages) against a server
/// that misbehaves `how`; check that it stops as it must. Returns its stderr.
fn against(how: Misbehavior) -> String {
    let server = Hostile::start(how);
    let prog = build_c("tests/c/touch_forever.c");
    let child = Command::new(&prog)
        .args(["8", "60"])
        .env("RMEM_SERVERS", &server.addr)
        .env("RMEM_TOKEN", TOKEN)
        .env("RMEM_LOCAL", "4M")
        .env("RMEM_PAGE_SIZE", "16K")
        .env("RMEM_SERVER_TIMEOUT_MS", "500")
        .env("RMEM_CONNECT_TIMEOUT_MS", "1000")
        .env("RMEM_RECONNECT_MS", "2000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Filling takes a second or two; then the first read meets the misbehavior, and at worst
    // a request timeout plus the reconnection window plus a connect timeout later it stops.
    let out = wait_bounded(child, Duration::from_secs(30), &format!("{how:?}"));
    let shown = format!(
        "{how:?}: {:?} after {:?}, {} links\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.elapsed,
        server.links.load(Ordering::SeqCst),
        out.stdout,
        out.stderr
    );
    eprintln!("{shown}");
    assert!(out.stdout.contains("touch_forever: filled"), "{shown}");
    assert_eq!(out.status.code(), Some(69), "{shown}");
    assert!(!out.stderr.contains("panicked"), "{shown}");
    let fatal = out
        .stderr
        .lines()
        .find(|l| l.starts_with("rmem: fatal: "))
        .unwrap_or_else(|| panic!("no fatal line: {shown}"));
    assert!(
        fatal.contains(&format!("memory server {}", server.addr)),
        "{shown}"
    );
    out.stderr
}

/// A frame that breaks the protocol is not retried: the first one stops the program.
fn protocol_violation(how: Misbehavior, what: &str) {
    let stderr = against(how);
    assert!(stderr.contains("sent a bad frame"), "{how:?}: {stderr}");
    assert!(stderr.contains(what), "{how:?}: {what:?} not in {stderr}");
    assert!(
        !stderr.contains("reconnecting"),
        "{how:?} was retried: {stderr}"
    );
}

#[test]
fn garbage_stops_the_program_naming_the_server() {
    protocol_violation(Misbehavior::Garbage, "unknown operation code");
}

#[test]
fn a_page_of_the_wrong_size_is_refused() {
    protocol_violation(Misbehavior::ShortPage, "does not answer");
}

#[test]
fn a_length_past_the_frame_limit_is_refused() {
    protocol_violation(Misbehavior::Oversized, "exceeds the limit");
}

#[test]
fn a_length_past_the_receive_buffer_is_refused() {
    protocol_violation(Misbehavior::BeyondBuffer, "exceeds the receive buffer");
}

#[test]
fn another_request_s_tag_is_refused() {
    protocol_violation(Misbehavior::WrongTag, "out of order");
}

#[test]
fn another_page_s_data_is_never_installed() {
    protocol_violation(Misbehavior::OtherPage, "does not answer");
}

/// A frame cut short by a closed link looks like a dropped link: it is retried, but an
/// outage lasts until the server answers, so a server that cuts every answer is given up on.
#[test]
fn a_frame_cut_short_on_every_link_ends_in_the_reconnection_window() {
    let stderr = against(Misbehavior::Truncated);
    assert!(stderr.contains("closed the connection"), "{stderr}");
    assert!(stderr.contains("but it answered no request"), "{stderr}");
}

/// A server that authenticates and never answers: the request times out, the client
/// reconnects, and re-sends; the new links are not answered either, and it gives up.
#[test]
fn a_server_that_never_answers_a_read_is_given_up_on() {
    let stderr = against(Misbehavior::Stall);
    assert!(stderr.contains("did not answer"), "{stderr}");
    assert!(stderr.contains("but it answered no request"), "{stderr}");
}

#[test]
fn a_handshake_that_never_comes_on_reconnect_is_given_up_on() {
    let stderr = against(Misbehavior::StallThenSilentHandshake);
    assert!(stderr.contains("waiting for its challenge"), "{stderr}");
}

/// One byte every 300 ms would keep a per-read timeout of 1 s happy forever; the handshake
/// has a deadline as a whole.
#[test]
fn a_handshake_trickled_a_byte_at_a_time_is_given_up_on() {
    let stderr = against(Misbehavior::StallThenTrickledHandshake);
    assert!(stderr.contains("waiting for its challenge"), "{stderr}");
}
