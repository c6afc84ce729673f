//! Two-level segregated fit (Masmano et al., ECRTS 2004): O(1) allocate and free, immediate coalescing.
//!
//! Free blocks sit in segregated lists: the first level is the power of two of the size (in units of
//! `min_align_bytes`), the second splits each power of two into 32 linear steps, so a list's blocks differ
//! in size by at most 1/32. Two bitmaps (one bit per first level, one word of bits per second level) find
//! the first non-empty list at or above a size with two `trailing_zeros`.
//!
//! Allocation first searches the list *above* the request's own ("good fit"): every block there holds the
//! request plus its worst-case alignment padding, so the head of that list is taken without looking at any
//! other block. Only when no such list exists does it scan the lists holding blocks that *may* fit (the
//! request's own list, and those the alignment padding skipped), so a request fails only when no free block
//! can hold it. Blocks are split at the allocation's ends; freeing merges a block with its free physical
//! neighbours at once. Metadata lives out of band in a node array (the managed memory is never touched);
//! a handle carries its node index and the node's generation, so a stale or repeated free is refused in
//! O(1). A node's generation is a 32-bit counter bumped on every free of it: a handle kept across 2^32 reuses
//! of the same node would match again.
//!
//! The hot path is written to avoid data-dependent branches, which cost more than the arithmetic on a
//! replay's unpredictable mix of sizes: node 0 is a sentinel that stands for "no node" (a link update to a
//! missing neighbour writes into it instead of being skipped, and it is never free, so it never merges), a
//! size's list is computed without a branch for small sizes, and a list's bitmap bits are cleared by masks
//! rather than tests. The requested size, read only by reports, sits beside the node array.

use crate::granularity::{self, GranularityGuard};
use crate::policy::{not_live, rounded};
use crate::report::allocation_ranges;
use crate::request::align_down;
use crate::{
    Allocation, AllocationId, FreeSpace, OwnerId, Policy, PolicyConfig, PolicyReport, RangeReport, RangeState, Request,
    ResourceKind, Result,
};

const SL_LOG2: u32 = 5;
const SL_COUNT: u32 = 1 << SL_LOG2;
const FL_COUNT: usize = 64;
const LISTS: usize = FL_COUNT * SL_COUNT as usize;
/// Node 0 is a sentinel, never part of the layout: a link to "no node" points at it, so updating a
/// neighbour's link needs no test (the sentinel absorbs the write), and it is never `Free`, so it never merges.
const NIL: u32 = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeState {
    Free,
    Used,
    /// Not part of the layout: waiting in `vacant` for reuse (and the sentinel).
    Vacant,
}

/// A block of the layout. What only reports read (the requested size) lives in `Tlsf::requested`, so a node
/// takes 40 bytes.
#[derive(Clone, Copy, Debug)]
struct Node {
    offset: u64,
    size: u64,
    prev_phys: u32,
    next_phys: u32,
    prev_free: u32,
    next_free: u32,
    /// Incremented every time a used node is freed, so that old handles no longer match.
    generation: u32,
    /// The free list holding the node (free nodes).
    list: u16,
    state: NodeState,
    kind: ResourceKind,
}

impl Node {
    const SENTINEL: Self = Self {
        offset: 0,
        size: 0,
        prev_phys: NIL,
        next_phys: NIL,
        prev_free: NIL,
        next_free: NIL,
        generation: 0,
        list: 0,
        state: NodeState::Vacant,
        kind: ResourceKind::Linear,
    };
}

/// The TLSF policy. See the module documentation.
#[derive(Clone, Debug)]
pub struct Tlsf {
    owner: OwnerId,
    capacity_bytes: u64,
    min_align: u64,
    unit_shift: u32,
    fl_bitmap: u64,
    sl_bitmaps: [u32; FL_COUNT],
    /// The head of each free list; boxed, so that the policy itself stays small (a heap of hundreds of blocks builds a
    /// policy per block, and an 8 KiB array inline was copied at each move).
    heads: Box<[u32; LISTS]>,
    /// Block metadata, out of band; `nodes[0]` is the sentinel.
    nodes: Vec<Node>,
    /// Bytes the caller asked for, by node (used nodes; read by reports only).
    requested: Vec<u64>,
    /// Head of the vacant nodes, linked through `next_free`.
    vacant: u32,
    live: usize,
    /// Bytes in the free lists.
    free_bytes: u64,
    guard: Option<GranularityGuard>,
}

