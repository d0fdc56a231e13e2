//! `--lock` of `rmem server` and `rmem nbd`: the process's memory locked so that none of it is
//! ever swapped out (mlockall of what is mapped now and of everything mapped later).
//!
//! A memory server that is swapped out lends disk, not RAM; `rmem nbd` used as swap on its own
//! node must not be swapped out at all, or a fault on one of its own pages waits for the device
//! it serves. The limit is checked up front: under MCL_FUTURE a mapping beyond RLIMIT_MEMLOCK
//! fails to map, and the process would abort at some allocation instead of saying why.

/// Beyond what a process holds for others (a server's capacity, `rmem nbd`'s cache), what a
/// locked one may map for itself: threads' stacks, buffers, indexes.
pub const LOCK_MARGIN_BYTES: u64 = 256 << 20;

/// What RLIMIT_MEMLOCK must allow for [`lock_memory`] (CAP_IPC_LOCK lifts it either way).
pub enum Need<'a> {
    /// What the process holds for others (`held`, "the capacity", of `bytes`) plus
    /// [`LOCK_MARGIN_BYTES`]: a server, whose mappings beyond its pages are its own.
    Holding { held: &'a str, bytes: u64 },
    /// No limit at all: what the process maps follows its clients (`why`), and the limit
    /// counts mappings, reserved address space included, not resident pages.
    Unlimited { why: &'a str },
}

/// mlockall(MCL_CURRENT | MCL_FUTURE), refused where RLIMIT_MEMLOCK is below `need` and the
/// process lacks CAP_IPC_LOCK. `who` names the process in the message ("the server").
pub fn lock_memory(who: &str, need: Need<'_>) -> Result<(), String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Err(format!(
            "--lock: getrlimit(RLIMIT_MEMLOCK): {}",
            std::io::Error::last_os_error()
        ));
    }
    let how = format!(
        "raise it (`ulimit -l unlimited`, systemd's LimitMEMLOCK=infinity, \
         /etc/security/limits.conf), give {who} CAP_IPC_LOCK, or run without --lock"
    );
    let limited = lim.rlim_cur != libc::RLIM_INFINITY && !has_cap_ipc_lock();
    match need {
        Need::Holding { held, bytes } => {
            if limited && lim.rlim_cur < bytes.saturating_add(LOCK_MARGIN_BYTES) {
                return Err(format!(
                    "--lock: RLIMIT_MEMLOCK is {} bytes, less than {held} ({bytes} bytes) plus \
                     {LOCK_MARGIN_BYTES} for {who} itself: {how}",
                    lim.rlim_cur
                ));
            }
        }
        Need::Unlimited { why } => {
            if limited {
                return Err(format!(
                    "--lock: RLIMIT_MEMLOCK is {} bytes, and {who} needs it unlimited ({why}, \
                     and the limit counts reserved address space too): {how}",
                    lim.rlim_cur
                ));
            }
        }
    }
    // SAFETY: mlockall only changes how the kernel treats this process's mappings.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        return Err(format!(
            "--lock: mlockall: {} (RLIMIT_MEMLOCK {} bytes)",
            std::io::Error::last_os_error(),
            lim.rlim_cur
        ));
    }
    Ok(())
}

/// linux/capability.h
const CAP_IPC_LOCK: u32 = 14;

/// The effective capabilities include CAP_IPC_LOCK, which lifts RLIMIT_MEMLOCK.
fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}
