//! rmem-nbd: remote memory as a block device, served over the NBD protocol.
//!
//! Entry point: [`server::Server`], which serves one [`proto::Export`] from a
//! [`rmem_client::blocks::BlockCache`] (the page cache's buffer front end, over the same
//! memory servers, redundancy and encryption as `rmem run`) to any number of NBD clients: the
//! kernel's `nbd` driver through `nbd-client`, QEMU, libnbd's tools, fio. `rmem nbd` (in
//! rmem-cli) starts the memory servers and runs it.
//!
//! Modules: [`proto`] (the protocol's bytes, no I/O and no unsafe code) -> [`server`] (the
//! event loop: connections, requests split into pages, replies in any order).

pub mod proto;
pub mod server;
