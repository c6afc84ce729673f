//! # heapscope-vulkan
//!
//! heapscope's Vulkan backend on ash: real device memory under every heapscope policy.
//!
//! - [`VulkanContext`] (`context`): instance and device bring-up, device choice by `HEAPSCOPE_DEVICE`
//!   ([`select_device`]), sparse features, optional validation with a recorded message log.
//! - [`DeviceProperties`] (`properties`): the device, its memory types, heaps, limits and budget as plain data.
//! - [`DeviceMemorySource`] (`source`): `vkAllocateMemory` blocks as a [`heapscope_core::MemorySource`], so a
//!   [`heapscope_core::Heap`] runs any policy over real device memory.
//! - [`SparseBuffer`] (`sparse`): a sparse-residency buffer whose pages are bound on demand from a [`PagePool`]
//!   with `vkQueueBindSparse`, and [`measure_bind_latency`]; its bookkeeping is kept in runs of pages
//!   (`page_runs`), so binding a large range costs as much as its runs, not its pages.
//! - [`DevicePagedHeap`] (`paged`): a [`heapscope_core::PagedHeap`] whose mapped pages are bound in a sparse buffer
//!   (cached pages stay bound under [`heapscope_core::UnmapRule::UnderPressure`]); a [`heapscope_core::DeviceHeap`].
//! - [`SegmentMemory`] (`segment_memory`): device memory under PyTorch's caching allocator — each segment a
//!   dedicated `vkAllocateMemory` block, each expandable segment a sparse buffer — applying its segment events;
//!   heapscope-pytorch's `SegmentBacking`, so the emulation of a recording runs on it.
//! - [`PytorchDeviceHeap`] (`pytorch_heap`): PyTorch's caching allocator (heapscope-pytorch's `CachingHeap`) over a
//!   [`SegmentMemory`], a device refusal undone.
//! - [`compute::Dispatcher`] (`compute`): compute shaders on the compute queue, knowing nothing of what they
//!   compute — pipelines from SPIR-V, dispatches checked then recorded, each submit waited for, host-visible words for
//!   results; [`compute::BlockBuffer`] and the heaps' `compute_buffer`s hand out buffers for it. heapscope's kernels
//!   run through it from `heapscope-kernels`, which also holds the bench runner's target on this device.
//! - [`Transfer`] (`transfer`): staging copies into and out of device buffers on the compute queue.
//! - `GpuAllocatorHeap` (`gpu_allocator_heap`, feature `gpu-allocator`): gpu-allocator 0.28 as a
//!   [`heapscope_core::DeviceHeap`], a contender on the same device; `VmaHeap` (`vma_heap`, feature `vma`): VMA
//!   (vk-mem 0.5, a C++ build) the same way. Both features are on by default. Both are one generic
//!   heap, `ExternalHeap` (`external_heap`: the `DeviceHeap` written once), over an `ExternalAllocator`
//!   (`GpuAllocatorBackend`, `VmaBackend`: only what talks to the allocator), set up by one
//!   `ExternalConfig` (block size, budget cap); the heap keeps the books
//!   (`external`: slot table, blocks and their synthetic addresses, reserved / live bytes, device events,
//!   refusals) and gives out one handle type, `ExternalHandle`.
//! - [`replay_on_device`] (`contenders`): a recording through a lab `Contender` — PyTorch's allocator on
//!   device memory, a heap of device-memory blocks, `paged` on a sparse buffer sized by [`paged_virtual_bytes`],
//!   gpu-allocator or VMA — summed up in the lab's `Figures` (what `heapscope replay --vulkan` prints); a
//!   contender the device cannot run is an error with [`VulkanError::is_device_limit`].
//! - [`memory_types`]: the choice of a memory type for a use.
//! - [`wgpu_interop`] (feature `wgpu`): wgpu 30 on heapscope's own device (sparse features and all), and
//!   heapscope's device-memory blocks and sparse buffers as `wgpu::Buffer`s, binds ordered before wgpu's work;
//!   `queue_guard`: the queue entry points handed to wgpu-hal take the context's queue lock, so anyone holding the
//!   `wgpu::Queue` (egui-wgpu drawing the window) may submit and present while heapscope binds and submits.
//!
//! - `testing` (feature `testing`): a validated context for device tests, skipped where there is no Vulkan unless
//!   `HEAPSCOPE_REQUIRE_GPU=1`, and the check that the layer said nothing.
//!
//! All of heapscope's `unsafe` lives in this crate; every block carries a `// SAFETY:` comment.
#![allow(unsafe_code, reason = "the Vulkan backend: every unsafe block says why it is sound")]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod compute;
mod contenders;
mod context;
mod error;
#[cfg(any(feature = "gpu-allocator", feature = "vma"))]
mod external;
#[cfg(any(feature = "gpu-allocator", feature = "vma"))]
mod external_heap;
#[cfg(feature = "gpu-allocator")]
mod gpu_allocator_heap;
mod margins;
pub mod memory_types;
mod page_runs;
mod paged;
mod properties;
mod pytorch_heap;
#[cfg(feature = "wgpu")]
mod queue_guard;
mod segment_memory;
mod source;
mod sparse;
#[cfg(feature = "testing")]
pub mod testing;
mod transfer;
#[cfg(feature = "vma")]
mod vma_heap;
#[cfg(feature = "wgpu")]
pub mod wgpu_interop;

