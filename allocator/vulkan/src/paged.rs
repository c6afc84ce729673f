//! [`DevicePagedHeap`]: heapscope's [`PagedHeap`] over a real [`SparseBuffer`]. The heap places allocations
//! in the buffer (TLSF by default) and says which page runs it maps and unmaps; each run becomes a sparse bind
//! or unbind, so the buffer's resident pages are exactly the heap's mapped pages.

use std::sync::Arc;

use ash::vk;
use heapscope_core::{Allocation, DeviceEvent, PagedConfig, PagedHeap, PagedStats, PolicyKind, Request};

use crate::compute::ComputeBuffer;
use crate::sparse::{SparseBuffer, SparseConfig, SparseStats};
use crate::{VulkanContext, VulkanError};

/// How a [`DevicePagedHeap`] is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePagedConfig {
    /// The sparse buffer's size: the heap's virtual range.
    pub virtual_bytes: u64,
    /// The most bytes of pages bound at once (heap capacity and pool cap); `None`: no cap.
    pub capacity_bytes: Option<u64>,
    /// The policy placing allocations.
    pub policy: PolicyKind,
    /// Pages per memory chunk of the pool.
    pub pages_per_chunk: u32,
    /// At most this many live sparse mappings.
    pub max_live_mappings: u64,
    /// The heap's page size, a multiple of the sparse page size (a larger page maps whole runs of sparse pages);
    /// `None`: the sparse page size.
    pub page_bytes: Option<u64>,
}

impl DevicePagedConfig {
    /// TLSF over `virtual_bytes`, capped at `capacity_bytes`, the sparse buffer's default chunking and limit.
    pub fn new(virtual_bytes: u64, capacity_bytes: Option<u64>) -> Self {
        Self {
            virtual_bytes,
            capacity_bytes,
            policy: PolicyKind::Tlsf,
            pages_per_chunk: SparseConfig::DEFAULT_PAGES_PER_CHUNK,
            max_live_mappings: SparseConfig::DEFAULT_MAX_LIVE_MAPPINGS,
            page_bytes: None,
        }
    }
}

/// Counters of a [`DevicePagedHeap`]: the heap's and the sparse buffer's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicePagedStats {
    /// The heap's counters (map and unmap calls are the runs bound and unbound).
    pub heap: PagedStats,
    /// The sparse buffer's counters (batches, bind entries, pages bound, live mappings).
    pub sparse: SparseStats,
}

/// A paged heap whose pages are bound in a sparse buffer. See the module documentation.
#[derive(Debug)]
pub struct DevicePagedHeap {
    heap: PagedHeap,
    sparse: SparseBuffer,
}

impl DevicePagedHeap {
    /// A heap over a new sparse buffer of `config.virtual_bytes`, pages of the buffer's sparse page size (or of
    /// `config.page_bytes`, a multiple of it).
    ///
    /// # Errors
    /// What [`SparseBuffer::new`] returns; [`VulkanError::InvalidArgument`] for a page size that is not a
    /// multiple of the sparse page size; [`VulkanError::Heap`] for settings the heap refuses.
    pub fn new(context: Arc<VulkanContext>, config: DevicePagedConfig) -> Result<Self, VulkanError> {
        let sparse = SparseBuffer::new(
            context,
            SparseConfig {
                size_bytes: config.virtual_bytes,
                pool_capacity_bytes: config.capacity_bytes,
                pages_per_chunk: config.pages_per_chunk,
                max_live_mappings: config.max_live_mappings,
            },
        )?;
        let sparse_page_bytes = sparse.page_bytes();
        let page_bytes = config.page_bytes.unwrap_or(sparse_page_bytes);
        if page_bytes == 0 || !page_bytes.is_multiple_of(sparse_page_bytes) {
            return Err(VulkanError::InvalidArgument(format!(
                "page size {page_bytes} B: must be a multiple of the sparse page size ({sparse_page_bytes} B)"
            )));
        }
        let mut paged = PagedConfig::new(config.capacity_bytes);
        paged.policy = config.policy;
        paged.page_bytes = page_bytes;
        paged.virtual_bytes = config.virtual_bytes / page_bytes * page_bytes;
        // The heap refuses before the pool runs dry: its capacity is the pool's, in whole pages.
        paged.capacity_bytes = config.capacity_bytes.map(|capacity| capacity / page_bytes * page_bytes);
        let mut heap = PagedHeap::new(paged)?;
        heap.record_device_events(true);
        Ok(Self { heap, sparse })
    }

