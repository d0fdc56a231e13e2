//! `rmem cc`, the DLM compiler: programs with `dlm` arrays (tests/c/dlm/) compiled by it, run
//! under `rmem run --api` at a local budget of about a tenth of their data and directly (the
//! program starts its own memory servers), and compared with plain `cc` builds of the same
//! source (`-Ddlm=` makes the arrays ordinary). Every run is bounded in time.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// `rmem cc ARGS`, bounded.
fn rmem_cc_run<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> Output {
    run_bounded(Command::new(rmem()).arg("cc").args(args), LIMIT)
}

/// `o`'s stderr contains `what`.
fn assert_said(o: &Output, what: &str) {
    assert!(o.stderr.contains(what), "wanted {what:?} in:\n{}", o.stderr);
}

/// `rmem cc -O2 -Wall ARGS -o target/release/c-tests/cc-NAME`; returns the binary.
fn rmem_cc(name: &str, sources: &[&str], extra: &[&str]) -> PathBuf {
    let out = target_dir().join("c-tests").join(format!("cc-{name}"));
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let tmp = tmp_output(&out);
    let mut args: Vec<std::ffi::OsString> = vec!["-O2".into(), "-Wall".into()];
    args.extend(extra.iter().map(Into::into));
    args.extend(sources.iter().map(|s| repo_root().join(s).into_os_string()));
    args.extend(["-o".into(), tmp.clone().into_os_string()]);
    let o = rmem_cc_run(&args);
    assert!(
        o.status.success(),
        "rmem cc {sources:?} failed:\n{}",
        o.stderr
    );
    publish(&tmp, &out);
    out
}

/// The same sources built by plain `cc` with `dlm` defined away, and `dlm_alloc` (which the
/// paper's program calls without including anything) made `calloc`.
fn plain_cc(name: &str, sources: &[&str]) -> PathBuf {
    let out = target_dir()
        .join("c-tests")
        .join(format!("plain-cc-{name}"));
    let tmp = tmp_output(&out);
    let o = run_bounded(
        Command::new("cc")
            .args([
                "-O2",
                "-Ddlm=",
                "-Ddlm_alloc(n)=calloc(1, n)",
                "-include",
                "stdlib.h",
                "-w",
            ])
            .args(sources.iter().map(|s| repo_root().join(s)))
            .arg("-o")
            .arg(&tmp),
        LIMIT,
    );
    assert!(o.status.success(), "cc {sources:?} failed:\n{}", o.stderr);
    publish(&tmp, &out);
    out
}

fn plain_output(bin: &Path) -> String {
    let o = run_bounded(&mut Command::new(bin), LIMIT);
    assert!(o.status.success(), "{}: {}", bin.display(), o.stderr);
    o.stdout
}

/// Run `bin` under `rmem run --api --local LOCAL` (as `nobody` when root); its stdout and
/// the number of pages it fetched.
fn under_rmem_run(bin: &Path, local: &str, name: &str) -> (String, u64) {
    let dir = scratch(&format!("cc-{name}"));
    let stats = dir.join("stats.json");
    let as_nobody = is_root();
    if !as_nobody {
        eprintln!("not root: {name} runs as this user, not as nobody");
    }
    let o = run_bounded(
        &mut rmem_run(
            &["--api", "--local", local],
            &stats,
            &[bin.to_str().unwrap()],
            as_nobody,
        ),
        LIMIT,
    );
    assert!(o.status.success(), "{name} under rmem run: {}", o.stderr);
    let swap_ins = read_json(&stats)["swap_ins"].as_u64().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (o.stdout, swap_ins)
}

