//! [`VulkanTarget`]: the bench runner's [`Target`] on a Vulkan device. Each contender allocates real memory — a
//! core policy in a `Heap<DeviceMemorySource>`, `paged` in a [`DevicePagedHeap`] (sparse binding), `pytorch` and
//! `pytorch-expandable` in a [`PytorchDeviceHeap`] — and [`VulkanKernels`] runs the ops on it: fills, verifies,
//! copies and the matvec payload, in one call per batch.
//!
//! Order on the device: `VulkanKernels::run` waits for its submits, so when [`Target::run`] returns no kernel
//! touches the memory any more and the runner may free it (a block released, pages unbound). Sparse binds are
//! waited for before the kernels run, since the compute submits do not wait on the bind timeline. Memory
//! reserved is counted as the simulated heaps count it (blocks, mapped pages, segments), so the same stream gives
//! the same numbers with and without a device.

use std::collections::HashMap;
use std::sync::Arc;

use heapscope_core::{Allocation, DeviceEvent, DeviceHeap, Heap, HeapAllocation, Request};
use heapscope_lab::contender::Contender;
use heapscope_pytorch::CachingAllocation;
use heapscope_vulkan::compute::{BlockBuffer, ComputeBuffer};
use heapscope_vulkan::{
    DeviceMemorySource, DevicePagedConfig, DevicePagedHeap, DeviceSourceConfig, PytorchDeviceHeap, VulkanContext, VulkanError,
};

use super::vulkan_runner::{VulkanKernelError, VulkanKernels};
use crate::bench::{BenchSettings, Target, TargetError, compact_heap};
use crate::{KernelRunner, Op, VerifyResult};
use heapscope_lab::compaction::CompactRule;

/// The heap behind a [`VulkanTarget`].
#[derive(Debug)]
enum Backend {
    Heap(Heap<DeviceMemorySource>),
    Paged(DevicePagedHeap),
    Pytorch(Box<PytorchDeviceHeap>),
}

/// An allocation of a [`VulkanTarget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VulkanHandle {
    /// In a heap of device-memory blocks.
    Heap(HeapAllocation),
    /// In the sparse buffer of the paged heap.
    Paged(Allocation),
    /// In a PyTorch segment.
    Pytorch(CachingAllocation),
}

/// A bench contender on a Vulkan device. See the module documentation.
#[derive(Debug)]
pub struct VulkanTarget {
    backend: Backend,
    kernels: VulkanKernels,
    align_bytes: u64,
    compact: CompactRule,
}

impl VulkanHandle {
    /// Where its footprint sits, as `(address, footprint_bytes, lead_bytes)`: the address in the space of
    /// [`VulkanTarget::take_device_events`] (a block's or segment's base plus the footprint's offset; an offset in
    /// the sparse buffer for the paged heap), the bytes set aside, and the alignment padding before the bytes
    /// asked for.
    pub fn footprint(&self) -> (u64, u64, u64) {
        let (base, allocation) = match self {
            VulkanHandle::Heap(handle) => (Heap::<DeviceMemorySource>::block_base(handle), handle.allocation()),
            VulkanHandle::Paged(handle) => (0, handle),
            VulkanHandle::Pytorch(handle) => (handle.segment_base(), handle.allocation()),
        };
        let lead_bytes = allocation.offset() - allocation.footprint_offset();
        (base + allocation.footprint_offset(), allocation.footprint_bytes(), lead_bytes)
    }
}

/// The key of a handle in a batch's placements: its address (its offset for the paged heap's one buffer).
fn key(handle: VulkanHandle) -> u64 {
    match handle {
        VulkanHandle::Heap(allocation) => allocation.address(),
        VulkanHandle::Paged(allocation) => allocation.offset(),
        VulkanHandle::Pytorch(allocation) => allocation.address(),
    }
}

