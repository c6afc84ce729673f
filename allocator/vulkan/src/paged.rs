//! [`DevicePagedHeap`]: heapscope's [`PagedHeap`] over a real [`SparseBuffer`]. The heap places allocations
//! in the buffer (TLSF by default) and says which page runs it maps and unmaps; each run becomes a sparse bind
//! or unbind, so the buffer's resident pages are exactly the heap's mapped pages — cached ones included under
//! [`UnmapRule::UnderPressure`]: those stay bound (their contents with them) until the heap unmaps them under
//! pressure, in the same allocate call that then binds what the request needs (unbinds first, so the pool has
//! the pages back).
//!
//! It is a [`DeviceHeap`] too, so a trace replays through it like through any heap
//! ([`heapscope_lab::driver::replay_device_heap`]): the pool running dry is an out-of-memory verdict, other
//! Vulkan failures are [`heapscope_core::Error::Source`] naming them (a bind refused), or
//! [`heapscope_core::Error::DeviceLimit`] where the device cannot do it at all (too many mappings).

use std::sync::Arc;

use ash::vk;
use heapscope_core::compaction::{Algorithm, Budget};
use heapscope_core::{
    Allocation, DeviceEvent, DeviceHeap, OomCause, OomVerdict, PagedCompaction, PagedConfig, PagedHeap, PagedStats, PolicyKind,
    Request, UnmapRule, moved_indices,
};

use crate::compute::ComputeBuffer;
use crate::sparse::{PageMove, SparseBuffer, SparseConfig, SparseStats};
use crate::{VulkanContext, VulkanError};

/// A run of pages in the buffer: `(offset, size_bytes)`.
type Run = (u64, u64);

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
    /// At most this many live sparse mappings; `None`: the device's default ([`SparseConfig::max_live_mappings`]).
    pub max_live_mappings: Option<u64>,
    /// When pages no allocation touches are unbound.
    pub unmap: UnmapRule,
    /// The heap's page size, a multiple of the sparse page size (a larger page maps whole runs of sparse pages);
    /// `None`: the sparse page size.
    pub page_bytes: Option<u64>,
}

