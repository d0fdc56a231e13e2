//! The pool manager's other side: what clients and memory servers say to `rmem manager`
//! (`rmem_proto::pool`), over the same challenge and response as a memory server's
//! ([`handshake_as`]).
//!
//! Entry points: [`ManagerConn::connect`] and [`ManagerConn::ask`] for one question (`rmem pool
//! status`), [`spawn_beats`] for a process that beats for as long as it lives (a memory server
//! in a pool), and [`PoolLink`] for a client: its first beat answered before it starts (so a
//! wrong token or an unreachable manager is a clear error at once), then a thread that beats,
//! reports what the client uses where, and keeps the latest [`View`] (live servers by free
//! memory, the client's grant) for the cluster layer to follow
//! (`RemoteStore`'s `follow_pool`). A manager lost later is retried every heartbeat and
//! never stops the program: it only stops learning of new servers meanwhile.

use crate::store::remote::{dial, handshake_as, read_frame};
use crate::store::StoreError;
use rmem_proto::pool::{self, ClientBeat, PoolRequest, PoolResponse, ServerOffer, ServerUse};
use rmem_proto::SessionId;
use std::io::Write;
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long connecting to the manager and one answer may take.
pub const MANAGER_TIMEOUT: Duration = Duration::from_secs(5);

/// The manager's failure, in the manager's words (the link layer names "memory servers").
fn as_manager(manager: &str, e: StoreError) -> StoreError {
    let detail = match e {
        StoreError::Connect { source, .. } => format!("cannot connect: {source}"),
        StoreError::Refused { message, .. } => format!("refused the connection: {message}"),
        StoreError::Impostor { .. } => {
            "does not know the token: its proof of it did not match (is it the manager you \
             meant?)"
                .into()
        }
        StoreError::Closed { detail, .. } => format!("closed the connection{detail}"),
        StoreError::Timeout { secs, detail, .. } => {
            format!("did not answer for {secs:.1} s{detail}")
        }
        StoreError::Protocol { what, .. } => format!("sent a bad frame: {what}"),
        other => crate::error_chain(&other),
    };
    StoreError::Manager {
        manager: manager.into(),
        detail,
    }
}

/// An authenticated connection to the manager.
pub struct ManagerConn {
    sock: TcpStream,
    manager: String,
    next_tag: u64,
    /// The protocol spoken: [`pool::VERSION`], or an older one of [`pool::VERSIONS`] with a
    /// manager that knows no newer (beats then go without what came later).
    version: u16,
}

impl ManagerConn {
    /// Connect and authenticate, all within `timeout`. A manager that refuses a version as
    /// one it does not speak is asked again in the next older one of [`pool::VERSIONS`].
    pub fn connect(manager: &str, token: &[u8], timeout: Duration) -> Result<Self, StoreError> {
        let deadline = Instant::now() + timeout;
        let mut older = pool::VERSIONS.iter().copied();
        let mut version = older.next().expect("a version");
        loop {
            let mut sock = dial(manager, timeout).map_err(|e| as_manager(manager, e))?;
            match handshake_as(&mut sock, manager, token, version, 0, deadline) {
                Ok(_) => {
                    return Ok(ManagerConn {
                        sock,
                        manager: manager.into(),
                        next_tag: 1,
                        version,
                    })
                }
                Err(StoreError::Refused { ref message, .. })
                    if message.starts_with(&rmem_proto::ErrorCode::VersionMismatch.to_string())
                        && older.len() > 0 =>
                {
                    version = older.next().expect("checked");
                }
                Err(e) => return Err(as_manager(manager, e)),
            }
        }
    }

    /// This host's address on the connection: the one the manager (and, most likely, the
    /// pool's clients) reach it at.
    pub fn local_ip(&self) -> Option<IpAddr> {
        self.sock.local_addr().ok().map(|a| a.ip())
    }

