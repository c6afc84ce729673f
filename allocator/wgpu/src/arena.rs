//! Arenas: [`ArenaSource`], a [`MemorySource`] whose blocks are `wgpu::Buffer`s, and [`ArenaHeap`], the core
//! [`Heap`] over it with allocations that hand out buffer slices and bindings.
//!
//! wgpu exposes no raw device memory, so a block is a large buffer ([`ARENA_USAGE`]) and an allocation a range of
//! it. Every allocation is bindable whole as a storage buffer: its offset is a multiple of
//! `min_storage_buffer_offset_alignment`, its binding size its size rounded up to 4 bytes, and requests larger
//! than the binding limit (`max_storage_buffer_binding_size`, or a lower cap of the caller's) are refused before
//! they reach the heap, with [`WgpuError::TooLargeToBind`]. Blocks are at most `max_buffer_size`; the heap's
//! block-size, dedicated-block, release and budget rules apply unchanged.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;

use heapscope_core::source::check_block_size;
use heapscope_core::{
    BlockCopy, Heap, HeapAllocation, HeapConfig, HeapReport, HeapStats, MemorySource, Request, SourceBlock, SourceError,
};

use crate::{KernelBuffer, WgpuDevice, WgpuError};

/// The usage of every arena: storage (the kernels) and copies both ways.
pub const ARENA_USAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

/// One arena.
#[derive(Debug)]
struct Arena {
    handle: u64,
    buffer: wgpu::Buffer,
}

/// Blocks as `wgpu::Buffer` arenas. Addresses are heapscope's own (wgpu has none): increasing, never reused, so
/// an allocation's address names its arena.
pub struct ArenaSource {
    device: Arc<WgpuDevice>,
    name: String,
    alignment_bytes: u64,
    max_buffer_bytes: u64,
    /// Live arenas by base address.
    arenas: BTreeMap<u64, Arena>,
    next_address: u64,
    next_handle: u64,
    used_bytes: u64,
    blocks_allocated: u64,
    blocks_freed: u64,
}

impl fmt::Debug for ArenaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArenaSource")
            .field("name", &self.name)
            .field("arenas", &self.arenas.len())
            .field("used_bytes", &self.used_bytes)
            .finish_non_exhaustive()
    }
}

impl ArenaSource {
    /// The base address of the first arena.
    pub const BASE_ADDRESS: u64 = 0x5000_0000_0000;

    /// Arena sizes are multiples of this (or of `min_storage_buffer_offset_alignment` when larger), and so are
    /// their addresses.
    pub const ALIGNMENT_BYTES: u64 = 64 << 10;

    /// A source of arenas on `device`, sizes multiples of [`ArenaSource::ALIGNMENT_BYTES`].
    pub fn new(device: Arc<WgpuDevice>) -> Self {
        Self::with_block_alignment(device, Self::ALIGNMENT_BYTES)
    }

    /// A source of arenas on `device` whose sizes (and addresses) are multiples of `min_alignment_bytes` (a power
    /// of two), or of `min_storage_buffer_offset_alignment` when larger: to reserve the same blocks as another
    /// source (a simulated one, or Vulkan's).
    pub fn with_block_alignment(device: Arc<WgpuDevice>, min_alignment_bytes: u64) -> Self {
        let limits = device.limits();
        let alignment_bytes = min_alignment_bytes.max(u64::from(limits.min_storage_buffer_offset_alignment).next_power_of_two());
        let max_buffer_bytes = limits.max_buffer_size / alignment_bytes * alignment_bytes;
        let name = format!("wgpu arenas on {} ({:?})", device.info().name, device.info().backend);
        Self {
            device,
            name,
            alignment_bytes,
            max_buffer_bytes,
            arenas: BTreeMap::new(),
            next_address: Self::BASE_ADDRESS,
            next_handle: 1,
            used_bytes: 0,
            blocks_allocated: 0,
            blocks_freed: 0,
        }
    }

    /// The device.
    pub fn device(&self) -> &Arc<WgpuDevice> {
        &self.device
    }

    /// The largest arena: `max_buffer_size` rounded down to the block alignment.
    pub fn max_arena_bytes(&self) -> u64 {
        self.max_buffer_bytes
    }

    /// Live arenas.
    pub fn live_arenas(&self) -> usize {
        self.arenas.len()
    }