/// A Vulkan failure as a target error (out of memory keeps its verdict).
fn target_error(error: VulkanError) -> TargetError {
    match error {
        VulkanError::Heap(error) => error.into(),
        other if other.is_device_limit() => TargetError::DeviceLimit(other.to_string()),
        other => TargetError::Failed(other.to_string()),
    }
}

/// The bench's `paged` contender on `context`'s device, wherever its sparse buffer is used ([`VulkanTarget`], wgpu
/// over heapscope's device): `settings`' virtual range (at most the device's sparse address space), budget and page
/// size, 4,096 pages a chunk.
pub fn paged_config(context: &VulkanContext, settings: &BenchSettings) -> DevicePagedConfig {
    let address_space = context.properties().limits.sparse_address_space_size_bytes;
    let mut config = DevicePagedConfig::new(
        settings.virtual_bytes.min(heapscope_vulkan::whole_sparse_pages(address_space)),
        settings.budget_bytes,
    );
    config.page_bytes = Some(settings.page_bytes);
    config.pages_per_chunk = 4096;
    config
}

impl VulkanTarget {
    /// `policy` under `settings` on `context`'s device, with its own kernels.
    ///
    /// # Errors
    /// A Vulkan failure bringing up the heap or the kernels; settings the heap refuses; `paged` and
    /// `pytorch-expandable` on a device without sparse residency for buffers.
    pub fn new(context: &Arc<VulkanContext>, policy: Contender, settings: &BenchSettings) -> Result<Self, VulkanKernelError> {
        let kernels = VulkanKernels::new(Arc::clone(context))?;
        let backend = match policy {
            Contender::Heap(kind) => {
                let source = DeviceMemorySource::new(
                    Arc::clone(context),
                    DeviceSourceConfig {
                        min_block_alignment_bytes: settings.block_alignment_bytes,
                        ..DeviceSourceConfig::device_only(settings.budget_bytes)
                    },
                )?;
                Backend::Heap(Heap::new(settings.heap_config(kind), source).map_err(VulkanError::from)?)
            }
            Contender::Paged => Backend::Paged(DevicePagedHeap::new(Arc::clone(context), paged_config(context, settings))?),
            Contender::Pytorch { expandable } => {
                let config = settings.pytorch_device_config(expandable);
                Backend::Pytorch(Box::new(PytorchDeviceHeap::new(Arc::clone(context), config)?))
            }
            Contender::GpuAllocator | Contender::Vma => {
                return Err(VulkanError::Unsupported(format!(
                    "{policy} is no bench contender: it replays recordings (heapscope replay --vulkan)"
                ))
                .into());
            }
        };
        Ok(Self { backend, kernels, align_bytes: settings.align_bytes, compact: settings.compact_rule(policy) })
    }

    /// Submits and dispatches of its kernels so far.
    pub fn kernel_counts(&self) -> (u64, u64) {
        self.kernels.counts()
    }

    /// Bytes of device memory its heap holds now (blocks, bound pages).
    pub fn device_bytes(&self) -> u64 {
        match &self.backend {
            Backend::Heap(heap) => heap.source().used_bytes(),
            Backend::Paged(heap) => heap.stats().sparse.pages_bound * heap.sparse().page_bytes(),
            Backend::Pytorch(heap) => heap.device_bytes(),
        }
    }

    /// Switches the log of what the heap asks of the device on (emptied) or off: blocks and segments reserved and
    /// released, page runs mapped and unmapped (offsets in the sparse buffer for the paged heap).
    pub fn record_device_events(&mut self, on: bool) {
        match &mut self.backend {
            Backend::Heap(heap) => heap.record_device_events(on),
            Backend::Paged(heap) => DeviceHeap::record_device_events(heap, on),
            Backend::Pytorch(heap) => DeviceHeap::record_device_events(heap.as_mut(), on),
        }
    }

