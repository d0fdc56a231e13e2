//! DLM hosts files (`rmem run --hostfile FILE`): the local host and its memory budget, then
//! the memory servers and the memory each lends, in priority order. [`HostFile::load`] reads one.
//!
//! ```text
//! # DLM hosts file
//! calhost        4G    # the local host and the local memory budget
//! memhost1       16G   # a memory server and the memory it lends
//! memhost2:7000  16G   # a fixed port (else the server picks one and reports it)
//! redundancy     ec:2+1  # optional settings, anywhere: how pages are kept
//! encrypt        on      # on, off or auto (the command line's options win)
//! ```

use rmem_proto::size::parse_size;
use std::fmt;
use std::path::{Path, PathBuf};

/// One line of a hosts file: a host, an optional port and a size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLine {
    pub host: String,
    /// `None` when the line names no port.
    pub port: Option<u16>,
    pub bytes: u64,
    /// 1-based line number in the file, for error messages.
    pub line: usize,
}

impl HostLine {
    /// `host:port` as a client connects to it (IPv6 literals in brackets).
    pub fn addr(&self, port: u16) -> String {
        if self.host.contains(':') {
            format!("[{}]:{port}", self.host)
        } else {
            format!("{}:{port}", self.host)
        }
    }
}

/// A parsed hosts file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFile {
    pub path: PathBuf,
    /// The first line: this host and the local memory budget.
    pub local: HostLine,
    /// The memory servers, in priority order; never empty.
    pub servers: Vec<HostLine>,
    /// A `redundancy SPEC` line: how pages are kept (`rmem run --redundancy`), checked.
    pub redundancy: Option<String>,
    /// An `encrypt on|off|auto` line (`--encrypt`, `--no-encrypt`); `None` for auto.
    pub encrypt: Option<bool>,
}

/// What is wrong with a hosts file, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFileError {
    pub path: PathBuf,
    /// 1-based line, or 0 for the file as a whole.
    pub line: usize,
    pub what: String,
}

impl fmt::Display for HostFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            0 => write!(f, "hosts file {}: {}", self.path.display(), self.what),
            n => write!(f, "hosts file {}:{n}: {}", self.path.display(), self.what),
        }
    }
}

impl HostFile {
    /// Read and parse `path`.
    pub fn load(path: &Path) -> Result<HostFile, HostFileError> {
        let text = std::fs::read_to_string(path).map_err(|e| HostFileError {
            path: path.to_path_buf(),
            line: 0,
            what: format!("cannot read it: {e}"),
        })?;
        HostFile::parse(&text, path)
    }

    /// Parse the text of a hosts file; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<HostFile, HostFileError> {
        let err = |line: usize, what: String| HostFileError {
            path: path.to_path_buf(),
            line,
            what,
        };
        let mut lines = Vec::new();
        let (mut redundancy, mut encrypt) = (None, None);
        for (i, raw) in text.lines().enumerate() {
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let fields: Vec<&str> = content.split_whitespace().collect();
            match fields.as_slice() {
                ["redundancy", spec] => {
                    let r = rmem_client::store::codec::Redundancy::parse(spec)
                        .map_err(|e| err(i + 1, format!("redundancy {e}")))?;
                    if redundancy.replace(r.to_string()).is_some() {
                        return Err(err(i + 1, "a second redundancy line".into()));
                    }
                }
                ["encrypt", v] => {
                    let on = match *v {
                        "on" | "yes" | "1" => Some(true),
                        "off" | "no" | "0" => Some(false),
                        "auto" => None,
                        other => {
                            return Err(err(
                                i + 1,
                                format!("encrypt {other:?}: expected on, off or auto"),
                            ))
                        }
                    };
                    encrypt = on;
                }
                _ => lines.push(parse_line(content, i + 1).map_err(|what| err(i + 1, what))?),
            }
        }
        let mut it = lines.into_iter();
        let local = it.next().ok_or_else(|| {
            err(
                0,
                "no hosts: expected `LOCALHOST SIZE`, then `HOST[:PORT] SIZE` lines".into(),
            )
        })?;
        if local.port.is_some() {
            return Err(err(
                local.line,
                "the first line is the local host and its memory budget; it takes no port".into(),
            ));
        }
        let servers: Vec<HostLine> = it.collect();
        // A server named twice would be connected to twice in one session, each link fencing
        // the other: a wrong file, said here. (A host without a port may run several.)
        for (i, a) in servers.iter().enumerate() {
            if let Some(b) = servers[..i]
                .iter()
                .find(|b| a.port.is_some() && b.host == a.host && b.port == a.port)
            {
                return Err(err(
                    a.line,
                    format!(
                        "{} is listed twice (line {} too): each server once",
                        a.addr(a.port.expect("checked")),
                        b.line
                    ),
                ));
            }
        }
        if servers.is_empty() {
            return Err(err(
                0,
                "no memory servers: after the local host, list `HOST[:PORT] SIZE` lines".into(),
            ));
        }
        Ok(HostFile {
            path: path.to_path_buf(),
            local,
            servers,
            redundancy,
            encrypt,
        })
    }
}