    /// Bytes in live arenas.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Arenas created and destroyed so far.
    pub fn arena_counts(&self) -> (u64, u64) {
        (self.blocks_allocated, self.blocks_freed)
    }

    /// The arena holding `address`, and the offset of `address` in it.
    pub fn locate(&self, address: u64) -> Option<(&wgpu::Buffer, u64)> {
        let (&base, arena) = self.arenas.range(..=address).next_back()?;
        let offset = address - base;
        (offset < arena.buffer.size()).then_some((&arena.buffer, offset))
    }

    /// The arena of a block this source handed out.
    pub fn buffer(&self, block: &SourceBlock) -> Option<&wgpu::Buffer> {
        self.arenas.get(&block.base_address).filter(|arena| arena.handle == block.handle).map(|arena| &arena.buffer)
    }
}

impl MemorySource for ArenaSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn block_alignment_bytes(&self) -> u64 {
        self.alignment_bytes
    }

    fn allocate_block(&mut self, size_bytes: u64) -> Result<SourceBlock, SourceError> {
        check_block_size(size_bytes, self.alignment_bytes)?;
        // Larger than any buffer: the heap halves its block size, or reports the request out of memory.
        if size_bytes > self.max_buffer_bytes || self.next_address.checked_add(size_bytes).is_none() {
            return Err(SourceError::OutOfMemory { requested_bytes: size_bytes });
        }
        let descriptor = wgpu::BufferDescriptor {
            label: Some("heapscope arena"),
            size: size_bytes,
            usage: ARENA_USAGE,
            mapped_at_creation: false,
        };
        let buffer = self.device.scoped(|| self.device.device().create_buffer(&descriptor)).map_err(|caught| {
            if caught.out_of_memory {
                SourceError::OutOfMemory { requested_bytes: size_bytes }
            } else {
                SourceError::Failed(format!("creating an arena of {size_bytes} B: {}", caught.message))
            }
        })?;
        let block = SourceBlock { handle: self.next_handle, base_address: self.next_address, size_bytes };
        self.next_handle += 1;
        self.next_address += size_bytes;
        self.used_bytes += size_bytes;
        self.blocks_allocated += 1;
        self.arenas.insert(block.base_address, Arena { handle: block.handle, buffer });
        Ok(block)
    }

    fn free_block(&mut self, block: SourceBlock) {
        if self.arenas.get(&block.base_address).is_some_and(|arena| arena.handle == block.handle)
            && let Some(arena) = self.arenas.remove(&block.base_address)
        {
            // Destroyed now (wgpu frees the memory once submitted work using it has completed); a clone of the
            // buffer kept elsewhere is refused by wgpu from here on.
            arena.buffer.destroy();
            self.used_bytes -= block.size_bytes;
            self.blocks_freed += 1;
        }
    }

    fn available_bytes(&self) -> Option<u64> {
        // wgpu reports no memory budget; a heap budget (`HeapConfig::capacity_bytes`) is the way to cap arenas.
        None
    }

    /// Compaction's copies, `copy_buffer_to_buffer` in one command encoder in order (wgpu orders a copy after one
    /// that wrote or read the same buffer; a copy within one arena goes through a scratch buffer, since wgpu copies
    /// between two buffers only), submitted and waited for. wgpu copies whole 4-byte words: each size is
    /// rounded up to 4, which stays inside the allocation (its place is at least 4-aligned on both sides).
    fn copy_between_blocks(&mut self, copies: &[BlockCopy]) -> Result<(), SourceError> {
        let arena = |handle: u64| {
            self.arenas
                .values()
                .find(|arena| arena.handle == handle)
                .map(|arena| &arena.buffer)
                .ok_or_else(|| SourceError::Failed(format!("a copy names arena #{handle}, which is not live")))
        };
        let device = self.device.device();
        // wgpu copies between two buffers only: a move within one arena goes through a scratch buffer.
        let scratch_bytes = copies
            .iter()
            .filter(|copy| copy.from_block == copy.to_block)
            .map(|copy| copy.size_bytes.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT))
            .max();
        // Made inside error scopes: a device without room for it fails this compaction, named, instead of logging an
        // uncaptured error that fails the whole run.
        let scratch = match scratch_bytes {
            Some(size) => Some(
                self.device
                    .scoped(|| {
                        device.create_buffer(&wgpu::BufferDescriptor {
                            label: Some("heapscope compaction scratch"),
                            size,
                            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                            mapped_at_creation: false,
                        })
                    })
                    .map_err(|caught| {
                        SourceError::Failed(format!("the compaction's scratch buffer of {size} B: {}", caught.message))
                    })?,
            ),
            None => None,
        };
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("heapscope compaction") });
        for copy in copies {
            let (from, to) = (arena(copy.from_block)?, arena(copy.to_block)?);
            let size = copy.size_bytes.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
            let fits = |buffer: &wgpu::Buffer, offset: u64| {
                offset.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT)
                    && offset.checked_add(size).is_some_and(|end| end <= buffer.size())
            };
            if !fits(from, copy.from_offset_bytes) || !fits(to, copy.to_offset_bytes) {
                return Err(SourceError::Failed(format!(
                    "a copy of {size} B from arena #{} at {} to arena #{} at {} lies outside them or is not 4-aligned",
                    copy.from_block, copy.from_offset_bytes, copy.to_block, copy.to_offset_bytes
                )));
            }
            match &scratch {
                Some(scratch) if copy.from_block == copy.to_block => {
                    encoder.copy_buffer_to_buffer(from, copy.from_offset_bytes, scratch, 0, size);
                    encoder.copy_buffer_to_buffer(scratch, 0, to, copy.to_offset_bytes, size);
                }
                _ => encoder.copy_buffer_to_buffer(from, copy.from_offset_bytes, to, copy.to_offset_bytes, size),
            }
        }
        let submission = self.device.scoped(|| self.device.queue().submit([encoder.finish()])).map_err(|caught| {
            SourceError::Failed(format!("copying {} moves between arenas: {}", copies.len(), caught.message))
        })?;
        self.device.wait(Some(submission)).map_err(|error| SourceError::Failed(error.to_string()))
    }
}

