//! The client's connection layer against real memory servers (in-process) and a fake one:
//! authentication. Every wait is bounded by socket timeouts.

use rmem_client::config::Placement;
use rmem_client::store::remote::RemoteStore;
use rmem_client::store::StoreError;
use rmem_proto::{auth, parse_header, Request, Response, HEADER_LEN};
use rmem_server::{Server, ServerConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

const PS: usize = 4096;
const TOKEN: &[u8] = b"test-token";

fn server(capacity_pages: u64) -> SocketAddr {
    let s = Server::bind(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        capacity_bytes: capacity_pages * PS as u64,
        token: TOKEN.to_vec(),
        frame_len_max: rmem_proto::FRAME_LEN_MAX_DEFAULT,
        verbose: false,
    })
    .unwrap();
    let addr = s.local_addr();
    s.spawn();
    addr
}

fn connect(addr: SocketAddr, token: &[u8]) -> Result<RemoteStore, StoreError> {
    let t = Duration::from_secs(5);
    RemoteStore::connect(&[addr.to_string()], token, PS, Placement::Priority, t, t, t)
}

#[test]
fn a_wrong_token_is_refused_with_a_message_naming_it() {
    let addr = server(16);
    assert!(connect(addr, TOKEN).is_ok());
    let err = connect(addr, b"not-the-token").err().expect("accepted a wrong token");
    assert!(matches!(err, StoreError::Refused { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&addr.to_string()) && msg.contains("wrong token"),
        "{msg}"
    );
}

/// A server that does not know the token but welcomes everyone is caught by its proof.
#[test]
fn a_server_without_the_token_is_not_trusted() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let impostor = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = Vec::new();
        for answer in [
            Response::Challenge {
                nonce: [9; auth::NONCE_LEN],
            },
            Response::Welcome {
                version: rmem_proto::VERSION,
                frame_len_max: rmem_proto::FRAME_LEN_MAX_DEFAULT,
                capacity_bytes: 1 << 30,
                used_bytes: 0,
                proof: [0; auth::PROOF_LEN],
            },
        ] {
            let mut hdr = [0u8; HEADER_LEN];
            s.read_exact(&mut hdr).unwrap();
            let h = parse_header(&hdr, 4096).unwrap().unwrap();
            let mut body = vec![0u8; h.len as usize];
            s.read_exact(&mut body).unwrap();
            Request::decode(h.op, &body).unwrap();
            out.clear();
            answer.encode(h.tag, &mut out);
            s.write_all(&out).unwrap();
        }
    });
    let err = connect(addr, TOKEN).err().expect("trusted an impostor");
    assert!(matches!(err, StoreError::Impostor { .. }), "{err:?}");
    assert!(err.to_string().contains("does not know the token"), "{err}");
    impostor.join().unwrap();
}
