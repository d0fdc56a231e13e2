//! `rmem pool status|drain --manager HOST:PORT`: ask a pool's manager (token from RMEM_TOKEN or
//! RMEM_TOKEN_FILE, the same challenge and response as a memory server's).

use rmem_client::pool::ManagerConn;
use rmem_proto::pool::{self, PoolRequest, PoolResponse, PoolStatus};
use rmem_proto::size::format_size;
use std::time::Duration;

#[derive(clap::Subcommand, Debug)]
pub enum PoolCommand {
    /// The pool's servers (address, capacity, free memory, health) and clients (what each
    /// uses where).
    Status(StatusArgs),
    /// Move every page off SERVER to the pool's other servers while the programs run, then
    /// let it exit; waits until it holds nothing (or --wait runs out).
    Drain(DrainArgs),
}

#[derive(clap::Args, Debug)]
pub struct Common {
    /// The pool manager, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub manager: String,
    /// How long connecting and the answer may take, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub common: Common,
    /// Print JSON: heartbeat_s, servers (addr, capacity_bytes, used_bytes, free_bytes, health,
    /// last_beat_s, sessions), clients (session, name, max_remote_bytes, grant_bytes,
    /// used_bytes, last_beat_s, uses: server, used_bytes, kept: why the client cannot let a
    /// draining server go, empty when it can).
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct DrainArgs {
    /// The server to drain, as the pool names it (HOST:PORT).
    pub server: String,
    #[command(flatten)]
    pub common: Common,
    /// How long to wait for the server to be empty, in seconds.
    #[arg(long, default_value_t = 300.0)]
    pub wait: f64,
}

/// Ask for the drain, then watch the pool's status until the server's last beat says it holds
/// nothing (it then leaves), or every client with pages there says it cannot let it go (their
/// layouts need every server left), or `--wait` runs out (then say what is left: the pool had
/// no room for it, or the server went silent holding pages). A server the manager no longer
/// hears from is not drained by that: what it held when last heard from is what it holds.
fn drain(a: &DrainArgs) -> Result<(), String> {
    let req = PoolRequest::Drain {
        server: a.server.clone(),
    };
    ask(&a.common, &req)?;
    let until = std::time::Instant::now() + Duration::from_secs_f64(a.wait.max(0.0));
    // Its row as last seen: a server silent for long is forgotten by the manager.
    let mut last: Option<(pool::ServerRow, std::time::Instant)> = None;
    loop {
        let st = match ask(&a.common, &PoolRequest::Status)? {
            PoolResponse::StatusOk(st) => st,
            other => return Err(format!("unexpected answer {:?}", other.op())),
        };
        let listed = st.servers.iter().find(|s| s.addr == a.server);
        if let Some(row) = listed {
            last = Some((row.clone(), std::time::Instant::now()));
        }
        let Some((row, seen)) = &last else {
            return Err(format!("the pool's manager does not know {}", a.server));
        };
        let b = row.used_bytes;
        if b == 0 {
            println!("rmem pool: {} drained: no page left on it", a.server);
            return Ok(());
        }
        let kept = kept_by_all(&st, &a.server);
        if !kept.is_empty() {
            return Err(format!(
                "{} cannot be drained now: it holds {} that {}; it keeps serving what it \
                 holds, takes no new pages, and empties once servers enough join the pool",
                a.server,
                format_size(b),
                kept
            ));
        }
        if std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        if listed.is_none_or(|r| r.flags & pool::ROW_LOST != 0) {
            return Err(format!(
                "{} went silent {:.1} s ago holding {}: not drained (stopped, cut off or \
                 dead; should it come back it drains on, and if it does not, the clients \
                 that used it rebuild what their layouts allow from their other pieces){}",
                a.server,
                row.beat_age_ms as f64 / 1000.0 + seen.elapsed().as_secs_f64(),
                format_size(b),
                holders(&st, &a.server)
            ));
        }
        return Err(format!(
            "{} still holds {} after {:.0} s: the other servers have no room for it, or a \
             client keeps it (one that does not follow the pool, or older than the reasons \
             in beats){}; it keeps serving what it holds and takes no new pages",
            a.server,
            format_size(b),
            a.wait,
            holders(&st, &a.server)
        ));
    }
}

/// When every client with pages on `server` (as the manager last heard) says why it cannot let
/// it go: "NAME cannot let go: WHY; ..." (empty when one does not say, or none holds pages).
fn kept_by_all(st: &PoolStatus, server: &str) -> String {
    let mut why = Vec::new();
    for (name, u) in holding(st, server) {
        if u.kept.is_empty() {
            return String::new();
        }
        why.push(format!("{name} cannot let go: {}", u.kept));
    }
    why.join("; ")
}

/// Each client with pages on `server` as the manager last heard, with that use.
fn holding<'a>(
    st: &'a PoolStatus,
    server: &'a str,
) -> impl Iterator<Item = (&'a str, &'a pool::ServerUse)> {
    st.clients.iter().filter_map(move |c| {
        let u = c.uses.iter().find(|u| u.server == server && u.bytes > 0)?;
        Some((c.name.as_str(), u))
    })
}

