//! Random operation sequences against every policy, checked by `heapscope_core::check` after every step.
//!
//! Run: `cd allocator/core/fuzz && cargo fuzz run ops` (needs cargo-fuzz and a nightly compiler, or
//! `RUSTC_BOOTSTRAP=1` on a stable one). A crash input replays with `cargo fuzz run ops <file>`.
#![no_main]

use heapscope_core::check::Scenario;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let scenario = Scenario::from_bytes(data);
    if let Err(violation) = scenario.run() {
        panic!("{violation}\n{scenario:?}");
    }
});