    /// What the heap asked of the device since the last call, while recording is on.
    pub fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        match &mut self.backend {
            Backend::Heap(heap) => heap.take_device_events(),
            Backend::Paged(heap) => DeviceHeap::take_device_events(heap),
            Backend::Pytorch(heap) => DeviceHeap::take_device_events(heap.as_mut()),
        }
    }

    /// The virtual ranges whose pages are mapped on demand, as `(base, size_bytes)`: the paged heap's sparse buffer,
    /// PyTorch's expandable segments; none for a heap of blocks.
    pub fn virtual_ranges(&self) -> Vec<(u64, u64)> {
        match &self.backend {
            Backend::Heap(_) => Vec::new(),
            Backend::Paged(heap) => vec![(0, heap.heap().config().virtual_bytes)],
            Backend::Pytorch(heap) => heap.caching().allocator().expandable_segments(),
        }
    }

    fn mismatched(handle: VulkanHandle) -> TargetError {
        TargetError::Failed(format!("{handle:?} belongs to another kind of heap"))
    }
}

impl Target for VulkanTarget {
    type Handle = VulkanHandle;

    fn allocate(&mut self, size_bytes: u64) -> Result<VulkanHandle, TargetError> {
        let request = Request::new(size_bytes, self.align_bytes)?;
        match &mut self.backend {
            Backend::Heap(heap) => Ok(VulkanHandle::Heap(heap.allocate(request, None)?)),
            Backend::Paged(heap) => heap.allocate(request).map(VulkanHandle::Paged).map_err(target_error),
            Backend::Pytorch(heap) => heap.allocate(size_bytes).map(VulkanHandle::Pytorch).map_err(target_error),
        }
    }

    fn free(&mut self, handle: VulkanHandle) -> Result<(), TargetError> {
        match (&mut self.backend, handle) {
            (Backend::Heap(heap), VulkanHandle::Heap(allocation)) => Ok(heap.free(allocation)?),
            (Backend::Paged(heap), VulkanHandle::Paged(allocation)) => heap.free(allocation).map_err(target_error),
            (Backend::Pytorch(heap), VulkanHandle::Pytorch(allocation)) => heap.free(allocation).map_err(target_error),
            (_, handle) => Err(Self::mismatched(handle)),
        }
    }

    fn run(&mut self, ops: &[Op<VulkanHandle>]) -> Result<Vec<VerifyResult>, TargetError> {
        let handles: Vec<VulkanHandle> = ops.iter().flat_map(Op::buffers).copied().collect();
        // For the heap of blocks, a buffer over each block the ops touch, for this batch (they borrow the source).
        let mut block_buffers: HashMap<u64, BlockBuffer<'_>> = HashMap::new();
        if let Backend::Heap(heap) = &self.backend {
            for handle in &handles {
                let VulkanHandle::Heap(allocation) = *handle else { return Err(Self::mismatched(*handle)) };
                let (block, _) = heap
                    .source()
                    .locate(allocation.address())
                    .ok_or_else(|| TargetError::Failed(format!("{allocation:?} is in no live block")))?;
                if let std::collections::hash_map::Entry::Vacant(entry) = block_buffers.entry(block.handle) {
                    entry.insert(BlockBuffer::new(heap.source(), block.handle).map_err(target_error)?);
                }
            }
        }
        // Where each allocation's bytes are: its buffer and offset, by handle key.
        let mut places: HashMap<u64, (ComputeBuffer<'_>, u64)> = HashMap::new();
        for &handle in &handles {
            let place = match (&self.backend, handle) {
                (Backend::Heap(heap), VulkanHandle::Heap(allocation)) => heap
                    .source()
                    .locate(allocation.address())
                    .and_then(|(block, offset)| block_buffers.get(&block.handle).map(|buffer| (buffer.as_compute(), offset))),
                (Backend::Paged(heap), VulkanHandle::Paged(allocation)) => Some((heap.compute_buffer(), allocation.offset())),
                (Backend::Pytorch(heap), VulkanHandle::Pytorch(allocation)) => heap.compute_target(&allocation),
                (_, handle) => return Err(Self::mismatched(handle)),
            };
            let place = place.ok_or_else(|| TargetError::Failed(format!("{handle:?} has no device memory behind it")))?;
            places.insert(key(handle), place);
        }
        let mut placed = Vec::with_capacity(ops.len());
        for op in ops {
            if let Some(&(buffer, _)) = op.buffers().first().and_then(|handle| places.get(&key(**handle))) {
                placed.push(op.placed(|handle| places.get(&key(handle)).copied().unwrap_or((buffer, 0))));
            }
        }
        // Binds are queued on the sparse queue; the compute submits do not wait for them.
        match &self.backend {
            Backend::Paged(heap) => heap.wait_binds().map_err(target_error)?,
            Backend::Pytorch(heap) => heap.wait_binds().map_err(target_error)?,
            Backend::Heap(_) => {}
        }
        self.kernels.run(&placed).map_err(|error| TargetError::Failed(error.to_string()))
    }

    fn reserved_bytes(&self) -> u64 {
        match &self.backend {
            Backend::Heap(heap) => heap.stats().reserved_bytes,
            Backend::Paged(heap) => heap.heap().stats().mapped_bytes,
            Backend::Pytorch(heap) => heap.caching().allocator().reserved_bytes(),
        }
    }

    fn runs_kernels(&self) -> bool {
        true
    }

    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        VulkanTarget::take_device_events(self)
    }

