//! [`DeviceMemorySource`]: `vkAllocateMemory` blocks of one memory type as a heapscope [`MemorySource`].
//!
//! Blocks get addresses in a synthetic address space (increasing, never reused, aligned to
//! [`DeviceMemorySource::ADDRESS_ALIGNMENT_BYTES`] or the block alignment, whichever is larger, so that an
//! allocation's address is as aligned as its offset in the block), like [`heapscope_core::SimulatedSource`]: Vulkan memory has no address of its own.
//! [`DeviceMemorySource::locate`] turns an address back into a block and an offset, and
//! [`DeviceMemorySource::write_bytes`] / [`DeviceMemorySource::read_bytes`] reach host-visible memory through
//! the block's persistent mapping.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use ash::vk;
use heapscope_core::{BlockCopy, MemorySource, SourceBlock, SourceError};

use crate::memory_types::{BLOCK_BUFFER_USAGE, MemoryTypeInfo, MemoryUsage};
use crate::transfer::{BufferCopy, MemorySpan, Transfer, block_buffer_requirements, buffer_over_memory};
use crate::{VulkanContext, VulkanError};

/// How a [`DeviceMemorySource`] allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSourceConfig {
    /// What the memory is for: chooses the memory type.
    pub usage: MemoryUsage,
    /// Map every block of a host-visible type for its whole life.
    pub persistent_mapping: bool,
    /// At most this many bytes allocated at once; beyond, [`SourceError::OutOfMemory`] (budget cap injection).
    pub budget_cap_bytes: Option<u64>,
    /// At most this many live blocks of this source, below the device's `maxMemoryAllocationCount`.
    pub max_blocks: Option<u32>,
    /// Print a line to stderr when the source is dropped with live blocks (it frees them either way).
    pub report_leaks_on_drop: bool,
    /// Block sizes and addresses are multiples of at least this (a power of two): the same block granularity as
    /// another source, such as a simulated one in a side-by-side run.
    pub min_block_alignment_bytes: u64,
}

impl DeviceSourceConfig {
    /// Memory for `usage`, mapped when host-visible, no cap, leaks reported on drop.
    pub fn new(usage: MemoryUsage) -> Self {
        Self {
            usage,
            persistent_mapping: true,
            budget_cap_bytes: None,
            max_blocks: None,
            report_leaks_on_drop: true,
            min_block_alignment_bytes: 1,
        }
    }

    /// Device-local memory the host never maps, at most `budget_cap_bytes`, no leak report on drop (the owner frees
    /// or drops every block): the source of heaps that only the device's kernels touch — device replays, bench
    /// targets, PyTorch's segments.
    pub fn device_only(budget_cap_bytes: Option<u64>) -> Self {
        Self { persistent_mapping: false, budget_cap_bytes, report_leaks_on_drop: false, ..Self::new(MemoryUsage::DeviceLocal) }
    }
}

/// A live block of a [`DeviceMemorySource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// The handle in its [`SourceBlock`].
    pub handle: u64,
    /// Its synthetic base address.
    pub base_address: u64,
    /// The size handed out.
    pub size_bytes: u64,
    /// The size allocated from Vulkan (a dedicated block's buffer may need more than was asked for).
    pub allocation_size_bytes: u64,
    /// The memory.
    pub memory: vk::DeviceMemory,
    /// The persistent mapping of its first byte, when mapped.
    pub mapped_ptr: Option<NonNull<u8>>,
    /// For a dedicated block, the buffer the memory is dedicated to (bound at offset 0).
    pub dedicated_buffer: Option<vk::Buffer>,
}

/// Blocks still live: what [`DeviceMemorySource::leak_report`] and [`DeviceMemorySource::release_all`] say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeakReport {
    /// The live blocks, by address: `(handle, base_address, size_bytes, dedicated)`.
    pub blocks: Vec<LeakedBlock>,
    /// Their allocation sizes, summed.
    pub leaked_bytes: u64,
}

/// One block in a [`LeakReport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakedBlock {
    /// Its handle.
    pub handle: u64,
    /// Its synthetic base address.
    pub base_address: u64,
    /// Its size.
    pub size_bytes: u64,
    /// Whether it is a dedicated block.
    pub dedicated: bool,
}

