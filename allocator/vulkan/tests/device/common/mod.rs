//! Shared by the integration tests: a validated context, or a skip when the machine has no Vulkan.
#![allow(dead_code, unused_imports, reason = "each test binary uses a part")]

pub mod bind_cost;
#[cfg(any(feature = "gpu-allocator", feature = "vma"))]
pub mod external;

pub use heapscope_vulkan::testing::{context, finish, sparse_context, with_context};

/// Compiles only where `T` may move to another thread.
pub fn assert_send<T: Send>() {}

/// splitmix64, a small deterministic generator.
pub use heapscope_core::rng::Rng;
