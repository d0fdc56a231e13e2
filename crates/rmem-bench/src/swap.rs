//! Kernel swap for the comparison runs: a cgroup v1 memory group that limits a workload's
//! resident memory, a swap file, and zram with lz4. Needs root.
//!
//! [`SwapRig`] owns everything it set up and undoes it on drop, in reverse order, also when
//! the benchmark fails or is interrupted: tasks left in the group are killed, swap is turned off,
//! zram is reset, the swap file is removed and the group is removed. Only one of the two
//! swap devices is on at a time. Existing swap devices are left alone (and reported).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const CGROUP_V1_MEMORY: &str = "/sys/fs/cgroup/memory";
const ZRAM: &str = "/sys/block/zram0";
const ZRAM_DEV: &str = "/dev/zram0";
/// Ours is used before any swap that was already on.
const SWAP_PRIORITY: &str = "32767";

/// Why kernel swap cannot be measured here, if it cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("kernel swap runs need root (they set up swap and a cgroup)".into());
    }
    if !Path::new(CGROUP_V1_MEMORY)
        .join("memory.limit_in_bytes")
        .exists()
    {
        return Some(format!(
            "no cgroup v1 memory controller at {CGROUP_V1_MEMORY}"
        ));
    }
    None
}

/// Swap devices that were on before the benchmark started (`/proc/swaps`), not ours.
pub fn existing_swaps() -> Vec<String> {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value)
        .map_err(|e| format!("cannot write {value:?} to {}: {e}", path.display()))
}

fn tool(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Device {
    File(PathBuf),
    Zram,
}

/// The cgroup and at most one swap device, set up by the benchmark; restored on drop.
pub struct SwapRig {
    cgroup: PathBuf,
    swap_dir: PathBuf,
    device: Option<Device>,
}

impl SwapRig {
    /// Create the memory cgroup `rmem-bench-PID`.
    pub fn new(swap_dir: &Path) -> Result<SwapRig, String> {
        if let Some(why) = unavailable() {
            return Err(why);
        }
        let cgroup = Path::new(CGROUP_V1_MEMORY).join(format!("rmem-bench-{}", std::process::id()));
        std::fs::create_dir(&cgroup)
            .map_err(|e| format!("cannot create cgroup {}: {e}", cgroup.display()))?;
        Ok(SwapRig {
            cgroup,
            swap_dir: swap_dir.to_path_buf(),
            device: None,
        })
    }

    /// The group's `cgroup.procs`, opened for a child to join by writing "0" (itself).
    pub fn procs(&self) -> Result<File, String> {
        let p = self.cgroup.join("cgroup.procs");
        File::options()
            .write(true)
            .open(&p)
            .map_err(|e| format!("cannot open {}: {e}", p.display()))
    }

    /// Limit the group's memory (RAM; swap is not limited), or lift the limit with None.
    pub fn set_limit(&self, bytes: Option<u64>) -> Result<(), String> {
        let v = bytes.map_or("-1".to_string(), |b| b.to_string());
        write(&self.cgroup.join("memory.limit_in_bytes"), &v)
    }

    /// Peak memory charged to the group since the last reset, and reset it.
    pub fn take_max_usage(&self) -> Result<u64, String> {
        let p = self.cgroup.join("memory.max_usage_in_bytes");
        let v = std::fs::read_to_string(&p)
            .map_err(|e| format!("cannot read {}: {e}", p.display()))?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", p.display()))?;
        write(&p, "0")?;
        Ok(v)
    }

    /// Turn on a swap file of `bytes` (written in full: swap files must have no holes).
    pub fn swap_file_on(&mut self, bytes: u64) -> Result<(), String> {
        self.swap_off()?;
        let path = self
            .swap_dir
            .join(format!("rmem-bench-{}.swap", std::process::id()));
        self.device = Some(Device::File(path.clone()));
        write_zeros(&path, bytes)?;
        let p = path.to_str().ok_or("swap file path is not UTF-8")?;
        tool("mkswap", &[p])?;
        tool("swapon", &["-p", SWAP_PRIORITY, p])
    }

    /// Turn on zram0 with lz4, `bytes` of uncompressed capacity.
    pub fn zram_on(&mut self, bytes: u64) -> Result<(), String> {
        self.swap_off()?;
        let zram = Path::new(ZRAM);
        if !zram.exists() {
            return Err(format!(
                "{ZRAM} does not exist (is the zram module loaded?)"
            ));
        }
        let size = std::fs::read_to_string(zram.join("disksize")).unwrap_or_default();
        if size.trim() != "0" {
            return Err("zram0 is already in use (its disksize is set); left alone".into());
        }
        self.device = Some(Device::Zram);
        write(&zram.join("comp_algorithm"), "lz4")?;
        write(&zram.join("disksize"), &bytes.to_string())?;
        tool("mkswap", &[ZRAM_DEV])?;
        tool("swapon", &["-p", SWAP_PRIORITY, ZRAM_DEV])
    }

    /// Turn off our swap device, if any, and undo it. Safe to repeat.
    pub fn swap_off(&mut self) -> Result<(), String> {
        let Some(dev) = self.device.take() else {
            return Ok(());
        };
        let name = match &dev {
            Device::File(p) => p.display().to_string(),
            Device::Zram => ZRAM_DEV.to_string(),
        };
        let mut errors = Vec::new();
        if existing_swaps().contains(&name) {
            if let Err(e) = tool("swapoff", &[&name]) {
                errors.push(e);
            }
        }
        match dev {
            Device::File(p) => {
                if let Err(e) = std::fs::remove_file(&p) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        errors.push(format!("cannot remove {}: {e}", p.display()));
                    }
                }
            }
            Device::Zram => {
                if let Err(e) = write(&Path::new(ZRAM).join("reset"), "1") {
                    errors.push(e);
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// Kill whatever is left in the group (a run that hung in reclaim) and wait for it.
    fn empty_group(&self) {
        let procs = self.cgroup.join("cgroup.procs");
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            let pids: Vec<i32> = std::fs::read_to_string(&procs)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                // SAFETY: kill has no memory-safety preconditions; these pids are in our group.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for SwapRig {
    fn drop(&mut self) {
        self.empty_group();
        if let Err(e) = self.swap_off() {
            eprintln!("rmem bench: restoring swap: {e}");
        }
        if let Err(e) = std::fs::remove_dir(&self.cgroup) {
            eprintln!(
                "rmem bench: cannot remove cgroup {}: {e}",
                self.cgroup.display()
            );
        }
    }
}

fn write_zeros(path: &Path, bytes: u64) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot create swap file {}: {e}", path.display()))?;
    let chunk = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])
            .map_err(|e| format!("cannot write swap file {}: {e}", path.display()))?;
        left -= n as u64;
    }
    f.sync_all()
        .map_err(|e| format!("cannot sync swap file {}: {e}", path.display()))
}
