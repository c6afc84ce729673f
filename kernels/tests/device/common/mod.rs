//! Shared by the device tests: a validated Vulkan context, or a skip when the machine has no Vulkan; the wgpu
//! devices (`wgpu`).
#![allow(dead_code, unused_imports, reason = "each test module uses a part")]

pub mod wgpu;

pub use heapscope_vulkan::testing::{context, finish, sparse_context, with_context};

/// The workloads' splitmix64, a small deterministic generator.
pub use heapscope_core::rng::Rng;
