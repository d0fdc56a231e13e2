//! Direct regions in the C API (`rmem_region_*`, `rmem_read`, `rmem_write` and their list
//! forms in `rmem.h`) over [`rmem_client::direct::DirectRegion`]. A region needs no runtime
//! and no pager: it is configured from the same environment (`rmem run`'s), or, with no
//! servers configured, uses the memory servers this process starts for itself (shared with
//! the runtime's: [`crate::own_servers`]). Every failure returns -1 or NULL with errno set
//! and a message `rmem_last_error` returns on the same thread.

use rmem_client::direct::{DirectRegion, RegionError};
use rmem_client::store::remote::Timing;
use rmem_client::Config;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::null_mut;
use std::sync::atomic::Ordering::Relaxed;

/// `rmem_region_t`: opaque to C.
pub struct RmemRegion(DirectRegion);

/// C layout of `struct rmem_range`.
#[repr(C)]
pub struct RmemRange {
    offset: u64,
    buf: *mut c_void,
    len: usize,
}

/// C layout of `struct rmem_region_stats`.
#[repr(C)]
pub struct RmemRegionStats {
    size: u64,
    page_size: u64,
    reads: u64,
    writes: u64,
    bytes_read: u64,
    bytes_written: u64,
    bytes_fetched: u64,
    bytes_sent: u64,
    requests: u64,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `msg` as this thread's last error, set errno; servers lost are also said on stderr
/// (a program that only checks -1 should still leave a trace of why).
fn fail(errno: c_int, msg: String) {
    if errno == libc::EIO {
        crate::report(&msg);
    }
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
    // SAFETY: errno is thread-local; setting it is always allowed.
    unsafe { *libc::__errno_location() = errno };
}

fn fail_with(e: &RegionError) {
    fail(e.errno(), rmem_client::error_chain(e));
}

/// The configuration regions are made with: `RMEM_*`, or this process's own servers.
fn config() -> Result<Config, String> {
    let own = if rmem_client::config::servers_configured() {
        None
    } else {
        Some(crate::own_servers::start()?)
    };
    Config::from_env_with(own.as_ref()).map_err(|e| rmem_client::error_chain(&e))
}

/// A C string argument, or a failure naming `what`.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Option<&'a str> {
    if p.is_null() {
        fail(libc::EINVAL, format!("{what} is NULL"));
        return None;
    }
    // SAFETY: the caller's promise.
    match unsafe { CStr::from_ptr(p) }.to_str() {
        Ok(s) => Some(s),
        Err(_) => {
            fail(libc::EINVAL, format!("{what} is not UTF-8"));
            None
        }
    }
}

fn create(name: Option<&str>, size: usize) -> *mut RmemRegion {
    let config = match config() {
        Ok(c) => c,
        Err(msg) => {
            fail(libc::EIO, format!("cannot make a region: {msg}"));
            return null_mut();
        }
    };
    match DirectRegion::create(&config, size as u64, name) {
        Ok(r) => Box::into_raw(Box::new(RmemRegion(r))),
        Err(e) => {
            fail_with(&e);
            null_mut()
        }
    }
}

/// See `rmem.h`.
#[no_mangle]
pub extern "C" fn rmem_region_create(size: usize) -> *mut RmemRegion {
    crate::guard(|| create(None, size))
}

/// See `rmem.h`.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn rmem_region_create_named(
    name: *const c_char,
    size: usize,
) -> *mut RmemRegion {
    crate::guard(|| {
        // SAFETY: the caller's promise.
        match unsafe { c_str(name, "the region name") } {
            Some(n) => create(Some(n), size),
            None => null_mut(),
        }
    })
}

/// See `rmem.h`.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn rmem_region_open(name: *const c_char) -> *mut RmemRegion {
    crate::guard(|| {
        // SAFETY: the caller's promise.
        let Some(name) = (unsafe { c_str(name, "the region name") }) else {
            return null_mut();
        };
        let timing = match Config::from_env() {
            Ok(c) => Timing::of(&c),
            Err(_) => Timing::of(&Config::default()),
        };
        match DirectRegion::open(name, timing) {
            Ok(r) => Box::into_raw(Box::new(RmemRegion(r))),
            Err(e) => {
                fail_with(&e);
                null_mut()
            }
        }
    })
}

/// See `rmem.h`.
///
/// # Safety
/// `r` is NULL or a region from `rmem_region_create*`/`rmem_region_open` not freed yet, and
/// no other thread is using it.
#[no_mangle]
pub unsafe extern "C" fn rmem_region_free(r: *mut RmemRegion) {
    if r.is_null() {
        return;
    }
    // SAFETY: the caller's promise: a live region from Box::into_raw, used by no one else.
    crate::guard(|| drop(unsafe { Box::from_raw(r) }))
}

/// See `rmem.h`.
///
/// # Safety
/// `r` is NULL or a live region.
#[no_mangle]
pub unsafe extern "C" fn rmem_region_size(r: *const RmemRegion) -> u64 {
    // SAFETY: the caller's promise.
    unsafe { r.as_ref() }.map_or(0, |r| r.0.size())
}

/// The region behind `r`, or a failure.
///
/// # Safety
/// `r` is NULL or a live region.
unsafe fn region<'a>(r: *const RmemRegion) -> Option<&'a DirectRegion> {
    // SAFETY: the caller's promise.
    match unsafe { r.as_ref() } {
        Some(r) => Some(&r.0),
        None => {
            fail(libc::EINVAL, "the region is NULL".into());
            None
        }
    }
}

/// Bytes moved, or -1.
fn done(r: Result<(), RegionError>, n: u64) -> isize {
    match r {
        Ok(()) => isize::try_from(n).unwrap_or(isize::MAX),
        Err(e) => {
            fail_with(&e);
            -1
        }
    }
}

