//! Which memory pool each request of a recording went to: the allocator's own, or a private pool of a CUDA graph or
//! a `torch.cuda.MemPool`.
//!
//! PyTorch 2.12 and later write it in every trace entry (`pool_id`, read into [`TraceEntry::pool_id`]). Older files
//! name only the final segments' pools (`segment_pool_id`), yet PyTorch serves a request only from its own pool's
//! segments, so where a request was placed tells its pool: an `alloc` inside a segment of a private pool went to that
//! pool. The trace is walked back from the final segments: a `cudaMalloc` segment of a private pool holds its pool from
//! its `segment_alloc` (or the start of the recording) to the end; the pages of a private pool's expandable segments
//! lie within the reservation its final mapped ranges span. Requests placed in a private segment freed before the end
//! cannot be told apart (the file says nothing of its pool) and count as the allocator's own.

use std::collections::BTreeMap;

use crate::snapshot::{Action, PoolId, Snapshot, TraceEntry};

/// The memory pool of each entry of one device's trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestPools {
    /// The pools, `(0, 0)` first; `ids` index it.
    pool_ids: Vec<(i64, i64)>,
    /// Per entry, the index of its pool in `pool_ids` (empty: every entry's own [`TraceEntry::pool_id`]).
    ids: Vec<u8>,
}

impl RequestPools {
    /// The pools of device `device`'s entries in `snapshot`: the entries' own where the file names them (or no final
    /// segment is a private pool's), else those where the requests were placed shows.
    pub fn of(snapshot: &Snapshot, device: usize) -> RequestPools {
        let trace = snapshot.device_traces.get(device).map_or(&[][..], Vec::as_slice);
        let private = |id: (i64, i64)| id != (0, 0);
        let finals = || snapshot.segments.iter().filter(|segment| segment.device as usize == device);
        // Cheapest first: most files have no private final segment (and the emulation asks for every run it makes).
        let told = || !snapshot.pool_ids.is_empty() || trace.iter().any(|entry| entry.pool_id != PoolId::DEFAULT);
        if !finals().any(|segment| private(segment.segment_pool_id)) || told() {
            return RequestPools { pool_ids: snapshot.pool_ids.clone(), ids: Vec::new() };
        }
        let mut pools = RequestPools { pool_ids: vec![(0, 0)], ids: vec![0; trace.len()] };
        // base -> (end, pool index) of the private cudaMalloc segments alive at this point of the walk back.
        let mut segments: BTreeMap<u64, (u64, u8)> = BTreeMap::new();
        // Per private pool and stream, the span of its expandable segments' final mapped ranges.
        let mut reservations: BTreeMap<(u64, u8), (u64, u64)> = BTreeMap::new();
        for segment in finals().filter(|segment| private(segment.segment_pool_id)) {
            let index = pools.index(segment.segment_pool_id);
            let end = segment.address.saturating_add(segment.total_size);
            if segment.is_expandable {
                let span = reservations.entry((segment.stream, index)).or_insert((segment.address, end));
                *span = (span.0.min(segment.address), span.1.max(end));
            } else {
                segments.insert(segment.address, (end, index));
            }
        }
        let spans: Vec<(u64, u64, u8)> = reservations.into_iter().map(|((_, index), (start, end))| (start, end, index)).collect();
        let holding = |segments: &BTreeMap<u64, (u64, u8)>, addr: u64| {
            let in_segment =
                segments.range(..=addr).next_back().filter(|(_, (end, _))| addr < *end).map(|(_, (_, index))| *index);
            in_segment.or_else(|| spans.iter().find(|&&(start, end, _)| start <= addr && addr < end).map(|&(_, _, index)| index))
        };
        for (k, entry) in trace.iter().enumerate().rev() {
            let index = match entry.action {
                Action::Alloc | Action::SegmentMap | Action::SegmentUnmap => holding(&segments, entry.addr),
                // Before its `segment_alloc` the segment was not there.
                Action::SegmentAlloc => segments.remove(&entry.addr).map(|(_, index)| index),
                _ => None,
            };
            if let Some(index) = index {
                pools.ids[k] = index;
            }
        }
        pools
    }

    /// The index of `pool_id` in `pool_ids`, added when new (past 255 pools, the last).
    fn index(&mut self, pool_id: (i64, i64)) -> u8 {
        let index = self.pool_ids.iter().position(|&known| known == pool_id).unwrap_or_else(|| {
            self.pool_ids.push(pool_id);
            self.pool_ids.len() - 1
        });
        u8::try_from(index).unwrap_or(u8::MAX)
    }