impl LeakReport {
    /// No block was live.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} live block(s), {} bytes", self.blocks.len(), self.leaked_bytes)?;
        for block in &self.blocks {
            let kind = if block.dedicated { " dedicated" } else { "" };
            write!(f, "; #{} at {:#x}, {} bytes{kind}", block.handle, block.base_address, block.size_bytes)?;
        }
        Ok(())
    }
}

/// `vkAllocateMemory` blocks of one memory type. See the module documentation.
pub struct DeviceMemorySource {
    context: Arc<VulkanContext>,
    config: DeviceSourceConfig,
    name: String,
    memory_type: MemoryTypeInfo,
    alignment_bytes: u64,
    non_coherent_atom_bytes: Option<u64>,
    blocks: HashMap<u64, BlockInfo>,
    by_address: BTreeMap<u64, u64>,
    used_bytes: u64,
    next_address: u64,
    next_handle: u64,
    blocks_allocated: u64,
    blocks_freed: u64,
    /// Command buffers for copies between blocks, made at the first copy.
    transfer: Option<Transfer>,
    copies: CopyStats,
}

/// What the source's copies between blocks took ([`MemorySource::copy_between_blocks`]: compaction's moves).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Copies made.
    pub copies: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Submissions of them.
    pub submits: u64,
    /// Wall time from recording each submission to its fence, on the host, ns: the device's copy time and the
    /// submission's overhead.
    pub nanos: u64,
}

// SAFETY: the source owns its memory, mappings and buffers; Vulkan handles and mapped pointers may be used from
// any thread, and every use goes through `&mut self` or, for the mapped bytes, `&self` of a type that is not
// `Sync` (so never from two threads at once).
unsafe impl Send for DeviceMemorySource {}

impl fmt::Debug for DeviceMemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemorySource")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("alignment_bytes", &self.alignment_bytes)
            .field("live_blocks", &self.blocks.len())
            .field("used_bytes", &self.used_bytes)
            .finish_non_exhaustive()
    }
}

/// A Vulkan failure as a source error: out of device or host memory is [`SourceError::OutOfMemory`].
fn source_error(call: &str, result: vk::Result, requested_bytes: u64) -> SourceError {
    match result {
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
            SourceError::OutOfMemory { requested_bytes }
        }
        other => SourceError::Failed(format!("{call} failed: {other}")),
    }
}

impl DeviceMemorySource {
    /// The synthetic address of the first block.
    pub const BASE_ADDRESS: u64 = 0x4000_0000_0000;

    /// Synthetic block addresses are multiples of this (or of the block alignment when larger).
    pub const ADDRESS_ALIGNMENT_BYTES: u64 = 64 << 10;