    /// Send `req`, wait up to `timeout` for the answer. An `Error` answer is an error.
    pub fn ask(
        &mut self,
        req: &PoolRequest,
        timeout: Duration,
    ) -> Result<PoolResponse, StoreError> {
        let m = self.manager.clone();
        let tag = self.next_tag;
        self.next_tag += 1;
        let mut frame = Vec::new();
        req.encode_for(self.version, tag, &mut frame);
        self.sock
            .set_write_timeout(Some(timeout))
            .and_then(|()| self.sock.write_all(&frame))
            .map_err(|e| {
                as_manager(
                    &m,
                    StoreError::Closed {
                        server: m.clone(),
                        detail: format!(" ({e})"),
                    },
                )
            })?;
        let deadline = Instant::now() + timeout;
        let max = rmem_proto::FRAME_LEN_MAX_DEFAULT;
        let h = read_frame(&mut self.sock, &m, "answer", &mut frame, max, deadline)
            .map_err(|e| as_manager(&m, e))?;
        let bad = |what: String| StoreError::Manager {
            manager: m.clone(),
            detail: format!("sent a bad frame: {what}"),
        };
        if h.tag != tag {
            return Err(bad(format!("an answer tagged {} to request {tag}", h.tag)));
        }
        match PoolResponse::decode_for(self.version, h.op, &frame)
            .map_err(|e| bad(e.to_string()))?
        {
            PoolResponse::Error { code, message } => Err(StoreError::Manager {
                manager: m,
                detail: format!("answered {code}: {message}"),
            }),
            r => Ok(r),
        }
    }
}

/// The heartbeat an answer asks for, bounded to something sane.
fn heartbeat_of(r: &PoolResponse) -> Option<Duration> {
    match r {
        PoolResponse::ServerAck { heartbeat_ms, .. }
        | PoolResponse::ClientAck { heartbeat_ms, .. } => Some(Duration::from_millis(
            u64::from(*heartbeat_ms).clamp(10, 60_000),
        )),
        _ => None,
    }
}

/// Beat to `manager` until `stop` is set: each beat made by `beat` (given this host's address
/// toward the manager), each answer given to `acked`. A failure is said through `say` when the
/// manager is lost and again when it is back; the connection is made again every heartbeat.
#[allow(clippy::too_many_arguments)]
fn beat_loop(
    mut conn: Option<ManagerConn>,
    manager: &str,
    token: &[u8],
    mut heartbeat: Duration,
    stop: &AtomicBool,
    beat: &mut dyn FnMut(Option<IpAddr>) -> PoolRequest,
    acked: &mut dyn FnMut(PoolResponse),
    say: &dyn Fn(&str),
) {
    let mut lost = false;
    while !stop.load(Ordering::Relaxed) {
        let timeout = heartbeat.clamp(Duration::from_millis(200), MANAGER_TIMEOUT);
        let answer = match conn.take() {
            Some(c) => Ok(c),
            None => ManagerConn::connect(manager, token, timeout),
        }
        .and_then(|mut c| {
            let r = c.ask(&beat(c.local_ip()), timeout)?;
            conn = Some(c);
            Ok(r)
        });
        match answer {
            Ok(r) => {
                if lost {
                    say(&format!("pool manager {manager} is back"));
                    lost = false;
                }
                heartbeat = heartbeat_of(&r).unwrap_or(heartbeat);
                acked(r);
            }
            Err(e) if !lost => {
                say(&format!(
                    "{}; going on without it, retrying every {:.1} s",
                    crate::error_chain(&e),
                    heartbeat.as_secs_f64()
                ));
                lost = true;
            }
            Err(_) => {}
        }
        let until = Instant::now() + heartbeat;
        while !stop.load(Ordering::Relaxed) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20).min(heartbeat));
        }
    }
}

/// Beat to `manager` from a thread of its own for as long as the process lives (a memory
/// server in a pool): `conn` is the first connection if there is one.
pub fn spawn_beats(
    conn: Option<ManagerConn>,
    manager: String,
    token: Vec<u8>,
    heartbeat: Duration,
    mut beat: impl FnMut(Option<IpAddr>) -> PoolRequest + Send + 'static,
    mut acked: impl FnMut(PoolResponse) + Send + 'static,
    say: impl Fn(&str) + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("rmem-pool-beat".into())
        .spawn(move || {
            let stop = AtomicBool::new(false);
            beat_loop(
                conn, &manager, &token, heartbeat, &stop, &mut beat, &mut acked, &say,
            )
        })
        .map(drop)
}

