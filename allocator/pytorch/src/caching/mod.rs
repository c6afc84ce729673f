//! A byte-exact emulation of PyTorch 2.11's CUDA caching allocator (`DeviceCachingAllocator` in
//! `c10/cuda/CUDACachingAllocator.cpp`), replaying a snapshot's trace decision by decision.
//!
//! ## Design
//!
//! - [`CachingAllocator`] is the allocator, usable step by step ([`CachingAllocator::malloc`],
//!   [`CachingAllocator::free`], [`CachingAllocator::report`]). Blocks live in an arena and are linked to
//!   their neighbours in the segment (`Block::prev/next`); each pool keeps its cached free blocks in a
//!   `BTreeSet` ordered by (stream, size, address) — PyTorch's `BlockComparatorSize`, which breaks ties by
//!   address — and its unmapped expandable ranges by (stream, address) (`BlockComparatorAddress`). Every memory pool
//!   has its small and large pool (`MemoryPool`): the allocator's own, and each private pool (a CUDA graph's, a
//!   `torch.cuda.MemPool`'s) a request is made to ([`CachingAllocator::malloc_in`], a trace entry's `pool_id`), which
//!   `empty_cache()` releases only once it is gone ([`CachingAllocator::set_freeable`]).
//! - Every function is named after the PyTorch function it implements and says which rule it follows:
//!   `round_size`, `get_allocation_size`, `get_pool`, `get_free_block`, `alloc_block`, `should_split`,
//!   `alloc_found_block`, `free_block`, `try_merge_blocks` here; the cache release paths in `release`;
//!   expandable segments (`find_expandable_block`, `map_block`, `unmap_block`) in `expandable`.
//! - The only inputs that are not allocator decisions: where the driver puts a new segment or expandable
//!   segment's reservation (a base address hint, taken by [`emulate`] from the recorded `alloc` that opens
//!   it; without one, bases simply increase; in a run that turns expandable segments on or off against the
//!   recording, the driver's rule of `addresses`, see [`AddressSource`]), the device's capacity, and user
//!   `empty_cache()` calls.
//! - [`CachingHeap`] (`heap`) wraps the allocator as a [`heapscope_core::DeviceHeap`]: generation-checked handles, its
//!   segment operations as core device events (blocks reserved and released, expandable pages mapped and
//!   unmapped), out of memory as a core [`OomVerdict`] ([`OomReport::verdict`]); the bench runner and the Vulkan
//!   backend drive PyTorch's rules through it.
//! - [`Emulator`] drives the allocator through a snapshot's trace, one entry per [`Emulator::step`], and compares
//!   what it decided with what PyTorch recorded ([`Fidelity`]); [`emulate`] steps it through every entry (the lab's
//!   replay driver steps it moment by moment); `initial` rebuilds the allocator state at the start of a recording that began
//!   mid-run, as MemoryViz does. [`emulate_backed`] does the same with memory under the allocator
//!   ([`SegmentBacking`], `backing`): every segment operation applied as it is made (the Vulkan backend puts
//!   device memory there).

mod addresses;
mod backing;
mod emulate;
mod expandable;
mod heap;
mod in_effect;
mod initial;
mod release;
mod request_pools;
#[cfg(test)]
mod tests;
mod validate;
mod virtual_segments;

use std::collections::{BTreeMap, BTreeSet};

pub use addresses::{AddressSource, DEFAULT_CUDA_MALLOC_TOP, DRIVER_GRANULE_BYTES, DriverRuleScore};
pub use backing::{BackingRefused, EntryEffect, SegmentBacking, Unbacked};
pub use emulate::{
    Emulation, Emulator, EventStats, Fidelity, Mismatch, Misplacement, OomEvent, SegmentEvent, Stepped, emulate, emulate_backed,
    user_empty_caches,
};
pub use heap::{CachingAllocation, CachingHeap};
pub use in_effect::{largest_block_bound, settings_in_effect};
pub use request_pools::RequestPools;
pub use validate::{EmulationError, no_overlapping_segments, segments_describe_a_device};
pub use virtual_segments::{add_range, remove_range};

use super::alloc_conf::AllocConf;
use super::memory_stats::MemoryStats;
use super::snapshot::{Action, Block, BlockState, Pool, Segment, Snapshot, StackId};
use heapscope_core::{OomCause, OomVerdict};

/// `kMinBlockSize`: every size is a multiple of 512 bytes.
pub const MIN_BLOCK_BYTES: u64 = 512;
/// `kSmallSize`: requests up to 1 MiB use the small pool.
pub const SMALL_SIZE_BYTES: u64 = 1 << 20;
/// `kSmallBuffer`: small-pool segments (and expandable small-pool pages) are 2 MiB.
pub const SMALL_BUFFER_BYTES: u64 = 2 << 20;
/// `kMinLargeAlloc`: requests below 10 MiB get a 20 MiB segment.
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 << 20;
/// `kRoundLarge`: larger segments are rounded up to 2 MiB.
pub const ROUND_LARGE_BYTES: u64 = 2 << 20;
/// `kLargeBuffer`: 20 MiB segments (and expandable large-pool pages).
pub const LARGE_BUFFER_BYTES: u64 = 20 << 20;
/// Virtual bytes reserved per expandable segment while the allocator has reserved less than 114 GiB at once. PyTorch
/// reserves 9/8 of the device's memory (157 GiB on an H200, 89 GiB on an 80 GB H100); the trace does not say how much,
/// but it shows where the driver put the next reservation: a segment whose base comes from the trace ends by the next
/// reservation above it (`expandable.rs`), so a device with less memory than that gets segments as close as its own;
/// above, a reservation spans 9/8 of the most reserved at once (the device holds at least that), and one the trace
/// places a request past grows.
pub const EXPANDABLE_VIRTUAL_BYTES: u64 = 128 << 30;

/// Requests above this (1 EiB, the largest device heapscope models) fit no device: refused as out of memory, so
/// sizes stay far from overflow.
pub const MAX_REQUEST_BYTES: u64 = heapscope_core::LARGEST_DEVICE_BYTES;

