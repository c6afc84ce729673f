//! [`SegmentMemory`]: device memory under PyTorch's caching allocator. It applies the allocator's segment
//! operations — core [`DeviceEvent`]s at the allocator's addresses — to the device:
//!
//! - `Reserved` / `Released` (a segment's `cudaMalloc` / `cudaFree`): a `vkAllocateMemory` block of the segment's
//!   size, dedicated to a storage buffer of its own, from a [`DeviceMemorySource`]; freed with the segment.
//! - `Mapped` / `Unmapped` (pages of an expandable segment): binds and unbinds of whole runs of device pages in
//!   the segment's [`SparseBuffer`] (the first [`PytorchDeviceConfig::expandable_virtual_bytes`] of PyTorch's
//!   virtual range; chunks of 2 MiB, PyTorch's smallest page). The buffer is created at the segment's first map
//!   and dropped when the allocator drops the segment.
//!
//! Two drivers use it: [`crate::PytorchDeviceHeap`] (a `CachingHeap` step by step, refusals undone) and the
//! `pytorch` contender of `replay --vulkan`, where it is the [`SegmentBacking`] of the core's emulation
//! ([`heapscope_lab::compare::emulate_pytorch`]): the same decisions as the simulated contender, each made on
//! the device. There a refusal stops the replay; the typed error is kept ([`SegmentMemory::take_error`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use heapscope_core::{DeviceEvent, MemorySource, SourceBlock, SourceError};
use heapscope_pytorch::caching::{MIN_BLOCK_BYTES, SMALL_BUFFER_BYTES};
use heapscope_pytorch::{AllocConf, BackingRefused, CachingAllocator, SegmentBacking};

use crate::compute::ComputeBuffer;
use crate::sparse::{SparseBuffer, SparseConfig};
use crate::{DeviceMemorySource, DeviceSourceConfig, VulkanContext, VulkanError};

/// How PyTorch's allocator on device memory is made: its settings and the memory under it (a
/// [`crate::PytorchDeviceHeap`], or a [`SegmentMemory`] under the emulation).
#[derive(Clone, Debug, PartialEq)]
pub struct PytorchDeviceConfig {
    /// PyTorch's settings (`expandable_segments`, `max_split_size_mb`, ...).
    pub conf: AllocConf,
    /// The most bytes reserved at once (the allocator's capacity, and the device memory's cap); `None`: no limit.
    pub capacity_bytes: Option<u64>,
    /// Bytes of each expandable segment backed by its sparse buffer (at most `sparseAddressSpaceSize` over two:
    /// the small and the large pool each have a segment).
    pub expandable_virtual_bytes: u64,
    /// The most device memory the segments' blocks (and each page pool) may hold; by default the capacity. A
    /// lower cap makes the device refuse below the allocator's capacity (budget cap injection).
    pub device_cap_bytes: Option<u64>,
}

impl PytorchDeviceConfig {
    /// `conf` under `capacity_bytes`; expandable segments backed over twice the capacity (1 GiB without one).
    pub fn new(conf: AllocConf, capacity_bytes: Option<u64>) -> Self {
        Self {
            conf,
            capacity_bytes,
            expandable_virtual_bytes: capacity_bytes.map_or(1 << 30, |capacity| capacity.saturating_mul(2)),
            device_cap_bytes: capacity_bytes,
        }
    }
}

/// What a [`SegmentMemory`] asked of the device so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentCounts {
    /// Segment blocks allocated (`vkAllocateMemory`) plus page runs bound: PyTorch's `num_device_alloc`.
    pub device_allocs: u64,
    /// Segment blocks freed plus page runs unbound: PyTorch's `num_device_free`.
    pub device_frees: u64,
    /// The most bytes of device memory held at once (blocks and bound pages).
    pub peak_device_bytes: u64,
}

/// Device memory following PyTorch's segment operations. See the module documentation.
#[derive(Debug)]
pub struct SegmentMemory {
    source: DeviceMemorySource,
    capacity_bytes: Option<u64>,
    /// Segment base (the allocator's address) -> its block.
    segments: HashMap<u64, SourceBlock>,
    /// Expandable segment base -> its sparse buffer and virtual size.
    expandable: BTreeMap<u64, Expandable>,
    sparse_config: SparseConfig,
    counts: SegmentCounts,
    /// The refusal that stopped an emulation (see [`SegmentMemory::take_error`]).
    error: Option<VulkanError>,
}

