//! Which settings a run can feel. `max_split_size_mb` decides only about blocks at least that large (they are never
//! split, only oversize requests may take them, `release_available_cached_blocks` frees them, the `oversize_*`
//! counters count them), and `max_non_split_rounding_mb` only about requests that large. On a run where no block can
//! reach the max split size, no decision and no counter depends on either: the run is the same, entry for entry and
//! at every capacity, as with neither set. [`settings_in_effect`] says so, and `advise` replays such a setting once.
//!
//! No block outgrows its segment. Without expandable segments a segment is either one the allocator held at the start
//! (one of the snapshot's segments, or one the trace frees) or a new `cudaMalloc` of a request's allocation size
//! ([`super::get_allocation_size`] of [`super::round_size`]); an expandable segment has no such bound, so a run
//! with expandable segments (or a start state holding one) keeps its settings as they are.

use super::{get_allocation_size, round_size};
use crate::alloc_conf::AllocConf;
use crate::snapshot::{Action, Snapshot};

/// The largest block a run of `conf` on device `device` of `snapshot` can hold, `None` when nothing bounds it
/// (expandable segments).
pub fn largest_block_bound(snapshot: &Snapshot, device: usize, conf: &AllocConf) -> Option<u64> {
    let trace = snapshot.device_traces.get(device).map_or(&[][..], Vec::as_slice);
    let segments = snapshot.segments.iter().filter(|segment| usize::try_from(segment.device).is_ok_and(|d| d == device));
    if conf.expandable_segments
        || snapshot.segments.iter().any(|segment| segment.is_expandable)
        || trace.iter().any(|entry| matches!(entry.action, Action::SegmentMap | Action::SegmentUnmap))
    {
        return None;
    }
    let held = segments.map(|segment| segment.total_size).chain(
        trace.iter().filter(|entry| matches!(entry.action, Action::SegmentAlloc | Action::SegmentFree)).map(|entry| entry.size),
    );
    let requested = trace
        .iter()
        .filter(|entry| matches!(entry.action, Action::Alloc | Action::Oom))
        .map(|entry| get_allocation_size(round_size(entry.size, conf)));
    Some(held.chain(requested).max().unwrap_or(0))
}

/// `conf` with the settings a run whose blocks stay below `largest_block_bytes` (`None`: unbounded) cannot feel set
/// back to PyTorch's defaults: `max_split_size_mb` (and `max_non_split_rounding_mb` with it) when no block reaches the
/// max split size. Two settings equal here replay alike.
pub fn settings_in_effect(conf: &AllocConf, largest_block_bytes: Option<u64>) -> AllocConf {
    let mut effective = conf.clone();
    if let (Some(max_split), Some(largest)) = (conf.max_split_size, largest_block_bytes)
        && largest < max_split
    {
        let defaults = AllocConf::default();
        effective.max_split_size = defaults.max_split_size;
        effective.max_non_split_rounding = defaults.max_non_split_rounding;
    }
    effective
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{Pool, Segment, TraceEntry};

    const MIB: u64 = 1 << 20;

    fn snapshot(segment_mib: &[u64], entries: &[(Action, u64)]) -> Snapshot {
        Snapshot {
            segments: (0u64..)
                .zip(segment_mib)
                .map(|(k, &mib)| Segment::from_blocks(0, (k + 1) << 32, mib * MIB, Pool::Large, Vec::new()))
                .collect(),
            device_traces: vec![entries.iter().map(|&(action, size)| TraceEntry::new(action, 1 << 40, size)).collect()],
            ..Snapshot::default()
        }
    }

    fn conf(setting: &str) -> AllocConf {
        let mut conf = AllocConf::default();
        conf.parse_overrides(setting).unwrap();
        conf
    }

    #[test]
    fn a_max_split_size_no_block_reaches_is_dropped() {
        // What, the start's segments (MiB), the trace's entries, the setting, the bound, whether the max split goes.
        type Case<'a> = (&'a str, &'a [u64], &'a [(Action, u64)], &'a str, Option<u64>, bool);
        let cases: [Case; 7] = [
            ("requests only", &[], &[(Action::Alloc, 100 * MIB)], "max_split_size_mb:128", Some(100 * MIB), true),
            (
                "a request's segment reaches it",
                &[],
                &[(Action::Alloc, 127 * MIB + 1)],
                "max_split_size_mb:128",
                Some(128 * MIB),
                false,
            ),
            (
                "a small request takes a 20 MiB segment",
                &[],
                &[(Action::Alloc, 3 * MIB)],
                "max_split_size_mb:20",
                Some(20 * MIB),
                false,
            ),
            ("a start segment reaches it", &[256], &[(Action::Alloc, MIB)], "max_split_size_mb:128", Some(256 * MIB), false),
            (
                "a segment the trace frees",
                &[],
                &[(Action::SegmentFree, 200 * MIB)],
                "max_split_size_mb:128",
                Some(200 * MIB),
                false,
            ),
            ("a recorded oom's request", &[], &[(Action::Oom, 300 * MIB)], "max_split_size_mb:256", Some(300 * MIB), false),
            ("expandable segments", &[], &[(Action::Alloc, MIB)], "expandable_segments:True,max_split_size_mb:128", None, false),
        ];
        for (what, segments, entries, setting, bound, dropped) in cases {
            let snapshot = snapshot(segments, entries);
            let conf = conf(setting);
            assert_eq!(largest_block_bound(&snapshot, 0, &conf), bound, "{what}");
            let effective = settings_in_effect(&conf, bound);
            assert_eq!(effective.max_split_size.is_none(), dropped, "{what}");
            let mut expected = conf.clone();
            expected.max_split_size = None;
            assert_eq!(effective == expected, dropped, "{what}: nothing else changes");
        }
        // Other settings stay; `max_non_split_rounding_mb` goes with the max split size.
        let conf = conf("max_split_size_mb:512,max_non_split_rounding_mb:64,garbage_collection_threshold:0.6");
        assert_eq!(settings_in_effect(&conf, Some(100 * MIB)), self::conf("garbage_collection_threshold:0.6"));
        assert_eq!(settings_in_effect(&conf, Some(600 * MIB)), conf);
    }
}
