//! Expandable segments (`expandable_segments:True`, Note [Expandable Segments] in
//! `CUDACachingAllocator.cpp`): one reserved virtual range per stream and pool, backed by physical pages
//! (2 MiB for the small pool, 20 MiB for the large pool) that are mapped on demand at the lowest address
//! that fits (`find_expandable_block`, `map_block`, `ExpandableSegment::map`) and unmapped when the cache
//! is released (`unmap_block`, `ExpandableSegment::unmap`). PyTorch counts every map as a device
//! allocation and every unmap as a device free (`num_device_alloc` / `num_device_free`).

use super::{
    BlockId, CachingAllocator, DeviceEvent, EXPANDABLE_VIRTUAL_BYTES, ExpandableSegment, LARGE_BUFFER_BYTES, Node,
    SMALL_BUFFER_BYTES,
};
use crate::snapshot::{Action, Pool};

impl CachingAllocator {
    /// `try_allocate_expandable_block`: maps pages until a free block of at least `size` bytes exists at
    /// the lowest usable address, and takes it out of the pool.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        pool: Pool,
        stream: u64,
        size: u64,
        base_hint: Option<u64>,
    ) -> Option<BlockId> {
        let mut candidate = self.find_expandable_block(pool, stream, size, base_hint);
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
    fn find_expandable_block(&mut self, pool: Pool, stream: u64, size: u64, base_hint: Option<u64>) -> BlockId {
        let unmapped: Vec<BlockId> =
            self.pool(pool).unmapped.range((stream, 0, 0)..).take_while(|k| k.0 == stream).map(|k| k.2).collect();
        for mut c in unmapped {
            if let Some(p) = self.node(c).prev
                && !self.node(p).active
            {
                c = p;
            }
            if self.has_available_address_space(c, size) {
                return c;
            }
        }
        let page_bytes = if pool == Pool::Small { SMALL_BUFFER_BYTES } else { LARGE_BUFFER_BYTES };
        let base = self.choose_base(base_hint, EXPANDABLE_VIRTUAL_BYTES);
        self.expandable.push(Some(ExpandableSegment { base, size: EXPANDABLE_VIRTUAL_BYTES, page_bytes }));
        let index = self.expandable.len() - 1;
        let id = self.new_node(Node::free(base, EXPANDABLE_VIRTUAL_BYTES, stream, pool, false, Some(index)));
        self.insert_unmapped(id);
        id
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
        let mapped_size = (end - begin) * seg.page_bytes;
        if mapped_size > self.node(id).size || self.total_allocated_memory.saturating_add(mapped_size) > self.device_limit() {
            return false;
        }
        self.remove_unmapped(id);
        self.node_mut(id).mapped = true;
        if mapped_size < self.node(id).size {
            let n = self.node(id).clone();
            let remaining = self.new_node(Node {
                addr: addr + mapped_size,
                size: n.size - mapped_size,
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
            let before = self.new_node(Node { size: before_size, prev: n.prev, next: Some(id), ..n.clone() });
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
