//! Synthetic traces for benchmarks and tests: deterministic, dependency-free, any length.
//!
//! [`steady_churn`] is the shape that stresses a timeline: it grows to about `live` allocations, then holds
//! there (within a few allocations), each event allocating a size drawn log-uniformly from 512 B to a largest size
//! or freeing a random live allocation. The same seed gives the same trace.

use crate::rng::Rng;
use crate::{Trace, TraceBuilder};

/// `events` events that keep about `live` allocations live, of 512 B up to `max_size_bytes` (rounded down to a
/// power of two, at least 1 KiB; see the module documentation).
pub fn steady_churn(events: u64, live: usize, max_size_bytes: u64, seed: u64) -> Trace {
    // Size classes 2^9 .. 2^top: a class's sizes run from 2^class to twice that.
    let top = max_size_bytes.max(1024).ilog2() - 1;
    let mut rng = Rng::new(seed);
    let mut builder = TraceBuilder::new(format!("synthetic, ~{live} live"));
    let mut alive: Vec<u64> = Vec::new();
    let mut next_id = 0;
    for _ in 0..events {
        // Three allocations in four below the target, one in four at or above it: the count climbs, then stays.
        let allocate = alive.is_empty() || (rng.below(4) < 3) == (alive.len() < live);
        if allocate {
            let class = 9 + rng.below(u64::from(top - 8));
            let size = (1u64 << class) + rng.below(1u64 << class);
            builder.alloc(next_id, size).expect("ids are fresh");
            alive.push(next_id);
            next_id += 1;
        } else {
            let index = rng.below(alive.len() as u64) as usize;
            builder.free(alive.swap_remove(index)).expect("the id is live");
        }
    }
    builder.finish()
}

/// `count` pseudo-random values in `range` (where to seek, in a benchmark), the same for the same `seed`.
pub fn positions(count: usize, range: std::ops::Range<u64>, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    let span = range.end.saturating_sub(range.start);
    (0..count).map(|_| range.start + rng.below(span)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Event;

    #[test]
    fn grows_to_the_live_count_and_holds_there() {
        // (events, live target): the live count at the end is within 2 % of the target once the trace is long
        // enough to reach it.
        for (events, live) in [(2_000u64, 100usize), (20_000, 1_000), (100_000, 10_000)] {
            let trace = steady_churn(events, live, 128 << 20, 7);
            assert_eq!(trace.events().len() as u64, events);
            let mut count: i64 = 0;
            for event in trace.events() {
                count += match event {
                    Event::Alloc { size_bytes, .. } => {
                        assert!((512..128 << 20).contains(size_bytes), "{size_bytes}");
                        1
                    }
                    Event::Free { .. } => -1,
                    Event::EmptyCache => 0,
                };
                assert!(count >= 0);
            }
            let live = live as i64;
            assert!((count - live).abs() <= live / 50 + 5, "{events} events: {count} live, target {live}");
        }
        assert_eq!(steady_churn(1000, 50, 1 << 20, 3).events(), steady_churn(1000, 50, 1 << 20, 3).events());
        let sought = positions(500, 10..20, 42);
        assert!(sought.iter().all(|position| (10..20).contains(position)) && sought.len() == 500);
        assert_eq!((sought.iter().min(), sought.iter().max()), (Some(&10), Some(&19)));
        assert_eq!(sought, positions(500, 10..20, 42));
        assert_ne!(steady_churn(1000, 50, 1 << 20, 3).events(), steady_churn(1000, 50, 1 << 20, 4).events());
    }
}
