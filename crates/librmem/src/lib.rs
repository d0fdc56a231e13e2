//! librmem: the client runtime behind a C ABI (`include/rmem.h`, `include/dlm.h`).
//!
//! Entry point: `rmem_init` (or `dlm_init`), called implicitly by the first allocation. The
//! runtime is configured from the environment that `rmem run` sets
//! ([`rmem_client::Config::from_env`]). One runtime per process, created once and kept for
//! the life of the process; `rmem_exit` stops it, and a later allocation starts a new one.

use rmem_client::Runtime;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Mutex;

/// The live runtime, or null. Runtimes are leaked on purpose: pointers into a stopped one
/// must stay valid to compare against, and the process keeps one for its whole life.
static RUNTIME: AtomicPtr<Runtime> = AtomicPtr::new(null_mut());
static INIT_LOCK: Mutex<()> = Mutex::new(());
static ATEXIT_REGISTERED: AtomicBool = AtomicBool::new(false);
static INIT_ERROR_REPORTED: AtomicBool = AtomicBool::new(false);

fn current() -> Option<&'static Runtime> {
    let p = RUNTIME.load(Ordering::Acquire);
    // SAFETY: non-null values are leaked Box<Runtime>s that are never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Run `f`, turning a panic into an abort: unwinding into C is undefined behaviour.
fn guard<T>(f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            eprintln!("rmem: internal error (panic); aborting");
            std::process::abort();
        }
    }
}

extern "C" fn at_exit() {
    if let Some(rt) = current() {
        rt.flush_trace();
        write_stats(rt);
    }
}

fn write_stats(rt: &Runtime) {
    if let Ok(path) = std::env::var("RMEM_STATS_JSON") {
        if !path.is_empty() {
            if let Err(e) = rt.write_stats_json(&path) {
                eprintln!("rmem: cannot write statistics to {path}: {e}");
            }
        }
    }
}

fn init() -> Option<&'static Runtime> {
    if let Some(rt) = current() {
        return Some(rt);
    }
    let _g = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = current() {
        return Some(rt);
    }
    match Runtime::from_env() {
        Ok(rt) => {
            if std::env::var_os("RMEM_VERBOSE").is_some_and(|v| v != "0") {
                eprintln!(
                    "rmem: started: servers {}, capacity {} bytes, page {} bytes, userfaultfd {}",
                    rt.servers(),
                    rt.capacity_bytes(),
                    rt.page_size(),
                    rt.uffd_mode().name()
                );
            }
            let rt: &'static Runtime = Box::leak(Box::new(rt));
            RUNTIME.store(rt as *const Runtime as *mut Runtime, Ordering::Release);
            if !ATEXIT_REGISTERED.swap(true, Ordering::AcqRel) {
                // SAFETY: registering a plain extern "C" fn with no captured state.
                unsafe { libc::atexit(at_exit) };
            }
            Some(rt)
        }
        Err(e) => {
            if !INIT_ERROR_REPORTED.swap(true, Ordering::AcqRel) {
                let mut msg = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg.push_str(": ");
                    msg.push_str(&s.to_string());
                    src = s.source();
                }
                eprintln!("rmem: cannot start: {msg}");
            }
            None
        }
    }
}

/// See `rmem.h`.
#[no_mangle]
pub extern "C" fn rmem_init() -> c_int {
    guard(|| if init().is_some() { 0 } else { -1 })
}

/// See `rmem.h`.
#[no_mangle]
pub extern "C" fn rmem_alloc(size: usize) -> *mut c_void {
    guard(|| match init().and_then(|rt| rt.alloc(size)) {
        Some(p) => p.cast(),
        None => {
            // SAFETY: errno is thread-local; setting it is always allowed.
            unsafe { *libc::__errno_location() = libc::ENOMEM };
            null_mut()
        }
    })
}

/// See `rmem.h`.
#[no_mangle]
pub extern "C" fn rmem_free(ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    guard(|| match current() {
        Some(rt) => {
            if let Err(e) = rt.free(ptr.cast()) {
                eprintln!("rmem: rmem_free({ptr:p}): {e}; ignored");
            }
        }
        None => eprintln!("rmem: rmem_free({ptr:p}) while rmem is not running; ignored"),
    })
}

/// See `rmem.h`.
#[no_mangle]
pub extern "C" fn rmem_usable_size(ptr: *mut c_void) -> usize {
    guard(|| {
        current()
            .and_then(|rt| rt.usable_size(ptr.cast()))
            .unwrap_or(0)
    })
}

/// See `rmem.h`.
#[no_mangle]
pub extern "C" fn rmem_exit() {
    guard(|| {
        let _g = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let p = RUNTIME.swap(null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: leaked runtime, never freed.
            let rt = unsafe { &*p };
            write_stats(rt);
            rt.shutdown();
        }
    })
}

/// C layout of `struct rmem_stats`.
#[repr(C)]
pub struct RmemStats {
    swap_ins: u64,
    swap_outs: u64,
    evictions: u64,
    zero_fills: u64,
    faults: u64,
    wp_faults: u64,
    fault_us_p50: f64,
    fault_us_p99: f64,
    bytes_fetched: u64,
    bytes_written_back: u64,
    local_bytes_max: u64,
    page_size: u64,
    policy: [c_char; 16],
    select_us_total: f64,
    select_us_max: f64,
}

/// See `rmem.h`.
///
/// # Safety
/// `out` must be null or point to a writable `struct rmem_stats`.
#[no_mangle]
pub unsafe extern "C" fn rmem_get_stats(out: *mut RmemStats) -> c_int {
    guard(|| {
        let Some(rt) = current() else { return -1 };
        if out.is_null() {
            return -1;
        }
        let s = rt.stats();
        let mut policy = [0 as c_char; 16];
        for (d, b) in policy.iter_mut().zip(s.policy.bytes().take(15)) {
            *d = b as c_char;
        }
        let v = RmemStats {
            swap_ins: s.swap_ins,
            swap_outs: s.swap_outs,
            evictions: s.evictions,
            zero_fills: s.zero_fills,
            faults: s.faults,
            wp_faults: s.wp_faults,
            fault_us_p50: s.fault_us_p50,
            fault_us_p99: s.fault_us_p99,
            bytes_fetched: s.bytes_fetched,
            bytes_written_back: s.bytes_written_back,
            local_bytes_max: s.local_bytes_max,
            page_size: s.page_size,
            policy,
            select_us_total: s.select_us_total,
            select_us_max: s.select_us_max,
        };
        // SAFETY: the caller guarantees `out` points to a writable struct rmem_stats.
        unsafe { out.write(v) };
        0
    })
}

/// See `rmem.h`.
#[no_mangle]
pub extern "C" fn rmem_page_size() -> usize {
    guard(|| current().map_or(0, |rt| rt.page_size()))
}

/// See `dlm.h`. argc and argv are left as they are.
#[no_mangle]
pub extern "C" fn dlm_init(_argc: *mut c_int, _argv: *mut *mut *mut c_char) -> c_int {
    rmem_init()
}

/// See `dlm.h`.
#[no_mangle]
pub extern "C" fn dlm_alloc(size: usize) -> *mut c_void {
    rmem_alloc(size)
}

/// See `dlm.h`.
#[no_mangle]
pub extern "C" fn dlm_free(ptr: *mut c_void) {
    rmem_free(ptr)
}

/// See `dlm.h`.
#[no_mangle]
pub extern "C" fn dlm_exit() {
    rmem_exit()
}
