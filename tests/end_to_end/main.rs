//! heapscope's end-to-end tests: the built binary run as a user runs it, on the real snapshots in `assets/`, on
//! lavapipe and under Xvfb where a command needs them; one test binary, each former file a module.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

mod bench;
mod cli;
mod common;
mod gui_window;
mod probe;
mod vma_json;
mod vulkan_replay;
