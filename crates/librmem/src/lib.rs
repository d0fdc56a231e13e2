//! librmem: the client runtime behind a C ABI (`include/rmem.h`, `include/dlm.h`).
//!
//! Entry point: `rmem_init` (or `dlm_init`), called implicitly by the first allocation. The
//! runtime is configured from the environment that `rmem run` sets
//! ([`rmem_client::Config::from_env`]); a program started without it starts its own memory
//! servers ([`own_servers`]). One runtime per process, created once and kept for
//! the life of the process; `rmem_exit` stops it, and a later allocation starts a new one.
//!
//! The same library is the `LD_PRELOAD` library of transparent mode: [`malloc`] interposes
//! the malloc family, [`io`] the I/O calls that need help in `UFFD_USER_MODE_ONLY` mode,
//! [`sys`] every other system call with a buffer there (a seccomp filter and SIGSYS),
//! [`mem`] the memory calls (madvise, munmap, mremap, mprotect, mlock) on remote memory,
//! [`stack`] stacks in remote memory, [`fork`] a fork() child's remote memory, [`spawn`] posix_spawn's arguments, and [`signals`] keeps
//! rmem's SIGSEGV/SIGBUS handler first whatever the program does with those signals. A
//! constructor starts the runtime before any constructor of the program when `rmem run` asks
//! for transparent mode.

mod fds;
mod fork;
mod io;
mod malloc;
mod mem;
mod own_servers;
mod probe;
mod regions;
mod signals;
mod spawn;
mod stack;
mod sys;

#[global_allocator]
static ALLOC: malloc::LibcAlloc = malloc::LibcAlloc;

/// Default of `RMEM_MIN_ALLOC` (`rmem run --min-alloc`); see docs/configuration.md for why.
pub const MIN_ALLOC_DEFAULT: usize = 64 << 10;

use rmem_client::Runtime;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::Mutex;

/// The live runtime, or null. Runtimes are leaked on purpose: pointers into a stopped one
/// must stay valid to compare against, and the process keeps one for its whole life.
static RUNTIME: AtomicPtr<Runtime> = AtomicPtr::new(null_mut());
static INIT_LOCK: Mutex<()> = Mutex::new(());
static ATEXIT_REGISTERED: AtomicBool = AtomicBool::new(false);
static INIT_ERROR_REPORTED: AtomicBool = AtomicBool::new(false);

/// Bounds of the region of the latest runtime (kept after rmem_exit, so its pointers are
/// still recognised as rmem's).
pub(crate) static REGION_BASE: AtomicU64 = AtomicU64::new(0);
pub(crate) static REGION_LEN: AtomicU64 = AtomicU64::new(0);

/// `addr` lies in rmem's region.
pub(crate) fn region_contains(addr: u64) -> bool {
    let base = REGION_BASE.load(Ordering::Relaxed);
    addr.wrapping_sub(base) < REGION_LEN.load(Ordering::Relaxed)
}

/// `[a, b]` covers the whole region.
pub(crate) fn region_within(a: u64, b: u64) -> bool {
    let (base, len) = (
        REGION_BASE.load(Ordering::Relaxed),
        REGION_LEN.load(Ordering::Relaxed),
    );
    len > 0 && a <= base && b >= base + len - 1
}

/// Say something on stderr as rmem.
pub(crate) fn report(msg: &str) {
    rmem_client::tell!("rmem: {msg}");
}

pub(crate) fn current() -> Option<&'static Runtime> {
    let p = RUNTIME.load(Ordering::Acquire);
    // SAFETY: non-null values are leaked Box<Runtime>s that are never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Run `f`, turning a panic into an abort: unwinding into C is undefined behaviour.
pub(crate) fn guard<T>(f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            rmem_client::tell!("rmem: internal error (panic); aborting");
            std::process::abort();
        }
    }
}

/// Make `rt` the process's runtime: a fork() child's own, replacing its copy of its
/// parent's (which is forgotten, never dropped: its pager thread is not in the child).
pub(crate) fn make_current(rt: Runtime) {
    let rt: &'static Runtime = Box::leak(Box::new(rt));
    RUNTIME.store(rt as *const Runtime as *mut Runtime, Ordering::Release);
}

extern "C" fn at_exit() {
    // A fork() child rmem could not serve has only its copy of its parent's runtime.
    if malloc::FORKED.load(Ordering::Relaxed) {
        return;
    }
    if let Some(rt) = current() {
        rt.flush_trace();
        write_stats(rt, true);
    }
}

/// A child process of the program `rmem run` started (`rmem run --children`): its statistics
/// go to `RMEM_STATS_JSON.PID`, beside the program's.
static DESCENDANT: AtomicBool = AtomicBool::new(false);

