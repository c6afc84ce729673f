//! What a heap of blocks ([`Heap`]) and a paged heap ([`PagedHeap`]) have in common for replays and
//! exports: they serve a request or refuse it with an out-of-memory verdict, and can log what they ask of
//! the device. One replay loop and one exporter serve both through this trait.

use crate::compaction::{Algorithm, Budget};
use crate::{
    Allocation, DeviceEvent, Heap, HeapAllocation, MemorySource, Movable, OomCause, OomVerdict, PagedHeap, Request, Result,
};

/// A heap that reserves device memory on its own.
pub trait DeviceHeap {
    /// What an allocation hands back.
    type Handle: Copy;

    /// Serves `request`.
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`] with the verdict when it cannot; other errors are failures.
    fn allocate_request(&mut self, request: Request) -> Result<Self::Handle>;

    /// Frees an allocation it made.
    ///
    /// # Errors
    /// A double free or a foreign handle.
    fn free_handle(&mut self, handle: Self::Handle) -> Result<()>;

    /// The allocation behind a handle.
    fn allocation(handle: &Self::Handle) -> &Allocation;

    /// Where the allocation sits: a device address (a heap), or an offset in the virtual range (a paged
    /// heap).
    fn address(handle: &Self::Handle) -> u64;

    /// Where the unit of memory holding it starts: its block's base (a heap), or 0 (the one virtual range
    /// of a paged heap).
    fn block_base(handle: &Self::Handle) -> u64;

    /// Switches the log of device events on (emptied) or off.
    fn record_device_events(&mut self, on: bool);

    /// The device events since the last call.
    fn take_device_events(&mut self) -> Vec<DeviceEvent>;

    /// `torch.cuda.empty_cache()` in a trace: gives back the memory held for reuse that no allocation uses (a heap's
    /// empty blocks, a paged heap's cached pages, PyTorch's free segments). Default: nothing is held for reuse.
    ///
    /// # Errors
    /// A backend's failure to give memory back.
    fn empty_cache(&mut self) -> Result<()> {
        Ok(())
    }

    /// The policy's name, for verdicts.
    fn policy_name(&self) -> &'static str;

    /// Bytes reserved from the device now, and requested by live allocations now.
    fn reserved_and_live_bytes(&self) -> (u64, u64);

    /// Reserved bytes held only as a cache, which [`DeviceHeap::empty_cache`] would give back although allocations
    /// live beside them (a paged heap's free pages kept mapped under pressure); 0 for a heap, whose free space in a
    /// block holding allocations stays with the block.
    fn cached_bytes(&self) -> u64 {
        0
    }

    /// The verdict for a request of `size_bytes` that overflows once aligned to `align_bytes`: no device
    /// holds it (exhaustion), whatever the state. It counts as an out-of-memory error.
    fn oversized_verdict(&mut self, size_bytes: u64, align_bytes: u64) -> OomVerdict {
        self.count_oom();
        let (reserved_bytes, live_bytes) = self.reserved_and_live_bytes();
        OomVerdict {
            policy: self.policy_name(),
            requested_bytes: size_bytes,
            needed_bytes: u64::MAX,
            align_bytes,
            reserved_bytes,
            live_bytes,
            padding_bytes: 0,
            free_in_blocks_bytes: 0,
            largest_free_run_bytes: 0,
            retired_bytes: 0,
            unreserved_bytes: 0,
            capacity_bytes: None,
            virtual_range_bytes: None,
            new_block_bytes: None,
            cause: OomCause::Exhaustion,
        }
    }

    /// Counts a refused request in the heap's own statistics.
    fn count_oom(&mut self);

    /// Moves live allocations to gather free space ([`crate::compaction`]'s `algorithm`, within `budget`): `movable`
    /// are the handles the caller lets move, each with the request that made it. Returns each move as the index in
    /// `movable` of the allocation moved and its new handle, in the order the bytes must be copied (an allocation may
    /// move twice); the heap's memory copied the bytes. Default: a heap that moves nothing.
    ///
    /// # Errors
    /// [`crate::Error::Source`] when the memory under the heap failed to copy the moves.
    fn compact(
        &mut self,
        movable: &[(Self::Handle, Request)],
        algorithm: Algorithm,
        budget: Budget,
    ) -> Result<Vec<(usize, Self::Handle)>> {
        let _ = (movable, algorithm, budget);
        Ok(Vec::new())
    }

    /// Whether [`DeviceHeap::compact`] moves allocations by remapping their pages (nothing copied) rather than by
    /// copying their bytes. Default: copies.
    fn moves_by_remap(&self) -> bool {
        false
    }
}

impl<S: MemorySource> DeviceHeap for Heap<S> {
    type Handle = HeapAllocation;

    fn empty_cache(&mut self) -> Result<()> {
        self.release_empty_blocks();
        Ok(())
    }

    fn allocate_request(&mut self, request: Request) -> Result<HeapAllocation> {
        // No label: a replay measures the allocator, not string formatting; a report names ranges by slot.
        self.allocate(request, None)
    }

    fn free_handle(&mut self, handle: HeapAllocation) -> Result<()> {
        self.free(handle)
    }

    fn allocation(handle: &HeapAllocation) -> &Allocation {
        handle.allocation()
    }

    fn address(handle: &HeapAllocation) -> u64 {
        handle.address()
    }

    fn block_base(handle: &HeapAllocation) -> u64 {
        handle.address() - handle.offset()
    }

    fn record_device_events(&mut self, on: bool) {
        Heap::record_device_events(self, on);
    }

    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        Heap::take_device_events(self)
    }

    fn policy_name(&self) -> &'static str {
        self.config().policy.name()
    }

    fn reserved_and_live_bytes(&self) -> (u64, u64) {
        (self.stats().reserved_bytes, self.stats().live_bytes)
    }

    fn count_oom(&mut self) {
        self.count_refused();
    }

    fn compact(
        &mut self,
        movable: &[(HeapAllocation, Request)],
        algorithm: Algorithm,
        budget: Budget,
    ) -> Result<Vec<(usize, HeapAllocation)>> {
        let listed: Vec<Movable> = movable.iter().map(|&(allocation, request)| Movable { allocation, request }).collect();
        let compaction = Heap::compact(self, &listed, algorithm, budget)?;
        Ok(moved_indices(movable, compaction.moves.into_iter().map(|m| (m.from, m.to)).collect()))
    }
}

impl DeviceHeap for PagedHeap {
    type Handle = Allocation;

    fn empty_cache(&mut self) -> Result<()> {
        PagedHeap::empty_cache(self);
        Ok(())
    }

    fn allocate_request(&mut self, request: Request) -> Result<Allocation> {
        self.allocate(request)
    }

    fn free_handle(&mut self, handle: Allocation) -> Result<()> {
        self.free(handle)
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

    fn cached_bytes(&self) -> u64 {
        self.stats().cached_bytes
    }

    fn record_device_events(&mut self, on: bool) {
        PagedHeap::record_device_events(self, on);
    }

    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        PagedHeap::take_device_events(self)
    }

    fn policy_name(&self) -> &'static str {
        "paged"
    }

    fn reserved_and_live_bytes(&self) -> (u64, u64) {
        (self.stats().mapped_bytes, self.stats().live_bytes)
    }

    fn count_oom(&mut self) {
        self.count_refused();
    }

    fn compact(
        &mut self,
        movable: &[(Allocation, Request)],
        algorithm: Algorithm,
        budget: Budget,
    ) -> Result<Vec<(usize, Allocation)>> {
        let compaction = PagedHeap::compact(self, movable, algorithm, budget)?;
        Ok(moved_indices(movable, compaction.moves))
    }

    fn moves_by_remap(&self) -> bool {
        true
    }
}

/// Each move `(from, to)` as the index in `movable` of the allocation moved and its new handle (an allocation moved
/// twice is found by its handle after the first move).
pub fn moved_indices<H: Copy + Eq + std::hash::Hash>(movable: &[(H, Request)], moves: Vec<(H, H)>) -> Vec<(usize, H)> {
    let mut index: std::collections::HashMap<H, usize> =
        movable.iter().enumerate().map(|(i, &(handle, _))| (handle, i)).collect();
    moves
        .into_iter()
        .filter_map(|(from, to)| {
            let i = index.remove(&from)?;
            index.insert(to, i);
            Some((i, to))
        })
        .collect()
}
