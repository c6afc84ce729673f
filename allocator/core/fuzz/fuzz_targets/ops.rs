//! Random operation sequences against every policy, checked by `heapscope_core::check` after every step.
//!
//! Run: `scripts/fuzz.sh ops 600` (the stable compiler; CI runs it for 20 s), or `cargo fuzz run ops` with
//! cargo-fuzz and a nightly compiler. A crash input replays by running the built target on the file
//! (`allocator/core/fuzz/target/<host>/release/ops FILE`).
#![no_main]

use heapscope_core::check::Scenario;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let scenario = Scenario::from_bytes(data);
    if let Err(violation) = scenario.run() {
        panic!("{violation}\n{scenario:?}");
    }
});
