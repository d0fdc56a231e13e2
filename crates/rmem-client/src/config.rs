//! Runtime configuration, read from the environment that `rmem run` sets.
//!
//! Every variable and its default is listed in `docs/configuration.md`; keep the two in step.

use rmem_proto::size::{format_size, parse_size};
use std::time::Duration;

/// Where a page that has never been written back goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Fill the first server up to its capacity, then the next (DLM's hosts-file order).
    Priority,
    /// Page i goes to server i mod N, or the next one with room (JumboMem).
    Stripe,
    /// The server with the most free memory first (a pool's servers, as the manager and this
    /// client's own placements since say): new servers and emptier ones fill first.
    Free,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Priority => "priority",
            Placement::Stripe => "stripe",
            Placement::Free => "free",
        }
    }
}

/// What the runtime needs to start.
#[derive(Clone, Debug)]
pub struct Config {
    /// Memory servers, `host:port`, in priority order (with a manager: where to start; the
    /// manager's list wins).
    pub servers: Vec<String>,
    /// The pool manager (`host:port`) that names the servers and grants this client its
    /// share (`RMEM_MANAGER`); none: the servers above are all there is.
    pub manager: Option<String>,
    /// The most server memory this client asks to use, redundancy included
    /// (`RMEM_MAX_REMOTE`; `None`: no limit of its own). Only with a manager.
    pub max_remote_bytes: Option<u64>,
    /// Shared secret presented to every server.
    pub token: Vec<u8>,
    /// Most bytes of region pages resident locally (the local memory budget).
    pub local_bytes: u64,
    /// The DLM page size: the unit of paging.
    pub page_size: usize,
    /// Replacement policy name.
    pub policy: String,
    pub placement: Placement,
    /// Virtual address space reserved for the region.
    pub region_bytes: u64,
    /// Dirty victims whose write-back may be in flight at once.
    pub writeback_max: usize,
    /// How long the pager spins after its last event before sleeping in poll(2).
    pub spin: Duration,
    /// A request unanswered for this long means the server is lost.
    pub server_timeout: Duration,
    /// Idle connections are pinged this often.
    pub heartbeat: Duration,
    /// Connecting to a server gives up after this long.
    pub connect_timeout: Duration,
    /// After a connection drops, reconnecting goes on this long (at most the server's lease)
    /// before the server counts as lost; 0: never reconnect.
    pub reconnect: Duration,
    /// Where to write statistics as JSON at exit, if anywhere.
    pub stats_json: Option<String>,
    /// Open userfaultfd in `UFFD_USER_MODE_ONLY` mode even where kernel faults are allowed.
    pub uffd_user_mode_only: bool,
    /// Parameters of the replacement policies (`history`'s reflecting history ratio).
    pub policy_params: rmem_policy::PolicyParams,
    /// Trace mode: record the page reference string to this file (format in
    /// `rmem_policy::trace`); pages then live in process memory, not on servers.
    pub trace: Option<String>,
    /// Prefetch ahead of sequential and strided fault streams.
    pub prefetch: bool,
    /// A read fault away from every fault stream fetches its 4 KiB piece alone, where pages
    /// are kept unsealed on one server (`RMEM_SUB_PAGE`).
    pub sub_page: bool,
    /// Capacity is taken when pages are written back, not when memory is allocated (like
    /// Linux's overcommit); off (`RMEM_OVERCOMMIT=0`), an allocation beyond the servers'
    /// capacity fails.
    pub overcommit: bool,
    /// A drained server's pages are copied by the servers that take them (`Request::Pull`),
    /// not read and written again by this client (`RMEM_PULL`, default on).
    pub pull: bool,
    /// How pages are kept on the servers; `None`: chosen by [`Config::layout`] (auto).
    pub redundancy: Option<crate::store::codec::Redundancy>,
    /// Encrypt pages; `None`: whenever a server is not on loopback.
    pub encrypt: Option<bool>,
    /// Faults reach the pager by SIGBUS to the faulting thread instead of a userfaultfd
    /// message it sleeps on (`RMEM_FAULT_DELIVERY=signal`; see rmem-uffd's signal.rs).
    pub fault_by_signal: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            servers: Vec::new(),
            manager: None,
            max_remote_bytes: None,
            token: Vec::new(),
            local_bytes: 1 << 30,
            page_size: 64 << 10,
            policy: rmem_policy::DEFAULT_POLICY.into(),
            placement: Placement::Priority,
            region_bytes: 1 << 40,
            writeback_max: 64,
            spin: Duration::from_micros(200),
            server_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            reconnect: Duration::from_secs(5),
            stats_json: None,
            uffd_user_mode_only: false,
            policy_params: rmem_policy::PolicyParams::default(),
            trace: None,
            prefetch: true,
            sub_page: true,
            overcommit: true,
            pull: true,
            redundancy: None,
            encrypt: None,
            fault_by_signal: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var}={value:?}: {reason}")]
    Invalid {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("no memory servers: set RMEM_SERVERS=host:port[,host:port...] or RMEM_MANAGER=host:port (rmem run does this)")]
    NoServers,
    #[error("no token: set RMEM_TOKEN or RMEM_TOKEN_FILE (rmem run does this)")]
    NoToken,
    #[error("cannot read RMEM_TOKEN_FILE {path}")]
    TokenFile {
        path: String,
        source: std::io::Error,
    },
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn size_var(name: &'static str, default: u64) -> Result<u64, ConfigError> {
    match var(name) {
        None => Ok(default),
        Some(v) => parse_size(&v).map_err(|e| ConfigError::Invalid {
            var: name,
            value: v,
            reason: e.to_string(),
        }),
    }
}