/// Addresses and ranges end by this (4 EiB), far above any device's virtual address space: sums of
/// addresses and sizes stay exact. Also the most the emulation ever reserves, whatever the capacity.
pub const ADDRESS_LIMIT: u64 = 1 << 62;

/// `round_size`: 512 B multiples, or `roundup_power2_divisions` steps between powers of two.
pub fn round_size(size_bytes: u64, conf: &AllocConf) -> u64 {
    if size_bytes < MIN_BLOCK_BYTES {
        return MIN_BLOCK_BYTES;
    }
    let divisions = conf.divisions_for(size_bytes);
    // PyTorch's `kMinBlockSize * divisions` is a `size_t` product: from 2^55 divisions it wraps (to 0), and every
    // size not a power of two goes up to the next one.
    if divisions > 1 && size_bytes > MIN_BLOCK_BYTES.wrapping_mul(divisions) {
        roundup_power2_next_division(size_bytes, divisions)
    } else {
        // Saturating: a size near 2^64 (refused by the emulation, but bounded first by `advise`) rounds to the top.
        size_bytes.div_ceil(MIN_BLOCK_BYTES).saturating_mul(MIN_BLOCK_BYTES)
    }
}

/// `roundup_power2_next_division`: the next multiple of `2^floor(log2 size) / divisions`.
fn roundup_power2_next_division(size_bytes: u64, divisions: u64) -> u64 {
    if size_bytes.is_power_of_two() {
        return size_bytes;
    }
    let floor = 1u64 << (63 - size_bytes.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let rounded_floor = size_bytes & !(step - 1);
    if rounded_floor == size_bytes { size_bytes } else { rounded_floor.saturating_add(step) }
}

/// `get_allocation_size`: a new segment for a rounded request: 2 MiB for the small pool, 20 MiB below
/// 10 MiB, else rounded up to 2 MiB.
pub fn get_allocation_size(size_bytes: u64) -> u64 {
    if size_bytes <= SMALL_SIZE_BYTES {
        SMALL_BUFFER_BYTES
    } else if size_bytes < MIN_LARGE_ALLOC_BYTES {
        LARGE_BUFFER_BYTES
    } else {
        size_bytes.div_ceil(ROUND_LARGE_BYTES).saturating_mul(ROUND_LARGE_BYTES)
    }
}

/// `get_pool`: the small pool serves rounded sizes up to 1 MiB.
pub fn get_pool(size_bytes: u64) -> Pool {
    if size_bytes <= SMALL_SIZE_BYTES { Pool::Small } else { Pool::Large }
}

/// A device-memory operation the allocator performed (`segment_alloc`, `segment_free`, `segment_map`,
/// `segment_unmap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DeviceEvent {
    /// The action, as PyTorch records it.
    pub action: Action,
    /// Address of the segment or mapped range.
    pub addr: u64,
    /// Bytes.
    pub size_bytes: u64,
}

/// Why a request failed: PyTorch's out-of-memory message, as numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OomReport {
    /// What the caller asked for.
    pub request_bytes: u64,
    /// Bytes reserved after the cache was released ("reserved by PyTorch").
    pub reserved_bytes: u64,
    /// Bytes allocated ("allocated by PyTorch").
    pub allocated_bytes: u64,
    /// Reserved but unallocated bytes (free inside reserved memory).
    pub free_in_reserved_bytes: u64,
    /// Of [`OomReport::free_in_reserved_bytes`], the bytes cached in free blocks the request could use: its memory
    /// pool's (the allocator's own, or a private pool), of its size (small or large blocks), on its stream. PyTorch keeps
    /// the rest apart from it.
    pub usable_free_bytes: u64,
    /// The largest of those blocks.
    pub largest_free_block_bytes: u64,
    /// `num_alloc_retries` so far.
    pub num_alloc_retries: i64,
    /// What PyTorch's message says it tried to allocate: `alloc_size`, the request rounded to the segment it needs
    /// (a request under 1 MiB asks a 2 MiB segment, one under 10 MiB a 20 MiB one).
    pub alloc_bytes: u64,
    /// What serving it needed in all: the request as the allocator rounds it, plus what the device would have had to
    /// give beyond that (the rest of a new segment, or of the last page mapped into an expandable one): the free bytes
    /// that do not cover this are no fragmentation.
    pub needed_bytes: u64,
}

/// An allocated block ([`CachingAllocator::live_block`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Its address.
    pub address: u64,
    /// Its size: the request rounded (`round_size`), or a whole block too small to split.
    pub size_bytes: u64,
    /// Bytes the caller asked for.
    pub requested_bytes: u64,
    /// The base of the segment holding it.
    pub segment_base: u64,
}

impl OomReport {
    /// The report as a core verdict for `policy` under `capacity_bytes`, judged by [`OomCause::judge`]:
    /// fragmentation when the free bytes in reserved memory plus what the capacity still allows cover `needed_bytes`
    /// (the request as the allocator rounds it), else internal waste or exhaustion. `live_bytes` are the bytes callers asked for and hold.
    pub fn verdict(&self, policy: &'static str, needed_bytes: u64, live_bytes: u64, capacity_bytes: Option<u64>) -> OomVerdict {
        // Without a capacity, the largest device heapscope models (where the emulation's driver stops too).
        let unreserved_bytes = capacity_bytes.unwrap_or(heapscope_core::LARGEST_DEVICE_BYTES).saturating_sub(self.reserved_bytes);
        OomVerdict {
            policy,
            requested_bytes: self.request_bytes,
            needed_bytes,
            align_bytes: MIN_BLOCK_BYTES,
            reserved_bytes: self.reserved_bytes,
            live_bytes,
            padding_bytes: self.allocated_bytes.saturating_sub(live_bytes),
            free_in_blocks_bytes: self.free_in_reserved_bytes,
            largest_free_run_bytes: self.largest_free_block_bytes,
            retired_bytes: 0,
            unreserved_bytes,
            capacity_bytes,
            virtual_range_bytes: None,
            new_block_bytes: None,
            cause: OomCause::Exhaustion,
        }
        .judged()
    }
}

/// Index of a block in the arena.
type BlockId = usize;