/// The list holding blocks of `units`: (first level, second level). Below `SL_COUNT` units the first level is
/// 0 and the second the size itself; computed without branches.
#[inline]
fn mapping(units: u64) -> (usize, u32) {
    // floor(log2(units)), or SL_LOG2 - 1 below SL_COUNT.
    let log = 63 - (units | u64::from(SL_COUNT - 1)).leading_zeros();
    let shift = log.max(SL_LOG2) - SL_LOG2;
    ((log + 1 - SL_LOG2) as usize, (units >> shift) as u32 & (SL_COUNT - 1))
}

/// The first list whose every block holds `units`; `None` when rounding overflows.
#[inline]
fn mapping_round_up(units: u64) -> Option<(usize, u32)> {
    let log = 63 - (units | u64::from(SL_COUNT - 1)).leading_zeros();
    let shift = log.max(SL_LOG2) - SL_LOG2;
    Some(mapping(units.checked_add((1u64 << shift) - 1)?))
}

/// The first size (in units) past list `(fl, sl)`: every block of the list is smaller.
#[inline]
fn list_end_units(fl: u32, sl: u32) -> u128 {
    if fl == 0 {
        // First level 0 holds the sizes below SL_COUNT, one per list.
        u128::from(sl) + 1
    } else {
        // First level `fl` holds [2^(fl + SL_LOG2 - 1), 2^(fl + SL_LOG2)) in SL_COUNT steps of 2^(fl - 1).
        (u128::from(SL_COUNT + sl) + 1) << (fl - 1)
    }
}

#[inline]
fn list(fl: usize, sl: u32) -> usize {
    (fl * SL_COUNT as usize + sl as usize) & (LISTS - 1)
}

