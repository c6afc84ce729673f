//! Vulkan interop, safely (feature `vulkan`): wgpu on heapscope's own Vulkan device (for the adapter wgpu would
//! choose, [`WgpuDevice::from_vulkan_adapter`]), and heapscope's device memory, sparse buffers and PyTorch segments
//! as wgpu buffers on a [`WgpuDevice::from_vulkan`] device. The `unsafe` part is `heapscope_vulkan::wgpu_interop`.

use heapscope_pytorch::CachingAllocation;
use heapscope_vulkan::wgpu_interop::WgpuVulkan;
use heapscope_vulkan::{
    ContextOptions, DeviceCandidate, DeviceMemorySource, DevicePagedConfig, PytorchDeviceHeap, VulkanContext, VulkanError,
};

pub use heapscope_vulkan::wgpu_interop::{
    WgpuBlockBuffer as VulkanBlockBuffer, WgpuPagedHeap as VulkanPagedHeap, WgpuSegmentBuffer as VulkanSegmentBuffer,
};

use crate::{DeviceOptions, WgpuDevice, WgpuError};

/// The index among `vulkan` (Vulkan's physical devices, in the loader's order: what `HEAPSCOPE_DEVICE` counts for
/// the Vulkan backend) of wgpu's adapter `adapters[chosen]`, a Vulkan adapter: the device with the same name and
/// vendor, two identical devices told apart by their order (wgpu lists a backend's devices in the loader's order).
/// `None` when `adapters[chosen]` is no Vulkan adapter or Vulkan lists no such device.
pub fn vulkan_device_index(adapters: &[wgpu::AdapterInfo], chosen: usize, vulkan: &[DeviceCandidate]) -> Option<usize> {
    let info = adapters.get(chosen).filter(|info| info.backend == wgpu::Backend::Vulkan)?;
    let same = |name: &str, vendor: u32| name == info.name && vendor == info.vendor;
    let twins_before = adapters[..chosen]
        .iter()
        .filter(|other| other.backend == wgpu::Backend::Vulkan && same(&other.name, other.vendor))
        .count();
    vulkan
        .iter()
        .enumerate()
        .filter(|(_, candidate)| same(&candidate.name, candidate.vendor_id))
        .nth(twins_before)
        .map(|(index, _)| index)
}

impl WgpuDevice {
    fn interop(&self) -> Result<&WgpuVulkan, WgpuError> {
        self.vulkan().ok_or_else(|| {
            WgpuError::Vulkan(VulkanError::InvalidArgument(
                "this wgpu device is not heapscope's Vulkan device (make it with WgpuDevice::from_vulkan)".into(),
            ))
        })
    }

    /// wgpu on heapscope's own Vulkan device for the adapter [`WgpuDevice::new`] would open with `options` (the same
    /// physical device, [`vulkan_device_index`]), validation as `options` say (heapscope's messenger records it):
    /// the device on which sparse binding reaches wgpu.
    ///
    /// # Errors
    /// [`WgpuError::NoAdapter`] / [`WgpuError::NoMatchingAdapter`]; [`WgpuError::Unsupported`] when the adapter is
    /// not a Vulkan one (Metal, DX12) or Vulkan does not list it; [`WgpuError::Vulkan`] when the context cannot be
    /// brought up for wgpu.
    pub fn from_vulkan_adapter(options: &DeviceOptions) -> Result<Self, WgpuError> {
        let (instance, adapters, chosen) = Self::enumerate(options)?;
        let infos: Vec<wgpu::AdapterInfo> = adapters.iter().map(wgpu::Adapter::get_info).collect();
        drop((adapters, instance));
        let info = infos.get(chosen).ok_or(WgpuError::NoAdapter)?;
        if info.backend != wgpu::Backend::Vulkan {
            return Err(WgpuError::Unsupported(format!(
                "{} is a {} adapter: heapscope's own device is a Vulkan one",
                info.name, info.backend
            )));
        }
        let vulkan = VulkanContext::enumerate_devices()?;
        let index = vulkan_device_index(&infos, chosen, &vulkan).ok_or_else(|| {
            WgpuError::Unsupported(format!("Vulkan lists no device named {:?} of vendor {:#x}", info.name, info.vendor))
        })?;
        Self::from_vulkan(&ContextOptions { validation: options.validation, device_selector: Some(index.to_string()) })
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

    /// The segment of `heap` (PyTorch's caching allocator on this device's Vulkan context) holding `allocation`, as
    /// a `wgpu::Buffer`: the allocation is at `allocation.offset()` in it. The heap stays borrowed while it lives;
    /// call [`PytorchDeviceHeap::wait_binds`] before kernels use pages of expandable segments bound since.
    ///
    /// # Errors
    /// [`WgpuError::Vulkan`] for a device not made by [`WgpuDevice::from_vulkan`], a heap of another context, or an
    /// allocation that is not live in it.
    pub fn segment_buffer<'a>(
        &'a self,
        heap: &'a PytorchDeviceHeap,
        allocation: &CachingAllocation,
    ) -> Result<VulkanSegmentBuffer<'a>, WgpuError> {
        Ok(VulkanSegmentBuffer::new(self.interop()?, heap, allocation)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, vendor: u32, backend: wgpu::Backend) -> wgpu::AdapterInfo {
        wgpu::AdapterInfo {
            name: name.into(),
            vendor,
            device: 0,
            device_type: wgpu::DeviceType::DiscreteGpu,
            device_pci_bus_id: String::new(),
            driver: String::new(),
            driver_info: String::new(),
            backend,
            subgroup_min_size: 4,
            subgroup_max_size: 128,
            transient_saves_memory: Some(false),
            limit_bucket: None,
        }
    }

    fn candidate(name: &str, vendor_id: u32) -> DeviceCandidate {
        DeviceCandidate { name: name.into(), vendor_id, kind: heapscope_core::selection::DeviceKind::Discrete }
    }

    /// wgpu's adapter, found among Vulkan's devices: by name and vendor, twins by their order; other backends and
    /// devices Vulkan does not list are not found.
    #[test]
    fn a_wgpu_adapter_is_found_among_vulkan_devices() {
        use wgpu::Backend::{Gl, Metal, Vulkan};
        let adapters = [
            info("NVIDIA H200", 0x10de, Vulkan),
            info("llvmpipe", 0x10005, Vulkan),
            info("NVIDIA H200", 0x10de, Vulkan),
            info("llvmpipe", 0x10005, Gl),
            info("Apple M3", 0x106b, Metal),
            info("AMD Radeon", 0x1002, Vulkan),
        ];
        let vulkan = [candidate("llvmpipe", 0x10005), candidate("NVIDIA H200", 0x10de), candidate("NVIDIA H200", 0x10de)];
        let table: [(usize, Option<usize>); 7] =
            [(0, Some(1)), (1, Some(0)), (2, Some(2)), (3, None), (4, None), (5, None), (6, None)];
        for (chosen, expected) in table {
            assert_eq!(vulkan_device_index(&adapters, chosen, &vulkan), expected, "adapter {chosen}");
        }
        assert_eq!(vulkan_device_index(&adapters, 0, &[candidate("NVIDIA H200", 0x10df)]), None, "another vendor");
    }
}
