//! `rmem status` and `rmem server --metrics` against a real server holding a real program's
//! pages: the JSON and the Prometheus text are parsed and checked against each other, and the
//! text once more by the Prometheus Python client's own parser when it is installed.

mod common;
use common::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

const TOKEN: &str = "secret-for-the-status-test";

/// `GET /metrics` at `addr` (HOST:PORT): the body.
fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

/// Samples of the text format: `name{labels}` -> value (comments checked for form).
fn parse_samples(text: &str) -> HashMap<String, f64> {
    let mut m = HashMap::new();
    for l in text.lines() {
        if let Some(c) = l.strip_prefix('#') {
            assert!(c.starts_with(" HELP ") || c.starts_with(" TYPE "), "{l}");
            continue;
        }
        let (k, v) = l.rsplit_once(' ').unwrap_or_else(|| panic!("{l}"));
        let v: f64 = v.parse().unwrap_or_else(|_| panic!("{l}"));
        assert!(m.insert(k.to_string(), v).is_none(), "repeated {k}");
    }
    m
}

#[test]
fn status_json_and_metrics_describe_a_running_client() {
    let server = ServerProcess::start(
        TOKEN,
        &[
            "--capacity",
            "64M",
            "--lease",
            "20",
            "--metrics",
            "127.0.0.1:0",
        ],
    );
    let line = server
        .wait_for("metrics on http://", Duration::from_secs(10))
        .expect("no metrics address logged");
    let metrics = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    let mut client = touch_forever(&server.addr, TOKEN, 16, 60, &[]);

    let st = status_json(&server.addr, TOKEN);
    assert_eq!(st["capacity_bytes"], 64u64 << 20, "{st}");
    assert_eq!(st["lease_s"], 20.0, "{st}");
    let used = st["used_bytes"].as_u64().unwrap();
    assert!(used >= 12 << 20, "{st}");
    let sessions = st["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{st}");
    let s = &sessions[0];
    let id = s["id"].as_str().unwrap();
    assert!(
        id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()),
        "{st}"
    );
    assert_eq!(s["used_bytes"], used, "{st}");
    assert!(s["lease_age_s"].as_f64().unwrap() < 5.0, "{st}");
    assert_eq!(s["connections"], 1, "{st}");

    // The text form says the same.
    let out = run_bounded(
        Command::new(rmem())
            .args(["status", &server.addr])
            .env("RMEM_TOKEN", TOKEN),
        Duration::from_secs(20),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout.contains("1 sessions") && out.stdout.contains(id),
        "{}",
        out.stdout
    );
    // A wrong token gets nothing but the reason.
    let out = run_bounded(
        Command::new(rmem())
            .args(["status", &server.addr, "--json"])
            .env("RMEM_TOKEN", "not-the-token"),
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty() && out.stderr.contains("wrong token"),
        "{}",
        out.stderr
    );

    let text = scrape(&metrics);
    let m = parse_samples(&text);
    assert_eq!(m["rmem_capacity_bytes"], (64u64 << 20) as f64);
    assert_eq!(m["rmem_sessions"], 1.0);
    let session_used = m[&format!("rmem_session_used_bytes{{session=\"{id}\"}}")];
    assert!(session_used >= (12u64 << 20) as f64, "{text}");
    assert!(m["rmem_used_bytes"] >= (12u64 << 20) as f64, "{text}");
    let writes = m["rmem_requests_total{op=\"write\"}"];
    assert!(writes >= 1.0, "{text}");
    assert!(m["rmem_requests_total{op=\"status\"}"] >= 2.0, "{text}");
    let h = "rmem_request_duration_seconds";
    assert_eq!(m[&format!("{h}_count{{op=\"write\"}}")], writes);
    assert_eq!(
        m[&format!("{h}_bucket{{op=\"write\",le=\"+Inf\"}}")],
        writes
    );
    assert!(m[&format!("{h}_sum{{op=\"write\"}}")] > 0.0);
    // Buckets never decrease.
    let mut last = 0.0;
    for (k, v) in text
        .lines()
        .filter(|l| l.starts_with(&format!("{h}_bucket{{op=\"write\"")))
        .map(|l| l.rsplit_once(' ').unwrap())
    {
        let v: f64 = v.parse().unwrap();
        assert!(v >= last, "{k} {v} < {last}");
        last = v;
    }

    // Once by the reference parser (Debian's python3-prometheus-client, from deps.sh).
    let python = "/usr/bin/python3";
    let has_client = Command::new(python)
        .args(["-c", "import prometheus_client"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has_client {
        let script = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = {f.name: f for f in text_string_to_metric_families(sys.stdin.read())}
print(fams["rmem_used_bytes"].samples[0].value)
print(fams["rmem_request_duration_seconds"].type)
print(sum(1 for s in fams["rmem_requests"].samples if s.labels["op"] == "write"))
"#;
        let mut child = Command::new(python)
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = wait_bounded(
            child,
            Duration::from_secs(30),
            "the prometheus_client parser",
        );
        assert!(out.status.success(), "{}", out.stderr);
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(
            lines.first().map(|v| v.parse::<f64>().unwrap()),
            Some(m["rmem_used_bytes"]),
            "{}",
            out.stdout
        );
        assert_eq!(
            lines.get(1..3),
            Some(&["histogram", "1"][..]),
            "{}",
            out.stdout
        );
    } else {
        eprintln!("skipped the prometheus_client parse: /usr/bin/python3 lacks it (scripts/deps.sh installs python3-prometheus-client)");
    }
    let _ = client.kill();
    let _ = client.wait();
}