impl Tlsf {
    /// A TLSF policy over `[0, capacity_bytes)` with the default settings.
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_config(capacity_bytes, &PolicyConfig::default()).expect("the default configuration is valid")
    }

    /// A TLSF policy over `[0, capacity_bytes)`; the capacity is rounded down to `min_align_bytes`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for invalid settings.
    pub fn with_config(capacity_bytes: u64, config: &PolicyConfig) -> Result<Self> {
        config.validate()?;
        let min_align = config.min_align_bytes;
        let capacity_bytes = align_down(capacity_bytes, min_align);
        let mut nodes = Vec::with_capacity(64);
        nodes.push(Node::SENTINEL);
        let mut tlsf = Self {
            owner: OwnerId::fresh(),
            capacity_bytes,
            min_align,
            unit_shift: min_align.trailing_zeros(),
            fl_bitmap: 0,
            sl_bitmaps: [0; FL_COUNT],
            heads: vec![NIL; LISTS].into_boxed_slice().try_into().expect("LISTS heads"),
            nodes,
            requested: vec![0],
            vacant: NIL,
            live: 0,
            free_bytes: 0,
            guard: config.granularity().map(GranularityGuard::new),
        };
        if capacity_bytes > 0 {
            let first = tlsf.new_node(0, capacity_bytes, NIL, NIL);
            tlsf.insert_free(first, capacity_bytes);
        }
        Ok(tlsf)
    }

    /// A node for the block `[offset, offset + size)` between `prev_phys` and `next_phys`; its free-list
    /// fields are set by [`Tlsf::insert_free`].
    #[inline]
    fn new_node(&mut self, offset: u64, size: u64, prev_phys: u32, next_phys: u32) -> u32 {
        let index = self.vacant;
        if index != NIL {
            let node = &mut self.nodes[index as usize];
            self.vacant = node.next_free;
            node.offset = offset;
            node.size = size;
            node.prev_phys = prev_phys;
            node.next_phys = next_phys;
            index
        } else {
            let index = u32::try_from(self.nodes.len()).expect("fewer than 2^32 blocks");
            self.nodes.push(Node { offset, size, prev_phys, next_phys, ..Node::SENTINEL });
            self.requested.push(0);
            index
        }
    }

    #[inline]
    fn vacate(&mut self, index: u32) {
        let node = &mut self.nodes[index as usize];
        node.state = NodeState::Vacant;
        node.next_free = self.vacant;
        self.vacant = index;
    }

    /// Puts node `index`, of `size` bytes, at the head of its free list.
    #[inline]
    fn insert_free(&mut self, index: u32, size: u64) {
        let (fl, sl) = mapping(size >> self.unit_shift);
        let slot = list(fl, sl);
        let head = self.heads[slot];
        let node = &mut self.nodes[index as usize];
        node.list = slot as u16;
        node.state = NodeState::Free;
        node.prev_free = NIL;
        node.next_free = head;
        self.nodes[head as usize].prev_free = index;
        self.heads[slot] = index;
        self.fl_bitmap |= 1 << fl;
        self.sl_bitmaps[fl] |= 1 << sl;
        self.free_bytes += size;
    }

    #[inline]
    fn remove_free(&mut self, index: u32) {
        let Node { list, prev_free, next_free, size, .. } = self.nodes[index as usize];
        self.free_bytes -= size;
        let list = usize::from(list);
        self.nodes[next_free as usize].prev_free = prev_free;
        self.nodes[prev_free as usize].next_free = next_free;
        if prev_free == NIL {
            self.heads[list] = next_free;
            self.clear_list_bit_if_empty(list);
        }
    }

    /// The error for freeing a handle that is not live here (kept out of the hot path).
    #[cold]
    #[inline(never)]
    fn refuse(&self, allocation: &Allocation) -> crate::Error {
        not_live(self.owner, allocation, self.name())
    }

    /// Merges block `right` into its physical predecessor `left` (neither on a free list).
    #[inline]
    fn join(&mut self, left: u32, right: u32) {
        let Node { size, next_phys: after, .. } = self.nodes[right as usize];
        let node = &mut self.nodes[left as usize];
        node.size += size;
        node.next_phys = after;
        self.nodes[after as usize].prev_phys = left;
        self.vacate(right);
    }

    /// The highest non-empty list, as (first level, second level): the one holding the largest free blocks.
    #[inline]
    fn highest_list(&self) -> Option<(u32, u32)> {
        if self.fl_bitmap == 0 {
            return None;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros();
        Some((fl, 31 - self.sl_bitmaps[fl as usize].leading_zeros()))
    }

    /// Takes the head off the non-empty list `slot`.
    #[inline]
    fn pop_head(&mut self, slot: usize) -> u32 {
        let index = self.heads[slot];
        let Node { next_free, size, .. } = self.nodes[index as usize];
        self.free_bytes -= size;
        self.heads[slot] = next_free;
        self.nodes[next_free as usize].prev_free = NIL;
        self.clear_list_bit_if_empty(slot);
        index
    }

    /// Clears the bitmap bits of list `slot` when it is empty, without branches.
    #[inline]
    fn clear_list_bit_if_empty(&mut self, slot: usize) {
        let (fl, sl) = (slot / SL_COUNT as usize, slot % SL_COUNT as usize);
        let empty = u32::from(self.heads[slot] == NIL);
        self.sl_bitmaps[fl] &= !(empty << sl);
        let fl_empty = u64::from(self.sl_bitmaps[fl] == 0);
        self.fl_bitmap &= !(fl_empty << fl);
    }

    /// The first non-empty list at or after `(fl, sl)`.
    #[inline]
    fn find_non_empty(&self, fl: usize, sl: u32) -> Option<(usize, u32)> {
        let sl_map = self.sl_bitmaps[fl] & (u32::MAX << sl);
        if sl_map != 0 {
            return Some((fl, sl_map.trailing_zeros()));
        }
        let fl_map = self.fl_bitmap & u64::MAX.checked_shl(fl as u32 + 1).unwrap_or(0);
        if fl_map == 0 {
            return None;
        }
        let fl = fl_map.trailing_zeros() as usize;
        Some((fl, self.sl_bitmaps[fl].trailing_zeros()))
    }

    #[inline]
    fn fit(&self, index: u32, size: u64, align: u64, kind: ResourceKind) -> Option<u64> {
        let node = &self.nodes[index as usize];
        granularity::place(self.guard.as_ref(), node.offset, node.offset + node.size, size, align, kind)
    }

    /// Turns the free block `index`, already off its list, into the allocation `[offset, offset + size)`,
    /// returning its ends to the free lists.
    #[inline]
    fn take(&mut self, index: u32, offset: u64, size: u64, request: Request) -> Allocation {
        let Node { offset: block_offset, size: block_size, prev_phys, next_phys, .. } = self.nodes[index as usize];
        if offset > block_offset {
            let gap_size = offset - block_offset;
            let gap = self.new_node(block_offset, gap_size, prev_phys, index);
            self.nodes[prev_phys as usize].next_phys = gap;
            self.nodes[index as usize].prev_phys = gap;
            self.insert_free(gap, gap_size);
        }
        let tail_size = block_offset + block_size - (offset + size);
        if tail_size > 0 {
            let tail = self.new_node(offset + size, tail_size, index, next_phys);
            self.nodes[next_phys as usize].prev_phys = tail;
            self.nodes[index as usize].next_phys = tail;
            self.insert_free(tail, tail_size);
        }
        let node = &mut self.nodes[index as usize];
        node.offset = offset;
        node.size = size;
        node.state = NodeState::Used;
        node.kind = request.kind();
        let generation = node.generation;
        self.requested[index as usize] = request.size_bytes();
        if let Some(guard) = &mut self.guard {
            guard.insert(offset, size, request.kind());
        }
        self.live += 1;
        Allocation::from_parts(
            self.owner,
            AllocationId::from_slot(index, generation),
            offset,
            request.size_bytes(),
            (offset, size),
            request.kind(),
        )
    }

    /// Scans every list from the one holding `size` upwards, block by block: the complete (slow) search.
    fn scan(&mut self, size: u64, align: u64, request: Request) -> Option<Allocation> {
        let (mut fl, mut sl) = mapping(size >> self.unit_shift);
        loop {
            let (found_fl, found_sl) = self.find_non_empty(fl, sl)?;
            let mut index = self.heads[list(found_fl, found_sl)];
            while index != NIL {
                if let Some(offset) = self.fit(index, size, align, request.kind()) {
                    self.remove_free(index);
                    return Some(self.take(index, offset, size, request));
                }
                index = self.nodes[index as usize].next_free;
            }
            (fl, sl) = if found_sl + 1 < SL_COUNT {
                (found_fl, found_sl + 1)
            } else if found_fl + 1 < FL_COUNT {
                (found_fl + 1, 0)
            } else {
                return None;
            };
        }
    }
}

