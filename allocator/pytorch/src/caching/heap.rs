//! [`CachingHeap`]: the emulated caching allocator as a [`DeviceHeap`], so the replay loop, the bench runner and
//! device backends drive PyTorch's placement rules like any other heap.
//!
//! Requests go to [`CachingAllocator::malloc`] on stream 0 with no address hint (segments at increasing
//! addresses); handles carry the block's address, its segment's base and a generation-checked id, so a double or
//! foreign free is an error even after the address was handed out again. The allocator's own device operations
//! become core [`DeviceEvent`](heapscope_core::DeviceEvent)s: `segment_alloc` / `segment_free` are blocks reserved and
//! released, `segment_map` / `segment_unmap` (expandable segments) page runs mapped and unmapped, each at its
//! address in the allocator's address space. A backend applies them to real memory the way `DevicePagedHeap`
//! applies a `PagedHeap`'s; when its device refuses memory reserved for a request,
//! [`CachingHeap::undo_device_refusal`] frees the request, releases the cache and gives the verdict every backend
//! (Vulkan, wgpu) returns.

use super::backing::device_event;
use super::{CachingAllocator, LiveBlock, MIN_BLOCK_BYTES, OomReport, round_size};
use crate::AllocConf;
use heapscope_core::DeviceLog;
use heapscope_core::hash::FastMap;
use heapscope_core::{
    Allocation, AllocationId, DeviceEvent, DeviceHeap, Error, OomCause, OomVerdict, OwnerId, Request, ResourceKind, Result,
};

/// A live allocation of a [`CachingHeap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CachingAllocation {
    allocation: Allocation,
    address: u64,
    segment_base: u64,
}

impl CachingAllocation {
    /// The handle of `block`, serving a request of `size_bytes`, known as `id` of `owner`: for a replay that drives
    /// the allocator itself (the emulation of a snapshot, entry by entry) as well as for [`CachingHeap`].
    pub fn of_block(block: &LiveBlock, size_bytes: u64, owner: OwnerId, id: AllocationId) -> Self {
        let offset = block.address - block.segment_base;
        let allocation = Allocation::from_parts(owner, id, offset, size_bytes, (offset, block.size_bytes), ResourceKind::Linear);
        Self { allocation, address: block.address, segment_base: block.segment_base }
    }

    /// The allocation: offset in its segment, bytes asked for, footprint = the block.
    pub fn allocation(&self) -> &Allocation {
        &self.allocation
    }

    /// The block's address in the allocator's address space.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// The base of the segment holding it (a `cudaMalloc` block, or an expandable segment's virtual range).
    pub fn segment_base(&self) -> u64 {
        self.segment_base
    }

    /// Offset in the segment.
    pub fn offset(&self) -> u64 {
        self.allocation.offset()
    }

    /// Bytes asked for.
    pub fn size_bytes(&self) -> u64 {
        self.allocation.size_bytes()
    }
}

/// PyTorch's caching allocator (emulated) as a heap. See the module documentation.
#[derive(Debug)]
pub struct CachingHeap {
    allocator: CachingAllocator,
    capacity_bytes: Option<u64>,
    owner: OwnerId,
    /// The id of the live allocation at each address.
    live: FastMap<u64, AllocationId>,
    next_id: u64,
    live_bytes: u64,
    refused: u64,
    /// PyTorch's report of the last refused request.
    last_refusal: Option<OomReport>,
    device_log: DeviceLog,
}

impl CachingHeap {
    /// An empty allocator with `conf` on a device of `capacity_bytes` (`None`: unlimited).
    pub fn new(conf: AllocConf, capacity_bytes: Option<u64>) -> Self {
        Self {
            allocator: CachingAllocator::new(conf, capacity_bytes),
            capacity_bytes,
            owner: OwnerId::fresh(),
            live: FastMap::default(),
            next_id: 0,
            live_bytes: 0,
            refused: 0,
            last_refusal: None,
            device_log: DeviceLog::default(),
        }
    }

