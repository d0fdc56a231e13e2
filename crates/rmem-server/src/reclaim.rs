//! No loan while in debt (`rmem server --reclaim-below`): how much memory the server's node
//! has left, and how much the server may lend while its node's own programs need memory.
//!
//! Entry points: [`available`] reads what is left (the server's memory cgroup when it runs in
//! a limited one, else the node's `MemAvailable`, the smaller when both apply), and
//! [`Reclaim::step`] turns each reading into a [`Decision`]: whether the server is
//! *reclaiming* (takes no new pages; its beats say so and clients move its pages elsewhere)
//! and the most bytes it lends meanwhile. The CLI samples every [`SAMPLE_EVERY`] and applies
//! the decision ([`crate::ServerState::set_lend_limit`] and the beat's flag).
//!
//! What is read, exactly (docs/configuration.md repeats it):
//!
//! - `/proc/meminfo`: `MemAvailable` and `MemTotal`.
//! - `/proc/self/cgroup` for the server's memory cgroup (the v1 line whose controllers include
//!   `memory`, else the v2 line `0::PATH`), and `/proc/self/mountinfo` for where that
//!   hierarchy is mounted (the mount's root is taken off the path, as in a container).
//! - cgroup v1: `memory.limit_in_bytes` and `hierarchical_memory_limit` of `memory.stat` (the
//!   smaller: a parent's limit counts), `memory.usage_in_bytes`, and `total_inactive_file` of
//!   `memory.stat` (page cache the kernel reclaims first, so not counted as used).
//! - cgroup v2: at the cgroup and each ancestor up to the mount, `memory.max` (unless `max`),
//!   `memory.current` and `inactive_file` of `memory.stat`; the smallest room left.
//!
//! A cgroup counts as limited when its limit is below `MemTotal`. The cgroup is looked up at
//! every reading, so a server moved into one is followed.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the CLI reads the node's memory.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// The least hysteresis between starting and stopping a reclaim.
pub const MARGIN_MIN_BYTES: u64 = 4 << 20;

/// Where the figure of a reading came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `/proc/meminfo`'s `MemAvailable`.
    Node,
    /// A memory cgroup's limit less its use (the directory read).
    Cgroup(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Node => write!(f, "the node's MemAvailable"),
            Source::Cgroup(p) => write!(f, "memory cgroup {}", p.display()),
        }
    }
}

/// One reading of the memory left to the server's node (or cgroup).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Available {
    /// Bytes left before the node (or cgroup) would have to swap, reclaim or kill.
    pub bytes: u64,
    /// All the memory there is to it: the smallest cgroup limit, else `MemTotal`.
    pub total_bytes: u64,
    pub source: Source,
}

/// `--reclaim-below`: a size, or a percentage of [`Available::total_bytes`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Floor {
    Bytes(u64),
    Percent(f64),
}

impl Floor {
    /// `SIZE` (as `--capacity`) or `N%` (0 < N < 100).
    pub fn parse(s: &str) -> Result<Floor, String> {
        if let Some(p) = s.trim().strip_suffix('%') {
            let p: f64 = p
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a percentage"))?;
            if !(p > 0.0 && p < 100.0) {
                return Err(format!("{s:?}: a percentage between 0 and 100"));
            }
            return Ok(Floor::Percent(p));
        }
        let b = rmem_proto::size::parse_size(s).map_err(|e| e.to_string())?;
        if b == 0 {
            return Err("0 bytes: leave --reclaim-below out instead".into());
        }
        Ok(Floor::Bytes(b))
    }

    pub fn bytes(self, total_bytes: u64) -> u64 {
        match self {
            Floor::Bytes(b) => b,
            Floor::Percent(p) => (total_bytes as f64 * p / 100.0) as u64,
        }
    }
}

/// What a reading means for the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Below the floor, and not yet back above it by the margin: no new pages, and clients
    /// move pages off.
    pub reclaiming: bool,
    /// The most bytes to hold in all; new pages beyond it are refused (`u64::MAX`: no limit).
    pub lend_limit_bytes: u64,
}

/// The hysteresis between lending and reclaiming.
#[derive(Clone, Debug)]
pub struct Reclaim {
    pub floor: Floor,
    reclaiming: bool,
}

impl Reclaim {
    pub fn new(floor: Floor) -> Reclaim {
        Reclaim {
            floor,
            reclaiming: false,
        }
    }

    /// The band between starting a reclaim (below the floor) and stopping it (above floor +
    /// margin): an eighth of the floor, at least [`MARGIN_MIN_BYTES`].
    pub fn margin_bytes(floor_bytes: u64) -> u64 {
        (floor_bytes / 8).max(MARGIN_MIN_BYTES)
    }

