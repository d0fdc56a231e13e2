//! `rmem region put|get|ls`: named direct regions ([`rmem_client::direct`], docs/regions.md)
//! from the command line, to hand a file's bytes to other processes through the memory
//! servers.
//!
//! A named region lives only while its creator holds it, so `put` is the holder: it writes
//! the file, prints one line (`NAME BYTES PID`) once every byte is on the servers, and stays
//! until SIGTERM, SIGINT or SIGHUP ends it (`--detach`: in the background, the line printed by
//! the command that started it). With no servers configured (not under `rmem run`, no
//! `RMEM_SERVERS`) it starts its own, as a program using librmem does, and they go with it.

use rmem_client::config::{self, Config};
use rmem_client::direct::{self, DirectRegion};
use rmem_client::own_servers::{hostfile_from_env, Helper};
use rmem_client::store::remote::Timing;
use rmem_proto::size::format_size;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Bytes moved per call: many pieces in flight at once, a bounded local buffer.
const CHUNK_BYTES: usize = 8 << 20;

#[derive(clap::Subcommand, Debug)]
pub enum RegionCommand {
    /// Make a region named NAME holding FILE's bytes and hold it: prints `NAME BYTES PID` on
    /// stdout once it is written, then stays until SIGTERM, SIGINT or SIGHUP (the region ends
    /// with it). Servers: `rmem run`'s, RMEM_SERVERS/RMEM_TOKEN, else its own.
    Put(PutArgs),
    /// Read the region named NAME (held by another process of this user) into FILE, `-` for
    /// stdout.
    Get(GetArgs),
    /// The named regions held now: name, size, page size, holder's pid.
    Ls,
}

#[derive(clap::Args, Debug)]
pub struct PutArgs {
    pub name: String,
    pub file: PathBuf,
    /// Hold the region in the background: return once it is written, after printing its
    /// line; `kill PID` ends it.
    #[arg(long)]
    pub detach: bool,
    /// The process `--detach` starts: its stderr (inherited by servers it starts) is
    /// /dev/null, so an error goes to stdout, as `error: MESSAGE`, for its starter to say.
    #[arg(long, hide = true)]
    pub background: bool,
}

#[derive(clap::Args, Debug)]
pub struct GetArgs {
    pub name: String,
    /// Where the bytes go; `-` for stdout.
    pub file: PathBuf,
}

pub fn run(c: RegionCommand) -> i32 {
    let r = match c {
        RegionCommand::Put(a) if a.detach => detach(&a),
        RegionCommand::Put(a) if a.background => {
            return match put(&a) {
                Ok(()) => 0,
                Err(e) => {
                    let _ = writeln!(std::io::stdout(), "error: {e}");
                    1
                }
            };
        }
        RegionCommand::Put(a) => put(&a),
        RegionCommand::Get(a) => get(&a),
        RegionCommand::Ls => ls(),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rmem region: {e}");
            1
        }
    }
}

/// The signals that end a `put`, blocked in every thread (the region's engine thread
/// inherits the mask) so that only `sigwait` sees them.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialized by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t we own; blocking signals in this thread has no
    // memory effects.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

/// A line on stderr; a failure is ignored.
fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "rmem region: {msg}");
}

