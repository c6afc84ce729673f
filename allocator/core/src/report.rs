//! Reports as plain data: what every byte of a range or heap is doing, and the totals derived from it.
//! Drawing is the GUI's business; these types only describe.

use crate::AllocationId;

/// What a run of bytes is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum RangeState {
    /// Bytes a caller asked for and holds.
    Live,
    /// Bytes set aside for a live allocation but not asked for: rounding, alignment, size-class slack
    /// (internal waste).
    Padding,
    /// Bytes the policy can hand out, as one run: adjacent free ranges are reported separately when the
    /// policy cannot serve a request across them (buddy blocks, slab slots).
    Free,
    /// Freed bytes the policy cannot reuse yet (a linear allocator reclaims them only in its own order).
    Retired,
}

/// One run of bytes in a range.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RangeReport {
    /// First byte, relative to the start of the range (block).
    pub offset: u64,
    /// Length in bytes (> 0).
    pub size_bytes: u64,
    /// What the bytes are doing.
    pub state: RangeState,
    /// The allocation the bytes belong to (`Live` and `Padding`).
    pub allocation: Option<AllocationId>,
    /// The allocation's label, where the heap was given one.
    pub label: Option<String>,
}

impl RangeReport {
    /// A run without allocation or label (free or retired).
    pub fn unowned(offset: u64, size_bytes: u64, state: RangeState) -> Self {
        Self { offset, size_bytes, state, allocation: None, label: None }
    }

    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.size_bytes
    }
}

/// The live and padding runs of one allocation, in address order, for building reports.
pub(crate) fn allocation_ranges(id: AllocationId, footprint: (u64, u64), live: (u64, u64), out: &mut Vec<RangeReport>) {
    let (footprint_offset, footprint_bytes) = footprint;
    let (offset, size_bytes) = live;
    let owned = |offset, size_bytes, state| RangeReport { offset, size_bytes, state, allocation: Some(id), label: None };
    if offset > footprint_offset {
        out.push(owned(footprint_offset, offset - footprint_offset, RangeState::Padding));
    }
    out.push(owned(offset, size_bytes, RangeState::Live));
    let tail = footprint_offset + footprint_bytes - (offset + size_bytes);
    if tail > 0 {
        out.push(owned(offset + size_bytes, tail, RangeState::Padding));
    }
}

/// The layout of one contiguous range managed by one policy.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PolicyReport {
    /// The policy's name.
    pub policy: &'static str,
    /// Bytes the policy manages; `ranges` cover `[0, capacity_bytes)` exactly, in address order.
    pub capacity_bytes: u64,
    /// Every byte, in address order.
    pub ranges: Vec<RangeReport>,
}

impl PolicyReport {
    /// Totals over the ranges, with `reserved_bytes = capacity_bytes`.
    pub fn totals(&self) -> Totals {
        Totals::from_ranges(self.capacity_bytes, &self.ranges)
    }
}

/// How many free runs fall in each power-of-two size class.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FreeRunHistogram {
    /// Buckets with at least one run, by increasing size.
    pub buckets: Vec<HistogramBucket>,
}

/// Free runs of `[min_bytes, 2 * min_bytes)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HistogramBucket {
    /// Lower bound of the bucket (a power of two).
    pub min_bytes: u64,
    /// Runs in the bucket.
    pub runs: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl FreeRunHistogram {
    fn add(&mut self, size_bytes: u64) {
        self.add_bucket(HistogramBucket { min_bytes: 1 << (63 - size_bytes.leading_zeros()), runs: 1, bytes: size_bytes });
    }

    /// Adds `runs` runs of `bytes` in total to the bucket starting at `min_bytes`.
    fn add_bucket(&mut self, added: HistogramBucket) {
        match self.buckets.binary_search_by_key(&added.min_bytes, |bucket| bucket.min_bytes) {
            Ok(index) => {
                self.buckets[index].runs += added.runs;
                self.buckets[index].bytes += added.bytes;
            }
            Err(index) => self.buckets.insert(index, added),
        }
    }
}

/// Totals of a policy or heap report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Totals {
    /// Bytes reserved from the memory source (a policy: its capacity).
    pub reserved_bytes: u64,
    /// Bytes callers asked for and hold (requested bytes).
    pub live_bytes: u64,
    /// Bytes set aside for live allocations: `live_bytes` plus padding (rounded bytes).
    pub rounded_bytes: u64,
    /// Free bytes, in runs the policy can serve.
    pub free_bytes: u64,
    /// Freed bytes not reusable yet.
    pub retired_bytes: u64,
    /// The largest run of free bytes.
    pub largest_free_run_bytes: u64,
    /// Live allocations.
    pub live_allocations: u64,
    /// Free runs.
    pub free_runs: u64,
    /// Free runs by size.
    pub free_run_histogram: FreeRunHistogram,
}

