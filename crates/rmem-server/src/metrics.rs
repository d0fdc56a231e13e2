//! Request counts and latencies, and the Prometheus text exposition of them with the
//! server's status, served over plain HTTP by [`serve`] (`rmem server --metrics ADDR:PORT`).
//!
//! A request's latency is the server's own time on it: from its frame decoded to its answer
//! encoded (the network and the client's queueing are not in it).

use crate::ServerState;
use rmem_proto::{Op, ServerStatus};
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Operations counted, in exposition order, with their label.
const OPS: [(Op, &str); 13] = [
    (Op::Read, "read"),
    (Op::Write, "write"),
    (Op::Swap, "swap"),
    (Op::Free, "free"),
    (Op::Ping, "ping"),
    (Op::Attach, "attach"),
    (Op::EndSession, "end_session"),
    (Op::Status, "status"),
    (Op::Snapshot, "snapshot"),
    (Op::EndSnapshot, "end_snapshot"),
    (Op::ReadRange, "read_range"),
    (Op::ReadPart, "read_part"),
    (Op::WriteRange, "write_range"),
];

/// Histogram bucket bounds, in nanoseconds (1 us to 10 ms).
const BUCKETS_NS: [u64; 9] = [
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 1_000_000, 10_000_000,
];

/// A scrape request may take this long to arrive; longer, and the connection is dropped.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest HTTP request head read.
const HTTP_REQUEST_MAX: usize = 8192;

#[derive(Debug, Default)]
struct OpMetrics {
    count: AtomicU64,
    nanos: AtomicU64,
    /// Bucket i counts requests above BUCKETS_NS[i - 1] and at most BUCKETS_NS[i] (one
    /// increment per request; summed into Prometheus' cumulative buckets when rendered).
    buckets: [AtomicU64; BUCKETS_NS.len()],
}

/// Counters every connection thread updates (relaxed atomics: a scrape may see one request
/// counted in `count` and not yet in its bucket).
#[derive(Debug, Default)]
pub struct Metrics {
    ops: [OpMetrics; OPS.len()],
}