    /// The allocator (its statistics, segments, settings).
    pub fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }

    /// `pytorch-expandable` with expandable segments, else `pytorch`.
    pub fn name(&self) -> &'static str {
        self.allocator.policy_name()
    }

    /// Bytes asked for by live allocations.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Requests refused so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// PyTorch's report of the last request refused (its `OutOfMemoryError` numbers; the verdict of
    /// [`CachingHeap::allocate`] is made from it).
    pub fn last_refusal(&self) -> Option<&OomReport> {
        self.last_refusal.as_ref()
    }

    /// `torch.cuda.empty_cache()`: every wholly free segment (and free expandable page) goes back to the device.
    pub fn empty_cache(&mut self) {
        self.allocator.empty_cache();
        self.log_events();
    }

    /// Serves `size_bytes` (blocks are 512-byte aligned).
    ///
    /// # Errors
    /// [`Error::ZeroSize`]; [`Error::OutOfMemory`] with PyTorch's numbers as a verdict (the cache was released
    /// first, as PyTorch does: the device events say what went back).
    pub fn allocate(&mut self, size_bytes: u64) -> Result<CachingAllocation> {
        if size_bytes == 0 {
            return Err(Error::ZeroSize);
        }
        let result = self.allocator.malloc(size_bytes, 0, None);
        self.log_events();
        let address = match result {
            Ok(address) => address,
            Err(report) => {
                self.refused += 1;
                let verdict = self.allocator.verdict(&report);
                self.last_refusal = Some(report);
                return Err(Error::OutOfMemory(Box::new(verdict)));
            }
        };
        let Some(block) = self.allocator.live_block(address) else {
            return Err(Error::Source(format!("the caching allocator handed out {address:#x} but holds no block there")));
        };
        let id = AllocationId(self.next_id);
        self.next_id += 1;
        self.live.insert(address, id);
        self.live_bytes += size_bytes;
        Ok(CachingAllocation::of_block(&block, size_bytes, self.owner, id))
    }

    /// Frees an allocation it made (the block goes back to the cache at once: no stream uses).
    ///
    /// # Errors
    /// [`Error::ForeignAllocation`] or [`Error::DoubleFree`]; nothing changes then.
    pub fn free(&mut self, allocation: CachingAllocation) -> Result<()> {
        if allocation.allocation.owner() != self.owner {
            return Err(Error::ForeignAllocation { offset: allocation.offset(), owner: "caching allocator" });
        }
        if self.live.get(&allocation.address) != Some(&allocation.allocation.id()) {
            return Err(Error::DoubleFree {
                offset: allocation.offset(),
                id: allocation.allocation.id().0,
                owner: "caching allocator",
            });
        }
        self.live.remove(&allocation.address);
        self.allocator.free(allocation.address);
        self.live_bytes -= allocation.size_bytes();
        self.log_events();
        Ok(())
    }

    /// Undoes `allocation` after the device refused memory the allocator reserved for it (a backend's memory
    /// runs out below the allocator's capacity): frees it and releases the cache, whose device events say what
    /// goes back (some of it never backed), and returns the verdict: exhaustion, with the reserved and live bytes
    /// left.
    ///
    /// # Errors
    /// What [`CachingHeap::free`] returns for a foreign or already freed `allocation`.
    pub fn undo_device_refusal(&mut self, allocation: CachingAllocation) -> Result<OomVerdict> {
        let size_bytes = allocation.size_bytes();
        self.free(allocation)?;
        self.empty_cache();
        let (reserved_bytes, live_bytes) = self.reserved_and_live_bytes();
        Ok(OomVerdict {
            policy: self.name(),
            requested_bytes: size_bytes,
            needed_bytes: round_size(size_bytes, self.allocator.conf()),
            align_bytes: MIN_BLOCK_BYTES,
            reserved_bytes,
            live_bytes,
            padding_bytes: 0,
            free_in_blocks_bytes: reserved_bytes.saturating_sub(live_bytes),
            largest_free_run_bytes: 0,
            retired_bytes: 0,
            unreserved_bytes: 0,
            capacity_bytes: self.capacity_bytes,
            virtual_range_bytes: None,
            new_block_bytes: None,
            cause: OomCause::Exhaustion,
        })
    }

    /// Moves the allocator's segment operations into the device log (or drops them when it is off).
    fn log_events(&mut self) {
        for event in self.allocator.take_events().iter().filter_map(device_event) {
            self.device_log.push(|| event);
        }
    }
}

impl DeviceHeap for CachingHeap {
    fn empty_cache(&mut self) -> Result<()> {
        CachingHeap::empty_cache(self);
        Ok(())
    }

