//! rmem-bench: rmem's benchmarks, each printing ratios measured in one run and writing JSON
//! (`rmem bench ARGS` runs `rmem-bench ARGS`). A binary of its own so that `rmem`, which
//! every memory node runs, carries neither the benchmarks, nor their swap setup that needs
//! root, nor the plotting library (which links fontconfig and freetype).
//!
//! This file is the command line: one module per benchmark, which depend on what they share
//! (report.rs: output options, percentiles, targets; setup.rs: a local server and the raw
//! round trip; limits.rs: the network's limits; plot.rs; workloads.rs) and never on each
//! other. Servers are started through the `rmem` beside this binary (`rmem_cli::launch`).

mod bounded;
mod compress;
mod fault;
mod fork;
mod limits;
mod nbd;
mod plot;
mod policies;
mod pool;
mod programs;
mod redundancy;
mod report;
mod scan;
mod setup;
mod suite;
mod swap;
mod syscalls;
mod workloads;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "rmem-bench",
    version,
    about = "rmem's benchmarks: ratios measured in one run, JSON and plots (also `rmem bench`)"
)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Latency of one remote 4 KiB fault against the raw 4 KiB round trip, in one run.
    Fault(fault::FaultArgs),
    /// Sequential scan bandwidth of a region larger than the local budget, per page size.
    Scan(scan::ScanArgs),
    /// The workloads on local memory, rmem, and kernel swap to disk and to zram under a
    /// cgroup limit, at several local ratios and page sizes, with the network's limits.
    Suite(suite::SuiteArgs),
    /// Every workload pattern at several local ratios under every policy, live and simulated.
    Policies(policies::PoliciesArgs),
    /// Real programs (GNU sort, numpy, sqlite3, Octave, ImageMagick, CPython, STREAM, Himeno) at
    /// 50, 25 and 10% of their footprint under rmem at its defaults, kernel swap to zram and to disk,
    /// against the same programs plain, with their output checked.
    #[command(alias = "real")]
    Programs(programs::ProgramsArgs),
    /// What trapping system calls with remote buffers costs per call, unprivileged, against
    /// the same calls without rmem and with the trap off.
    Syscalls(syscalls::SyscallsArgs),
    /// fork() then exec under rmem against without it, and multiprocessing.Pool with the fork
    /// start method against spawn over remote numpy arrays.
    Fork(fork::ForkArgs),
    /// What surviving a server loss costs: each redundancy layout, with and without
    /// encryption, against none (time, memory, latency), and its repair throughput.
    Redundancy(redundancy::RedundancyArgs),
    /// The block device (`rmem nbd`, data fitting its cache and 4x it) under fio against
    /// nbdkit's memory plugin, nbdkit's file plugin and the kernel's loop device.
    Nbd(nbd::NbdBenchArgs),
    /// The memory pool: a drain's and a reclaim's MB/s and the program's slowdown meanwhile,
    /// direct access by transfer size, a disk-backed server against the raw disk.
    Pool(pool::PoolBenchArgs),
    /// Would compressing pages on the wire pay? The real programs' memory sampled while they
    /// run, each page compressed with LZ4 and zstd: ratios, microseconds per page, and what
    /// it would add to a fetch and a write-back on 10 and 25 Gbit/s links.
    Compress(compress::CompressArgs),
}

fn main() {
    let r = match Cli::parse().command {
        BenchCommand::Fault(a) => fault::fault(a),
        BenchCommand::Scan(a) => scan::scan(a),
        BenchCommand::Suite(a) => suite::run(a),
        BenchCommand::Policies(a) => policies::policies(a),
        BenchCommand::Programs(a) => programs::programs(a),
        BenchCommand::Syscalls(a) => syscalls::syscalls(a),
        BenchCommand::Fork(a) => fork::fork(a),
        BenchCommand::Redundancy(a) => redundancy::redundancy(a),
        BenchCommand::Nbd(a) => nbd::nbd(a),
        BenchCommand::Pool(a) => pool::pool(a),
        BenchCommand::Compress(a) => compress::compress(a),
    };
    if let Err(e) = r {
        eprintln!("rmem bench: {e}");
        std::process::exit(1);
    }
}
