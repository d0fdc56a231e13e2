//! `rmem cc` (also `dlmcc`): the DLM compiler. Preprocesses each C file with `$CC -E` and
//! `dlm` defined as an attribute, translates the `dlm` declarations ([`translate`]), compiles
//! the translated file with `$CC`, and links with librmem (with an rpath unless told not to).
//!
//! Options it does not know go to the compiler unchanged, so it takes what `cc` takes.

pub mod translate;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The headers a DLM program may use without saying where they are (`dlm.h` is included
/// first in every translation unit, as the DLM compiler's programs call `dlm_alloc` without
/// including anything).
const DLM_H: &str = include_str!("../../../../include/dlm.h");
const RMEM_H: &str = include_str!("../../../../include/rmem.h");

/// Options of the C compiler whose value is the next argument.
const TAKES_VALUE: &[&str] = &[
    "-o",
    "-I",
    "-D",
    "-U",
    "-include",
    "-imacros",
    "-isystem",
    "-idirafter",
    "-iquote",
    "-iprefix",
    "-isysroot",
    "-x",
    "-L",
    "-l",
    "-MF",
    "-MT",
    "-MQ",
    "-Xlinker",
    "-Xpreprocessor",
    "-Xassembler",
    "-T",
    "-u",
    "-z",
    "-aux-info",
    "--param",
];

/// Options only the link step wants.
fn link_only(a: &str) -> bool {
    a.starts_with("-l")
        || a.starts_with("-L")
        || a.starts_with("-Wl,")
        || a == "-Xlinker"
        || a == "-T"
        || a == "-u"
        || a == "-z"
        || matches!(
            a,
            "-shared" | "-static" | "-pie" | "-no-pie" | "-rdynamic" | "-nostdlib" | "-s"
        )
}

/// Options that must not reach the steps rmem cc runs itself (it decides the language, the
/// output and the stopping point of each step).
fn dropped(a: &str) -> bool {
    a.starts_with("-M") || a.starts_with("-x") || matches!(a, "-c" | "-S" | "-E" | "-pipe")
}

#[derive(Debug, Default)]
struct Args {
    /// `-c`, `-S`, `-E` (`--emit-c`), or link.
    stop: Option<&'static str>,
    output: Option<PathBuf>,
    sources: Vec<PathBuf>,
    /// Other inputs (objects, libraries), in order, for the link.
    others: Vec<OsString>,
    /// Compiler options, each with its value if it takes one.
    options: Vec<Vec<String>>,
    rpath: bool,
    verbose: bool,
}

fn usage() -> &'static str {
    "usage: rmem cc [cc options] FILE.c ... [-o PROG]\n\
     \x20 translates every dlm declaration, compiles with $CC (default cc), links librmem.\n\
     \x20 -E, --emit-c     write the translated C (to -o FILE, or stdout)\n\
     \x20 -c, -S           stop after compiling (one object or assembly file per source)\n\
     \x20 --no-rpath       link librmem without an rpath (find it by LD_LIBRARY_PATH)\n\
     \x20 --rmem-verbose   print the commands run\n\
     \x20 anything else goes to the compiler; see docs/configuration.md (rmem cc)"
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        rpath: true,
        ..Args::default()
    };
    let mut i = 0;
    while i < argv.len() {
        let s = argv[i].as_str();
        i += 1;
        match s {
            "-h" | "--help" => return Err(usage().into()),
            "-E" | "--emit-c" => a.stop = Some("-E"),
            "-c" => a.stop = a.stop.or(Some("-c")),
            "-S" => a.stop = a.stop.filter(|&x| x == "-E").or(Some("-S")),
            "--no-rpath" => a.rpath = false,
            "--rmem-verbose" => a.verbose = true,
            "-o" => {
                let v = argv.get(i).ok_or("-o needs a file name")?;
                a.output = Some(PathBuf::from(v));
                i += 1;
            }
            _ if s.starts_with("-o") => a.output = Some(PathBuf::from(&s[2..])),
            _ if s.starts_with('-') && s.len() > 1 => {
                let mut opt = vec![s.to_string()];
                if TAKES_VALUE.contains(&s) {
                    let v = argv.get(i).ok_or_else(|| format!("{s} needs a value"))?;
                    opt.push(v.clone());
                    i += 1;
                }
                a.options.push(opt);
            }
            _ if s.ends_with(".c") => a.sources.push(PathBuf::from(s)),
            _ => a.others.push(s.into()),
        }
    }
    if a.sources.is_empty() && a.others.is_empty() {
        return Err(format!("no input files\n{}", usage()));
    }
    if a.stop.is_some() && a.output.is_some() && a.sources.len() > 1 {
        return Err("-o with -c, -S or -E and several source files".into());
    }
    Ok(a)
}

