//! [`PytorchHeap`]: PyTorch's CUDA caching allocator on wgpu, each segment a `wgpu::Buffer` of its own.
//!
//! The core's [`CachingHeap`] decides everything by PyTorch's rules (pools, rounding, best fit, splits and merges,
//! segment sizes, cache release); this heap applies the segments it reserves and releases (`cudaMalloc` /
//! `cudaFree`) as buffers created and destroyed, the way `heapscope_vulkan::PytorchDeviceHeap` applies them as
//! dedicated `vkAllocateMemory` blocks. An allocation's bytes are at its offset in its segment's buffer, so the
//! kernels bind them like any storage buffer range (any backend wgpu reaches).
//!
//! - **Expandable segments** map pages into a reserved virtual range, which needs sparse binding: wgpu has none, so
//!   `expandable_segments:True` is refused here ([`WgpuError::Unsupported`]); on wgpu over heapscope's Vulkan device
//!   `PytorchDeviceHeap` runs them and [`WgpuDevice::segment_buffer`] hands its segments to wgpu.
//! - **Budget**: the allocator's capacity, so it refuses first with its own verdict. If wgpu still refuses a
//!   segment (out of memory below the budget, or larger than `max_buffer_size`), the request is undone — the block
//!   freed back to the cache and the cache emptied, as PyTorch does before it gives up — and refused with an
//!   exhaustion verdict; the allocator's state then differs from the simulated one. Any other failure of wgpu (a lost
//!   device) undoes the request the same way and is returned as it is; every segment event is applied even past one,
//!   so no buffer outlives its segment.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use heapscope_core::{DeviceEvent, DeviceHeap};
use heapscope_pytorch::{AllocConf, CachingAllocation, CachingHeap};

use crate::{ARENA_USAGE, WgpuDevice, WgpuError};

/// PyTorch's caching allocator over `wgpu::Buffer` segments. See the module documentation.
pub struct PytorchHeap {
    device: Arc<WgpuDevice>,
    heap: CachingHeap,
    /// Segment base (the allocator's address) -> its buffer.
    segments: HashMap<u64, wgpu::Buffer>,
    device_bytes: u64,
    device_refusals: u64,
}

impl fmt::Debug for PytorchHeap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PytorchHeap")
            .field("heap", &self.heap.name())
            .field("segments", &self.segments.len())
            .field("device_bytes", &self.device_bytes)
            .finish_non_exhaustive()
    }
}

impl PytorchHeap {
    /// An empty allocator with PyTorch's settings `conf` under `capacity_bytes` (`None`: no limit) on `device`.
    ///
    /// # Errors
    /// [`WgpuError::Unsupported`] for expandable segments (see the module documentation).
    pub fn new(device: Arc<WgpuDevice>, conf: AllocConf, capacity_bytes: Option<u64>) -> Result<Self, WgpuError> {
        if conf.expandable_segments {
            return Err(WgpuError::Unsupported(
                "expandable segments map pages into a reserved virtual range, which needs sparse binding: wgpu has none \
                 (on wgpu over heapscope's Vulkan device, heapscope_vulkan::PytorchDeviceHeap runs them)"
                    .into(),
            ));
        }
        let mut heap = CachingHeap::new(conf, capacity_bytes);
        heap.record_device_events(true);
        Ok(Self { device, heap, segments: HashMap::new(), device_bytes: 0, device_refusals: 0 })
    }

    /// The allocator (its statistics and segments).
    pub fn caching(&self) -> &CachingHeap {
        &self.heap
    }

    /// Segments backed by a buffer now.
    pub fn live_segments(&self) -> usize {
        self.segments.len()
    }

    /// Bytes of the segments' buffers.
    pub fn device_bytes(&self) -> u64 {
        self.device_bytes
    }

    /// Requests wgpu refused below the allocator's capacity.
    pub fn device_refusals(&self) -> u64 {
        self.device_refusals
    }

    /// The buffer of the segment holding `allocation` (its bytes are at `allocation.offset()` there); `None` for an
    /// allocation of another heap, or of a released segment.
    pub fn segment(&self, allocation: &CachingAllocation) -> Option<&wgpu::Buffer> {
        self.segments
            .get(&allocation.segment_base())
            .filter(|buffer| allocation.offset() + allocation.size_bytes() <= buffer.size())
    }