impl SegmentMemory {
    /// No memory yet, on `context`'s device, under `config`'s device cap; expandable segments backed over
    /// `config.expandable_virtual_bytes` (at most half the sparse address space: the small and the large pool
    /// have a segment each).
    ///
    /// # Errors
    /// What [`DeviceMemorySource::new`] returns; [`VulkanError::Unsupported`] for expandable segments on a device
    /// without sparse residency for buffers.
    pub fn new(context: Arc<VulkanContext>, config: &PytorchDeviceConfig) -> Result<Self, VulkanError> {
        if config.conf.expandable_segments {
            let features = context.enabled_features();
            if !(features.sparse_binding && features.sparse_residency_buffer && features.timeline_semaphore) {
                return Err(VulkanError::Unsupported(format!(
                    "{}: expandable segments need sparse residency for buffers ({features:?})",
                    context.properties().name
                )));
            }
        }
        let address_space = context.properties().limits.sparse_address_space_size_bytes;
        // Two pools' reservations in the address space, each in whole pages.
        let virtual_bytes =
            config.expandable_virtual_bytes.min(crate::sparse::whole_sparse_pages(address_space / 2)).max(MIN_BLOCK_BYTES);
        let mut sparse_config = SparseConfig::new(virtual_bytes).with_pool_capacity(config.device_cap_bytes);
        if config.conf.expandable_segments {
            // Whole PyTorch pages (2 MiB at least) per memory chunk, about a thousand chunks at the capacity: few memory
            // objects (a device may allow 4,096), and mapped runs that stay contiguous (a run never spans two chunks).
            let page_bytes = SparseBuffer::new(Arc::clone(&context), SparseConfig::new(SMALL_BUFFER_BYTES))?.page_bytes();
            let chunk_bytes = config
                .capacity_bytes
                .map_or(SMALL_BUFFER_BYTES, |capacity| (capacity / 1024).next_multiple_of(SMALL_BUFFER_BYTES))
                .max(SMALL_BUFFER_BYTES);
            sparse_config.pages_per_chunk = u32::try_from(chunk_bytes / page_bytes).unwrap_or(u32::MAX).max(1);
        }
        let source = DeviceMemorySource::new(context, DeviceSourceConfig::device_only(config.device_cap_bytes))?;
        Ok(Self {
            source,
            capacity_bytes: config.capacity_bytes,
            segments: HashMap::new(),
            expandable: BTreeMap::new(),
            sparse_config,
            counts: SegmentCounts::default(),
            error: None,
        })
    }

    /// The context.
    pub fn context(&self) -> &Arc<VulkanContext> {
        self.source.context()
    }

    /// Segments backed now: blocks, and expandable segments' sparse buffers.
    pub fn live_segments(&self) -> (usize, usize) {
        (self.segments.len(), self.expandable.len())
    }

    /// Bytes of device memory held: the segments' blocks and the pages bound in expandable segments.
    pub fn device_bytes(&self) -> u64 {
        self.source.used_bytes()
            + self
                .expandable
                .values()
                .map(|Expandable { sparse, .. }| sparse.stats().pages_bound * sparse.page_bytes())
                .sum::<u64>()
    }

    /// What was asked of the device so far.
    pub fn counts(&self) -> SegmentCounts {
        self.counts
    }

    /// The refusal that stopped an emulation this memory backed, if any (taken).
    pub fn take_error(&mut self) -> Option<VulkanError> {
        self.error.take()
    }

