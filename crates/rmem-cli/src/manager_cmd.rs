//! `rmem manager`: the pool manager (rmem-server's manager.rs). Logs like `rmem server`.

use rmem_proto::size::parse_size;
use rmem_server::manager::{Manager, ManagerConfig};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ManagerArgs {
    /// Address to listen on. Loopback unless told otherwise; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// File holding the pool's shared-secret token (else the RMEM_TOKEN environment variable).
    #[arg(long, conflicts_with = "token_stdin")]
    pub token_file: Option<PathBuf>,
    /// Read the token as the first line of stdin, then exit when stdin reaches EOF.
    #[arg(long)]
    pub token_stdin: bool,
    /// How often servers and clients beat, in milliseconds. A server silent for 3 beats is
    /// lost (offered to no client), forgotten after 30; a client is forgotten after 3.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// The most server memory any one client is granted (redundancy included); each client's
    /// own --max-remote may ask for less [default: no limit].
    #[arg(long, value_name = "SIZE")]
    pub max_remote: Option<String>,
    /// Debug lines (RMEM_LOG overrides).
    #[arg(long, short)]
    pub verbose: bool,
}

pub fn run(a: ManagerArgs) -> i32 {
    match serve(a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rmem manager: {e}");
            1
        }
    }
}

fn serve(a: ManagerArgs) -> Result<(), String> {
    crate::server_cmd::init_log_as("rmem-manager", a.verbose)?;
    if !(10..=60_000).contains(&a.heartbeat_ms) {
        return Err(format!(
            "--heartbeat-ms: {} is not 10 to 60000",
            a.heartbeat_ms
        ));
    }
    let max_remote_bytes = match &a.max_remote {
        Some(v) => parse_size(v).map_err(|e| format!("--max-remote {v}: {e}"))?,
        None => rmem_proto::pool::UNLIMITED,
    };
    let token = crate::server_cmd::token(a.token_file.as_deref(), a.token_stdin)?;
    let manager = Manager::bind(ManagerConfig {
        listen: a.listen,
        token,
        heartbeat: Duration::from_millis(a.heartbeat_ms),
        max_remote_bytes,
    })
    .map_err(|e| rmem_client::error_chain(&e))?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "rmem-manager listening on {}", manager.local_addr());
    let _ = out.flush();
    drop(out);
    manager.run().map_err(|e| e.to_string())
}
