//! [`WgpuTarget`]: the bench runner's [`Target`] on a wgpu device. Each contender allocates real memory and
//! [`WgpuKernels`] runs the ops on it — fills, verifies, copies and the matvec payload, in one call per batch:
//!
//! - **Core policies** (`tlsf`, `best-fit`, ...): an [`ArenaHeap`], the policy inside `wgpu::Buffer` arenas, on
//!   any backend wgpu reaches.
//! - **`pytorch`**: a [`PytorchHeap`], PyTorch's caching allocator with a `wgpu::Buffer` per segment, on any
//!   backend.
//! - **`paged`** and **`pytorch-expandable`** map pages into a reserved virtual range: sparse binding, which wgpu
//!   does not expose. On wgpu over heapscope's own Vulkan device ([`WgpuDevice::from_vulkan`]) they run there:
//!   `paged` as a [`VulkanPagedHeap`] (the sparse buffer a `wgpu::Buffer`, binds ordered before wgpu's submits),
//!   `pytorch-expandable` as a `heapscope_vulkan::PytorchDeviceHeap` whose segments (dedicated blocks, sparse
//!   buffers) become `wgpu::Buffer`s for each batch ([`WgpuDevice::segment_buffer`]; binds waited for before the
//!   kernels). On any other wgpu device, [`WgpuTarget::new`] refuses them with [`WgpuError::Unsupported`], saying
//!   why and what to use instead.
//!
//! Order on the device: `WgpuKernels::run` waits for its submits, so when [`Target::run`] returns no kernel
//! touches the memory any more and the runner may free it (an arena or segment destroyed, pages unbound). Memory
//! reserved is counted as the simulated heaps count it (arenas, segments, mapped pages), so the same stream gives
//! the same numbers with and without a device.

use std::collections::HashMap;
use std::sync::Arc;

use heapscope_core::{Allocation, HeapAllocation};
use heapscope_lab::contender::Contender;
use heapscope_pytorch::CachingAllocation;
use heapscope_wgpu::{
    ArenaAllocation, ArenaConfig, ArenaHeap, KernelBuffer, PytorchHeap, VulkanPagedHeap, VulkanSegmentBuffer, WgpuDevice,
    WgpuError,
};

use super::wgpu_runner::{WgpuKernelError, WgpuKernels};
use crate::bench::{BenchSettings, Target, TargetError, with_requests};
use crate::{KernelRunner, Op, VerifyResult};
use heapscope_lab::compaction::CompactRule;

/// The heap behind a [`WgpuTarget`].
#[derive(Debug)]
enum Backend<'a> {
    /// Arena allocations by address (the handle is the heap's, the allocation holds the arena).
    Arenas {
        heap: ArenaHeap,
        live: HashMap<u64, ArenaAllocation>,
    },
    Pytorch(Box<PytorchHeap>),
    Paged(VulkanPagedHeap<'a>),
    Expandable(Box<heapscope_vulkan::PytorchDeviceHeap>),
}

/// An allocation of a [`WgpuTarget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgpuHandle {
    /// In an arena.
    Arena(HeapAllocation),
    /// In the paged heap's sparse buffer.
    Paged(Allocation),
    /// In a PyTorch segment.
    Pytorch(CachingAllocation),
}

/// The key of a handle in a batch's placements: its address (its offset for the paged heap's one buffer).
fn key(handle: WgpuHandle) -> u64 {
    match handle {
        WgpuHandle::Arena(allocation) => allocation.address(),
        WgpuHandle::Paged(allocation) => allocation.offset(),
        WgpuHandle::Pytorch(allocation) => allocation.address(),
    }
}

/// A wgpu failure as a target error (out of memory keeps its verdict).
fn target_error(error: WgpuError) -> TargetError {
    match error {
        WgpuError::Heap(error) => error.into(),
        WgpuError::Vulkan(heapscope_vulkan::VulkanError::Heap(error)) => error.into(),
        other => TargetError::Failed(other.to_string()),
    }
}

