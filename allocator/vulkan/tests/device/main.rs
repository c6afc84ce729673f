//! The Vulkan backend's tests on a real device (lavapipe here; `HEAPSCOPE_DEVICE` picks another), validation on:
//! one test binary, each former file a module.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

mod bench_target;
mod common;
mod compute;
mod contenders;
mod context;
#[cfg(feature = "gpu-allocator")]
mod gpu_allocator;
mod margins;
mod memory_tables;
mod paged_pressure;
mod proof;
mod pytorch_heap;
mod source;
mod sparse;
#[cfg(feature = "vma")]
mod vma;
