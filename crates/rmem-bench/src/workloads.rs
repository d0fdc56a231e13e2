//! The workloads in `workloads/`: small self-checking C programs with the access patterns of
//! the rmem papers, compiled on demand into `target/release/workloads/NAME`.
//!
//! Entry points: [`build`] (compile one if its source is newer than its binary) and
//! [`parse_result`] (read the one line a workload prints). Each workload takes its data
//! size in MiB, and optionally one number (iterations, steps or updates); it allocates
//! through `wl_alloc`, which is remote memory (`dlm_alloc`) when `RMEM_MODE=api`, as
//! `rmem run --api` sets, and `malloc` otherwise.
//!
//! This file uses only `std`, so integration tests include it with `#[path]`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// One workload: its name (the source is `workloads/NAME.c`) and what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    pub name: &'static str,
    pub about: &'static str,
}

/// Every workload, in the order the papers evaluate them.
pub const WORKLOADS: [Workload; 7] = [
    Workload {
        name: "stream",
        about: "STREAM copy/scale/add/triad over 3 arrays",
    },
    Workload {
        name: "himeno",
        about: "Himeno 3D 19-point Jacobi stencil over 14 grids",
    },
    Workload {
        name: "cg",
        about: "CG-like repeated CSR sparse matrix-vector product",
    },
    Workload {
        name: "is",
        about: "IS-like bucket sort of 24-bit keys",
    },
    Workload {
        name: "cluster",
        about: "Cluster 3.0 maximum-linkage merges over a shrinking distance matrix",
    },
    Workload {
        name: "random",
        about: "uniform random read-modify-write of 8-byte words",
    },
    Workload {
        name: "sort",
        about: "bottom-up merge sort of 64-bit keys",
    },
];

/// The workload called `name`.
pub fn by_name(name: &str) -> Option<Workload> {
    WORKLOADS.iter().copied().find(|w| w.name == name)
}

/// `workloads/` in the source tree: `RMEM_WORKLOADS_DIR` if set, else where this crate was
/// built from.
pub fn source_dir() -> PathBuf {
    match std::env::var_os("RMEM_WORKLOADS_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workloads"),
    }
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Compile `workloads/NAME.c` into `TARGET/workloads/NAME` against `TARGET/librmem.so`
/// (`target` is `target/release`), unless the binary is newer than the sources. Returns
/// the binary's path.
pub fn build(target: &Path, name: &str) -> Result<PathBuf, String> {
    let src_dir = source_dir();
    let src = src_dir.join(format!("{name}.c"));
    let include = src_dir.join("../include");
    if by_name(name).is_none() || !src.exists() {
        return Err(format!("no workload {name} ({} is missing)", src.display()));
    }
    let lib = target.join("librmem.so");
    if !lib.exists() {
        return Err(format!(
            "{} is missing: run `cargo build --release --workspace` first",
            lib.display()
        ));
    }
    let out_dir = target.join("workloads");
    let out = out_dir.join(name);
    let inputs = [src.clone(), src_dir.join("wl.h"), include.join("dlm.h")];
    if let Some(built) = modified(&out) {
        if inputs
            .iter()
            .all(|i| modified(i).is_some_and(|t| t <= built))
        {
            return Ok(out);
        }
    }
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    // Compile to a private name and rename, so concurrent builds never see half a binary.
    let tmp = out_dir.join(format!(".{name}.{}", std::process::id()));
    let status = Command::new("cc")
        // No contraction into fused multiply-adds: the self-checks recompute results and
        // compare them bit for bit.
        .args(["-O2", "-Wall", "-ffp-contract=off", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-L")
        .arg(target)
        .arg("-lrmem")
        .arg(format!("-Wl,-rpath,{}", target.display()))
        .arg("-lm")
        .arg("-o")
        .arg(&tmp)
        .status()
        .map_err(|e| format!("cannot run cc (scripts/deps.sh installs it): {e}"))?;
    if !status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("compiling {} failed ({status})", src.display()));
    }
    std::fs::rename(&tmp, &out).map_err(|e| format!("cannot rename to {}: {e}", out.display()))?;
    Ok(out)
}

/// What a workload reported: `workload NAME ok seconds=S checksum=HEX`.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub seconds: f64,
    pub checksum: String,
}

/// The result line of workload `name` in its standard output, if it passed its self-check.
pub fn parse_result(name: &str, stdout: &str) -> Option<Outcome> {
    let prefix = format!("workload {name} ok ");
    let rest = stdout.lines().find_map(|l| l.strip_prefix(&prefix))?;
    let field = |key: &str| {
        rest.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
    };
    Some(Outcome {
        seconds: field("seconds")?.parse().ok()?,
        checksum: field("checksum")?.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_result_line() {
        let out = "noise\nworkload sort ok seconds=1.250000 checksum=00ff\n";
        assert_eq!(
            parse_result("sort", out),
            Some(Outcome {
                seconds: 1.25,
                checksum: "00ff".into()
            })
        );
        assert_eq!(parse_result("stream", out), None);
        assert_eq!(parse_result("sort", "workload sort FAILED: x"), None);
    }

    #[test]
    fn every_workload_has_a_source() {
        for w in WORKLOADS {
            assert!(source_dir().join(format!("{}.c", w.name)).exists(), "{w:?}");
        }
    }
}
