#![no_main]
//! `cargo fuzz run server_session`: see harness.rs and docs/fuzzing.md.

#[path = "../harness.rs"]
mod harness;

/// No leak checks here (the other targets have them). libFuzzer checks for leaks right after
/// an input, and an input here ends when the server closes its connection: that connection's
/// thread is still dropping its buffers and exiting, concurrently with the check, which then
/// misses that thread's references (google/sanitizers#757 is the same race). Three runs
/// stopped on such reports within 40 to 72 s: the thread's glibc destructor list node, std's
/// handle for the thread, then its boxed closure and its two 256 KiB socket buffers, all
/// freed as the thread ends; none reproduced when its input was replayed (docs/fuzzing.md).
#[no_mangle]
pub extern "C" fn __lsan_default_options() -> *const std::ffi::c_char {
    c"detect_leaks=0".as_ptr()
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::server_session(data));