/// Why `policy` (which maps pages: `paged`, `pytorch-expandable`) cannot run on `device`, and what to use instead.
pub fn sparse_refusal(policy: Contender, device: &WgpuDevice) -> String {
    let what = match policy {
        Contender::Paged => "paged maps pages on demand into one virtual range",
        _ => "pytorch-expandable maps PyTorch's pages into each segment's virtual range",
    };
    let info = device.info();
    if info.backend == wgpu::Backend::Vulkan {
        format!(
            "{what}, which needs Vulkan sparse binding: wgpu does not expose it, and this wgpu device on {} is not heapscope's own Vulkan device; run it on wgpu over heapscope's Vulkan device (what `heapscope bench --backend wgpu` uses on a Vulkan adapter unless --plain-wgpu) or with --backend vulkan",
            info.name
        )
    } else {
        format!(
            "{what}, which needs sparse binding: wgpu does not expose it, and heapscope reaches it only through Vulkan, while {} is a {} adapter; run it with --backend vulkan on a Vulkan device, or --backend sim",
            info.name, info.backend
        )
    }
}

/// A bench contender on a wgpu device. See the module documentation.
#[derive(Debug)]
pub struct WgpuTarget<'a> {
    // The heap first: it goes (arenas destroyed, wrapped buffers unwrapped) before the kernels.
    backend: Backend<'a>,
    kernels: WgpuKernels,
    device: &'a Arc<WgpuDevice>,
    align_bytes: u64,
    compact: CompactRule,
}

impl<'a> WgpuTarget<'a> {
    /// `policy` under `settings` on `device`, with its own kernels.
    ///
    /// # Errors
    /// [`WgpuError::Unsupported`] (in [`WgpuKernelError::Wgpu`]) for `paged` and `pytorch-expandable` on a device that is not heapscope's Vulkan
    /// device ([`sparse_refusal`] says why); settings a heap refuses; a wgpu or Vulkan failure bringing up the heap
    /// or the kernels.
    pub fn new(device: &'a Arc<WgpuDevice>, policy: Contender, settings: &BenchSettings) -> Result<Self, WgpuKernelError> {
        let backend = match policy {
            Contender::Heap(kind) => {
                let config = ArenaConfig {
                    heap: settings.heap_config(kind),
                    max_binding_bytes: None,
                    min_block_alignment_bytes: settings.block_alignment_bytes,
                };
                Backend::Arenas { heap: ArenaHeap::new(Arc::clone(device), config)?, live: HashMap::new() }
            }
            Contender::Pytorch { expandable: false } => Backend::Pytorch(Box::new(PytorchHeap::new(
                Arc::clone(device),
                settings.caching_conf(false),
                settings.budget_bytes,
            )?)),
            Contender::Paged | Contender::Pytorch { expandable: true } => Self::sparse_backend(device, policy, settings)?,
            Contender::GpuAllocator | Contender::Vma => {
                return Err(WgpuError::Unsupported(format!(
                    "{policy} is no bench contender: it replays recordings (heapscope replay --vulkan)"
                ))
                .into());
            }
        };
        let kernels = WgpuKernels::new(Arc::clone(device))?;
        Ok(Self { backend, kernels, device, align_bytes: settings.align_bytes, compact: settings.compact_rule(policy) })
    }

    fn sparse_backend(
        device: &'a Arc<WgpuDevice>,
        policy: Contender,
        settings: &BenchSettings,
    ) -> Result<Backend<'a>, WgpuError> {
        let Some(context) = device.vulkan_context() else {
            return Err(WgpuError::Unsupported(sparse_refusal(policy, device)));
        };
        if policy == Contender::Paged {
            return Ok(Backend::Paged(device.paged_heap(super::vulkan_target::paged_config(context, settings))?));
        }
        let config = settings.pytorch_device_config(true);
        Ok(Backend::Expandable(Box::new(heapscope_vulkan::PytorchDeviceHeap::new(Arc::clone(context), config)?)))
    }

    /// Submits and dispatches of its kernels so far.
    pub fn kernel_counts(&self) -> (u64, u64) {
        self.kernels.counts()
    }

    /// Bytes of device memory its heap holds now (arenas, segments, bound pages).
    pub fn device_bytes(&self) -> u64 {
        match &self.backend {
            Backend::Arenas { heap, .. } => heap.heap().source().used_bytes(),
            Backend::Pytorch(heap) => heap.device_bytes(),
            Backend::Paged(heap) => heap.paged().stats().sparse.pages_bound * heap.paged().sparse().page_bytes(),
            Backend::Expandable(heap) => heap.device_bytes(),
        }
    }

    fn mismatched(handle: WgpuHandle) -> TargetError {
        TargetError::Failed(format!("{handle:?} belongs to another kind of heap"))
    }
}

