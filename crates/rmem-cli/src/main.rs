//! rmem: the command-line entry point.
//!
//! `rmem server` runs a memory server, `rmem run` starts servers and runs a program on them,
//! `rmem nbd` serves remote memory as a block device,
//! `rmem manager` runs a pool's manager and `rmem pool` asks it, `rmem region` puts and gets
//! named direct regions,
//! `rmem status` asks a server what it holds, `rmem cc` compiles DLM programs (cc/). Each
//! subcommand lives in its own module of the library (lib.rs). `rmem bench` runs the
//! `rmem-bench` beside this binary, which is a crate of its own so that the binary every
//! memory node runs carries no benchmark code and links no plotting library.

mod bench;

use clap::{Parser, Subcommand};
use rmem_cli::{
    cc, launch_cmd, manager_cmd, nbd_cmd, pool_cmd, region_cmd, run_cmd, server_cmd, sim_cmd,
    status_cmd,
};

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
    /// Benchmarks that print ratios measured in one run and write JSON: runs `rmem-bench`
    /// (beside this binary) with the arguments; `rmem bench --help` lists them.
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<std::ffi::OsString>,
    },
    /// Replay a reference trace under every policy and Belady's OPT.
    Sim(sim_cmd::SimArgs),
    /// The DLM compiler: translate `dlm` arrays, compile with $CC, link librmem (also as
    /// `dlmcc`). `rmem cc --help` for its options; the others go to the compiler.
    #[command(disable_help_flag = true)]
    Cc {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<String>,
    },
    /// Serve remote memory as a block device over NBD (nbd-client, qemu, nbdfuse, fio).
    Nbd(nbd_cmd::NbdArgs),
    /// Start memory servers, print where they are, finalize them when stdin closes (what
    /// librmem runs for a program started without `rmem run`).
    Launch(launch_cmd::LaunchCmdArgs),
    /// Show a memory server's capacity, use and sessions (token from RMEM_TOKEN or
    /// RMEM_TOKEN_FILE).
    Status(status_cmd::StatusArgs),
    /// Run a memory pool's manager: it knows the servers (capacity, free memory, health by
    /// heartbeat) and the clients (what each uses where).
    Manager(manager_cmd::ManagerArgs),
    /// Ask a pool's manager: `rmem pool status --manager HOST:PORT [--json]`.
    #[command(subcommand)]
    Pool(pool_cmd::PoolCommand),
    /// Named direct regions from the command line: `rmem region put NAME FILE` holds a
    /// file's bytes on the memory servers for other processes, `get NAME FILE` reads them,
    /// `ls` lists them (docs/regions.md).
    #[command(subcommand)]
    Region(region_cmd::RegionCommand),
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let invoked_as = std::path::Path::new(argv.first().map_or("", String::as_str))
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    if invoked_as == "dlmcc" {
        std::process::exit(cc::run(&argv[1..]));
    }
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Server(a) => server_cmd::run(a),
        Command::Run(a) => run_cmd::run(a),
        Command::Bench { args } => bench::run(&args),
        Command::Sim(a) => sim_cmd::run(a),
        Command::Launch(a) => launch_cmd::run(a),
        Command::Nbd(a) => nbd_cmd::run(a),
        Command::Cc { args } => cc::run(&args),
        Command::Status(a) => status_cmd::run(a),
        Command::Manager(a) => manager_cmd::run(a),
        Command::Pool(c) => pool_cmd::run(c),
        Command::Region(c) => region_cmd::run(c),
    };
    std::process::exit(code);
}
