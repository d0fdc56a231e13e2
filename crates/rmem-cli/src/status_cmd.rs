//! `rmem status HOST:PORT [--json]`: a memory server's capacity, use and sessions, asked over
//! the protocol (`Status`, after the same challenge and response as any client).

use rmem_client::store::remote::{handshake, read_frame};
use rmem_client::store::StoreError;
use rmem_proto::size::format_size;
use rmem_proto::{Request, Response, ServerStatus};
use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The memory server, HOST:PORT.
    pub server: String,
    /// Print JSON: capacity_bytes, used_bytes, lease_s, sessions_total, sessions (id,
    /// used_bytes, lease_age_s, connections).
    #[arg(long)]
    pub json: bool,
    /// How long connecting and the answer may take, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
}

pub fn run(a: StatusArgs) -> i32 {
    match status(&a) {
        Ok(st) => {
            if a.json {
                println!("{}", to_json(&a.server, &st));
            } else {
                print!("{}", to_text(&a.server, &st));
            }
            0
        }
        Err(e) => {
            eprintln!("rmem status: {e}");
            1
        }
    }
}

fn status(a: &StatusArgs) -> Result<ServerStatus, String> {
    if !(a.timeout.is_finite() && a.timeout > 0.0) {
        return Err(format!(
            "--timeout: {} is not a positive number of seconds",
            a.timeout
        ));
    }
    let token = crate::launch::token_from_env("rmem status")?;
    query(
        &a.server,
        token.as_bytes(),
        Duration::from_secs_f64(a.timeout),
    )
}

/// Ask the memory server at `server` what it holds, giving up after `timeout` in all.
pub fn query(server: &str, token: &[u8], timeout: Duration) -> Result<ServerStatus, String> {
    let addr = server
        .to_socket_addrs()
        .map_err(|e| format!("{server}: {e}"))?
        .next()
        .ok_or_else(|| format!("{server}: no address"))?;
    // The whole exchange, however slowly a server answers.
    let deadline = Instant::now() + timeout;
    let mut sock = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("cannot connect to memory server {server}: {e}"))?;
    let failed = |e: std::io::Error| format!("memory server {server}: {e}");
    sock.set_write_timeout(Some(timeout)).map_err(failed)?;
    // Any valid page size will do: status touches no pages.
    let chain = |e: StoreError| rmem_client::error_chain(&e);
    handshake(&mut sock, server, token, 4096, deadline).map_err(chain)?;
    let mut frame = Vec::new();
    Request::Status.encode(1, &mut frame);
    sock.write_all(&frame).map_err(failed)?;
    let mut body = Vec::new();
    let max = rmem_proto::FRAME_LEN_MAX_DEFAULT;
    let h = read_frame(&mut sock, server, "status", &mut body, max, deadline).map_err(chain)?;
    match Response::decode(h.op, &body).map_err(|e| format!("memory server {server}: {e}"))? {
        Response::StatusOk(st) => Ok(st),
        Response::Error { code, message } => {
            Err(format!("memory server {server} answered {code}: {message}"))
        }
        other => Err(format!(
            "memory server {server} answered {:?} to status",
            other.op()
        )),
    }
}

fn to_json(server: &str, st: &ServerStatus) -> serde_json::Value {
    serde_json::json!({
        "server": server,
        "capacity_bytes": st.capacity_bytes,
        "used_bytes": st.used_bytes,
        "lease_s": st.lease_ms as f64 / 1000.0,
        "sessions_total": st.sessions_total,
        "sessions": st.sessions.iter().map(|s| serde_json::json!({
            "id": s.id.to_string(),
            "used_bytes": s.used_bytes,
            "lease_age_s": s.lease_age_ms as f64 / 1000.0,
            "connections": s.connections,
        })).collect::<Vec<_>>(),
    })
}

fn to_text(server: &str, st: &ServerStatus) -> String {
    let pct = |b: u64| 100.0 * b as f64 / st.capacity_bytes.max(1) as f64;
    let mut o = format!(
        "memory server {server}: {} of {} used ({:.1}%), lease {:.1} s, {} sessions\n",
        format_size(st.used_bytes),
        format_size(st.capacity_bytes),
        pct(st.used_bytes),
        st.lease_ms as f64 / 1000.0,
        st.sessions_total
    );
    for s in &st.sessions {
        o += &format!(
            "  session {}  {:>10}  lease renewed {:.1} s ago  {} connection(s)\n",
            s.id,
            format_size(s.used_bytes),
            s.lease_age_ms as f64 / 1000.0,
            s.connections
        );
    }
    if (st.sessions.len() as u64) < st.sessions_total as u64 {
        o += &format!(
            "  ... and {} smaller sessions\n",
            st.sessions_total as usize - st.sessions.len()
        );
    }
    o
}
