//! The wgpu backend's tests on a real adapter (lavapipe here), wgpu's validation on: one test binary, each former
//! file a module.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

mod arena;
mod bench_target;
mod common;
mod interop;
mod matvec;
mod pytorch;