    /// A source of memory for `config.usage` on `context`'s device.
    ///
    /// The memory type is the one [`MemoryProperties::select_memory_type`](crate::memory_types::MemoryProperties::select_memory_type)
    /// picks (heap sizes known: a large BAR may serve uploads) among those a buffer of
    /// [`BLOCK_BUFFER_USAGE`] accepts; the block alignment is the largest of that buffer's alignment,
    /// `bufferImageGranularity`, (for host-visible, non-coherent types) `nonCoherentAtomSize` and
    /// [`DeviceSourceConfig::min_block_alignment_bytes`].
    ///
    /// # Errors
    /// [`VulkanError::Vk`] when the throwaway buffer cannot be created, [`VulkanError::Unsupported`] when no
    /// memory type fits the usage.
    pub fn new(context: Arc<VulkanContext>, config: DeviceSourceConfig) -> Result<Self, VulkanError> {
        let requirements = block_buffer_requirements(&context)?;
        let type_bits = requirements.memory_type_bits;
        let properties = context.properties();
        let index = properties.memory_properties().select_memory_type(type_bits, config.usage).ok_or_else(|| {
            VulkanError::Unsupported(format!(
                "{} has no memory type for {:?} among type bits {type_bits:#b}",
                properties.name, config.usage
            ))
        })?;
        let memory_type = properties
            .memory_types
            .iter()
            .find(|info| info.index == index)
            .copied()
            .ok_or_else(|| VulkanError::Unsupported(format!("memory type {index} is not among the device's types")))?;
        let flags = memory_type.property_flags;
        let host_visible = flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE);
        let non_coherent = host_visible && !flags.contains(vk::MemoryPropertyFlags::HOST_COHERENT);
        let limits = &properties.limits;
        let non_coherent_atom_bytes = non_coherent.then_some(limits.non_coherent_atom_size_bytes.max(1));
        let alignment_bytes = requirements
            .alignment
            .max(limits.buffer_image_granularity_bytes)
            .max(non_coherent_atom_bytes.unwrap_or(1))
            .max(config.min_block_alignment_bytes)
            .max(1)
            .next_power_of_two();
        let name = format!("{} memory type {index} ({flags:?})", properties.name);
        Ok(Self {
            context,
            config: DeviceSourceConfig { persistent_mapping: config.persistent_mapping && host_visible, ..config },
            name,
            memory_type,
            alignment_bytes,
            non_coherent_atom_bytes,
            blocks: HashMap::new(),
            by_address: BTreeMap::new(),
            used_bytes: 0,
            next_address: Self::BASE_ADDRESS,
            next_handle: 1,
            blocks_allocated: 0,
            blocks_freed: 0,
            transfer: None,
            copies: CopyStats::default(),
        })
    }

    /// The context.
    pub fn context(&self) -> &Arc<VulkanContext> {
        &self.context
    }

    /// The settings (`persistent_mapping` is off for a type that is not host-visible).
    pub fn config(&self) -> &DeviceSourceConfig {
        &self.config
    }

    /// The memory type its blocks come from.
    pub fn memory_type(&self) -> MemoryTypeInfo {
        self.memory_type
    }

    /// Bytes allocated from Vulkan and not freed.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Live blocks.
    pub fn live_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks allocated and freed so far.
    pub fn block_counts(&self) -> (u64, u64) {
        (self.blocks_allocated, self.blocks_freed)
    }

    /// What its copies between blocks took so far.
    pub fn copy_stats(&self) -> CopyStats {
        self.copies
    }

    /// A `VkBuffer` over live block `handle` ([`BLOCK_BUFFER_USAGE`], the memory bound at offset 0), its size, and
    /// whether it is new: a dedicated block's own buffer is lent (`false`); a new one (`true`) is the caller's to
    /// destroy, after its last use and before the block is freed.
    ///
    /// # Errors
    /// [`VulkanError::Unsupported`] when there is no such live block, or a buffer of its size needs more memory or
    /// another memory type; [`VulkanError::Vk`] when creating or binding the buffer fails.
    pub(crate) fn buffer_over(&self, handle: u64) -> Result<(vk::Buffer, u64, bool), VulkanError> {
        let block = self.block(handle).ok_or_else(|| VulkanError::Unsupported(format!("no live block #{handle}")))?;
        if let Some(buffer) = block.dedicated_buffer {
            return Ok((buffer, block.size_bytes, false));
        }
        let memory = MemorySpan {
            memory: block.memory,
            type_index: self.memory_type.index,
            size_bytes: block.size_bytes,
            allocation_size_bytes: block.allocation_size_bytes,
        };
        let buffer = buffer_over_memory(&self.context, memory, || format!("block #{handle}"))?;
        Ok((buffer, block.size_bytes, true))
    }

    /// Makes `copies` on the device in order (see [`MemorySource::copy_between_blocks`]), each range checked to lie
    /// inside its live block, through a buffer over each block involved (destroyed after the copies). The heap says
    /// how many bytes each move copies (whole words where its alignment allows: `Heap::compact`).
    fn copy_in_order(&self, transfer: &mut Transfer, copies: &[BlockCopy]) -> Result<(), VulkanError> {
        let mut buffers: HashMap<u64, (vk::Buffer, bool)> = HashMap::new();
        let copied = self.copy_through(transfer, copies, &mut buffers);
        for (buffer, owned) in buffers.into_values() {
            if owned {
                // SAFETY: the buffer was made by `buffer_over` for these copies, which were waited for (or never
                // submitted).
                unsafe { self.context.device().destroy_buffer(buffer, None) };
            }
        }
        copied
    }

    /// [`Self::copy_in_order`] with the buffers over the blocks kept in `buffers` (for the caller to destroy).
    fn copy_through(
        &self,
        transfer: &mut Transfer,
        copies: &[BlockCopy],
        buffers: &mut HashMap<u64, (vk::Buffer, bool)>,
    ) -> Result<(), VulkanError> {
        for copy in copies {
            for (handle, offset) in [(copy.from_block, copy.from_offset_bytes), (copy.to_block, copy.to_offset_bytes)] {
                let block =
                    self.blocks.get(&handle).ok_or_else(|| VulkanError::Unsupported(format!("no live block #{handle}")))?;
                if offset.checked_add(copy.size_bytes).is_none_or(|end| end > block.size_bytes) || copy.size_bytes == 0 {
                    return Err(VulkanError::Unsupported(format!(
                        "a copy of {} bytes at offset {offset} of block #{handle} ({} bytes)",
                        copy.size_bytes, block.size_bytes
                    )));
                }
                if let std::collections::hash_map::Entry::Vacant(entry) = buffers.entry(handle) {
                    let (buffer, _, owned) = self.buffer_over(handle)?;
                    entry.insert((buffer, owned));
                }
            }
            let same_block = copy.from_block == copy.to_block;
            let apart = copy.from_offset_bytes + copy.size_bytes <= copy.to_offset_bytes
                || copy.to_offset_bytes + copy.size_bytes <= copy.from_offset_bytes;
            if same_block && !apart {
                return Err(VulkanError::Unsupported(format!(
                    "a copy within block #{} from offset {} to {} overlaps itself",
                    copy.from_block, copy.from_offset_bytes, copy.to_offset_bytes
                )));
            }
        }
        let buffer = |handle: u64| buffers.get(&handle).map_or(vk::Buffer::null(), |&(buffer, _)| buffer);
        let recorded: Vec<BufferCopy> = copies
            .iter()
            .map(|copy| BufferCopy {
                source: buffer(copy.from_block),
                source_offset: copy.from_offset_bytes,
                destination: buffer(copy.to_block),
                destination_offset: copy.to_offset_bytes,
                size_bytes: copy.size_bytes,
            })
            .collect();
        // SAFETY: every buffer is a live buffer over a live block of this source (borrowed for the call; the buffers
        // outlive the copies) with the block's transfer usages; every range was checked to lie inside its block and not to overlap itself; the
        // source is borrowed, so nothing else uses the blocks until the copies are waited for.
        unsafe { transfer.copy_in_order(&recorded) }
    }

    /// The live block with this handle.
    pub fn block(&self, handle: u64) -> Option<&BlockInfo> {
        self.blocks.get(&handle)
    }

    /// The persistent mapping of a live block's first byte.
    pub fn mapped_ptr(&self, handle: u64) -> Option<NonNull<u8>> {
        self.blocks.get(&handle)?.mapped_ptr
    }

    /// The live block holding `address`, and the offset in it.
    pub fn locate(&self, address: u64) -> Option<(&BlockInfo, u64)> {
        let (_, handle) = self.by_address.range(..=address).next_back()?;
        let block = self.blocks.get(handle)?;
        let offset = address - block.base_address;
        (offset < block.size_bytes).then_some((block, offset))
    }

    /// Copies `bytes` to `address` through the persistent mapping (flushing non-coherent memory).
    ///
    /// # Errors
    /// [`SourceError::Failed`] when the range is not inside one mapped live block, or the flush fails.
    pub fn write_bytes(&self, address: u64, bytes: &[u8]) -> Result<(), SourceError> {
        let (block, offset, pointer) = self.mapped_range(address, bytes.len())?;
        // SAFETY: `mapped_range` checked that `offset..offset + len` lies inside the block's live mapping; the
        // source never hands out references into mapped memory and is not `Sync`, so nothing aliases the copy.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), pointer.as_ptr(), bytes.len()) };
        if let Some(range) = self.atom_range(&block, offset, bytes.len()) {
            // SAFETY: the range lies in the block's mapped memory, aligned to `nonCoherentAtomSize` or to its end.
            unsafe { self.context.device().flush_mapped_memory_ranges(&[range]) }
                .map_err(|result| SourceError::Failed(format!("vkFlushMappedMemoryRanges failed: {result}")))?;
        }
        Ok(())
    }

    /// Copies `out.len()` bytes at `address` out of the persistent mapping (invalidating non-coherent memory).
    ///
    /// # Errors
    /// [`SourceError::Failed`] when the range is not inside one mapped live block, or the invalidation fails.
    pub fn read_bytes(&self, address: u64, out: &mut [u8]) -> Result<(), SourceError> {
        let (block, offset, pointer) = self.mapped_range(address, out.len())?;
        if let Some(range) = self.atom_range(&block, offset, out.len()) {
            // SAFETY: as in `write_bytes`.
            unsafe { self.context.device().invalidate_mapped_memory_ranges(&[range]) }
                .map_err(|result| SourceError::Failed(format!("vkInvalidateMappedMemoryRanges failed: {result}")))?;
        }
        // SAFETY: as in `write_bytes`; `out` is a distinct Rust buffer of the same length.
        unsafe { std::ptr::copy_nonoverlapping(pointer.as_ptr(), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The block, the offset and the mapped pointer of `len` bytes at `address`, all inside one mapped block.
    fn mapped_range(&self, address: u64, len: usize) -> Result<(BlockInfo, u64, NonNull<u8>), SourceError> {
        let (block, offset) =
            self.locate(address).ok_or_else(|| SourceError::Failed(format!("address {address:#x} is in no live block")))?;
        let len_bytes = len as u64;
        if offset.checked_add(len_bytes).is_none_or(|end| end > block.size_bytes) {
            return Err(SourceError::Failed(format!("{len} bytes at {address:#x} run past the end of block #{}", block.handle)));
        }
        let base = block.mapped_ptr.ok_or_else(|| SourceError::Failed(format!("block #{} is not mapped", block.handle)))?;
        let offset_usize = usize::try_from(offset).map_err(|_| SourceError::Failed("offset exceeds usize".into()))?;
        // SAFETY: `offset + len <= size_bytes <= allocation_size_bytes`, the length of the mapping.
        let pointer = unsafe { base.add(offset_usize) };
        Ok((*block, offset, pointer))
    }

    /// The flush or invalidate range covering `len` bytes at `offset`, for non-coherent memory.
    fn atom_range(&self, block: &BlockInfo, offset: u64, len: usize) -> Option<vk::MappedMemoryRange<'static>> {
        let atom = self.non_coherent_atom_bytes?;
        let start = offset / atom * atom;
        let end = (offset + len as u64).div_ceil(atom) * atom;
        let size = if end >= block.allocation_size_bytes { vk::WHOLE_SIZE } else { end - start };
        Some(vk::MappedMemoryRange::default().memory(block.memory).offset(start).size(size))
    }

    /// A block of memory dedicated to a buffer of `size_bytes` ([`BLOCK_BUFFER_USAGE`]) created for it and
    /// bound at offset 0 (`VkMemoryDedicatedAllocateInfo`, core since Vulkan 1.1). The buffer lives with the
    /// block: [`BlockInfo::dedicated_buffer`]; [`MemorySource::free_block`] destroys both.
    ///
    /// # Errors
    /// As [`MemorySource::allocate_block`]; [`SourceError::Failed`] when the buffer cannot use this source's
    /// memory type.
    pub fn allocate_dedicated_block(&mut self, size_bytes: u64) -> Result<SourceBlock, SourceError> {
        if size_bytes == 0 {
            return Err(SourceError::Failed("a dedicated block of 0 bytes".into()));
        }
        self.context.check_buffer_size(size_bytes, "a dedicated block's buffer").map_err(SourceError::Failed)?;
        let device = self.context.device();
        let buffer_info =
            vk::BufferCreateInfo::default().size(size_bytes).usage(BLOCK_BUFFER_USAGE).sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid create info on a live device.
        let buffer = unsafe { device.create_buffer(&buffer_info, None) }
            .map_err(|result| source_error("vkCreateBuffer", result, size_bytes))?;
        // SAFETY: the buffer was just created on this device.
        let requirements = unsafe { device.get_buffer_memory_requirements(buffer) };
        let result = if requirements.memory_type_bits & (1 << self.memory_type.index) == 0 {
            Err(SourceError::Failed(format!(
                "a buffer of {size_bytes} bytes cannot use memory type {} (type bits {:#b})",
                self.memory_type.index, requirements.memory_type_bits
            )))
        } else {
            self.allocate(size_bytes, requirements.size, Some(buffer))
        };
        if result.is_err() {
            // SAFETY: `allocate` failed, so the buffer is unused; its memory, if it was bound, is already freed
            // (destroying a buffer whose memory was freed is valid).
            unsafe { self.context.device().destroy_buffer(buffer, None) };
        }
        result
    }

    /// What is live now.
    pub fn leak_report(&self) -> LeakReport {
        let blocks: Vec<LeakedBlock> = self
            .by_address
            .values()
            .filter_map(|handle| self.blocks.get(handle))
            .map(|block| LeakedBlock {
                handle: block.handle,
                base_address: block.base_address,
                size_bytes: block.size_bytes,
                dedicated: block.dedicated_buffer.is_some(),
            })
            .collect();
        let leaked_bytes = self.blocks.values().map(|block| block.allocation_size_bytes).sum();
        LeakReport { blocks, leaked_bytes }
    }

    /// Frees every live block; returns what was live.
    pub fn release_all(&mut self) -> LeakReport {
        let report = self.leak_report();
        let handles: Vec<u64> = self.blocks.keys().copied().collect();
        for handle in handles {
            self.release(handle);
        }
        report
    }

    /// Allocates `allocation_size_bytes` (dedicated to `buffer` when given), maps it and registers the block.
    fn allocate(
        &mut self,
        size_bytes: u64,
        allocation_size_bytes: u64,
        buffer: Option<vk::Buffer>,
    ) -> Result<SourceBlock, SourceError> {
        if let Some(cap) = self.config.budget_cap_bytes
            && self.used_bytes.saturating_add(allocation_size_bytes) > cap
        {
            return Err(SourceError::OutOfMemory { requested_bytes: size_bytes });
        }
        // A block larger than its memory heap is no device's to give (asking is invalid usage,
        // VUID-vkAllocateMemory-pAllocateInfo-01713): refused as out of memory, as gpu-allocator and VMA refuse it.
        let heap_bytes = self.context.properties().heap_of_type(self.memory_type.index).map_or(u64::MAX, |heap| heap.size_bytes);
        if allocation_size_bytes > heap_bytes {
            return Err(SourceError::OutOfMemory { requested_bytes: size_bytes });
        }
        // Nor one past the device's `maxMemoryAllocationSize`: the driver may refuse it, or serve it (NVIDIA) where the
        // validation layer reports it; refused as out of memory, as VMA refuses it.
        if self.context.properties().limits.max_memory_allocation_size_bytes.is_some_and(|max| allocation_size_bytes > max) {
            return Err(SourceError::OutOfMemory { requested_bytes: size_bytes });
        }
        let address_alignment = self.alignment_bytes.max(Self::ADDRESS_ALIGNMENT_BYTES);
        let span_bytes = allocation_size_bytes.max(size_bytes).checked_next_multiple_of(address_alignment);
        let Some(span_bytes) = span_bytes.filter(|&span| self.next_address.checked_add(span).is_some()) else {
            return Err(SourceError::OutOfMemory { requested_bytes: size_bytes });
        };
        self.take_allocation_slot()?;
        let device = self.context.device();
        let mut dedicated = vk::MemoryDedicatedAllocateInfo::default();
        let mut info =
            vk::MemoryAllocateInfo::default().allocation_size(allocation_size_bytes).memory_type_index(self.memory_type.index);
        if let Some(buffer) = buffer {
            dedicated = dedicated.buffer(buffer);
            info = info.push_next(&mut dedicated);
        }
        // SAFETY: a valid allocate info on a live device; the memory type index is the device's.
        let memory = match unsafe { device.allocate_memory(&info, None) } {
            Ok(memory) => memory,
            Err(result) => {
                self.give_back_allocation_slot();
                return Err(source_error("vkAllocateMemory", result, size_bytes));
            }
        };
        let undo = |source: &Self, error: SourceError| {
            // SAFETY: the memory was just allocated; nothing uses it (a failed bind or map leaves it unbound/unmapped).
            unsafe { source.context.device().free_memory(memory, None) };
            source.give_back_allocation_slot();
            Err(error)
        };
        if let Some(buffer) = buffer {
            // SAFETY: the memory was allocated for this buffer (dedicated), of its required size and an allowed type.
            if let Err(result) = unsafe { device.bind_buffer_memory(buffer, memory, 0) } {
                return undo(self, source_error("vkBindBufferMemory", result, size_bytes));
            }
        }
        let mapped_ptr = if self.config.persistent_mapping {
            // SAFETY: the memory is host-visible (checked in `new`) and not mapped yet.
            match unsafe { device.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) } {
                Ok(pointer) => NonNull::new(pointer.cast::<u8>()),
                Err(result) => return undo(self, source_error("vkMapMemory", result, size_bytes)),
            }
        } else {
            None
        };
        let block = BlockInfo {
            handle: self.next_handle,
            base_address: self.next_address,
            size_bytes,
            allocation_size_bytes,
            memory,
            mapped_ptr,
            dedicated_buffer: buffer,
        };
        self.next_handle += 1;
        self.next_address += span_bytes;
        self.used_bytes += allocation_size_bytes;
        self.blocks_allocated += 1;
        self.by_address.insert(block.base_address, block.handle);
        self.blocks.insert(block.handle, block);
        Ok(SourceBlock { handle: block.handle, base_address: block.base_address, size_bytes })
    }

    /// Counts one more live allocation on the device, or refuses past `maxMemoryAllocationCount` (or `max_blocks`).
    fn take_allocation_slot(&self) -> Result<(), SourceError> {
        if let Some(max_blocks) = self.config.max_blocks
            && self.blocks.len() >= max_blocks as usize
        {
            return Err(SourceError::Failed(format!("source {} is at its limit of {max_blocks} blocks (max_blocks)", self.name)));
        }
        self.context.take_allocation_slot().map_err(SourceError::Failed)
    }

    fn give_back_allocation_slot(&self) {
        self.context.give_back_allocation_slot();
    }

    /// Frees a live block (unmaps, destroys its dedicated buffer, frees the memory).
    fn release(&mut self, handle: u64) {
        let Some(block) = self.blocks.remove(&handle) else { return };
        self.by_address.remove(&block.base_address);
        let device = self.context.device();
        // SAFETY: the block is ours and now forgotten; the caller (the heap) no longer uses its memory; the
        // mapping, the buffer and the memory are released children first.
        unsafe {
            if block.mapped_ptr.is_some() {
                device.unmap_memory(block.memory);
            }
            if let Some(buffer) = block.dedicated_buffer {
                device.destroy_buffer(buffer, None);
            }
            device.free_memory(block.memory, None);
        }
        self.give_back_allocation_slot();
        self.used_bytes -= block.allocation_size_bytes;
        self.blocks_freed += 1;
    }
}