/// The clients with pages on `server` as the manager last heard, for a drain that does not
/// end: "; clients with pages there: NAME (SIZE), ..." (empty if none says so).
fn holders(st: &PoolStatus, server: &str) -> String {
    let named: Vec<String> = holding(st, server)
        .map(|(name, u)| format!("{name} ({})", format_size(u.bytes)))
        .collect();
    if named.is_empty() {
        String::new()
    } else {
        format!("; clients with pages there: {}", named.join(", "))
    }
}

pub fn run(c: PoolCommand) -> i32 {
    let r = match &c {
        PoolCommand::Status(a) => ask(&a.common, &PoolRequest::Status).map(|r| match r {
            PoolResponse::StatusOk(st) if a.json => println!("{}", to_json(&st)),
            PoolResponse::StatusOk(st) => print!("{}", to_text(&a.common.manager, &st)),
            other => eprintln!("rmem pool: unexpected answer {:?}", other.op()),
        }),
        PoolCommand::Drain(a) => drain(a),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rmem pool: {e}");
            1
        }
    }
}

fn ask(c: &Common, req: &PoolRequest) -> Result<PoolResponse, String> {
    if !(c.timeout.is_finite() && c.timeout > 0.0) {
        return Err(format!("--timeout: {} is not a positive number", c.timeout));
    }
    let timeout = Duration::from_secs_f64(c.timeout);
    let token = crate::launch::token_from_env("rmem pool")?;
    let chain = |e: rmem_client::store::StoreError| rmem_client::error_chain(&e);
    let mut conn = ManagerConn::connect(&c.manager, token.as_bytes(), timeout).map_err(chain)?;
    conn.ask(req, timeout).map_err(chain)
}

fn health(flags: u32) -> &'static str {
    if flags & pool::ROW_LOST != 0 {
        "lost"
    } else if flags & pool::SERVER_DRAINING != 0 {
        "draining"
    } else if flags & pool::SERVER_NODE_BORROWS != 0 {
        "in debt"
    } else if flags & pool::SERVER_RECLAIMING != 0 {
        "reclaiming"
    } else {
        "ok"
    }
}

fn tier(flags: u32) -> &'static str {
    if flags & pool::SERVER_DISK != 0 {
        "disk"
    } else {
        "ram"
    }
}

fn limit(b: u64) -> serde_json::Value {
    if b == pool::UNLIMITED {
        serde_json::Value::Null
    } else {
        b.into()
    }
}

fn to_json(st: &PoolStatus) -> serde_json::Value {
    serde_json::json!({
        "heartbeat_s": st.heartbeat_ms as f64 / 1000.0,
        "servers": st.servers.iter().map(|s| serde_json::json!({
            "addr": s.addr,
            "capacity_bytes": s.capacity_bytes,
            "used_bytes": s.used_bytes,
            "free_bytes": s.capacity_bytes.saturating_sub(s.used_bytes),
            "health": health(s.flags),
            "tier": tier(s.flags),
            "last_beat_s": s.beat_age_ms as f64 / 1000.0,
            "sessions": s.sessions.iter().map(|u| serde_json::json!({
                "id": u.session.to_string(), "used_bytes": u.bytes,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "clients": st.clients.iter().map(|c| serde_json::json!({
            "session": c.session.to_string(),
            "name": c.name,
            "max_remote_bytes": limit(c.max_remote_bytes),
            "grant_bytes": limit(c.grant_bytes),
            "used_bytes": c.uses.iter().map(|u| u.bytes).sum::<u64>(),
            "last_beat_s": c.beat_age_ms as f64 / 1000.0,
            "uses": c.uses.iter().map(|u| serde_json::json!({
                "server": u.server, "used_bytes": u.bytes, "kept": u.kept,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn to_text(manager: &str, st: &PoolStatus) -> String {
    let mut o = format!(
        "pool manager {manager}: {} servers, {} clients, heartbeat {:.1} s\n",
        st.servers.len(),
        st.clients.len(),
        st.heartbeat_ms as f64 / 1000.0
    );
    o += &format!(
        "  {:<24} {:>10} {:>10} {:>10}  {:<4} {:<8} {:>9} sessions\n",
        "server", "capacity", "used", "free", "tier", "health", "last beat"
    );
    for s in &st.servers {
        o += &format!(
            "  {:<24} {:>10} {:>10} {:>10}  {:<4} {:<8} {:>7.1} s {}\n",
            s.addr,
            format_size(s.capacity_bytes),
            format_size(s.used_bytes),
            format_size(s.capacity_bytes.saturating_sub(s.used_bytes)),
            tier(s.flags),
            health(s.flags),
            s.beat_age_ms as f64 / 1000.0,
            s.sessions.len()
        );
    }
    let size = |b: u64| {
        if b == pool::UNLIMITED {
            "no limit".to_string()
        } else {
            format_size(b)
        }
    };
    for c in &st.clients {
        let used: u64 = c.uses.iter().map(|u| u.bytes).sum();
        o += &format!(
            "  client {} {}: {} used, grant {}\n",
            c.session,
            c.name,
            format_size(used),
            size(c.grant_bytes)
        );
        for u in c.uses.iter().filter(|u| u.bytes > 0) {
            o += &format!("    {:<24} {:>10}", u.server, format_size(u.bytes));
            if !u.kept.is_empty() {
                o += &format!("  (cannot let it go: {})", u.kept);
            }
            o += "\n";
        }
    }
    o
}