    fn compact_rule(&self) -> CompactRule {
        self.compact
    }

    fn device_copy_ns(&self) -> Option<u64> {
        match &self.backend {
            Backend::Heap(heap) => Some(heap.source().copy_stats().nanos),
            Backend::Paged(_) | Backend::Pytorch(_) => None,
        }
    }

    fn finish(&mut self) -> Result<(), TargetError> {
        match &self.backend {
            Backend::Paged(heap) => heap.wait_binds().map_err(target_error),
            Backend::Pytorch(heap) => heap.wait_binds().map_err(target_error),
            Backend::Heap(_) => Ok(()),
        }
    }

    /// A heap of blocks compacts, its source copying the moves between device blocks; `paged` remaps the moved
    /// allocations' pages in its sparse buffer (nothing copied); `pytorch` moves nothing.
    fn compact(&mut self, live: &[(VulkanHandle, u64)], for_refused: bool) -> Result<Vec<(usize, VulkanHandle)>, TargetError> {
        match &mut self.backend {
            Backend::Heap(heap) => {
                let listed =
                    handles_of(live, |handle| if let VulkanHandle::Heap(allocation) = handle { Some(allocation) } else { None })?;
                let moves = compact_heap(heap, &listed, self.align_bytes, for_refused)?;
                Ok(moves.into_iter().map(|(index, to)| (index, VulkanHandle::Heap(to))).collect())
            }
            Backend::Paged(heap) => {
                let listed =
                    handles_of(
                        live,
                        |handle| if let VulkanHandle::Paged(allocation) = handle { Some(allocation) } else { None },
                    )?;
                let moves = compact_heap(heap, &listed, self.align_bytes, for_refused)?;
                Ok(moves.into_iter().map(|(index, to)| (index, VulkanHandle::Paged(to))).collect())
            }
            Backend::Pytorch(_) => Ok(Vec::new()),
        }
    }

    fn moves_by_remap(&self) -> bool {
        matches!(self.backend, Backend::Paged(_))
    }
}

/// The handles of `live` as one heap's own (`pick`), with their sizes.
///
/// # Errors
/// [`TargetError::Failed`] when one belongs to another heap.
fn handles_of<A>(live: &[(VulkanHandle, u64)], pick: impl Fn(VulkanHandle) -> Option<A>) -> Result<Vec<(A, u64)>, TargetError> {
    live.iter()
        .map(|&(handle, size_bytes)| {
            let own = pick(handle)
                .ok_or_else(|| TargetError::Failed("a handle of another heap among a heap's live allocations".to_owned()))?;
            Ok((own, size_bytes))
        })
        .collect()
}
