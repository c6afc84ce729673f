//! # heapscope-wgpu
//!
//! heapscope's wgpu 30 backend: every heapscope policy inside `wgpu::Buffer` arenas, PyTorch's caching allocator
//! over wgpu buffers, and Vulkan interop with heapscope's own device. A backend only: what runs on its buffers (the
//! WGSL kernels, the bench runner's target) is `heapscope-kernels`'.
//!
//! ## Design
//!
//! - **Device** ([`WgpuDevice`], `device`): the adapter `HEAPSCOPE_DEVICE` names (index, vendor or name
//!   substring: the rules every backend shares, [`heapscope_core::selection::select_device`], on wgpu's adapter list), else the
//!   first discrete GPU; the device asks for all the adapter's limits. Every error wgpu reports outside an error
//!   scope is recorded ([`ErrorLog`], `Device::on_uncaptured_error`); heapscope's own operations run inside error
//!   scopes and return wgpu's errors as [`WgpuError::Device`]. Futures are blocked on with pollster.
//! - **Arenas** ([`ArenaSource`], [`ArenaHeap`], `arena`): wgpu exposes no raw memory, so a heap block is a large
//!   `wgpu::Buffer` (storage, copies both ways) and the core [`heapscope_core::Heap`] runs any policy inside the
//!   arenas, with its block-size, dedicated-block, release and budget rules. Allocations are aligned to
//!   `min_storage_buffer_offset_alignment` at least and never exceed the storage binding limit, so each one is a
//!   valid [`wgpu::BufferBinding`] (arena, offset, size rounded to 4) and [`wgpu::BufferSlice`]. Arenas are at
//!   most `max_buffer_size`; an arena released by the heap is destroyed.
//! - **Buffers for compute** ([`KernelBuffer`], `kernel_buffer`): any `wgpu::Buffer` an arena, a segment or an
//!   interop wrapper hands out, compared by identity; the kernels crate's wgpu runner binds ranges of them.
//! - **Vulkan interop** (feature `vulkan`, on by default; `vulkan` module): [`WgpuDevice::from_vulkan`] puts wgpu on
//!   heapscope's own ash device, created with wgpu-hal's extensions and features plus the sparse ones; then
//!   [`WgpuDevice::block_buffer`] wraps a `DeviceMemorySource` block and [`WgpuDevice::paged_heap`] a sparse
//!   `DevicePagedHeap` as `wgpu::Buffer`s, so the same kernels run on arena, device-memory and paged allocations.
//!   wgpu's queue operations take the Vulkan context's queue lock (one queue may serve compute and sparse binding),
//!   whoever calls them; sparse
//!   binds are ordered before wgpu's submissions by their timeline semaphore, and unbinds wait for wgpu's work.
//!   [`WgpuDevice::segment_buffer`] does the same for a `heapscope_vulkan::PytorchDeviceHeap` segment (a dedicated
//!   block, or an expandable segment's sparse buffer). [`WgpuDevice::from_vulkan_adapter`] opens heapscope's device
//!   for the very adapter [`WgpuDevice::new`] would open ([`vulkan_device_index`]: name, vendor, order).
//!   All the `unsafe` is in `heapscope_vulkan::wgpu_interop`; this crate has none.
//! - **PyTorch on wgpu** ([`PytorchHeap`], `pytorch`): heapscope-pytorch's `CachingHeap` (PyTorch's caching allocator,
//!   emulated exactly) with each segment it reserves a `wgpu::Buffer` of its own, destroyed when released; a
//!   refusal by wgpu below the budget is undone and becomes an exhaustion verdict. Expandable segments need sparse
//!   binding and are refused ([`WgpuError::Unsupported`]).
//! - **wgpu-hal's log** ([`hal_log`]): on plain wgpu the validation layer speaks only through `log`; `hal_log`
//!   collects wgpu-hal's warnings and errors and hands back those of the device's backend, so the tests and
//!   `heapscope bench --backend wgpu` fail on them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod arena;
mod device;
mod error;
pub mod hal_log;
mod kernel_buffer;
mod pytorch;
#[cfg(feature = "vulkan")]
mod vulkan;

pub use arena::{ARENA_USAGE, ArenaAllocation, ArenaConfig, ArenaHeap, ArenaSource};
pub use device::{DeviceOptions, ErrorLog, WgpuDevice, select_adapter};
pub use error::WgpuError;
pub use hal_log::foreign_backend_log;
pub use kernel_buffer::KernelBuffer;
pub use pytorch::PytorchHeap;
#[cfg(feature = "vulkan")]
pub use vulkan::{VulkanBlockBuffer, VulkanPagedHeap, VulkanSegmentBuffer, vulkan_device_index};

/// wgpu, re-exported so users name the same types.
pub use wgpu;
