//! The kernels and the bench targets on real devices (lavapipe here; `HEAPSCOPE_DEVICE` picks another), validation
//! on: the Vulkan runner and target, the proofs of the Vulkan heaps with the kernels verifying every byte, and the
//! wgpu runner and target on plain wgpu and on wgpu over heapscope's Vulkan device. One test binary, each former
//! file a module.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

mod common;
mod compaction;
mod paged_pressure;
mod proof;
mod pytorch_heap;
mod vulkan_runner;
mod vulkan_target;
mod wgpu_arena;
mod wgpu_interop;
mod wgpu_matvec;
mod wgpu_pytorch;
mod wgpu_target;
