#![no_main]
//! `cargo fuzz run server_session`: see harness.rs and docs/fuzzing.md.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::server_session(data));