fn ms_var(name: &'static str, default: Duration) -> Result<Duration, ConfigError> {
    match var(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|e| ConfigError::Invalid {
                var: name,
                value: v,
                reason: e.to_string(),
            }),
    }
}

fn ratio_var(name: &'static str, default: f64) -> Result<f64, ConfigError> {
    match var(name) {
        None => Ok(default),
        Some(v) => match v.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err(ConfigError::Invalid {
                var: name,
                value: v,
                reason: "expected a number from 0 to 1".into(),
            }),
        },
    }
}

/// `on`/`1` or `off`/`0`.
fn on_off_var(name: &'static str, default: bool) -> Result<bool, ConfigError> {
    match var(name).as_deref() {
        None => Ok(default),
        Some("on") | Some("1") => Ok(true),
        Some("off") | Some("0") => Ok(false),
        Some(other) => Err(ConfigError::Invalid {
            var: name,
            value: other.into(),
            reason: "expected on (1) or off (0)".into(),
        }),
    }
}

fn servers_from_env() -> Result<Vec<String>, ConfigError> {
    Ok(var("RMEM_SERVERS")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect())
}

/// The token `RMEM_TOKEN` or `RMEM_TOKEN_FILE` names (the first wins).
pub fn token_from_env() -> Result<Vec<u8>, ConfigError> {
    match (var("RMEM_TOKEN"), var("RMEM_TOKEN_FILE")) {
        (Some(t), _) => Ok(t.into_bytes()),
        (None, Some(path)) => Ok(std::fs::read_to_string(&path)
            .map_err(|source| ConfigError::TokenFile { path, source })?
            .trim_end()
            .as_bytes()
            .to_vec()),
        (None, None) => Err(ConfigError::NoToken),
    }
}

/// Memory servers a program started for itself (librmem does when none are configured), in
/// place of `RMEM_SERVERS` and the token.
#[derive(Clone, Debug)]
pub struct OwnServers {
    /// `host:port`, in priority order.
    pub servers: Vec<String>,
    pub token: Vec<u8>,
    /// The hosts file's local budget, the default when `RMEM_LOCAL` is not set.
    pub local_bytes: Option<u64>,
    /// The hosts file's `redundancy` and `encrypt` lines, the defaults when
    /// `RMEM_REDUNDANCY` and `RMEM_ENCRYPT` are not set (or `auto`).
    pub redundancy: Option<crate::store::codec::Redundancy>,
    pub encrypt: Option<bool>,
    /// A pool manager that names the servers (`servers` are then where to start).
    pub manager: Option<String>,
}

/// `RMEM_SERVERS` names at least one server, or `RMEM_MANAGER` a pool (else a program may
/// start its own).
pub fn servers_configured() -> bool {
    var("RMEM_SERVERS").is_some_and(|v| v.split(',').any(|s| !s.trim().is_empty()))
        || var("RMEM_MANAGER").is_some()
}