/// `Block` of `CUDACachingAllocator.cpp`.
#[derive(Clone, Debug)]
struct Node {
    addr: u64,
    size: u64,
    /// `requested_size`: the request of the block's last allocation, kept once it is freed (PyTorch writes it for a
    /// free block too); 0 for a block never allocated.
    requested: u64,
    stream: u64,
    pool: Pool,
    /// The memory pool holding it: an index in [`CachingAllocator::pools`] (0, the allocator's own).
    owner: usize,
    /// Handed out (`allocated`).
    allocated: bool,
    /// Allocated or freed but not yet completed (`event_count > 0`).
    active: bool,
    /// Backed by physical pages (always for non-expandable blocks).
    mapped: bool,
    prev: Option<BlockId>,
    next: Option<BlockId>,
    /// Index of the expandable segment holding the block.
    expandable: Option<usize>,
    /// `gc_count_base`.
    gc_base: i64,
}

impl Node {
    /// A free block of `[addr, addr + size)` on `stream` in `pool` of memory pool `owner`, not linked to neighbours yet.
    fn free(addr: u64, size: u64, stream: u64, (owner, pool): (usize, Pool), mapped: bool, expandable: Option<usize>) -> Node {
        Node {
            addr,
            size,
            requested: 0,
            stream,
            pool,
            owner,
            allocated: false,
            active: false,
            mapped,
            prev: None,
            next: None,
            expandable,
            gc_base: 0,
        }
    }
}

/// `BlockPool`: cached free blocks and unmapped expandable ranges.
#[derive(Clone, Debug, Default)]
struct BlockPool {
    /// `blocks` with `BlockComparatorSize`: (stream, size, address, id).
    blocks: BTreeSet<(u64, u64, u64, BlockId)>,
    /// `unmapped` with `BlockComparatorAddress`: (stream, address, id).
    unmapped: BTreeSet<(u64, u64, BlockId)>,
    /// `get_free_blocks_call_count`.
    get_free_blocks_call_count: i64,
}

/// A memory pool's cached blocks: the allocator's own (index 0; PyTorch's `small_blocks` and `large_blocks`) or a
/// private pool's (`PrivatePool`: a CUDA graph's or a `torch.cuda.MemPool`'s), which serves only the requests made
/// to it and is released only once its graph or pool is gone.
#[derive(Clone, Debug, Default)]
struct MemoryPool {
    /// `MempoolId_t`: `(0, 0)` for the allocator's own.
    id: (i64, i64),
    small: BlockPool,
    large: BlockPool,
    /// In `graph_pools_freeable` (its graph or `MemPool` is gone): `emptyCache()` releases its cached blocks too.
    freeable: bool,
}

/// `ExpandableSegment`: a reserved virtual range mapped in pages.
#[derive(Clone, Debug)]
struct ExpandableSegment {
    base: u64,
    size: u64,
    page_bytes: u64,
    /// The base is the driver's, from the trace (a recorded `alloc` that first landed in it, or the file's
    /// segments); otherwise synthetic, and the segment may move while nothing is mapped in it.
    from_trace: bool,
    /// The memory pool it belongs to (an index in [`CachingAllocator::pools`]).
    owner: usize,
}

/// The caching allocator of one device.
#[derive(Clone, Debug)]
pub struct CachingAllocator {
    conf: AllocConf,
    /// Bytes of device memory the driver lets PyTorch reserve (`None` = unlimited).
    capacity_bytes: Option<u64>,
    /// The device's memory, before the settings' memory fraction (`None` = unknown): what an expandable segment's
    /// reservation is 9/8 of.
    device_bytes: Option<u64>,
    /// Bytes the last request's latest refused segment or mapping would have held beyond what it needed of them (the
    /// rest of a segment, of the pages mapped), for [`OomReport::needed_bytes`].
    refused_rounding_bytes: u64,
    /// A temporary limit for one request (the driver's free memory recorded with an `oom` event).
    pub(crate) request_limit_bytes: Option<u64>,
    nodes: Vec<Option<Node>>,
    free_ids: Vec<BlockId>,
    /// The allocator's own pools first, then each private pool as first met (`graph_pools`).
    pools: Vec<MemoryPool>,
    /// Active blocks (allocated or pending free) by address.
    active: heapscope_core::hash::FastMap<u64, BlockId>,
    /// Non-expandable segments: base -> bytes.
    segments: BTreeMap<u64, u64>,
    /// The non-expandable segments of private pools: base -> memory pool (the others are the allocator's own).
    segment_owners: BTreeMap<u64, usize>,
    expandable: Vec<Option<ExpandableSegment>>,
    /// Where new segments' and reservations' bases come from.
    addresses: AddressSource,
    /// The driver's virtual address space, for [`AddressSource::Driver`].
    driver: addresses::DriverAddresses,
    /// `cudaMalloc` segments placed at the trace's address where the driver's rule had something to go on, and how
    /// many of them the rule put at that very address.
    driver_rule: DriverRuleScore,
    stats: MemoryStats,
    /// `total_allocated_memory`: reserved bytes.
    total_allocated_memory: u64,
    events: Vec<DeviceEvent>,
    /// PyTorch before 2.5: private pools take whole `cudaMalloc` segments even with expandable segments on (its
    /// checkpointing of private pools did not support them); set where the recording shows it.
    private_pools_whole: bool,
}

impl CachingAllocator {
    /// An empty allocator. `capacity_bytes`: device memory available to PyTorch (`None` = unlimited), of which the
    /// allocator reserves at most `conf`'s memory fraction ([`AllocConf::allowed_bytes`]).
    pub fn new(conf: AllocConf, capacity_bytes: Option<u64>) -> CachingAllocator {
        CachingAllocator {
            capacity_bytes: conf.allowed_bytes(capacity_bytes),
            device_bytes: capacity_bytes,
            conf,
            refused_rounding_bytes: 0,
            request_limit_bytes: None,
            nodes: Vec::new(),
            free_ids: Vec::new(),
            pools: vec![MemoryPool::default()],
            active: heapscope_core::hash::FastMap::default(),
            segments: BTreeMap::new(),
            segment_owners: BTreeMap::new(),
            expandable: Vec::new(),
            addresses: AddressSource::Trace,
            driver: addresses::DriverAddresses::default(),
            driver_rule: DriverRuleScore::default(),
            stats: MemoryStats::default(),
            total_allocated_memory: 0,
            events: Vec::new(),
            private_pools_whole: false,
        }
    }

