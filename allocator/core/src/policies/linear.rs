//! Linear allocation: a bump pointer, in three modes (as VMA's linear pools).
//!
//! - **bump** ("free at once"): frees only mark bytes retired; the range resets when the last live
//!   allocation is freed. The cheapest allocator there is, for per-frame or per-step scratch memory.
//! - **stack**: frees at the top pop it, and every retired allocation below it; frees elsewhere retire.
//! - **ring**: allocations wrap around to the start of the range once the end is reached; freeing the
//!   oldest allocation (and the newest) reclaims space, so first-in first-out lifetimes (streaming uploads,
//!   per-frame rings) reuse memory forever.
//!
//! Alignment gaps between consecutive allocations are front padding of the later allocation. Retired bytes
//! are reported as [`RangeState::Retired`]: free in the accounting sense but not reusable yet.

use std::collections::VecDeque;

use crate::granularity::{self, GranularityGuard};
use crate::policy::{check_owner, not_live, rounded};
use crate::report::allocation_ranges;
use crate::request::align_down;
use crate::{
    Allocation, AllocationId, FreeSpace, OwnerId, Policy, PolicyConfig, PolicyReport, RangeReport, RangeState, Request,
    ResourceKind, Result,
};

/// How a [`Linear`] policy reclaims freed memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum LinearMode {
    /// Reset when everything is freed.
    Bump,
    /// Last in, first out.
    Stack,
    /// First in, first out, wrapping around.
    Ring,
}

impl LinearMode {
    /// The name of the linear policy in this mode (`linear-bump`, …): the name table's entry for it.
    pub fn policy_name(self) -> &'static str {
        match self {
            Self::Bump => "linear-bump",
            Self::Stack => "linear-stack",
            Self::Ring => "linear-ring",
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    seq: u64,
    footprint_offset: u64,
    offset: u64,
    footprint_end: u64,
    size_bytes: u64,
    live: bool,
}

/// The linear policy.
#[derive(Clone, Debug)]
pub struct Linear {
    owner: OwnerId,
    mode: LinearMode,
    capacity_bytes: u64,
    min_align: u64,
    /// In allocation order (for bump and stack modes also address order).
    entries: VecDeque<Entry>,
    next_seq: u64,
    live: usize,
    /// Footprint bytes of the live allocations.
    live_footprint_bytes: u64,
    guard: Option<GranularityGuard>,
}

impl Linear {
    /// A linear policy over `[0, capacity_bytes)` with the default settings.
    pub fn new(capacity_bytes: u64, mode: LinearMode) -> Self {
        Self::with_config(capacity_bytes, mode, &PolicyConfig::default()).expect("the default configuration is valid")
    }

    /// A linear policy over `[0, capacity_bytes)`; the capacity is rounded down to `min_align_bytes`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for invalid settings.
    pub fn with_config(capacity_bytes: u64, mode: LinearMode, config: &PolicyConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            owner: OwnerId::fresh(),
            mode,
            capacity_bytes: align_down(capacity_bytes, config.min_align_bytes),
            min_align: config.min_align_bytes,
            entries: VecDeque::new(),
            next_seq: 0,
            live: 0,
            live_footprint_bytes: 0,
            guard: config.granularity().map(GranularityGuard::new),
        })
    }

    /// One past the newest allocation.
    fn top(&self) -> u64 {
        self.entries.back().map_or(0, |entry| entry.footprint_end)
    }

    /// Where the oldest allocation starts.
    fn head(&self) -> u64 {
        self.entries.front().map_or(0, |entry| entry.footprint_offset)
    }

    /// Whether the newest allocation lies below the oldest one (the ring has wrapped).
    fn wrapped(&self) -> bool {
        !self.entries.is_empty() && self.top() <= self.head()
    }

    /// The runs a new allocation may use, in the order they are tried.
    fn usable_runs(&self) -> [(u64, u64); 2] {
        let (top, head) = (self.top(), self.head());
        match self.mode {
            LinearMode::Bump | LinearMode::Stack => [(top, self.capacity_bytes), (0, 0)],
            LinearMode::Ring if self.entries.is_empty() => [(0, self.capacity_bytes), (0, 0)],
            LinearMode::Ring if self.wrapped() => [(top, head), (0, 0)],
            LinearMode::Ring => [(top, self.capacity_bytes), (0, head)],
        }
    }

    fn reclaim(&mut self) {
        match self.mode {
            LinearMode::Bump => {
                if self.live == 0 {
                    self.entries.clear();
                }
            }
            LinearMode::Stack | LinearMode::Ring => {
                while self.entries.back().is_some_and(|entry| !entry.live) {
                    self.entries.pop_back();
                }
                if self.mode == LinearMode::Ring {
                    while self.entries.front().is_some_and(|entry| !entry.live) {
                        self.entries.pop_front();
                    }
                }
            }
        }
    }
}