/// `RMEM_SPIN_US`, else the default: how long a thread waiting on servers polls without
/// sleeping after its last event (the pager; a region call).
pub fn spin_from_env() -> Result<Duration, ConfigError> {
    match var("RMEM_SPIN_US") {
        None => Ok(Config::default().spin),
        Some(v) => {
            v.trim()
                .parse()
                .map(Duration::from_micros)
                .map_err(|e: std::num::ParseIntError| ConfigError::Invalid {
                    var: "RMEM_SPIN_US",
                    value: v.clone(),
                    reason: e.to_string(),
                })
        }
    }
}

/// One step of a spin (the pager's, a region call's, `rmem nbd`'s loop) that found nothing
/// to do: give the CPU to any thread that can run on it, else go on at once. A spin exists to
/// save the wake-up of a sleeping thread when an idle CPU is there to burn; with every CPU
/// busy (the program's threads, the servers on this node) a spin that does not yield takes
/// their time (docs/benchmarks.md, "A spin that gives way").
pub fn spin_pause() {
    // SAFETY: sched_yield has no preconditions.
    unsafe { libc::sched_yield() };
}

impl Config {
    /// Read the configuration from `RMEM_*` environment variables over the defaults.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_env_with(None)
    }

    /// [`Config::from_env`], with the servers and token of `own` instead of `RMEM_SERVERS`
    /// and `RMEM_TOKEN` when given.
    pub fn from_env_with(own: Option<&OwnServers>) -> Result<Config, ConfigError> {
        let d = Config::default();
        let (servers, token) = match own {
            Some(o) => (o.servers.clone(), o.token.clone()),
            None => (servers_from_env()?, token_from_env()?),
        };
        let manager = match own {
            Some(o) => o.manager.clone(),
            None => var("RMEM_MANAGER"),
        };
        if servers.is_empty() && manager.is_none() {
            return Err(ConfigError::NoServers);
        }
        let max_remote_bytes = match var("RMEM_MAX_REMOTE").as_deref() {
            None | Some("none") => None,
            Some(_) => Some(size_var("RMEM_MAX_REMOTE", 0)?),
        };
        let local_default = own.and_then(|o| o.local_bytes).unwrap_or(d.local_bytes);
        let placement = match var("RMEM_PLACEMENT").as_deref() {
            None if manager.is_some() => Placement::Free,
            None | Some("priority") => Placement::Priority,
            Some("stripe") | Some("round-robin") => Placement::Stripe,
            Some("free") => Placement::Free,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    var: "RMEM_PLACEMENT",
                    value: other.into(),
                    reason: "expected priority, stripe or free".into(),
                })
            }
        };
        let writeback_max = match var("RMEM_WRITEBACK_MAX") {
            None => d.writeback_max,
            Some(v) => {
                v.trim()
                    .parse()
                    .map_err(|e: std::num::ParseIntError| ConfigError::Invalid {
                        var: "RMEM_WRITEBACK_MAX",
                        value: v,
                        reason: e.to_string(),
                    })?
            }
        };
        let spin = spin_from_env()?;
        let c = Config {
            servers,
            manager,
            max_remote_bytes,
            token,
            local_bytes: size_var("RMEM_LOCAL", local_default)?,
            page_size: size_var("RMEM_PAGE_SIZE", d.page_size as u64)? as usize,
            policy: var("RMEM_POLICY").unwrap_or(d.policy),
            placement,
            region_bytes: size_var("RMEM_REGION", d.region_bytes)?,
            writeback_max,
            spin,
            server_timeout: ms_var("RMEM_SERVER_TIMEOUT_MS", d.server_timeout)?,
            heartbeat: ms_var("RMEM_HEARTBEAT_MS", d.heartbeat)?,
            connect_timeout: ms_var("RMEM_CONNECT_TIMEOUT_MS", d.connect_timeout)?,
            reconnect: ms_var("RMEM_RECONNECT_MS", d.reconnect)?,
            stats_json: var("RMEM_STATS_JSON"),
            uffd_user_mode_only: var("RMEM_UFFD_USER_MODE_ONLY").is_some_and(|v| v.trim() != "0"),
            policy_params: rmem_policy::PolicyParams {
                history_ratio: ratio_var("RMEM_HISTORY_RATIO", d.policy_params.history_ratio)?,
                ..d.policy_params
            },
            trace: var("RMEM_TRACE"),
            fault_by_signal: match var("RMEM_FAULT_DELIVERY").as_deref() {
                None | Some("wait") => d.fault_by_signal,
                Some("signal") => true,
                Some(other) => {
                    return Err(ConfigError::Invalid {
                        var: "RMEM_FAULT_DELIVERY",
                        value: other.into(),
                        reason: "expected wait or signal".into(),
                    })
                }
            },
            prefetch: on_off_var("RMEM_PREFETCH", d.prefetch)?,
            sub_page: on_off_var("RMEM_SUB_PAGE", d.sub_page)?,
            overcommit: on_off_var("RMEM_OVERCOMMIT", d.overcommit)?,
            pull: on_off_var("RMEM_PULL", d.pull)?,
            redundancy: match var("RMEM_REDUNDANCY").as_deref() {
                None | Some("auto") => own.and_then(|o| o.redundancy),
                Some(v) => Some(crate::store::codec::Redundancy::parse(v).map_err(|reason| {
                    ConfigError::Invalid {
                        var: "RMEM_REDUNDANCY",
                        value: v.into(),
                        reason,
                    }
                })?),
            },
            encrypt: match var("RMEM_ENCRYPT").as_deref() {
                None | Some("auto") => own.and_then(|o| o.encrypt),
                Some(_) => Some(on_off_var("RMEM_ENCRYPT", false)?),
            },
        };
        c.validate()?;
        Ok(c)
    }

    /// The redundancy and encryption to use over `servers`: as configured, else the
    /// defaults. With three servers or more, each page survives losing one: K data fragments
    /// and one parity fragment, K = servers - 1 up to 4 (1.25x the memory at 5 servers and
    /// more; replicas would take 2x; docs/benchmarks.md), and of those the largest under
    /// which pages are sealed by the piece and read a piece at a time
    /// ([`codec::sealed_by_piece`]: at 64 KiB pages 2 on four servers, not 3): `ec:2+1` on
    /// four servers takes 1.5x the memory against `ec:3+1`'s 1.33x, and read and updated
    /// 2.2-3.0x faster at random (docs/benchmarks.md, "Pieces under a seal"). Pages are
    /// encrypted whenever a server is not on this host's loopback.
    ///
    /// [`codec::sealed_by_piece`]: crate::store::codec::sealed_by_piece
    pub fn layout(&self) -> (crate::store::codec::Redundancy, bool) {
        use crate::store::codec::Redundancy;
        let n = self.servers.len();
        let redundancy = self.redundancy.unwrap_or(if n >= 3 {
            let ec = |k: usize| Redundancy::Ec { k: k as u8, m: 1 };
            let most = (n - 1).min(4);
            (1..=most)
                .rev()
                .map(ec)
                .find(|&r| crate::store::codec::sealed_by_piece(self.page_size, r))
                .unwrap_or(ec(most))
        } else {
            Redundancy::None
        });
        let encrypt = self
            .encrypt
            .unwrap_or_else(|| !self.servers.iter().all(|s| on_loopback(s)));
        (redundancy, encrypt)
    }

    /// Check the limits every runtime relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ps = self.page_size as u64;
        let bad = |var: &'static str, value: String, reason: String| {
            Err(ConfigError::Invalid { var, value, reason })
        };
        if !ps.is_power_of_two()
            || ps < rmem_proto::PAGE_SIZE_MIN as u64
            || ps > rmem_proto::PAGE_SIZE_MAX as u64
        {
            return bad(
                "RMEM_PAGE_SIZE",
                format_size(ps),
                "must be a power of two from 4 KiB to 4 MiB".into(),
            );
        }
        if self.local_bytes < 4 * ps {
            return bad(
                "RMEM_LOCAL",
                format_size(self.local_bytes),
                format!("must hold at least 4 pages ({})", format_size(4 * ps)),
            );
        }
        if self.region_bytes < ps {
            return bad(
                "RMEM_REGION",
                format_size(self.region_bytes),
                "smaller than one page".into(),
            );
        }
        let r = self.policy_params.history_ratio;
        if !(0.0..=1.0).contains(&r) {
            return bad(
                "RMEM_HISTORY_RATIO",
                r.to_string(),
                "expected a number from 0 to 1".into(),
            );
        }
        if self.writeback_max == 0 {
            return bad(
                "RMEM_WRITEBACK_MAX",
                "0".into(),
                "must be at least 1".into(),
            );
        }
        Ok(())
    }

    /// Pages the local budget holds.
    pub fn local_pages(&self) -> u64 {
        self.local_bytes / self.page_size as u64
    }

    /// Staging slots (dirty victims on their way to a server) the budget sets aside.
    pub fn staging_slots(&self) -> u64 {
        staging_slots(self.local_pages(), self.writeback_max)
    }
}

