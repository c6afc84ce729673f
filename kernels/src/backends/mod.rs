//! The kernels and the bench runner on the backends' devices. The backend crates know nothing of the kernels: the
//! Vulkan backend offers generic compute (`heapscope_vulkan::compute::Dispatcher`: pipelines from SPIR-V, checked
//! dispatches, waited submits) and buffers; the wgpu backend its device, arenas and buffers, and wgpu's own safe
//! compute API does the rest.
//!
//! - [`VulkanKernels`] (`vulkan_runner`) and [`WgpuKernels`] (`wgpu_runner`): the two [`crate::KernelRunner`]s,
//!   each only its device code.
//! - [`VulkanTarget`] (`vulkan_target`) and [`WgpuTarget`] (`wgpu_target`): the bench runner's [`crate::bench::Target`]
//!   on each device, every contender's allocations in real memory, filled, computed on and verified by the kernels.

mod vulkan_runner;
mod vulkan_target;
mod wgpu_runner;
mod wgpu_target;

pub use vulkan_runner::{VulkanKernelError, VulkanKernels};
pub use vulkan_target::{VulkanHandle, VulkanTarget, paged_config};
pub use wgpu_runner::{ArenaOps, WgpuKernelError, WgpuKernels};
pub use wgpu_target::{WgpuHandle, WgpuTarget, sparse_refusal};