    /// The pool entry `entry` went to (its own `pool_id`, read through `snapshot`, where the file names them).
    pub fn pool_id(&self, snapshot: &Snapshot, entry: usize, pool_id: PoolId) -> (i64, i64) {
        match self.ids.get(entry) {
            Some(&index) => self.pool_ids.get(usize::from(index)).copied().unwrap_or((0, 0)),
            None => snapshot.pool_id(pool_id),
        }
    }

    /// Whether the pools come from where the requests were placed rather than from the entries (a file before
    /// PyTorch 2.12).
    pub fn inferred(&self) -> bool {
        !self.ids.is_empty()
    }

    /// How many requests (`alloc` entries of `trace`, the device's) went to a private pool, and to how many pools.
    pub fn private_requests(&self, trace: &[TraceEntry]) -> (usize, usize) {
        let mut pools = [false; 256];
        let mut requests = 0;
        for (k, entry) in trace.iter().enumerate().filter(|(_, entry)| entry.action == Action::Alloc) {
            let index = self.ids.get(k).copied().unwrap_or(entry.pool_id.0);
            if index != 0 {
                requests += 1;
                pools[usize::from(index)] = true;
            }
        }
        (requests, pools.iter().filter(|&&used| used).count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{Block, BlockState, Pool, Segment};

    const MIB: u64 = 1 << 20;

    fn segment(address: u64, total_size: u64, pool_id: (i64, i64), is_expandable: bool) -> Segment {
        let blocks = vec![Block::new(address, total_size, 0, BlockState::Inactive)];
        Segment { segment_pool_id: pool_id, is_expandable, ..Segment::from_blocks(0, address, total_size, Pool::Large, blocks) }
    }

    /// From the final segments back: a private segment's requests are its pool's from its `segment_alloc` on (the
    /// address a default segment had before is the default pool's), a private reservation's too; requests in a
    /// private segment freed before the end, and every request of a file that names its pools, keep the entries' own.
    #[test]
    fn requests_placed_in_a_private_pools_segments_went_to_it() {
        let (d, p, x) = (0x7000_0000_0000_u64, 0x7000_0200_0000_u64, 0x7100_0000_0000_u64);
        let e = |action, addr, size| TraceEntry::new(action, addr, size);
        let trace = vec![
            e(Action::SegmentAlloc, p, 20 * MIB), // 0: a default segment where the graph's will be
            e(Action::Alloc, p, 5 * MIB),
            e(Action::FreeRequested, p, 5 * MIB),
            e(Action::FreeCompleted, p, 5 * MIB),
            e(Action::SegmentFree, p, 20 * MIB),
            e(Action::SegmentAlloc, p, 20 * MIB), // 5: the graph's
            e(Action::Alloc, p, 5 * MIB),
            e(Action::Alloc, d, 5 * MIB), // 7: the default pool's
            e(Action::Alloc, p + 5 * MIB, 5 * MIB),
            e(Action::SegmentMap, x, 20 * MIB), // 9: a MemPool's reservation
            e(Action::Alloc, x + 2 * MIB, MIB + 1),
        ];
        let snapshot = Snapshot {
            segments: vec![
                segment(d, 20 * MIB, (0, 0), false),
                segment(p, 20 * MIB, (0, 1), false),
                segment(x, 20 * MIB, (3, 0), true),
            ],
            device_traces: vec![trace.clone()],
            ..Snapshot::default()
        };
        let pools = RequestPools::of(&snapshot, 0);
        assert!(pools.inferred());
        let of: Vec<(i64, i64)> = (0..trace.len()).map(|k| pools.pool_id(&snapshot, k, trace[k].pool_id)).collect();
        let (default, graph, mem_pool) = ((0, 0), (0, 1), (3, 0));
        assert_eq!(of, [default, default, default, default, default, graph, graph, default, graph, mem_pool, mem_pool]);
        assert_eq!(pools.private_requests(&trace), (3, 2));

        // A file that names its pools: the entries' own, however they were placed.
        let mut named = snapshot.clone();
        named.device_traces[0][6].pool_id = PoolId(1);
        named.pool_ids = vec![(0, 0), (0, 1)];
        let pools = RequestPools::of(&named, 0);
        assert!(!pools.inferred());
        assert_eq!((pools.pool_id(&named, 6, PoolId(1)), pools.pool_id(&named, 8, PoolId::DEFAULT)), (graph, default));
        assert_eq!(pools.private_requests(&named.device_traces[0]), (1, 1));

        // No private final segment: nothing to tell.
        let plain = Snapshot { segments: vec![segment(d, 20 * MIB, (0, 0), false)], ..snapshot };
        assert!(!RequestPools::of(&plain, 0).inferred());
    }
}
