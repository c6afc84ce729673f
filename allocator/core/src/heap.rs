//! The heap: policies over blocks (segments) that a [`MemorySource`] hands out.
//!
//! A request is served from an existing block when one fits; otherwise a new block is reserved — of
//! `block_size_bytes`, or smaller while the heap is small (VMA's growth: an eighth, a quarter, a half, each larger
//! than every block held and holding the request twice), or halved down to what the request needs when the budget
//! or device has less room (VMA's fallback) — and requests at or above `dedicated_threshold_bytes` get a block of
//! their own, sized to them. Large requests too take room a shared block already has before any new memory: a block of their
//! own spares the rest of a new shared block, but reserving one while reserved memory could hold them costs
//! more than it saves (on the GPT-2 trace it left heapscope 0.5 % above gpu-allocator's peak, now 0.8 %
//! below). Blocks that become empty are released by the [`ReleaseRule`] (keeping one keeps a shared block: a
//! dedicated one goes back at once, as VMA frees a dedicated allocation). When neither a block nor the
//! source can serve a request, cached empty blocks are released and the reservation retried (PyTorch's
//! `release_cached_blocks`); after that the request fails with an [`OomVerdict`] that says whether the
//! memory was exhausted or fragmented.
//!
//! Offsets are aligned relative to their block; blocks are aligned to the source's
//! `block_alignment_bytes`.

use std::collections::HashMap;

use crate::device_event::{DeviceEvent, DeviceLog};
use crate::oom::{OomCause, OomVerdict};
use crate::request::align_up;
use crate::source::{MemorySource, SourceBlock, SourceError};
use crate::{Allocation, AllocationId, Error, OwnerId, Policy, PolicyConfig, PolicyKind, PolicyReport, Request, Result, Totals};

mod compact;
pub use compact::{HeapCompaction, HeapMove, Movable};

/// When empty blocks go back to the source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ReleaseRule {
    /// As soon as they are empty.
    Immediately,
    /// Keep one empty block cached (gpu-allocator keeps its last block); release the others.
    #[default]
    KeepOne,
    /// Cache every empty block; release them only when a reservation fails (PyTorch's caching allocator).
    OnPressure,
    /// Never.
    Never,
}

impl ReleaseRule {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Immediately => "immediately",
            Self::KeepOne => "keep-one",
            Self::OnPressure => "on-pressure",
            Self::Never => "never",
        }
    }
}

impl std::fmt::Display for ReleaseRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ReleaseRule {
    type Err = crate::UnknownName;

    fn from_str(text: &str) -> Result<Self, crate::UnknownName> {
        [Self::Immediately, Self::KeepOne, Self::OnPressure, Self::Never].into_iter().find(|rule| rule.name() == text).ok_or_else(
            || crate::UnknownName {
                what: "release rule",
                name: text.to_owned(),
                expected: "immediately, keep-one, on-pressure or never".to_owned(),
            },
        )
    }
}

/// How a heap reserves and releases blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HeapConfig {
    /// The policy inside each block.
    pub policy: PolicyKind,
    /// Its settings.
    pub policy_config: PolicyConfig,
    /// Preferred size of a shared block (VMA and gpu-allocator use 256 MiB).
    pub block_size_bytes: u64,
    /// Requests of at least this many bytes that no reserved block has room for get a block of their own,
    /// sized to them (instead of a new shared block).
    pub dedicated_threshold_bytes: u64,
    /// When empty blocks are released.
    pub release: ReleaseRule,
    /// A budget: at most this many bytes reserved at once.
    pub capacity_bytes: Option<u64>,
    /// Whether new shared blocks start smaller while the heap is small (VMA's growth: an eighth, a quarter, a half of
    /// `block_size_bytes`); off, every shared block has the preferred size (one block spanning a device stays one).
    pub grow_blocks: bool,
}

impl HeapConfig {
    /// The default rules (256 MiB blocks, dedicated blocks from 128 MiB, keep one empty block, no budget)
    /// with `policy` inside the blocks.
    pub fn new(policy: PolicyKind) -> Self {
        Self {
            policy,
            policy_config: PolicyConfig::default(),
            block_size_bytes: 256 << 20,
            dedicated_threshold_bytes: 128 << 20,
            release: ReleaseRule::default(),
            capacity_bytes: None,
            grow_blocks: true,
        }
    }

    /// The same rules with everything in one block of `size_bytes` (a whole device as one range, an arena): no
    /// dedicated blocks, no growth, the block never released.
    #[must_use]
    pub fn one_range(self, size_bytes: u64) -> Self {
        Self {
            block_size_bytes: size_bytes,
            dedicated_threshold_bytes: u64::MAX,
            release: ReleaseRule::Never,
            grow_blocks: false,
            ..self
        }
    }
}

/// A live allocation of a heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeapAllocation {
    owner: OwnerId,
    block: u32,
    allocation: Allocation,
    address: u64,
}

impl HeapAllocation {
    /// Index of the block holding it.
    pub fn block(&self) -> u32 {
        self.block
    }

    /// The allocation inside the block.
    pub fn allocation(&self) -> &Allocation {
        &self.allocation
    }

    /// Offset inside the block.
    pub fn offset(&self) -> u64 {
        self.allocation.offset()
    }

