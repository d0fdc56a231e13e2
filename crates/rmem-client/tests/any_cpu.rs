//! `ec:K+M` runs on any x86-64 CPU, not only on those with AVX2: the Reed-Solomon kernels are
//! chosen when the program runs (store/gf256.rs). The proof is this test binary run again
//! under QEMU's user-mode emulator with CPU models that lack AVX2 (Nehalem: SSSE3) and SSSE3
//! too (qemu64), encoding and rebuilding pages with every ec layout; with a kernel compiled
//! for AVX2 (as reed-solomon-erasure's own `simd-accel` C is) QEMU stops it with SIGILL.

use rmem_client::store::codec::{Codec, Redundancy, Stamp};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Every ec layout, sealed by a checksum and encrypted, at 4 KiB and 64 KiB pages: each page
/// encoded, then decoded without M of its fragments.
#[test]
fn ec_pages_come_back_from_any_k_fragments() {
    for layout in ["ec:2+1", "ec:4+1", "ec:4+2", "ec:8+2"] {
        for page_size in [4096, 65536] {
            for encrypt in [false, true] {
                let c = Codec::new(page_size, Redundancy::parse(layout).unwrap(), encrypt).unwrap();
                let data: Vec<u8> = (0..page_size)
                    .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
                    .collect();
                let stamp = Stamp { version: 5, key: 0 };
                let mut units = Vec::new();
                c.encode(11, stamp, &data, &mut units);
                let (w, lose) = (c.slots(), c.redundancy().tolerates());
                let all = (1u32 << w) - 1;
                // The first M fragments lost (data rebuilt from parity), then the last M (the
                // parity itself): the lost ones hold garbage.
                for have in [all & !((1 << lose) - 1), all >> lose] {
                    let mut buf = units.clone();
                    for (i, unit) in buf.chunks_mut(c.unit_len()).enumerate() {
                        if have & (1 << i) == 0 {
                            unit.fill(0x5A);
                        }
                    }
                    c.decode(11, &stamp.into(), &mut buf, have).unwrap();
                    assert!(
                        buf[..page_size] == data[..],
                        "{layout} {page_size} encrypt={encrypt}: wrong page from {have:#b}"
                    );
                }
            }
        }
    }
}

#[test]
fn ec_runs_on_cpus_without_avx2() {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("not x86-64: the CPU models checked here are x86's");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for cpu in ["Nehalem", "qemu64"] {
        let mut child = Command::new("qemu-x86_64")
            .args(["-cpu", cpu])
            .arg(&exe)
            .args([
                "--exact",
                "ec_pages_come_back_from_any_k_fragments",
                "--nocapture",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("qemu-x86_64 (Debian's qemu-user, installed by scripts/deps.sh): {e}")
            });
        let started = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if started.elapsed() > Duration::from_secs(240) {
                let _ = child.kill();
                panic!("ec under qemu-x86_64 -cpu {cpu} ran over 240 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            status.success() && stdout.contains("1 passed"),
            "ec on a {cpu} CPU (qemu-x86_64): {status:?}\n{stdout}\n{stderr}"
        );
        eprintln!(
            "ec on a {cpu} CPU: {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
}
