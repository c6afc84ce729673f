//! Arbitrary bytes through the PyTorch snapshot reader (`heapscope_pytorch::parse_snapshot`: gzip or raw pickle,
//! both snapshot schemas): it must return a snapshot or an error, never panic, overflow the stack or balloon
//! (libFuzzer's `-rss_limit_mb` and `-timeout` catch the last two). A snapshot it returns must write back
//! (`write_snapshot`) and read again to the same snapshot (up to the numbering of its frame stacks).
//!
//! Seeds: `seeds/snapshot/` (small snapshots from `scripts/synthetic_snapshot.py` and the shared traces, and
//! hostile ones); `allocator/pytorch`'s test `fuzz_seeds_replay_through_the_reader` reads each of them, so a
//! crash found here and saved as a seed fails `cargo test`. CI runs this target for a bounded time on the
//! stable compiler (`scripts/fuzz.sh`); by hand: `scripts/fuzz.sh snapshot 600`, or
//! `cargo fuzz run snapshot seeds/snapshot` with cargo-fuzz and a nightly compiler.
#![no_main]

use heapscope_pytorch::{parse_snapshot, write_snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(snapshot) = parse_snapshot(data, "fuzz input") else { return };
    let mut written = Vec::new();
    write_snapshot(&snapshot, &mut written).expect("a snapshot read writes back");
    let again = parse_snapshot(written.as_slice(), "written back").expect("a written snapshot reads back");
    assert_eq!(
        again.with_stacks_in_use_order(),
        snapshot.with_stacks_in_use_order(),
        "a snapshot read, written and read again is the same snapshot"
    );
});
