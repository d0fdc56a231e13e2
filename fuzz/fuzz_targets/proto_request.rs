#![no_main]
//! `cargo fuzz run proto_request`: see harness.rs and docs/fuzzing.md.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::proto_request(data));
