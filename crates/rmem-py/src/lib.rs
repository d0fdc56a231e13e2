//! rmem-py: the native part of the Python package `rmem` (`rmem._rmem`).
//!
//! Entry point: `_connect`, which starts one [`Runtime`] for the process (on the servers it
//! is given, on those `rmem run` put in the environment, or on servers it starts itself with
//! `rmem launch --detach`), and `_alloc`, which hands out a [`Block`] of remote memory. A
//! block exposes its bytes through numpy's `__array_interface__`; the Python layer
//! (`python/rmem/__init__.py`) turns it into an `ndarray` whose base is the block, so the
//! block is freed, and its pages given back to the servers, when the last array using it
//! goes.
//!
//! Errors are Python exceptions: `RmemError`, and `ServerLost` once the pager has given up
//! on a server. The pager cannot raise in the thread that touches memory (that thread may be
//! anywhere in numpy's C code), so after a loss the region is made inaccessible
//! ([`rmem_client::region::Mapping::seal`]) and a touch of it ends the process with status 69
//! and a message from this module's SIGSEGV handler ([`signals`]); every later call into
//! this module raises `ServerLost`.
//!
//! `rmem.Region` (region.rs) is the other way in: a direct region on the same servers,
//! byte ranges read and written with no mapping.

mod fork;
mod region;
mod signals;

use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rmem_client::config::{self, Config, OwnServers};
use rmem_client::own_servers::{hostfile_from_env, Helper};
use rmem_client::Runtime;
use std::cell::UnsafeCell;
use std::io::{Read, Seek, SeekFrom};
use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

pyo3::create_exception!(
    rmem,
    RmemError,
    PyException,
    "An rmem operation failed: no servers could be started or reached, the servers' \
     capacity is exhausted, or a bad setting."
);
pyo3::create_exception!(
    rmem,
    ServerLost,
    RmemError,
    "A memory server was lost: the data of every remote array is gone. Raised by every rmem \
     call after the loss; a touch of a remote array's data ends the process (status 69)."
);

/// Bytes read from a file at a time by `_read_into`, through a local buffer.
const READ_CHUNK_BYTES: usize = 4 << 20;

/// One runtime and what came with it. Blocks hold it alive: `close()` only drops the
/// module's reference, and the runtime stops (and its own servers are finalized) when the
/// last array using it is gone.
struct Session {
    /// Replaced in a fork() child by the child's own (fork.rs); the copy of the parent's is
    /// never dropped there, it has no pager to stop.
    rt: UnsafeCell<ManuallyDrop<Runtime>>,
    /// Servers this session started (`rmem launch --detach`), finalized after the runtime.
    helper: Mutex<Option<Helper>>,
    /// The pager's last words, set when it gives up.
    lost: Arc<OnceLock<String>>,
    /// Blocks alive now.
    live_blocks: AtomicU64,
    /// The signal handler's record of this region.
    slot: usize,
    /// The process this session's runtime serves: the one that connected, or a fork() child
    /// that took it over.
    pid: AtomicI32,
    /// The process that started `helper`'s servers, the only one that stops them.
    helper_pid: i32,
    own_servers: bool,
    /// What the runtime was started with: `rmem.Region` makes its regions on the same
    /// servers (region.rs).
    config: Config,
}

// SAFETY: `rt` is written only by a fork() child's handler (fork.rs), when the child has one
// thread and nothing else can read it; everything else only reads it.
unsafe impl Sync for Session {}

impl Session {
    fn rt(&self) -> &Runtime {
        // SAFETY: see the Sync impl: no write while anything can read.
        unsafe { &*self.rt.get() }
    }

    fn pid(&self) -> i32 {
        self.pid.load(Ordering::Relaxed)
    }
}

impl Session {
    /// Refuse to go on after a loss or in a fork() child.
    fn check(&self) -> PyResult<()> {
        if signals::getpid() != self.pid() {
            return Err(RmemError::new_err(
                "this fork() child has no remote memory of this session: its rmem could not \
                 start at the fork (see the message then)",
            ));
        }
        match self.lost.get() {
            Some(m) => Err(ServerLost::new_err(m.clone())),
            None => Ok(()),
        }
    }