/// The ranges of a list call as (offset, buffer, length), or a failure; total bytes.
///
/// # Safety
/// `ranges` is NULL or `count` readable `RmemRange`s.
unsafe fn ranges<'a>(ranges: *const RmemRange, count: usize) -> Option<(&'a [RmemRange], u64)> {
    if ranges.is_null() && count > 0 {
        fail(libc::EINVAL, "the range list is NULL".into());
        return None;
    }
    let list: &[RmemRange] = if count == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(ranges, count) }
    };
    let mut total = 0u64;
    for (i, r) in list.iter().enumerate() {
        if r.buf.is_null() && r.len > 0 {
            fail(libc::EINVAL, format!("range {i}: its buffer is NULL"));
            return None;
        }
        total += r.len as u64;
    }
    if total > isize::MAX as u64 {
        fail(
            libc::EINVAL,
            "the ranges add up to more than SSIZE_MAX bytes".into(),
        );
        return None;
    }
    Some((list, total))
}

/// A list call: `region` and `list` checked, then `f` with the region and the ranges as
/// (offset, pointer, length); the bytes moved, or -1.
///
/// # Safety
/// `r` is NULL or a live region; `list` is NULL or `count` ranges.
unsafe fn list_call(
    r: *const RmemRegion,
    list: *const RmemRange,
    count: usize,
    f: impl FnOnce(&DirectRegion, &[RmemRange]) -> Result<(), RegionError>,
) -> isize {
    crate::guard(|| {
        // SAFETY: the caller's promises.
        let (Some(region), Some((list, total))) =
            (unsafe { region(r) }, unsafe { ranges(list, count) })
        else {
            return -1;
        };
        done(f(region, list), total)
    })
}

/// See `rmem.h`.
///
/// # Safety
/// `r` is NULL or a live region; `list` is NULL or `count` ranges whose buffers are
/// writable for their lengths.
#[no_mangle]
pub unsafe extern "C" fn rmem_readv(
    r: *const RmemRegion,
    list: *const RmemRange,
    count: usize,
) -> isize {
    let read = |region: &DirectRegion, list: &[RmemRange]| {
        let mut bufs: Vec<(u64, &mut [u8])> = list
            .iter()
            .map(|r| {
                let b: &mut [u8] = if r.len == 0 {
                    &mut []
                } else {
                    // SAFETY: the caller's promise: `len` writable bytes at `buf`.
                    unsafe { std::slice::from_raw_parts_mut(r.buf.cast(), r.len) }
                };
                (r.offset, b)
            })
            .collect();
        region.read_ranges(&mut bufs)
    };
    // SAFETY: the caller's promises, passed on.
    unsafe { list_call(r, list, count, read) }
}

/// See `rmem.h`.
///
/// # Safety
/// As [`rmem_readv`], with readable buffers.
#[no_mangle]
pub unsafe extern "C" fn rmem_writev(
    r: *const RmemRegion,
    list: *const RmemRange,
    count: usize,
) -> isize {
    let write = |region: &DirectRegion, list: &[RmemRange]| {
        let bufs: Vec<(u64, &[u8])> = list
            .iter()
            .map(|r| {
                let b: &[u8] = if r.len == 0 {
                    &[]
                } else {
                    // SAFETY: the caller's promise: `len` readable bytes at `buf`.
                    unsafe { std::slice::from_raw_parts(r.buf.cast(), r.len) }
                };
                (r.offset, b)
            })
            .collect();
        region.write_ranges(&bufs)
    };
    // SAFETY: the caller's promises, passed on.
    unsafe { list_call(r, list, count, write) }
}

/// See `rmem.h`.
///
/// # Safety
/// `r` is NULL or a live region; `buf` is NULL or `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn rmem_read(
    r: *const RmemRegion,
    offset: u64,
    buf: *mut c_void,
    len: usize,
) -> isize {
    let one = RmemRange { offset, buf, len };
    // SAFETY: the caller's promises, passed on.
    unsafe { rmem_readv(r, &one, 1) }
}

/// See `rmem.h`.
///
/// # Safety
/// `r` is NULL or a live region; `buf` is NULL or `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rmem_write(
    r: *const RmemRegion,
    offset: u64,
    buf: *const c_void,
    len: usize,
) -> isize {
    let one = RmemRange {
        offset,
        buf: buf.cast_mut(),
        len,
    };
    // SAFETY: the caller's promises, passed on.
    unsafe { rmem_writev(r, &one, 1) }
}

/// See `rmem.h`.
///
/// # Safety
/// `r` is NULL or a live region; `out` is NULL or a writable `struct rmem_region_stats`.
#[no_mangle]
pub unsafe extern "C" fn rmem_region_get_stats(
    r: *const RmemRegion,
    out: *mut RmemRegionStats,
) -> c_int {
    // SAFETY: the caller's promise.
    let Some(region) = (unsafe { region(r) }) else {
        return -1;
    };
    if out.is_null() {
        fail(libc::EINVAL, "the statistics pointer is NULL".into());
        return -1;
    }
    let s = region.stats();
    let v = RmemRegionStats {
        size: region.size(),
        page_size: region.page_size() as u64,
        reads: s.reads.load(Relaxed),
        writes: s.writes.load(Relaxed),
        bytes_read: s.bytes_read.load(Relaxed),
        bytes_written: s.bytes_written.load(Relaxed),
        bytes_fetched: s.bytes_fetched.load(Relaxed),
        bytes_sent: s.bytes_sent.load(Relaxed),
        requests: s.requests.load(Relaxed),
    };
    // SAFETY: the caller's promise: `out` is writable.
    unsafe { out.write(v) };
    0
}

/// See `rmem.h`.
#[no_mangle]
pub extern "C" fn rmem_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