    /// Serves private pools from whole segments even with expandable segments on, as PyTorch before 2.5 did.
    pub(crate) fn set_private_pools_whole(&mut self) {
        self.private_pools_whole = true;
    }

    /// The allocator as it stood when the recording of device `device` in `snapshot` started (empty for a
    /// recording that began at CUDA initialisation); see the `initial` module.
    ///
    /// # Errors
    ///
    /// [`EmulationError`] naming the segment, block or trace entry the emulation cannot replay.
    pub fn at_recording_start(
        snapshot: &Snapshot,
        device: usize,
        conf: &AllocConf,
        capacity_bytes: Option<u64>,
    ) -> Result<CachingAllocator, EmulationError> {
        validate::validate(snapshot, device)?;
        let pools = RequestPools::of(snapshot, device);
        Ok(initial::rebuild_start_state(snapshot, device, conf, capacity_bytes, &pools)?.0)
    }

    /// The settings.
    pub fn conf(&self) -> &AllocConf {
        &self.conf
    }

    /// Where new segments' and reservations' bases come from.
    pub fn address_source(&self) -> AddressSource {
        self.addresses
    }

    /// From now on, new segments and reservations placed by the driver's rule, not at the addresses the trace gives
    /// (see [`AddressSource`]): the first `cudaMalloc` range ending at `cuda_malloc_top` and the first reservation
    /// starting at `reserve_bottom` while the allocator holds none (`None`: where a process's usually go).
    pub fn use_driver_addresses(&mut self, cuda_malloc_top: Option<u64>, reserve_bottom: Option<u64>) {
        self.addresses = AddressSource::Driver;
        self.driver.anchor(cuda_malloc_top, reserve_bottom);
    }

    /// From now on, a device of `capacity_bytes` (`None`: unlimited), of which the settings' memory fraction.
    pub fn set_capacity(&mut self, capacity_bytes: Option<u64>) {
        self.capacity_bytes = self.conf.allowed_bytes(capacity_bytes);
        self.device_bytes = capacity_bytes;
    }