    type Handle = CachingAllocation;

    fn allocate_request(&mut self, request: Request) -> Result<CachingAllocation> {
        if request.align_bytes() > MIN_BLOCK_BYTES {
            return Err(Error::InvalidConfig {
                what: format!(
                    "alignment {} B: PyTorch's caching allocator aligns blocks to {MIN_BLOCK_BYTES} B",
                    request.align_bytes()
                ),
            });
        }
        self.allocate(request.size_bytes())
    }

    fn free_handle(&mut self, handle: CachingAllocation) -> Result<()> {
        self.free(handle)
    }

    fn allocation(handle: &CachingAllocation) -> &Allocation {
        &handle.allocation
    }

    fn address(handle: &CachingAllocation) -> u64 {
        handle.address
    }

    fn block_base(handle: &CachingAllocation) -> u64 {
        handle.segment_base
    }

    fn record_device_events(&mut self, on: bool) {
        self.device_log.set_recording(on);
    }

    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        self.device_log.take()
    }

    fn policy_name(&self) -> &'static str {
        self.name()
    }

    fn reserved_and_live_bytes(&self) -> (u64, u64) {
        (self.allocator.reserved_bytes(), self.live_bytes)
    }

    /// A request refused before it reached the allocator (its size overflows): no report of PyTorch's.
    fn count_oom(&mut self) {
        self.refused += 1;
        self.last_refusal = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_core::OomCause;
    use heapscope_core::units::MIB;

    fn heap(conf: &str, capacity_bytes: Option<u64>) -> CachingHeap {
        let mut settings = AllocConf::default();
        settings.parse_overrides(conf).unwrap();
        let mut heap = CachingHeap::new(settings, capacity_bytes);
        heap.record_device_events(true);
        heap
    }

    /// A device refusal undone: the allocation freed, the cache released (as device events), and an exhaustion
    /// verdict with the bytes left and the allocator's capacity; the allocation cannot be undone twice.
    #[test]
    fn device_refusal_is_undone_with_a_verdict() {
        let mut heap = heap("", Some(64 * MIB));
        let kept = heap.allocate(1000).unwrap();
        let refused = heap.allocate(3 * MIB).unwrap();
        heap.take_device_events();
        let verdict = heap.undo_device_refusal(refused).unwrap();
        let released = heap.take_device_events();
        assert_eq!(released, vec![DeviceEvent::Released { address: refused.segment_base(), size_bytes: 20 * MIB }]);
        assert_eq!((verdict.policy, verdict.requested_bytes, verdict.needed_bytes), ("pytorch", 3 * MIB, 3 * MIB));
        assert_eq!((verdict.align_bytes, verdict.capacity_bytes), (MIN_BLOCK_BYTES, Some(64 * MIB)));
        assert_eq!((verdict.reserved_bytes, verdict.live_bytes, verdict.free_in_blocks_bytes), (2 * MIB, 1000, 2 * MIB - 1000));
        assert_eq!((verdict.cause, verdict.unreserved_bytes), (OomCause::Exhaustion, 0));
        assert!(matches!(heap.undo_device_refusal(refused), Err(Error::DoubleFree { .. })));
        heap.free(kept).unwrap();
    }

    /// Segments come and go as device events; offsets are in the segment; the footprint is the block.
    #[test]
    fn segments_become_device_events() {
        let mut heap = heap("", None);
        let small = heap.allocate(1000).unwrap();
        let large = heap.allocate(3 * MIB).unwrap();
        let events = heap.take_device_events();
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(matches!(events[0], DeviceEvent::Reserved { size_bytes, .. } if size_bytes == 2 * MIB));
        assert!(matches!(events[1], DeviceEvent::Reserved { size_bytes, .. } if size_bytes == 20 * MIB));
        assert_eq!((small.offset(), small.allocation().footprint_bytes(), small.size_bytes()), (0, 1024, 1000));
        assert_eq!(heap.reserved_and_live_bytes(), (22 * MIB, 1000 + 3 * MIB));
        let second = heap.allocate(512).unwrap();
        assert_eq!((second.segment_base(), second.offset()), (small.segment_base(), 1024));
        let segments = heap.allocator();
        assert_eq!(segments.segment_at(second.address()), Some((small.segment_base(), 2 * MIB)));
        assert_eq!(segments.segment_at(large.address() + 20 * MIB - 1), Some((large.segment_base(), 20 * MIB)));
        assert_eq!(segments.segment_at(large.address() + 20 * MIB), None);
        assert!(segments.expandable_segments().is_empty());
        heap.free(small).unwrap();
        heap.free(large).unwrap();
        heap.free(second).unwrap();
        assert!(heap.take_device_events().is_empty(), "freed blocks stay cached");
        heap.empty_cache();
        let released = heap.take_device_events();
        assert_eq!(released.len(), 2);
        assert!(released.iter().all(|event| matches!(event, DeviceEvent::Released { .. })));
        assert_eq!(heap.reserved_and_live_bytes(), (0, 0));
    }

    #[test]
    fn double_foreign_and_stale_frees_are_refused() {
        let (mut a, mut b) = (heap("", None), heap("", None));
        let first = a.allocate(4096).unwrap();
        a.free(first).unwrap();
        assert!(matches!(a.free(first), Err(Error::DoubleFree { .. })));
        // The same address handed out again: the stale handle still cannot free it.
        let again = a.allocate(4096).unwrap();
        assert_eq!(again.address(), first.address());
        assert!(matches!(a.free(first), Err(Error::DoubleFree { .. })));
        let foreign = b.allocate(4096).unwrap();
        assert!(matches!(a.free(foreign), Err(Error::ForeignAllocation { .. })));
        a.free(again).unwrap();
        assert!(matches!(a.allocate(0), Err(Error::ZeroSize)));
        // No device holds it: refused with a verdict, before any rounding could overflow.
        assert!(matches!(a.allocate(u64::MAX), Err(Error::OutOfMemory(verdict)) if verdict.needed_bytes == u64::MAX));
        assert!(a.last_refusal().is_some());
        assert!(matches!(a.allocate_request(Request::new(64, 4096).unwrap()), Err(Error::InvalidConfig { .. })));
    }

    /// The frag_oom pattern in small: three 12 MiB segments cached, 8 MiB live in each, a 12 MiB request finds
    /// no room under a 40 MiB capacity: a fragmentation verdict with PyTorch's numbers.
    #[test]
    fn out_of_memory_is_a_verdict() {
        let mut heap = heap("", Some(40 * MIB));
        let big: Vec<_> = (0..3).map(|_| heap.allocate(12 * MIB).unwrap()).collect();
        for allocation in big {
            heap.free(allocation).unwrap();
        }
        let medium: Vec<_> = (0..3).map(|_| heap.allocate(8 * MIB).unwrap()).collect();
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(12 * MIB) else { panic!("12 MiB must fail") };
        assert_eq!(verdict.policy, "pytorch");
        assert_eq!((verdict.reserved_bytes, verdict.live_bytes), (36 * MIB, 24 * MIB));
        assert_eq!((verdict.free_in_blocks_bytes, verdict.largest_free_run_bytes), (12 * MIB, 4 * MIB));
        assert_eq!((verdict.unreserved_bytes, verdict.cause), (4 * MIB, OomCause::Fragmentation));
        assert_eq!(heap.refused(), 1);
        drop(medium);
        // With expandable segments the same stream is served: pages are mapped where the request needs them.
        let mut expandable = self::heap("expandable_segments:True", Some(40 * MIB));
        let big: Vec<_> = (0..3).map(|_| expandable.allocate(12 * MIB).unwrap()).collect();
        for allocation in big {
            expandable.free(allocation).unwrap();
        }
        let medium: Vec<_> = (0..3).map(|_| expandable.allocate(8 * MIB).unwrap()).collect();
        let last = expandable.allocate(12 * MIB).unwrap();
        assert_eq!(expandable.name(), "pytorch-expandable");
        let events = expandable.take_device_events();
        assert!(!events.is_empty() && events.iter().all(|event| matches!(event, DeviceEvent::Mapped { .. })), "{events:?}");
        assert_eq!(last.segment_base(), medium[0].segment_base());
        assert_eq!(expandable.reserved_and_live_bytes(), (40 * MIB, 36 * MIB));
        let segments = expandable.allocator().expandable_segments();
        assert_eq!(segments.len(), 1);
        assert_eq!(expandable.allocator().segment_at(last.address()), Some(segments[0]));
    }
}
