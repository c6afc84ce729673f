//! [`SparseBuffer`]: one sparse-residency `VkBuffer` whose pages are bound on demand to physical pages of a
//! [`PagePool`] with `vkQueueBindSparse`.
//!
//! - The page size is the alignment of the buffer's memory requirements (4 KiB on lavapipe, usually 64 KiB on
//!   discrete GPUs), never a constant.
//! - Physical pages are carved from `VkDeviceMemory` chunks of [`SparseConfig::pages_per_chunk`] pages; free
//!   pages are handed out lowest first, so pages taken together are usually contiguous in one chunk.
//! - A bind or unbind is one `vkQueueBindSparse` batch. Pages contiguous in the buffer *and* in one chunk are
//!   coalesced into one `VkSparseMemoryBind` (a "bind entry"); an unbind needs only buffer contiguity.
//! - Batches are ordered by a timeline semaphore: batch `n` waits for value `n - 1` and signals `n`. The host
//!   waits for the last value ([`SparseBuffer::wait_binds`]) before reading or writing through other queues.
//! - Every live mapping (a maximal run of pages contiguous in the buffer and in one chunk) may cost the driver a
//!   host mapping (lavapipe, a CPU device: an `mmap`, bounded by `vm.max_map_count`), and so may every memory chunk;
//!   binds that would leave more than [`SparseConfig::max_live_mappings`] of both together live fail with
//!   [`VulkanError::TooManyMappings`], touching nothing. By default the limit holds on a CPU device only: a GPU's
//!   page tables map no host memory per bind. Unbinds are not refused (the heap has freed what they
//!   unbind): pages unbound out of the middle of a mapping split it, so frees can pass the limit.
//! - The bookkeeping (which physical pages back which buffer pages, which pages of the pool are free) is kept in
//!   runs (`page_runs`): an operation costs in proportion to the runs it touches, not to its pages.
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use ash::vk;

use crate::memory_types::BLOCK_BUFFER_USAGE;
use crate::memory_types::MemoryUsage;
use crate::page_runs::{BoundRuns, FreeRuns, PageRef, PhysicalRun, pair};
use crate::{VulkanContext, VulkanError};

/// `limit_bytes` (a device's `sparseAddressSpaceSize` or `maxBufferSize`, or a share of them) rounded down to whole
/// sparse pages of any device: a multiple of 64 KiB, the sparse page of discrete GPUs, which lavapipe's 4 KiB divides.
/// RADV reports both limits as 2^32 - 4: a buffer of that size rounds up to 2^32 B of pages, past the address space.
pub fn whole_sparse_pages(limit_bytes: u64) -> u64 {
    const GRAIN_BYTES: u64 = 64 << 10;
    limit_bytes / GRAIN_BYTES * GRAIN_BYTES
}

/// How a [`SparseBuffer`] is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparseConfig {
    /// The buffer's size (rounded up to whole pages); at most `sparseAddressSpaceSize`.
    pub size_bytes: u64,
    /// At most this many bytes of physical pages (a multiple of the page size is used); `None`: no cap.
    pub pool_capacity_bytes: Option<u64>,
    /// Pages per `VkDeviceMemory` chunk of the pool.
    pub pages_per_chunk: u32,
    /// At most this many live mappings plus memory chunks (see the module documentation); `None`: the device's
    /// default, [`SparseConfig::CPU_MAX_LIVE_MAPPINGS`] on a CPU device (lavapipe), no limit on a GPU.
    pub max_live_mappings: Option<u64>,
}

impl SparseConfig {
    /// Pages per chunk by default.
    pub const DEFAULT_PAGES_PER_CHUNK: u32 = 64;
    /// The limit of live mappings on a CPU device (lavapipe maps each with `mmap`): well below Linux's default
    /// `vm.max_map_count` (65530), which the whole process shares.
    pub const CPU_MAX_LIVE_MAPPINGS: u64 = 16_384;

    /// A buffer of `size_bytes`, uncapped pool, 64 pages per chunk, the device's mapping limit.
    pub fn new(size_bytes: u64) -> Self {
        Self { size_bytes, pool_capacity_bytes: None, pages_per_chunk: Self::DEFAULT_PAGES_PER_CHUNK, max_live_mappings: None }
    }

    /// The same with a pool capacity.
    #[must_use]
    pub fn with_pool_capacity(self, pool_capacity_bytes: Option<u64>) -> Self {
        Self { pool_capacity_bytes, ..self }
    }
}