/// `rmem cc ARGS...`: the exit status.
pub fn run(argv: &[String]) -> i32 {
    let args = match parse(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rmem cc: {e}");
            return 2;
        }
    };
    match build(&args) {
        Ok(()) => 0,
        Err(Failure::Said(code)) => code,
        Err(Failure::Message(e)) => {
            eprintln!("rmem cc: {e}");
            1
        }
    }
}

enum Failure {
    /// A step failed and has said why (the compiler, or the translation's diagnostics).
    Said(i32),
    Message(String),
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Failure::Message(s)
    }
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn compiler() -> String {
    std::env::var("CC")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| "cc".into())
}

/// Run `cmd`; a failure has been reported by the command itself.
fn run_step(cmd: &mut Command, verbose: bool) -> Result<std::process::Output, Failure> {
    if verbose {
        eprintln!("rmem cc: {cmd:?}");
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        use std::io::Write;
        let _ = std::io::stderr().write_all(&out.stderr);
        return Err(Failure::Said(out.status.code().unwrap_or(1)));
    }
    let _ = std::io::Write::write_all(&mut std::io::stderr(), &out.stderr);
    Ok(out)
}

/// Short hash of a path, to make names of hoisted statics unique among translation units.
fn tag(path: &Path) -> String {
    let p = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in p.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", h as u32)
}

fn build(args: &Args) -> Result<(), Failure> {
    let cc = compiler();
    let tmp = TempDir(std::env::temp_dir().join(format!(
        "rmem-cc-{}-{}",
        std::process::id(),
        &crate::launch::fresh_token()[..8]
    )));
    std::fs::create_dir_all(&tmp.0)
        .map_err(|e| format!("cannot create {}: {e}", tmp.0.display()))?;
    for (name, text) in [("dlm.h", DLM_H), ("rmem.h", RMEM_H)] {
        std::fs::write(tmp.0.join(name), text).map_err(|e| format!("cannot write {name}: {e}"))?;
    }
    let compile_opts: Vec<&String> = args
        .options
        .iter()
        .filter(|o| !link_only(&o[0]) && !dropped(&o[0]))
        .flatten()
        .collect();
    let mut objects: Vec<OsString> = Vec::new();
    for (k, src) in args.sources.iter().enumerate() {
        // 1. Preprocess, with dlm an attribute tree-sitter parses and dlm.h included.
        let mut pre = Command::new(&cc);
        pre.arg("-E")
            .args(&compile_opts)
            .arg(format!("-D{}", translate::DLM_DEFINE))
            .arg("-I")
            .arg(&tmp.0)
            .args(["-include", "dlm.h"])
            .arg(src);
        let out = run_step(&mut pre, args.verbose)?;
        let text = String::from_utf8(out.stdout)
            .map_err(|_| format!("{}: the preprocessed source is not UTF-8", src.display()))?;
        // 2. Translate.
        let translated = match translate::translate(&text, &tag(src)) {
            Ok(t) => t.text,
            Err(diags) => {
                for d in diags {
                    eprintln!("{d}");
                }
                return Err(Failure::Said(1));
            }
        };
        let stem = src
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if args.stop == Some("-E") {
            match &args.output {
                Some(o) => std::fs::write(o, &translated)
                    .map_err(|e| format!("cannot write {}: {e}", o.display()))?,
                None => print!("{translated}"),
            }
            continue;
        }
        let i_file = tmp.0.join(format!("{k}-{stem}.i"));
        std::fs::write(&i_file, &translated)
            .map_err(|e| format!("cannot write {}: {e}", i_file.display()))?;
        // 3. Compile the translated file.
        let (flag, ext) = if args.stop == Some("-S") {
            ("-S", "s")
        } else {
            ("-c", "o")
        };
        let obj = match (&args.output, args.stop) {
            (Some(o), Some(_)) => o.clone(),
            (_, Some(_)) => PathBuf::from(format!("{stem}.{ext}")),
            (_, None) => tmp.0.join(format!("{k}-{stem}.o")),
        };
        let mut comp = Command::new(&cc);
        comp.args(&compile_opts)
            .arg(flag)
            .arg(&i_file)
            .arg("-o")
            .arg(&obj);
        run_step(&mut comp, args.verbose)?;
        objects.push(obj.into());
    }
    if args.stop.is_some() {
        return Ok(());
    }
    // 4. Link with librmem.
    let lib = crate::run_cmd::librmem_path()?;
    let libdir = lib.parent().expect("a file has a directory");
    let mut link = Command::new(&cc);
    let mut objs = objects.into_iter();
    // Sources' objects where the sources were, other inputs in their order.
    link.args(objs.by_ref());
    link.args(&args.others);
    for o in &args.options {
        if !dropped(&o[0]) {
            link.args(o);
        }
    }
    link.arg("-o")
        .arg(args.output.clone().unwrap_or_else(|| "a.out".into()));
    link.arg("-L").arg(libdir).arg("-lrmem");
    if args.rpath {
        link.arg(format!("-Wl,-rpath,{}", libdir.display()));
    }
    run_step(&mut link, args.verbose)?;
    Ok(())
}
