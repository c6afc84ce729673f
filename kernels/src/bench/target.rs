//! [`Target`]: what the bench runner needs of a device — allocate, free, run kernel ops on allocations, say how
//! much memory is reserved. No device types appear in it: the Vulkan backend, a wgpu backend and the simulated
//! [`SimTarget`] implement it alike.

use heapscope_core::compaction::Budget;
use heapscope_core::{DeviceEvent, DeviceHeap, OomVerdict, Request};
use heapscope_lab::compaction::CompactRule;

use crate::{Op, VerifyResult};

/// Why a target refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The allocation does not fit: the verdict, in numbers. The run goes on.
    #[error("out of memory: {0}")]
    OutOfMemory(Box<OomVerdict>),
    /// Anything else (a device call failed, a handle was refused): the run stops.
    #[error("{0}")]
    Failed(String),
    /// Something the device cannot do at all, whatever memory it has (more live sparse mappings than a CPU device
    /// holds): the run stops, and the contender is one this device cannot run.
    #[error("{0}")]
    DeviceLimit(String),
}

impl From<heapscope_core::Error> for TargetError {
    fn from(error: heapscope_core::Error) -> Self {
        match error {
            heapscope_core::Error::OutOfMemory(verdict) => Self::OutOfMemory(verdict),
            heapscope_core::Error::DeviceLimit(what) => Self::DeviceLimit(what),
            other => Self::Failed(other.to_string()),
        }
    }
}

/// A device (real or simulated) a workload runs on.
///
/// The runner keeps the order safe on a real device: every op that uses an allocation is passed to
/// [`Target::run`] — which must return only once the ops have completed — before the allocation is freed, so no
/// memory is freed, reused or unmapped while a kernel may still touch it. A target whose memory is bound
/// asynchronously (sparse binding) makes its binds visible to the kernels inside `run`.
///
/// The kernels work in 4-byte words: an allocation's bytes are filled and verified through its last word, which may
/// reach past the requested bytes (a 5-byte allocation, two words). A target's allocations cover that word: every heap
/// rounds sizes up to at least its alignment (256 B blocks, 512 B PyTorch blocks, pages), which no neighbour shares.
pub trait Target {
    /// An allocation.
    type Handle: Copy;

    /// Allocates `size_bytes`.
    ///
    /// # Errors
    /// [`TargetError::OutOfMemory`] with the verdict when it does not fit (the device refusing too);
    /// [`TargetError::Failed`] otherwise.
    fn allocate(&mut self, size_bytes: u64) -> Result<Self::Handle, TargetError>;

    /// Frees an allocation (no op that uses it is pending).
    ///
    /// # Errors
    /// [`TargetError::Failed`] for a handle the target refuses, or a device failure.
    fn free(&mut self, handle: Self::Handle) -> Result<(), TargetError>;

    /// Runs `ops` in order, each seeing the writes of those before it; offsets are relative to each handle's
    /// first byte. Returns one [`VerifyResult`] per [`Op::Verify`], in order, once everything has completed.
    ///
    /// # Errors
    /// [`TargetError::Failed`] when an op cannot run (the run stops).
    fn run(&mut self, ops: &[Op<Self::Handle>]) -> Result<Vec<VerifyResult>, TargetError>;

    /// Bytes of device memory reserved now (blocks, segments, mapped pages).
    fn reserved_bytes(&self) -> u64;

    /// Whether [`Target::run`] really runs the kernels (a simulated target skips them).
    fn runs_kernels(&self) -> bool;

    /// What it asked of the device since the last call (blocks reserved and released, page runs mapped and
    /// unmapped), for the runner's observers; empty for a target that does not record them (the default).
    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        Vec::new()
    }

    /// When the runner asks it to compact. Default: never.
    fn compact_rule(&self) -> CompactRule {
        CompactRule::Never
    }

    /// The time its device took for the copies of its compactions so far, ns (recorded to waited for on the host);
    /// `None` where nothing times them (a simulated target, the default).
    fn device_copy_ns(&self) -> Option<u64> {
        None
    }

    /// Moves live allocations (`live`: each handle with the size it was allocated with) to gather free space, their
    /// bytes copied on the device before the call returns (no op uses them: the runner ran every pending op first);
    /// returns each move as the index in `live` and the new handle, in order. `for_refused`: to make room for a
    /// refused request. Default: moves nothing.
    ///
    /// # Errors
    /// [`TargetError::Failed`] when the device fails to copy.
    fn compact(&mut self, live: &[(Self::Handle, u64)], for_refused: bool) -> Result<Vec<(usize, Self::Handle)>, TargetError> {
        let _ = (live, for_refused);
        Ok(Vec::new())
    }

    /// Whether its moves remap pages (nothing copied) rather than copy bytes. Default: copies.
    fn moves_by_remap(&self) -> bool {
        false
    }

    /// Waits for what it queued on the device and nothing waits for yet (sparse binds and unbinds after the last
    /// kernels): the run's wall time includes them. Default: nothing queued.
    ///
    /// # Errors
    /// [`TargetError::Failed`] for a device failure.
    fn finish(&mut self) -> Result<(), TargetError> {
        Ok(())
    }
}