#[test]
fn the_papers_matrix_vector_program_runs_at_a_tenth_of_its_data() {
    // a: 8 MiB, x: 8 KiB, y (dlm_alloc): 8 KiB; 832 KiB is 10% of it.
    let bin = rmem_cc("matvec", &["tests/c/dlm/matvec.c"], &["-w"]);
    let (out, swap_ins) = under_rmem_run(&bin, "832K", "matvec");
    assert!(out.contains("bad=0 sizeof a=8388608"), "{out}");
    assert!(
        swap_ins >= 100,
        "most of the matrix (128 pages) should come back from the servers: {swap_ins}"
    );
    assert_eq!(
        out,
        plain_output(&plain_cc("matvec", &["tests/c/dlm/matvec.c"]))
    );
}

#[test]
fn a_stream_program_with_dlm_statics_matches_a_plain_build() {
    // 24 MiB of arrays, 2.5 MiB local.
    let bin = rmem_cc("stream", &["tests/c/dlm/stream.c"], &[]);
    let (out, swap_ins) = under_rmem_run(&bin, "2560K", "stream");
    assert!(out.ends_with("ok\n"), "{out}");
    assert!(swap_ins > 0);
    assert_eq!(
        out,
        plain_output(&plain_cc("stream", &["tests/c/dlm/stream.c"]))
    );
}

const THREE: [&str; 3] = [
    "tests/c/dlm/three/main.c",
    "tests/c/dlm/three/fill.c",
    "tests/c/dlm/three/sum.c",
];

#[test]
fn three_files_share_their_extern_dlm_arrays() {
    // 4 MiB + 8 KiB of arrays, 448 KiB local.
    let bin = rmem_cc("three", &THREE, &[]);
    let (out, swap_ins) = under_rmem_run(&bin, "448K", "three");
    assert!(
        out.contains("s=267737088 want=267737088 totals=130823"),
        "{out}"
    );
    assert!(swap_ins > 0);
    assert_eq!(out, plain_output(&plain_cc("three", &THREE)));
}

#[test]
fn a_file_that_declares_a_dlm_array_without_dlm_does_not_link() {
    let mut srcs = THREE.map(|s| repo_root().join(s)).to_vec();
    srcs.push(repo_root().join("tests/c/dlm/three/plain_extern.c"));
    let out = scratch("cc-plain-extern").join("prog");
    srcs.extend(["-o".into(), out]);
    let o = rmem_cc_run(&srcs);
    assert!(!o.status.success(), "linked a plain extern of a dlm array");
    assert_said(&o, "undefined reference to `grid'");
}

#[test]
fn every_translation_case_prints_what_a_plain_build_prints() {
    let bin = rmem_cc("cases", &["tests/c/dlm/cases.c"], &[]);
    let (out, _) = under_rmem_run(&bin, "1M", "cases");
    let plain = plain_output(&plain_cc("cases", &["tests/c/dlm/cases.c"]));
    assert_eq!(out, plain);
    assert!(out.contains("init: 1 2 3 4 | 5 6 7 | hello"), "{out}");
}

#[test]
fn diagnostics_point_at_the_users_source() {
    let src = repo_root().join("tests/c/dlm/errors.c");
    let o = rmem_cc_run([
        Path::new("-c"),
        &src,
        Path::new("-o"),
        Path::new("/dev/null"),
    ]);
    assert!(!o.status.success());
    assert_said(
        &o,
        "errors.c:7: error: dlm array a is an array: it cannot be assigned",
    );
    // A warning of the compiler after a multi-line dlm declaration, at the right line.
    let src = repo_root().join("tests/c/dlm/warn.c");
    let out = scratch("cc-warn").join("warn.o");
    let o = rmem_cc_run([
        Path::new("-Wall"),
        Path::new("-c"),
        &src,
        Path::new("-o"),
        &out,
    ]);
    assert!(o.status.success(), "{}", o.stderr);
    assert_said(&o, "warn.c:8:9: warning: unused variable");
}

