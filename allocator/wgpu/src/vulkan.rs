//! Vulkan interop, safely (feature `vulkan`): heapscope's device memory and sparse buffers as wgpu buffers on a
//! [`WgpuDevice::from_vulkan`] device. The `unsafe` part is `heapscope_vulkan::wgpu_interop`.

use heapscope_vulkan::wgpu_interop::WgpuVulkan;
use heapscope_vulkan::{DeviceMemorySource, DevicePagedConfig, VulkanError};

pub use heapscope_vulkan::wgpu_interop::{WgpuBlockBuffer as VulkanBlockBuffer, WgpuPagedHeap as VulkanPagedHeap};

use crate::{WgpuDevice, WgpuError};

impl WgpuDevice {
    fn interop(&self) -> Result<&WgpuVulkan, WgpuError> {
        self.vulkan().ok_or_else(|| {
            WgpuError::Vulkan(VulkanError::InvalidArgument(
                "this wgpu device is not heapscope's Vulkan device (make it with WgpuDevice::from_vulkan)".into(),
            ))
        })
    }

    /// Block `handle` of `source` (a [`DeviceMemorySource`] on this device's Vulkan context) as a `wgpu::Buffer`
    /// of the block's size; the block stays borrowed while it lives.
    ///
    /// # Errors
    /// [`WgpuError::Vulkan`] for a device not made by [`WgpuDevice::from_vulkan`], a source of another context, or
    /// no such live block.
    pub fn block_buffer<'a>(&'a self, source: &'a DeviceMemorySource, handle: u64) -> Result<VulkanBlockBuffer<'a>, WgpuError> {
        Ok(VulkanBlockBuffer::new(self.interop()?, source, handle)?)
    }

    /// A paged heap (a sparse buffer with pages bound on demand, `heapscope_vulkan::DevicePagedHeap`) on this
    /// device's Vulkan context, its sparse buffer a `wgpu::Buffer`; binds are ordered before the kernels' submits.
    ///
    /// # Errors
    /// [`WgpuError::Vulkan`] for a device not made by [`WgpuDevice::from_vulkan`], or without sparse residency.
    pub fn paged_heap(&self, config: DevicePagedConfig) -> Result<VulkanPagedHeap<'_>, WgpuError> {
        Ok(VulkanPagedHeap::new(self.interop()?, config)?)
    }
}