impl Target for WgpuTarget<'_> {
    type Handle = WgpuHandle;

    fn allocate(&mut self, size_bytes: u64) -> Result<WgpuHandle, TargetError> {
        match &mut self.backend {
            Backend::Arenas { heap, live } => match heap.allocate(size_bytes, self.align_bytes, None) {
                Ok(allocation) => {
                    let handle = *allocation.heap_allocation();
                    live.insert(handle.address(), allocation);
                    Ok(WgpuHandle::Arena(handle))
                }
                Err(error @ WgpuError::TooLargeToBind { .. }) => Err(TargetError::Failed(format!(
                    "{error}: arena allocations are bindable whole (--backend vulkan takes larger ones; --scale makes a recording smaller)"
                ))),
                Err(error) => Err(target_error(error)),
            },
            Backend::Pytorch(heap) => heap.allocate(size_bytes).map(WgpuHandle::Pytorch).map_err(target_error),
            Backend::Paged(heap) => {
                let request = heapscope_core::Request::new(size_bytes, self.align_bytes)?;
                heap.allocate(request).map(WgpuHandle::Paged).map_err(|error| target_error(error.into()))
            }
            Backend::Expandable(heap) => {
                heap.allocate(size_bytes).map(WgpuHandle::Pytorch).map_err(|error| target_error(error.into()))
            }
        }
    }

    fn free(&mut self, handle: WgpuHandle) -> Result<(), TargetError> {
        match (&mut self.backend, handle) {
            (Backend::Arenas { heap, live }, WgpuHandle::Arena(allocation)) => {
                let allocation = live
                    .remove(&allocation.address())
                    .ok_or_else(|| TargetError::Failed(format!("{allocation:?} is not a live allocation")))?;
                heap.free(allocation).map_err(target_error)
            }
            (Backend::Pytorch(heap), WgpuHandle::Pytorch(allocation)) => heap.free(allocation).map_err(target_error),
            (Backend::Paged(heap), WgpuHandle::Paged(allocation)) => {
                heap.free(allocation).map_err(|error| target_error(error.into()))
            }
            (Backend::Expandable(heap), WgpuHandle::Pytorch(allocation)) => {
                heap.free(allocation).map_err(|error| target_error(error.into()))
            }
            (_, handle) => Err(Self::mismatched(handle)),
        }
    }

    fn run(&mut self, ops: &[Op<WgpuHandle>]) -> Result<Vec<VerifyResult>, TargetError> {
        let handles: Vec<WgpuHandle> = ops.iter().flat_map(Op::buffers).copied().collect();
        // Expandable segments: binds done, and each segment the ops touch a wgpu buffer for this batch (they borrow
        // the heap, so nothing is released under them).
        let mut segments: HashMap<u64, VulkanSegmentBuffer<'_>> = HashMap::new();
        if let Backend::Expandable(heap) = &self.backend {
            heap.wait_binds().map_err(|error| target_error(error.into()))?;
            for handle in &handles {
                let WgpuHandle::Pytorch(allocation) = *handle else { return Err(Self::mismatched(*handle)) };
                if let std::collections::hash_map::Entry::Vacant(entry) = segments.entry(allocation.segment_base()) {
                    entry.insert(self.device.segment_buffer(heap, &allocation).map_err(target_error)?);
                }
            }
        }
        // Where each allocation's bytes are: its buffer and offset, by handle key.
        let mut places: HashMap<u64, (KernelBuffer<'_>, u64)> = HashMap::new();
        for &handle in &handles {
            let place = match (&self.backend, handle) {
                (Backend::Arenas { live, .. }, WgpuHandle::Arena(allocation)) => {
                    live.get(&allocation.address()).map(|live| (live.kernel_buffer(), live.offset_bytes()))
                }
                (Backend::Pytorch(heap), WgpuHandle::Pytorch(allocation)) => {
                    heap.segment(&allocation).map(|buffer| (KernelBuffer::new(buffer), allocation.offset()))
                }
                (Backend::Paged(heap), WgpuHandle::Paged(allocation)) => {
                    Some((KernelBuffer::new(heap.buffer()), allocation.offset()))
                }
                (Backend::Expandable(_), WgpuHandle::Pytorch(allocation)) => segments
                    .get(&allocation.segment_base())
                    .map(|segment| (KernelBuffer::new(segment.buffer()), allocation.offset())),
                (_, handle) => return Err(Self::mismatched(handle)),
            };
            let place = place.ok_or_else(|| TargetError::Failed(format!("{handle:?} has no buffer behind it")))?;
            places.insert(key(handle), place);
        }
        let mut placed = Vec::with_capacity(ops.len());
        for op in ops {
            // Every handle was placed above; the fallback is never taken.
            if let Some(&(buffer, _)) = op.buffers().first().and_then(|handle| places.get(&key(**handle))) {
                placed.push(op.placed(|handle| places.get(&key(handle)).copied().unwrap_or((buffer, 0))));
            }
        }
        self.kernels.run(&placed).map_err(|error| TargetError::Failed(error.to_string()))
    }

    fn reserved_bytes(&self) -> u64 {
        match &self.backend {
            Backend::Arenas { heap, .. } => heap.stats().reserved_bytes,
            Backend::Pytorch(heap) => heap.caching().allocator().reserved_bytes(),
            Backend::Paged(heap) => heap.paged().heap().stats().mapped_bytes,
            Backend::Expandable(heap) => heap.caching().allocator().reserved_bytes(),
        }
    }

    fn runs_kernels(&self) -> bool {
        true
    }

    fn compact_rule(&self) -> CompactRule {
        self.compact
    }

    fn moves_by_remap(&self) -> bool {
        matches!(self.backend, Backend::Paged(_))
    }

    fn finish(&mut self) -> Result<(), TargetError> {
        match &self.backend {
            Backend::Paged(heap) => heap.paged().wait_binds().map_err(|error| target_error(error.into())),
            Backend::Expandable(heap) => heap.wait_binds().map_err(|error| target_error(error.into())),
            Backend::Arenas { .. } | Backend::Pytorch(_) => Ok(()),
        }
    }

    /// The arenas compact ([`ArenaHeap::compact`], the moves copied with `copy_buffer_to_buffer`); `paged` remaps
    /// pages ([`VulkanPagedHeap::compact`], nothing copied); PyTorch's emulations move nothing (PyTorch never moves
    /// a live block). Each move is returned, in order, with where its allocation ended up.
    fn compact(&mut self, live: &[(WgpuHandle, u64)], for_refused: bool) -> Result<Vec<(usize, WgpuHandle)>, TargetError> {
        if let Backend::Paged(heap) = &mut self.backend {
            let listed = live
                .iter()
                .map(|&(handle, size_bytes)| match handle {
                    WgpuHandle::Paged(allocation) => Ok((allocation, size_bytes)),
                    other => Err(Self::mismatched(other)),
                })
                .collect::<Result<Vec<_>, TargetError>>()?;
            let movable = with_requests(&listed, self.align_bytes)?;
            let budget = heapscope_core::compaction::Budget::UNLIMITED;
            let moves = heap
                .compact(&movable, CompactRule::algorithm(for_refused), budget)
                .map_err(|error| target_error(error.into()))?;
            return Ok(moves.into_iter().map(|(index, now)| (index, WgpuHandle::Paged(now))).collect());
        }
        let Backend::Arenas { heap, live: arenas } = &mut self.backend else { return Ok(Vec::new()) };
        let movable = live
            .iter()
            .map(|(handle, _)| match handle {
                WgpuHandle::Arena(allocation) => arenas.get(&allocation.address()).cloned(),
                _ => None,
            })
            .collect::<Option<Vec<ArenaAllocation>>>()
            .ok_or_else(|| TargetError::Failed("a live allocation the arenas do not hold".to_owned()))?;
        let budget = heapscope_core::compaction::Budget::UNLIMITED;
        let moves = heap.compact(&movable, CompactRule::algorithm(for_refused), budget).map_err(target_error)?;
        // Old places out first: a new place may be where another moved allocation was.
        for &(index, _) in &moves {
            arenas.remove(&movable[index].address());
        }
        let mut moved = Vec::with_capacity(moves.len());
        for (index, now) in moves {
            let handle = *now.heap_allocation();
            arenas.insert(handle.address(), now);
            moved.push((index, WgpuHandle::Arena(handle)));
        }
        Ok(moved)
    }
}
