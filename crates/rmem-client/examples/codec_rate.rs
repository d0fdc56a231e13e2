//! Microseconds to encode a page into its ec fragments (with its checksum seal) and to decode
//! it with its first data fragment lost (rebuilt from parity), per layout and page size; and
//! each GF(2^8) kernel this CPU runs, multiplying and adding 16 KiB fragments:
//!   cargo run --release -p rmem-client --example codec_rate -- [ITERATIONS]
use rmem_client::store::codec::{Codec, Redundancy, Stamp};
use rmem_client::store::gf256::{apply, Kernel};
use std::time::Instant;

fn main() {
    let iterations: u32 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("ITERATIONS"))
        .unwrap_or(20_000);
    println!("layout  page   encode us  decode us (a data fragment lost)");
    for layout in ["ec:2+1", "ec:4+1", "ec:4+2", "ec:8+2"] {
        for page_size in [4096, 65536] {
            let c = Codec::new(page_size, Redundancy::parse(layout).unwrap(), false).unwrap();
            let data: Vec<u8> = (0..page_size).map(|i| (i * 7 + i / 251) as u8).collect();
            let stamp = Stamp { version: 1, key: 0 };
            let mut units = Vec::new();
            let t = Instant::now();
            for _ in 0..iterations {
                c.encode(3, stamp, &data, &mut units);
            }
            let encode = t.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
            let have = ((1u32 << c.slots()) - 1) & !1;
            let mut buf = units.clone();
            let t = Instant::now();
            for _ in 0..iterations {
                buf.copy_from_slice(&units);
                c.decode(3, &stamp.into(), &mut buf, have).expect("decodes");
            }
            let decode = t.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
            assert!(buf[..page_size] == data[..]);
            println!(
                "{layout:7} {:4}K  {encode:9.2}  {decode:9.2}",
                page_size / 1024
            );
        }
    }
    let input: Vec<u8> = (0..16384).map(|i| (i * 13 + 5) as u8).collect();
    let mut out = vec![0u8; input.len()];
    for kernel in Kernel::available() {
        let t = Instant::now();
        for i in 0..iterations {
            apply::<true>(kernel, (i % 255 + 1) as u8, &input, &mut out);
        }
        let gbs = input.len() as f64 * f64::from(iterations) / t.elapsed().as_secs_f64() / 1e9;
        println!("kernel {kernel:?}: {gbs:.1} GB/s multiply-add");
    }
}