    /// Block base address plus offset.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Bytes requested.
    pub fn size_bytes(&self) -> u64 {
        self.allocation.size_bytes()
    }
}

/// Counters of a heap's life.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HeapStats {
    /// Bytes reserved now.
    pub reserved_bytes: u64,
    /// The most bytes reserved at once.
    pub peak_reserved_bytes: u64,
    /// Bytes requested by live allocations now.
    pub live_bytes: u64,
    /// The most live bytes at once.
    pub peak_live_bytes: u64,
    /// Blocks reserved from the source so far (PyTorch's `num_device_alloc`).
    pub blocks_reserved: u64,
    /// Blocks released so far (`num_device_free`).
    pub blocks_released: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Requests that failed with out of memory.
    pub ooms: u64,
}

/// One block in a heap report.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BlockReport {
    /// The block's index (stable while it lives).
    pub index: u32,
    /// Its base address.
    pub base_address: u64,
    /// Its size.
    pub size_bytes: u64,
    /// Whether it was reserved for one large request.
    pub dedicated: bool,
    /// Its layout, with labels.
    pub layout: PolicyReport,
}

/// A heap's layout and totals.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HeapReport {
    /// The policy inside the blocks.
    pub policy: &'static str,
    /// The memory source.
    pub source: String,
    /// The budget, if any.
    pub capacity_bytes: Option<u64>,
    /// Blocks by address.
    pub blocks: Vec<BlockReport>,
    /// Totals over all blocks (`reserved_bytes` = the sum of block sizes).
    pub totals: Totals,
    /// Counters.
    pub stats: HeapStats,
}

#[derive(Debug)]
struct Block {
    source: SourceBlock,
    policy: Box<dyn Policy>,
    dedicated: bool,
    /// The policy's live allocations and `largest_free_bound_bytes`, cached after every change so the
    /// search for a block reads this vector only, not each policy behind its box.
    live: usize,
    free_bound_bytes: u64,
}

impl Block {
    /// Refreshes the cached counters after an allocation or a free.
    fn refresh(&mut self) {
        self.live = self.policy.live_allocations();
        self.free_bound_bytes = self.policy.largest_free_bound_bytes();
    }
}

/// How many times a new shared block may be halved below the preferred size while the heap holds no block as large
/// (VMA's `NEW_BLOCK_SIZE_SHIFT_MAX`).
const NEW_BLOCK_HALVINGS: usize = 3;

/// Blocks per entry of `Heap::room_max`.
const ROOM_GROUP: usize = 16;

/// The first index at or after `from` whose room (`rooms`) is at least `size_bytes`: the rest of `from`'s group, then
/// the first group whose largest room (`room_max`) is enough, then the block within it.
fn first_with_room(rooms: &[u64], room_max: &[u64], from: usize, size_bytes: u64) -> Option<usize> {
    let group = from / ROOM_GROUP;
    let group_end = ((group + 1) * ROOM_GROUP).min(rooms.len());
    if let Some(within) = rooms.get(from..group_end.max(from))?.iter().position(|&room| room >= size_bytes) {
        return Some(from + within);
    }
    let later = group + 1 + room_max.get(group + 1..)?.iter().position(|&max| max >= size_bytes)?;
    let start = later * ROOM_GROUP;
    let end = (start + ROOM_GROUP).min(rooms.len());
    rooms.get(start..end)?.iter().position(|&room| room >= size_bytes).map(|within| start + within)
}

/// Whether a block slot holds a block with no live allocation.
fn is_empty(block: &Option<Block>) -> bool {
    block.as_ref().is_some_and(|block| block.live == 0)
}

/// Policies over blocks from a memory source. See the module documentation.
#[derive(Debug)]
pub struct Heap<S: MemorySource> {
    owner: OwnerId,
    config: HeapConfig,
    source: S,
    blocks: Vec<Option<Block>>,
    /// Beside `blocks`, what the search for a block reads first: a block's `free_bound_bytes` when it may take
    /// a new allocation (shared, or empty), else 0. A dense scan of these words skips the blocks that cannot
    /// serve a request without touching the blocks themselves (a replay of a long recording holds hundreds).
    room: Vec<u64>,
    /// The largest `room` of each group of [`ROOM_GROUP`] blocks, so the search skips sixteen full blocks at a time.
    room_max: Vec<u64>,
    vacant: Vec<u32>,
    labels: HashMap<(u32, AllocationId), String>,
    stats: HeapStats,
    device_log: DeviceLog,
}

