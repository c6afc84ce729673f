//! [`PytorchDeviceHeap`]: PyTorch's CUDA caching allocator on real Vulkan memory.
//!
//! The core's [`CachingHeap`] decides everything — pools, rounding, best fit, splits and merges, segment sizes,
//! cache release, expandable segments — by PyTorch's exact rules; this heap applies what it asks of the device
//! through a [`SegmentMemory`], the way [`crate::DevicePagedHeap`] applies a `PagedHeap`'s page runs:
//!
//! - **Segments** (`cudaMalloc` / `cudaFree`): each reserved segment becomes a `vkAllocateMemory` block of its
//!   size from a [`crate::DeviceMemorySource`], dedicated to a storage buffer of its own (a segment is one allocation,
//!   like PyTorch's), freed when the allocator releases the segment. An allocation's bytes are at its offset in
//!   its segment's buffer.
//! - **Expandable segments** (`expandable_segments:True`): each segment's virtual range is a [`crate::SparseBuffer`]
//!   (PyTorch reserves 128 GiB of address space per segment; the buffer covers the first
//!   [`PytorchDeviceConfig::expandable_virtual_bytes`], which the lowest-first mapping stays within); the 2 MiB
//!   and 20 MiB pages PyTorch maps and unmaps are sparse binds and unbinds of whole runs of device pages. A
//!   segment's buffer goes when the allocator drops the segment.
//! - **Budget**: the allocator's capacity, the source's cap and each page pool's cap are the budget, so the
//!   allocator refuses first, with its own verdict. If the device still refuses (below the budget, or past an
//!   expandable buffer's virtual range), the request is undone — the block freed back to the cache and the cache
//!   emptied, as PyTorch does before it gives up — and refused with an exhaustion verdict; the allocator's state
//!   then differs from the simulated one (its cache was emptied).

use std::sync::Arc;

use heapscope_core::{Allocation, DeviceEvent, DeviceHeap, Error, Request};
use heapscope_pytorch::caching::MIN_BLOCK_BYTES;
use heapscope_pytorch::{CachingAllocation, CachingHeap};

use crate::compute::ComputeBuffer;
use crate::{PytorchDeviceConfig, SegmentMemory, VulkanContext, VulkanError};

/// PyTorch's caching allocator over device memory. See the module documentation.
#[derive(Debug)]
pub struct PytorchDeviceHeap {
    heap: CachingHeap,
    memory: SegmentMemory,
    device_refusals: u64,
    /// What the device was asked, for `DeviceHeap::take_device_events` (`None` while off).
    exported: Option<Vec<DeviceEvent>>,
}

impl PytorchDeviceHeap {
    /// An empty allocator on `context`'s device.
    ///
    /// # Errors
    /// What [`SegmentMemory::new`] returns.
    pub fn new(context: Arc<VulkanContext>, config: PytorchDeviceConfig) -> Result<Self, VulkanError> {
        let memory = SegmentMemory::new(context, &config)?;
        let mut heap = CachingHeap::new(config.conf, config.capacity_bytes);
        heap.record_device_events(true);
        Ok(Self { heap, memory, device_refusals: 0, exported: None })
    }

    /// The Vulkan context the segments live on.
    pub fn context(&self) -> &Arc<VulkanContext> {
        self.memory.context()
    }

    /// The allocator (its statistics and segments).
    pub fn caching(&self) -> &CachingHeap {
        &self.heap
    }

    /// Segments backed by device memory now: blocks, and expandable segments' sparse buffers.
    pub fn live_segments(&self) -> (usize, usize) {
        self.memory.live_segments()
    }

    /// Bytes of device memory held: the segments' blocks and the pages bound in expandable segments.
    pub fn device_bytes(&self) -> u64 {
        self.memory.device_bytes()
    }

    /// The device memory under the allocator (its counters).
    pub fn memory(&self) -> &SegmentMemory {
        &self.memory
    }

    /// Requests the device refused below the allocator's capacity.
    pub fn device_refusals(&self) -> u64 {
        self.device_refusals
    }