/// How an [`ArenaHeap`] is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaConfig {
    /// The heap's rules: policy, block (arena) size, dedicated threshold, release rule, budget. The block size is
    /// clamped to the largest buffer the device makes.
    pub heap: HeapConfig,
    /// A lower cap on the binding size than the device's `max_storage_buffer_binding_size` (to exercise the limit
    /// with small buffers, or to match another device).
    pub max_binding_bytes: Option<u64>,
    /// Arena sizes are multiples of this (a power of two; raised to the storage offset alignment): by default
    /// [`ArenaSource::ALIGNMENT_BYTES`].
    pub min_block_alignment_bytes: u64,
}

impl ArenaConfig {
    /// The core's default heap rules for `policy`, the device's binding limit.
    pub fn new(policy: heapscope_core::PolicyKind) -> Self {
        Self { heap: HeapConfig::new(policy), max_binding_bytes: None, min_block_alignment_bytes: ArenaSource::ALIGNMENT_BYTES }
    }
}

/// A live allocation in an arena: the arena, the range, and what wgpu binds.
#[derive(Clone, Debug)]
pub struct ArenaAllocation {
    heap: HeapAllocation,
    buffer: wgpu::Buffer,
    offset_bytes: u64,
    size_bytes: u64,
    binding_bytes: u64,
    /// The alignment it was placed with (a move keeps it).
    align_bytes: u64,
}

impl ArenaAllocation {
    /// The arena.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Where the allocation starts in its arena (a multiple of `min_storage_buffer_offset_alignment`).
    pub fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }

    /// Bytes asked for.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Bytes a binding covers: the size rounded up to 4 (all of them the allocation's).
    pub fn binding_bytes(&self) -> u64 {
        self.binding_bytes
    }

    /// The heap's handle (block, offset, address).
    pub fn heap_allocation(&self) -> &HeapAllocation {
        &self.heap
    }

    /// heapscope's address of the allocation (the arena's base plus the offset).
    pub fn address(&self) -> u64 {
        self.heap.address()
    }

    /// The allocation's bytes as a slice of the arena (for copies, mapping is not offered: arenas are not
    /// mappable).
    pub fn slice(&self) -> wgpu::BufferSlice<'_> {
        self.buffer.slice(self.offset_bytes..self.offset_bytes + self.binding_bytes)
    }

    /// The allocation as a buffer binding (arena, offset, size), for a bind group entry.
    pub fn binding(&self) -> wgpu::BufferBinding<'_> {
        wgpu::BufferBinding { buffer: &self.buffer, offset: self.offset_bytes, size: NonZeroU64::new(self.binding_bytes) }
    }

    /// The arena, for the kernels.
    pub fn kernel_buffer(&self) -> KernelBuffer<'_> {
        KernelBuffer::new(&self.buffer)
    }
}