/// Staging slots for a budget of `budget_pages`: a 32nd of the budget, but at least
/// [`STAGING_MIN`] (so a prefetch window can evict dirty pages while a fault's own victim is in
/// flight) unless that is more than a quarter of the budget; never more than `writeback_max`,
/// never fewer than one. They are part of the budget, so that a write-back in flight never
/// takes local memory beyond it; the rest holds the program's resident pages.
pub fn staging_slots(budget_pages: u64, writeback_max: usize) -> u64 {
    (budget_pages / STAGING_SHARE)
        .max(STAGING_MIN.min(budget_pages / 4))
        .min(writeback_max as u64)
        .max(1)
}

/// Staging slots a budget of at least four times this many pages always has.
pub const STAGING_MIN: u64 = 4;

/// The budget is at most this many times the staging slots it sets aside.
pub const STAGING_SHARE: u64 = 32;

/// The smallest budget, in pages, that leaves `resident_pages` for the program's pages once
/// the staging slots are set aside.
pub fn budget_for_resident(resident_pages: u64, writeback_max: usize) -> u64 {
    let mut b = resident_pages + 1;
    while b - staging_slots(b, writeback_max) < resident_pages {
        b += 1;
    }
    b
}

/// Whether `server` (`host:port`) names this host's loopback.
fn on_loopback(server: &str) -> bool {
    use std::net::ToSocketAddrs;
    match server.to_socket_addrs() {
        Ok(mut a) => a.all(|a| a.ip().is_loopback()),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default layout: none under three servers, else ec:K+1 with K = servers - 1 up to
    /// 4, of those the largest dividing the page's pieces.
    #[test]
    fn the_default_layout_survives_a_loss_and_reads_pieces() {
        use crate::store::codec::Redundancy;
        let layout = |servers: usize, page_size: usize| {
            Config {
                servers: (0..servers)
                    .map(|i| format!("127.0.0.1:{}", 7000 + i))
                    .collect(),
                page_size,
                ..Config::default()
            }
            .layout()
        };
        let ec = |k| (Redundancy::Ec { k, m: 1 }, false);
        assert_eq!(layout(2, 65536), (Redundancy::None, false));
        assert_eq!(layout(3, 65536), ec(2));
        assert_eq!(layout(4, 65536), ec(2), "3 does not divide 16 pieces");
        assert_eq!(layout(5, 65536), ec(4));
        assert_eq!(layout(9, 65536), ec(4));
        assert_eq!(layout(4, 4096), ec(3), "one piece: sealed whole anyway");
        assert_eq!(layout(4, 1 << 20), ec(3), "256 pieces: sealed whole");
        assert_eq!(layout(4, 16384), ec(2));
    }

    #[test]
    fn staging_slots_stay_a_small_part_of_the_budget() {
        assert_eq!(staging_slots(1, 64), 1);
        assert_eq!(staging_slots(8, 64), 2);
        assert_eq!(staging_slots(32, 64), 4);
        assert_eq!(staging_slots(256, 64), 8);
        assert_eq!(staging_slots(1 << 20, 64), 64);
        assert_eq!(staging_slots(1 << 20, 0), 1);
        for b in 1..5000 {
            let s = staging_slots(b, 64);
            assert!(
                (1..=64).contains(&s) && (s == 1 || s <= b / 4),
                "budget {b}: {s}"
            );
        }
    }

    #[test]
    fn budget_for_resident_is_the_smallest_that_fits() {
        for r in 1..3000 {
            let b = budget_for_resident(r, 64);
            assert!(b - staging_slots(b, 64) >= r);
            assert!(
                b - 1 - staging_slots(b - 1, 64) < r,
                "resident {r}: {b} not smallest"
            );
        }
    }
}