    /// Serves `size_bytes` and backs what the allocator reserved for it.
    ///
    /// # Errors
    /// [`VulkanError::Heap`] with an out-of-memory verdict when the allocator or the device refuses (see
    /// [`VulkanError::is_out_of_memory`]); a Vulkan failure otherwise.
    pub fn allocate(&mut self, size_bytes: u64) -> Result<CachingAllocation, VulkanError> {
        let allocation = match self.heap.allocate(size_bytes) {
            Ok(allocation) => allocation,
            Err(error) => {
                // Refused: the cache may have been released first.
                self.apply_events(false)?;
                return Err(error.into());
            }
        };
        match self.apply_events(false) {
            Ok(()) => Ok(allocation),
            Err(error) if error.is_out_of_memory() => {
                self.device_refusals += 1;
                let verdict = self.heap.undo_device_refusal(allocation)?;
                self.apply_events(true)?;
                Err(Error::OutOfMemory(Box::new(verdict)).into())
            }
            Err(error) => Err(error),
        }
    }

    /// Frees an allocation (its block goes back to the cache; nothing changes on the device).
    ///
    /// # Errors
    /// [`VulkanError::Heap`] for a double or foreign free.
    pub fn free(&mut self, allocation: CachingAllocation) -> Result<(), VulkanError> {
        self.heap.free(allocation)?;
        self.apply_events(false)
    }

    /// `torch.cuda.empty_cache()`: every wholly free segment and free expandable page goes back to the device.
    ///
    /// # Errors
    /// A failed unbind.
    pub fn empty_cache(&mut self) -> Result<(), VulkanError> {
        self.heap.empty_cache();
        self.apply_events(false)
    }

    /// The buffer holding `allocation` and the offset of its first byte there, for the kernels; `None` for an
    /// allocation of another heap or already freed segment. Call [`PytorchDeviceHeap::wait_binds`] before the
    /// kernels run on expandable segments.
    pub fn compute_target(&self, allocation: &CachingAllocation) -> Option<(ComputeBuffer<'_>, u64)> {
        let buffer = self.memory.compute_target(allocation.segment_base(), allocation.offset(), allocation.size_bytes())?;
        Some((buffer, allocation.offset()))
    }

    /// Waits until every sparse bind and unbind so far has completed.
    ///
    /// # Errors
    /// A failed `vkWaitSemaphores`.
    pub fn wait_binds(&self) -> Result<(), VulkanError> {
        self.memory.wait_binds()
    }

    /// Applies the allocator's device events: blocks for reserved segments, binds for mapped pages, and back.
    /// `undoing`: events of a request being undone after a refusal, where some of the released segments or
    /// unmapped pages were never backed (skipped).
    fn apply_events(&mut self, undoing: bool) -> Result<(), VulkanError> {
        let events = self.heap.take_device_events();
        if let Some(exported) = &mut self.exported {
            exported.extend_from_slice(&events);
        }
        self.memory.apply_events(&events, self.heap.allocator(), undoing)
    }
}

impl DeviceHeap for PytorchDeviceHeap {
    type Handle = CachingAllocation;

    fn empty_cache(&mut self) -> heapscope_core::Result<()> {
        PytorchDeviceHeap::empty_cache(self).map_err(VulkanError::into_core)
    }

    fn allocate_request(&mut self, request: Request) -> heapscope_core::Result<CachingAllocation> {
        if request.align_bytes() > MIN_BLOCK_BYTES {
            return self.heap.allocate_request(request);
        }
        self.allocate(request.size_bytes()).map_err(VulkanError::into_core)
    }

    fn free_handle(&mut self, handle: CachingAllocation) -> heapscope_core::Result<()> {
        self.free(handle).map_err(VulkanError::into_core)
    }

    fn allocation(handle: &CachingAllocation) -> &Allocation {
        handle.allocation()
    }

    fn address(handle: &CachingAllocation) -> u64 {
        handle.address()
    }

    fn block_base(handle: &CachingAllocation) -> u64 {
        handle.segment_base()
    }

    fn record_device_events(&mut self, on: bool) {
        self.exported = on.then(Vec::new);
    }

    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        self.exported.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn policy_name(&self) -> &'static str {
        self.heap.name()
    }

    fn reserved_and_live_bytes(&self) -> (u64, u64) {
        self.heap.reserved_and_live_bytes()
    }

    fn count_oom(&mut self) {
        self.heap.count_oom();
    }
}