impl Policy for Tlsf {
    fn name(&self) -> &'static str {
        "tlsf"
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    #[inline]
    fn allocate(&mut self, request: Request) -> Option<Allocation> {
        let (size, align) = rounded(request, self.min_align)?;
        // Fast path: the head of the first list whose blocks all hold the size plus worst-case padding.
        let good_fit = size
            .checked_add(align - self.min_align)
            .and_then(|worst| mapping_round_up(worst >> self.unit_shift))
            .and_then(|(fl, sl)| self.find_non_empty(fl, sl));
        if let Some((fl, sl)) = good_fit {
            let slot = list(fl, sl);
            let index = self.heads[slot];
            // Without a granularity guard every block of this list holds the request: no check needed when
            // the alignment is the unit's.
            let offset = if self.guard.is_none() && align == self.min_align {
                Some(self.nodes[index as usize].offset)
            } else {
                self.fit(index, size, align, request.kind())
            };
            if let Some(offset) = offset {
                self.pop_head(slot);
                return Some(self.take(index, offset, size, request));
            }
        }
        self.scan(size, align, request)
    }

    /// The free block holding `[offset, offset + size)` is found by walking the blocks (TLSF keeps no index by
    /// address): compaction's rare re-placements, not the hot path.
    fn allocate_at(&mut self, request: Request, offset: u64) -> Option<Allocation> {
        let (size, align) = rounded(request, self.min_align)?;
        let end = offset.checked_add(size)?;
        let index = (1..self.nodes.len() as u32).find(|&index| {
            let node = &self.nodes[index as usize];
            node.state == NodeState::Free && node.offset <= offset && end <= node.offset + node.size
        })?;
        let node_end = self.nodes[index as usize].offset + self.nodes[index as usize].size;
        if granularity::place(self.guard.as_ref(), offset, node_end, size, align, request.kind()) != Some(offset) {
            return None;
        }
        self.remove_free(index);
        Some(self.take(index, offset, size, request))
    }