/// Write `rt`'s statistics where `rmem run` asked (`RMEM_STATS_JSON`): `complete` at the
/// program's exit; also when the runtime starts, incomplete, so that a program that ends
/// without running its exit handlers (`_exit`) is not taken for one that never started it.
/// A child's go to `RMEM_STATS_JSON.PID`: one `rmem run --children` started, and a fork()
/// child, whose runtime counts from the fork (at its exit only: one that execs leaves none,
/// and `rmem run` waits for a child whose file says it is still running).
fn write_stats(rt: &Runtime, complete: bool) {
    if let Ok(mut path) = std::env::var("RMEM_STATS_JSON") {
        if !path.is_empty() {
            if DESCENDANT.load(Ordering::Relaxed) || fork::CHILD.load(Ordering::Relaxed) {
                path = format!("{path}.{}", std::process::id());
            }
            if let Err(e) = rt.write_stats_json(&path, complete) {
                rmem_client::tell!("rmem: cannot write statistics to {path}: {e}");
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
    match start_runtime() {
        Ok(rt) => {
            if std::env::var_os("RMEM_VERBOSE").is_some_and(|v| v != "0") {
                rmem_client::tell!(
                    "rmem: started: servers {}, capacity {} bytes, page {} bytes, userfaultfd {}, faults by {}",
                    rt.servers(),
                    rt.capacity_bytes(),
                    rt.page_size(),
                    rt.uffd_mode().name(),
                    rt.fault_delivery()
                );
            }
            let rt: &'static Runtime = Box::leak(Box::new(rt));
            let (base, len) = rt.region();
            REGION_LEN.store(0, Ordering::Relaxed);
            REGION_BASE.store(base, Ordering::Relaxed);
            REGION_LEN.store(len, Ordering::Relaxed);
            let ps = rt.page_size();
            io::PAGE.store(ps, Ordering::Relaxed);
            // A system call's region buffer is faulted in a chunk at a time, small enough that
            // the chunk stays resident while the call runs: a 64th of the budget is within
            // the newest fetches that `adaptive` never evicts (resident/32), and far from
            // `fifo`'s address-order sweep.
            let chunk = (rt.local_bytes() / 64).min(8 << 20).max(ps as u64);
            io::CHUNK.store(chunk as usize, Ordering::Relaxed);
            io::PREFAULT.store(!rt.handles_kernel_faults(), Ordering::Relaxed);
            if !rt.handles_kernel_faults() {
                if let Err(why) = sys::install(base, len) {
                    if std::env::var_os("RMEM_SYSCALL_TRAP").is_none_or(|v| v != "0") {
                        report(&format!(
                            "system calls on remote buffers are helped only through the C \
                             library functions rmem wraps: {why}"
                        ));
                    }
                }
            }
            fork::guard_children();
            if rt.fault_delivery() == "signal" {
                // Faults arrive as SIGBUS: keep rmem's handler first whatever the program
                // installs; the program's disposition is the one rmem-uffd's replaced.
                signals::own(
                    libc::SIGBUS,
                    // SAFETY: signals.rs calls this part with the kernel's arguments.
                    |_, info, ctx| unsafe { rmem_client::handle_sigbus(info, ctx) },
                    Some(rmem_client::sigbus_previous_action()),
                );
            }
            RUNTIME.store(rt as *const Runtime as *mut Runtime, Ordering::Release);
            stack::give_signal_stack();
            write_stats(rt, false);
            if !ATEXIT_REGISTERED.swap(true, Ordering::AcqRel) {
                // SAFETY: registering a plain extern "C" fn with no captured state.
                unsafe { libc::atexit(at_exit) };
            }
            Some(rt)
        }
        Err(e) => {
            if !INIT_ERROR_REPORTED.swap(true, Ordering::AcqRel) {
                rmem_client::tell!("rmem: cannot start: {e}");
            }
            None
        }
    }
}

/// The runtime `RMEM_*` describes; with no servers configured (and not in trace mode, which
/// needs none), on memory servers started for this process ([`own_servers`]).
fn start_runtime() -> Result<Runtime, String> {
    let trace = std::env::var_os("RMEM_TRACE").is_some_and(|v| !v.is_empty());
    let own = if trace || rmem_client::config::servers_configured() {
        None
    } else {
        Some(own_servers::start()?)
    };
    let started = rmem_client::Config::from_env_with(own.as_ref())
        .map_err(rmem_client::RuntimeError::from)
        .and_then(|c| Runtime::from_config(&c));
    match started {
        Ok(rt) => {
            if let Some(o) = &own {
                if std::env::var_os("RMEM_VERBOSE").is_some_and(|v| v != "0") {
                    rmem_client::tell!(
                        "rmem: no servers configured: started {} itself",
                        o.servers.join(", ")
                    );
                }
            }
            Ok(rt)
        }
        Err(e) => {
            own_servers::stop();
            Err(rmem_client::error_chain(&e))
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
    if malloc::FORKED.load(Ordering::Relaxed) {
        report("rmem_alloc in a fork() child without rmem (see above); returning NULL");
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return null_mut();
    }
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
    if ptr.is_null() || malloc::FORKED.load(Ordering::Relaxed) {
        return;
    }
    guard(|| match current() {
        Some(rt) => {
            if let Err(e) = rt.free(ptr.cast()) {
                rmem_client::tell!("rmem: rmem_free({ptr:p}): {e}; ignored");
            }
        }
        None => rmem_client::tell!("rmem: rmem_free({ptr:p}) while rmem is not running; ignored"),
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
            write_stats(rt, true);
            rt.shutdown();
        }
        own_servers::stop();
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

/// The allocation of one `dlm` array, called by the constructor `rmem cc` writes into each
/// translation unit: `bytes` of zeroed remote memory, the first `init_bytes` of them (at most
/// `bytes`) copied from `init`. Never returns NULL: a program whose arrays cannot be allocated
/// ends here, before `main`, with status 69 and a message naming the array and where it is
/// declared.
///
/// # Safety
/// `init` is null or readable for `init_bytes`; `name` and `at` are null or C strings.
#[no_mangle]
pub unsafe extern "C" fn __rmem_dlm_array(
    bytes: usize,
    init: *const c_void,
    init_bytes: usize,
    name: *const c_char,
    at: *const c_char,
) -> *mut c_void {
    let p = rmem_alloc(bytes);
    if p.is_null() {
        let text = |s: *const c_char| {
            (!s.is_null()).then(|| {
                // SAFETY: the caller passes null or a C string.
                unsafe { std::ffi::CStr::from_ptr(s) }
                    .to_string_lossy()
                    .into_owned()
            })
        };
        report(&format!(
            "fatal: cannot allocate dlm array {} ({bytes} bytes, declared at {}): rmem did not start (see above), or the memory servers' capacity is too small",
            text(name).unwrap_or_default(),
            text(at).unwrap_or_default()
        ));
        // SAFETY: ending the process before main; nothing of the program has run.
        unsafe { libc::_exit(rmem_client::EXIT_SERVER_LOST) };
    }
    if !init.is_null() && init_bytes > 0 {
        // SAFETY: `p` holds `bytes` bytes, `init` is readable for `init_bytes` (the caller's
        // promise); the two cannot overlap (`p` is fresh).
        unsafe {
            std::ptr::copy_nonoverlapping(init.cast::<u8>(), p.cast::<u8>(), init_bytes.min(bytes))
        };
    }
    p
}

/// Runs when the library is loaded, before any constructor of the program: turns on
/// transparent mode when `rmem run` asked for it.
#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;

extern "C" fn constructor() {
    io::resolve_all();
    fork::install();
    if std::env::var_os("RMEM_MODE").is_none_or(|m| m != "transparent") {
        return;
    }
    // The program `rmem run` started; its children (they inherit LD_PRELOAD) only with
    // `rmem run --children`, each with a runtime and a budget of its own.
    if let Some(pid) = std::env::var("RMEM_RUN_PID")
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    {
        // SAFETY: getppid has no preconditions.
        if pid != unsafe { libc::getppid() } {
            if std::env::var_os("RMEM_CHILDREN").is_none_or(|v| v != "1") {
                return;
            }
            DESCENDANT.store(true, Ordering::Relaxed);
        }
    }
    guard(transparent_start);
}

/// Start the runtime for transparent mode, or end the process: a program that asked for
/// remote memory must not silently run without it.
fn transparent_start() {
    if let Ok(v) = std::env::var("RMEM_MIN_ALLOC") {
        match rmem_proto::size::parse_size(&v) {
            Ok(n) => malloc::MIN_ALLOC.store(n as usize, Ordering::Relaxed),
            Err(e) => {
                report(&format!("fatal: RMEM_MIN_ALLOC={v:?}: {e}"));
                // SAFETY: ending the process before the program starts.
                unsafe { libc::_exit(rmem_client::EXIT_SERVER_LOST) };
            }
        }
    }
    match std::env::var("RMEM_ANON_MMAP").as_deref() {
        Ok("1") => malloc::ANON_MMAP.store(true, Ordering::Relaxed),
        Ok("0") | Ok("") | Err(_) => {}
        Ok(v) => {
            report(&format!("fatal: RMEM_ANON_MMAP={v:?}: expected 0 or 1"));
            // SAFETY: ending the process before the program starts.
            unsafe { libc::_exit(rmem_client::EXIT_SERVER_LOST) };
        }
    }
    if init().is_none() {
        // SAFETY: as above; init() has said why.
        unsafe { libc::_exit(rmem_client::EXIT_SERVER_LOST) };
    }
    malloc::TRANSPARENT.store(true, Ordering::Release);
}