impl MemorySource for DeviceMemorySource {
    fn name(&self) -> &str {
        &self.name
    }

    fn block_alignment_bytes(&self) -> u64 {
        self.alignment_bytes
    }

    fn allocate_block(&mut self, size_bytes: u64) -> Result<SourceBlock, SourceError> {
        heapscope_core::source::check_block_size(size_bytes, self.alignment_bytes)?;
        self.allocate(size_bytes, size_bytes, None)
    }

    fn free_block(&mut self, block: SourceBlock) {
        if self.blocks.get(&block.handle).is_some_and(|live| live.base_address == block.base_address) {
            self.release(block.handle);
        }
    }

    /// Through one command buffer, a barrier between each copy, waited for on the host.
    fn copy_between_blocks(&mut self, copies: &[BlockCopy]) -> Result<(), SourceError> {
        if copies.is_empty() {
            return Ok(());
        }
        let mut transfer = match self.transfer.take() {
            Some(transfer) => transfer,
            None => Transfer::new(Arc::clone(&self.context), 4096).map_err(|error| SourceError::Failed(error.to_string()))?,
        };
        let started = Instant::now();
        let copied = self.copy_in_order(&mut transfer, copies);
        self.transfer = Some(transfer);
        copied.map_err(|error| SourceError::Failed(error.to_string()))?;
        self.copies.copies += copies.len() as u64;
        self.copies.bytes += copies.iter().map(|copy| copy.size_bytes).sum::<u64>();
        self.copies.submits += 1;
        self.copies.nanos += u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        Ok(())
    }

    fn available_bytes(&self) -> Option<u64> {
        let heap_index = self.memory_type.heap_index;
        let budgets = self.context.heap_budgets();
        let budget = budgets.iter().find(|budget| budget.heap_index == heap_index)?;
        // With VK_EXT_memory_budget the usage includes this source's blocks; without, subtract them.
        let device_left =
            if budget.from_extension { budget.available_bytes() } else { budget.budget_bytes.saturating_sub(self.used_bytes) };
        let cap_left = self.config.budget_cap_bytes.map_or(u64::MAX, |cap| cap.saturating_sub(self.used_bytes));
        Some(device_left.min(cap_left))
    }
}

impl Drop for DeviceMemorySource {
    fn drop(&mut self) {
        let report = self.release_all();
        if self.config.report_leaks_on_drop && !report.is_empty() {
            eprintln!("heapscope-vulkan: source {} dropped with {report}; freed them", self.name);
        }
    }
}
