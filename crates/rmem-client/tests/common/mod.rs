//! What the store tests share: a real memory server, in-process.

use rmem_server::{Server, ServerConfig};

/// A memory server on loopback that knows `token` and holds up to `capacity_bytes`, running
/// on its own threads for the rest of the test; its address.
pub fn server(token: &[u8], capacity_bytes: u64) -> String {
    let s = Server::bind(ServerConfig::loopback(capacity_bytes, token)).unwrap();
    let addr = s.local_addr().to_string();
    s.spawn();
    addr
}
