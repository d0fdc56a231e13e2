#![no_main]
//! `cargo fuzz run metrics_http`: see harness.rs and docs/fuzzing.md.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::metrics_http(data));
