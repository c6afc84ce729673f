//! heapscope's end-to-end tests: the built binary run as a user runs it, on the real snapshots in `assets/`; one
//! test binary, in three groups a run can pick by name (`cargo test --test end_to_end gpu::`).
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

mod common;

/// What needs no device and no display: the commands on the shared snapshots, errors, exports, the floor plan.
mod cpu {
    mod cli;
    mod floor_plan;
    mod vma_json;
}

/// What runs on a Vulkan device (lavapipe in CI): `bench`, `probe`, `replay --vulkan`.
mod gpu {
    mod bench;
    mod probe;
    mod vulkan_replay;
}

/// What opens a real window (under Xvfb in CI).
mod gui {
    mod window;
}