    fn free(&self, addr: usize) {
        self.live_blocks.fetch_sub(1, Ordering::Relaxed);
        if signals::getpid() != self.pid() || self.lost.get().is_some() {
            return; // no pager to give the pages back to
        }
        if let Err(e) = self.rt().free(addr as *mut u8) {
            eprintln!("rmem: freeing a remote array at {addr:#x}: {e}");
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let me = signals::getpid();
        if me != self.pid() {
            return; // a fork() child without it: the parent's runtime is not ours to stop
        }
        // SAFETY: dropped exactly once, here; nothing uses `rt` afterwards.
        unsafe { ManuallyDrop::drop(self.rt.get_mut()) };
        if self.lost.get().is_none() {
            signals::forget(self.slot);
        }
        if me != self.helper_pid {
            return; // the servers are the parent's
        }
        if let Some(h) = self.helper.lock().unwrap_or_else(|e| e.into_inner()).take() {
            h.stop();
        }
    }
}

/// The session `connect` started, until `close`.
static CURRENT: Mutex<Option<Arc<Session>>> = Mutex::new(None);

fn current() -> PyResult<Arc<Session>> {
    let s = CURRENT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or_else(|| RmemError::new_err("not connected: call rmem.connect() first"))?;
    s.check()?;
    Ok(s)
}

/// A size given as an int (bytes) or a string with a K/M/G/T suffix, as everywhere in rmem.
fn size_arg(what: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    if let Ok(n) = v.extract::<u64>() {
        return Ok(Some(n));
    }
    let s: String = v.extract().map_err(|_| {
        RmemError::new_err(format!(
            "{what}: expected a size in bytes or a string such as \"1G\""
        ))
    })?;
    rmem_proto::size::parse_size(&s)
        .map(Some)
        .map_err(|e| RmemError::new_err(format!("{what}={s:?}: {e}")))
}

/// Start a runtime; see `rmem.connect` for the arguments.
#[pyfunction]
#[pyo3(signature = (servers=None, local=None, page_size=None, hostfile=None, redundancy=None, encrypt=None, manager=None))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments, one to one
fn _connect(
    py: Python<'_>,
    servers: Option<Vec<String>>,
    local: Option<&Bound<'_, PyAny>>,
    page_size: Option<&Bound<'_, PyAny>>,
    hostfile: Option<PathBuf>,
    redundancy: Option<String>,
    encrypt: Option<bool>,
    manager: Option<String>,
) -> PyResult<()> {
    let local = size_arg("local", local)?;
    let page_size = size_arg("page_size", page_size)?;
    let redundancy = match redundancy.as_deref() {
        None | Some("auto") => None,
        Some(r) => Some(
            rmem_client::store::codec::Redundancy::parse(r)
                .map_err(|e| PyValueError::new_err(format!("redundancy={r:?}: {e}")))?,
        ),
    };
    let layout = Layout {
        redundancy,
        encrypt,
    };
    let mut cur = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    if cur.is_some() {
        return Err(RmemError::new_err(
            "already connected: call rmem.close() before connecting again",
        ));
    }
    let session = py.detach(|| start(servers, manager, local, page_size, hostfile, layout))?;
    let session = Arc::new(session);
    fork::track(&session);
    *cur = Some(session);
    Ok(())
}

/// Where the servers come from, in order: `servers`, `hostfile`, the environment `rmem run`
/// sets, else servers started here (the hosts file `RMEM_HOSTFILE` or `./dlm_hosts` names,
/// else two on loopback).
/// `connect()`'s `redundancy=` and `encrypt=`: over the environment and the hosts file.
struct Layout {
    redundancy: Option<rmem_client::store::codec::Redundancy>,
    encrypt: Option<bool>,
}

fn start(
    servers: Option<Vec<String>>,
    manager: Option<String>,
    local: Option<u64>,
    page_size: Option<u64>,
    hostfile: Option<PathBuf>,
    layout: Layout,
) -> PyResult<Session> {
    let err = |e: &dyn std::error::Error| RmemError::new_err(rmem_client::error_chain(e));
    let mut helper = None;
    let mut config = match (servers, hostfile) {
        (list, _) if manager.is_some() => {
            let token = config::token_from_env().map_err(|e| err(&e))?;
            let own = OwnServers {
                servers: list.unwrap_or_default(),
                token,
                local_bytes: None,
                redundancy: None,
                encrypt: None,
                manager,
            };
            Config::from_env_with(Some(&own))
        }
        (Some(list), _) => {
            let token = config::token_from_env().map_err(|e| err(&e))?;
            let own = OwnServers {
                servers: list,
                token,
                local_bytes: None,
                redundancy: None,
                encrypt: None,
                manager: None,
            };
            Config::from_env_with(Some(&own))
        }
        (None, hostfile) => {
            let hostfile = hostfile.or_else(|| {
                (!config::servers_configured())
                    .then(hostfile_from_env)
                    .flatten()
            });
            if hostfile.is_none() && config::servers_configured() {
                Config::from_env()
            } else {
                let (h, own) = Helper::start(hostfile.as_deref()).map_err(RmemError::new_err)?;
                helper = Some(h);
                Config::from_env_with(Some(&own))
            }
        }
    }
    .map_err(|e| err(&e));
    let stop_helper = |helper: Option<Helper>| {
        if let Some(h) = helper {
            h.stop();
        }
    };
    if let Ok(c) = &mut config {
        if let Some(v) = local {
            c.local_bytes = v;
        }
        if let Some(v) = page_size {
            c.page_size = v as usize;
        }
        if layout.redundancy.is_some() {
            c.redundancy = layout.redundancy;
        }
        if layout.encrypt.is_some() {
            c.encrypt = layout.encrypt;
        }
    }
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            stop_helper(helper);
            return Err(e);
        }
    };
    let lost = Arc::new(OnceLock::new());
    let on_loss = lost.clone();
    let slot_cell = Arc::new(OnceLock::<usize>::new());
    let slot_of_loss = slot_cell.clone();
    let rt = Runtime::connect_with(
        &config,
        Box::new(move |msg: &str| {
            let _ = on_loss.set(msg.to_string());
            if let Some(&slot) = slot_of_loss.get() {
                signals::mark_lost(slot);
            }
            eprintln!(
                "rmem: memory server lost: {msg}\nrmem: every rmem call now raises \
                 rmem.ServerLost; touching a remote array's data ends the process (status 69)"
            );
        }),
    );
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            stop_helper(helper);
            return Err(err(&e));
        }
    };
    let (base, len) = rt.region();
    let slot = signals::watch(base, len)
        .map_err(|e| RmemError::new_err(format!("too many rmem sessions alive at once: {e}")))?;
    let _ = slot_cell.set(slot);
    if lost.get().is_some() {
        signals::mark_lost(slot); // lost before the slot was known
    }
    let own_servers = helper.is_some();
    Ok(Session {
        rt: UnsafeCell::new(ManuallyDrop::new(rt)),
        helper: Mutex::new(helper),
        lost,
        live_blocks: AtomicU64::new(0),
        slot,
        pid: AtomicI32::new(signals::getpid()),
        helper_pid: signals::getpid(),
        own_servers,
        config,
    })
}