    /// Serves `request` and binds the pages it newly needs; the allocation's offsets are offsets in
    /// [`DevicePagedHeap::buffer`].
    ///
    /// # Errors
    /// [`VulkanError::Heap`] with an out-of-memory verdict when the heap has no room or capacity (see
    /// [`VulkanError::is_out_of_memory`]); what [`SparseBuffer::bind`] returns, after which the allocation is
    /// undone and the heap is as before (its counters aside).
    pub fn allocate(&mut self, request: Request) -> Result<Allocation, VulkanError> {
        let allocation = self.heap.allocate(request)?;
        if let Err(error) = self.apply_events() {
            // The failed bind changed nothing on the device: undo the allocation and drop its unmap events.
            self.heap.free(allocation)?;
            let _ = self.heap.take_device_events();
            return Err(error);
        }
        Ok(allocation)
    }

    /// Frees `allocation` and unbinds the pages no live allocation touches any more.
    ///
    /// # Errors
    /// [`VulkanError::Heap`] for a double or foreign free (nothing changes then); a failed unbind.
    pub fn free(&mut self, allocation: Allocation) -> Result<(), VulkanError> {
        self.heap.free(allocation)?;
        self.apply_events()
    }

    /// Binds and unbinds the runs the heap recorded, each kind in one batch.
    fn apply_events(&mut self) -> Result<(), VulkanError> {
        let mut mapped = Vec::new();
        let mut unmapped = Vec::new();
        for event in self.heap.take_device_events() {
            match event {
                DeviceEvent::Mapped { address, size_bytes } => mapped.push((address, size_bytes)),
                DeviceEvent::Unmapped { address, size_bytes } => unmapped.push((address, size_bytes)),
                DeviceEvent::Reserved { .. } | DeviceEvent::Released { .. } => {}
            }
        }
        // A paged heap maps only on allocate and unmaps only on free: one of the lists is empty.
        if !unmapped.is_empty() {
            self.sparse.unbind(&unmapped)?;
        }
        if !mapped.is_empty() {
            self.sparse.bind(&mapped)?;
        }
        Ok(())
    }

    /// The sparse buffer holding the allocations.
    pub fn buffer(&self) -> vk::Buffer {
        self.sparse.buffer()
    }

    /// The sparse buffer as a kernel target: an allocation's bytes are at its offset. Only the ranges of live
    /// allocations are resident; call [`DevicePagedHeap::wait_binds`] before the kernels run.
    pub fn compute_buffer(&self) -> ComputeBuffer<'_> {
        ComputeBuffer::borrowed(self.sparse.context(), self.sparse.buffer(), self.sparse.size_bytes())
    }

    /// The sparse buffer (its page size, pool, timeline).
    pub fn sparse(&self) -> &SparseBuffer {
        &self.sparse
    }

    /// The heap (its layout, mapped runs, report).
    pub fn heap(&self) -> &PagedHeap {
        &self.heap
    }

    /// Waits on the host until every bind and unbind so far has completed: before copies touch the buffer.
    ///
    /// # Errors
    /// A failed `vkWaitSemaphores`.
    pub fn wait_binds(&self) -> Result<(), VulkanError> {
        self.sparse.wait_binds()
    }

    /// The heap's and the buffer's counters.
    pub fn stats(&self) -> DevicePagedStats {
        DevicePagedStats { heap: self.heap.stats().clone(), sparse: self.sparse.stats() }
    }
}