/// Physical pages carved from `VkDeviceMemory` chunks of one memory type, with free runs and a capacity cap.
pub struct PagePool {
    context: Arc<VulkanContext>,
    memory_type_index: u32,
    page_bytes: u64,
    pages_per_chunk: u32,
    capacity_pages: u64,
    chunks: Vec<vk::DeviceMemory>,
    /// Pages of the chunks, allocated so far.
    allocated_pages: u64,
    free: FreeRuns,
}

impl fmt::Debug for PagePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PagePool")
            .field("memory_type_index", &self.memory_type_index)
            .field("page_bytes", &self.page_bytes)
            .field("pages_per_chunk", &self.pages_per_chunk)
            .field("capacity_pages", &self.capacity_pages)
            .field("chunks", &self.chunks.len())
            .field("free_pages", &self.free.pages())
            .finish_non_exhaustive()
    }
}

impl PagePool {
    /// Pages in use (taken and not given back).
    pub fn used_pages(&self) -> u64 {
        self.allocated_pages - self.free.pages()
    }

    /// Chunks allocated so far.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Pages that can still be taken: free ones plus those the cap allows to allocate.
    pub fn available_pages(&self) -> u64 {
        self.free.pages() + (self.capacity_pages - self.allocated_pages)
    }

    /// The memory of a chunk.
    fn memory(&self, chunk: u32) -> vk::DeviceMemory {
        self.chunks[chunk as usize]
    }

    /// Takes `count` pages, lowest first, as runs of one chunk, allocating chunks as needed; all or nothing.
    fn take(&mut self, count: u64) -> Result<Vec<PhysicalRun>, VulkanError> {
        let out_of_pages = |pool: &Self| VulkanError::OutOfPages {
            requested_pages: count,
            available_pages: pool.available_pages(),
            page_bytes: pool.page_bytes,
            capacity_bytes: pool.capacity_pages.saturating_mul(pool.page_bytes),
        };
        if count > self.available_pages() {
            return Err(out_of_pages(self));
        }
        while self.free.pages() < count {
            let pages = u64::from(self.pages_per_chunk).min(self.capacity_pages - self.allocated_pages);
            let info = vk::MemoryAllocateInfo::default()
                .allocation_size(pages * self.page_bytes)
                .memory_type_index(self.memory_type_index);
            // Each chunk is an allocation of the device's `maxMemoryAllocationCount`, as every source's block is.
            self.context.take_allocation_slot().map_err(VulkanError::Unsupported)?;
            // SAFETY: a valid allocate info for a memory type of this device; the memory is freed on drop.
            let memory = match unsafe { self.context.device().allocate_memory(&info, None) } {
                Ok(memory) => memory,
                Err(result) => {
                    self.context.give_back_allocation_slot();
                    return Err(match result {
                        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => out_of_pages(self),
                        result => VulkanError::Vk { call: "vkAllocateMemory", result },
                    });
                }
            };
            let chunk =
                u32::try_from(self.chunks.len()).map_err(|_| VulkanError::InvalidArgument("more than u32::MAX chunks".into()))?;
            self.chunks.push(memory);
            self.allocated_pages += pages;
            // `pages` is at most `pages_per_chunk`, a u32.
            self.free.add(PhysicalRun { first: PageRef { chunk, page: 0 }, pages: pages as u32 });
        }
        self.free.take(count).ok_or_else(|| out_of_pages(self))
    }

    /// Gives pages back.
    fn give_back(&mut self, runs: impl IntoIterator<Item = PhysicalRun>) {
        for run in runs {
            self.free.add(run);
        }
    }
}

impl Drop for PagePool {
    fn drop(&mut self) {
        for &memory in &self.chunks {
            // SAFETY: the buffer using these pages was destroyed first (`SparseBuffer::drop`) after the queue
            // went idle; the memory is ours.
            unsafe { self.context.device().free_memory(memory, None) };
            self.context.give_back_allocation_slot();
        }
    }
}

