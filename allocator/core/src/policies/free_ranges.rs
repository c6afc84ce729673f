//! Ordered free ranges: the machinery best fit and first fit share. Free runs are kept by offset (for
//! coalescing with both neighbours on free) and in a [`FitIndex`] that answers "which run?" — by size for
//! best fit, by address for first fit. Live allocations sit in a slot table.

use std::collections::BTreeMap;
use std::fmt;

use crate::granularity::{self, GranularityGuard};
use crate::policy::rounded;
use crate::report::allocation_ranges;
use crate::request::align_down;
use crate::slots::SlotTable;
use crate::{Allocation, FreeSpace, OwnerId, PolicyConfig, PolicyReport, RangeReport, RangeState, Request, ResourceKind, Result};

/// Chooses the free run for a request.
pub trait FitIndex: fmt::Debug + Send {
    /// The policy's name.
    const NAME: &'static str;

    /// An empty index for a policy with these settings.
    fn with_config(config: &PolicyConfig) -> Self;

    /// Adds the free run `[offset, offset + size)`.
    fn insert(&mut self, offset: u64, size: u64);

    /// Removes a run added by `insert`.
    fn remove(&mut self, offset: u64, size: u64);

    /// The run to serve a request of `size` bytes aligned to `align` from, as `(run offset, run size, placed offset)`:
    /// `place(run offset, run size)` says where in a run the request would go, if anywhere.
    fn find(&self, size: u64, align: u64, place: impl FnMut(u64, u64) -> Option<u64>) -> Option<(u64, u64, u64)>;

    /// The size of the largest run (0 when none is free): no request larger than it can be served.
    fn largest_run(&self) -> u64;
}

#[derive(Clone, Copy, Debug)]
struct Live {
    offset: u64,
    size_bytes: u64,
    footprint_bytes: u64,
}

/// A policy over ordered free ranges; [`BestFit`](super::BestFit) and [`FirstFit`](super::FirstFit) are
/// this with their index.
#[derive(Debug)]
pub struct FreeRangePolicy<I: FitIndex> {
    owner: OwnerId,
    capacity_bytes: u64,
    min_align: u64,
    by_offset: BTreeMap<u64, u64>,
    index: I,
    live: SlotTable<Live>,
    /// Bytes in the free runs.
    free_bytes: u64,
    guard: Option<GranularityGuard>,
}