impl DevicePagedConfig {
    /// TLSF over `virtual_bytes`, capped at `capacity_bytes`, the sparse buffer's default chunking and limit,
    /// eager unbinding.
    pub fn new(virtual_bytes: u64, capacity_bytes: Option<u64>) -> Self {
        Self {
            virtual_bytes,
            capacity_bytes,
            policy: PolicyKind::Tlsf,
            pages_per_chunk: SparseConfig::DEFAULT_PAGES_PER_CHUNK,
            max_live_mappings: None,
            unmap: UnmapRule::Eager,
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
    /// The device events for [`DeviceHeap::take_device_events`], while recording (the heap's own log feeds the
    /// binds).
    events: Option<Vec<DeviceEvent>>,
}

impl DevicePagedHeap {
    /// A heap over a new sparse buffer of `config.virtual_bytes`, pages of the buffer's sparse page size (or of
    /// `config.page_bytes`, a multiple of it).
    ///
    /// # Errors
    /// What [`SparseBuffer::new`] returns; [`VulkanError::InvalidArgument`] for a page size that is not a
    /// multiple of the sparse page size or is larger than the virtual range; [`VulkanError::Heap`] for settings the heap refuses.
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
        if page_bytes > config.virtual_bytes {
            // Checked here, before the range is cut to whole pages (to 0 B, which the heap's error would name).
            return Err(VulkanError::InvalidArgument(format!(
                "page size {page_bytes} B: must be no larger than the virtual range ({} B)",
                config.virtual_bytes
            )));
        }
        let mut paged = PagedConfig::new(config.capacity_bytes);
        paged.policy = config.policy;
        paged.unmap = config.unmap;
        paged.page_bytes = page_bytes;
        paged.virtual_bytes = config.virtual_bytes / page_bytes * page_bytes;
        // The heap refuses before the pool runs dry: its capacity is the pool's, in whole pages.
        paged.capacity_bytes = config.capacity_bytes.map(|capacity| capacity / page_bytes * page_bytes);
        let mut heap = PagedHeap::new(paged)?;
        heap.record_device_events(true);
        Ok(Self { heap, sparse, events: None })
    }

    /// `empty_cache()`: the heap unmaps its cached pages and the buffer unbinds them.
    ///
    /// # Errors
    /// What [`SparseBuffer::unbind`] returns.
    pub fn empty_cache(&mut self) -> Result<(), VulkanError> {
        self.heap.empty_cache();
        let (_, unmapped) = self.take_runs();
        if !unmapped.is_empty() {
            self.sparse.unbind(&unmapped)?;
        }
        Ok(())
    }

    /// Serves `request` and binds the pages it newly needs (unbinding the cached pages first when the heap
    /// released them under pressure); the allocation's offsets are offsets in [`DevicePagedHeap::buffer`].
    ///
    /// # Errors
    /// [`VulkanError::Heap`] with an out-of-memory verdict when the heap has no room or capacity (see
    /// [`VulkanError::is_out_of_memory`]); what [`SparseBuffer::bind`] or [`SparseBuffer::unbind`] return, after
    /// which the allocation is undone: the heap keeps no page the buffer lacks (its counters aside; after a
    /// failed unbind — a lost device — the buffer may still hold cached pages the heap released).
    pub fn allocate(&mut self, request: Request) -> Result<Allocation, VulkanError> {
        let result = self.heap.allocate(request);
        let (mapped, unmapped) = self.take_runs();
        // The cache released under pressure goes first, even when the request is refused after all.
        let unbound = if unmapped.is_empty() { Ok(0) } else { self.sparse.unbind(&unmapped) };
        let allocation = match result {
            Ok(allocation) => allocation,
            Err(refused) => {
                unbound?;
                return Err(refused.into());
            }
        };
        let bound = unbound.and_then(|_| if mapped.is_empty() { Ok(0) } else { self.sparse.bind(&mapped) });
        if let Err(error) = bound {
            // The failed batch changed nothing on the device: the heap forgets the pages it could not bind.
            self.heap.undo_allocate(allocation, &mapped)?;
            return Err(error);
        }
        Ok(allocation)
    }

    /// Frees `allocation` and unbinds the pages no live allocation touches any more (under
    /// [`UnmapRule::UnderPressure`] they stay bound, cached).
    ///
    /// # Errors
    /// [`VulkanError::Heap`] for a double or foreign free (nothing changes then); a failed unbind.
    pub fn free(&mut self, allocation: Allocation) -> Result<(), VulkanError> {
        self.heap.free(allocation)?;
        let (mapped, unmapped) = self.take_runs();
        debug_assert!(mapped.is_empty(), "a free maps nothing");
        if !unmapped.is_empty() {
            self.sparse.unbind(&unmapped)?;
        }
        Ok(())
    }

    /// Moves the clusters of `movable` allocations down the buffer to gather its free space ([`PagedHeap::compact`])
    /// and rebinds their physical pages at the new places in one batch ([`SparseBuffer::remap_runs`]): the contents
    /// move with the pages, nothing is copied. Cached pages the heap let go first are unbound first.
    ///
    /// # Errors
    /// [`VulkanError::Heap`] when the heap could not re-place an allocation; a failed unbind or remap (the heap has
    /// moved the allocations then, and their contents are not defined).
    pub fn compact(
        &mut self,
        movable: &[(Allocation, Request)],
        algorithm: Algorithm,
        budget: Budget,
    ) -> Result<PagedCompaction, VulkanError> {
        let compaction = self.heap.compact(movable, algorithm, budget)?;
        // The heap's log says the same as an unmap and a map per cluster: kept for observers, not bound again.
        let events = self.heap.take_device_events();
        if let Some(log) = &mut self.events {
            log.extend(events);
        }
        if !compaction.cache_released.is_empty() {
            self.sparse.unbind(&compaction.cache_released)?;
        }
        let moves: Vec<PageMove> = compaction
            .remaps
            .iter()
            .map(|remap| PageMove { from_offset: remap.from_offset, to_offset: remap.to_offset, size_bytes: remap.size_bytes })
            .collect();
        if !moves.is_empty() {
            self.sparse.remap_runs(&moves)?;
        }
        Ok(compaction)
    }

    /// The runs the heap mapped and unmapped since the last call, as `(offset, size_bytes)`, kept for
    /// [`DeviceHeap::take_device_events`] while recording.
    fn take_runs(&mut self) -> (Vec<Run>, Vec<Run>) {
        let mut mapped = Vec::new();
        let mut unmapped = Vec::new();
        let events = self.heap.take_device_events();
        for &event in &events {
            match event {
                DeviceEvent::Mapped { address, size_bytes } => mapped.push((address, size_bytes)),
                DeviceEvent::Unmapped { address, size_bytes } => unmapped.push((address, size_bytes)),
                DeviceEvent::Reserved { .. } | DeviceEvent::Released { .. } => {}
            }
        }
        if let Some(log) = &mut self.events {
            log.extend(events);
        }
        (mapped, unmapped)
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

impl DevicePagedHeap {
    /// The verdict for a request the pool could not give pages for (the device refused a chunk).
    fn pool_verdict(&mut self, request: Request, requested_pages: u64) -> OomVerdict {
        self.heap.count_refused();
        let stats = self.heap.stats();
        let page_bytes = self.sparse.page_bytes();
        OomVerdict {
            policy: "paged",
            requested_bytes: request.size_bytes(),
            needed_bytes: requested_pages.saturating_mul(page_bytes),
            align_bytes: request.align_bytes(),
            reserved_bytes: stats.mapped_bytes,
            live_bytes: stats.live_bytes,
            padding_bytes: 0,
            free_in_blocks_bytes: 0,
            largest_free_run_bytes: 0,
            retired_bytes: 0,
            unreserved_bytes: 0,
            capacity_bytes: self.heap.config().capacity_bytes,
            virtual_range_bytes: None,
            new_block_bytes: None,
            cause: OomCause::Exhaustion,
        }
    }
}

impl DeviceHeap for DevicePagedHeap {
    type Handle = Allocation;

    fn empty_cache(&mut self) -> heapscope_core::Result<()> {
        DevicePagedHeap::empty_cache(self).map_err(VulkanError::into_core)
    }

    fn allocate_request(&mut self, request: Request) -> heapscope_core::Result<Allocation> {
        match self.allocate(request) {
            Ok(allocation) => Ok(allocation),
            Err(VulkanError::OutOfPages { requested_pages, .. }) => {
                Err(heapscope_core::Error::OutOfMemory(Box::new(self.pool_verdict(request, requested_pages))))
            }
            Err(other) => Err(other.into_core()),
        }
    }

    fn free_handle(&mut self, handle: Allocation) -> heapscope_core::Result<()> {
        self.free(handle).map_err(VulkanError::into_core)
    }

    fn allocation(handle: &Allocation) -> &Allocation {
        handle
    }

    fn address(handle: &Allocation) -> u64 {
        handle.offset()
    }

    fn block_base(_handle: &Allocation) -> u64 {
        0
    }

    fn record_device_events(&mut self, on: bool) {
        self.events = on.then(Vec::new);
    }

    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn policy_name(&self) -> &'static str {
        "paged"
    }

    fn reserved_and_live_bytes(&self) -> (u64, u64) {
        (self.heap.stats().mapped_bytes, self.heap.stats().live_bytes)
    }

    fn count_oom(&mut self) {
        self.heap.count_refused();
    }

    fn compact(
        &mut self,
        movable: &[(Allocation, Request)],
        algorithm: Algorithm,
        budget: Budget,
    ) -> heapscope_core::Result<Vec<(usize, Allocation)>> {
        let compaction = DevicePagedHeap::compact(self, movable, algorithm, budget).map_err(VulkanError::into_core)?;
        Ok(moved_indices(movable, compaction.moves))
    }

    fn moves_by_remap(&self) -> bool {
        true
    }
}
