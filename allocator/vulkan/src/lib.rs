//! # heapscope-vulkan
//!
//! heapscope's Vulkan backend on ash: real device memory under every heapscope policy.
//!
//! All of heapscope's `unsafe` lives in this crate; every block carries a `// SAFETY:` comment.
#![allow(unsafe_code, reason = "the Vulkan backend: every unsafe block says why it is sound")]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod memory_types;