    /// The buffer holding `size_bytes` at `offset` of the segment at `base`, for the kernels: the segment's
    /// dedicated buffer, or its sparse buffer when the range lies inside it.
    pub fn compute_target(&self, base: u64, offset: u64, size_bytes: u64) -> Option<ComputeBuffer<'_>> {
        if let Some(block) = self.segments.get(&base) {
            let info = self.source.block(block.handle)?;
            let buffer = info.dedicated_buffer?;
            return Some(ComputeBuffer::borrowed(self.source.context(), buffer, info.size_bytes));
        }
        let sparse = &self.expandable.get(&base)?.sparse;
        (offset + size_bytes <= sparse.size_bytes())
            .then(|| ComputeBuffer::borrowed(sparse.context(), sparse.buffer(), sparse.size_bytes()))
    }

    /// Waits until every sparse bind and unbind so far has completed.
    ///
    /// # Errors
    /// A failed `vkWaitSemaphores`.
    pub fn wait_binds(&self) -> Result<(), VulkanError> {
        self.expandable.values().try_for_each(|Expandable { sparse, .. }| sparse.wait_binds())
    }

    /// Applies `events`, the segment operations `allocator` just made (`allocator` is the state after them).
    /// `undoing`: events of a request being undone after a refusal, where some released segments or unmapped
    /// pages were never backed (skipped).
    ///
    /// # Errors
    /// [`VulkanError::OutOfPages`] when the device (or its cap) refuses a segment or pages, or pages lie past an
    /// expandable buffer's range; another Vulkan failure.
    pub fn apply_events(
        &mut self,
        events: &[DeviceEvent],
        allocator: &CachingAllocator,
        undoing: bool,
    ) -> Result<(), VulkanError> {
        let result = events.iter().try_for_each(|&event| self.apply_event(event, allocator, undoing));
        // Sparse buffers of expandable segments the allocator dropped.
        let live: Vec<u64> = allocator.expandable_segments().iter().map(|&(base, _)| base).collect();
        self.expandable.retain(|base, _| live.contains(base));
        self.counts.peak_device_bytes = self.counts.peak_device_bytes.max(self.device_bytes());
        result
    }

    fn apply_event(&mut self, event: DeviceEvent, allocator: &CachingAllocator, undoing: bool) -> Result<(), VulkanError> {
        match event {
            DeviceEvent::Reserved { address, size_bytes } => {
                let block = self.source.allocate_dedicated_block(size_bytes).map_err(|error| match error {
                    SourceError::OutOfMemory { requested_bytes } => VulkanError::OutOfPages {
                        requested_pages: 1,
                        available_pages: 0,
                        page_bytes: requested_bytes,
                        capacity_bytes: self.capacity_bytes.unwrap_or(u64::MAX),
                    },
                    SourceError::Failed(message) => VulkanError::Unsupported(message),
                })?;
                self.segments.insert(address, block);
                self.counts.device_allocs += 1;
            }
            DeviceEvent::Released { address, .. } => {
                if let Some(block) = self.segments.remove(&address) {
                    self.source.free_block(block);
                    self.counts.device_frees += 1;
                }
            }
            DeviceEvent::Mapped { address, size_bytes } => {
                self.bind(address, size_bytes, allocator)?;
                self.counts.device_allocs += 1;
            }
            DeviceEvent::Unmapped { address, size_bytes } => {
                if self.unbind(address, size_bytes, undoing, allocator)? {
                    self.counts.device_frees += 1;
                }
            }
        }
        Ok(())
    }

    /// The expandable segment holding `address`, and the offset in it (see [`holding_segment`]).
    fn segment_of(&self, address: u64, allocator: &CachingAllocator) -> Result<(u64, u64), VulkanError> {
        let (base, _) = holding_segment(address, allocator.segment_at(address), &self.expandable, |backed| backed.virtual_bytes)
            .ok_or_else(|| VulkanError::InvalidArgument(format!("pages mapped at {address:#x}, in no expandable segment")))?;
        Ok((base, address - base))
    }

    fn bind(&mut self, address: u64, size_bytes: u64, allocator: &CachingAllocator) -> Result<(), VulkanError> {
        let (base, offset) = self.segment_of(address, allocator)?;
        if !self.expandable.contains_key(&base) {
            let sparse = SparseBuffer::new(Arc::clone(self.source.context()), self.sparse_config)?;
            let virtual_bytes = allocator.segment_at(address).map_or(u64::MAX - base, |(_, size)| size);
            self.expandable.insert(base, Expandable { sparse, virtual_bytes });
        }
        let Some(Expandable { sparse, .. }) = self.expandable.get_mut(&base) else { return Ok(()) };
        if offset + size_bytes > sparse.size_bytes() {
            return Err(VulkanError::OutOfPages {
                requested_pages: size_bytes.div_ceil(sparse.page_bytes()),
                available_pages: 0,
                page_bytes: sparse.page_bytes(),
                capacity_bytes: sparse.size_bytes(),
            });
        }
        sparse.bind(&[(offset, size_bytes)]).map(drop)
    }

    /// Unbinds the pages; returns whether anything was unbound.
    fn unbind(
        &mut self,
        address: u64,
        size_bytes: u64,
        undoing: bool,
        allocator: &CachingAllocator,
    ) -> Result<bool, VulkanError> {
        let (base, offset) = self.segment_of(address, allocator)?;
        let Some(Expandable { sparse, .. }) = self.expandable.get_mut(&base) else {
            return if undoing {
                Ok(false)
            } else {
                Err(VulkanError::InvalidArgument(format!("unmap at {address:#x}: no buffer")))
            };
        };
        if !undoing {
            return sparse.unbind(&[(offset, size_bytes)]).map(|_| true);
        }
        // Only the pages that were bound.
        let runs = sparse.bound_runs_within(offset, size_bytes);
        if runs.is_empty() { Ok(false) } else { sparse.unbind(&runs).map(|_| true) }
    }
}