    /// `pytorch-expandable` with expandable segments, else `pytorch`: its name as a contender.
    pub fn policy_name(&self) -> &'static str {
        if self.conf.expandable_segments { "pytorch-expandable" } else { "pytorch" }
    }

    /// `report`, of a request this allocator just refused, as a core verdict: what serving it needed
    /// ([`OomReport::needed_bytes`]: a request no device holds is refused before rounding, which would overflow), the
    /// bytes callers hold now, this allocator's capacity.
    pub fn verdict(&self, report: &OomReport) -> OomVerdict {
        let live_bytes = u64::try_from(self.stats.requested_bytes.all().current).unwrap_or(0);
        report.verdict(self.policy_name(), report.needed_bytes, live_bytes, self.capacity_bytes)
    }

    /// `torch.cuda.memory_stats()` now.
    pub fn stats(&self) -> &MemoryStats {
        &self.stats
    }

    /// How well the driver's rule ([`AddressSource::Driver`]) foretold the bases of the segments placed at the trace's
    /// addresses so far, each from the segments as they were.
    pub fn driver_rule_score(&self) -> DriverRuleScore {
        self.driver_rule
    }

    /// Reserved bytes now.
    pub fn reserved_bytes(&self) -> u64 {
        self.total_allocated_memory
    }

    /// Device operations performed since the last call.
    pub fn take_events(&mut self) -> Vec<DeviceEvent> {
        std::mem::take(&mut self.events)
    }

    /// Forgets the segment operations made so far (keeping the room they took).
    pub(crate) fn clear_events(&mut self) {
        self.events.clear();
    }

    /// The allocated block starting at `address`: its size (the request rounded, or the whole block when it
    /// was not split) and the base of the segment holding it.
    pub fn live_block(&self, address: u64) -> Option<LiveBlock> {
        let &id = self.active.get(&address)?;
        if !self.node(id).allocated {
            return None;
        }
        self.active_block(address)
    }

    /// The block starting at `address` that a caller holds: allocated, or freed by the caller and waiting for its
    /// stream uses (`free_requested` before `free_completed`, still in the allocator's active set).
    pub fn active_block(&self, address: u64) -> Option<LiveBlock> {
        let &id = self.active.get(&address)?;
        let node = self.node(id);
        // The segment's base by address (O(log n)); walking the block list to its head would cost every block before
        // this one, which in an expandable segment can be all of them.
        let segment_base = self.segment_at(address).map_or_else(
            || {
                let mut head = id;
                while let Some(prev) = self.node(head).prev {
                    head = prev;
                }
                self.node(head).addr
            },
            |(base, _)| base,
        );
        Some(LiveBlock { address, size_bytes: node.size, requested_bytes: node.requested, segment_base })
    }

    /// The segment (a `cudaMalloc` block, or an expandable segment's whole virtual range) holding `address`:
    /// its base and size.
    pub fn segment_at(&self, address: u64) -> Option<(u64, u64)> {
        if let Some((&base, &size)) = self.segments.range(..=address).next_back()
            && address - base < size
        {
            return Some((base, size));
        }
        self.expandable.iter().flatten().find(|e| e.base <= address && address - e.base < e.size).map(|e| (e.base, e.size))
    }

    /// The memory pool of the segment or expandable segment holding `address` (`None` where nothing is reserved).
    pub fn pool_id_at(&self, address: u64) -> Option<(i64, i64)> {
        if let Some((&base, &size)) = self.segments.range(..=address).next_back()
            && address - base < size
        {
            return Some(self.pools[self.segment_owners.get(&base).copied().unwrap_or(0)].id);
        }
        let holding = self.expandable.iter().flatten().find(|e| e.base <= address && address - e.base < e.size)?;
        Some(self.pools[holding.owner].id)
    }

    /// The expandable segments reserved now: base and virtual size of each.
    pub fn expandable_segments(&self) -> Vec<(u64, u64)> {
        self.expandable.iter().flatten().map(|e| (e.base, e.size)).collect()
    }

    /// The virtual bytes of an expandable segment's reservation, as far as the allocator can tell: PyTorch reserves 9/8
    /// of the device's memory (`numSegments(total + total / 8)`), the device's capacity where known, and the device
    /// holds at least the most this allocator has reserved at once, with `more_bytes` beside what it holds now (pages a
    /// start state maps next); at least [`EXPANDABLE_VIRTUAL_BYTES`] (a reservation the trace shows is cut where the
    /// next one begins, and grown where a request lands past it). Of a device of at most the largest modelled
    /// ([`heapscope_core::LARGEST_DEVICE_BYTES`]), so that a reservation stays far below [`ADDRESS_LIMIT`].
    fn reservation_bytes(&self, more_bytes: u64) -> u64 {
        let peak = u64::try_from(self.stats.reserved_bytes.all().peak).unwrap_or(0);
        let reserved = peak.max(self.total_allocated_memory.saturating_add(more_bytes));
        let device_bytes = reserved.max(self.device_bytes.unwrap_or(0)).min(heapscope_core::LARGEST_DEVICE_BYTES);
        EXPANDABLE_VIRTUAL_BYTES.max(device_bytes + device_bytes / 8)
    }

    fn max_split_size(&self) -> u64 {
        self.conf.max_split_size.unwrap_or(u64::MAX)
    }

    /// PyTorch's `set_fraction`: a memory fraction is set (`per_process_memory_fraction` in the settings, or
    /// `torch.cuda.set_per_process_memory_fraction`, which no snapshot records). A recording or what-if with garbage
    /// collection on is taken to have set one (collection acts only under one; `advise` says to set it), of 1 where the
    /// settings give none: the capacity. With one, a request whose whole allocation size would pass the allowed bytes
    /// is refused before any `cudaMalloc` or page is tried ([`CachingAllocator::alloc_block`]).
    fn set_fraction(&self) -> bool {
        self.capacity_bytes.is_some()
            && (self.conf.per_process_memory_fraction.is_some() || self.conf.garbage_collection_threshold > 0.0)
    }

    /// Garbage collection acts only with a memory fraction ([`CachingAllocator::set_fraction`]).
    fn gc_enabled(&self) -> bool {
        self.set_fraction() && self.conf.garbage_collection_threshold > 0.0
    }

    /// The driver refuses to reserve beyond this: never beyond the largest device heapscope models
    /// ([`heapscope_core::LARGEST_DEVICE_BYTES`], the unlimited device every contender runs on; below
    /// [`ADDRESS_LIMIT`], so reserved bytes and segment ends stay far from overflow).
    fn device_limit(&self) -> u64 {
        let limit = match (self.capacity_bytes, self.request_limit_bytes) {
            (Some(c), Some(r)) => c.min(r),
            (Some(c), None) => c,
            (None, Some(r)) => r,
            (None, None) => u64::MAX,
        };
        limit.min(heapscope_core::LARGEST_DEVICE_BYTES)
    }

    fn node(&self, id: BlockId) -> &Node {
        match self.nodes.get(id) {
            Some(Some(n)) => n,
            _ => panic!("caching allocator: block {id} does not exist"),
        }
    }

    fn node_mut(&mut self, id: BlockId) -> &mut Node {
        match self.nodes.get_mut(id) {
            Some(Some(n)) => n,
            _ => panic!("caching allocator: block {id} does not exist"),
        }
    }

    fn new_node(&mut self, node: Node) -> BlockId {
        if let Some(id) = self.free_ids.pop() {
            self.nodes[id] = Some(node);
            id
        } else {
            self.nodes.push(Some(node));
            self.nodes.len() - 1
        }
    }

    fn delete_node(&mut self, id: BlockId) {
        self.nodes[id] = None;
        self.free_ids.push(id);
    }

    fn pool_mut(&mut self, (owner, pool): (usize, Pool)) -> &mut BlockPool {
        let memory_pool = &mut self.pools[owner];
        match pool {
            Pool::Small => &mut memory_pool.small,
            Pool::Large => &mut memory_pool.large,
        }
    }

    fn pool(&self, (owner, pool): (usize, Pool)) -> &BlockPool {
        let memory_pool = &self.pools[owner];
        match pool {
            Pool::Small => &memory_pool.small,
            Pool::Large => &memory_pool.large,
        }
    }

    /// The block pool holding block `id`'s kind of free range.
    fn pool_of(&self, id: BlockId) -> (usize, Pool) {
        let n = self.node(id);
        (n.owner, n.pool)
    }

    /// The index of the memory pool `id` names (a trace entry's `pool_id`, a segment's `segment_pool_id`), created
    /// empty when first met.
    fn owner_of(&mut self, id: (i64, i64)) -> usize {
        if id == (0, 0) {
            return 0;
        }
        if let Some(owner) = self.pools.iter().position(|memory_pool| memory_pool.id == id) {
            return owner;
        }
        self.pools.push(MemoryPool { id, ..MemoryPool::default() });
        self.pools.len() - 1
    }

    /// The private pool `id` is gone (its CUDA graph or `MemPool` was freed): `emptyCache()` releases it from now on.
    pub fn set_freeable(&mut self, id: (i64, i64)) {
        if id != (0, 0) {
            let owner = self.owner_of(id);
            self.pools[owner].freeable = true;
        }
    }

    /// `BlockPool::insert_into_blocks`: caches a free mapped block (and stamps its gc age base).
    fn insert_free(&mut self, id: BlockId) {
        let (stream, size, addr) = {
            let n = self.node(id);
            (n.stream, n.size, n.addr)
        };
        let pool = self.pool_of(id);
        let count = self.pool(pool).get_free_blocks_call_count;
        self.node_mut(id).gc_base = count;
        self.pool_mut(pool).blocks.insert((stream, size, addr, id));
    }

    fn remove_free(&mut self, id: BlockId) {
        let n = self.node(id);
        let key = (n.stream, n.size, n.addr, id);
        let pool = self.pool_of(id);
        self.pool_mut(pool).blocks.remove(&key);
    }

    fn insert_unmapped(&mut self, id: BlockId) {
        let n = self.node(id);
        let key = (n.stream, n.addr, id);
        let pool = self.pool_of(id);
        self.pool_mut(pool).unmapped.insert(key);
    }

    fn remove_unmapped(&mut self, id: BlockId) {
        let n = self.node(id);
        let key = (n.stream, n.addr, id);
        let pool = self.pool_of(id);
        self.pool_mut(pool).unmapped.remove(&key);
    }

    /// A base address for a new reservation of `size_bytes`: the hint when it overlaps nothing (and ends by
    /// [`ADDRESS_LIMIT`]), else past everything reserved so far (2 MiB aligned; with the driver's addresses, in its
    /// granules).
    fn choose_base(&self, hint: Option<u64>, size_bytes: u64) -> u64 {
        if let Some(h) = hint
            && h != 0
            && h.checked_add(size_bytes).is_some_and(|end| end <= ADDRESS_LIMIT)
            && !self.overlaps(h, size_bytes)
        {
            return h;
        }
        let segments_end = self.segments.iter().next_back().map(|(&b, &s)| b + s);
        let end = self.expandable.iter().flatten().map(|e| e.base + e.size).chain(segments_end).max();
        match self.addresses {
            AddressSource::Trace => end.unwrap_or(0).max(1 << 32).div_ceil(ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES,
            AddressSource::Driver => self.driver.reserve_base(end),
        }
    }

    /// The base of a new `cudaMalloc` segment of `size_bytes`: with the driver's addresses, where its rule puts it
    /// (when that overlaps nothing), else [`Self::choose_base`].
    fn cuda_malloc_base(&self, hint: Option<u64>, size_bytes: u64) -> u64 {
        if self.addresses == AddressSource::Driver
            && let Some(base) = self.driver.cuda_malloc_base(size_bytes)
            && !self.overlaps(base, size_bytes)
        {
            return base;
        }
        self.choose_base(hint, size_bytes)
    }

    /// A segment `cudaMalloc` gave (from the trace, the driver's rule, or the start of a recording) to memory pool
    /// `owner`.
    fn insert_segment(&mut self, base: u64, size_bytes: u64, owner: usize) {
        self.segments.insert(base, size_bytes);
        if owner != 0 {
            self.segment_owners.insert(base, owner);
        }
        self.driver.note_segment(base, size_bytes);
    }

    fn overlaps(&self, base: u64, size_bytes: u64) -> bool {
        let end = base.saturating_add(size_bytes);
        if let Some((&b, &s)) = self.segments.range(..end).next_back()
            && b + s > base
        {
            return true;
        }
        self.expandable.iter().flatten().any(|e| e.base < end && base < e.base + e.size)
    }

    /// `malloc`: serves a request of `size_bytes` on `stream` from the allocator's own pools; `base_hint` is where the
    /// driver would put a new segment (an address input from the trace). Returns the block's address.
    pub fn malloc(&mut self, size_bytes: u64, stream: u64, base_hint: Option<u64>) -> Result<u64, OomReport> {
        self.malloc_in((0, 0), size_bytes, stream, base_hint)
    }

    /// [`Self::malloc`] in the memory pool `pool_id` (`get_pool` during a CUDA graph capture or under
    /// `torch.cuda.use_mem_pool`: a trace entry's `pool_id`). A private pool's request never releases the
    /// allocator's whole cache to retry (PyTorch does that only while no capture or pool is in use).
    pub fn malloc_in(
        &mut self,
        pool_id: (i64, i64),
        size_bytes: u64,
        stream: u64,
        base_hint: Option<u64>,
    ) -> Result<u64, OomReport> {
        if size_bytes > MAX_REQUEST_BYTES {
            // No device holds it (cudaMalloc fails); refused before any rounding could overflow.
            self.stats.num_ooms += 1;
            return Err(self.oom_report(size_bytes, size_bytes, size_bytes, ((0, Pool::Large), stream)));
        }
        self.refused_rounding_bytes = 0;
        // With the driver's addresses, the trace's are not used.
        let base_hint = base_hint.filter(|_| self.addresses == AddressSource::Trace);
        let size = round_size(size_bytes, &self.conf);
        let pool = (self.owner_of(pool_id), get_pool(size));
        let alloc_size = get_allocation_size(size);
        // Search pool (get_free_block); the free-memory callbacks of PyTorch do nothing here.
        let mut block = self.get_free_block(pool, stream, size);
        if block.is_none() {
            // Can't reuse an existing block: garbage collection (only with a memory fraction), cudaMalloc,
            // then free oversize blocks and retry, then free every whole cached segment and retry.
            if self.gc_enabled() {
                self.garbage_collect_cached_blocks();
            }
            block = self.alloc_block(pool, stream, size, alloc_size, false, base_hint);
            if block.is_none() && self.release_available_cached_blocks(pool, stream, size) {
                block = self.alloc_block(pool, stream, size, alloc_size, false, base_hint);
            }
            if block.is_none() && pool.0 == 0 {
                self.release_cached_blocks();
                block = self.alloc_block(pool, stream, size, alloc_size, true, base_hint);
            }
        }
        let Some(id) = block else {
            self.stats.num_ooms += 1;
            return Err(self.oom_report(
                size_bytes,
                alloc_size,
                size.saturating_add(self.refused_rounding_bytes),
                (pool, stream),
            ));
        };
        let split = self.should_split(id, size);
        let id = self.alloc_found_block(id, size, size_bytes, split);
        let addr = self.node(id).addr;
        self.active.insert(addr, id);
        Ok(addr)
    }

    /// The report of a refused request to `pool` (its memory pool and size) on `stream`: the cached blocks it could use
    /// are that pool's on that stream (`get_free_block` looks nowhere else).
    fn oom_report(
        &self,
        request_bytes: u64,
        alloc_bytes: u64,
        needed_bytes: u64,
        (pool, stream): ((usize, Pool), u64),
    ) -> OomReport {
        let reserved = u64::try_from(self.stats.reserved_bytes.all().current).unwrap_or(0);
        let allocated = u64::try_from(self.stats.allocated_bytes.all().current).unwrap_or(0);
        let usable = self.pool(pool).blocks.range((stream, 0, 0, 0)..=(stream, u64::MAX, u64::MAX, BlockId::MAX));
        let (usable_free, largest) =
            usable.fold((0u64, 0), |(sum, largest), &(_, size, _, _)| (sum.saturating_add(size), largest.max(size)));
        OomReport {
            request_bytes,
            reserved_bytes: reserved,
            allocated_bytes: allocated,
            free_in_reserved_bytes: reserved.saturating_sub(allocated),
            usable_free_bytes: usable_free,
            largest_free_block_bytes: largest,
            num_alloc_retries: self.stats.num_alloc_retries,
            alloc_bytes,
            needed_bytes,
        }
    }

    /// `get_free_block`: best fit in (stream, size, address) order; expandable tails count with the room
    /// they can grow into; oversize blocks only serve oversize requests within `max_non_split_rounding`.
    fn get_free_block(&mut self, pool: (usize, Pool), stream: u64, size: u64) -> Option<BlockId> {
        if self.gc_enabled() {
            self.pool_mut(pool).get_free_blocks_call_count += 1;
        }
        let mut iter = self.pool(pool).blocks.range((stream, size, 0, 0)..);
        let &(s, _, _, mut id) = iter.next()?;
        if s != stream {
            return None;
        }
        if self.node(id).expandable.is_some() {
            if self.conf.expandable_segments {
                for &(s2, _, _, next) in iter {
                    if s2 != stream
                        || self.node(id).expandable.is_none()
                        || self.expandable_size(next) >= self.expandable_size(id)
                    {
                        break;
                    }
                    id = next;
                }
            } else {
                // Expandable segments were turned off: only non-expandable blocks qualify.
                match iter.find(|&&(s2, _, _, b)| s2 != stream || self.node(b).expandable.is_none()) {
                    Some(&(s2, _, _, b)) if s2 == stream => id = b,
                    _ => return None,
                }
            }
        }
        let block_size = self.node(id).size;
        let max_split = self.max_split_size();
        // Do not return an oversized block for a large request.
        if size < max_split && block_size >= max_split {
            return None;
        }
        // Allow an oversized block to be rounded up, within a limit.
        if size >= max_split && block_size >= size.saturating_add(self.conf.max_non_split_rounding) {
            return None;
        }
        self.remove_free(id);
        Some(id)
    }

    /// `alloc_block`: a new segment from cudaMalloc (or pages mapped into an expandable segment).
    fn alloc_block(
        &mut self,
        pool: (usize, Pool),
        stream: u64,
        size: u64,
        alloc_size: u64,
        is_retry: bool,
        base_hint: Option<u64>,
    ) -> Option<BlockId> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if self.set_fraction()
            && let Some(cap) = self.capacity_bytes
            && self.total_allocated_memory.saturating_add(alloc_size) > cap
        {
            self.refused_rounding_bytes = alloc_size.saturating_sub(size);
            return None;
        }
        if self.conf.expandable_segments && !(self.private_pools_whole && pool.0 != 0) {
            return self.try_allocate_expandable_block(pool, stream, size, base_hint);
        }
        if self.total_allocated_memory.saturating_add(alloc_size) > self.device_limit() {
            self.refused_rounding_bytes = alloc_size.saturating_sub(size);
            return None;
        }
        let base = self.cuda_malloc_base(base_hint, alloc_size);
        if self.addresses == AddressSource::Trace
            && base_hint == Some(base)
            && let Some(foretold) = self.driver.foretold_base(alloc_size)
        {
            self.driver_rule.placed += 1;
            self.driver_rule.foretold += usize::from(foretold == base);
        }
        self.total_allocated_memory += alloc_size;
        let id = self.new_node(Node::free(base, alloc_size, stream, pool, true, None));
        self.insert_segment(base, alloc_size, pool.0);
        let small = pool.1 == Pool::Small;
        self.stats.segment.increase(small, 1);
        self.stats.reserved_bytes.increase(small, alloc_size);
        if alloc_size >= self.max_split_size() {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.events.push(DeviceEvent { action: Action::SegmentAlloc, addr: base, size_bytes: alloc_size });
        Some(id)
    }

    /// `should_split`: small pool (or expandable segments) when the remainder is at least 512 B; large
    /// pool when the request is below `max_split_size` and the remainder exceeds 1 MiB.
    fn should_split(&self, id: BlockId, size: u64) -> bool {
        let n = self.node(id);
        let remaining = n.size - size;
        if n.pool == Pool::Small || self.conf.expandable_segments {
            remaining >= MIN_BLOCK_BYTES
        } else {
            size < self.max_split_size() && remaining > SMALL_SIZE_BYTES
        }
    }

    /// `alloc_found_block`: splits off the front `size` bytes when asked, marks the block allocated and
    /// counts it.
    fn alloc_found_block(&mut self, id: BlockId, size: u64, requested: u64, split: bool) -> BlockId {
        let small = self.node(id).pool == Pool::Small;
        let already_split = self.is_split(id);
        let expandable = self.node(id).expandable.is_some();
        let block = if split {
            let remaining = id;
            let r = self.node(remaining).clone();
            let block = self.new_node(Node { size, requested: 0, prev: r.prev, next: Some(remaining), ..r });
            if let Some(p) = r.prev {
                self.node_mut(p).next = Some(block);
            }
            {
                let rn = self.node_mut(remaining);
                rn.prev = Some(block);
                rn.addr += size;
                rn.size -= size;
            }
            self.insert_free(remaining);
            let remaining_size = self.node(remaining).size;
            if already_split && !expandable {
                // An already-split inactive block is being shrunk by `size` bytes.
                self.stats.inactive_split_bytes.decrease(small, size);
            } else if !expandable {
                // A new split inactive block is created from a previously unsplit block.
                self.stats.inactive_split_bytes.increase(small, remaining_size);
                self.stats.inactive_split.increase(small, 1);
            }
            block
        } else {
            if already_split && !expandable {
                let s = self.node(id).size;
                self.stats.inactive_split_bytes.decrease(small, s);
                self.stats.inactive_split.decrease(small, 1);
            }
            id
        };
        let max_split = self.max_split_size();
        let n = self.node_mut(block);
        n.allocated = true;
        n.active = true;
        n.requested = requested;
        let size = n.size;
        let st = &mut self.stats;
        st.allocation.increase(small, 1);
        st.allocated_bytes.increase(small, size);
        st.active.increase(small, 1);
        st.active_bytes.increase(small, size);
        st.requested_bytes.increase(small, requested);
        if size >= max_split {
            st.oversize_allocations.increase(1);
        }
        block
    }

    fn is_split(&self, id: BlockId) -> bool {
        let n = self.node(id);
        n.prev.is_some() || n.next.is_some()
    }

    /// `free`: the caller released the block at `addr` and it returns to the pool at once (no stream uses).
    /// Returns false when no live block starts at `addr`.
    pub fn free(&mut self, addr: u64) -> bool {
        self.free_requested(addr) && self.free_completed(addr)
    }

    /// The first half of `free`: the block stops counting as allocated (`free_requested`).
    pub fn free_requested(&mut self, addr: u64) -> bool {
        let Some(&id) = self.active.get(&addr) else { return false };
        if !self.node(id).allocated {
            return true;
        }
        let max_split = self.max_split_size();
        let n = self.node_mut(id);
        n.allocated = false;
        let (small, size) = (n.pool == Pool::Small, n.size);
        self.stats.allocation.decrease(small, 1);
        self.stats.allocated_bytes.decrease(small, size);
        if size >= max_split {
            self.stats.oversize_allocations.decrease(1);
        }
        true
    }

    /// The second half: the block goes back to the pool (`free_block`, trace action `free_completed`).
    pub fn free_completed(&mut self, addr: u64) -> bool {
        if self.active.get(&addr).is_some_and(|&id| self.node(id).allocated) {
            self.free_requested(addr);
        }
        let Some(id) = self.active.remove(&addr) else { return false };
        self.free_block(id);
        true
    }

    /// `free_block`: merges with free neighbours (`try_merge_blocks`) and caches the block.
    fn free_block(&mut self, id: BlockId) {
        let (original_size, requested, small, expandable) = {
            let n = self.node_mut(id);
            n.active = false;
            (n.size, n.requested, n.pool == Pool::Small, n.expandable.is_some())
        };
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for candidate in [self.node(id).prev, self.node(id).next] {
            let subsumed = self.try_merge_blocks(id, candidate);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.insert_free(id);
        if self.is_split(id) {
            net_blocks += 1;
            net_bytes += self.node(id).size as i64;
        }
        if !expandable {
            adjust(&mut self.stats.inactive_split, small, net_blocks);
            adjust(&mut self.stats.inactive_split_bytes, small, net_bytes);
        }
        self.stats.active.decrease(small, 1);
        self.stats.active_bytes.decrease(small, original_size);
        self.stats.requested_bytes.decrease(small, requested);
    }

    /// `try_merge_blocks`: absorbs `src` into `dst` when `src` is free and equally mapped; returns the bytes
    /// absorbed.
    fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) -> u64 {
        let Some(src) = src else { return 0 };
        let (s, d) = (self.node(src), self.node(dst));
        if s.active || s.mapped != d.mapped {
            return 0;
        }
        if s.mapped {
            self.remove_free(src);
        } else {
            self.remove_unmapped(src);
        }
        let s = self.node(src).clone();
        if self.node(dst).prev == Some(src) {
            // [src dst]
            if let Some(p) = s.prev {
                self.node_mut(p).next = Some(dst);
            }
            let d = self.node_mut(dst);
            d.addr = s.addr;
            d.prev = s.prev;
        } else {
            // [dst src]
            if let Some(nx) = s.next {
                self.node_mut(nx).prev = Some(dst);
            }
            self.node_mut(dst).next = s.next;
        }
        self.node_mut(dst).size += s.size;
        self.delete_node(src);
        s.size
    }

    /// `emptyCache()` (`release_cached_blocks`): returns every wholly free segment (and, with expandable
    /// segments, every free page) to the driver.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
    }

    /// The segments and blocks now, as a snapshot's `segments` (sorted by address; an expandable segment
    /// shows one segment per mapped range, as `snapshot()` does).
    pub fn report(&self) -> Vec<Segment> {
        let mut out = Vec::new();
        for (id, node) in self.nodes.iter().enumerate() {
            let Some(head) = node else { continue };
            if head.prev.is_some() {
                continue;
            }
            let mut cur = Some(id);
            let mut seg: Option<Segment> = None;
            while let Some(c) = cur {
                let n = self.node(c);
                if n.mapped {
                    let s = seg.get_or_insert_with(|| Segment {
                        device: 0,
                        address: n.addr,
                        total_size: 0,
                        allocated_size: 0,
                        active_size: 0,
                        requested_size: 0,
                        stream: n.stream,
                        segment_type: n.pool,
                        segment_pool_id: self.pools[n.owner].id,
                        is_expandable: n.expandable.is_some(),
                        frames: StackId::NONE,
                        blocks: Vec::new(),
                    });
                    let state = match (n.allocated, n.active) {
                        (true, _) => BlockState::ActiveAllocated,
                        (false, true) => BlockState::ActivePendingFree,
                        _ => BlockState::Inactive,
                    };
                    s.total_size += n.size;
                    if n.allocated {
                        s.allocated_size += n.size;
                    }
                    if n.active {
                        s.active_size += n.size;
                        // A live block known from a free entry may record any requested size.
                        s.requested_size = s.requested_size.saturating_add(n.requested);
                    }
                    s.blocks.push(Block {
                        address: n.addr,
                        size: n.size,
                        requested_size: n.requested,
                        state,
                        frames: StackId::NONE,
                    });
                } else if let Some(s) = seg.take() {
                    out.push(s);
                }
                cur = n.next;
            }
            if let Some(s) = seg {
                out.push(s);
            }
        }
        out.sort_by_key(|s| s.address);
        out
    }
}

/// Applies a signed change to a counter (`increase_stat` / `decrease_stat`).
fn adjust(array: &mut super::memory_stats::StatArray, small: bool, delta: i64) {
    if delta > 0 {
        array.increase(small, delta.unsigned_abs());
    } else if delta < 0 {
        array.decrease(small, delta.unsigned_abs());
    }
}