/// Drop the module's session; it stops when its last array is gone.
#[pyfunction]
fn _close(py: Python<'_>) {
    let s = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).take();
    // Stopping may wait for the pager and the servers: not while holding the GIL.
    py.detach(move || drop(s));
}

/// A session is open.
#[pyfunction]
fn _connected() -> bool {
    CURRENT.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}

/// A block of remote memory; numpy sees its bytes through `__array_interface__`.
#[pyclass(module = "rmem._rmem", frozen)]
struct Block {
    session: Arc<Session>,
    addr: usize,
    nbytes: usize,
}

#[pymethods]
impl Block {
    /// numpy's array interface (version 3): `nbytes` writable bytes at `addr`.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.nbytes,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.addr, false))?;
        Ok(d)
    }

    /// Address of the first byte.
    #[getter]
    fn addr(&self) -> usize {
        self.addr
    }

    /// Bytes in the block.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        let (s, addr) = (self.session.clone(), self.addr);
        // Freeing waits for the pager to drop the pages: let other threads run meanwhile.
        Python::attach(|py| py.detach(move || s.free(addr)));
    }
}

/// `nbytes` zeroed bytes of remote memory.
#[pyfunction]
fn _alloc(py: Python<'_>, nbytes: usize) -> PyResult<Block> {
    let s = current()?;
    let size = nbytes.max(1);
    let rt = s.clone();
    // Reused memory is zeroed by stores that may fault: without the GIL.
    let p = py.detach(move || rt.rt().alloc(size).map(|p| p as usize));
    let Some(addr) = p else {
        s.check()?;
        return Err(RmemError::new_err(format!(
            "cannot allocate {nbytes} bytes of remote memory: the memory servers' capacity \
             ({} bytes, {} allocated) or the region is exhausted",
            s.rt().capacity_bytes(),
            s.rt().allocated_bytes()
        )));
    };
    s.live_blocks.fetch_add(1, Ordering::Relaxed);
    Ok(Block {
        session: s,
        addr,
        nbytes,
    })
}

