//! `rmem.Region`'s native half (`rmem._rmem._Region`): a direct region
//! ([`rmem_client::direct::DirectRegion`], docs/regions.md) made on the servers of the
//! module's session, or opened by name. Byte ranges go between Python buffers and the servers
//! with the GIL released; the Python half (`python/rmem/__init__.py`) turns buffer-protocol
//! objects into addresses (ctypes) so `readinto` and `write` copy nothing locally.
//!
//! Errors map as the C API's errno does: a bad range or name is a `ValueError`, everything
//! else an `OSError` carrying the errno (`FileNotFoundError` for ENOENT, and so on, by
//! Python's own mapping).

use crate::{current, signals, size_arg, Session};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use rmem_client::direct::{DirectRegion, RegionError};
use rmem_client::store::remote::Timing;
use rmem_client::Config;
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock};

/// A region and what keeps its servers up: the session that made it (its own servers, if it
/// started them, stop only after the region is gone).
struct Held {
    region: ManuallyDrop<DirectRegion>,
    session: ManuallyDrop<Option<Arc<Session>>>,
    /// The process that made or opened it: only there does its engine thread exist.
    pid: i32,
}

impl Drop for Held {
    fn drop(&mut self) {
        if signals::getpid() != self.pid {
            // A fork() child's copy: the engine thread, the server sessions and the
            // registration are the parent's. Joining or ending them here would hang or cut
            // the parent off, so the copy is left as it is.
            return;
        }
        // SAFETY: each dropped once, here, region first (the session's own servers must
        // outlive it); neither is used after.
        unsafe {
            ManuallyDrop::drop(&mut self.region);
            ManuallyDrop::drop(&mut self.session);
        }
    }
}

fn to_py(e: &RegionError) -> PyErr {
    let msg = rmem_client::error_chain(e);
    match e.errno() {
        libc::EINVAL => PyValueError::new_err(msg),
        errno => PyOSError::new_err((errno, msg)),
    }
}

/// The native region behind `rmem.Region`.
#[pyclass(module = "rmem._rmem", frozen, name = "_Region")]
pub struct Region {
    /// `None` once closed. A call clones the Arc and works without the lock, so `close` from
    /// another thread waits for nothing: the region goes when the last call on it returns.
    held: RwLock<Option<Arc<Held>>>,
}

impl Region {
    fn held(&self) -> PyResult<Arc<Held>> {
        let h = self
            .held
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| PyValueError::new_err("I/O operation on a closed region"))?;
        if h.pid != signals::getpid() {
            return Err(crate::RmemError::new_err(
                "a region cannot be used in a fork() child of the process that made or opened \
                 it: open it by name in the child (rmem.Region.open)",
            ));
        }
        Ok(h)
    }

    fn wrap(region: DirectRegion, session: Option<Arc<Session>>) -> Region {
        let held = Held {
            region: ManuallyDrop::new(region),
            session: ManuallyDrop::new(session),
            pid: signals::getpid(),
        };
        Region {
            held: RwLock::new(Some(Arc::new(held))),
        }
    }

    /// Check a range before anything is allocated for it.
    fn check_range(h: &Held, offset: u64, len: usize) -> PyResult<()> {
        let size = h.region.size();
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(to_py(&RegionError::OutOfRange {
                offset,
                len: len as u64,
                size,
            }));
        }
        Ok(())
    }

    /// `_read_at` and `_write_at`: `length` bytes at `addr` (a buffer the caller holds) to or
    /// from `offset`, without the GIL.
    fn at(
        &self,
        py: Python<'_>,
        offset: u64,
        addr: usize,
        length: usize,
        write: bool,
    ) -> PyResult<()> {
        let h = self.held()?;
        Region::check_range(&h, offset, length)?;
        if length == 0 {
            return Ok(());
        }
        if addr == 0 {
            return Err(PyValueError::new_err("the buffer's address is NULL"));
        }
        py.detach(move || {
            let r = if write {
                // SAFETY: the caller's promise: `length` readable bytes at `addr`, held (a
                // buffer export keeps them from moving or going) until this call returns.
                let buf = unsafe { std::slice::from_raw_parts(addr as *const u8, length) };
                h.region.write(offset, buf)
            } else {
                // SAFETY: as above, and writable.
                let buf = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, length) };
                h.region.read(offset, buf)
            };
            drop(h); // the last reference may go here (a close meanwhile): without the GIL
            r
        })
        .map_err(|e| to_py(&e))
    }
}

