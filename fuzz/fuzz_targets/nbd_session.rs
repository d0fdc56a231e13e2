#![no_main]
//! `cargo fuzz run nbd_session`: see harness.rs and docs/fuzzing.md.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::nbd_session(data));
