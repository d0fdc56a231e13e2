//! The fuzz targets of fuzz/ in the test suite, on the stable toolchain: libFuzzer needs
//! nightly and `cargo fuzz`, which the suite does not assume. So this is not coverage-guided
//! fuzzing: each target replays its committed corpus (fuzz/corpus/TARGET/seed-*), then runs
//! seeded random mutations of it (bit flips, interesting integers, cuts, splices) for a
//! bounded time. `cargo fuzz run TARGET` is the real thing (docs/fuzzing.md). A panic
//! anywhere, a server thread's included, fails the target.

#[path = "../../../fuzz/harness.rs"]
mod harness;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Mutation time per target, beyond the corpus replay.
const BUDGET: Duration = Duration::from_secs(3);

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = corpus_dir(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("seed-")
        })
        .collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// Panics seen on any thread (the servers' connection threads would otherwise die quietly).
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn watch_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.lock().unwrap().push(info.to_string());
            default(info);
        }));
    });
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING: [u32; 9] = [
    0,
    1,
    0x7F,
    0x80,
    0xFF,
    4096,
    16 * 1024 * 1024 + 65,
    0x7FFF_FFFF,
    u32::MAX,
];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut d = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(d.len());
        match rng.below(6) {
            0 if !d.is_empty() => d[at] ^= 1 << rng.below(8),
            1 if !d.is_empty() => d[at] = INTERESTING[rng.below(INTERESTING.len())] as u8,
            2 if d.len() >= 4 => {
                let at = rng.below(d.len() - 3);
                let v = INTERESTING[rng.below(INTERESTING.len())];
                d[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            3 => d.truncate(at),
            4 => {
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len());
                d.splice(at..at, other[from..].iter().copied().take(64));
            }
            _ => d.insert(at.min(d.len()), rng.next() as u8),
        }
    }
    d
}

fn run(target: &str) {
    watch_panics();
    let f = harness::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .unwrap()
        .1;
    let seeds = corpus(target);
    assert!(!seeds.is_empty(), "no seeds for {target}");
    for s in &seeds {
        f(s);
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ target.len() as u64);
    let started = Instant::now();
    let mut runs = 0;
    while started.elapsed() < BUDGET {
        f(&mutate(&mut rng, &seeds));
        runs += 1;
    }
    eprintln!(
        "{target}: {} seeds replayed, {runs} mutations in {:?} (not coverage-guided: see docs/fuzzing.md)",
        seeds.len(),
        started.elapsed()
    );
    let panics = PANICS.lock().unwrap();
    assert!(panics.is_empty(), "{target}: {panics:?}");
}

#[test]
fn proto_request() {
    run("proto_request");
}

#[test]
fn proto_response() {
    run("proto_response");
}

#[test]
fn server_session() {
    run("server_session");
}

#[test]
fn client_session() {
    run("client_session");
}

#[test]
fn metrics_http() {
    run("metrics_http");
}

#[test]
fn pool_frames() {
    run("pool_frames");
}

#[test]
fn nbd_session() {
    run("nbd_session");
}

/// Rewrite the committed seeds from harness::seeds() (after a protocol change).
#[test]
#[ignore]
fn write_seed_corpus() {
    let mut n = std::collections::HashMap::new();
    for (target, data) in harness::seeds() {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        let i = n.entry(target).or_insert(0);
        std::fs::write(dir.join(format!("seed-{i:02}")), data).unwrap();
        *i += 1;
    }
}