    /// Take a reading, given the bytes the server holds now.
    ///
    /// Under the floor the server reclaims, and stops only once `floor + margin` is free
    /// again. While it lends, it lends no more than keeps half the margin free above the
    /// floor: pages cost the server a little more than their bytes (slabs, the index), and
    /// lending right up to the floor would start a reclaim by itself, then stop, then
    /// start again.
    pub fn step(&mut self, available_bytes: u64, total_bytes: u64, used_bytes: u64) -> Decision {
        let floor = self.floor.bytes(total_bytes);
        let margin = Self::margin_bytes(floor);
        if self.reclaiming {
            self.reclaiming = available_bytes < floor.saturating_add(margin);
        } else {
            self.reclaiming = available_bytes < floor;
        }
        let lend_limit_bytes = if self.reclaiming {
            0
        } else {
            used_bytes.saturating_add(available_bytes.saturating_sub(floor + margin / 2))
        };
        Decision {
            reclaiming: self.reclaiming,
            lend_limit_bytes,
        }
    }
}

fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|k| k.saturating_mul(1024))
}

/// `MemAvailable` and `MemTotal` of a `/proc/meminfo`, in bytes.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    Some((
        kib_field(text, "MemAvailable")?,
        kib_field(text, "MemTotal")?,
    ))
}

/// A `name value` line of a cgroup's `memory.stat`.
fn stat_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok())?
    })
}

/// Which memory cgroup hierarchy the server is in: (v2, path in the hierarchy).
pub fn parse_proc_cgroup(text: &str) -> Option<(bool, String)> {
    let mut v2 = None;
    for l in text.lines() {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some((false, path.to_string()));
        }
        if controllers.is_empty() {
            v2 = Some((true, path.to_string()));
        }
    }
    v2
}

/// Where the hierarchy is mounted, and the mount's root within it: for v1 the `cgroup` mount
/// with the `memory` option, for v2 the `cgroup2` mount.
pub fn parse_mountinfo(text: &str, v2: bool) -> Option<(PathBuf, String)> {
    text.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        let (fstype, _source, opts) = (right.next()?, right.next()?, right.next()?);
        let ours = if v2 {
            fstype == "cgroup2"
        } else {
            fstype == "cgroup" && opts.split(',').any(|o| o == "memory")
        };
        if !ours {
            return None;
        }
        Some((PathBuf::from(*left.get(4)?), left.get(3)?.to_string()))
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The server's memory cgroup directory, if it is in one that is mounted here.
fn cgroup_dir() -> Option<(bool, PathBuf, PathBuf)> {
    let (v2, path) = parse_proc_cgroup(&std::fs::read_to_string("/proc/self/cgroup").ok()?)?;
    let (mount, root) =
        parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").ok()?, v2)?;
    let rel = path.strip_prefix(root.as_str()).unwrap_or(&path);
    let dir = mount.join(rel.trim_start_matches('/'));
    dir.is_dir().then_some((v2, dir, mount))
}

/// Room left in a limited cgroup v1: (bytes, limit).
fn cgroup_v1(dir: &Path, mem_total: u64) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    let limit = read_u64(&dir.join("memory.limit_in_bytes"))?
        .min(stat_field(&stat, "hierarchical_memory_limit").unwrap_or(u64::MAX));
    if limit >= mem_total {
        return None;
    }
    let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
    let cache = stat_field(&stat, "total_inactive_file").unwrap_or(0);
    Some((limit.saturating_sub(usage.saturating_sub(cache)), limit))
}

/// Room left in a limited cgroup v2, the smallest over it and its ancestors: (bytes, limit).
fn cgroup_v2(dir: &Path, mount: &Path, mem_total: u64) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    let mut d = Some(dir);
    while let Some(here) = d.filter(|h| h.starts_with(mount)) {
        let max = std::fs::read_to_string(here.join("memory.max")).ok();
        if let Some(limit) = max.and_then(|m| m.trim().parse::<u64>().ok()) {
            if limit < mem_total {
                let current = read_u64(&here.join("memory.current")).unwrap_or(0);
                let cache = std::fs::read_to_string(here.join("memory.stat"))
                    .ok()
                    .and_then(|s| stat_field(&s, "inactive_file"))
                    .unwrap_or(0);
                let room = limit.saturating_sub(current.saturating_sub(cache));
                if best.is_none_or(|(b, _)| room < b) {
                    best = Some((room, limit));
                }
            }
        }
        d = here.parent();
    }
    best
}