impl Totals {
    /// Sums `ranges` of a space of `reserved_bytes`.
    pub fn from_ranges<'a>(reserved_bytes: u64, ranges: impl IntoIterator<Item = &'a RangeReport>) -> Self {
        let mut totals = Self { reserved_bytes, ..Self::default() };
        for range in ranges {
            totals.add_range(range);
        }
        totals
    }

    fn add_range(&mut self, range: &RangeReport) {
        match range.state {
            RangeState::Live => {
                self.live_bytes += range.size_bytes;
                self.rounded_bytes += range.size_bytes;
                self.live_allocations += 1;
            }
            RangeState::Padding => self.rounded_bytes += range.size_bytes,
            RangeState::Free => {
                self.free_bytes += range.size_bytes;
                self.free_runs += 1;
                self.largest_free_run_bytes = self.largest_free_run_bytes.max(range.size_bytes);
                self.free_run_histogram.add(range.size_bytes);
            }
            RangeState::Retired => self.retired_bytes += range.size_bytes,
        }
    }

    /// Adds the totals of another part (a block of a heap).
    pub fn merge(&mut self, other: &Self) {
        self.reserved_bytes += other.reserved_bytes;
        self.live_bytes += other.live_bytes;
        self.rounded_bytes += other.rounded_bytes;
        self.free_bytes += other.free_bytes;
        self.retired_bytes += other.retired_bytes;
        self.largest_free_run_bytes = self.largest_free_run_bytes.max(other.largest_free_run_bytes);
        self.live_allocations += other.live_allocations;
        self.free_runs += other.free_runs;
        for bucket in &other.free_run_histogram.buckets {
            self.free_run_histogram.add_bucket(*bucket);
        }
    }

    /// Rounding, alignment and size-class waste: `rounded_bytes - live_bytes`.
    pub fn internal_waste_bytes(&self) -> u64 {
        self.rounded_bytes - self.live_bytes
    }

    /// External fragmentation: `1 - largest_free_run / free_bytes` (0 when nothing is free). 0 means all free
    /// bytes form one run; near 1, the free bytes are scattered in small runs.
    pub fn external_fragmentation(&self) -> f64 {
        if self.free_bytes == 0 { 0.0 } else { 1.0 - self.largest_free_run_bytes as f64 / self.free_bytes as f64 }
    }
}

/// The free space of a policy's range as its report totals it, without the layout: what the verdict of a refused
/// request weighs ([`Policy::free_space`](crate::Policy::free_space)). Live and padding bytes are the rest of the
/// range: `capacity - free_bytes - retired_bytes` is the rounded bytes of the live allocations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeSpace {
    /// Free bytes, in runs the policy can serve.
    pub free_bytes: u64,
    /// The largest run of free bytes.
    pub largest_free_run_bytes: u64,
    /// Freed bytes not reusable yet.
    pub retired_bytes: u64,
}

impl FreeSpace {
    /// The free space `totals` count.
    pub fn of(totals: &Totals) -> Self {
        Self {
            free_bytes: totals.free_bytes,
            largest_free_run_bytes: totals.largest_free_run_bytes,
            retired_bytes: totals.retired_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_table() {
        let id = Some(AllocationId(1));
        let ranges = [
            RangeReport { allocation: id, ..RangeReport::unowned(0, 100, RangeState::Live) },
            RangeReport { allocation: id, ..RangeReport::unowned(100, 28, RangeState::Padding) },
            RangeReport::unowned(128, 64, RangeState::Free),
            RangeReport::unowned(192, 64, RangeState::Retired),
            RangeReport::unowned(256, 256, RangeState::Free),
            RangeReport::unowned(512, 100, RangeState::Free),
        ];
        let totals = Totals::from_ranges(612, &ranges);
        assert_eq!((totals.live_bytes, totals.rounded_bytes, totals.free_bytes, totals.retired_bytes), (100, 128, 420, 64));
        assert_eq!((totals.largest_free_run_bytes, totals.free_runs, totals.live_allocations), (256, 3, 1));
        assert_eq!(totals.internal_waste_bytes(), 28);
        assert!((totals.external_fragmentation() - (1.0 - 256.0 / 420.0)).abs() < 1e-12);
        let buckets: Vec<_> = totals.free_run_histogram.buckets.iter().map(|b| (b.min_bytes, b.runs, b.bytes)).collect();
        assert_eq!(buckets, [(64, 2, 164), (256, 1, 256)]);

        let mut doubled = totals.clone();
        doubled.merge(&totals);
        assert_eq!((doubled.free_bytes, doubled.largest_free_run_bytes, doubled.free_runs), (840, 256, 6));
        assert_eq!(doubled.free_run_histogram.buckets[0].runs, 4);
        assert_eq!(Totals::default().external_fragmentation(), 0.0);
    }
}