/// `HOST[:PORT] SIZE`, comment already stripped.
fn parse_line(content: &str, line: usize) -> Result<HostLine, String> {
    let fields: Vec<&str> = content.split_whitespace().collect();
    let (spec, size) = match fields.as_slice() {
        [spec, size] => (*spec, *size),
        [spec] => {
            return Err(format!(
                "{spec:?} has no memory size (expected `HOST[:PORT] SIZE`)"
            ))
        }
        _ => {
            return Err(format!(
                "{content:?}: expected `HOST[:PORT] SIZE`, got {} fields",
                fields.len()
            ))
        }
    };
    let (host, port) = split_host_port(spec)?;
    let bytes = parse_size(size).map_err(|e| format!("memory size: {e}"))?;
    if bytes == 0 {
        return Err(format!("{host}: the memory size is zero"));
    }
    Ok(HostLine {
        host,
        port,
        bytes,
        line,
    })
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`, or a bare IPv6 literal (no port).
fn split_host_port(spec: &str) -> Result<(String, Option<u16>), String> {
    let (host, port) = if let Some(rest) = spec.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{spec:?}: unclosed '['"))?;
        match after {
            "" => (h, None),
            a => (
                h,
                Some(
                    a.strip_prefix(':')
                        .ok_or_else(|| format!("{spec:?}: expected ':PORT' after ']'"))?,
                ),
            ),
        }
    } else if spec.matches(':').count() == 1 {
        let (h, p) = spec.split_once(':').expect("one colon");
        (h, Some(p))
    } else {
        (spec, None)
    };
    // Host names travel to ssh and srun as arguments: keep them to what names and addresses use.
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '%');
    if host.is_empty() || host.starts_with('-') || !host.chars().all(valid) {
        return Err(format!("{host:?} is not a host name or address"));
    }
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .map_err(|_| format!("{spec:?}: {p:?} is not a port (0 to 65535)"))
        })
        .transpose()?;
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HostFile, HostFileError> {
        HostFile::parse(text, Path::new("hosts"))
    }

    #[test]
    fn settings_lines_are_read_checked_and_kept_apart_from_hosts() {
        let h = parse("me 1G\nredundancy ec:2+1 # keep pages\nm1 1G\nencrypt on\nm2 1G\nm3 1G\n")
            .unwrap();
        assert_eq!(h.servers.len(), 3);
        assert_eq!(h.redundancy.as_deref(), Some("ec:2+1"));
        assert_eq!(h.encrypt, Some(true));
        let h = parse("me 1G\nm1 1G\nencrypt auto\n").unwrap();
        assert_eq!((h.redundancy, h.encrypt), (None, None));
        let e = parse("me 1G\nm1 1G\nredundancy ec:0+1\n").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        let e = parse("me 1G\nm1 1G\nencrypt maybe\n").unwrap_err();
        assert!(e.to_string().contains("on, off or auto"), "{e}");
        let e = parse("me 1G\nredundancy none\nredundancy replicas:2\nm1 1G\n").unwrap_err();
        assert!(e.to_string().contains("second"), "{e}");
    }

    #[test]
    fn a_server_listed_twice_is_refused_naming_both_lines() {
        let e = parse("me 1G\nn1:7000 1G\nn2:7000 1G\nn1:7000 2G\n").unwrap_err();
        assert_eq!(e.line, 4);
        assert!(e.what.contains("n1:7000 is listed twice (line 2"), "{e}");
        // The same host on other ports, or without a port (several servers launched there).
        assert!(parse("me 1G\nn1:7000 1G\nn1:7001 1G\n").is_ok());
        assert!(parse("me 1G\nn1 1G\nn1 1G\n").is_ok());
    }

    #[test]
    fn parses_dlm_format_with_comments_ports_and_suffixes() {
        let h = parse(
            "# the DLM hosts file\n\
             \n\
             calhost 4G   # local budget\n\
             memhost1 16G\n\
             \tmemhost2:7000\t512M\n\
             10.0.0.9:0 1T\n\
             [fe80::1%eth0]:7070 64K\n\
             ::1 1G\n",
        )
        .unwrap();
        assert_eq!(h.local.host, "calhost");
        assert_eq!(h.local.bytes, 4 << 30);
        assert_eq!(h.local.line, 3);
        let s: Vec<(&str, Option<u16>, u64, usize)> = h
            .servers
            .iter()
            .map(|l| (l.host.as_str(), l.port, l.bytes, l.line))
            .collect();
        assert_eq!(
            s,
            [
                ("memhost1", None, 16 << 30, 4),
                ("memhost2", Some(7000), 512 << 20, 5),
                ("10.0.0.9", Some(0), 1 << 40, 6),
                ("fe80::1%eth0", Some(7070), 64 << 10, 7),
                ("::1", None, 1 << 30, 8),
            ]
        );
        assert_eq!(h.servers[1].addr(7000), "memhost2:7000");
        assert_eq!(h.servers[4].addr(9), "[::1]:9");
    }

    #[test]
    fn errors_name_the_file_and_line() {
        for (text, line, needle) in [
            ("calhost 4G\nmem1 lots\n", 2, "memory size"),
            ("calhost 4G\nmem1\n", 2, "no memory size"),
            ("calhost 4G\nmem1 1G extra\n", 2, "3 fields"),
            ("calhost 4G\nmem1:99999 1G\n", 2, "not a port"),
            ("calhost 4G\nmem1:x 1G\n", 2, "not a port"),
            ("calhost 4G\n# c\n-oProxyCommand=x 1G\n", 3, "not a host"),
            ("calhost 4G\nme;m 1G\n", 2, "not a host"),
            ("calhost 4G\nmem1 0\n", 2, "zero"),
            ("calhost:7000 4G\nmem1 1G\n", 1, "takes no port"),
            ("calhost 4G\n[::1 1G\n", 2, "unclosed"),
            ("# only a comment\n", 0, "no hosts"),
            ("calhost 4G # nothing else\n", 0, "no memory servers"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.what.contains(needle), "{text:?}: {e}");
            let shown = e.to_string();
            if line > 0 {
                assert!(
                    shown.starts_with(&format!("hosts file hosts:{line}: ")),
                    "{shown}"
                );
            }
        }
    }

    #[test]
    fn load_names_an_unreadable_file() {
        let e = HostFile::load(Path::new("/nonexistent/rmem-hosts")).unwrap_err();
        assert!(
            e.to_string()
                .contains("/nonexistent/rmem-hosts: cannot read"),
            "{e}"
        );
    }
}