/// Read `nbytes` of the file at `path` from `offset` into `block`; returns the bytes read
/// (fewer at the end of the file). Reads go through a local buffer and are copied in with
/// ordinary stores: a `read(2)` straight into a page that is not resident fails with EFAULT
/// when userfaultfd runs in user-mode-only mode (unprivileged).
#[pyfunction]
fn _read_into(
    py: Python<'_>,
    path: PathBuf,
    block: &Block,
    offset: u64,
    nbytes: usize,
) -> PyResult<usize> {
    block.session.check()?;
    if nbytes > block.nbytes {
        return Err(RmemError::new_err(format!(
            "{nbytes} bytes do not fit a block of {}",
            block.nbytes
        )));
    }
    let addr = block.addr;
    let done = py.detach(move || -> std::io::Result<usize> {
        let mut f = std::fs::File::open(&path)?;
        f.seek(SeekFrom::Start(offset))?;
        let mut buf = vec![0u8; READ_CHUNK_BYTES.min(nbytes.max(1))];
        let mut done = 0;
        while done < nbytes {
            let want = buf.len().min(nbytes - done);
            let n = match f.read(&mut buf[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            // SAFETY: [addr+done, addr+done+n) lies inside the block (done + n <= nbytes <=
            // block.nbytes), which the caller's reference keeps allocated; the pager resolves
            // the faults these stores take, and `buf` is local memory.
            unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), (addr + done) as *mut u8, n) };
            done += n;
        }
        Ok(done)
    })?;
    block.session.check()?;
    Ok(done)
}

/// The runtime's statistics (rmem run's JSON report), as JSON text.
#[pyfunction]
fn _stats_json() -> PyResult<String> {
    Ok(current()?.rt().stats().to_json())
}

/// What the session is: servers, sizes, live blocks.
#[pyfunction]
fn _info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = current()?;
    let d = PyDict::new(py);
    d.set_item("servers", s.rt().servers())?;
    d.set_item("own_servers", s.own_servers)?;
    d.set_item("page_size", s.rt().page_size())?;
    d.set_item("local_bytes", s.rt().local_bytes())?;
    d.set_item("capacity_bytes", s.rt().capacity_bytes())?;
    d.set_item("allocated_bytes", s.rt().allocated_bytes())?;
    d.set_item("live_arrays", s.live_blocks.load(Ordering::Relaxed))?;
    d.set_item("userfaultfd", s.rt().uffd_mode().name())?;
    Ok(d)
}

#[pymodule]
fn _rmem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    fork::install();
    m.add("RmemError", m.py().get_type::<RmemError>())?;
    m.add("ServerLost", m.py().get_type::<ServerLost>())?;
    m.add_class::<Block>()?;
    m.add_class::<region::Region>()?;
    m.add_function(wrap_pyfunction!(_connect, m)?)?;
    m.add_function(wrap_pyfunction!(_close, m)?)?;
    m.add_function(wrap_pyfunction!(_connected, m)?)?;
    m.add_function(wrap_pyfunction!(_alloc, m)?)?;
    m.add_function(wrap_pyfunction!(_read_into, m)?)?;
    m.add_function(wrap_pyfunction!(_stats_json, m)?)?;
    m.add_function(wrap_pyfunction!(_info, m)?)?;
    Ok(())
}
