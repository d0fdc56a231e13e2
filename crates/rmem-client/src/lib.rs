//! rmem-client: the client runtime that makes memory servers' RAM look local.
//!
//! Entry point: [`Runtime::start`] (or [`Runtime::from_env`], which reads the configuration
//! `rmem run` puts in the environment). A runtime reserves one large virtual region, registers
//! it with userfaultfd, and runs a pager thread that resolves every fault in it: a page never
//! written is zero-filled locally; any other page is fetched from its [`store::PageStore`] and
//! installed atomically. A local budget bounds resident pages; victims chosen by a
//! [`rmem_policy::Policy`] are written back only when dirty. [`Runtime::alloc`] and
//! [`Runtime::free`] hand out memory inside the region.
//!
//! Module pipeline, in the order a fault travels: [`region`] (the reserved range) ->
//! [`pager`] (fault loop, eviction) -> [`pages`] (per-page state machine) -> [`store`] (where
//! pages live: [`store::remote`] over TCP, [`store::mem`] in-process for tests).
//!
//! A second front end, [`blocks::BlockCache`], holds pages in buffers instead of a mapped
//! region, over the same [`state::PageStates`] and page stores: the block device (`rmem nbd`)
//! is built on it.
//!
//! A third front end, [`direct::DirectRegion`], maps and caches nothing: byte ranges go
//! between the caller's buffers and the servers (`rmem_read`/`rmem_write`).
//!
//! In a pool (`rmem run --manager`), [`pool::PoolLink`] beats to the manager and tells the
//! cluster layer of servers that join and of the client's grant.

/// `eprintln!` in one `write(2)`: the runtime's lines from several processes of one program
/// (`--children`, fork children sharing its stderr) come out whole, not interleaved
/// mid-line, as separate writes of a line's pieces did.
#[macro_export]
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }};
}

pub mod alloc;
pub mod blocks;
pub mod config;
pub mod direct;
pub mod own_servers;
pub mod pager;
pub mod pages;
pub mod pool;
pub mod prefetch;
pub mod protect;
pub mod region;
pub mod runtime;
pub mod state;
pub mod stats;
pub mod store;

pub use config::Config;
pub use rmem_policy::PageIndex;
/// For a library that keeps SIGBUS's handler itself (librmem): the fault-by-signal handler's
/// own work, and the action it replaced.
pub use rmem_uffd::{handle_sigbus, sigbus_previous_action};
pub use runtime::{Runtime, RuntimeError};
pub use stats::{Stats, StatsSnapshot};

/// Exit status of a program stopped because a memory server died (EX_UNAVAILABLE).
pub const EXIT_SERVER_LOST: i32 = 69;

thread_local! {
    /// Set on the pager thread: it must never allocate in, or touch, the region it serves.
    static PAGER_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True on a runtime's pager thread. An allocator that interposes `malloc` must send this
/// thread's allocations elsewhere: a fault it took on the region would wait for itself.
pub fn on_pager_thread() -> bool {
    PAGER_THREAD.with(|t| t.get())
}

/// An error and every error that caused it, as one line: "what: why: deeper why".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}