#[test]
fn emit_c_writes_the_translation_and_dlmcc_is_rmem_cc() {
    let src = repo_root().join("tests/c/dlm/matvec.c");
    let o = rmem_cc_run([Path::new("--emit-c"), &src]);
    assert!(o.status.success(), "{}", o.stderr);
    assert!(o
        .stdout
        .contains("double (*a)[1024] __asm__(\"a.dlm\"), (*x) __asm__(\"x.dlm\");"));
    assert!(o.stdout.contains("a[i][j] = i;"));
    let out = scratch("cc-dlmcc").join("matvec");
    let o = run_bounded(
        Command::new(target_dir().join("dlmcc"))
            .args(["-w"])
            .arg(&src)
            .arg("-o")
            .arg(&out),
        LIMIT,
    );
    assert!(o.status.success(), "{}", o.stderr);
    assert!(out.is_file());
}

/// `runuser -u nobody --` around `bin` when root (else the program itself).
fn direct(bin: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(bin);
        c
    } else {
        eprintln!("not root: the direct runs are as this user, not as nobody");
        Command::new(bin)
    }
}

/// The servers a run started itself (`RMEM_VERBOSE=1` names them) have stopped.
fn servers_finalized(stderr: &str) -> bool {
    let line = stderr
        .lines()
        .find(|l| l.contains("no servers configured: started"))
        .unwrap_or_else(|| panic!("no start line in:\n{stderr}"));
    let addrs = line
        .split("started ")
        .nth(1)
        .unwrap()
        .trim_end_matches(" itself");
    addrs.split(", ").all(|a| {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if std::net::TcpStream::connect(a).is_err() {
                return true;
            }
            if std::time::Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

#[test]
fn a_dlm_program_runs_without_rmem_run_on_servers_it_starts() {
    let bin = rmem_cc("matvec-direct", &["tests/c/dlm/matvec.c"], &["-w"]);
    let dir = scratch("cc-direct");
    let stats = dir.join("stats.json");
    // `bin` run directly in `dir` with no servers configured; `env` adds to the environment.
    let run_direct = |env: &[(&str, &std::ffi::OsStr)]| {
        let mut c = direct(&bin);
        c.env_remove("RMEM_SERVERS")
            .env_remove("RMEM_HOSTFILE")
            .env_remove("RMEM_LOCAL")
            .env("RMEM_VERBOSE", "1")
            .env("RMEM_STATS_JSON", &stats)
            .current_dir(&dir);
        for (k, v) in env {
            c.env(k, v);
        }
        run_bounded(&mut c, LIMIT)
    };
    let o = run_direct(&[("RMEM_LOCAL", "832K".as_ref())]);
    assert!(o.status.success(), "{}", o.stderr);
    assert!(o.stdout.contains("bad=0"), "{}", o.stdout);
    assert!(read_json(&stats)["swap_ins"].as_u64().unwrap() >= 100);
    assert_said(&o, "servers 127.0.0.1:");
    assert!(servers_finalized(&o.stderr), "servers still up after exit");

    // With ./dlm_hosts: the first line is the budget, then one server.
    std::fs::write(dir.join("dlm_hosts"), "calhost 832K\nlocalhost 64M\n").unwrap();
    let o = run_direct(&[]);
    assert!(o.status.success(), "{}", o.stderr);
    assert!(o.stdout.contains("bad=0"), "{}", o.stdout);
    let s = read_json(&stats);
    assert!(s["local_bytes_max"].as_u64().unwrap() <= 832 << 10, "{s}");
    assert!(
        !o.stderr.contains(", 127.0.0.1:"),
        "one server: {}",
        o.stderr
    );
    assert!(servers_finalized(&o.stderr));

    // RMEM_HOSTFILE names one; a bad one stops the program before main, saying why.
    let bad = dir.join("bad_hosts");
    std::fs::write(&bad, "calhost 1M\nlocalhost 64Q\n").unwrap();
    let o = run_direct(&[("RMEM_HOSTFILE", bad.as_os_str())]);
    assert_eq!(o.status.code(), Some(69), "{}", o.stderr);
    assert_said(&o, "bad_hosts:2");
    assert_said(&o, "cannot allocate dlm array a");
    let _ = std::fs::remove_dir_all(&dir);
}