/// What the manager last told a client.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Answers received so far: a new one means something may have changed.
    pub epoch: u64,
    /// The most server memory this client may use (`pool::UNLIMITED`: no limit).
    pub grant_bytes: u64,
    /// Live servers, the most free memory first.
    pub servers: Vec<ServerOffer>,
}

struct Shared {
    view: Mutex<View>,
    uses: Mutex<Vec<ServerUse>>,
    stop: AtomicBool,
}

/// A client's membership of a pool: its beats, and what the manager last said.
pub struct PoolLink {
    manager: String,
    session: SessionId,
    shared: Arc<Shared>,
}

impl PoolLink {
    /// Beat once as `session` (named `name`, asking for at most `max_remote_bytes`) and wait
    /// for the answer, then go on beating from a thread until dropped.
    pub fn start(
        manager: &str,
        token: &[u8],
        session: SessionId,
        name: String,
        max_remote_bytes: u64,
    ) -> Result<PoolLink, StoreError> {
        let mut conn = ManagerConn::connect(manager, token, MANAGER_TIMEOUT)?;
        let node = pool::node_id();
        let beat = move |uses: Vec<ServerUse>| {
            PoolRequest::ClientBeat(ClientBeat {
                session,
                name: name.clone(),
                max_remote_bytes,
                uses,
                node: node.clone(),
            })
        };
        let first = conn.ask(&beat(Vec::new()), MANAGER_TIMEOUT)?;
        let heartbeat = heartbeat_of(&first).unwrap_or(Duration::from_secs(1));
        let shared = Arc::new(Shared {
            view: Mutex::default(),
            uses: Mutex::default(),
            stop: AtomicBool::new(false),
        });
        let take = |shared: &Shared, r: PoolResponse| {
            if let PoolResponse::ClientAck {
                grant_bytes,
                servers,
                ..
            } = r
            {
                let mut v = shared.view.lock().unwrap_or_else(|e| e.into_inner());
                v.epoch += 1;
                v.grant_bytes = grant_bytes;
                v.servers = servers;
            }
        };
        if !matches!(first, PoolResponse::ClientAck { .. }) {
            return Err(StoreError::Manager {
                manager: manager.into(),
                detail: format!("answered {:?} to a client's beat", first.op()),
            });
        }
        take(&shared, first);
        let (s, m, t) = (shared.clone(), manager.to_string(), token.to_vec());
        std::thread::Builder::new()
            .name("rmem-pool-beat".into())
            .spawn(move || {
                let mut beat = |_: Option<IpAddr>| {
                    beat(s.uses.lock().unwrap_or_else(|e| e.into_inner()).clone())
                };
                let mut acked = |r| take(&s, r);
                let say = |m: &str| crate::tell!("rmem: {m}");
                beat_loop(
                    Some(conn),
                    &m,
                    &t,
                    heartbeat,
                    &s.stop,
                    &mut beat,
                    &mut acked,
                    &say,
                );
            })
            .map_err(|e| StoreError::Manager {
                manager: manager.into(),
                detail: format!("cannot start the heartbeat thread: {e}"),
            })?;
        Ok(PoolLink {
            manager: manager.into(),
            session,
            shared,
        })
    }

    pub fn manager(&self) -> &str {
        &self.manager
    }

    /// The session id this client uses on every server.
    pub fn session(&self) -> SessionId {
        self.session
    }

    /// How many answers the manager has given (cheap: compare before taking the view).
    pub fn epoch(&self) -> u64 {
        self.shared
            .view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .epoch
    }

    /// What the manager last said.
    pub fn view(&self) -> View {
        self.shared
            .view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What this client uses where, sent with the next beat.
    pub fn report(&self, uses: Vec<ServerUse>) {
        *self.shared.uses.lock().unwrap_or_else(|e| e.into_inner()) = uses;
    }
}

impl Drop for PoolLink {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}
