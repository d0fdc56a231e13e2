//! Pages on memory servers over TCP: one connection per server, many requests in flight on
//! each, answered in order. Placement (priority fill or round-robin stripe) is decided here
//! and recorded per page in two bytes.

use super::{Completion, PageStore, StoreError};
use crate::config::Placement;
use crate::PageIndex;
use rmem_proto::{auth, parse_header, PageKey, Request, Response, HEADER_LEN};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Fetch(PageIndex),
    Store(PageIndex),
    Swap { victim: PageIndex, page: PageIndex },
    Free,
    Ping,
}

#[derive(Debug)]
struct Pending {
    tag: u64,
    kind: Kind,
    sent: Instant,
}

/// One server connection.
pub struct Conn {
    name: String,
    sock: TcpStream,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    pending: VecDeque<Pending>,
    next_tag: u64,
    frees: Vec<PageKey>,
    last_activity: Instant,
    frame_len_max: u32,
    /// Bytes this client may use on the server (its capacity less what others used at connect).
    capacity_bytes: u64,
    /// Bytes this client has placed there.
    used_bytes: u64,
}

fn io_err(server: &str, e: io::Error) -> StoreError {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => StoreError::Closed {
            server: server.into(),
            detail: format!(" ({e})"),
        },
        _ => StoreError::Io {
            server: server.into(),
            source: e,
        },
    }
}

