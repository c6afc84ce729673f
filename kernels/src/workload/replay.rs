//! `replay FILE`: a recording's allocations and frees (a PyTorch snapshot's trace, a native or CSV trace, as
//! `heapscope_lab::recording::Recording` reads them) as a workload. Every allocation gets a fresh id (trace
//! slots are reused, pattern ids are not), so the runner fills it with its own pattern and verifies it before
//! its free; allocations the recording never frees are freed at the end. Sizes may be divided by a scale, so a
//! recording made on a large GPU runs on a small device with the same shape. A trace's `empty_cache()` events are no
//! workload step (the runner's heaps keep their caches through them).

use heapscope_core::trace::Event;
use heapscope_lab::recording::{Moment, Recording};

use super::{StreamBuilder, Workload};

/// The first `max_events` events of `recording` (all when `None`) as a workload, every size divided by `scale`
/// (rounded up; 1 keeps them).
pub fn replay(recording: &Recording, max_events: Option<u64>, scale: u64) -> Workload {
    let scale = scale.max(1);
    let mut b = StreamBuilder::default();
    let mut ids: Vec<Option<u32>> = vec![None; recording.trace.slots() as usize];
    let events = recording.trace.events();
    let take = max_events.map_or(events.len(), |max| usize::try_from(max).unwrap_or(usize::MAX).min(events.len()));
    // The recording's moment of each step: steps skip empty_cache events and frees of what was never allocated.
    let mut moments = Vec::new();
    for (index, event) in (0u64..).zip(&events[..take]) {
        match *event {
            Event::Alloc { slot, size_bytes } => {
                let id = b.alloc(size_bytes.div_ceil(scale).max(1));
                moments.push(recording.moment_of(index));
                if let Some(entry) = ids.get_mut(slot as usize) {
                    *entry = Some(id);
                }
            }
            Event::Free { slot } => {
                if let Some(id) = ids.get_mut(slot as usize).and_then(Option::take) {
                    b.free(id);
                    moments.push(recording.moment_of(index));
                }
            }
            Event::EmptyCache => {}
        }
    }
    let end = match take.checked_sub(1) {
        Some(last) => recording.moment_of(last as u64),
        None => Moment::Start,
    };
    for id in ids.into_iter().flatten() {
        b.free(id);
        moments.push(end);
    }
    let cut = if take < events.len() { format!(", first {take} of {} events", events.len()) } else { String::new() };
    let scaled = if scale > 1 { format!(", sizes / {scale}") } else { String::new() };
    Workload { moments, ..b.finish(format!("replay {}{cut}{scaled}", recording.name)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_core::trace::Trace;

    #[test]
    fn slots_become_fresh_ids_and_everything_is_freed() {
        let trace = Trace::parse_csv("t.csv", "a,1,100\na,2,200\nf,1\na,1,300\n").unwrap();
        let recording = Recording::from_trace(trace);
        let workload = replay(&recording, None, 1);
        let stats = workload.check().unwrap();
        // Each step's entry in the recording (an empty_cache is no step), and the last entry for what it left live.
        let trace = Trace::parse_csv("e.csv", "a,1,100\ne\na,2,200\nf,1\na,1,300\n").unwrap();
        let moments = replay(&Recording::from_trace(trace), None, 1).moments;
        assert_eq!(moments, [0, 2, 3, 4, 4, 4].into_iter().map(Moment::Entry).collect::<Vec<_>>());
        assert_eq!((stats.allocs, stats.frees, stats.peak_live_bytes), (3, 3, 500));
        assert!(workload.name.starts_with("replay t.csv"), "{}", workload.name);
        let cut = replay(&recording, Some(2), 1);
        assert_eq!(cut.check().unwrap().allocs, 2);
        assert!(cut.name.ends_with("first 2 of 4 events"), "{}", cut.name);
        let scaled = replay(&recording, None, 16);
        assert_eq!(scaled.check().unwrap().peak_live_bytes, 13 + 19);
        assert!(scaled.name.ends_with("sizes / 16"), "{}", scaled.name);
    }
}