/// Counters of a [`SparseBuffer`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SparseStats {
    /// `vkQueueBindSparse` batches submitted.
    pub batches: u64,
    /// `VkSparseMemoryBind` entries binding memory.
    pub bind_entries: u64,
    /// `VkSparseMemoryBind` entries unbinding (memory null).
    pub unbind_entries: u64,
    /// Pages bound now.
    pub pages_bound: u64,
    /// The most pages bound at once.
    pub peak_pages_bound: u64,
    /// Live mappings now (runs of pages contiguous in the buffer and in one chunk).
    pub live_mappings: u64,
    /// The most live mappings at once.
    pub peak_live_mappings: u64,
    /// Pages moved to another place in the buffer with their contents ([`SparseBuffer::remap_runs`]).
    pub pages_remapped: u64,
}

/// Pages to move within a [`SparseBuffer`]: the physical pages bound at `from_offset .. from_offset + size_bytes`
/// go to `to_offset ..` (offsets and size whole pages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageMove {
    /// The first source page's offset in the buffer.
    pub from_offset: u64,
    /// The first destination page's offset.
    pub to_offset: u64,
    /// Bytes.
    pub size_bytes: u64,
}

/// A sparse-residency buffer with a page pool. See the module documentation.
pub struct SparseBuffer {
    context: Arc<VulkanContext>,
    queue: vk::Queue,
    buffer: vk::Buffer,
    size_bytes: u64,
    /// Bytes of the device's `sparseAddressSpaceSize` it holds.
    space_bytes: u64,
    page_bytes: u64,
    pool: PagePool,
    /// The physical pages behind the bound buffer pages, in runs (the live mappings).
    bound: BoundRuns,
    semaphore: vk::Semaphore,
    timeline_value: u64,
    max_live_mappings: u64,
    stats: SparseStats,
}

