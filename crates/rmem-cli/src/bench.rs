//! `rmem bench ARGS`: runs `rmem-bench ARGS`, the benchmarks' own binary (crates/rmem-bench),
//! found beside this `rmem`. The benchmarks are not part of `rmem`, which every memory node
//! runs: they carry the swap setup that needs root and a plotting library that links
//! fontconfig and freetype.

use rmem_cli::launch::BENCH_BIN;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// Replace this process with `rmem-bench ARGS`; returns only if that cannot start.
pub fn run(args: &[OsString]) -> i32 {
    let bench = match bench_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rmem bench: {e}");
            return 127;
        }
    };
    // argv[0] "rmem bench" so that its usage and errors name the command the user typed.
    let err = std::process::Command::new(&bench)
        .arg0("rmem bench")
        .args(args)
        .exec();
    eprintln!("rmem bench: cannot run {}: {err}", bench.display());
    127
}

/// `rmem-bench` beside this executable.
fn bench_exe() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this rmem: {e}"))?;
    let bench = exe.with_file_name(BENCH_BIN);
    if bench.is_file() {
        Ok(bench)
    } else {
        Err(format!(
            "the benchmarks are a separate binary, and there is no {} (build it with \
             `cargo build --release -p rmem-bench`, or `cargo build --release --workspace`)",
            bench.display()
        ))
    }
}
