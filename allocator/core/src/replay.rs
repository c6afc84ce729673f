//! Replays a [`Trace`] through a policy (one contiguous range) or a [`Heap`] (blocks from a source), and
//! measures what it took.

use crate::oom::OomVerdict;
use crate::source::MemorySource;
use crate::trace::{Event, Trace};
use crate::{Allocation, DeviceHeap, Error, Heap, PagedHeap, Policy, Request, Result};

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
    /// Frees of served allocations.
    pub frees: u64,
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

/// Where a replay sends its requests: a policy or a heap.
trait Target {
    type Handle: Copy;

    /// Serves `request` for trace slot `slot`, or `None` when it does not fit.
    fn allocate(&mut self, request: Request, slot: u32) -> Result<Option<Self::Handle>>;

    fn free(&mut self, handle: Self::Handle) -> Result<()>;

    /// The allocation it stands for.
    fn allocation(handle: &Self::Handle) -> &Allocation;

    /// One past the last byte set aside, in one address space across allocations (0 when there is none).
    fn footprint_end(handle: &Self::Handle) -> u64;

    /// A request of `size_bytes` that overflows once aligned to `align_bytes`: no device holds it.
    fn oversized(&mut self, _size_bytes: u64, _align_bytes: u64) {}
}

struct PolicyTarget<'a, P: Policy + ?Sized>(&'a mut P);

impl<P: Policy + ?Sized> Target for PolicyTarget<'_, P> {
    type Handle = Allocation;

    fn allocate(&mut self, request: Request, _slot: u32) -> Result<Option<Allocation>> {
        Ok(self.0.allocate(request))
    }

    fn free(&mut self, handle: Allocation) -> Result<()> {
        self.0.free(handle)
    }

    fn allocation(handle: &Allocation) -> &Allocation {
        handle
    }

    fn footprint_end(handle: &Allocation) -> u64 {
        handle.footprint_end()
    }
}

/// A heap of blocks or a paged heap: failures are out-of-memory verdicts, kept.
struct DeviceHeapTarget<'a, H: DeviceHeap> {
    heap: &'a mut H,
    first_oom: Option<OomVerdict>,
    last_oom: Option<OomVerdict>,
}

impl<H: DeviceHeap> Target for DeviceHeapTarget<'_, H> {
    type Handle = H::Handle;

    fn allocate(&mut self, request: Request, _slot: u32) -> Result<Option<H::Handle>> {
        match self.heap.allocate_request(request) {
            Ok(handle) => Ok(Some(handle)),
            Err(Error::OutOfMemory(verdict)) => {
                self.first_oom.get_or_insert_with(|| (*verdict).clone());
                self.last_oom = Some(*verdict);
                Ok(None)
            }
            Err(other) => Err(other),
        }
    }

    fn free(&mut self, handle: H::Handle) -> Result<()> {
        self.heap.free_handle(handle)
    }

    fn oversized(&mut self, size_bytes: u64, align_bytes: u64) {
        let verdict = self.heap.oversized_verdict(size_bytes, align_bytes);
        self.first_oom.get_or_insert_with(|| verdict.clone());
        self.last_oom = Some(verdict);
    }

    fn allocation(handle: &H::Handle) -> &Allocation {
        H::allocation(handle)
    }

    /// Offsets are per block in a heap, and a paged heap's peak is its mapped bytes: no single range end
    /// means anything.
    fn footprint_end(_handle: &H::Handle) -> u64 {
        0
    }
}