impl Policy for Linear {
    fn name(&self) -> &'static str {
        self.mode.policy_name()
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn allocate(&mut self, request: Request) -> Option<Allocation> {
        let (size, align) = rounded(request, self.min_align)?;
        let kind: ResourceKind = request.kind();
        let (start, offset) = self
            .usable_runs()
            .into_iter()
            .find_map(|(start, end)| Some((start, granularity::place(self.guard.as_ref(), start, end, size, align, kind)?)))?;
        if let Some(guard) = &mut self.guard {
            guard.insert(offset, size, kind);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.live += 1;
        self.live_footprint_bytes += offset + size - start;
        self.entries.push_back(Entry {
            seq,
            footprint_offset: start,
            offset,
            footprint_end: offset + size,
            size_bytes: request.size_bytes(),
            live: true,
        });
        Some(Allocation::from_parts(
            self.owner,
            AllocationId(seq),
            offset,
            request.size_bytes(),
            (start, offset + size - start),
            kind,
        ))
    }

    fn free(&mut self, allocation: Allocation) -> Result<()> {
        check_owner(self.owner, &allocation, self.name())?;
        let seq = allocation.id().0;
        let position = self
            .entries
            .binary_search_by_key(&seq, |entry| entry.seq)
            .ok()
            .filter(|&position| self.entries[position].live && self.entries[position].offset == allocation.offset());
        let Some(position) = position else {
            return Err(not_live(self.owner, &allocation, self.name()));
        };
        let entry = &mut self.entries[position];
        entry.live = false;
        let (offset, footprint_end) = (entry.offset, entry.footprint_end);
        self.live_footprint_bytes -= footprint_end - entry.footprint_offset;
        if let Some(guard) = &mut self.guard {
            guard.remove(offset, footprint_end - offset);
        }
        self.live -= 1;
        self.reclaim();
        Ok(())
    }

    fn live_allocations(&self) -> usize {
        self.live
    }

    /// The usable runs are the free ones; what neither they nor live footprints hold is retired.
    fn free_space(&self) -> FreeSpace {
        let runs = self.usable_runs().map(|(start, end)| end.saturating_sub(start));
        let free_bytes: u64 = runs.iter().sum();
        let retired_bytes = self.capacity_bytes.saturating_sub(free_bytes).saturating_sub(self.live_footprint_bytes);
        FreeSpace { free_bytes, largest_free_run_bytes: runs.into_iter().max().unwrap_or(0), retired_bytes }
    }

    fn report(&self) -> PolicyReport {
        let usable = self.usable_runs();
        let mut entries: Vec<&Entry> = self.entries.iter().collect();
        entries.sort_unstable_by_key(|entry| entry.footprint_offset);
        let mut ranges = Vec::with_capacity(entries.len() + 3);
        let mut cursor = 0;
        let gap = |from: u64, to: u64, ranges: &mut Vec<RangeReport>| {
            if to > from {
                let state = if usable.contains(&(from, to)) { RangeState::Free } else { RangeState::Retired };
                ranges.push(RangeReport::unowned(from, to - from, state));
            }
        };
        for entry in entries {
            gap(cursor, entry.footprint_offset, &mut ranges);
            let footprint = (entry.footprint_offset, entry.footprint_end - entry.footprint_offset);
            if entry.live {
                allocation_ranges(AllocationId(entry.seq), footprint, (entry.offset, entry.size_bytes), &mut ranges);
            } else {
                ranges.push(RangeReport::unowned(footprint.0, footprint.1, RangeState::Retired));
            }
            cursor = entry.footprint_end;
        }
        gap(cursor, self.capacity_bytes, &mut ranges);
        PolicyReport { policy: self.name(), capacity_bytes: self.capacity_bytes, ranges }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(policy: &Linear) -> Vec<(u64, u64, RangeState)> {
        policy.report().ranges.iter().map(|r| (r.offset, r.size_bytes, r.state)).collect()
    }

    fn kilobytes(size: u64) -> Request {
        Request::new(size << 10, 1).unwrap()
    }

    #[test]
    fn modes_reclaim_in_their_order() {
        use RangeState::{Free, Live, Retired};
        // Allocate 1, 2, 3 KiB on 8 KiB, free the first two, then ask for 3 KiB.
        let retired_below = vec![(0, 1024, Retired), (1024, 2048, Retired), (3072, 3072, Live), (6144, 2048, Free)];
        let cases = [
            (LinearMode::Bump, None, retired_below.clone()),
            (LinearMode::Stack, None, retired_below),
            (LinearMode::Ring, Some(0), vec![(0, 3072, Live), (3072, 3072, Live), (6144, 2048, Retired)]),
        ];
        for (mode, expected_offset, expected_states) in cases {
            let mut policy = Linear::new(8 << 10, mode);
            let allocations: Vec<_> = (1..=3).map(|k| policy.allocate(kilobytes(k)).unwrap()).collect();
            policy.free(allocations[0]).unwrap();
            policy.free(allocations[1]).unwrap();
            let placed = policy.allocate(kilobytes(3));
            assert_eq!(placed.map(|a| a.offset()), expected_offset, "{mode:?}");
            assert_eq!(states(&policy), expected_states, "{mode:?}");
        }
    }

    #[test]
    fn stack_pops_retired_entries_below_the_top() {
        let mut policy = Linear::new(8 << 10, LinearMode::Stack);
        let allocations: Vec<_> = (1..=3).map(|k| policy.allocate(kilobytes(k)).unwrap()).collect();
        policy.free(allocations[1]).unwrap();
        policy.free(allocations[2]).unwrap();
        assert_eq!(states(&policy), [(0, 1024, RangeState::Live), (1024, 7168, RangeState::Free)]);
        policy.free(allocations[0]).unwrap();
        assert_eq!(states(&policy), [(0, 8192, RangeState::Free)]);
        assert!(policy.free(allocations[0]).is_err());
    }

    #[test]
    fn alignment_gap_is_front_padding() {
        let mut policy = Linear::new(1 << 20, LinearMode::Bump);
        policy.allocate(Request::new(256, 1).unwrap()).unwrap();
        let aligned = policy.allocate(Request::new(256, 4096).unwrap()).unwrap();
        assert_eq!((aligned.offset(), aligned.footprint_offset(), aligned.footprint_bytes()), (4096, 256, 4096));
    }
}
