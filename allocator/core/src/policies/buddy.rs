//! Buddy allocation: blocks of power-of-two sizes, split in halves on demand and merged with their buddy
//! (the other half) when both are free. Any capacity works: it is cut into power-of-two top blocks, largest
//! first, each aligned to its own size, so every block is naturally aligned to its size.
//!
//! A request takes the smallest block that holds it (size and alignment rounded up to a power of two, and
//! to the granularity page when the granularity rule is on, so blocks of different kinds never share a
//! page); among blocks of the smallest available order, the lowest address. Internal waste is the
//! difference to the power of two, up to half the block: the price of O(log n) merging without a free list
//! search.

use std::collections::BTreeSet;

use crate::policy::rounded;
use crate::report::allocation_ranges;
use crate::request::align_down;
use crate::slots::SlotTable;
use crate::{Allocation, FreeSpace, OwnerId, Policy, PolicyConfig, PolicyReport, RangeReport, RangeState, Request, Result};

#[derive(Clone, Copy, Debug)]
struct Live {
    offset: u64,
    order: u32,
    size_bytes: u64,
}

/// The buddy policy.
#[derive(Clone, Debug)]
pub struct Buddy {
    owner: OwnerId,
    capacity_bytes: u64,
    /// log2 of the smallest block a request may take (min alignment, or granularity when on).
    min_order: u32,
    /// Top blocks as (offset, order), by offset.
    tops: Vec<(u64, u32)>,
    /// Free block offsets per order.
    free: Vec<BTreeSet<u64>>,
    /// Bit `k` set when `free[k]` is not empty.
    non_empty: u64,
    /// Bytes in the free blocks.
    free_bytes: u64,
    live: SlotTable<Live>,
}

impl Buddy {
    /// A buddy policy over `[0, capacity_bytes)` with the default settings.
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_config(capacity_bytes, &PolicyConfig::default()).expect("the default configuration is valid")
    }

    /// A buddy policy over `[0, capacity_bytes)`; the capacity is rounded down to `min_align_bytes`, the
    /// smallest block.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for invalid settings.
    pub fn with_config(capacity_bytes: u64, config: &PolicyConfig) -> Result<Self> {
        config.validate()?;
        let capacity_bytes = align_down(capacity_bytes, config.min_align_bytes);
        let mut buddy = Self {
            owner: OwnerId::fresh(),
            capacity_bytes,
            min_order: config.min_align_bytes.max(config.granularity_bytes).trailing_zeros(),
            tops: Vec::new(),
            free: vec![BTreeSet::new(); 64],
            non_empty: 0,
            free_bytes: 0,
            live: SlotTable::default(),
        };
        let mut offset = 0;
        for order in (0..64).rev() {
            if capacity_bytes & (1 << order) != 0 {
                buddy.tops.push((offset, order));
                buddy.push_free(offset, order);
                offset += 1 << order;
            }
        }
        Ok(buddy)
    }

    fn push_free(&mut self, offset: u64, order: u32) {
        self.free[order as usize].insert(offset);
        self.non_empty |= 1 << order;
        self.free_bytes += 1 << order;
    }

    fn take_free(&mut self, offset: u64, order: u32) -> bool {
        let set = &mut self.free[order as usize];
        let taken = set.remove(&offset);
        if set.is_empty() {
            self.non_empty &= !(1 << order);
        }
        if taken {
            self.free_bytes -= 1 << order;
        }
        taken
    }

    /// The order of the top block containing `offset`.
    fn top_order(&self, offset: u64) -> u32 {
        let index = self.tops.partition_point(|&(top, _)| top <= offset) - 1;
        self.tops[index].1
    }
}

impl Policy for Buddy {
    fn name(&self) -> &'static str {
        "buddy"
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn allocate(&mut self, request: Request) -> Option<Allocation> {
        let (size, align) = rounded(request, 1)?;
        let block = size.max(align).checked_next_power_of_two()?;
        let order = block.trailing_zeros().max(self.min_order);
        let candidates = self.non_empty & u64::MAX.checked_shl(order).unwrap_or(0);
        if candidates == 0 {
            return None;
        }
        let mut found = candidates.trailing_zeros();
        let offset = *self.free[found as usize].first().expect("non-empty order");
        self.take_free(offset, found);
        while found > order {
            found -= 1;
            self.push_free(offset + (1 << found), found);
        }
        let id = self.live.insert(Live { offset, order, size_bytes: request.size_bytes() });
        Some(Allocation::from_parts(self.owner, id, offset, request.size_bytes(), (offset, 1 << order), request.kind()))
    }