    #[inline]
    fn free(&mut self, allocation: Allocation) -> Result<()> {
        let mut index = allocation.id().slot();
        let matches = allocation.owner() == self.owner
            && self.nodes.get(index as usize).is_some_and(|node| {
                node.state == NodeState::Used
                    && node.generation == allocation.id().generation()
                    && node.offset == allocation.offset()
            });
        if !matches {
            return Err(self.refuse(&allocation));
        }
        let node = &mut self.nodes[index as usize];
        node.generation = node.generation.wrapping_add(1);
        node.state = NodeState::Free;
        let Node { offset, size, prev_phys, next_phys, .. } = *node;
        if let Some(guard) = &mut self.guard {
            guard.remove(offset, size);
        }
        self.live -= 1;
        // The sentinel is never free, so no test for a missing neighbour.
        if self.nodes[next_phys as usize].state == NodeState::Free {
            self.remove_free(next_phys);
            self.join(index, next_phys);
        }
        if self.nodes[prev_phys as usize].state == NodeState::Free {
            self.remove_free(prev_phys);
            self.join(prev_phys, index);
            index = prev_phys;
        }
        let size = self.nodes[index as usize].size;
        self.insert_free(index, size);
        Ok(())
    }

    fn live_allocations(&self) -> usize {
        self.live
    }

    /// Blocks in the highest non-empty list `(fl, sl)` are below the first size of the list after it: within 1/32
    /// of the largest free block, so a heap seldom asks a block that then cannot serve.
    #[inline]
    fn largest_free_bound_bytes(&self) -> u64 {
        let Some((fl, sl)) = self.highest_list() else { return 0 };
        // A free block's units fit 64 bits, so the list's end fits 65 and shifted by the unit, 128.
        u64::try_from(list_end_units(fl, sl) << self.unit_shift).unwrap_or(u64::MAX)
    }

    /// The free bytes are counted as the lists change; the largest run is in the highest non-empty list (lists hold
    /// disjoint sizes), walked.
    fn free_space(&self) -> FreeSpace {
        let mut largest = 0;
        if let Some((fl, sl)) = self.highest_list() {
            let mut index = self.heads[list(fl as usize, sl)];
            while index != NIL {
                let node = &self.nodes[index as usize];
                largest = largest.max(node.size);
                index = node.next_free;
            }
        }
        FreeSpace { free_bytes: self.free_bytes, largest_free_run_bytes: largest, retired_bytes: 0 }
    }

