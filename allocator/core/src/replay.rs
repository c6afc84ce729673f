//! Replays a [`Trace`] through a policy (one contiguous range) or a [`Heap`] (blocks from a source), and
//! measures what it took.

use crate::oom::OomVerdict;
use crate::source::MemorySource;
use crate::trace::{Event, Trace};
use crate::{Allocation, Error, Heap, HeapAllocation, Policy, Request, Result};

/// What a replay measured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ReplayStats {
    /// Events replayed.
    pub events: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Allocations that did not fit (their frees are skipped).
    pub failed_allocations: u64,
    /// Index of the first event that failed.
    pub first_failure: Option<u64>,
    /// Whether the last event succeeded.
    pub last_event_ok: bool,
    /// Requested bytes live at the end.
    pub live_bytes: u64,
    /// The most requested bytes live at once.
    pub peak_live_bytes: u64,
    /// The most bytes set aside (footprints) at once.
    pub peak_footprint_bytes: u64,
    /// The highest footprint end ever used: the range a single-range policy needed (its peak reserved).
    pub peak_end_bytes: u64,
}

impl ReplayStats {
    fn allocated(&mut self, size_bytes: u64, footprint_bytes: u64, footprint_end: u64, footprint_now: &mut u64) {
        self.allocations += 1;
        self.live_bytes += size_bytes;
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
        *footprint_now += footprint_bytes;
        self.peak_footprint_bytes = self.peak_footprint_bytes.max(*footprint_now);
        self.peak_end_bytes = self.peak_end_bytes.max(footprint_end);
    }

    fn failed(&mut self, index: u64) {
        self.failed_allocations += 1;
        self.first_failure.get_or_insert(index);
    }

    /// `peak_end_bytes / peak_live_bytes`: how much more range than live bytes a single-range policy needed.
    pub fn peak_end_over_peak_live(&self) -> f64 {
        self.peak_end_bytes as f64 / self.peak_live_bytes.max(1) as f64
    }
}

/// Replays `trace` through `policy`, every request aligned to `align_bytes`.
///
/// # Errors
/// An error from the policy's `free` (a policy bug: the trace frees only what it allocated), or
/// [`Error::AlignmentNotPowerOfTwo`].
pub fn replay_policy<P: Policy + ?Sized>(trace: &Trace, policy: &mut P, align_bytes: u64) -> Result<ReplayStats> {
    let mut handles: Vec<Option<Allocation>> = vec![None; trace.slots() as usize];
    let mut stats = ReplayStats::default();
    let mut footprint_now = 0;
    for (index, event) in (0..).zip(trace.events()) {
        stats.events += 1;
        let ok = match *event {
            Event::Alloc { slot, size_bytes } => {
                let allocation = Request::new(size_bytes, align_bytes).ok().and_then(|request| policy.allocate(request));
                match allocation {
                    Some(allocation) => {
                        stats.allocated(size_bytes, allocation.footprint_bytes(), allocation.footprint_end(), &mut footprint_now);
                        handles[slot as usize] = Some(allocation);
                        true
                    }
                    None => {
                        stats.failed(index);
                        false
                    }
                }
            }
            Event::Free { slot } => {
                if let Some(allocation) = handles[slot as usize].take() {
                    policy.free(allocation)?;
                    stats.live_bytes -= allocation.size_bytes();
                    footprint_now -= allocation.footprint_bytes();
                }
                true
            }
        };
        stats.last_event_ok = ok;
    }
    Ok(stats)
}

/// What a heap replay measured, with the verdicts of its failures.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HeapReplay {
    /// Counts and peaks (`peak_end_bytes` and footprints stay 0: see the heap's own stats for reserved bytes).
    pub stats: ReplayStats,
    /// The first out-of-memory verdict.
    pub first_oom: Option<OomVerdict>,
    /// The last out-of-memory verdict.
    pub last_oom: Option<OomVerdict>,
}

/// Replays `trace` through `heap`, every request aligned to `align_bytes`, labelling each allocation with
/// its trace slot.
///
/// # Errors
/// A source failure other than out of memory, or a heap bug on free.
pub fn replay_heap<S: MemorySource>(trace: &Trace, heap: &mut Heap<S>, align_bytes: u64) -> Result<HeapReplay> {
    let mut handles: Vec<Option<HeapAllocation>> = vec![None; trace.slots() as usize];
    let mut replay = HeapReplay::default();
    let mut footprint_now = 0;
    for (index, event) in (0..).zip(trace.events()) {
        replay.stats.events += 1;
        let ok = match *event {
            Event::Alloc { slot, size_bytes } => {
                let request = Request::new(size_bytes, align_bytes)?;
                match heap.allocate(request, Some(&format!("#{slot}"))) {
                    Ok(allocation) => {
                        replay.stats.allocated(size_bytes, 0, 0, &mut footprint_now);
                        handles[slot as usize] = Some(allocation);
                        true
                    }
                    Err(Error::OutOfMemory(verdict)) => {
                        replay.stats.failed(index);
                        replay.first_oom.get_or_insert_with(|| (*verdict).clone());
                        replay.last_oom = Some(*verdict);
                        false
                    }
                    Err(other) => return Err(other),
                }
            }
            Event::Free { slot } => {
                if let Some(allocation) = handles[slot as usize].take() {
                    heap.free(allocation)?;
                    replay.stats.live_bytes -= allocation.size_bytes();
                }
                true
            }
        };
        replay.stats.last_event_ok = ok;
    }
    Ok(replay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::story::frag_oom;
    use crate::units::MIB;
    use crate::{HeapConfig, PolicyKind, ReleaseRule, SimulatedSource, Tlsf};

    #[test]
    fn frag_oom_on_one_range_succeeds() {
        let story = frag_oom();
        let mut policy = Tlsf::new(story.device_bytes);
        let stats = replay_policy(&story.trace, &mut policy, 256).unwrap();
        assert_eq!((stats.allocations, stats.failed_allocations, stats.last_event_ok), (41, 0, true));
        assert_eq!(stats.peak_live_bytes, 3024 * MIB);
        assert_eq!(stats.peak_end_bytes, 3024 * MIB, "the 100 MiB blocks reuse the start of the range");
    }

    #[test]
    fn frag_oom_in_a_caching_heap_fails_with_fragmentation() {
        let story = frag_oom();
        let config = HeapConfig { release: ReleaseRule::OnPressure, ..HeapConfig::new(PolicyKind::BestFit) };
        let mut heap = Heap::new(config, SimulatedSource::new(story.device_bytes, 2 * MIB)).unwrap();
        let replay = replay_heap(&story.trace, &mut heap, 256).unwrap();
        assert!(!replay.stats.last_event_ok);
        assert_eq!(replay.stats.failed_allocations, 1);
        let verdict = replay.last_oom.unwrap();
        assert_eq!(verdict.cause, crate::OomCause::Fragmentation);
        assert_eq!(verdict.free_in_blocks_bytes, 1000 * MIB);
    }
}