/// The expandable segment (base, virtual size) holding `address`: the allocator's (`allocators`, its
/// `segment_at`), else — the allocator dropped it in the same call that unmapped its pages — one backed here
/// (`backed`: by base, `size` its virtual size as the allocator reserved it). Never by a distance assumed between
/// reservations: their bases come from the trace and may lie closer than PyTorch's default reservation (issue 14).
fn holding_segment<V>(
    address: u64,
    allocators: Option<(u64, u64)>,
    backed: &BTreeMap<u64, V>,
    size: impl Fn(&V) -> u64,
) -> Option<(u64, u64)> {
    allocators.or_else(|| {
        let (&base, value) = backed.range(..=address).next_back()?;
        Some((base, size(value))).filter(|&(base, size)| address - base < size)
    })
}

/// An expandable segment backed here: its sparse buffer, and its virtual size as the allocator reserved it when its
/// first pages were bound.
#[derive(Debug)]
struct Expandable {
    sparse: SparseBuffer,
    virtual_bytes: u64,
}

impl SegmentBacking for SegmentMemory {
    fn apply(&mut self, events: &[DeviceEvent], allocator: &CachingAllocator) -> Result<(), BackingRefused> {
        self.apply_events(events, allocator, false).map_err(|error| {
            let text = error.to_string();
            self.error = Some(error);
            BackingRefused(text)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The segment an address belongs to is the allocator's, or a dropped one backed here by its own size:
    /// reservations 90 GiB apart (closer than the default 128 GiB) are told apart.
    #[test]
    fn addresses_belong_to_the_allocators_segments_not_to_an_assumed_distance() {
        const GIB: u64 = 1 << 30;
        let backed = BTreeMap::from([(0, 90 * GIB), (90 * GIB, 128 * GIB)]);
        // (address, the allocator's segment there, the segment holding it)
        let cases = [
            (90 * GIB + 4096, Some((90 * GIB, 128 * GIB)), Some((90 * GIB, 128 * GIB))),
            (4096, Some((0, 90 * GIB)), Some((0, 90 * GIB))),
            // Dropped by the allocator in the same call: the backed segment, by its own size.
            (90 * GIB + 4096, None, Some((90 * GIB, 128 * GIB))),
            (89 * GIB, None, Some((0, 90 * GIB))),
            (300 * GIB, None, None),
            // A new reservation 90 GiB past a backed one: the allocator's, not the backed one below it.
            (180 * GIB, Some((180 * GIB, 128 * GIB)), Some((180 * GIB, 128 * GIB))),
        ];
        for (address, allocators, holding) in cases {
            assert_eq!(holding_segment(address, allocators, &backed, |&size| size), holding, "{address:#x}");
        }
    }
}
