//! The physical limits measured in the same run as the suite: loopback TCP round trip of
//! 4 KiB, loopback streaming bandwidth, and memcpy bandwidth.

use crate::report::{err, percentile_us};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// What the network and memory of this machine can do at best. Bandwidths in Gbit/s
/// (10^9 bits per second).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub rtt_us_p50: f64,
    pub loopback_gbps: f64,
    pub memcpy_gbps: f64,
}

impl Limits {
    /// Loopback bandwidth in bytes per second.
    pub fn loopback_bytes_per_s(&self) -> f64 {
        self.loopback_gbps * 1e9 / 8.0
    }
}

const MSG: usize = 4096;
const CHUNK: usize = 1 << 20;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

fn pair() -> Result<(TcpStream, TcpStream), String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(err)?;
    let client = TcpStream::connect(listener.local_addr().map_err(err)?).map_err(err)?;
    let (server, _) = listener.accept().map_err(err)?;
    for s in [&client, &server] {
        s.set_nodelay(true).map_err(err)?;
        s.set_read_timeout(Some(IO_TIMEOUT)).map_err(err)?;
        s.set_write_timeout(Some(IO_TIMEOUT)).map_err(err)?;
    }
    Ok((client, server))
}

/// Median of `samples` blocking ping-pongs of 4 KiB over 127.0.0.1, in microseconds.
fn rtt_us_p50(samples: usize) -> Result<f64, String> {
    tcp_rtt_us_p50(samples, MSG)
}

/// Median of `samples` blocking ping-pongs of `bytes` over 127.0.0.1, in microseconds.
pub fn tcp_rtt_us_p50(samples: usize, bytes: usize) -> Result<f64, String> {
    let (mut client, mut server) = pair()?;
    let echo = std::thread::spawn(move || {
        let mut b = vec![0u8; bytes];
        while server.read_exact(&mut b).is_ok() && server.write_all(&b).is_ok() {}
    });
    let mut b = vec![0x5au8; bytes];
    let mut rtt = Vec::with_capacity(samples);
    for i in 0..samples + samples / 10 {
        let t0 = Instant::now();
        client.write_all(&b).map_err(err)?;
        client.read_exact(&mut b).map_err(err)?;
        if i >= samples / 10 {
            rtt.push(t0.elapsed());
        }
    }
    drop(client);
    let _ = echo.join();
    rtt.sort();
    Ok(percentile_us(&rtt, 0.5))
}

/// Stream `bytes` over 127.0.0.1 to a reader thread; Gbit/s.
fn loopback_gbps(bytes: usize) -> Result<f64, String> {
    let (mut client, mut server) = pair()?;
    let reader = std::thread::spawn(move || {
        let mut b = vec![0u8; CHUNK];
        let mut got = 0usize;
        while let Ok(n) = server.read(&mut b) {
            if n == 0 {
                break;
            }
            got += n;
        }
        got
    });
    let chunk = vec![0xa5u8; CHUNK];
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < bytes {
        client.write_all(&chunk).map_err(err)?;
        sent += CHUNK;
    }
    client.shutdown(Shutdown::Write).map_err(err)?;
    let got = reader.join().map_err(|_| "loopback reader panicked")?;
    let secs = t0.elapsed().as_secs_f64();
    if got != sent {
        return Err(format!(
            "loopback stream: sent {sent} bytes, received {got}"
        ));
    }
    Ok(sent as f64 * 8.0 / secs / 1e9)
}

/// Best of a few copies of `bytes` between two buffers already in memory; Gbit/s of bytes
/// copied (each byte is read once and written once).
fn memcpy_gbps(bytes: usize) -> f64 {
    let src: Vec<u8> = (0..bytes).map(|i| (i * 131 + 7) as u8).collect();
    let mut dst = vec![1u8; bytes];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    bytes as f64 * 8.0 / best / 1e9
}

/// Measure all three; `scale` in MiB sizes the bandwidth transfers.
pub fn measure(rtt_samples: usize, scale_mib: usize) -> Result<Limits, String> {
    Ok(Limits {
        rtt_us_p50: rtt_us_p50(rtt_samples)?,
        loopback_gbps: loopback_gbps(4 * (scale_mib << 20))?,
        memcpy_gbps: memcpy_gbps(scale_mib << 20),
    })
}