    /// Serves `size_bytes` and creates the buffer of a segment reserved for it.
    ///
    /// # Errors
    /// [`WgpuError::Heap`] with an out-of-memory verdict when the allocator or wgpu refuses
    /// ([`WgpuError::is_out_of_memory`]); [`WgpuError::Device`] when wgpu fails otherwise.
    pub fn allocate(&mut self, size_bytes: u64) -> Result<CachingAllocation, WgpuError> {
        let allocation = match self.heap.allocate(size_bytes) {
            Ok(allocation) => allocation,
            Err(error) => {
                // Refused: the cache may have been released first.
                self.apply_events()?;
                return Err(error.into());
            }
        };
        match self.apply_events() {
            Ok(false) => Ok(allocation),
            Ok(true) => {
                self.device_refusals += 1;
                let verdict = self.heap.undo_device_refusal(allocation)?;
                self.apply_events()?;
                Err(heapscope_core::Error::OutOfMemory(Box::new(verdict)).into())
            }
            Err(error) => {
                // wgpu failed otherwise (a lost device): the request is undone as for a refusal, so the allocator
                // holds no allocation its caller never got, and the failure is what the caller hears.
                self.heap.undo_device_refusal(allocation)?;
                let _released = self.apply_events();
                Err(error)
            }
        }
    }

    /// Frees an allocation (its block goes back to the cache; no buffer changes).
    ///
    /// # Errors
    /// [`WgpuError::Heap`] for a double or foreign free.
    pub fn free(&mut self, allocation: CachingAllocation) -> Result<(), WgpuError> {
        self.heap.free(allocation)?;
        self.apply_events().map(drop)
    }

    /// `torch.cuda.empty_cache()`: the buffer of every wholly free segment is destroyed.
    ///
    /// # Errors
    /// What applying the allocator's events returns (releasing alone does not fail).
    pub fn empty_cache(&mut self) -> Result<(), WgpuError> {
        self.heap.empty_cache();
        self.apply_events().map(drop)
    }

    /// Applies the allocator's segment events: a buffer per reserved segment, destroyed when released. Returns
    /// whether wgpu refused a segment (it then has no buffer; its release later is skipped). Every event is applied
    /// even past a failure (a later release still destroys its buffer, so no buffer outlives its segment and
    /// `device_bytes` stays true); the first failure is returned after them.
    fn apply_events(&mut self) -> Result<bool, WgpuError> {
        let mut refused = false;
        let mut failed = None;
        for event in self.heap.take_device_events() {
            match event {
                DeviceEvent::Reserved { address, size_bytes } => match self.create_segment(size_bytes) {
                    Ok(Some(buffer)) => {
                        self.device_bytes += size_bytes;
                        self.segments.insert(address, buffer);
                    }
                    Ok(None) => refused = true,
                    Err(error) => {
                        failed.get_or_insert(error);
                    }
                },
                DeviceEvent::Released { address, size_bytes } => {
                    if let Some(buffer) = self.segments.remove(&address) {
                        // wgpu frees the memory once submitted work that uses it has completed.
                        buffer.destroy();
                        self.device_bytes -= size_bytes;
                    }
                }
                DeviceEvent::Mapped { address, .. } | DeviceEvent::Unmapped { address, .. } => {
                    failed.get_or_insert_with(|| {
                        WgpuError::Unsupported(format!(
                            "the allocator mapped pages at {address:#x}: expandable segments are not supported on wgpu"
                        ))
                    });
                }
            }
        }
        match failed {
            Some(error) => Err(error),
            None => Ok(refused),
        }
    }

    /// A segment's buffer; `None` when wgpu refuses it for memory (or it exceeds `max_buffer_size`).
    fn create_segment(&self, size_bytes: u64) -> Result<Option<wgpu::Buffer>, WgpuError> {
        if size_bytes > self.device.limits().max_buffer_size {
            return Ok(None);
        }
        let descriptor = wgpu::BufferDescriptor {
            label: Some("heapscope PyTorch segment"),
            size: size_bytes,
            usage: ARENA_USAGE,
            mapped_at_creation: false,
        };
        match self.device.scoped(|| self.device.device().create_buffer(&descriptor)) {
            Ok(buffer) => Ok(Some(buffer)),
            Err(caught) if caught.out_of_memory => Ok(None),
            Err(caught) => Err(WgpuError::Device { during: "creating a PyTorch segment", message: caught.message }),
        }
    }
}