impl fmt::Debug for SparseBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SparseBuffer")
            .field("size_bytes", &self.size_bytes)
            .field("page_bytes", &self.page_bytes)
            .field("pool", &self.pool)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl SparseBuffer {
    /// A sparse buffer of `config.size_bytes` (usage storage and transfers both ways) on `context`'s device.
    ///
    /// # Errors
    /// [`VulkanError::Unsupported`] without `sparseBinding`, `sparseResidencyBuffer` or `timelineSemaphore`, or
    /// without a device-local memory type for the buffer; [`VulkanError::InvalidArgument`] for a size of zero or
    /// beyond `sparseAddressSpaceSize`; [`VulkanError::Vk`] when a call fails.
    pub fn new(context: Arc<VulkanContext>, config: SparseConfig) -> Result<Self, VulkanError> {
        let features = context.enabled_features();
        let name = context.properties().name.clone();
        if !features.sparse_binding || !features.sparse_residency_buffer || !features.timeline_semaphore {
            return Err(VulkanError::Unsupported(format!(
                "{name} lacks sparseBinding, sparseResidencyBuffer or timelineSemaphore ({features:?})"
            )));
        }
        let (_, queue) = context.sparse_queue().ok_or_else(|| VulkanError::Unsupported(format!("{name}: no sparse queue")))?;
        let address_space_bytes = context.properties().limits.sparse_address_space_size_bytes;
        if config.size_bytes == 0 || config.size_bytes > address_space_bytes {
            return Err(VulkanError::InvalidArgument(format!(
                "sparse buffer of {} B: must be above 0 and at most sparseAddressSpaceSize ({address_space_bytes} B)",
                config.size_bytes
            )));
        }
        context.check_buffer_size(config.size_bytes, "a sparse buffer").map_err(VulkanError::Unsupported)?;
        if config.pages_per_chunk == 0 {
            return Err(VulkanError::InvalidArgument("pages_per_chunk must be above 0".into()));
        }
        let mut flags = vk::BufferCreateFlags::SPARSE_BINDING | vk::BufferCreateFlags::SPARSE_RESIDENCY;
        if features.sparse_residency_aliased {
            flags |= vk::BufferCreateFlags::SPARSE_ALIASED;
        }
        let info = vk::BufferCreateInfo::default()
            .size(config.size_bytes)
            .flags(flags)
            .usage(BLOCK_BUFFER_USAGE)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let device = context.device();
        // SAFETY: a valid create info on a live device with the sparse features enabled; destroyed on drop (or
        // below on failure).
        let mut buffer = unsafe { device.create_buffer(&info, None) }.map_err(VulkanError::vk("vkCreateBuffer"))?;
        // SAFETY: the buffer was just created on this device.
        let mut requirements = unsafe { device.get_buffer_memory_requirements(buffer) };
        let mut created_bytes = config.size_bytes;
        if requirements.size > config.size_bytes
            && requirements.size <= address_space_bytes
            && context.check_buffer_size(requirements.size, "").is_ok()
        {
            // A size that ends inside a page: the buffer is made again in whole pages, so its last page can be bound
            // and what it says of its size (descriptors, wgpu) is what it holds.
            // SAFETY: the buffer is unused, nothing is bound to it.
            unsafe { device.destroy_buffer(buffer, None) };
            created_bytes = requirements.size;
            let whole = info.size(created_bytes);
            // SAFETY: as above, in whole pages.
            buffer = unsafe { device.create_buffer(&whole, None) }.map_err(VulkanError::vk("vkCreateBuffer"))?;
            // SAFETY: the buffer was just created on this device.
            requirements = unsafe { device.get_buffer_memory_requirements(buffer) };
        }
        // The address space is the device's, for every sparse buffer together.
        let space_bytes = created_bytes.max(requirements.size);
        if let Err(why) = context.take_sparse_space(space_bytes) {
            // SAFETY: the buffer is unused, nothing is bound to it.
            unsafe { device.destroy_buffer(buffer, None) };
            return Err(VulkanError::Unsupported(why));
        }
        let destroy = |error: VulkanError| {
            context.give_back_sparse_space(space_bytes);
            // SAFETY: the buffer is unused, nothing is bound to it.
            unsafe { device.destroy_buffer(buffer, None) };
            error
        };
        let page_bytes = requirements.alignment.max(1);
        let memory_type_index = context
            .properties()
            .memory_properties()
            .select_memory_type(requirements.memory_type_bits, MemoryUsage::DeviceLocal)
            .ok_or_else(|| {
                destroy(VulkanError::Unsupported(format!(
                    "{name}: no memory type for a sparse buffer among type bits {:#b}",
                    requirements.memory_type_bits
                )))
            })?;
        let capacity_pages = config.pool_capacity_bytes.map_or(u64::MAX, |capacity| capacity / page_bytes);
        let mut timeline = vk::SemaphoreTypeCreateInfo::default().semaphore_type(vk::SemaphoreType::TIMELINE).initial_value(0);
        let semaphore_info = vk::SemaphoreCreateInfo::default().push_next(&mut timeline);
        // SAFETY: timelineSemaphore is enabled (checked above); destroyed on drop.
        let semaphore = unsafe { device.create_semaphore(&semaphore_info, None) }
            .map_err(|result| destroy(VulkanError::Vk { call: "vkCreateSemaphore", result }))?;
        let context_is_cpu = context.properties().device_type == vk::PhysicalDeviceType::CPU;
        // A chunk is one `vkAllocateMemory`: no larger than the device's `maxMemoryAllocationSize`.
        let max_chunk_pages = context
            .properties()
            .limits
            .max_memory_allocation_size_bytes
            .map_or(u32::MAX, |max| u32::try_from(max / page_bytes).unwrap_or(u32::MAX));
        let pool = PagePool {
            context: Arc::clone(&context),
            memory_type_index,
            page_bytes,
            pages_per_chunk: config.pages_per_chunk.min(max_chunk_pages).max(1),
            capacity_pages,
            chunks: Vec::new(),
            allocated_pages: 0,
            free: FreeRuns::default(),
        };
        Ok(Self {
            context,
            queue,
            buffer,
            // What the buffer was made with: what its binds may cover, and its descriptors.
            size_bytes: created_bytes,
            space_bytes,
            page_bytes,
            pool,
            bound: BoundRuns::default(),
            semaphore,
            timeline_value: 0,
            max_live_mappings: config.max_live_mappings.unwrap_or(if context_is_cpu {
                SparseConfig::CPU_MAX_LIVE_MAPPINGS
            } else {
                u64::MAX
            }),
            stats: SparseStats::default(),
        })
    }

    /// The sparse page size of buffers on `context`'s device: that of a one-byte buffer, created and dropped.
    ///
    /// # Errors
    /// What [`SparseBuffer::new`] returns.
    pub fn page_bytes_on(context: &Arc<VulkanContext>) -> Result<u64, VulkanError> {
        Ok(Self::new(Arc::clone(context), SparseConfig::new(1))?.page_bytes())
    }

    /// The buffer.
    pub fn buffer(&self) -> vk::Buffer {
        self.buffer
    }

    /// The context.
    pub fn context(&self) -> &Arc<VulkanContext> {
        &self.context
    }

    /// Its size.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The sparse page size (the buffer's memory alignment).
    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// The page pool.
    pub fn pool(&self) -> &PagePool {
        &self.pool
    }

    /// Counters.
    pub fn stats(&self) -> SparseStats {
        self.stats
    }

    /// The physical page bound at the buffer page holding `offset`, if any.
    pub fn page_at(&self, offset: u64) -> Option<PageRef> {
        self.bound.at(offset / self.page_bytes)
    }

    /// The bound parts of `offset .. offset + size_bytes` (clipped to the buffer), as page-aligned runs
    /// `(offset, size_bytes)`: what [`SparseBuffer::unbind`] accepts to free whatever of a range is bound.
    pub fn bound_runs_within(&self, offset: u64, size_bytes: u64) -> Vec<(u64, u64)> {
        let first = offset / self.page_bytes;
        let end = offset.saturating_add(size_bytes).min(self.size_bytes).div_ceil(self.page_bytes);
        if end <= first {
            return Vec::new();
        }
        self.bound
            .bound_within(first, end - first)
            .into_iter()
            .map(|(start, pages)| (start * self.page_bytes, pages * self.page_bytes))
            .collect()
    }

    /// The runs `(offset, size_bytes)` as page runs `(first page, pages)`, checked to be page-aligned and inside
    /// the buffer, sorted, empty ones dropped and adjacent ones merged. Overlapping runs are merged when
    /// `overlap_allowed`, else refused.
    fn page_runs(&self, runs: &[(u64, u64)], overlap_allowed: bool) -> Result<Vec<(u64, u64)>, VulkanError> {
        let mut pages = Vec::with_capacity(runs.len());
        for &(offset, size_bytes) in runs {
            let end = offset.checked_add(size_bytes);
            if offset % self.page_bytes != 0 || size_bytes % self.page_bytes != 0 || end.is_none_or(|end| end > self.size_bytes) {
                return Err(VulkanError::InvalidArgument(format!(
                    "run at {offset:#x} of {size_bytes} B: must be whole {} B pages inside the buffer of {} B",
                    self.page_bytes, self.size_bytes
                )));
            }
            if size_bytes > 0 {
                pages.push((offset / self.page_bytes, size_bytes / self.page_bytes));
            }
        }
        pages.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(pages.len());
        for (start, count) in pages {
            match merged.last_mut() {
                Some((last, last_count)) if *last + *last_count > start && !overlap_allowed => {
                    return Err(VulkanError::InvalidArgument(format!(
                        "page {start} of the buffer is listed twice (runs overlap; page {last} starts another)"
                    )));
                }
                Some((last, last_count)) if *last + *last_count >= start => {
                    *last_count = (*last_count).max(start + count - *last);
                }
                _ => merged.push((start, count)),
            }
        }
        Ok(merged)
    }

    fn set_live_mappings(&mut self) {
        self.stats.live_mappings = self.bound.len();
        self.stats.peak_live_mappings = self.stats.peak_live_mappings.max(self.stats.live_mappings);
        self.stats.pages_bound = self.bound.pages();
        self.stats.peak_pages_bound = self.stats.peak_pages_bound.max(self.stats.pages_bound);
    }

    /// Binds physical pages to every page of `runs` (page-aligned `(offset, size_bytes)` in the buffer, none
    /// bound yet), in one batch; returns the bind entries it took.
    ///
    /// # Errors
    /// [`VulkanError::InvalidArgument`] for a run outside the buffer, misaligned, or over a bound page;
    /// [`VulkanError::OutOfPages`] when the pool is exhausted; [`VulkanError::TooManyMappings`]; a failed
    /// `vkQueueBindSparse`. Nothing changes on error.
    pub fn bind(&mut self, runs: &[(u64, u64)]) -> Result<u64, VulkanError> {
        let runs = self.page_runs(runs, false)?;
        if runs.iter().any(|&(start, count)| self.bound.any_bound(start, count)) {
            return Err(VulkanError::InvalidArgument("bind over a page already bound (or listed twice)".into()));
        }
        let pages: u64 = runs.iter().map(|&(_, count)| count).sum();
        if pages == 0 {
            return Ok(0);
        }
        let physical = self.pool.take(pages)?;
        self.bind_runs(&runs, physical)
    }

    /// Binds `physical` (as many pages as `runs` holds, lowest buffer page first) at the buffer page runs
    /// `runs` (sorted, unbound), giving the physical pages back to the pool on error.
    fn bind_runs(&mut self, runs: &[(u64, u64)], physical: Vec<PhysicalRun>) -> Result<u64, VulkanError> {
        let bound = pair(runs, &physical);
        for &run in &bound {
            self.bound.insert(run);
        }
        let needed = self.bound.len() + self.pool.chunk_count() as u64;
        let binds: Vec<vk::SparseMemoryBind> = bound
            .iter()
            .map(|run| {
                vk::SparseMemoryBind::default()
                    .resource_offset(run.start * self.page_bytes)
                    .size(u64::from(run.pages) * self.page_bytes)
                    .memory(self.pool.memory(run.physical.chunk))
                    .memory_offset(u64::from(run.physical.page) * self.page_bytes)
            })
            .collect();
        let result = if needed > self.max_live_mappings {
            Err(VulkanError::TooManyMappings { needed, limit: self.max_live_mappings })
        } else {
            self.submit(&binds)
        };
        if let Err(error) = result {
            // The runs are canonical: removing what was inserted restores them.
            for &(start, count) in runs {
                self.bound.remove(start, count);
            }
            self.pool.give_back(physical);
            return Err(error);
        }
        self.set_live_mappings();
        self.stats.bind_entries += binds.len() as u64;
        Ok(binds.len() as u64)
    }

    /// Null-memory binds covering the page runs `runs` (sorted, merged): one per run.
    fn unbind_entries(&self, runs: &[(u64, u64)]) -> Vec<vk::SparseMemoryBind> {
        runs.iter()
            .map(|&(start, count)| {
                vk::SparseMemoryBind::default().resource_offset(start * self.page_bytes).size(count * self.page_bytes)
            })
            .collect()
    }

    /// Unbinds every page of `runs` (all bound), in one batch, and gives their physical pages back; returns
    /// the unbind entries it took (one per run of pages contiguous in the buffer).
    ///
    /// # Errors
    /// [`VulkanError::InvalidArgument`] for a run outside the buffer, misaligned, or over an unbound page; a
    /// failed `vkQueueBindSparse`. Nothing changes on error.
    pub fn unbind(&mut self, runs: &[(u64, u64)]) -> Result<u64, VulkanError> {
        let runs = self.page_runs(runs, true)?;
        if !runs.iter().all(|&(start, count)| self.bound.all_bound(start, count)) {
            return Err(VulkanError::InvalidArgument("unbind of a page not bound".into()));
        }
        let binds = self.unbind_entries(&runs);
        if binds.is_empty() {
            return Ok(0);
        }
        self.submit(&binds)?;
        for &(start, count) in &runs {
            let freed = self.bound.remove(start, count);
            self.pool.give_back(freed);
        }
        self.set_live_mappings();
        let entries = binds.len() as u64;
        self.stats.unbind_entries += entries;
        Ok(entries)
    }

    /// Moves the physical page bound at `from_offset` to the unbound page at `to_offset`, in one batch (an
    /// unbind and a bind of the same memory): the contents move with it.
    ///
    /// # Errors
    /// As [`SparseBuffer::remap_runs`].
    pub fn remap(&mut self, from_offset: u64, to_offset: u64) -> Result<(), VulkanError> {
        self.remap_runs(&[PageMove { from_offset, to_offset, size_bytes: self.page_bytes }]).map(|_| ())
    }

    /// Moves the physical pages bound at each move's source run to its destination run, the moves applied in order
    /// (a destination may overlap its own source, or a source an earlier move vacated), in one batch: the pages of
    /// the buffer that end up unbound are unbound, those that end up bound are bound to the physical pages that
    /// moved there, and the contents move with their pages; nothing is copied. Returns the bind and unbind entries
    /// it took.
    ///
    /// # Errors
    /// [`VulkanError::InvalidArgument`] when a run is not whole pages inside the buffer, a source page is not bound
    /// or a destination page is (once the earlier moves and its own source are taken away);
    /// [`VulkanError::TooManyMappings`]; a failed `vkQueueBindSparse`. Nothing changes on error.
    pub fn remap_runs(&mut self, moves: &[PageMove]) -> Result<u64, VulkanError> {
        let saved = self.bound.clone();
        let result = self.remap_bookkeeping(moves).and_then(|touched| {
            // Every page a move touched ends bound (to the memory that moved there) or unbound.
            let mut binds = Vec::new();
            let mut unbinds = Vec::new();
            for &(start, count) in &touched {
                let bound = self.bound.runs_within(start, count);
                let mut cursor = start;
                for run in &bound {
                    if run.start > cursor {
                        unbinds.push((cursor, run.start - cursor));
                    }
                    cursor = run.start + u64::from(run.pages);
                }
                if start + count > cursor {
                    unbinds.push((cursor, start + count - cursor));
                }
                binds.extend(bound);
            }
            let needed = self.bound.len() + self.pool.chunk_count() as u64;
            if needed > self.max_live_mappings {
                return Err(VulkanError::TooManyMappings { needed, limit: self.max_live_mappings });
            }
            let mut entries = self.unbind_entries(&unbinds);
            entries.extend(binds.iter().map(|run| {
                vk::SparseMemoryBind::default()
                    .resource_offset(run.start * self.page_bytes)
                    .size(u64::from(run.pages) * self.page_bytes)
                    .memory(self.pool.memory(run.physical.chunk))
                    .memory_offset(u64::from(run.physical.page) * self.page_bytes)
            }));
            if !entries.is_empty() {
                self.submit(&entries)?;
            }
            Ok((binds.len() as u64, unbinds.len() as u64))
        });
        match result {
            Ok((binds, unbinds)) => {
                self.set_live_mappings();
                self.stats.bind_entries += binds;
                self.stats.unbind_entries += unbinds;
                self.stats.pages_remapped += moves.iter().map(|m| m.size_bytes / self.page_bytes).sum::<u64>();
                Ok(binds + unbinds)
            }
            Err(error) => {
                self.bound = saved;
                Err(error)
            }
        }
    }

    /// Applies `moves` to the bookkeeping of bound pages, in order; returns the buffer page runs they touched
    /// (sorted, merged).
    fn remap_bookkeeping(&mut self, moves: &[PageMove]) -> Result<Vec<(u64, u64)>, VulkanError> {
        let mut touched = Vec::with_capacity(moves.len() * 2);
        for m in moves {
            let from = self.page_runs(&[(m.from_offset, m.size_bytes)], false)?;
            let to = self.page_runs(&[(m.to_offset, m.size_bytes)], false)?;
            let (Some(&(from_start, pages)), Some(&(to_start, _))) = (from.first(), to.first()) else { continue };
            if !self.bound.all_bound(from_start, pages) {
                return Err(VulkanError::InvalidArgument(format!(
                    "remap from {:#x} ({} B): not every page is bound",
                    m.from_offset, m.size_bytes
                )));
            }
            let physical = self.bound.remove(from_start, pages);
            if self.bound.any_bound(to_start, pages) {
                return Err(VulkanError::InvalidArgument(format!(
                    "remap to {:#x} ({} B): a page there is bound",
                    m.to_offset, m.size_bytes
                )));
            }
            for run in pair(&[(to_start, pages)], &physical) {
                self.bound.insert(run);
            }
            touched.push((from_start, pages));
            touched.push((to_start, pages));
        }
        touched.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(touched.len());
        for (start, count) in touched {
            match merged.last_mut() {
                Some((last, last_count)) if *last + *last_count >= start => {
                    *last_count = (*last_count).max(start + count - *last);
                }
                _ => merged.push((start, count)),
            }
        }
        Ok(merged)
    }

    /// Submits one batch of `binds` on the sparse queue, waiting for the previous batch and signalling the next
    /// timeline value.
    fn submit(&mut self, binds: &[vk::SparseMemoryBind]) -> Result<(), VulkanError> {
        let wait_values = [self.timeline_value];
        let signal_values = [self.timeline_value + 1];
        let semaphores = [self.semaphore];
        let buffer_binds = [vk::SparseBufferMemoryBindInfo::default().buffer(self.buffer).binds(binds)];
        let mut timeline = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_values)
            .signal_semaphore_values(&signal_values);
        let info = vk::BindSparseInfo::default()
            .wait_semaphores(&semaphores)
            .buffer_binds(&buffer_binds)
            .signal_semaphores(&semaphores)
            .push_next(&mut timeline);
        let _queue = self.context.lock_queues();
        // SAFETY: the queue is the device's sparse queue, held under the context's queue lock; every bind names
        // memory of this device's pool at an offset and size that are multiples of the buffer's alignment,
        // inside the chunk and the buffer; all pointers in `info` outlive the call.
        unsafe { self.context.device().queue_bind_sparse(self.queue, &[info], vk::Fence::null()) }
            .map_err(VulkanError::vk("vkQueueBindSparse"))?;
        self.timeline_value += 1;
        self.stats.batches += 1;
        Ok(())
    }

    /// Waits on the host until every batch submitted so far has completed.
    ///
    /// # Errors
    /// A failed `vkWaitSemaphores`.
    pub fn wait_binds(&self) -> Result<(), VulkanError> {
        let semaphores = [self.semaphore];
        let values = [self.timeline_value];
        let info = vk::SemaphoreWaitInfo::default().semaphores(&semaphores).values(&values);
        // SAFETY: the semaphore is this buffer's timeline semaphore on this device.
        unsafe { self.context.device().wait_semaphores(&info, u64::MAX) }.map_err(VulkanError::vk("vkWaitSemaphores"))
    }

    /// The timeline semaphore and the value the last batch signals, for a submission that waits on the device.
    pub fn timeline(&self) -> (vk::Semaphore, u64) {
        (self.semaphore, self.timeline_value)
    }
}

