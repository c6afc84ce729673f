//! Expandable segments (`expandable_segments:True`, Note [Expandable Segments] in
//! `CUDACachingAllocator.cpp`): one reserved virtual range per stream and pool, backed by physical pages
//! (2 MiB for the small pool, 20 MiB for the large pool) that are mapped on demand at the lowest address
//! that fits (`find_expandable_block`, `map_block`, `ExpandableSegment::map`) and unmapped when the cache
//! is released (`unmap_block`, `ExpandableSegment::unmap`). PyTorch counts every map as a device
//! allocation and every unmap as a device free (`num_device_alloc` / `num_device_free`).
//!
//! Where a reservation starts is the driver's choice, seen in the trace: the first `alloc` that lands in a
//! segment sits at its base. Its size (9/8 of the device's memory) is not in the trace; a segment is taken to span
//! 9/8 of the most the allocator has reserved at once (the device holds at least that), at least
//! [`EXPANDABLE_VIRTUAL_BYTES`](super::EXPANDABLE_VIRTUAL_BYTES), or up to the next reservation, whichever ends
//! first. It is cut when a later reservation turns out to start inside its unmapped tail (an 80 GB device reserves
//! 89 GiB per segment), and grown when the trace places a request of its stream and pool where its free run at the end
//! begins but the run is too short (a 180 GiB device reserves 202 GiB). A segment reserved without a hint (by a
//! recorded `oom`) gets a synthetic base and moves to the first hint that lands in it while nothing is mapped there,
//! or out of the way of a reservation the trace shows over it.

use super::{
    ADDRESS_LIMIT, BlockId, CachingAllocator, DeviceEvent, ExpandableSegment, LARGE_BUFFER_BYTES, Node, ROUND_LARGE_BYTES,
    SMALL_BUFFER_BYTES,
};
use crate::snapshot::{Action, Pool};