impl<S: MemorySource> Heap<S> {
    /// A heap drawing blocks from `source`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for invalid settings.
    pub fn new(config: HeapConfig, source: S) -> Result<Self> {
        config.policy_config.validate()?;
        if config.block_size_bytes == 0 {
            return Err(Error::InvalidConfig { what: "block_size_bytes must be positive".into() });
        }
        if !source.block_alignment_bytes().is_power_of_two() {
            return Err(Error::InvalidConfig {
                what: format!(
                    "source {} has block alignment {}, not a power of two",
                    source.name(),
                    source.block_alignment_bytes()
                ),
            });
        }
        Ok(Self {
            owner: OwnerId::fresh(),
            config,
            source,
            blocks: Vec::new(),
            room: Vec::new(),
            room_max: Vec::new(),
            vacant: Vec::new(),
            labels: HashMap::new(),
            stats: HeapStats::default(),
            device_log: DeviceLog::default(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &HeapConfig {
        &self.config
    }

    /// The memory source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Counters.
    pub fn stats(&self) -> &HeapStats {
        &self.stats
    }

    /// Switches the log of blocks reserved and released on (emptied) or off.
    pub fn record_device_events(&mut self, on: bool) {
        self.device_log.set_recording(on);
    }

    /// The blocks reserved and released since the last call, while recording is on.
    pub fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        self.device_log.take()
    }

    /// Counts a request refused before it reached the heap (a size no device holds) among the
    /// out-of-memory errors.
    pub fn count_refused(&mut self) {
        self.stats.ooms += 1;
    }

    /// Live allocations.
    pub fn live_allocations(&self) -> usize {
        self.blocks.iter().flatten().map(|block| block.policy.live_allocations()).sum()
    }

    /// Serves `request`, remembering `label` for reports.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] with the verdict, or [`Error::Source`] when the source fails otherwise.
    pub fn allocate(&mut self, request: Request, label: Option<&str>) -> Result<HeapAllocation> {
        let dedicated = request.size_bytes() >= self.config.dedicated_threshold_bytes;
        if let Some(allocation) = self.allocate_in_blocks(request, dedicated) {
            return Ok(self.served(allocation, request, label));
        }
        for attempt in 0..2 {
            if attempt == 1 && (self.config.release == ReleaseRule::Never || self.release_empty_blocks() == 0) {
                break;
            }
            if let Some(index) = self.reserve_block(request, dedicated)? {
                let block = self.blocks[index as usize].as_mut().expect("just reserved");
                if let Some(allocation) = block.policy.allocate(request) {
                    block.refresh();
                    self.sync_room(index);
                    let allocation = self.heap_allocation(index, allocation);
                    return Ok(self.served(allocation, request, label));
                }
            }
        }
        self.stats.ooms += 1;
        Err(Error::OutOfMemory(Box::new(self.verdict(request))))
    }

    /// Frees an allocation made by this heap.
    ///
    /// # Errors
    /// [`Error::DoubleFree`] or [`Error::ForeignAllocation`]; nothing changes then.
    pub fn free(&mut self, allocation: HeapAllocation) -> Result<()> {
        if allocation.owner != self.owner {
            return Err(Error::ForeignAllocation { offset: allocation.offset(), owner: "heap" });
        }
        let stale = || Error::DoubleFree { offset: allocation.offset(), id: allocation.allocation.id().0, owner: "heap" };
        let block = self.blocks.get_mut(allocation.block as usize).and_then(Option::as_mut).ok_or_else(stale)?;
        block.policy.free(allocation.allocation).map_err(|error| match error {
            // The handle's block was released and its slot reused by a new block.
            Error::ForeignAllocation { .. } => stale(),
            other => other,
        })?;
        block.refresh();
        let now_empty = block.live == 0;
        self.sync_room(allocation.block);
        if !self.labels.is_empty() {
            self.labels.remove(&(allocation.block, allocation.allocation.id()));
        }
        self.stats.live_bytes -= allocation.size_bytes();
        if now_empty {
            self.block_emptied(allocation.block);
        }
        Ok(())
    }

    /// Block `index` just became empty: released if the release rule says so. Keeping one empty block keeps a shared
    /// one: a block reserved for one large request goes back at once (as VMA and gpu-allocator free a dedicated
    /// allocation's memory), since the next request rarely has its size.
    fn block_emptied(&mut self, index: u32) {
        let dedicated = self.blocks[index as usize].as_ref().is_some_and(|block| block.dedicated);
        let release = match self.config.release {
            ReleaseRule::Immediately => true,
            ReleaseRule::KeepOne => {
                dedicated || self.blocks.iter().enumerate().any(|(other, block)| other != index as usize && is_empty(block))
            }
            ReleaseRule::OnPressure | ReleaseRule::Never => false,
        };
        if release {
            self.release_block(index);
        }
    }

    /// Releases every empty block; returns how many.
    pub fn release_empty_blocks(&mut self) -> usize {
        let empty: Vec<u32> = (0..).zip(&self.blocks).filter(|(_, block)| is_empty(block)).map(|(index, _)| index).collect();
        for &index in &empty {
            self.release_block(index);
        }
        empty.len()
    }

    /// The layout of every block, with labels, and the totals.
    pub fn report(&self) -> HeapReport {
        let mut blocks: Vec<BlockReport> = (0..)
            .zip(&self.blocks)
            .filter_map(|(index, block)| {
                let block = block.as_ref()?;
                let mut layout = block.policy.report();
                for range in &mut layout.ranges {
                    range.label = range.allocation.and_then(|id| self.labels.get(&(index, id)).cloned());
                }
                Some(BlockReport {
                    index,
                    base_address: block.source.base_address,
                    size_bytes: block.source.size_bytes,
                    dedicated: block.dedicated,
                    layout,
                })
            })
            .collect();
        blocks.sort_by_key(|block| block.base_address);
        let mut totals = Totals::default();
        for block in &blocks {
            totals.merge(&Totals::from_ranges(block.size_bytes, &block.layout.ranges));
        }
        HeapReport {
            policy: self.config.policy.name(),
            source: self.source.name().to_owned(),
            capacity_bytes: self.config.capacity_bytes,
            blocks,
            totals,
            stats: self.stats.clone(),
        }
    }

    /// Serves `request` from a reserved block: an empty one, or a shared one with room (never a dedicated block
    /// holding its allocation). An empty block taken becomes `dedicated` (a request at the dedicated threshold)
    /// or shared.
    fn allocate_in_blocks(&mut self, request: Request, dedicated: bool) -> Option<HeapAllocation> {
        let size_bytes = request.size_bytes();
        let mut index = 0;
        let allocation = loop {
            // Blocks whose room is short are skipped from `room` alone: exactly those the test below refuses.
            index = first_with_room(&self.room, &self.room_max, index, size_bytes)?;
            if let Some(block) = self.blocks[index].as_mut() {
                let empty = block.live == 0;
                if block.free_bound_bytes >= size_bytes
                    && (empty || !block.dedicated)
                    && let Some(allocation) = block.policy.allocate(request)
                {
                    block.refresh();
                    if empty {
                        block.dedicated = dedicated;
                    }
                    break allocation;
                }
            }
            index += 1;
        };
        let index = u32::try_from(index).expect("fewer than 2^32 blocks");
        self.sync_room(index);
        Some(self.heap_allocation(index, allocation))
    }

    /// Updates `room` for block `index` after a change to it.
    fn sync_room(&mut self, index: u32) {
        let room = match &self.blocks[index as usize] {
            Some(block) if block.live == 0 || !block.dedicated => block.free_bound_bytes,
            _ => 0,
        };
        self.set_room(index as usize, room);
    }

    /// Sets block `index`'s room and its group's largest.
    fn set_room(&mut self, index: usize, room: u64) {
        let old = std::mem::replace(&mut self.room[index], room);
        let group = index / ROOM_GROUP;
        if room >= self.room_max[group] {
            self.room_max[group] = room;
        } else if old == self.room_max[group] {
            // The group's largest may have shrunk: look again.
            let end = ((group + 1) * ROOM_GROUP).min(self.room.len());
            self.room_max[group] = self.room[group * ROOM_GROUP..end].iter().copied().max().unwrap_or(0);
        }
    }

    fn heap_allocation(&self, block: u32, allocation: Allocation) -> HeapAllocation {
        let base = self.blocks[block as usize].as_ref().expect("live block").source.base_address;
        HeapAllocation { owner: self.owner, block, allocation, address: base + allocation.offset() }
    }

    fn served(&mut self, allocation: HeapAllocation, request: Request, label: Option<&str>) -> HeapAllocation {
        if let Some(label) = label {
            self.labels.insert((allocation.block, allocation.allocation.id()), label.to_owned());
        }
        self.stats.allocations += 1;
        self.stats.live_bytes += request.size_bytes();
        self.stats.peak_live_bytes = self.stats.peak_live_bytes.max(self.stats.live_bytes);
        allocation
    }

    /// Reserves a block for `request`; `Ok(None)` when the budget or the device has no room.
    fn reserve_block(&mut self, request: Request, dedicated: bool) -> Result<Option<u32>> {
        // Blocks are whole multiples of the source's unit and of the policy's, so no byte is unaccounted for.
        let alignment = self.source.block_alignment_bytes().max(self.config.policy_config.min_align_bytes);
        let Some(needed) =
            self.config.policy.dedicated_bytes(request, &self.config.policy_config).and_then(|bytes| align_up(bytes, alignment))
        else {
            return Ok(None);
        };
        let headroom = self.config.capacity_bytes.map_or(u64::MAX, |cap| cap.saturating_sub(self.stats.reserved_bytes));
        let mut size = if dedicated { needed } else { self.config.block_size_bytes.max(needed) };
        if !dedicated && self.config.grow_blocks {
            // VMA's growth: while the heap holds no block as large, a new one starts smaller (down to an eighth), as
            // long as it holds the request twice over; a small workload then never reserves a whole block. Unlike VMA
            // a dedicated block counts: a heap already that large gains nothing by starting small.
            let largest = self.blocks.iter().flatten().map(|block| block.source.size_bytes).max().unwrap_or(0);
            for _ in 0..NEW_BLOCK_HALVINGS {
                let smaller = size / 2;
                if smaller > largest && smaller >= needed.saturating_mul(2) {
                    size = smaller;
                } else {
                    break;
                }
            }
        }
        loop {
            // A size that overflows once aligned is too large for any source: halve it.
            let candidate = align_up(size, alignment).map_or(u64::MAX, |aligned| aligned.max(needed));
            if candidate <= headroom && candidate != u64::MAX {
                match self.source.allocate_block(candidate) {
                    Ok(source_block) => return self.add_block(source_block, dedicated).map(Some),
                    Err(SourceError::OutOfMemory { .. }) => {}
                    Err(SourceError::Failed(message)) => return Err(Error::Source(message)),
                }
            }
            if candidate <= needed {
                return Ok(None);
            }
            size = (size / 2).max(needed);
        }
    }

    fn add_block(&mut self, source_block: SourceBlock, dedicated: bool) -> Result<u32> {
        if source_block.base_address.checked_add(source_block.size_bytes).is_none() {
            let source = self.source.name().to_owned();
            self.source.free_block(source_block);
            return Err(Error::Source(format!("source {source} handed out a block that ends past the 64-bit address space")));
        }
        let policy = match self.config.policy.build(source_block.size_bytes, &self.config.policy_config) {
            Ok(policy) => policy,
            Err(error) => {
                self.source.free_block(source_block);
                return Err(error);
            }
        };
        let mut block = Block { source: source_block, policy, dedicated, live: 0, free_bound_bytes: 0 };
        block.refresh();
        let index = match self.vacant.pop() {
            Some(index) => {
                self.blocks[index as usize] = Some(block);
                index
            }
            None => {
                self.blocks.push(Some(block));
                self.room.push(0);
                self.room_max.resize(self.room.len().div_ceil(ROOM_GROUP), 0);
                u32::try_from(self.blocks.len() - 1).expect("fewer than 2^32 blocks")
            }
        };
        self.sync_room(index);
        self.stats.blocks_reserved += 1;
        self.stats.reserved_bytes += source_block.size_bytes;
        self.device_log
            .push(|| DeviceEvent::Reserved { address: source_block.base_address, size_bytes: source_block.size_bytes });
        self.stats.peak_reserved_bytes = self.stats.peak_reserved_bytes.max(self.stats.reserved_bytes);
        Ok(index)
    }

    fn release_block(&mut self, index: u32) {
        if let Some(block) = self.blocks[index as usize].take() {
            self.set_room(index as usize, 0);
            self.stats.reserved_bytes -= block.source.size_bytes;
            self.stats.blocks_released += 1;
            self.device_log
                .push(|| DeviceEvent::Released { address: block.source.base_address, size_bytes: block.source.size_bytes });
            self.source.free_block(block.source);
            self.vacant.push(index);
        }
    }

    /// Why `request` failed. Free runs count only in blocks the request could use: a dedicated block that holds
    /// its allocation serves nobody else. Built from each block's [`Policy::free_space`], not from a report: a
    /// replay at its capacity refuses thousands of requests, and a report costs the live allocations each time.
    fn verdict(&self, request: Request) -> OomVerdict {
        let (mut usable_free_bytes, mut largest_free_run_bytes) = (0u64, 0u64);
        let (mut rounded_bytes, mut retired_bytes) = (0u64, 0u64);
        for block in self.blocks.iter().flatten() {
            let space = block.policy.free_space();
            rounded_bytes += block.policy.capacity_bytes() - space.free_bytes - space.retired_bytes;
            retired_bytes += space.retired_bytes;
            if !block.dedicated || block.live == 0 {
                usable_free_bytes += space.free_bytes;
                largest_free_run_bytes = largest_free_run_bytes.max(space.largest_free_run_bytes);
            }
        }
        let needed_bytes = self.config.policy.dedicated_bytes(request, &self.config.policy_config).unwrap_or(u64::MAX);
        let budget_left = self.config.capacity_bytes.map(|cap| cap.saturating_sub(self.stats.reserved_bytes));
        // Memory comes from the source in whole blocks of its granularity: a budget of 1 MiB beside a device of 2 MiB
        // blocks has nothing reservable (it is no fragmentation that a 64 KiB request fails there).
        let granule = self.source.block_alignment_bytes().max(1);
        let unreserved_bytes = match (budget_left, self.source.available_bytes()) {
            (Some(budget), Some(device)) => budget.min(device),
            (Some(left), None) | (None, Some(left)) => left,
            (None, None) => 0,
        } / granule
            * granule;
        OomVerdict {
            policy: self.config.policy.name(),
            requested_bytes: request.size_bytes(),
            needed_bytes,
            align_bytes: request.align_bytes(),
            reserved_bytes: self.stats.reserved_bytes,
            live_bytes: self.stats.live_bytes,
            padding_bytes: rounded_bytes.saturating_sub(self.stats.live_bytes),
            free_in_blocks_bytes: usable_free_bytes,
            largest_free_run_bytes,
            retired_bytes,
            unreserved_bytes,
            capacity_bytes: self.config.capacity_bytes,
            virtual_range_bytes: None,
            new_block_bytes: None,
            cause: OomCause::Exhaustion,
        }
        .judged()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimulatedSource;
    use crate::units::MIB;

    #[test]
    fn first_with_room_finds_the_first_fit() {
        // Rooms of 0 to 9 in a pseudo-random order, over several groups and a last short one: every start and size
        // against a plain scan.
        let rooms: Vec<u64> = (0..(3 * ROOM_GROUP + 5) as u64).map(|index| index * 7919 % 10).collect();
        let room_max: Vec<u64> = rooms.chunks(ROOM_GROUP).map(|group| group.iter().copied().max().unwrap_or(0)).collect();
        for from in 0..=rooms.len() + 1 {
            for size in 0..=10 {
                let scanned = rooms.get(from..).and_then(|rest| rest.iter().position(|&room| room >= size)).map(|at| from + at);
                assert_eq!(first_with_room(&rooms, &room_max, from, size), scanned, "from {from}, size {size}");
            }
        }
        assert_eq!(first_with_room(&[], &[], 0, 1), None);
    }

    fn heap(policy: PolicyKind, release: ReleaseRule, device_bytes: u64) -> Heap<SimulatedSource> {
        let config = HeapConfig { release, ..HeapConfig::new(policy) };
        Heap::new(config, SimulatedSource::new(device_bytes, 2 * MIB)).unwrap()
    }

    fn mib(size: u64) -> Request {
        Request::new(size * MIB, 256).unwrap()
    }

    #[test]
    fn shared_and_dedicated_blocks() {
        let mut heap = heap(PolicyKind::Tlsf, ReleaseRule::Immediately, 4096 * MIB);
        let small: Vec<_> = (0..3).map(|_| heap.allocate(mib(100), Some("activation")).unwrap()).collect();
        assert_eq!(small.iter().map(HeapAllocation::block).collect::<Vec<_>>(), [0, 0, 1], "two 100 MiB fit a 256 MiB block");
        // A large request takes room a shared block already has (156 MiB in block 1) ...
        let shared = heap.allocate(mib(150), None).unwrap();
        assert_eq!(shared.block(), 1);
        // ... and gets a block of its own, sized to it, only when it needs new memory.
        let big = heap.allocate(mib(150), None).unwrap();
        assert_eq!(big.block(), 2);
        let report = heap.report();
        assert_eq!(
            report.blocks.iter().map(|b| (b.size_bytes / MIB, b.dedicated)).collect::<Vec<_>>(),
            [(256, false), (256, false), (150, true)]
        );
        assert_eq!(report.totals.live_bytes, 600 * MIB);
        assert_eq!(report.blocks[0].layout.ranges[0].label.as_deref(), Some("activation"));
        // A dedicated block holding its allocation serves nobody else.
        assert_eq!(heap.allocate(mib(1), None).unwrap().block(), 0);
        heap.free(big).unwrap();
        assert_eq!(heap.stats().reserved_bytes, 512 * MIB, "the dedicated block went back at once");
        assert!(matches!(heap.free(big), Err(Error::DoubleFree { .. })));
    }

    #[test]
    fn release_rules_table() {
        // Two dedicated 150 MiB blocks, then three 100 MiB allocations in two shared 256 MiB blocks, all freed: reserved
        // bytes left per rule. Keeping one empty block keeps a shared one; dedicated blocks go back at once.
        let cases = [
            (ReleaseRule::Immediately, 0, 0),
            (ReleaseRule::KeepOne, 0, 256),
            // Cached, the two 150 MiB blocks take two of the 100 MiB allocations; the third needs a shared block.
            (ReleaseRule::OnPressure, 300, 300 + 256),
            (ReleaseRule::Never, 300, 300 + 256),
        ];
        for (rule, after_dedicated_mib, after_shared_mib) in cases {
            let mut heap = heap(PolicyKind::BestFit, rule, 4096 * MIB);
            let a = heap.allocate(mib(150), None).unwrap();
            let b = heap.allocate(mib(150), None).unwrap();
            heap.free(a).unwrap();
            heap.free(b).unwrap();
            assert_eq!(heap.stats().reserved_bytes, after_dedicated_mib * MIB, "{rule:?}: dedicated");
            let shared: Vec<_> = (0..3).map(|_| heap.allocate(mib(100), None).unwrap()).collect();
            for allocation in shared {
                heap.free(allocation).unwrap();
            }
            assert_eq!(heap.stats().reserved_bytes, after_shared_mib * MIB, "{rule:?}: shared");
        }
    }

    #[test]
    fn fragmentation_verdict_then_release_on_pressure() {
        // The frag_oom story: 20 x 150 MiB freed (cached), 20 x 100 MiB reuse the cached blocks, 1 GiB fails.
        let mut heap = heap(PolicyKind::BestFit, ReleaseRule::OnPressure, 3584 * MIB);
        let big: Vec<_> = (0..20).map(|_| heap.allocate(mib(150), None).unwrap()).collect();
        for allocation in big {
            heap.free(allocation).unwrap();
        }
        for _ in 0..20 {
            heap.allocate(mib(100), None).unwrap();
        }
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(mib(1024), None) else {
            panic!("1 GiB must fail");
        };
        assert_eq!(verdict.cause, OomCause::Fragmentation);
        assert_eq!((verdict.reserved_bytes, verdict.live_bytes), (3000 * MIB, 2000 * MIB));
        assert_eq!((verdict.free_in_blocks_bytes, verdict.largest_free_run_bytes), (1000 * MIB, 50 * MIB));
        assert_eq!(verdict.unreserved_bytes, 584 * MIB);
        assert!(verdict.to_string().contains("Fragmentation"), "{verdict}");
        assert_eq!(heap.stats().ooms, 1);
    }

    #[test]
    fn exhaustion_verdict_and_budget_cap() {
        let config = HeapConfig {
            capacity_bytes: Some(512 * MIB),
            dedicated_threshold_bytes: 1 << 30,
            ..HeapConfig::new(PolicyKind::Tlsf)
        };
        let mut heap = Heap::new(config, SimulatedSource::new(4096 * MIB, 2 * MIB)).unwrap();
        heap.allocate(mib(200), None).unwrap();
        heap.allocate(mib(200), None).unwrap();
        // 512 MiB budget: blocks of 256 MiB hold one 200 MiB each; the halving fallback cannot go below 200.
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(mib(200), None) else {
            panic!("the budget must stop the third block");
        };
        assert_eq!(verdict.cause, OomCause::Exhaustion);
        assert_eq!(verdict.capacity_bytes, Some(512 * MIB));
        assert_eq!(heap.stats().reserved_bytes, 512 * MIB);
        // A smaller request fits the room left in the blocks.
        assert!(heap.allocate(mib(50), None).is_ok());
    }

    /// VMA's growth: a heap of small requests starts with a block of an eighth of the preferred size, each new block
    /// larger than every block held, a request fitting twice in it; a heap holding a block that large starts whole.
    #[test]
    fn new_blocks_grow_from_an_eighth() {
        let sizes = |requests: &[u64]| {
            let mut heap = heap(PolicyKind::Tlsf, ReleaseRule::KeepOne, 4096 * MIB);
            for &request in requests {
                heap.allocate(mib(request), None).unwrap();
            }
            heap.report().blocks.iter().map(|block| block.size_bytes / MIB).collect::<Vec<_>>()
        };
        let cases: &[(&str, &[u64], &[u64])] = &[
            ("small requests start at an eighth, blocks grow past the largest", &[10, 20, 40, 100], &[32, 128, 256]),
            ("a request that would not fit twice takes a larger block", &[20, 50], &[64, 128]),
            ("after a dedicated block of 150 MiB, shared blocks start whole", &[150, 10], &[150, 256]),
        ];
        for (what, requests, expected) in cases {
            let mut got = sizes(requests);
            let mut expected = expected.to_vec();
            got.sort_unstable();
            expected.sort_unstable();
            assert_eq!(got, expected, "{what}");
        }
    }

    #[test]
    fn halving_fallback_near_the_budget() {
        let config = HeapConfig { capacity_bytes: Some(384 * MIB), ..HeapConfig::new(PolicyKind::Tlsf) };
        let mut heap = Heap::new(config, SimulatedSource::new(4096 * MIB, 2 * MIB)).unwrap();
        heap.allocate(mib(200), None).unwrap();
        let second = heap.allocate(mib(100), None).unwrap();
        assert_eq!(second.block(), 1, "256 MiB block 0 has 56 MiB left");
        assert_eq!(heap.report().blocks[1].size_bytes, 128 * MIB, "256 MiB does not fit the 128 MiB left, 128 does");
    }

    /// The verdict reads each block's `free_space` instead of a report: its numbers are the report's, for every policy
    /// (linear retires bytes), with dedicated blocks left out of the usable free space.
    #[test]
    fn the_verdict_counts_what_the_report_counts() {
        for policy in PolicyKind::ALL {
            let config =
                HeapConfig { capacity_bytes: Some(1024 * MIB), dedicated_threshold_bytes: 300 * MIB, ..HeapConfig::new(policy) };
            let mut heap = Heap::new(config, SimulatedSource::new(4096 * MIB, 2 * MIB)).unwrap();
            // Its block, in whole 2 MiB, holds 1 MiB less 4 KiB free that no other request may use (TLSF; the policies
            // that round it up pad it).
            let dedicated = heap.allocate(Request::new(301 * MIB + 4096, 512).unwrap(), None).unwrap();
            let small: Vec<_> = (1..40).map(|i| heap.allocate(Request::new(i * 3 * MIB + 4097, 512).unwrap(), None)).collect();
            for allocation in small.into_iter().flatten().step_by(3) {
                heap.free(allocation).unwrap();
            }
            let Err(Error::OutOfMemory(verdict)) = heap.allocate(mib(900), None) else {
                panic!("{policy}: 900 MiB beside 300 MiB within 1 GiB must fail");
            };
            let report = heap.report();
            let mut usable = Totals::default();
            for block in report.blocks.iter().filter(|block| !block.dedicated || block.layout.totals().live_allocations == 0) {
                usable.merge(&Totals::from_ranges(block.size_bytes, &block.layout.ranges));
            }
            let totals = &report.totals;
            assert_eq!(
                (verdict.reserved_bytes, verdict.live_bytes, verdict.padding_bytes, verdict.retired_bytes),
                (totals.reserved_bytes, totals.live_bytes, totals.internal_waste_bytes(), totals.retired_bytes),
                "{policy}"
            );
            assert_eq!(
                (verdict.free_in_blocks_bytes, verdict.largest_free_run_bytes),
                (usable.free_bytes, usable.largest_free_run_bytes),
                "{policy}"
            );
            if policy == PolicyKind::Tlsf {
                assert!(totals.free_bytes > usable.free_bytes, "the dedicated block's free bytes are not usable");
            }
            heap.free(dedicated).unwrap();
        }
    }

    #[test]
    fn a_large_request_without_room_for_its_own_block_uses_a_shared_one() {
        let config = HeapConfig { capacity_bytes: Some(256 * MIB), ..HeapConfig::new(PolicyKind::Tlsf) };
        let mut heap = Heap::new(config, SimulatedSource::new(4096 * MIB, 2 * MIB)).unwrap();
        let small = heap.allocate(mib(100), None).unwrap();
        let large = heap.allocate(mib(130), None).unwrap();
        assert_eq!((small.block(), large.block()), (0, 0), "the budget leaves no room for a dedicated block");
        // Now nothing fits: the verdict counts only blocks the request could use, so it is honest.
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(mib(130), None) else { panic!("no room left") };
        assert_eq!((verdict.free_in_blocks_bytes, verdict.cause), (26 * MIB, OomCause::Exhaustion));
    }

    /// Issue 19: the three causes on hand-made heaps. Rounding alone: buddy needs a 1 GiB block for 600 MiB, an empty
    /// 800 MiB device cannot give it, though 600 MiB would fit: internal waste, not fragmentation nor exhaustion.
    /// Padding of live allocations: buddy holds 5 x 130 MiB in 256 MiB blocks (630 MiB of padding) on a 1400 MiB
    /// device; 300 MiB more needs 512 MiB; 120 MiB are left: the padding would have covered it. Too little memory: a
    /// request larger than the device.
    #[test]
    fn every_cause_on_hand_made_heaps() {
        let mut heap = heap(PolicyKind::Buddy, ReleaseRule::KeepOne, 800 * MIB);
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(mib(600), None) else { panic!("600 MiB rounds to 1 GiB") };
        assert_eq!((verdict.needed_bytes, verdict.cause), (1024 * MIB, OomCause::InternalWaste));
        assert!(verdict.to_string().contains("1.00 GiB once rounded by the policy"), "{verdict}");
        assert!(verdict.to_string().contains("Internal waste: 800.00 MiB are free in total, enough for the request as asked"));
        let mut heap = heap_with(PolicyKind::Buddy, 1400 * MIB);
        for _ in 0..5 {
            heap.allocate(mib(130), None).unwrap();
        }
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(mib(300), None) else { panic!("512 MiB do not fit") };
        assert_eq!((verdict.padding_bytes, verdict.cause), (5 * 126 * MIB, OomCause::InternalWaste), "{verdict}");
        assert!(verdict.to_string().contains("the 630.00 MiB of padding inside live allocations would have covered it"));
        let mut heap = heap_with(PolicyKind::Tlsf, 64 * MIB);
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(mib(100), None) else { panic!("larger than the device") };
        assert_eq!(verdict.cause, OomCause::Exhaustion, "{verdict}");
        assert!(verdict.to_string().ends_with("Exhaustion: not enough free memory in total, even without any waste"));
    }

    /// Issue 19: a budget under the device's block granularity (1 MiB beside 2 MiB blocks) refuses a 64 KiB request on
    /// an empty heap for want of memory, not for fragmentation.
    #[test]
    fn a_budget_under_one_device_block_is_no_fragmentation() {
        let config = HeapConfig { capacity_bytes: Some(MIB), ..HeapConfig::new(PolicyKind::Tlsf) };
        let mut heap = Heap::new(config, SimulatedSource::new(64 * MIB, 2 * MIB)).unwrap();
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(Request::new(64 * 1024, 256).unwrap(), None) else {
            panic!("a 2 MiB block does not fit a 1 MiB budget")
        };
        assert_eq!((verdict.unreserved_bytes, verdict.cause), (0, OomCause::Exhaustion), "{verdict}");
    }

    /// A heap of `policy` with its blocks sized to each request (one request a block) on a device of `device_bytes`.
    fn heap_with(policy: PolicyKind, device_bytes: u64) -> Heap<SimulatedSource> {
        Heap::new(HeapConfig::new(policy), SimulatedSource::new(device_bytes, 2 * MIB)).unwrap()
    }

    #[test]
    fn blocks_are_whole_multiples_of_the_policy_unit() {
        // 10 MiB blocks with a 4 MiB unit would leave 2 MiB nobody accounts for: blocks round to 12 MiB.
        let config = HeapConfig {
            block_size_bytes: 10 * MIB,
            policy_config: PolicyConfig { min_align_bytes: 4 * MIB, ..PolicyConfig::default() },
            ..HeapConfig::new(PolicyKind::Tlsf)
        };
        let mut heap = Heap::new(config, SimulatedSource::new(4096 * MIB, 2 * MIB)).unwrap();
        heap.allocate(mib(1), None).unwrap();
        let report = heap.report();
        assert_eq!(report.blocks[0].size_bytes, 12 * MIB);
        let totals = &report.totals;
        assert_eq!(totals.rounded_bytes + totals.free_bytes + totals.retired_bytes, totals.reserved_bytes);
    }

    #[test]
    fn foreign_heap_allocation_is_refused() {
        let mut one = heap(PolicyKind::Tlsf, ReleaseRule::KeepOne, 1024 * MIB);
        let mut two = heap(PolicyKind::Tlsf, ReleaseRule::KeepOne, 1024 * MIB);
        let allocation = one.allocate(mib(1), None).unwrap();
        assert!(matches!(two.free(allocation), Err(Error::ForeignAllocation { .. })));
        one.free(allocation).unwrap();
    }
}
