//! The Vulkan backend's tests on a real device (lavapipe here; `HEAPSCOPE_DEVICE` picks another), validation on:
//! one test binary, each former file a module. What needs the kernels (the runner, the bench target, the proofs
//! that verify every byte) is tested in `heapscope-kernels`.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

mod common;
mod contenders;
mod context;
#[cfg(feature = "gpu-allocator")]
mod gpu_allocator;
mod margins;
mod memory_tables;
mod source;
mod sparse;
#[cfg(feature = "vma")]
mod vma;
