//! What the store tests share: a real memory server, in-process.

use rmem_server::{Server, ServerConfig};

/// A memory server on loopback that knows `token` and holds up to `capacity_bytes`, running
/// on its own threads for the rest of the test; its address.
pub fn server(token: &[u8], capacity_bytes: u64) -> String {
    let s = Server::bind(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        capacity_bytes,
        token: token.to_vec(),
        frame_len_max: rmem_proto::FRAME_LEN_MAX_DEFAULT,
        lease: rmem_server::LEASE_DEFAULT,
        verbose: false,
        store: Default::default(),
    })
    .unwrap();
    let addr = s.local_addr().to_string();
    s.spawn();
    addr
}