/// The one replay loop. A size that overflows once aligned fits nowhere: it counts as a failed allocation.
fn replay<T: Target>(trace: &Trace, target: &mut T, align_bytes: u64) -> Result<ReplayStats> {
    // Validates the alignment once, before any event.
    Request::new(1, align_bytes)?;
    let mut handles: Vec<Option<T::Handle>> = vec![None; trace.slots() as usize];
    let mut stats = ReplayStats::default();
    let mut footprint_now = 0;
    for (index, event) in (0..).zip(trace.events()) {
        stats.events += 1;
        let ok = match *event {
            Event::Alloc { slot, size_bytes } => {
                let served = match Request::new(size_bytes, align_bytes) {
                    Ok(request) => target.allocate(request, slot)?,
                    Err(_) => {
                        target.oversized(size_bytes, align_bytes);
                        None
                    }
                };
                match served {
                    Some(handle) => {
                        let footprint_bytes = T::allocation(&handle).footprint_bytes();
                        stats.allocated(size_bytes, footprint_bytes, T::footprint_end(&handle), &mut footprint_now);
                        handles[slot as usize] = Some(handle);
                        true
                    }
                    None => {
                        stats.failed(index);
                        false
                    }
                }
            }
            Event::Free { slot } => {
                if let Some(handle) = handles[slot as usize].take() {
                    target.free(handle)?;
                    stats.frees += 1;
                    let allocation = T::allocation(&handle);
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

/// Replays `trace` through `policy`, every request aligned to `align_bytes`.
///
/// # Errors
/// [`Error::AlignmentNotPowerOfTwo`] for a bad alignment, or an error from the policy's `free` (a policy
/// bug: the trace frees only what it allocated).
pub fn replay_policy<P: Policy + ?Sized>(trace: &Trace, policy: &mut P, align_bytes: u64) -> Result<ReplayStats> {
    replay(trace, &mut PolicyTarget(policy), align_bytes)
}

/// What a heap replay measured, with the verdicts of its failures.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HeapReplay {
    /// Counts and peaks (`peak_end_bytes` stays 0: see the heap's own stats for reserved bytes).
    pub stats: ReplayStats,
    /// The first out-of-memory verdict.
    pub first_oom: Option<OomVerdict>,
    /// The last out-of-memory verdict.
    pub last_oom: Option<OomVerdict>,
}

/// Replays `trace` through `heap`, every request aligned to `align_bytes`.
///
/// # Errors
/// [`Error::AlignmentNotPowerOfTwo`] for a bad alignment, a source failure other than out of memory, or a heap
/// bug on free.
pub fn replay_heap<S: MemorySource>(trace: &Trace, heap: &mut Heap<S>, align_bytes: u64) -> Result<HeapReplay> {
    let mut target = DeviceHeapTarget { heap, first_oom: None, last_oom: None };
    let stats = replay(trace, &mut target, align_bytes)?;
    Ok(HeapReplay { stats, first_oom: target.first_oom, last_oom: target.last_oom })
}

/// Replays `trace` through a paged heap, every request aligned to `align_bytes`. The verdicts come back
/// in a [`HeapReplay`]; mapped bytes and map calls are in the heap's own stats.
///
/// # Errors
/// [`Error::AlignmentNotPowerOfTwo`] for a bad alignment, or a paged-heap bug on free.
pub fn replay_paged(trace: &Trace, heap: &mut PagedHeap, align_bytes: u64) -> Result<HeapReplay> {
    let mut target = DeviceHeapTarget { heap, first_oom: None, last_oom: None };
    let stats = replay(trace, &mut target, align_bytes)?;
    Ok(HeapReplay { stats, first_oom: target.first_oom, last_oom: target.last_oom })
}

/// Replays `trace` through any [`DeviceHeap`] (a heap of another crate, another allocator wrapped as one),
/// every request aligned to `align_bytes`; what [`replay_heap`] and [`replay_paged`] do for heapscope's own.
///
/// # Errors
/// [`Error::AlignmentNotPowerOfTwo`] for a bad alignment, a failure other than out of memory, or an error on
/// free.
pub fn replay_device_heap<H: DeviceHeap>(trace: &Trace, heap: &mut H, align_bytes: u64) -> Result<HeapReplay> {
    let mut target = DeviceHeapTarget { heap, first_oom: None, last_oom: None };
    let stats = replay(trace, &mut target, align_bytes)?;
    Ok(HeapReplay { stats, first_oom: target.first_oom, last_oom: target.last_oom })
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
    fn footprints_are_returned_on_free() {
        let mut builder = crate::TraceBuilder::new("churn");
        for id in 0..4 {
            builder.alloc(id, 1000).unwrap();
            builder.free(id).unwrap();
        }
        let trace = builder.finish();
        let stats = replay_policy(&trace, &mut Tlsf::new(1 << 20), 256).unwrap();
        assert_eq!((stats.peak_live_bytes, stats.peak_footprint_bytes), (1000, 1024), "one allocation at a time");
        let mut heap = Heap::new(HeapConfig::new(PolicyKind::Tlsf), SimulatedSource::new(1 << 30, 2 * MIB)).unwrap();
        let replay = replay_heap(&trace, &mut heap, 256).unwrap();
        assert_eq!(replay.stats.peak_footprint_bytes, 1024);
    }

    #[test]
    fn bad_alignment_is_an_error_and_huge_sizes_fail_alike() {
        let mut builder = crate::TraceBuilder::new("huge");
        builder.alloc(1, u64::MAX).unwrap();
        builder.alloc(2, 4096).unwrap();
        let trace = builder.finish();
        let mut policy = Tlsf::new(1 << 20);
        assert!(matches!(replay_policy(&trace, &mut policy, 3), Err(Error::AlignmentNotPowerOfTwo { align_bytes: 3 })));
        let stats = replay_policy(&trace, &mut policy, 256).unwrap();
        assert_eq!((stats.allocations, stats.failed_allocations, stats.first_failure), (1, 1, Some(0)));
        let mut heap = Heap::new(HeapConfig::new(PolicyKind::Tlsf), SimulatedSource::new(1 << 30, 2 * MIB)).unwrap();
        assert!(matches!(replay_heap(&trace, &mut heap, 0), Err(Error::AlignmentNotPowerOfTwo { align_bytes: 0 })));
        let replay = replay_heap(&trace, &mut heap, 256).unwrap();
        assert_eq!((replay.stats.allocations, replay.stats.failed_allocations), (1, 1));
    }

    #[test]
    fn frag_oom_through_paging_succeeds_and_unmaps() {
        let story = frag_oom();
        let mut heap = PagedHeap::new(crate::PagedConfig::new(Some(story.device_bytes))).unwrap();
        let replay = replay_paged(&story.trace, &mut heap, 256).unwrap();
        assert_eq!((replay.stats.failed_allocations, replay.stats.last_event_ok), (0, true));
        assert!(replay.first_oom.is_none());
        assert_eq!(heap.stats().peak_mapped_bytes, 3024 * MIB, "the freed 150 MiB pages were unmapped");
        assert!(heap.stats().unmap_calls > 0);
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
