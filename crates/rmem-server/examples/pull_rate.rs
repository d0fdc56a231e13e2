//! How fast one server pulls a client's pages from another on loopback (`Request::Pull`, what
//! drains and `replicas:N` repairs do), without a client program in the way: two servers in
//! this process, MiB of 64 KiB pages written to the first, then pulled onto the second in
//! pulls of KEYS keys over CONNS connections at once, ROUNDS times (the first round stores
//! fresh pages, as a drain or a repair does; later ones overwrite them in place).
//!
//! `cargo run --release -p rmem-server --example pull_rate -- [MIB [KEYS [CONNS [ROUNDS]]]]`
//! (defaults 96 16 2 3). docs/benchmarks.md, "Slabs populated when mapped".
use rmem_proto::auth::{self, Role, Transcript};
use rmem_proto::{parse_header, PageKey, Request, Response, SessionId, HEADER_LEN};
use rmem_server::{Server, ServerConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

const PS: usize = 65536;
const TOKEN: &[u8] = b"t";

fn server(cap: u64) -> SocketAddr {
    let s = Server::bind(ServerConfig::loopback(cap, TOKEN)).unwrap();
    let a = s.local_addr();
    s.spawn();
    a
}

struct C(TcpStream, u64);
impl C {
    fn send(&mut self, r: Request<'_>) {
        let mut b = Vec::new();
        self.1 += 1;
        r.encode(self.1, &mut b);
        self.0.write_all(&b).unwrap();
    }
    fn recv(&mut self) -> (rmem_proto::Op, Vec<u8>) {
        let mut h = [0u8; HEADER_LEN];
        self.0.read_exact(&mut h).unwrap();
        let h = parse_header(&h, u32::MAX).unwrap().unwrap();
        let mut b = vec![0u8; h.len as usize];
        self.0.read_exact(&mut b).unwrap();
        (h.op, b)
    }
    fn call(&mut self, r: Request<'_>) -> (rmem_proto::Op, Vec<u8>) {
        self.send(r);
        self.recv()
    }
    fn attach(addr: SocketAddr, id: SessionId) -> C {
        let mut c = C(TcpStream::connect(addr).unwrap(), 0);
        c.0.set_nodelay(true).unwrap();
        let cn = auth::nonce().unwrap();
        let (op, b) = c.call(Request::Hello {
            version: rmem_proto::VERSION,
            page_size: PS as u32,
            nonce: cn,
        });
        let Ok(Response::Challenge { nonce }) = Response::decode(op, &b) else {
            panic!()
        };
        let t = Transcript {
            client_nonce: cn,
            server_nonce: nonce,
            version: rmem_proto::VERSION,
            page_size: PS as u32,
        };
        c.call(Request::Auth {
            proof: t.proof(TOKEN, Role::Client),
        });
        c.call(Request::Attach {
            session: id,
            lease_ms: 0,
            flags: 0,
            reserved: 0,
        });
        c
    }
}

fn main() {
    let arg = |i: usize, default: usize| -> usize {
        std::env::args().nth(i).map_or(default, |s| {
            s.parse()
                .unwrap_or_else(|_| panic!("argument {i} ({s:?}) is not a number"))
        })
    };
    let (mb, per, conns, rounds) = (arg(1, 96), arg(2, 16), arg(3, 2), arg(4, 3));
    let pages = mb * 1024 * 1024 / PS;
    let src = server(1 << 34);
    let dst = server(1 << 34);
    let id = SessionId::random().unwrap();
    let mut owner = C::attach(src, id);
    let data = vec![7u8; 16 * PS];
    for k in (0..pages).step_by(16) {
        owner.call(Request::Write {
            key: PageKey(k as u64),
            count: 16,
            data: &data,
        });
    }
    for _ in 0..rounds {
        let t = Instant::now();
        let chunks: Vec<Vec<u64>> = (0..pages as u64)
            .collect::<Vec<_>>()
            .chunks(per)
            .map(|c| c.to_vec())
            .collect();
        let from = src.to_string();
        std::thread::scope(|s| {
            for j in 0..conns {
                let chunks = &chunks;
                let from = &from;
                s.spawn(move || {
                    let mut c = C::attach(dst, id);
                    for ch in chunks.iter().skip(j).step_by(conns) {
                        let (op, b) = c.call(Request::Pull {
                            from,
                            session: id,
                            deadline_ms: 5000,
                            keys: ch.iter().map(|&k| PageKey(k)).collect(),
                        });
                        match Response::decode(op, &b).unwrap() {
                            Response::Pulled { stored, .. } if stored as usize == ch.len() => {}
                            o => panic!("{o:?}"),
                        }
                    }
                });
            }
        });
        let s = t.elapsed().as_secs_f64();
        println!(
            "pulled {mb} MiB in {:.3} s: {:.0} MB/s ({per} keys a pull, {conns} in flight)",
            s,
            (pages * PS) as f64 / s / 1e6
        );
    }
}
