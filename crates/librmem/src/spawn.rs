//! posix_spawn, system and popen with arguments in remote memory.
//!
//! glibc's posix_spawn runs its child on the parent's memory (CLONE_VM) and resets every
//! handled signal to its default there before it calls execve. When sys.rs's filter traps
//! that execve (a path, argument array or string in the region), the trap's SIGSYS finds no
//! handler and the child dies. system() and popen() spawn the same way with the caller's
//! command string. So these functions copy whatever of their strings lies in the region into
//! local memory first; the child then never meets a region pointer. (Only needed where the
//! filter is on; elsewhere they pass straight through.)

use crate::io::real;
use crate::region_contains;
use crate::sys::copy_strvec as strvec;
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// `s` copied here (NUL included) when it lies in the region.
/// A NULL-terminated array of strings rebuilt in local memory where it or a string of it
/// lies in the region.
fn copy_strvec(v: *const *mut c_char) -> Option<(Vec<usize>, Vec<Vec<u8>>)> {
    (!v.is_null()).then(|| strvec(v as usize)).flatten()
}

fn local_str(s: *const c_char) -> Option<Vec<u8>> {
    if s.is_null() || !region_contains(s as u64) {
        return None;
    }
    crate::sys::copy_str(s as usize)
}

type Spawn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;

/// Call `f` with the path, argv and envp copied to local memory where they lie in the region.
///
/// # Safety
/// As posix_spawn(3).
unsafe fn spawn_local(
    f: Spawn,
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    if !crate::sys::filtered() {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { f(pid, path, actions, attr, argv, envp) };
    }
    let p = local_str(path);
    let (a, e) = (copy_strvec(argv), copy_strvec(envp));
    let path = p.as_ref().map_or(path, |c| c.as_ptr().cast());
    let argv = a.as_ref().map_or(argv, |v| v.0.as_ptr().cast());
    let envp = e.as_ref().map_or(envp, |v| v.0.as_ptr().cast());
    // SAFETY: the caller's arguments, some of them copied; the copies outlive the call.
    unsafe { f(pid, path, actions, attr, argv, envp) }
}

macro_rules! spawn_like {
    ($($name:ident, $sym:literal, $doc:literal;)*) => {$(
        #[doc = $doc]
        ///
        /// # Safety
        /// As posix_spawn(3).
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            pid: *mut libc::pid_t,
            path: *const c_char,
            actions: *const libc::posix_spawn_file_actions_t,
            attr: *const libc::posix_spawnattr_t,
            argv: *const *mut c_char,
            envp: *const *mut c_char,
        ) -> c_int {
            static REAL: AtomicUsize = AtomicUsize::new(0);
            let mut f = REAL.load(Relaxed);
            if f == 0 {
                f = crate::io::next_symbol($sym);
                REAL.store(f, Relaxed);
            }
            // SAFETY: f is the C library's definition of this function, of type Spawn.
            let f = unsafe { std::mem::transmute::<usize, Spawn>(f) };
            // SAFETY: caller's contract.
            unsafe { spawn_local(f, pid, path, actions, attr, argv, envp) }
        }
    )*};
}

spawn_like! {
    posix_spawn, c"posix_spawn", "See posix_spawn(3).";
    posix_spawnp, c"posix_spawnp", "See posix_spawnp(3).";
}

/// See system(3).
///
/// # Safety
/// `command` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    let f = real!(c"system", fn(*const c_char) -> c_int);
    let local = local_str(command);
    // SAFETY: the caller's command, or our copy of it.
    unsafe { f(local.as_ref().map_or(command, |c| c.as_ptr().cast())) }
}

/// See popen(3).
///
/// # Safety
/// `command` and `mode` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    let f = real!(
        c"popen",
        fn(*const c_char, *const c_char) -> *mut libc::FILE
    );
    let (c, m) = (local_str(command), local_str(mode));
    // SAFETY: the caller's strings, or our copies of them.
    unsafe {
        f(
            c.as_ref().map_or(command, |c| c.as_ptr().cast()),
            m.as_ref().map_or(mode, |c| c.as_ptr().cast()),
        )
    }
}