/// Drop a reference to a held region without the GIL: the last one joins the engine thread
/// and may end server sessions and stop the session's own servers.
fn release(py: Python<'_>, h: Option<Arc<Held>>) {
    if h.is_some() {
        py.detach(move || drop(h));
    }
}

#[pymethods]
impl Region {
    /// A new region of `size` zeroed bytes on the session's servers (connecting with the
    /// defaults first is the Python half's job), registered as `name` if given.
    #[staticmethod]
    #[pyo3(signature = (size, name=None))]
    fn create(py: Python<'_>, size: &Bound<'_, PyAny>, name: Option<String>) -> PyResult<Region> {
        let size = size_arg("size", Some(size))?
            .ok_or_else(|| PyValueError::new_err("size: expected a size in bytes"))?;
        let session = current()?;
        let config: Config = session.config.clone();
        let r = py.detach(|| DirectRegion::create(&config, size, name.as_deref()));
        Ok(Region::wrap(r.map_err(|e| to_py(&e))?, Some(session)))
    }

    /// The region another process of this user created as `name` and still holds. Needs no
    /// session: the registration names the servers.
    #[staticmethod]
    fn open(py: Python<'_>, name: String) -> PyResult<Region> {
        let timing = match Config::from_env() {
            Ok(c) => Timing::of(&c),
            Err(_) => Timing::of(&Config::default()),
        };
        let r = py.detach(|| DirectRegion::open(&name, timing));
        Ok(Region::wrap(r.map_err(|e| to_py(&e))?, None))
    }

    /// Bytes in the region.
    #[getter]
    fn size(&self) -> PyResult<u64> {
        Ok(self.held()?.region.size())
    }

    /// The page size: a range is split at multiples of it, one request per piece.
    #[getter]
    fn page_size(&self) -> PyResult<usize> {
        Ok(self.held()?.region.page_size())
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.held
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// `length` bytes at `offset`, as a new `bytes`.
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        // Checked before the bytes object is allocated: a bad length allocates nothing.
        Region::check_range(&*self.held()?, offset, length)?;
        PyBytes::new_with(py, length, |buf| {
            // The new object is ours alone until this returns.
            self.at(py, offset, buf.as_mut_ptr() as usize, buf.len(), false)
        })
    }

    /// Read `length` bytes at `offset` into the memory at `addr`.
    ///
    /// The caller (the Python half) holds a writable buffer export of at least `length`
    /// bytes at `addr` for the whole call: that is what makes this sound, and why it is not
    /// public API.
    fn _read_at(&self, py: Python<'_>, offset: u64, addr: usize, length: usize) -> PyResult<()> {
        self.at(py, offset, addr, length, false)
    }

    /// Write `data` (a `bytes`) at `offset`.
    fn _write_bytes(&self, py: Python<'_>, offset: u64, data: &Bound<'_, PyBytes>) -> PyResult<()> {
        // A `bytes` is immutable, and the caller's reference keeps it alive.
        let data = data.as_bytes();
        self.at(py, offset, data.as_ptr() as usize, data.len(), true)
    }

    /// Write the `length` bytes at `addr` at `offset`.
    ///
    /// As `_read_at`: the caller holds a buffer export of those bytes for the whole call.
    fn _write_at(&self, py: Python<'_>, offset: u64, addr: usize, length: usize) -> PyResult<()> {
        self.at(py, offset, addr, length, true)
    }

    /// What the region has moved: calls, bytes asked, bytes on the wire, requests.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let h = self.held()?;
        let s = h.region.stats();
        let d = PyDict::new(py);
        d.set_item("size", h.region.size())?;
        d.set_item("page_size", h.region.page_size())?;
        d.set_item("reads", s.reads.load(Relaxed))?;
        d.set_item("writes", s.writes.load(Relaxed))?;
        d.set_item("bytes_read", s.bytes_read.load(Relaxed))?;
        d.set_item("bytes_written", s.bytes_written.load(Relaxed))?;
        d.set_item("bytes_fetched", s.bytes_fetched.load(Relaxed))?;
        d.set_item("bytes_sent", s.bytes_sent.load(Relaxed))?;
        d.set_item("requests", s.requests.load(Relaxed))?;
        Ok(d)
    }

    /// Let the region go: the creator's close ends it for every process that opened it; an
    /// opener's closes only its links. Calls in flight on other threads finish first.
    fn close(&self, py: Python<'_>) {
        let h = self.held.write().unwrap_or_else(|e| e.into_inner()).take();
        release(py, h);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let h = self
            .held
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if h.is_some() {
            Python::attach(|py| release(py, h));
        }
    }
}