impl Metrics {
    /// Count one answered request of `op` that took `took`.
    pub fn record(&self, op: Op, took: Duration) {
        let Some(i) = OPS.iter().position(|(o, _)| *o == op) else {
            return;
        };
        let m = &self.ops[i];
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        m.count.fetch_add(1, Ordering::Relaxed);
        m.nanos.fetch_add(ns, Ordering::Relaxed);
        if let Some(i) = BUCKETS_NS.iter().position(|&bound| ns <= bound) {
            m.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests of `op` counted so far.
    pub fn count(&self, op: Op) -> u64 {
        OPS.iter()
            .position(|(o, _)| *o == op)
            .map_or(0, |i| self.ops[i].count.load(Ordering::Relaxed))
    }

    /// The Prometheus text format (version 0.0.4) of `status` and these counters.
    pub fn render(&self, status: &ServerStatus, connections: usize) -> String {
        let mut o = String::new();
        let mut gauge = |name: &str, help: &str, v: f64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            "rmem_capacity_bytes",
            "Most bytes of pages the server holds for all sessions.",
            status.capacity_bytes as f64,
        );
        gauge(
            "rmem_used_bytes",
            "Bytes of pages held.",
            status.used_bytes as f64,
        );
        gauge(
            "rmem_lease_seconds",
            "How long a session outlives its last request.",
            status.lease_ms as f64 / 1000.0,
        );
        gauge(
            "rmem_sessions",
            "Sessions held.",
            status.sessions_total as f64,
        );
        gauge(
            "rmem_connections",
            "Client connections open.",
            connections as f64,
        );
        let per_session = [
            (
                "rmem_session_used_bytes",
                "Bytes of pages held by a session.",
            ),
            (
                "rmem_session_lease_age_seconds",
                "Time since a session's lease was last renewed.",
            ),
        ];
        for (k, (name, help)) in per_session.iter().enumerate() {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge");
            for s in &status.sessions {
                let v = match k {
                    0 => s.used_bytes as f64,
                    _ => s.lease_age_ms as f64 / 1000.0,
                };
                let _ = writeln!(o, "{name}{{session=\"{}\"}} {v}", s.id);
            }
        }
        let _ = writeln!(
            o,
            "# HELP rmem_requests_total Requests answered, by operation.\n# TYPE rmem_requests_total counter"
        );
        for ((_, label), m) in OPS.iter().zip(&self.ops) {
            let n = m.count.load(Ordering::Relaxed);
            let _ = writeln!(o, "rmem_requests_total{{op=\"{label}\"}} {n}");
        }
        let name = "rmem_request_duration_seconds";
        let _ = writeln!(
            o,
            "# HELP {name} Server time per request, from decoded to answered, by operation.\n# TYPE {name} histogram"
        );
        for ((_, label), m) in OPS.iter().zip(&self.ops) {
            let mut below = 0;
            for (b, &bound) in m.buckets.iter().zip(&BUCKETS_NS) {
                let le = bound as f64 / 1e9;
                below += b.load(Ordering::Relaxed);
                let _ = writeln!(o, "{name}_bucket{{op=\"{label}\",le=\"{le}\"}} {below}");
            }
            let n = m.count.load(Ordering::Relaxed);
            let sum = m.nanos.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(o, "{name}_bucket{{op=\"{label}\",le=\"+Inf\"}} {n}");
            let _ = writeln!(o, "{name}_sum{{op=\"{label}\"}} {sum}");
            let _ = writeln!(o, "{name}_count{{op=\"{label}\"}} {n}");
        }
        o
    }
}

/// Serve `GET /metrics` (and `GET /`) on `listener`, one scrape at a time, forever.
pub fn serve(listener: TcpListener, state: Arc<ServerState>) {
    for conn in listener.incoming() {
        let Ok(sock) = conn else { continue };
        if let Err(e) = scrape(sock, &state) {
            log::debug!("metrics: a scrape failed: {e}");
        }
    }
}

fn scrape(mut sock: TcpStream, state: &ServerState) -> io::Result<()> {
    sock.set_read_timeout(Some(HTTP_TIMEOUT))?;
    sock.set_write_timeout(Some(HTTP_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = sock.read(&mut buf)?;
        if n == 0 || head.len() + n > HTTP_REQUEST_MAX {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    let (status, kind, body) = match (words.next(), words.next()) {
        (Some("GET"), Some("/metrics" | "/")) => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            state.metrics.render(&state.status(), state.connections()),
        ),
        (Some("GET"), _) => ("404 Not Found", "text/plain", "try /metrics\n".into()),
        _ => ("405 Method Not Allowed", "text/plain", "GET only\n".into()),
    };
    write!(
        sock,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Bind `addr` for [`serve`]; the address bound (port 0 picks one).
pub fn bind(addr: SocketAddr) -> io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr)?;
    let a = l.local_addr()?;
    Ok((l, a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_every_op_is_exposed() {
        let m = Metrics::default();
        m.record(Op::Read, Duration::from_nanos(800));
        m.record(Op::Read, Duration::from_micros(30));
        m.record(Op::Read, Duration::from_secs(1));
        let text = m.render(&ServerStatus::default(), 0);
        assert!(
            text.contains("rmem_requests_total{op=\"read\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("rmem_request_duration_seconds_bucket{op=\"read\",le=\"0.000001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rmem_request_duration_seconds_bucket{op=\"read\",le=\"0.00005\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("rmem_request_duration_seconds_bucket{op=\"read\",le=\"+Inf\"} 3"),
            "{text}"
        );
        for (_, label) in OPS {
            assert!(text.contains(&format!("rmem_requests_total{{op=\"{label}\"}}")));
        }
        assert_eq!(m.count(Op::Read), 3);
    }
}
