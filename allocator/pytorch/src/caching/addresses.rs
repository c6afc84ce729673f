//! Where a new reservation lands: the address the trace recorded, or — when the trace cannot say — where the
//! CUDA driver would have put it.
//!
//! PyTorch's decisions depend on addresses in one place: best fit breaks ties between equal free blocks by
//! address (`BlockComparatorSize`), so which of two equal cached blocks serves a request follows from where the
//! driver put their segments. A replay takes every base from the trace ([`AddressSource::Trace`]): as recorded they
//! are the truth, and in a what-if of the same kind of memory (other `max_split_size_mb`, garbage collection,
//! rounding) the recorded bases are still the driver's own answers to this program. A what-if that turns expandable
//! segments on or off cannot use them: they come from the other kind of memory and would order its segments wrongly
//! (an expandable recording's addresses rise, the driver's `cudaMalloc` bases fall). Such a run asks the driver's
//! rule ([`AddressSource::Driver`]), learnt from the shared H200 recordings:
//!
//! - `cudaMalloc` hands out virtual memory in **32 MiB granules, top down**: a 150 MiB segment takes five granules
//!   (160 MiB) and the next one lands 160 MiB below it; 20 MiB and 24 MiB segments are 32 MiB apart, 48 MiB ones
//!   64 MiB apart, 96 MiB ones 96 MiB apart.
//! - A segment that fits in the **unused tail of granules already handed out** goes there, the lowest such gap
//!   first: a 2 MiB small-pool segment right after a 148 MiB one (its granules' last 12 MiB), 12 MiB segments after
//!   20 MiB ones. A freed segment's range is such a gap again (the recordings free no segment, so this part is the
//!   rule's natural reading, not measured).
//! - `cuMemAddressReserve` (expandable segments) reserves **bottom up**, each reservation from the end of the last
//!   rounded up to 32 MiB (0x302000000 for the large pool's 157 GiB, then 0x2a56000000 for the small pool's).
//!
//! An as-recorded replay scores the rule on the recording's own segments ([`DriverRuleScore`]: each base foretold
//! from the segments before it; `replay`'s "driver's rule" figure); [`super::Emulator::hide_addresses`] runs a
//! recording on the rule alone. The figures for the shared recordings are in BENCHMARKS.md: every decision stays as
//! recorded with the addresses hidden; the bases the rule misses are those near CUDA's own start-up allocations,
//! which the trace does not show.

use std::collections::{BTreeMap, BTreeSet};

/// `cudaMalloc` and `cuMemAddressReserve` hand out virtual memory in granules of this size.
pub const DRIVER_GRANULE_BYTES: u64 = 32 << 20;

/// Segment bases are multiples of this (`kRoundLarge`; PyTorch's segment sizes are too).
const SEGMENT_ALIGN_BYTES: u64 = 2 << 20;

/// Where the first `cudaMalloc` range ends when nothing tells (below the usual top of a process's mappings).
pub const DEFAULT_CUDA_MALLOC_TOP: u64 = 0x7f00_0000_0000;

/// No reservation goes below this (4 GiB: the first page tables of a process).
const LOWEST_ADDRESS: u64 = 1 << 32;

/// Where a new segment's or reservation's base comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AddressSource {
    /// The trace's address (the recorded `alloc` that opens the segment) when it fits; else past everything.
    #[default]
    Trace,
    /// The driver's rule (module docs); trace addresses are not used.
    Driver,
}

/// How many `cudaMalloc` bases placed by the trace the driver's rule foretold, each from the segments before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DriverRuleScore {
    /// Segments placed at the trace's address after the first (the rule needs one to start from).
    pub placed: usize,
    /// Of those, the ones the rule put at the same address.
    pub foretold: usize,
}

