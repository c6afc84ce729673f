//! # heapscope-vulkan
//!
//! heapscope's Vulkan backend on ash: real device memory under every heapscope policy.
//!
//! - [`VulkanContext`] (`context`): instance and device bring-up, device choice by `HEAPSCOPE_DEVICE`
//!   ([`select_device`]), sparse features, optional validation with a recorded message log.
//! - [`DeviceProperties`] (`properties`): the device, its memory types, heaps, limits and budget as plain data.
//! - [`DeviceMemorySource`] (`source`): `vkAllocateMemory` blocks as a [`heapscope_core::MemorySource`], so a
//!   [`heapscope_core::Heap`] runs any policy over real device memory.
//! - [`memory_types`]: the choice of a memory type for a use.
//!
//! All of heapscope's `unsafe` lives in this crate; every block carries a `// SAFETY:` comment.
#![allow(unsafe_code, reason = "the Vulkan backend: every unsafe block says why it is sound")]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod compute;
mod context;
mod error;
pub mod memory_types;
mod properties;
mod selection;
mod source;

pub use context::{ContextOptions, VALIDATION_LAYER, ValidationLog, VulkanContext};
pub use error::VulkanError;
pub use properties::{DeviceFeatures, DeviceLimits, DeviceProperties, HeapBudget, QueueFamilyInfo, SparseProperties};
pub use selection::{DeviceCandidate, VENDORS, select_device};
pub use source::{BLOCK_BUFFER_USAGE, BlockInfo, DeviceMemorySource, DeviceSourceConfig, LeakReport, LeakedBlock};

/// `ash`, re-exported so users name the same `vk` types.
pub use ash;