    fn report(&self) -> PolicyReport {
        let mut nodes: Vec<(u32, &Node)> = (0..).zip(&self.nodes).filter(|(_, node)| node.state != NodeState::Vacant).collect();
        nodes.sort_unstable_by_key(|(_, node)| node.offset);
        let mut ranges = Vec::with_capacity(nodes.len() + self.live);
        for (index, node) in nodes {
            match node.state {
                NodeState::Used => allocation_ranges(
                    AllocationId::from_slot(index, node.generation),
                    (node.offset, node.size),
                    (node.offset, self.requested[index as usize]),
                    &mut ranges,
                ),
                _ => ranges.push(RangeReport::unowned(node.offset, node.size, RangeState::Free)),
            }
        }
        PolicyReport { policy: self.name(), capacity_bytes: self.capacity_bytes, ranges }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    fn request(size: u64, align: u64) -> Request {
        Request::new(size, align).unwrap()
    }

    #[test]
    fn mapping_table() {
        // units -> (fl, sl), and the round-up list
        let cases = [
            (0, (0, 0), (0, 0)),
            (31, (0, 31), (0, 31)),
            (32, (1, 0), (1, 0)),
            (33, (1, 1), (1, 1)),
            (63, (1, 31), (1, 31)),
            (64, (2, 0), (2, 0)),
            (65, (2, 0), (2, 1)),
            (127, (2, 31), (3, 0)),
            (u64::MAX, (59, 31), (59, 31)),
        ];
        for (units, exact, up) in cases {
            assert_eq!(mapping(units), exact, "mapping({units})");
            if units != u64::MAX {
                assert_eq!(mapping_round_up(units), Some(up), "round_up({units})");
            }
        }
        assert_eq!(mapping_round_up(u64::MAX), None);
    }

    #[test]
    fn allocation_table() {
        // Each case: allocations made in order on a 64 KiB range, then the expected offsets.
        // (size, align) requests in order -> their offsets
        type Case = (&'static [(u64, u64)], &'static [Option<u64>]);
        let cases: [Case; 5] = [
            (&[(1000, 1), (1000, 1)], &[Some(0), Some(1024)]),
            (&[(256, 1), (256, 4096)], &[Some(0), Some(4096)]),
            (&[(65536, 1), (1, 1)], &[Some(0), None]),
            (&[(65537, 1)], &[None]),
            (&[(30000, 1), (30000, 1), (5536, 1), (1, 1)], &[Some(0), Some(30208), None, Some(60416)]),
        ];
        for (requests, expected) in cases {
            let mut tlsf = Tlsf::new(64 << 10);
            let offsets: Vec<_> =
                requests.iter().map(|&(size, align)| tlsf.allocate(request(size, align)).map(|a| a.offset())).collect();
            assert_eq!(offsets, expected, "{requests:?}");
        }
    }

    #[test]
    fn alignment_gap_is_reused_and_coalesced() {
        let mut tlsf = Tlsf::new(1 << 20);
        let a = tlsf.allocate(request(256, 1)).unwrap();
        let b = tlsf.allocate(request(1024, 65536)).unwrap();
        assert_eq!(b.offset(), 65536);
        // The gap [256, 65536) went back to the free lists and serves the next request.
        let c = tlsf.allocate(request(60000, 1)).unwrap();
        assert_eq!(c.offset(), 256);
        for allocation in [a, b, c] {
            tlsf.free(allocation).unwrap();
        }
        let report = tlsf.report();
        assert_eq!(report.ranges, [RangeReport::unowned(0, 1 << 20, RangeState::Free)]);
    }

    #[test]
    fn slow_path_finds_a_block_the_good_fit_list_skips() {
        // 40 units and a 41-unit request: the round-up list is above every free block, the scan finds it.
        let mut tlsf = Tlsf::new(64 << 10);
        let left = tlsf.allocate(request(41 * 256, 1)).unwrap();
        let _wall = tlsf.allocate(request(256, 1)).unwrap();
        let _rest = tlsf.allocate(request((64 << 10) - 42 * 256, 1)).unwrap();
        tlsf.free(left).unwrap();
        assert_eq!(tlsf.allocate(request(41 * 256, 1)).map(|a| a.offset()), Some(0));
    }

    #[test]
    fn largest_free_bound_covers_every_free_block() {
        let mut tlsf = Tlsf::new(1 << 20);
        assert!(tlsf.largest_free_bound_bytes() >= 1 << 20);
        let whole = tlsf.allocate(request(1 << 20, 1)).unwrap();
        assert_eq!(tlsf.largest_free_bound_bytes(), 0, "nothing free");
        tlsf.free(whole).unwrap();
        let _small = tlsf.allocate(request((1 << 20) - 4096, 1)).unwrap();
        let bound = tlsf.largest_free_bound_bytes();
        assert!((4096..=8192).contains(&bound), "{bound}");
    }

    /// The bound sits just above the largest free block: at most one second-level step (1/32 of its power of two)
    /// above it, never at or below it.
    #[test]
    fn largest_free_bound_is_within_a_second_level_step() {
        let unit = PolicyConfig::default().min_align_bytes;
        // (free bytes left at the end of a 1 GiB range, the most the bound may exceed them by)
        let cases = [
            (unit, unit),
            (31 * unit, unit),
            (32 * unit, unit),
            (33 * unit, unit),
            (1 << 20, (1 << 20) / 32),
            ((1 << 20) + 1234 * unit, (1 << 20) / 32),
            ((3 << 20) - unit, (2 << 20) / 32),
            (700 << 20, (512 << 20) / 32),
        ];
        for (free, slack) in cases {
            let mut tlsf = Tlsf::new(1 << 30);
            let _used = tlsf.allocate(request((1 << 30) - free, 1)).unwrap();
            let bound = tlsf.largest_free_bound_bytes();
            assert!(bound > free && bound <= free + slack, "{free} free: bound {bound}, allowed up to {}", free + slack);
        }
    }

    #[test]
    fn misuse_is_refused() {
        let mut tlsf = Tlsf::new(1 << 20);
        let mut other = Tlsf::new(1 << 20);
        let a = tlsf.allocate(request(100, 1)).unwrap();
        let foreign = other.allocate(request(100, 1)).unwrap();
        assert!(matches!(tlsf.free(foreign), Err(Error::ForeignAllocation { .. })));
        tlsf.free(a).unwrap();
        assert!(matches!(tlsf.free(a), Err(Error::DoubleFree { .. })));
        // The node is reused; the old handle still does not free the new allocation.
        let b = tlsf.allocate(request(100, 1)).unwrap();
        assert!(matches!(tlsf.free(a), Err(Error::DoubleFree { .. })));
        assert_eq!(tlsf.live_allocations(), 1);
        tlsf.free(b).unwrap();
    }

    #[test]
    fn forged_handles_are_refused() {
        let mut tlsf = Tlsf::new(1 << 20);
        let live = tlsf.allocate(request(100, 1)).unwrap();
        let before = tlsf.report();
        let forge = |slot, generation, offset| {
            Allocation::from_parts(
                live.owner(),
                AllocationId::from_slot(slot, generation),
                offset,
                100,
                (offset, 256),
                ResourceKind::Linear,
            )
        };
        let id = live.id();
        // (slot, generation, offset): the sentinel node, a free node, past the node array, a wrong generation,
        // a wrong offset.
        let cases = [
            (0, 0, 0),
            (id.slot() + 1, 0, 256),
            (u32::MAX, 0, 0),
            (id.slot(), id.generation() + 1, live.offset()),
            (id.slot(), id.generation(), live.offset() + 256),
        ];
        for (slot, generation, offset) in cases {
            let result = tlsf.free(forge(slot, generation, offset));
            assert!(
                matches!(result, Err(Error::DoubleFree { .. })),
                "slot {slot} generation {generation} offset {offset}: {result:?}"
            );
            assert_eq!(tlsf.report(), before, "slot {slot}: nothing changes");
        }
        tlsf.free(live).unwrap();
        assert_eq!(tlsf.report().ranges, [RangeReport::unowned(0, 1 << 20, RangeState::Free)]);
    }
}