/// The driver's virtual address space as far as the allocator saw it: the granules `cudaMalloc` handed out, the
/// gaps in them no segment holds, and where the first ones go when none has been.
#[derive(Clone, Debug, Default)]
pub(crate) struct DriverAddresses {
    /// Granule runs handed out by `cudaMalloc`, merged: start -> end.
    granules: BTreeMap<u64, u64>,
    /// The ranges in those granules that no segment holds, merged: start -> end.
    gaps: BTreeMap<u64, u64>,
    /// The same gaps by (length, start): whether any is long enough without walking them.
    gaps_by_length: BTreeSet<(u64, u64)>,
    /// Where the first `cudaMalloc` range ends when no granule has been handed out.
    cuda_malloc_top: Option<u64>,
    /// Where the first reservation of expandable segments starts when none has been made.
    reserve_bottom: Option<u64>,
}

impl DriverAddresses {
    /// The first ranges placed as given while the driver has handed none out: `cuda_malloc_top`, where the first
    /// `cudaMalloc` range ends; `reserve_bottom`, where the first reservation starts.
    pub(crate) fn anchor(&mut self, cuda_malloc_top: Option<u64>, reserve_bottom: Option<u64>) {
        self.cuda_malloc_top = cuda_malloc_top;
        self.reserve_bottom = reserve_bottom;
    }

    /// `cudaMalloc` gave `[base, base + size_bytes)`, wherever that address came from: its granules are handed out,
    /// and what of them the segment does not hold is a gap.
    pub(crate) fn note_segment(&mut self, base: u64, size_bytes: u64) {
        let first = base / DRIVER_GRANULE_BYTES * DRIVER_GRANULE_BYTES;
        let Some(end) = base.checked_add(size_bytes) else { return };
        let Some(last) = end.checked_next_multiple_of(DRIVER_GRANULE_BYTES) else { return };
        // The granules not handed out before become gaps, then the runs merge.
        let mut cursor = first;
        let mut start = first;
        let mut run_end = last;
        if let Some((&s, &e)) = self.granules.range(..=first).next_back()
            && e >= first
        {
            start = s;
            run_end = run_end.max(e);
            cursor = cursor.max(e);
        }
        let inside: Vec<(u64, u64)> = self.granules.range(first..=last).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in inside {
            if s > cursor {
                self.add_gap(cursor, s.min(last));
            }
            cursor = cursor.max(e);
            run_end = run_end.max(e);
            self.granules.remove(&s);
        }
        if last > cursor {
            self.add_gap(cursor, last);
        }
        self.granules.insert(start, run_end);
        self.take_gap(base, end);
    }

    /// `cudaFree` gave `[base, base + size_bytes)` back: a gap again.
    pub(crate) fn note_freed(&mut self, base: u64, size_bytes: u64) {
        if let Some(end) = base.checked_add(size_bytes) {
            self.add_gap(base, end);
        }
    }

    /// Where `cudaMalloc(size_bytes)` would land: the lowest gap in the granules handed out that holds it, else whole
    /// granules below the lowest. `None` when it would go below 4 GiB.
    pub(crate) fn cuda_malloc_base(&self, size_bytes: u64) -> Option<u64> {
        let size = size_bytes.checked_next_multiple_of(SEGMENT_ALIGN_BYTES)?;
        if self.gaps_by_length.last().is_some_and(|&(length, _)| length >= size) {
            for (&start, &end) in &self.gaps {
                let aligned = start.checked_next_multiple_of(SEGMENT_ALIGN_BYTES)?;
                if end > aligned && end - aligned >= size {
                    return Some(aligned);
                }
            }
        }
        let lowest = match self.granules.keys().next() {
            Some(&start) => start,
            None => self.cuda_malloc_top.unwrap_or(DEFAULT_CUDA_MALLOC_TOP) / DRIVER_GRANULE_BYTES * DRIVER_GRANULE_BYTES,
        };
        let base = lowest.checked_sub(size.checked_next_multiple_of(DRIVER_GRANULE_BYTES)?)?;
        (base >= LOWEST_ADDRESS).then_some(base)
    }

    /// [`Self::cuda_malloc_base`] once a granule has been handed out (before, only an anchor would say).
    pub(crate) fn foretold_base(&self, size_bytes: u64) -> Option<u64> {
        if self.granules.is_empty() { None } else { self.cuda_malloc_base(size_bytes) }
    }

