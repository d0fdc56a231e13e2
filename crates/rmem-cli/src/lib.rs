//! The `rmem` command's subcommands, one module each, as a library: `main.rs` parses the
//! command line and runs one of them, and `rmem-bench` (crates/rmem-bench) starts memory
//! servers through [`launch`] the way `rmem run` does, without being part of the `rmem` binary.
//!
//! [`launch::start`] starts the servers of a [`launch::Plan`]; [`launch::start_local_servers`]
//! starts local ones for a test or a benchmark.

pub mod cc;
pub mod hostfile;
pub mod launch;
pub mod launch_cmd;
pub mod lock;
pub mod manager_cmd;
pub mod nbd_cmd;
pub mod pool_cmd;
pub mod region_cmd;
pub mod run_cmd;
pub mod server_cmd;
pub mod sim_cmd;
pub mod status_cmd;
