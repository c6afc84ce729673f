//! Giving cached memory back to the driver: `release_block` (cudaFree of a whole free segment),
//! `release_available_cached_blocks` (free oversize blocks, only with `max_split_size`),
//! `release_cached_blocks` / `release_blocks` (every wholly free segment, every free expandable page: the
//! last resort before an out-of-memory error, and `emptyCache()`), and
//! `garbage_collect_cached_blocks` (`garbage_collection_threshold`).

use super::{BlockId, CachingAllocator, DeviceEvent};
use crate::snapshot::{Action, Pool};

impl CachingAllocator {
    /// `release_block`: cudaFree of a free, unsplit, non-expandable block (a whole segment).
    fn release_block(&mut self, id: BlockId) {
        let n = self.node(id).clone();
        let small = n.pool == Pool::Small;
        self.stats.num_device_free += 1;
        self.events.push(DeviceEvent { action: Action::SegmentFree, addr: n.addr, size_bytes: n.size });
        self.total_allocated_memory -= n.size;
        self.stats.segment.decrease(small, 1);
        self.stats.reserved_bytes.decrease(small, n.size);
        if n.size >= self.max_split_size() {
            self.stats.oversize_segments.decrease(1);
        }
        self.remove_free(id);
        self.segments.remove(&n.addr);
        self.segment_owners.remove(&n.addr);
        self.driver.note_freed(n.addr, n.size);
        self.delete_node(id);
    }

    fn releasable(&self, id: BlockId) -> bool {
        self.node(id).expandable.is_none() && !self.is_split(id)
    }

    /// `release_available_cached_blocks`: with a `max_split_size`, frees the smallest oversize cached block
    /// that covers the request, or else the largest ones until enough bytes are freed.
    pub(super) fn release_available_cached_blocks(&mut self, pool: (usize, Pool), stream: u64, size: u64) -> bool {
        let Some(max_split) = self.conf.max_split_size else { return false };
        let key_size = size.max(max_split);
        let key = (stream, key_size, 0, 0);
        let found = self.pool(pool).blocks.range(key..).next().copied();
        match found {
            Some((s, _, _, id)) if s == stream => {
                if self.releasable(id) {
                    self.release_block(id);
                }
                true
            }
            _ => {
                // No single block is large enough: free oversize blocks, largest first.
                let candidates: Vec<(u64, u64, BlockId)> =
                    self.pool(pool).blocks.range(..key).rev().map(|&(s, sz, _, id)| (s, sz, id)).collect();
                if candidates.is_empty() {
                    return false;
                }
                let mut released = 0;
                for (s, sz, id) in candidates {
                    if released >= key_size || sz < max_split || s != stream {
                        break;
                    }
                    released += sz;
                    if self.releasable(id) {
                        self.release_block(id);
                    }
                }
                released >= key_size
            }
        }
    }

    /// `release_cached_blocks`: synchronizes, then `release_blocks` on the large and the small pool, then on the
    /// small and the large pool of each private pool that is gone (`graph_pools_freeable`).
    pub(super) fn release_cached_blocks(&mut self) -> bool {
        self.stats.num_sync_all_streams += 1;
        self.release_blocks((0, Pool::Large));
        self.release_blocks((0, Pool::Small));
        for owner in 1..self.pools.len() {
            if self.pools[owner].freeable {
                self.release_blocks((owner, Pool::Small));
                self.release_blocks((owner, Pool::Large));
            }
        }
        true
    }

    /// `release_cached_blocks` for the private pool `id` (`emptyCache(id)`, what deleting a `torch.cuda.MemPool`
    /// does): synchronizes, then `release_blocks` on its small and its large pool, once it is gone
    /// ([`CachingAllocator::set_freeable`]).
    pub fn release_pool(&mut self, id: (i64, i64)) {
        let Some(owner) = self.pools.iter().position(|memory_pool| memory_pool.id == id && id != (0, 0)) else { return };
        self.stats.num_sync_all_streams += 1;
        if self.pools[owner].freeable {
            self.release_blocks((owner, Pool::Small));
            self.release_blocks((owner, Pool::Large));
        }
    }

    /// `release_blocks`: frees every unsplit cached block and unmaps the free pages of expandable segments
    /// (dropping segments that end up wholly unmapped), in the pool's (stream, size, address) order.
    fn release_blocks(&mut self, pool: (usize, Pool)) {
        let ids: Vec<BlockId> = self.pool(pool).blocks.iter().map(|k| k.3).collect();
        let mut to_unmap = Vec::new();
        for id in ids {
            if self.node(id).expandable.is_some() {
                to_unmap.push(id);
            } else if !self.is_split(id) {
                self.release_block(id);
            }
        }
        for id in to_unmap {
            self.unmap_block(id);
            if !self.node(id).mapped && !self.is_split(id) {
                self.release_expandable_segment(id);
            }
        }
    }

    /// `garbage_collect_cached_blocks`: when reserved memory exceeds `garbage_collection_threshold` of
    /// the allowed memory, frees unsplit large-pool cached blocks older than the average age (age = calls
    /// of `get_free_block` since the block was cached) until the excess is reclaimed.
    pub(super) fn garbage_collect_cached_blocks(&mut self) {
        let Some(cap) = self.capacity_bytes else { return };
        let gc_threshold = (self.conf.garbage_collection_threshold * cap as f64) as u64;
        if self.total_allocated_memory <= gc_threshold {
            return;
        }
        let target = self.total_allocated_memory - gc_threshold;
        let count = self.pools[0].large.get_free_blocks_call_count;
        let age = |a: &CachingAllocator, id: BlockId| (count - a.node(id).gc_base) as f64;
        // The unsplit cached blocks, in the pool's order; each pass below walks them as PyTorch walks the pool, and
        // a block released leaves the list.
        let mut freeable: Vec<BlockId> =
            self.pools[0].large.blocks.iter().map(|k| k.3).filter(|&id| self.releasable(id)).collect();
        let mut total_age: f64 = freeable.iter().map(|&id| age(self, id)).sum();
        let mut reclaimed = 0;
        let mut block_freed = true;
        while reclaimed < target && block_freed && !freeable.is_empty() {
            let age_threshold = total_age / freeable.len() as f64;
            block_freed = false;
            let mut kept = Vec::with_capacity(freeable.len());
            for id in freeable {
                let a = age(self, id);
                if a >= age_threshold {
                    block_freed = true;
                    reclaimed += self.node(id).size;
                    total_age -= a;
                    self.release_block(id);
                } else {
                    kept.push(id);
                }
            }
            freeable = kept;
        }
    }
}