impl<I: FitIndex> FreeRangePolicy<I> {
    /// A policy over `[0, capacity_bytes)` with the default settings.
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_config(capacity_bytes, &PolicyConfig::default()).expect("the default configuration is valid")
    }

    /// A policy over `[0, capacity_bytes)`; the capacity is rounded down to `min_align_bytes`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for invalid settings.
    pub fn with_config(capacity_bytes: u64, config: &PolicyConfig) -> Result<Self> {
        config.validate()?;
        let capacity_bytes = align_down(capacity_bytes, config.min_align_bytes);
        let mut policy = Self {
            owner: OwnerId::fresh(),
            capacity_bytes,
            min_align: config.min_align_bytes,
            by_offset: BTreeMap::new(),
            index: I::with_config(config),
            live: SlotTable::default(),
            free_bytes: 0,
            guard: config.granularity().map(GranularityGuard::new),
        };
        if capacity_bytes > 0 {
            policy.insert_run(0, capacity_bytes);
        }
        Ok(policy)
    }

    fn insert_run(&mut self, offset: u64, size: u64) {
        self.by_offset.insert(offset, size);
        self.index.insert(offset, size);
        self.free_bytes += size;
    }

    fn remove_run(&mut self, offset: u64, size: u64) {
        self.by_offset.remove(&offset);
        self.index.remove(offset, size);
        self.free_bytes -= size;
    }

    /// Returns `[offset, offset + size)` to the free runs, merged with free neighbours.
    fn release(&mut self, mut offset: u64, mut size: u64) {
        if let Some((&prev_offset, &prev_size)) = self.by_offset.range(..offset).next_back()
            && prev_offset + prev_size == offset
        {
            self.remove_run(prev_offset, prev_size);
            offset = prev_offset;
            size += prev_size;
        }
        if let Some(&next_size) = self.by_offset.get(&(offset + size)) {
            self.remove_run(offset + size, next_size);
            size += next_size;
        }
        self.insert_run(offset, size);
    }

    pub(crate) fn allocate_from_runs(&mut self, request: Request) -> Option<Allocation> {
        let (size, align) = rounded(request, self.min_align)?;
        let kind: ResourceKind = request.kind();
        let guard = self.guard.as_ref();
        let (run_offset, run_size, offset) = self.index.find(size, align, |run_offset, run_size| {
            granularity::place(guard, run_offset, run_offset + run_size, size, align, kind)
        })?;
        Some(self.take(run_offset, run_size, offset, size, request))
    }

    pub(crate) fn allocate_at_offset(&mut self, request: Request, offset: u64) -> Option<Allocation> {
        let (size, align) = rounded(request, self.min_align)?;
        let (&run_offset, &run_size) = self.by_offset.range(..=offset).next_back()?;
        let run_end = run_offset + run_size;
        let placed = granularity::place(self.guard.as_ref(), offset, run_end, size, align, request.kind());
        (placed == Some(offset)).then(|| self.take(run_offset, run_size, offset, size, request))
    }

    /// Turns `[offset, offset + size)` of the free run `[run_offset, run_offset + run_size)` into an allocation
    /// for `request`, the rest of the run staying free.
    fn take(&mut self, run_offset: u64, run_size: u64, offset: u64, size: u64, request: Request) -> Allocation {
        let kind: ResourceKind = request.kind();
        self.remove_run(run_offset, run_size);
        if offset > run_offset {
            self.insert_run(run_offset, offset - run_offset);
        }
        let run_end = run_offset + run_size;
        if run_end > offset + size {
            self.insert_run(offset + size, run_end - offset - size);
        }
        if let Some(guard) = &mut self.guard {
            guard.insert(offset, size, kind);
        }
        let id = self.live.insert(Live { offset, size_bytes: request.size_bytes(), footprint_bytes: size });
        Allocation::from_parts(self.owner, id, offset, request.size_bytes(), (offset, size), kind)
    }

    pub(crate) fn free_to_runs(&mut self, allocation: Allocation) -> Result<()> {
        let live = self.live.take_live(self.owner, &allocation, I::NAME, |live| live.offset)?;
        if let Some(guard) = &mut self.guard {
            guard.remove(live.offset, live.footprint_bytes);
        }
        self.release(live.offset, live.footprint_bytes);
        Ok(())
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity_bytes
    }

    pub(crate) fn live_count(&self) -> usize {
        self.live.len()
    }

    /// The largest free run: what a heap reads to skip this block for a larger request.
    pub(crate) fn largest_run(&self) -> u64 {
        self.index.largest_run()
    }

    /// The free space, from the runs' count and the index's largest (no layout built).
    pub(crate) fn free_space(&self) -> FreeSpace {
        FreeSpace { free_bytes: self.free_bytes, largest_free_run_bytes: self.index.largest_run(), retired_bytes: 0 }
    }

    pub(crate) fn layout(&self) -> PolicyReport {
        let mut ranges: Vec<RangeReport> =
            self.by_offset.iter().map(|(&offset, &size)| RangeReport::unowned(offset, size, RangeState::Free)).collect();
        for (id, live) in self.live.iter() {
            allocation_ranges(id, (live.offset, live.footprint_bytes), (live.offset, live.size_bytes), &mut ranges);
        }
        ranges.sort_unstable_by_key(|range| range.offset);
        PolicyReport { policy: I::NAME, capacity_bytes: self.capacity_bytes, ranges }
    }
}

/// Test layout shared by the fit policies: ten 1 KiB blocks in a 10 KiB range, then frees that leave holes of
/// 3 KiB at 0, 1 KiB at 4 KiB, 1 KiB at 6 KiB and 2 KiB at 8 KiB.
#[cfg(test)]
pub(crate) fn punch_holes(policy: &mut dyn crate::Policy) {
    let blocks: Vec<_> = (0..10).map(|_| policy.allocate(Request::new(1024, 1).expect("valid")).expect("fits")).collect();
    for index in [0, 1, 2, 4, 6, 8, 9] {
        policy.free(blocks[index]).expect("live");
    }
}

/// Implements [`Policy`](crate::Policy) for a `FreeRangePolicy` alias.
macro_rules! free_range_policy {
    ($index:ty) => {
        impl $crate::Policy for $crate::policies::free_ranges::FreeRangePolicy<$index> {
            fn name(&self) -> &'static str {
                <$index as $crate::policies::free_ranges::FitIndex>::NAME
            }

            fn capacity_bytes(&self) -> u64 {
                self.capacity()
            }

            fn allocate(&mut self, request: $crate::Request) -> Option<$crate::Allocation> {
                self.allocate_from_runs(request)
            }

            fn allocate_at(&mut self, request: $crate::Request, offset: u64) -> Option<$crate::Allocation> {
                self.allocate_at_offset(request, offset)
            }

            fn free(&mut self, allocation: $crate::Allocation) -> $crate::Result<()> {
                self.free_to_runs(allocation)
            }

            fn live_allocations(&self) -> usize {
                self.live_count()
            }

            fn largest_free_bound_bytes(&self) -> u64 {
                self.largest_run()
            }

            fn report(&self) -> $crate::PolicyReport {
                self.layout()
            }

            fn free_space(&self) -> $crate::FreeSpace {
                self.free_space()
            }
        }
    };
}
pub(crate) use free_range_policy;
