//! `dlmcc`: the DLM compiler's name for `rmem cc`. Runs the `rmem` beside it as `rmem cc`.

use std::os::unix::process::CommandExt;

fn main() {
    let rmem = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("rmem")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| "rmem".into());
    let err = std::process::Command::new(&rmem)
        .arg("cc")
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!("dlmcc: cannot run {} cc: {err}", rmem.display());
    std::process::exit(127);
}