/// Read the memory left to the server now (see the module's doc for exactly what is read).
pub fn available() -> Result<Available, String> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| format!("cannot read /proc/meminfo: {e}"))?;
    let (mem_available, mem_total) = parse_meminfo(&meminfo)
        .ok_or("/proc/meminfo has no MemAvailable or MemTotal (Linux 3.14 or later needed)")?;
    let node = Available {
        bytes: mem_available,
        total_bytes: mem_total,
        source: Source::Node,
    };
    let cgroup = cgroup_dir().and_then(|(v2, dir, mount)| {
        let room = if v2 {
            cgroup_v2(&dir, &mount, mem_total)
        } else {
            cgroup_v1(&dir, mem_total)
        };
        room.map(|(bytes, limit)| (bytes, limit, dir))
    });
    Ok(match cgroup {
        Some((bytes, limit, dir)) if bytes < mem_available => Available {
            bytes,
            total_bytes: limit,
            source: Source::Cgroup(dir),
        },
        Some((_, limit, _)) => Available {
            total_bytes: limit,
            ..node
        },
        None => node,
    })
}

/// The memory left (as [`available`] reads it) when `bytes` is more than it: what a budget or
/// a capacity that large is warned of. None when it fits, or when it cannot be read.
pub fn short_of(bytes: u64) -> Option<Available> {
    available().ok().filter(|a| bytes > a.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn reclaims_below_the_floor_and_lends_again_above_floor_plus_margin() {
        let mut r = Reclaim::new(Floor::Bytes(128 * MIB));
        // Plenty: lend up to half the margin (16 MiB) above the floor.
        let d = r.step(300 * MIB, 1024 * MIB, 10 * MIB);
        assert_eq!(
            d,
            Decision {
                reclaiming: false,
                lend_limit_bytes: 10 * MIB + 300 * MIB - 136 * MIB
            }
        );
        // Close to the floor: still lending, a little.
        assert!(!r.step(130 * MIB, 1024 * MIB, 10 * MIB).reclaiming);
        assert_eq!(
            r.step(130 * MIB, 1024 * MIB, 10 * MIB).lend_limit_bytes,
            10 * MIB
        );
        // Under it: reclaim, take nothing new.
        let d = r.step(127 * MIB, 1024 * MIB, 10 * MIB);
        assert!(d.reclaiming);
        assert_eq!(d.lend_limit_bytes, 0);
        // Back over the floor, inside the margin: still reclaiming (no flapping).
        assert!(r.step(140 * MIB, 1024 * MIB, 5 * MIB).reclaiming);
        // Over floor + margin: lending again.
        let d = r.step(144 * MIB, 1024 * MIB, 5 * MIB);
        assert!(!d.reclaiming);
        assert_eq!(d.lend_limit_bytes, 5 * MIB + 8 * MIB);
    }

    #[test]
    fn floors_parse_as_sizes_or_percentages() {
        assert_eq!(Floor::parse("512M"), Ok(Floor::Bytes(512 * MIB)));
        assert_eq!(Floor::parse("10%"), Ok(Floor::Percent(10.0)));
        assert_eq!(Floor::parse("10%").unwrap().bytes(1000 * MIB), 100 * MIB);
        for bad in ["0", "0%", "100%", "x%", "-1%", "lots"] {
            assert!(Floor::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Reclaim::margin_bytes(8 * MIB), MARGIN_MIN_BYTES);
        assert_eq!(Reclaim::margin_bytes(1024 * MIB), 128 * MIB);
    }

    #[test]
    fn proc_files_parse() {
        let meminfo = "MemTotal:       24683520 kB\nMemFree:  1 kB\nMemAvailable:   24228864 kB\n";
        assert_eq!(
            parse_meminfo(meminfo),
            Some((24228864 * 1024, 24683520 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        let v1 = "9:name=systemd:/\n4:memory:/process_api/b9\n0::/\n";
        assert_eq!(
            parse_proc_cgroup(v1),
            Some((false, "/process_api/b9".into()))
        );
        assert_eq!(
            parse_proc_cgroup("0::/user.slice/x.scope\n"),
            Some((true, "/user.slice/x.scope".into()))
        );
        let mounts = "\
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
33 25 0:29 /docker/ab /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory
40 25 0:36 / /sys/fs/cgroup/unified rw,relatime shared:19 - cgroup2 cgroup2 rw
";
        assert_eq!(
            parse_mountinfo(mounts, false),
            Some(("/sys/fs/cgroup/memory".into(), "/docker/ab".into()))
        );
        assert_eq!(
            parse_mountinfo(mounts, true),
            Some(("/sys/fs/cgroup/unified".into(), "/".into()))
        );
        let stat =
            "cache 5\nhierarchical_memory_limit 9223372036854771712\ntotal_inactive_file 77\n";
        assert_eq!(stat_field(stat, "total_inactive_file"), Some(77));
        assert_eq!(stat_field(stat, "inactive_file"), None);
    }

    #[test]
    fn this_node_can_be_read() {
        let a = available().unwrap();
        assert!(a.bytes > 0 && a.bytes <= a.total_bytes, "{a:?}");
    }
}
