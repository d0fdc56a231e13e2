//! rmem: the command-line entry point.
//!
//! `rmem server` runs a memory server, `rmem run` starts servers and runs a program on them,
//! `rmem status` asks a server what it holds, `rmem bench` measures. Each subcommand lives in its own module.

mod bench_cmd;
mod bench_suite;
mod hostfile;
mod launch;
mod policy_bench;
mod programs_bench;
mod run_cmd;
mod server_cmd;
mod sim_cmd;
mod status_cmd;
mod workloads;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "rmem",
    version,
    about = "Run programs on the memory of other nodes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a memory server.
    Server(server_cmd::ServerArgs),
    /// Start memory servers, run PROGRAM on them, finalize them, report statistics.
    Run(run_cmd::RunArgs),
    /// Benchmarks that print ratios measured in one run and write JSON.
    #[command(subcommand)]
    Bench(bench_cmd::BenchCommand),
    /// Replay a reference trace under every policy and Belady's OPT.
    Sim(sim_cmd::SimArgs),
    /// Show a memory server's capacity, use and sessions (token from RMEM_TOKEN or
    /// RMEM_TOKEN_FILE).
    Status(status_cmd::StatusArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Server(a) => server_cmd::run(a),
        Command::Run(a) => run_cmd::run(a),
        Command::Bench(b) => bench_cmd::run(b),
        Command::Sim(a) => sim_cmd::run(a),
        Command::Status(a) => status_cmd::run(a),
    };
    std::process::exit(code);
}