impl Drop for SparseBuffer {
    fn drop(&mut self) {
        // A lost device cannot be waited on; destruction proceeds either way.
        let _ = self.wait_binds();
        let _queue = self.context.lock_queues();
        // SAFETY: every bind batch has completed and no other work uses the buffer (callers wait for their
        // copies); the pool's memory is freed after the buffer (the pool is dropped after this body).
        unsafe {
            let device = self.context.device();
            let _ = device.queue_wait_idle(self.queue);
            device.destroy_buffer(self.buffer, None);
            device.destroy_semaphore(self.semaphore, None);
        }
        self.context.give_back_sparse_space(self.space_bytes);
    }
}

/// How the pages of a latency measurement lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindLayout {
    /// One run of pages, contiguous in the buffer and in memory: one bind entry.
    Contiguous,
    /// Every other page of the buffer: one bind entry per page.
    Scattered,
}

impl BindLayout {
    /// `"contiguous"` or `"scattered"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Contiguous => "contiguous",
            Self::Scattered => "scattered",
        }
    }
}

/// One measurement of [`measure_bind_latency`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BindLatency {
    /// Pages bound.
    pub pages: u32,
    /// How they lay.
    pub layout: BindLayout,
    /// Microseconds from submitting the bind batch to its completion seen on the host.
    pub bind_us: f64,
    /// The same for the unbind batch.
    pub unbind_us: f64,
}