    /// `[start, end)` is free, merged with the gaps it touches.
    fn add_gap(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.gaps.range(..=start).next_back()
            && e >= start
        {
            self.remove_gap(s, e);
            start = s;
            end = end.max(e);
        }
        let touching: Vec<(u64, u64)> = self.gaps.range(start..=end).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in touching {
            self.remove_gap(s, e);
            end = end.max(e);
        }
        self.gaps.insert(start, end);
        self.gaps_by_length.insert((end - start, start));
    }

    /// `[start, end)` is held: the gaps it overlaps keep what is outside it.
    fn take_gap(&mut self, start: u64, end: u64) {
        let first = self.gaps.range(..start).next_back().filter(|&(_, &e)| e > start).map(|(&s, _)| s).unwrap_or(start);
        let overlapping: Vec<(u64, u64)> = self.gaps.range(first..end).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in overlapping {
            self.remove_gap(s, e);
            if s < start {
                self.gaps.insert(s, start);
                self.gaps_by_length.insert((start - s, s));
            }
            if e > end {
                self.gaps.insert(end, e);
                self.gaps_by_length.insert((e - end, end));
            }
        }
    }

    fn remove_gap(&mut self, start: u64, end: u64) {
        self.gaps.remove(&start);
        self.gaps_by_length.remove(&(end - start, start));
    }