    fn free(&mut self, allocation: Allocation) -> Result<()> {
        let Live { mut offset, mut order, .. } = self.live.take_live(self.owner, &allocation, self.name(), |live| live.offset)?;
        let top_order = self.top_order(offset);
        while order < top_order && self.take_free(offset ^ (1 << order), order) {
            offset &= !(1 << order);
            order += 1;
        }
        self.push_free(offset, order);
        Ok(())
    }

    fn live_allocations(&self) -> usize {
        self.live.len()
    }

    /// The largest free block is of the highest non-empty order: nothing larger can be served.
    fn largest_free_bound_bytes(&self) -> u64 {
        if self.non_empty == 0 { 0 } else { 1 << (63 - self.non_empty.leading_zeros()) }
    }

    /// Free blocks are reported one by one (buddies that cannot merge stay apart): the largest free run is the
    /// largest free block.
    fn free_space(&self) -> FreeSpace {
        FreeSpace { free_bytes: self.free_bytes, largest_free_run_bytes: self.largest_free_bound_bytes(), retired_bytes: 0 }
    }

    fn report(&self) -> PolicyReport {
        let mut ranges = Vec::new();
        for (order, set) in self.free.iter().enumerate() {
            ranges.extend(set.iter().map(|&offset| RangeReport::unowned(offset, 1 << order, RangeState::Free)));
        }
        for (id, live) in self.live.iter() {
            allocation_ranges(id, (live.offset, 1 << live.order), (live.offset, live.size_bytes), &mut ranges);
        }
        ranges.sort_unstable_by_key(|range| range.offset);
        PolicyReport { policy: self.name(), capacity_bytes: self.capacity_bytes, ranges }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    #[test]
    fn sizes_round_to_powers_of_two() {
        // (capacity, request size, align) -> (offset, footprint)
        let cases = [
            (1 << 20, 1, 1, Some((0, 256))),
            (1 << 20, 300, 1, Some((0, 512))),
            (1 << 20, 300, 4096, Some((0, 4096))),
            (1 << 20, 1 << 20, 1, Some((0, 1 << 20))),
            (1 << 20, (1 << 20) + 1, 1, None),
            (3584 * MIB, 150 * MIB, 1, Some((3072 * MIB, 256 * MIB))), // best fit: the 512 MiB top block
            (3584 * MIB, 1024 * MIB, 1, Some((2048 * MIB, 1024 * MIB))),
            (3584 * MIB, 2049 * MIB, 1, None),
        ];
        for (capacity, size, align, expected) in cases {
            let mut buddy = Buddy::new(capacity);
            let placed = buddy.allocate(Request::new(size, align).unwrap()).map(|a| (a.offset(), a.footprint_bytes()));
            assert_eq!(placed, expected, "capacity {capacity} size {size} align {align}");
        }
    }

    #[test]
    fn buddies_merge_back_and_tops_stay_apart() {
        let mut buddy = Buddy::new(3 << 20); // tops: 2 MiB at 0, 1 MiB at 2 MiB
        let halves: Vec<_> = (0..3).map(|_| buddy.allocate(Request::new(1 << 20, 1).unwrap()).unwrap()).collect();
        assert_eq!(
            halves.iter().map(Allocation::offset).collect::<Vec<_>>(),
            [2 << 20, 0, 1 << 20],
            "the 1 MiB top block fits best"
        );
        for half in halves {
            buddy.free(half).unwrap();
        }
        let free: Vec<_> = buddy.report().ranges.iter().map(|r| (r.offset, r.size_bytes, r.state)).collect();
        assert_eq!(free, [(0, 2 << 20, RangeState::Free), (2 << 20, 1 << 20, RangeState::Free)]);
        // 3 MiB are free, but no single block holds 1.5 MiB + 1 MiB.
        assert!(buddy.allocate(Request::new(3 << 20, 1).unwrap()).is_none());
    }
}