/// Measures binding and unbinding `pages` pages in one batch each, laid out contiguously (one entry) or
/// scattered (every other page, one entry per page), on a fresh sparse buffer whose pool chunks are allocated
/// beforehand (so only the binding is timed).
///
/// # Errors
/// What [`SparseBuffer::new`], [`SparseBuffer::bind`] and [`SparseBuffer::unbind`] return.
pub fn measure_bind_latency(context: &Arc<VulkanContext>, pages: u32, contiguous: bool) -> Result<BindLatency, VulkanError> {
    let page_bytes = SparseBuffer::page_bytes_on(context)?;
    let pages_u64 = u64::from(pages.max(1));
    let span_pages = if contiguous { pages_u64 } else { 2 * pages_u64 };
    let mut config = SparseConfig::new(span_pages * page_bytes);
    config.pages_per_chunk = pages.clamp(1, 4096);
    let mut buffer = SparseBuffer::new(Arc::clone(context), config)?;
    let runs: Vec<(u64, u64)> = if contiguous {
        vec![(0, pages_u64 * page_bytes)]
    } else {
        (0..pages_u64).map(|page| (2 * page * page_bytes, page_bytes)).collect()
    };
    // Allocate the chunks first: take and give back every page.
    let warm = buffer.pool.take(pages_u64)?;
    buffer.pool.give_back(warm);
    let start = Instant::now();
    buffer.bind(&runs)?;
    buffer.wait_binds()?;
    let bind_us = start.elapsed().as_secs_f64() * 1e6;
    let start = Instant::now();
    buffer.unbind(&runs)?;
    buffer.wait_binds()?;
    let unbind_us = start.elapsed().as_secs_f64() * 1e6;
    let layout = if contiguous { BindLayout::Contiguous } else { BindLayout::Scattered };
    Ok(BindLatency { pages, layout, bind_us, unbind_us })
}