impl Conn {
    /// Connect, authenticate and learn the server's limits.
    pub fn connect(
        server: &str,
        token: &[u8],
        page_size: usize,
        timeout: Duration,
    ) -> Result<Conn, StoreError> {
        let connect_err = |source| StoreError::Connect {
            server: server.into(),
            source,
        };
        let addrs: Vec<_> = server.to_socket_addrs().map_err(connect_err)?.collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        let mut sock = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    sock = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let mut sock = sock.ok_or_else(|| connect_err(last))?;
        sock.set_nodelay(true).map_err(connect_err)?;
        sock.set_read_timeout(Some(timeout)).map_err(connect_err)?;
        let welcome = handshake(&mut sock, server, token, page_size)?;
        let frame_len_max = welcome.frame_len_max;
        let capacity_bytes = welcome.capacity_bytes.saturating_sub(welcome.used_bytes);
        let proto = |what: String| StoreError::Protocol {
            server: server.into(),
            what,
        };
        if (frame_len_max as usize) < page_size + 64 {
            return Err(proto(format!(
                "frame limit {frame_len_max} is below one page of {page_size} bytes"
            )));
        }
        sock.set_read_timeout(None).map_err(connect_err)?;
        sock.set_nonblocking(true).map_err(connect_err)?;
        let inbuf_len = (2 * (page_size + 64)).max(256 * 1024);
        Ok(Conn {
            name: server.into(),
            sock,
            out: Vec::with_capacity(256 * 1024),
            out_pos: 0,
            inbuf: vec![0; inbuf_len],
            in_start: 0,
            in_end: 0,
            pending: VecDeque::new(),
            next_tag: 1,
            frees: Vec::new(),
            last_activity: Instant::now(),
            frame_len_max,
            capacity_bytes,
            used_bytes: 0,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn submit(&mut self, req: Request<'_>, kind: Kind) {
        let tag = self.next_tag;
        self.next_tag += 1;
        req.encode(tag, &mut self.out);
        self.pending.push_back(Pending {
            tag,
            kind,
            sent: Instant::now(),
        });
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        if !self.frees.is_empty() {
            let keys = std::mem::take(&mut self.frees);
            for chunk in keys.chunks(rmem_proto::FREE_KEYS_MAX) {
                self.submit(
                    Request::Free {
                        keys: chunk.to_vec(),
                    },
                    Kind::Free,
                );
            }
        }
        while self.out_pos < self.out.len() {
            match self.sock.write(&self.out[self.out_pos..]) {
                Ok(0) => {
                    return Err(StoreError::Closed {
                        server: self.name.clone(),
                        detail: String::new(),
                    })
                }
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err(&self.name, e)),
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(())
    }

    fn describe_inflight(&self) -> String {
        match self.pending.front() {
            Some(Pending {
                kind: Kind::Fetch(p),
                ..
            }) => format!(" while page {} was being fetched", p.0),
            Some(Pending {
                kind: Kind::Store(p),
                ..
            }) => format!(" while page {} was being written back", p.0),
            Some(Pending {
                kind: Kind::Swap { victim, page },
                ..
            }) => {
                format!(
                    " while page {} was being written back and page {} fetched",
                    victim.0, page.0
                )
            }
            Some(_) => format!(" with {} requests in flight", self.pending.len()),
            None => String::new(),
        }
    }

    /// Read what is available and hand complete responses to `f`.
    fn poll(
        &mut self,
        page_size: usize,
        f: &mut dyn FnMut(Completion<'_>),
    ) -> Result<usize, StoreError> {
        let mut done = 0;
        loop {
            // Parse every complete frame already buffered.
            loop {
                let avail = &self.inbuf[self.in_start..self.in_end];
                let h = match parse_header(avail, self.frame_len_max) {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(e) => {
                        return Err(StoreError::Protocol {
                            server: self.name.clone(),
                            what: e.to_string(),
                        })
                    }
                };
                let total = HEADER_LEN + h.len as usize;
                if total > self.inbuf.len() {
                    return Err(StoreError::Protocol {
                        server: self.name.clone(),
                        what: format!("response of {total} bytes exceeds the receive buffer"),
                    });
                }
                if avail.len() < total {
                    break;
                }
                let body_start = self.in_start + HEADER_LEN;
                self.in_start += total;
                self.last_activity = Instant::now();
                let pending = self
                    .pending
                    .pop_front()
                    .ok_or_else(|| StoreError::Protocol {
                        server: self.name.clone(),
                        what: format!("unsolicited {:?} frame", h.op),
                    })?;
                let proto = |what: String| StoreError::Protocol {
                    server: self.name.clone(),
                    what,
                };
                if pending.tag != h.tag {
                    return Err(proto(format!(
                        "answer tag {} out of order (expected {})",
                        h.tag, pending.tag
                    )));
                }
                let body = &self.inbuf[body_start..body_start + h.len as usize];
                let resp = Response::decode(h.op, body).map_err(|e| proto(e.to_string()))?;
                done += 1;
                match (pending.kind, resp) {
                    (
                        Kind::Fetch(page),
                        Response::ReadOk {
                            key,
                            count: 1,
                            data,
                        },
                    ) if key.0 == page.0 && data.len() == page_size => {
                        f(Completion::Fetched { page, data })
                    }
                    (Kind::Store(page), Response::WriteOk { key, count: 1 }) if key.0 == page.0 => {
                        f(Completion::Stored { page })
                    }
                    (Kind::Swap { victim, page }, Response::SwapOk { read_key, data })
                        if read_key.0 == page.0 && data.len() == page_size =>
                    {
                        f(Completion::Stored { page: victim });
                        f(Completion::Fetched { page, data });
                    }
                    (Kind::Free, Response::FreeOk { .. }) | (Kind::Ping, Response::Pong { .. }) => {
                    }
                    (_, Response::Error { code, message }) => {
                        return Err(StoreError::Server {
                            server: self.name.clone(),
                            code,
                            message: message.into(),
                        })
                    }
                    (kind, resp) => {
                        return Err(proto(format!("{:?} does not answer {kind:?}", resp.op())))
                    }
                }
            }
            if self.in_start == self.in_end {
                self.in_start = 0;
                self.in_end = 0;
            } else if self.in_end == self.inbuf.len() {
                self.inbuf.copy_within(self.in_start..self.in_end, 0);
                self.in_end -= self.in_start;
                self.in_start = 0;
            }
            match self.sock.read(&mut self.inbuf[self.in_end..]) {
                Ok(0) => {
                    return Err(StoreError::Closed {
                        server: self.name.clone(),
                        detail: self.describe_inflight(),
                    })
                }
                Ok(n) => self.in_end += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(done),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let detail = self.describe_inflight();
                    return Err(match io_err(&self.name, e) {
                        StoreError::Closed { server, detail: d } => StoreError::Closed {
                            server,
                            detail: d + &detail,
                        },
                        other => other,
                    });
                }
            }
        }
    }
}

/// What a server told a client that proved it knows the token.
#[derive(Clone, Copy, Debug)]
pub struct Welcome {
    pub frame_len_max: u32,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

/// Read one whole frame (blocking, under the socket's read timeout); `what` names the frame
/// expected, for the message when none comes.
fn read_frame(
    sock: &mut TcpStream,
    server: &str,
    what: &str,
    body: &mut Vec<u8>,
) -> Result<rmem_proto::Header, StoreError> {
    let mut hdr = [0u8; HEADER_LEN];
    sock.read_exact(&mut hdr).map_err(|e| StoreError::Refused {
        server: server.into(),
        message: format!("no {what} ({e}); is it an rmem server of this version?"),
    })?;
    let h = parse_header(&hdr, 64 * 1024)
        .map_err(|e| StoreError::Protocol {
            server: server.into(),
            what: e.to_string(),
        })?
        .expect("full header");
    body.resize(h.len as usize, 0);
    sock.read_exact(body).map_err(|e| io_err(server, e))?;
    Ok(h)
}

/// The client's side of the challenge and response (`rmem_proto::auth`) on a connected,
/// blocking socket: both sides prove they know `token` without sending it. On success the
/// socket is ready for requests.
pub fn handshake(
    sock: &mut TcpStream,
    server: &str,
    token: &[u8],
    page_size: usize,
) -> Result<Welcome, StoreError> {
    let proto = |what: String| StoreError::Protocol {
        server: server.into(),
        what,
    };
    let refused = |code, message: &str| StoreError::Refused {
        server: server.into(),
        message: format!("{code}: {message}"),
    };
    let send = |sock: &mut TcpStream, req: Request<'_>| {
        let mut frame = Vec::new();
        req.encode(0, &mut frame);
        sock.write_all(&frame).map_err(|e| io_err(server, e))
    };
    let mut transcript = auth::Transcript {
        client_nonce: auth::nonce().map_err(|e| io_err(server, e))?,
        server_nonce: [0; auth::NONCE_LEN],
        version: rmem_proto::VERSION,
        page_size: page_size as u32,
    };
    send(
        sock,
        Request::Hello {
            version: transcript.version,
            page_size: transcript.page_size,
            nonce: transcript.client_nonce,
        },
    )?;
    let mut body = Vec::new();
    let h = read_frame(sock, server, "challenge", &mut body)?;
    match Response::decode(h.op, &body).map_err(|e| proto(e.to_string()))? {
        Response::Challenge { nonce } => transcript.server_nonce = nonce,
        Response::Error { code, message } => return Err(refused(code, message)),
        other => return Err(proto(format!("expected challenge, got {:?}", other.op()))),
    }
    let proof = transcript.proof(token, auth::Role::Client);
    send(sock, Request::Auth { proof })?;
    let h = read_frame(sock, server, "welcome", &mut body)?;
    match Response::decode(h.op, &body).map_err(|e| proto(e.to_string()))? {
        Response::Welcome {
            version,
            frame_len_max,
            capacity_bytes,
            used_bytes,
            proof,
        } => {
            if version != rmem_proto::VERSION {
                return Err(proto(format!(
                    "protocol version {version}, this client speaks {}",
                    rmem_proto::VERSION
                )));
            }
            if !transcript.verify(token, auth::Role::Server, &proof) {
                return Err(StoreError::Impostor {
                    server: server.into(),
                });
            }
            Ok(Welcome {
                frame_len_max,
                capacity_bytes,
                used_bytes,
            })
        }
        Response::Error { code, message } => Err(refused(code, message)),
        other => Err(proto(format!("expected welcome, got {:?}", other.op()))),
    }
}

/// Per-page server slot: 0 = no remote copy, i + 1 = on server i. Chunked like the page table.
#[derive(Default)]
struct Locations {
    chunks: Vec<Option<Box<[u16]>>>,
}

const LOC_CHUNK: usize = 1 << 16;

impl Locations {
    fn get(&self, page: PageIndex) -> Option<usize> {
        let c = page.0 as usize / LOC_CHUNK;
        match self.chunks.get(c) {
            Some(Some(ch)) => ch[page.0 as usize % LOC_CHUNK]
                .checked_sub(1)
                .map(usize::from),
            _ => None,
        }
    }

    fn set(&mut self, page: PageIndex, server: Option<usize>) {
        let c = page.0 as usize / LOC_CHUNK;
        if c >= self.chunks.len() {
            if server.is_none() {
                return;
            }
            self.chunks.resize_with(c + 1, || None);
        }
        let ch = self.chunks[c].get_or_insert_with(|| vec![0u16; LOC_CHUNK].into_boxed_slice());
        ch[page.0 as usize % LOC_CHUNK] = server.map_or(0, |s| s as u16 + 1);
    }
}

/// Pages on a set of memory servers.
pub struct RemoteStore {
    conns: Vec<Conn>,
    page_size: usize,
    placement: Placement,
    locations: Locations,
    timeout: Duration,
    heartbeat: Duration,
}

/// Most servers one client can address (the per-page slot is 16 bits).
pub const SERVERS_MAX: usize = u16::MAX as usize - 1;

impl RemoteStore {
    /// Connect to every server, in order. The first failure is returned; connections already
    /// made are closed, which frees anything placed on them.
    pub fn connect(
        servers: &[String],
        token: &[u8],
        page_size: usize,
        placement: Placement,
        connect_timeout: Duration,
        timeout: Duration,
        heartbeat: Duration,
    ) -> Result<RemoteStore, StoreError> {
        assert!(servers.len() <= SERVERS_MAX, "too many servers");
        let conns = servers
            .iter()
            .map(|s| Conn::connect(s, token, page_size, connect_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RemoteStore {
            conns,
            page_size,
            placement,
            locations: Locations::default(),
            timeout,
            heartbeat,
        })
    }

    /// Where `page` goes (and stays): its current server, or a new placement.
    fn place(&mut self, page: PageIndex) -> Result<usize, StoreError> {
        if let Some(s) = self.locations.get(page) {
            return Ok(s);
        }
        let n = self.conns.len();
        let start = match self.placement {
            Placement::Priority => 0,
            Placement::Stripe => (page.0 % n as u64) as usize,
        };
        let ps = self.page_size as u64;
        let s = (0..n)
            .map(|i| (start + i) % n)
            .find(|&s| self.conns[s].used_bytes + ps <= self.conns[s].capacity_bytes)
            .ok_or(StoreError::AllFull {
                capacity: self.capacity_bytes(),
                page: page.0,
            })?;
        self.conns[s].used_bytes += ps;
        self.locations.set(page, Some(s));
        Ok(s)
    }

    fn located(&self, page: PageIndex) -> Result<usize, StoreError> {
        self.locations
            .get(page)
            .ok_or_else(|| StoreError::Protocol {
                server: "(none)".into(),
                what: format!("page {} has no remote copy to fetch", page.0),
            })
    }

    /// The server holding `page`, if any (for messages and tests).
    pub fn server_of(&self, page: PageIndex) -> Option<&str> {
        self.locations.get(page).map(|s| self.conns[s].name())
    }

    /// Bytes placed on each server by this client.
    pub fn used_per_server(&self) -> Vec<(String, u64)> {
        self.conns
            .iter()
            .map(|c| (c.name.clone(), c.used_bytes))
            .collect()
    }
}

impl PageStore for RemoteStore {
    fn capacity_bytes(&self) -> u64 {
        self.conns.iter().map(|c| c.capacity_bytes).sum()
    }

    fn fetch(&mut self, page: PageIndex) -> Result<(), StoreError> {
        let s = self.located(page)?;
        self.conns[s].submit(
            Request::Read {
                key: PageKey(page.0),
                count: 1,
            },
            Kind::Fetch(page),
        );
        self.conns[s].flush()
    }

    fn store(&mut self, page: PageIndex, data: &[u8]) -> Result<(), StoreError> {
        debug_assert_eq!(data.len(), self.page_size);
        let s = self.place(page)?;
        self.conns[s].submit(
            Request::Write {
                key: PageKey(page.0),
                count: 1,
                data,
            },
            Kind::Store(page),
        );
        Ok(())
    }

    fn swap(&mut self, victim: PageIndex, data: &[u8], page: PageIndex) -> Result<(), StoreError> {
        let v = self.place(victim)?;
        let p = self.located(page)?;
        if v == p {
            let req = Request::Swap {
                write_key: PageKey(victim.0),
                read_key: PageKey(page.0),
                data,
            };
            self.conns[v].submit(req, Kind::Swap { victim, page });
            self.conns[v].flush()
        } else {
            self.conns[p].submit(
                Request::Read {
                    key: PageKey(page.0),
                    count: 1,
                },
                Kind::Fetch(page),
            );
            self.conns[p].flush()?;
            self.conns[v].submit(
                Request::Write {
                    key: PageKey(victim.0),
                    count: 1,
                    data,
                },
                Kind::Store(victim),
            );
            Ok(())
        }
    }

    fn free(&mut self, page: PageIndex) -> Result<(), StoreError> {
        if let Some(s) = self.locations.get(page) {
            self.locations.set(page, None);
            let c = &mut self.conns[s];
            c.used_bytes -= self.page_size as u64;
            c.frees.push(PageKey(page.0));
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        self.conns.iter_mut().try_for_each(Conn::flush)
    }

    fn poll(&mut self, f: &mut dyn FnMut(Completion<'_>)) -> Result<usize, StoreError> {
        let mut n = 0;
        for c in &mut self.conns {
            if !c.pending.is_empty() {
                n += c.poll(self.page_size, f)?;
            }
        }
        Ok(n)
    }

    fn wait_fds(&self, out: &mut Vec<libc::pollfd>) {
        for c in &self.conns {
            let mut events = libc::POLLIN;
            if c.out_pos < c.out.len() {
                events |= libc::POLLOUT;
            }
            out.push(libc::pollfd {
                fd: c.sock.as_raw_fd(),
                events,
                revents: 0,
            });
        }
    }

    fn tick(&mut self, now: Instant) -> Result<(), StoreError> {
        for c in &mut self.conns {
            if let Some(p) = c.pending.front() {
                let waited = now.saturating_duration_since(p.sent.max(c.last_activity));
                if waited > self.timeout {
                    return Err(StoreError::Timeout {
                        server: c.name.clone(),
                        secs: waited.as_secs_f64(),
                        detail: c.describe_inflight(),
                    });
                }
            } else {
                // Idle: notice a closed connection now rather than at the next fault, and
                // ping so that a silently dead host is caught by the deadline above.
                c.poll(self.page_size, &mut |_| {})?;
                if now.saturating_duration_since(c.last_activity) > self.heartbeat {
                    c.submit(Request::Ping, Kind::Ping);
                    c.last_activity = now;
                }
            }
            c.flush()?;
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.conns.iter().map(|c| c.pending.len()).sum()
    }

    fn describe(&self) -> String {
        self.conns
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}