    /// Where `cuMemAddressReserve` would start a reservation with `end_of_everything` the end of the highest range
    /// reserved so far (`None`: nothing reserved yet): past it, rounded up to a granule.
    pub(crate) fn reserve_base(&self, end_of_everything: Option<u64>) -> u64 {
        let end = end_of_everything.or(self.reserve_bottom).unwrap_or(LOWEST_ADDRESS).max(LOWEST_ADDRESS);
        end.checked_next_multiple_of(DRIVER_GRANULE_BYTES).unwrap_or(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const TOP: u64 = 0x7fa2_0000_0000;

    fn anchored(cuda_malloc_top: Option<u64>, reserve_bottom: Option<u64>) -> DriverAddresses {
        let mut driver = DriverAddresses::default();
        driver.anchor(cuda_malloc_top, reserve_bottom);
        driver
    }

    /// (what happens, in order: `+size` a cudaMalloc placed by the rule, `-k` a cudaFree of the k-th segment placed,
    /// counting from 0; where each new one lands, relative to the top, in MiB)
    #[test]
    fn cuda_malloc_follows_the_drivers_rule() {
        let cases: &[(&str, &[i64], &[i64])] = &[
            ("top down in 32 MiB granules", &[150, 150, 150], &[-160, -320, -480]),
            ("20 MiB segments 32 MiB apart", &[20, 20, 24, 48, 96], &[-32, -64, -96, -160, -256]),
            ("a small segment fills the tail of the granules before it", &[148, 2, 20, 12], &[-160, -12, -192, -172]),
            ("the lowest gap that holds it", &[20, 20, 12], &[-32, -64, -44]),
            ("a tail too small is passed over", &[24, 12], &[-32, -64]),
            ("a freed segment's range is a gap again", &[100, 100, -0, 40], &[-128, -256, -156]),
            ("a freed range too small is passed over", &[20, 100, -0, 64], &[-32, -160, -224]),
        ];
        for (what, steps, expected) in cases {
            let mut driver = anchored(Some(TOP), None);
            let mut placed = Vec::new();
            let mut landed = Vec::new();
            for &step in *steps {
                if step > 0 {
                    let size = step as u64 * MIB;
                    let base = driver.cuda_malloc_base(size).unwrap();
                    driver.note_segment(base, size);
                    placed.push((base, size));
                    landed.push((base as i64 - TOP as i64) / MIB as i64);
                } else {
                    let (base, size) = placed[(-step) as usize];
                    driver.note_freed(base, size);
                }
            }
            assert_eq!(&landed[..], *expected, "{what}");
        }
    }

    /// Random segments placed by the rule or at random granule-free addresses, some freed: the gaps always equal the
    /// granules handed out minus the segments held, walked the slow way.
    #[test]
    fn the_gaps_are_the_granules_no_segment_holds() {
        let mut rng = heapscope_core::rng::Rng::new(7);
        for round in 0..40 {
            let mut driver = anchored(Some(TOP), None);
            let mut live: BTreeMap<u64, u64> = BTreeMap::new();
            for _ in 0..60 {
                let size = (1 + rng.next_u64() % 50) * 2 * MIB;
                if !live.is_empty() && rng.next_u64().is_multiple_of(3) {
                    let k = (rng.next_u64() % live.len() as u64) as usize;
                    let (&base, &bytes) = live.iter().nth(k).unwrap();
                    live.remove(&base);
                    driver.note_freed(base, bytes);
                    continue;
                }
                let base = if round % 2 == 0 || rng.next_u64().is_multiple_of(2) {
                    driver.cuda_malloc_base(size).unwrap()
                } else {
                    // From a trace: anywhere 2 MiB aligned that overlaps nothing held.
                    let base = TOP + (rng.next_u64() % 512) * 2 * MIB;
                    if live.range(..base + size).next_back().is_some_and(|(&b, &s)| b + s > base) {
                        continue;
                    }
                    base
                };
                assert!(live.range(..base + size).next_back().is_none_or(|(&b, &s)| b + s <= base), "{base:#x} overlaps");
                driver.note_segment(base, size);
                live.insert(base, size);
                let mut expected = Vec::new();
                for (&start, &end) in &driver.granules {
                    let mut cursor = start;
                    for (&b, &s) in live.range(start..end) {
                        if b > cursor {
                            expected.push((cursor, b));
                        }
                        cursor = cursor.max(b + s);
                    }
                    if end > cursor {
                        expected.push((cursor, end));
                    }
                }
                let gaps: Vec<(u64, u64)> = driver.gaps.iter().map(|(&s, &e)| (s, e)).collect();
                assert_eq!(gaps, expected, "round {round}");
                assert_eq!(driver.gaps_by_length.len(), driver.gaps.len());
            }
        }
    }

    #[test]
    fn bases_from_the_trace_count_as_handed_out() {
        let mut driver = DriverAddresses::default();
        for (base, size) in [(TOP - 160 * MIB, 148 * MIB), (TOP + 640 * MIB, 16 * MIB)] {
            driver.note_segment(base, size);
        }
        assert_eq!(driver.cuda_malloc_base(12 * MIB), Some(TOP - 12 * MIB), "the tail of the lower run first");
        assert_eq!(driver.cuda_malloc_base(13 * MIB), Some(TOP + 656 * MIB), "then the higher run's");
        assert_eq!(driver.cuda_malloc_base(40 * MIB), Some(TOP - 224 * MIB), "else below the lowest granule");
    }

    #[test]
    fn nothing_goes_below_four_gib_or_past_the_address_space() {
        let driver = anchored(Some(LOWEST_ADDRESS + 64 * MIB), None);
        assert_eq!(driver.cuda_malloc_base(64 * MIB), Some(LOWEST_ADDRESS));
        assert_eq!(driver.cuda_malloc_base(65 * MIB), None);
        assert_eq!(driver.cuda_malloc_base(u64::MAX), None);
        let mut driver = DriverAddresses::default();
        driver.note_segment(u64::MAX - MIB, MIB);
        assert!(driver.granules.is_empty(), "a range past the address space hands nothing out");
    }

    #[test]
    fn reservations_go_bottom_up_from_the_last_end_in_granules() {
        let driver = anchored(None, Some(0x3_0200_0000));
        assert_eq!(driver.reserve_base(None), 0x3_0200_0000);
        // The large pool's 8,054 pages of 20 MiB on an H200, then the small pool's reservation: as recorded.
        assert_eq!(driver.reserve_base(Some(0x3_0200_0000 + 8_054 * 20 * MIB)), 0x2a_5600_0000);
        assert_eq!(DriverAddresses::default().reserve_base(None), LOWEST_ADDRESS);
    }
}