/// The core [`Heap`] over [`ArenaSource`]: any policy inside `wgpu::Buffer` arenas. See the module documentation.
#[derive(Debug)]
pub struct ArenaHeap {
    heap: Heap<ArenaSource>,
    binding_limit_bytes: u64,
    offset_alignment_bytes: u64,
}

impl ArenaHeap {
    /// A heap of arenas on `device`.
    ///
    /// # Errors
    /// [`WgpuError::InvalidConfig`] for a binding cap that holds no word, a block alignment that is not a power of
    /// two, or a device whose largest buffer is smaller than one block unit; [`WgpuError::Heap`] for invalid heap
    /// settings.
    pub fn new(device: Arc<WgpuDevice>, config: ArenaConfig) -> Result<Self, WgpuError> {
        let limits = device.limits();
        let offset_alignment_bytes = u64::from(limits.min_storage_buffer_offset_alignment).max(4);
        let device_binding = limits.max_storage_buffer_binding_size;
        let binding_limit_bytes = config.max_binding_bytes.map_or(device_binding, |cap| cap.min(device_binding)) / 4 * 4;
        if binding_limit_bytes == 0 {
            return Err(WgpuError::InvalidConfig(format!(
                "a binding limit of {:?} B (device: {device_binding} B) holds no 4-byte word",
                config.max_binding_bytes
            )));
        }
        if !config.min_block_alignment_bytes.is_power_of_two() {
            return Err(WgpuError::InvalidConfig(format!(
                "a block alignment of {} B is not a power of two",
                config.min_block_alignment_bytes
            )));
        }
        let source = ArenaSource::with_block_alignment(device, config.min_block_alignment_bytes);
        let max_arena = source.max_arena_bytes();
        if max_arena == 0 {
            return Err(WgpuError::InvalidConfig(format!(
                "the device's largest buffer ({} B) is smaller than one arena unit ({} B)",
                source.device().limits().max_buffer_size,
                source.block_alignment_bytes()
            )));
        }
        let mut heap_config = config.heap;
        heap_config.block_size_bytes = heap_config.block_size_bytes.min(max_arena);
        let heap = Heap::new(heap_config, source)?;
        Ok(Self { heap, binding_limit_bytes, offset_alignment_bytes })
    }

    /// The largest allocation: the binding limit (every allocation is bindable whole), or the largest arena.
    pub fn max_allocation_bytes(&self) -> u64 {
        self.binding_limit_bytes.min(self.heap.source().max_arena_bytes())
    }

    /// The binding limit allocations respect.
    pub fn binding_limit_bytes(&self) -> u64 {
        self.binding_limit_bytes
    }

    /// The alignment every allocation's offset has at least (`min_storage_buffer_offset_alignment`).
    pub fn offset_alignment_bytes(&self) -> u64 {
        self.offset_alignment_bytes
    }

    /// Serves `size_bytes` aligned to `align_bytes` (raised to the storage offset alignment), remembering `label`.
    ///
    /// # Errors
    /// [`WgpuError::TooLargeToBind`] above [`ArenaHeap::max_allocation_bytes`]; [`WgpuError::Heap`] for an
    /// invalid request (zero size, alignment not a power of two), out of memory with the heap's verdict, or a
    /// failing arena.
    pub fn allocate(&mut self, size_bytes: u64, align_bytes: u64, label: Option<&str>) -> Result<ArenaAllocation, WgpuError> {
        let limit = self.max_allocation_bytes();
        if size_bytes > limit {
            self.heap.count_refused();
            let (limit_bytes, limit) = if limit == self.binding_limit_bytes {
                (limit, "max_storage_buffer_binding_size, or the arena's binding cap")
            } else {
                (limit, "max_buffer_size")
            };
            return Err(WgpuError::TooLargeToBind { size_bytes, limit_bytes, limit });
        }
        // Validates size and alignment first (zero, not a power of two), then rounds for binding.
        Request::new(size_bytes, align_bytes)?;
        let binding_bytes = size_bytes.div_ceil(4) * 4;
        let align_bytes = align_bytes.max(self.offset_alignment_bytes);
        let request = Request::new(binding_bytes, align_bytes)?;
        let heap = self.heap.allocate(request, label)?;
        self.allocation(heap, size_bytes, align_bytes).inspect_err(|_| {
            // Cannot happen (the heap's blocks are the source's live arenas); undo rather than panic.
            self.heap.free(heap).ok();
        })
    }