pub use contenders::{
    largest_sparse_buffer_bytes, paged_range_for, paged_virtual_bytes, peak_live_footprint_bytes, replay_on_device,
};
pub use context::{ContextOptions, VALIDATION_LAYER, ValidationLog, VulkanContext};
pub use error::VulkanError;
#[cfg(any(feature = "gpu-allocator", feature = "vma"))]
pub use external::ExternalHandle;
#[cfg(any(feature = "gpu-allocator", feature = "vma"))]
pub use external_heap::{ExternalAllocator, ExternalConfig, ExternalHeap, Placed};
#[cfg(feature = "gpu-allocator")]
pub use gpu_allocator_heap::{GpuAllocatorBackend, GpuAllocatorConfig, GpuAllocatorHandle, GpuAllocatorHeap};
pub use heapscope_core::selection::{DeviceCandidate, DeviceKind, VENDORS, select_device};
pub use margins::{Corruption, GuardedAllocation, GuardedHeap, MAGIC, MarginError, MarginLayout, Side};
pub use memory_types::BLOCK_BUFFER_USAGE;
pub use page_runs::PageRef;
pub use paged::{DevicePagedConfig, DevicePagedHeap, DevicePagedStats};
pub use properties::{DeviceFeatures, DeviceLimits, DeviceProperties, HeapBudget, QueueFamilyInfo, SparseProperties};
pub use pytorch_heap::PytorchDeviceHeap;
pub use segment_memory::{PytorchDeviceConfig, SegmentCounts, SegmentMemory};
pub use source::{BlockInfo, CopyStats, DeviceMemorySource, DeviceSourceConfig, LeakReport, LeakedBlock};
pub use sparse::{
    BindLatency, BindLayout, PageMove, PagePool, SparseBuffer, SparseConfig, SparseStats, measure_bind_latency,
    whole_sparse_pages,
};
pub use transfer::{BufferCopy, Transfer};
#[cfg(feature = "vma")]
pub use vma_heap::{VmaBackend, VmaConfig, VmaHandle, VmaHeap};

/// gpu-allocator, re-exported for its report types.
#[cfg(feature = "gpu-allocator")]
pub use gpu_allocator;

/// vk-mem (VMA), re-exported so users name the same types.
#[cfg(feature = "vma")]
pub use vk_mem;

/// `ash`, re-exported so users name the same `vk` types.
pub use ash;