impl CachingAllocator {
    /// `try_allocate_expandable_block`: maps pages until a free block of at least `size` bytes exists at
    /// the lowest usable address, and takes it out of the pool.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        pool: (usize, Pool),
        stream: u64,
        size: u64,
        base_hint: Option<u64>,
    ) -> Option<BlockId> {
        let mut candidate = self.find_expandable_block(pool, stream, size, base_hint)?;
        self.move_to_hint(candidate, size, base_hint);
        if !self.node(candidate).mapped {
            let to_map = self.node(candidate).size.min(size);
            if !self.map_block(candidate, to_map) {
                return None;
            }
        }
        while self.node(candidate).size < size {
            // Invariant: free -> unmapped -> *; map_block maps part of the unmapped block and merges.
            let remaining = size - self.node(candidate).size;
            let next = self.node(candidate).next?;
            let to_map = remaining.min(self.node(next).size);
            if !self.map_block(next, to_map) {
                return None;
            }
            candidate = next;
        }
        self.remove_free(candidate);
        Some(candidate)
    }

    /// `find_expandable_block`: the lowest unmapped range of this stream's segments (with the free block
    /// just before it) that has `size` bytes of address space; else a new segment.
    fn find_expandable_block(&mut self, pool: (usize, Pool), stream: u64, size: u64, base_hint: Option<u64>) -> Option<BlockId> {
        let unmapped: Vec<BlockId> =
            self.pool(pool).unmapped.range((stream, 0, 0)..).take_while(|k| k.0 == stream).map(|k| k.2).collect();
        let found = unmapped
            .into_iter()
            .map(|c| self.node(c).prev.filter(|&p| !self.node(p).active).unwrap_or(c))
            .find(|&c| self.has_available_address_space(c, size));
        // The trace placing the request where a segment's free run at the end begins, and not where room was found
        // (PyTorch takes the lowest range with room), says that segment served it: it is larger than taken.
        if let Some(hint) = base_hint
            && found.is_none_or(|c| self.node(c).addr != hint)
            && let Some(grown) = self.grow_to_hint(pool, stream, size, hint)
        {
            return Some(grown);
        }
        if found.is_some() {
            return found;
        }
        let page_bytes = if pool.1 == Pool::Small { SMALL_BUFFER_BYTES } else { LARGE_BUFFER_BYTES };
        let (base, virtual_bytes, from_trace) = self.place_expandable(base_hint, size, page_bytes, None)?;
        self.expandable.push(Some(ExpandableSegment { base, size: virtual_bytes, page_bytes, from_trace, owner: pool.0 }));
        let index = self.expandable.len() - 1;
        let id = self.new_node(Node::free(base, virtual_bytes, stream, pool, false, Some(index)));
        self.insert_unmapped(id);
        Some(id)
    }

    /// The free run at the end of a segment of `stream` and `pool` whose base is the driver's, grown to hold `size` bytes,
    /// when the trace places the request at `hint`, where that run begins (or where the segment ends, every page
    /// mapped): the reservation is larger than taken (PyTorch reserves 9/8 of the device, 202 GiB on a 180 GiB one).
    /// A new reservation of the same stream and pool never begins there: the one below would have had every page
    /// mapped, more than the device holds. The segment grows to what the request needs,
    /// or to [`CachingAllocator::reservation_bytes`] if more, as far as the next segment above (one with a synthetic
    /// base and nothing mapped moves out of the way). `None` when no such run begins at `hint`, or another segment
    /// lies where it would grow.
    fn grow_to_hint(&mut self, (owner, pool): (usize, Pool), stream: u64, size: u64, hint: u64) -> Option<BlockId> {
        let candidates: Vec<usize> = (0..self.expandable.len())
            .filter(|&index| {
                self.expandable[index]
                    .as_ref()
                    .is_some_and(|s| s.from_trace && s.owner == owner && s.base <= hint && hint <= s.base + s.size)
            })
            .collect();
        candidates.into_iter().find_map(|index| self.grow_segment(index, (owner, pool), stream, size, hint))
    }

    /// [`CachingAllocator::grow_to_hint`] for expandable segment `index`. The cheap checks first: a hostile trace can
    /// ask this of every request.
    fn grow_segment(&mut self, index: usize, (owner, pool): (usize, Pool), stream: u64, size: u64, hint: u64) -> Option<BlockId> {
        let segment = self.expandable[index].clone()?;
        let end = segment.base + segment.size;
        let page_bytes = segment.page_bytes;
        let round = |bytes: u64| bytes.div_ceil(page_bytes).checked_mul(page_bytes);
        let needed_end = hint
            .checked_add(size)
            .and_then(|request_end| round(request_end - segment.base))
            .and_then(|needed| segment.base.checked_add(needed))
            .filter(|&needed_end| needed_end > end && needed_end <= ADDRESS_LIMIT)?;
        let room_end = self.next_segment_above(end);
        if needed_end > room_end {
            return None;
        }
        // The segment's last block: its unmapped tail, else (every page mapped) the block ending at its end.
        let tail = self.unmapped_tail(index);
        let last = match tail {
            Some(tail) => tail,
            None => self.node_ending_at(index, end)?,
        };
        let node = self.node(last);
        if node.stream != stream || node.pool != pool {
            return None;
        }
        // The run the request takes: a free mapped block at `hint` just before the unmapped tail (or ending the
        // segment), or the unmapped tail itself, there already or added.
        let free_before = match tail {
            Some(_) => node.prev,
            None => Some(last),
        }
        .filter(|&block| !self.node(block).active && self.node(block).addr == hint);
        let tail_at_hint = tail.map_or(end, |tail| self.node(tail).addr) == hint;
        if free_before.is_none() && !tail_at_hint {
            return None;
        }
        let estimate_end = round(self.reservation_bytes(0)).and_then(|bytes| segment.base.checked_add(bytes)).unwrap_or(room_end);
        let new_end = estimate_end.min(room_end).max(needed_end);
        self.move_floating_out_of(end, new_end, None);
        let grown = new_end - end;
        let tail = match tail {
            Some(tail) => {
                self.remove_unmapped(tail);
                self.node_mut(tail).size += grown;
                self.insert_unmapped(tail);
                tail
            }
            None => {
                let id = self.new_node(Node::free(end, grown, stream, (owner, pool), false, Some(index)));
                self.node_mut(id).prev = Some(last);
                self.node_mut(last).next = Some(id);
                self.insert_unmapped(id);
                id
            }
        };
        if let Some(Some(segment)) = self.expandable.get_mut(index) {
            segment.size = new_end - segment.base;
        }
        Some(free_before.unwrap_or(tail))
    }

    /// Where the next segment at or above `end` begins (or [`ADDRESS_LIMIT`]); an expandable one with a synthetic base
    /// and nothing mapped is not in the way (it moves).
    fn next_segment_above(&self, end: u64) -> u64 {
        let ordinary = self.segments.range(end..).next().map_or(ADDRESS_LIMIT, |(&base, _)| base);
        // Segments whose base is the driver's never move; of the others, only those below them are asked.
        let fixed = self.expandable.iter().flatten().filter(|s| s.from_trace && s.base >= end).map(|s| s.base).min();
        let bound = ordinary.min(fixed.unwrap_or(ADDRESS_LIMIT));
        let mut others: Vec<(u64, usize)> = (0..self.expandable.len())
            .filter_map(|index| self.expandable[index].as_ref().map(|s| (s, index)))
            .filter(|(s, _)| !s.from_trace && s.base >= end && s.base < bound)
            .map(|(s, index)| (s.base, index))
            .collect();
        others.sort_unstable();
        others.into_iter().find(|&(_, index)| self.floating(index).is_none()).map_or(bound, |(base, _)| base)
    }

    /// The block of expandable segment `index` that ends at `end` (a scan of every block: only where a segment grows).
    fn node_ending_at(&self, index: usize, end: u64) -> Option<BlockId> {
        self.nodes.iter().position(|node| node.as_ref().is_some_and(|n| n.expandable == Some(index) && n.addr + n.size == end))
    }

    /// Where a new expandable segment's reservation goes and how large it is, for a request of `size` bytes
    /// in `page_bytes` pages; `true` when the base is the driver's. The recorded `alloc` that first lands in
    /// a segment sits at its base, so `hint` (its address) is the base when the range from there holds the
    /// request before the next reservation: an expandable segment whose range the hint falls in, after its
    /// last mapped page, is cut there (the driver put this reservation there, so that one is smaller than
    /// assumed), and segments with a synthetic base and nothing mapped move out of the way. Else a
    /// synthetic base past everything, `None` when the request's pages would end past [`ADDRESS_LIMIT`] there (the
    /// driver refuses to reserve: requests of exabytes, each refused, leave their reservations behind). `moving`: a
    /// segment being placed again, left out of the checks.
    fn place_expandable(
        &mut self,
        hint: Option<u64>,
        size: u64,
        page_bytes: u64,
        moving: Option<usize>,
    ) -> Option<(u64, u64, bool)> {
        if let Some(hint) = hint
            && let Some((virtual_bytes, cut)) = self.room_at(hint, size, page_bytes, moving)
        {
            if let Some((index, tail)) = cut {
                self.cut_expandable(index, tail, hint);
            }
            self.move_floating_out_of(hint, hint + virtual_bytes, moving);
            return Some((hint, virtual_bytes, true));
        }
        // A request larger than the usual reservation gets one its size (PyTorch's spans 9/8 of the device).
        let needed = size.div_ceil(page_bytes).saturating_mul(page_bytes);
        let virtual_bytes = self.reservation_bytes(0).max(needed);
        let base = self.choose_base(None, virtual_bytes);
        if base.checked_add(needed).is_none_or(|end| end > ADDRESS_LIMIT) {
            return None;
        }
        Some((base, virtual_bytes.min(ADDRESS_LIMIT - base), false))
    }

    /// Moves the segments with a synthetic base and nothing mapped that lie in `[start, end)` (but `moving`) past
    /// everything: the trace put a reservation there.
    fn move_floating_out_of(&mut self, start: u64, end: u64, moving: Option<usize>) {
        let floating: Vec<(usize, BlockId)> = (0..self.expandable.len())
            .filter(|&index| Some(index) != moving)
            .filter(|&index| self.expandable[index].as_ref().is_some_and(|s| s.base < end && start < s.base + s.size))
            .filter_map(|index| self.floating(index).map(|id| (index, id)))
            .collect();
        for (index, id) in floating {
            let base = self.choose_base(None, 0).max(end.div_ceil(ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES);
            let size = self.node(id).size;
            // Past the address limit (hostile reservations of exabytes) it stays: nothing is mapped in it.
            if base.checked_add(size).is_some_and(|moved_end| moved_end <= ADDRESS_LIMIT) {
                self.rebase_expandable(index, id, base, size, false);
            }
        }
    }

    /// The virtual bytes a reservation at `hint` can have (the request's pages at least), and the expandable
    /// segment to cut at `hint` with its unmapped tail; `None` when the hint cannot be the base.
    fn room_at(&self, hint: u64, size: u64, page_bytes: u64, moving: Option<usize>) -> Option<(u64, Option<(usize, BlockId)>)> {
        let needed = size.div_ceil(page_bytes).checked_mul(page_bytes)?;
        if hint == 0 || hint.checked_add(needed).is_none_or(|end| end > ADDRESS_LIMIT) {
            return None;
        }
        if let Some((&base, &bytes)) = self.segments.range(..=hint).next_back()
            && hint - base < bytes
        {
            return None;
        }
        let mut limit = self.reservation_bytes(0).max(needed).min(ADDRESS_LIMIT - hint);
        if let Some((&next, _)) = self.segments.range(hint..).next() {
            limit = limit.min(next - hint);
        }
        let mut cut = None;
        for (index, segment) in self.expandable.iter().enumerate() {
            let Some(segment) = segment else { continue };
            if Some(index) == moving || self.floating(index).is_some() {
                continue;
            }
            if segment.base > hint {
                limit = limit.min(segment.base - hint);
            } else if hint - segment.base < segment.size {
                // The hint falls in this segment's range: only past its last mapped page.
                let tail = self.unmapped_tail(index)?;
                if self.node(tail).addr > hint || segment.base == hint {
                    return None;
                }
                cut = Some((index, tail));
            }
        }
        (limit >= needed).then_some((limit, cut))
    }

    /// The unmapped block that ends expandable segment `index`, if its end is unmapped.
    fn unmapped_tail(&self, index: usize) -> Option<BlockId> {
        let segment = self.expandable.get(index)?.as_ref()?;
        let end = segment.base + segment.size;
        let unmapped =
            self.pools.iter().flat_map(|memory_pool| memory_pool.small.unmapped.iter().chain(&memory_pool.large.unmapped));
        unmapped.map(|&(_, _, id)| id).find(|&id| {
            let node = self.node(id);
            node.expandable == Some(index) && node.addr + node.size == end
        })
    }

    /// The one block of expandable segment `index` when its base is synthetic and nothing is mapped in it:
    /// a segment that may still move to where the trace shows it.
    fn floating(&self, index: usize) -> Option<BlockId> {
        let segment = self.expandable.get(index)?.as_ref()?;
        if segment.from_trace {
            return None;
        }
        let id = self.unmapped_tail(index)?;
        (self.node(id).addr == segment.base && self.node(id).prev.is_none()).then_some(id)
    }

    /// Ends expandable segment `index` at `end`, inside its unmapped tail block `tail`.
    fn cut_expandable(&mut self, index: usize, tail: BlockId, end: u64) {
        let start = self.node(tail).addr;
        if start == end {
            self.remove_unmapped(tail);
            if let Some(prev) = self.node(tail).prev {
                self.node_mut(prev).next = None;
            }
            self.delete_node(tail);
        } else {
            self.node_mut(tail).size = end - start;
        }
        if let Some(Some(segment)) = self.expandable.get_mut(index) {
            segment.size = end - segment.base;
        }
    }

    /// Moves expandable segment `index`, whose one block is `id` (nothing mapped), to `base` with `size` bytes.
    fn rebase_expandable(&mut self, index: usize, id: BlockId, base: u64, size: u64, from_trace: bool) {
        self.remove_unmapped(id);
        let node = self.node_mut(id);
        node.addr = base;
        node.size = size;
        self.insert_unmapped(id);
        if let Some(Some(segment)) = self.expandable.get_mut(index) {
            segment.base = base;
            segment.size = size;
            segment.from_trace = from_trace;
        }
    }

    /// A segment reserved without a hint (by a recorded `oom`, which has no address) and never mapped since
    /// is moved to `hint` when the first request that lands in it has one: its base in the trace.
    fn move_to_hint(&mut self, candidate: BlockId, size: u64, hint: Option<u64>) {
        let Some(hint) = hint else { return };
        let node = self.node(candidate);
        // Cheap checks first (this runs for every request that maps pages): the block is a whole segment.
        if node.mapped || node.prev.is_some() || node.next.is_some() || node.addr == hint {
            return;
        }
        let Some(index) = node.expandable else { return };
        let Some(segment) = self.expandable.get(index).cloned().flatten() else { return };
        if segment.from_trace || segment.base != node.addr || segment.size != node.size {
            return;
        }
        if let Some((base, virtual_bytes, true)) = self.place_expandable(Some(hint), size, segment.page_bytes, Some(index)) {
            self.rebase_expandable(index, candidate, base, virtual_bytes, true);
        }
    }

    fn has_available_address_space(&self, start: BlockId, size: u64) -> bool {
        let mut bytes = 0;
        let mut cur = Some(start);
        while bytes < size
            && let Some(c) = cur
            && !self.node(c).active
        {
            bytes += self.node(c).size;
            cur = self.node(c).next;
        }
        bytes >= size
    }

    /// The size a free expandable block can grow to (itself plus a following unmapped range), used by
    /// `get_free_block`'s best fit.
    pub(super) fn expandable_size(&self, id: BlockId) -> u64 {
        let n = self.node(id);
        n.size + n.next.filter(|&nx| !self.node(nx).mapped).map_or(0, |nx| self.node(nx).size)
    }

    fn segment_of(&self, id: BlockId) -> Option<ExpandableSegment> {
        self.node(id).expandable.and_then(|i| self.expandable.get(i).cloned().flatten())
    }

    /// `map_block`: maps the pages covering the first `size` bytes of the unmapped block `id` (rounded up
    /// to whole pages by `ExpandableSegment::map`), splits off the rest, merges with free neighbours.
    fn map_block(&mut self, id: BlockId, size: u64) -> bool {
        let Some(seg) = self.segment_of(id) else { return false };
        let addr = self.node(id).addr;
        let begin = (addr - seg.base) / seg.page_bytes;
        let end = (addr + size - seg.base).div_ceil(seg.page_bytes);
        // Whole pages, up to the end of the unmapped range: PyTorch's own maps leave only whole pages unmapped, but a
        // recorded layout may not (a range mapped at another page size, a reservation cut where the next one began),
        // and its narrower range is mapped to its end rather than refused on a device with room.
        let mapped_size = ((end - begin) * seg.page_bytes).min(self.node(id).size);
        if self.total_allocated_memory.saturating_add(mapped_size) > self.device_limit() {
            self.refused_rounding_bytes = mapped_size.saturating_sub(size);
            return false;
        }
        self.remove_unmapped(id);
        self.node_mut(id).mapped = true;
        if mapped_size < self.node(id).size {
            let n = self.node(id).clone();
            let remaining = self.new_node(Node {
                addr: addr + mapped_size,
                size: n.size - mapped_size,
                requested: 0,
                mapped: false,
                prev: Some(id),
                next: n.next,
                ..n
            });
            if let Some(nx) = n.next {
                self.node_mut(nx).prev = Some(remaining);
            }
            self.insert_unmapped(remaining);
            let nm = self.node_mut(id);
            nm.next = Some(remaining);
            nm.size = mapped_size;
        }
        let (prev, small) = (self.node(id).prev, self.node(id).pool == Pool::Small);
        self.try_merge_blocks(id, prev);
        let next = self.node(id).next;
        self.try_merge_blocks(id, next);
        self.insert_free(id);
        self.total_allocated_memory += mapped_size;
        self.stats.reserved_bytes.increase(small, mapped_size);
        self.stats.num_device_alloc += 1;
        self.events.push(DeviceEvent { action: Action::SegmentMap, addr, size_bytes: mapped_size });
        true
    }

    /// `unmap_block`: unmaps the whole pages inside the free block `id` (`ExpandableSegment::unmap` rounds
    /// inwards); the partial pages at either end stay as free mapped blocks.
    pub(super) fn unmap_block(&mut self, id: BlockId) {
        let Some(seg) = self.segment_of(id) else { return };
        let (addr, size) = (self.node(id).addr, self.node(id).size);
        let begin = (addr - seg.base).div_ceil(seg.page_bytes);
        let end = (addr + size - seg.base) / seg.page_bytes;
        if begin >= end {
            return;
        }
        let unmapped_ptr = seg.base + begin * seg.page_bytes;
        let unmapped_size = (end - begin) * seg.page_bytes;
        self.remove_free(id);
        let n = self.node(id).clone();
        let before_size = unmapped_ptr - addr;
        if before_size > 0 {
            let before = self.new_node(Node { size: before_size, requested: 0, prev: n.prev, next: Some(id), ..n.clone() });
            if let Some(p) = n.prev {
                self.node_mut(p).next = Some(before);
            }
            self.node_mut(id).prev = Some(before);
            self.insert_free(before);
        }
        let after_size = size - before_size - unmapped_size;
        if after_size > 0 {
            let after = self.new_node(Node {
                addr: unmapped_ptr + unmapped_size,
                size: after_size,
                requested: 0,
                prev: Some(id),
                next: n.next,
                ..n.clone()
            });
            if let Some(nx) = n.next {
                self.node_mut(nx).prev = Some(after);
            }
            self.node_mut(id).next = Some(after);
            self.insert_free(after);
        }
        {
            let nm = self.node_mut(id);
            nm.addr = unmapped_ptr;
            nm.size = unmapped_size;
            nm.mapped = false;
        }
        let prev = self.node(id).prev;
        self.try_merge_blocks(id, prev);
        let next = self.node(id).next;
        self.try_merge_blocks(id, next);
        self.insert_unmapped(id);
        self.total_allocated_memory -= unmapped_size;
        self.stats.reserved_bytes.decrease(n.pool == Pool::Small, unmapped_size);
        self.stats.num_device_free += 1;
        self.events.push(DeviceEvent { action: Action::SegmentUnmap, addr: unmapped_ptr, size_bytes: unmapped_size });
    }

    /// `release_expandable_segment`: drops a segment whose whole range is unmapped.
    pub(super) fn release_expandable_segment(&mut self, id: BlockId) {
        if let Some(index) = self.node(id).expandable
            && let Some(slot) = self.expandable.get_mut(index)
        {
            *slot = None;
        }
        self.remove_unmapped(id);
        self.delete_node(id);
    }
}