    /// The allocation the heap handed out as `heap`, for `size_bytes` placed with `align_bytes`.
    fn allocation(&self, heap: HeapAllocation, size_bytes: u64, align_bytes: u64) -> Result<ArenaAllocation, WgpuError> {
        let Some((buffer, offset_bytes)) = self.heap.source().locate(heap.address()) else {
            let address = heap.address();
            return Err(WgpuError::Heap(heapscope_core::Error::Source(format!("no arena holds address {address:#x}"))));
        };
        let binding_bytes = size_bytes.div_ceil(4) * 4;
        Ok(ArenaAllocation { heap, buffer: buffer.clone(), offset_bytes, size_bytes, binding_bytes, align_bytes })
    }

    /// Moves allocations of `movable` (those the caller lets move; the others stay) to gather free space: the heap's
    /// compaction ([`Heap::compact`], `algorithm` within `budget`), the arenas copying each move's bytes on the device
    /// before an arena it emptied is released. Returns each move the heap made, in its order, as the index in
    /// `movable` and the allocation now: an allocation that moved twice is listed twice (a count of moves stays the
    /// heap's), each time where it ended up (an arena it passed through may be gone). The ones it replaces are gone.
    ///
    /// # Errors
    /// [`WgpuError::Heap`] when the device failed to copy (the moved allocations' bytes are then undefined).
    pub fn compact(
        &mut self,
        movable: &[ArenaAllocation],
        algorithm: heapscope_core::compaction::Algorithm,
        budget: heapscope_core::compaction::Budget,
    ) -> Result<Vec<(usize, ArenaAllocation)>, WgpuError> {
        let listed = movable
            .iter()
            .map(|allocation| Ok((allocation.heap, Request::new(allocation.binding_bytes, allocation.align_bytes)?)))
            .collect::<Result<Vec<_>, heapscope_core::Error>>()?;
        let moves = heapscope_core::DeviceHeap::compact(&mut self.heap, &listed, algorithm, budget)?;
        // Where each moved allocation ended up (an arena it passed through may be gone).
        let last: BTreeMap<usize, HeapAllocation> = moves.iter().copied().collect();
        let now = last
            .into_iter()
            .map(|(index, heap)| {
                let before = &movable[index];
                Ok((index, self.allocation(heap, before.size_bytes, before.align_bytes)?))
            })
            .collect::<Result<BTreeMap<usize, ArenaAllocation>, WgpuError>>()?;
        Ok(moves.into_iter().map(|(index, _)| (index, now[&index].clone())).collect())
    }

    /// Frees an allocation of this heap; an arena left empty is released by the heap's rule.
    ///
    /// # Errors
    /// [`WgpuError::Heap`] for a double free or another heap's allocation.
    #[expect(clippy::needless_pass_by_value, reason = "the handle (and its clone of the arena) is used up by the free")]
    pub fn free(&mut self, allocation: ArenaAllocation) -> Result<(), WgpuError> {
        self.heap.free(allocation.heap)?;
        Ok(())
    }

    /// Releases every empty arena; returns how many.
    pub fn release_empty_arenas(&mut self) -> usize {
        self.heap.release_empty_blocks()
    }

    /// The core heap (its config, source, counters).
    pub fn heap(&self) -> &Heap<ArenaSource> {
        &self.heap
    }

    /// The arenas' layout and totals.
    pub fn report(&self) -> HeapReport {
        self.heap.report()
    }

    /// The heap's counters.
    pub fn stats(&self) -> &HeapStats {
        self.heap.stats()
    }

    /// Live arenas.
    pub fn live_arenas(&self) -> usize {
        self.heap.source().live_arenas()
    }
}