fn put(a: &PutArgs) -> Result<(), String> {
    let mut file =
        std::fs::File::open(&a.file).map_err(|e| format!("{}: {e}", a.file.display()))?;
    let size = file
        .metadata()
        .map_err(|e| format!("{}: {e}", a.file.display()))?
        .len();
    if size == 0 {
        return Err(format!(
            "{} is empty: a region holds at least 1 byte",
            a.file.display()
        ));
    }
    let err = |e: &dyn std::error::Error| rmem_client::error_chain(e);
    // Servers: configured, else started here (and finalized when `helper` goes).
    let (config, helper) = if config::servers_configured() {
        (Config::from_env().map_err(|e| err(&e))?, None)
    } else {
        let (h, own) = Helper::start(hostfile_from_env().as_deref())?;
        (
            Config::from_env_with(Some(&own)).map_err(|e| err(&e))?,
            Some(h),
        )
    };
    let stop = block_stop_signals(); // before the region's engine thread starts
    let region = DirectRegion::create(&config, size, Some(&a.name)).map_err(|e| err(&e))?;
    let mut buf = vec![0u8; CHUNK_BYTES.min(size as usize)];
    let mut done = 0u64;
    while done < size {
        let want = buf.len().min((size - done) as usize);
        file.read_exact(&mut buf[..want]).map_err(|e| {
            format!(
                "{}: {e} after {done} of {size} bytes (did it change?)",
                a.file.display()
            )
        })?;
        region.write(done, &buf[..want]).map_err(|e| err(&e))?;
        done += want as u64;
    }
    drop(buf);
    let pid = std::process::id();
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "{} {size} {pid}", a.name).and_then(|()| stdout.flush());
    say(&format!(
        "{} holds {} of {}{}; holding it until SIGTERM, SIGINT or SIGHUP (kill {pid}); \
         `rmem region get {} FILE` reads it",
        a.name,
        format_size(size),
        a.file.display(),
        if helper.is_some() {
            " on memory servers of its own"
        } else {
            ""
        },
        a.name
    ));
    let mut sig = 0;
    // SAFETY: `stop` is a valid set, blocked in every thread of this process; `sig` is ours.
    unsafe { libc::sigwait(&stop, &mut sig) };
    drop(region);
    if let Some(h) = helper {
        h.stop();
    }
    say(&format!("{} ended (signal {sig})", a.name));
    Ok(())
}

/// `put --detach`: run `put` in a process of its own (its own process group, so a terminal's
/// Ctrl-C does not reach it), pass on its line once the region is written, and leave it.
/// Nothing of it (or of servers it starts) keeps this command's output open, so a `$(...)`
/// or a `2>&1` pipe ends when this command does: its stderr is /dev/null and its stdout a
/// pipe to here, which says its one line, or its error.
fn detach(a: &PutArgs) -> Result<(), String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut child = Command::new(me)
        .args(["region", "put", "--background"])
        .arg(&a.name)
        .arg(&a.file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the holder: {e}"))?;
    let mut line = String::new();
    let out = child.stdout.take().expect("stdout was piped");
    let _ = BufReader::new(out).read_line(&mut line);
    if let Some(why) = line.strip_prefix("error: ") {
        let _ = child.wait();
        return Err(why.trim_end().to_string());
    }
    if line.trim().is_empty() {
        let status = child.wait().map_err(|e| e.to_string())?;
        return Err(format!("the process holding the region failed ({status})"));
    }
    print!("{line}");
    let pid = line.split_whitespace().nth(2).unwrap_or("?");
    say(&format!(
        "{} is held in the background by process {pid}; kill {pid} ends it",
        a.name
    ));
    Ok(())
}

fn get(a: &GetArgs) -> Result<(), String> {
    let timing = match Config::from_env() {
        Ok(c) => Timing::of(&c),
        Err(_) => Timing::of(&Config::default()),
    };
    let err = |e: &dyn std::error::Error| rmem_client::error_chain(e);
    let region = DirectRegion::open(&a.name, timing).map_err(|e| err(&e))?;
    let to_stdout = a.file.as_os_str() == "-";
    let mut out: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        let f = std::fs::File::create(&a.file).map_err(|e| format!("{}: {e}", a.file.display()))?;
        Box::new(f)
    };
    let size = region.size();
    let mut buf = vec![0u8; CHUNK_BYTES.min(size as usize)];
    let mut done = 0u64;
    while done < size {
        let want = buf.len().min((size - done) as usize);
        region.read(done, &mut buf[..want]).map_err(|e| err(&e))?;
        out.write_all(&buf[..want])
            .map_err(|e| format!("{}: {e}", a.file.display()))?;
        done += want as u64;
    }
    out.flush()
        .map_err(|e| format!("{}: {e}", a.file.display()))?;
    Ok(())
}

fn ls() -> Result<(), String> {
    let list = direct::registered().map_err(|e| rmem_client::error_chain(&e))?;
    println!("{:<24} {:>12} {:>10} {:>8}", "NAME", "BYTES", "PAGE", "PID");
    for r in list {
        println!(
            "{:<24} {:>12} {:>10} {:>8}",
            r.name, r.size, r.page_size, r.pid
        );
    }
    Ok(())
}