/// Compacts `heap` (a [`DeviceHeap`] whose requests were `size` aligned to `align_bytes`): the moves of
/// [`Target::compact`], by [`CompactRule::algorithm`].
///
/// # Errors
/// What the heap's compaction returns.
pub fn compact_heap<H: DeviceHeap>(
    heap: &mut H,
    live: &[(H::Handle, u64)],
    align_bytes: u64,
    for_refused: bool,
) -> Result<Vec<(usize, H::Handle)>, TargetError> {
    let movable = with_requests(live, align_bytes)?;
    Ok(heap.compact(&movable, CompactRule::algorithm(for_refused), Budget::UNLIMITED)?)
}

/// Each handle of `live` with the request that made it: its size aligned to `align_bytes`, as every bench request is.
///
/// # Errors
/// [`heapscope_core::Error`] for a size no request can have.
pub fn with_requests<A: Copy>(live: &[(A, u64)], align_bytes: u64) -> Result<Vec<(A, Request)>, heapscope_core::Error> {
    live.iter().map(|&(handle, size_bytes)| Ok((handle, Request::new(size_bytes, align_bytes)?))).collect()
}

/// A core [`DeviceHeap`] with no device: kernels are skipped, so a verify finds nothing by construction.
#[derive(Debug)]
pub struct SimTarget<H: DeviceHeap> {
    heap: H,
    align_bytes: u64,
    compact: CompactRule,
}

impl<H: DeviceHeap> SimTarget<H> {
    /// `heap`, every request aligned to `align_bytes`.
    pub fn new(heap: H, align_bytes: u64) -> Self {
        Self { heap, align_bytes, compact: CompactRule::Never }
    }

    /// The same target, compacting by `rule`.
    #[must_use]
    pub fn compacting(self, rule: CompactRule) -> Self {
        Self { compact: rule, ..self }
    }

    /// The heap.
    pub fn heap(&self) -> &H {
        &self.heap
    }
}

impl<H: DeviceHeap> Target for SimTarget<H> {
    type Handle = H::Handle;

    fn allocate(&mut self, size_bytes: u64) -> Result<H::Handle, TargetError> {
        let Ok(request) = Request::new(size_bytes, self.align_bytes) else {
            // One that overflows once aligned fits no device: refused, as a replay refuses it (the devices' backends
            // say such a request is past their largest buffer before the run).
            return Err(TargetError::OutOfMemory(Box::new(self.heap.oversized_verdict(size_bytes, self.align_bytes))));
        };
        Ok(self.heap.allocate_request(request)?)
    }

    fn free(&mut self, handle: H::Handle) -> Result<(), TargetError> {
        Ok(self.heap.free_handle(handle)?)
    }

    fn run(&mut self, ops: &[Op<H::Handle>]) -> Result<Vec<VerifyResult>, TargetError> {
        Ok(vec![VerifyResult::default(); ops.iter().filter(|op| matches!(op, Op::Verify { .. })).count()])
    }

    fn reserved_bytes(&self) -> u64 {
        self.heap.reserved_and_live_bytes().0
    }

    fn runs_kernels(&self) -> bool {
        false
    }

    fn compact_rule(&self) -> CompactRule {
        self.compact
    }

    fn compact(&mut self, live: &[(H::Handle, u64)], for_refused: bool) -> Result<Vec<(usize, H::Handle)>, TargetError> {
        compact_heap(&mut self.heap, live, self.align_bytes, for_refused)
    }

    fn moves_by_remap(&self) -> bool {
        self.heap.moves_by_remap()
    }
}
