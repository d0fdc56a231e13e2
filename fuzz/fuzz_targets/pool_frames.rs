#![no_main]
//! `cargo fuzz run pool_frames`: see harness.rs and docs/fuzzing.md.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::pool_frames(data));
