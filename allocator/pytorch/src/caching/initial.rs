//! The allocator state at the start of a recording, rebuilt from the snapshot's final `segments` and its
//! trace walked backwards — the way MemoryViz (`torch/utils/viz/MemoryViz.js`) builds its initial state
//! for a trace that began mid-run: an `alloc` seen going backwards means the block was not live before
//! it, a `free_completed` means it was; `segment_alloc` / `segment_map` remove memory that the recording
//! saw being reserved, `segment_free` / `segment_unmap` restore memory it saw being returned (in the virtual segments
//! of `virtual_segments.rs`, also those the final segments no longer show, every page unmapped by the end).
//!
//! Free blocks are the gaps between live blocks (free neighbours always merge); a gap that is one of the final
//! segments' free blocks keeps the requested size PyTorch wrote for it (that of its last allocation). A live block known only
//! from its free entry carries the requested size; its block size is `round_size` of it, grown to the next
//! boundary where PyTorch would not have split the remainder (`should_split`: a large-pool remainder of at
//! most 1 MiB, or an oversize block). The boundary is the next live block, the end of its segment, or the nearest
//! allocation the trace places above it while it is still live, whichever is lowest: a free block between its end
//! and the boundary was split off (a large-pool remainder over 1 MiB), so a gap of at most 1 MiB is its own. A recording that starts from an empty allocator rebuilds to empty.
//! Counters start at the rebuilt values (peak = current, nothing freed yet).
//!
//! A what-if with the other kind of memory (expandable segments turned on or off against the recording) cannot start
//! from that layout, made of the kind it does not use: [`reallocate_start_state`] allocates the same live blocks
//! afresh with its settings instead, in address order.

use std::collections::BTreeMap;

use super::validate::{EmulationError, Origin};
use super::virtual_segments::{Group, Groups, RunPools, add_range, remove_range};
use super::{ADDRESS_LIMIT, BlockId, CachingAllocator, ExpandableSegment, LARGE_BUFFER_BYTES, Node, SMALL_BUFFER_BYTES};
use super::{RequestPools, SMALL_SIZE_BYTES, round_size};
use crate::alloc_conf::AllocConf;
use crate::snapshot::{Action, BlockState, Pool, Snapshot};

/// Addresses of live allocations: recorded address -> emulated address.
pub(super) type LiveMap = heapscope_core::hash::FastMap<u64, u64>;

/// The `cudaMalloc` segments at the start: base -> (bytes, stream, (memory pool, pool), where it comes from).
type StartSegments = BTreeMap<u64, (u64, u64, (usize, Pool), Origin)>;

/// A block live at the start.
#[derive(Clone, Copy, Debug)]
struct LiveBlock {
    /// Exact size when the final segments show it.
    size: Option<u64>,
    requested: u64,
    /// Freed by the caller but not yet completed.
    pending: bool,
    /// Where the trace shows it ends (possibly past its segment: checked when laid out).
    observed_end: Option<u64>,
    /// The final block or trace entry it comes from.
    origin: Origin,
}

/// The allocator at the start of device `device`'s recording, the live allocations (recorded address -> emulated
/// address, equal here), and how many allocations live at the start lie in no segment the recording shows (PyTorch
/// could not have held them: left out).
///
/// Expects a snapshot that passed `validate` (every range ends by `ADDRESS_LIMIT`); reserved ranges that
/// overlap at the start, or a live block of known size that runs into the next live block or past its
/// segment, are errors naming where they come from. `pools`: the memory pool of each of the device's entries.
pub(super) fn rebuild_start_state(
    snapshot: &Snapshot,
    device: usize,
    conf: &AllocConf,
    capacity_bytes: Option<u64>,
    pools: &RequestPools,
) -> Result<(CachingAllocator, LiveMap, usize), EmulationError> {
    let mut alloc = CachingAllocator::new(conf.clone(), capacity_bytes);
    let mut live_map = LiveMap::default();
    let empty = Vec::new();
    let trace = snapshot.device_traces.get(device).unwrap_or(&empty);

    let mut segments = StartSegments::new();
    let mut groups = Groups::default();
    // A hash map while walking (most entries insert or remove), ordered by address once at the end.
    let mut live: heapscope_core::hash::FastMap<u64, LiveBlock> = heapscope_core::hash::FastMap::default();
    // Expandable mapped ranges: start -> origin, for errors.
    let mut mapped_origin: BTreeMap<u64, Origin> = BTreeMap::new();
    let mut stale = StaleRequests::default();
    // The final expandable segments, start -> (end, pool): what the file says of the pool of the trace's runs over them.
    let mut finals: BTreeMap<u64, (u64, Pool)> = BTreeMap::new();
    for (i, s) in snapshot.segments.iter().enumerate().filter(|(_, s)| s.device as usize == device) {
        if s.is_expandable {
            finals.insert(s.address, (s.address.saturating_add(s.total_size), s.segment_type));
            let owner = alloc.owner_of(s.segment_pool_id);
            let gi = groups.of_final(s.stream, (owner, s.segment_type), s.address);
            if let Some(&other) = mapped_origin.get(&s.address) {
                return Err(overlap(device, Origin::Segment(i), s.address, other));
            }
            mapped_origin.insert(s.address, Origin::Segment(i));
            groups.list[gi].show_mapped(s.address, s.address + s.total_size);
        } else {
            if let Some(&(_, _, _, other)) = segments.get(&s.address) {
                return Err(overlap(device, Origin::Segment(i), s.address, other));
            }
            let owner = alloc.owner_of(s.segment_pool_id);
            segments.insert(s.address, (s.total_size, s.stream, (owner, s.segment_type), Origin::Segment(i)));
        }
        for b in s.blocks.iter().filter(|b| b.state == BlockState::Inactive) {
            stale.insert(b.address, (b.size, b.requested_size));
        }
        for (j, b) in s.blocks.iter().enumerate().filter(|(_, b)| b.state != BlockState::Inactive) {
            live.insert(
                b.address,
                LiveBlock {
                    size: Some(b.size),
                    requested: b.requested_size,
                    pending: b.state == BlockState::ActivePendingFree,
                    observed_end: None,
                    origin: Origin::Block(i, j),
                },
            );
        }
    }
    // The memory pool of each segment entry: the entry's own (PyTorch 2.12 and later), else the one whose segments or
    // reservation it lies in (`RequestPools`: an expandable private pool's pages are mapped by entries naming none).
    let segment_owners: heapscope_core::hash::FastMap<usize, usize> = trace
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.action, Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap))
        .map(|(k, e)| (k, alloc.owner_of(pools.pool_id(snapshot, k, e.pool_id))))
        .collect();
    let owner = |k: usize| segment_owners.get(&k).copied().unwrap_or(0);
    let run_pools = RunPools::new(trace, &finals);
    groups.add_seen_only_in_trace(trace, &run_pools, owner);
    for (k, e) in trace.iter().enumerate().rev() {
        match e.action {
            Action::Alloc => {
                live.remove(&e.addr);
            }
            Action::FreeCompleted => {
                live.insert(
                    e.addr,
                    LiveBlock { size: None, requested: e.size, pending: true, observed_end: None, origin: Origin::Entry(k) },
                );
            }
            Action::FreeRequested => {
                if let Some(b) = live.get_mut(&e.addr) {
                    b.pending = false;
                }
            }
            Action::SegmentAlloc => {
                segments.remove(&e.addr);
            }
            Action::SegmentFree => {
                let pool = if e.size == SMALL_BUFFER_BYTES { Pool::Small } else { Pool::Large };
                segments.insert(e.addr, (e.size, e.stream, (owner(k), pool), Origin::Entry(k)));
            }
            Action::SegmentMap => {
                if let Some(gi) = groups.holding(e.stream, owner(k), run_pools.of(e.addr), e.addr) {
                    remove_range(&mut groups.list[gi].mapped, e.addr, e.addr + e.size);
                }
            }
            Action::SegmentUnmap => {
                if let Some(gi) = groups.holding(e.stream, owner(k), run_pools.of(e.addr), e.addr) {
                    add_range(&mut groups.list[gi].mapped, e.addr, e.addr + e.size);
                    mapped_origin.entry(e.addr).or_insert(Origin::Entry(k));
                }
            }
            _ => {}
        }
    }
    let mut live: BTreeMap<u64, LiveBlock> = live.into_iter().collect();
    // Where a block of unknown size ends at the latest: the nearest allocation placed above it while it is still live
    // (a bound, not its end: that allocation may have gone to a free block further up).
    let mut first_free: heapscope_core::hash::FastMap<u64, usize> = heapscope_core::hash::FastMap::default();
    for (i, e) in trace.iter().enumerate() {
        if e.action == Action::FreeCompleted {
            first_free.entry(e.addr).or_insert(i);
        }
    }
    let mut observed_end: heapscope_core::hash::FastMap<u64, u64> = heapscope_core::hash::FastMap::default();
    for (i, e) in trace.iter().enumerate().filter(|(_, e)| e.action == Action::Alloc) {
        if let Some((&x, b)) = live.range(..e.addr).next_back()
            && b.size.is_none()
            && first_free.get(&x).is_some_and(|&f| i < f)
        {
            let end = observed_end.entry(x).or_insert(e.addr);
            *end = (*end).min(e.addr);
        }
    }
    for (addr, end) in observed_end {
        if let Some(b) = live.get_mut(&addr) {
            b.observed_end = Some(end);
        }
    }
    check_disjoint(device, &segments, &groups.list, &mapped_origin)?;
    // Pending frees at the start are completed by the trace; blocks whose free was never requested before
    // the start stay allocated.
    let max_split = conf.max_split_size.unwrap_or(u64::MAX);
    for (&base, &(size, stream, pool, _)) in &segments {
        alloc.insert_segment(base, size, pool.0);
        let small = pool.1 == Pool::Small;
        alloc.stats.segment.increase(small, 1);
        alloc.stats.reserved_bytes.increase(small, size);
        if size >= max_split {
            alloc.stats.oversize_segments.increase(1);
        }
        alloc.total_allocated_memory += size;
        let ids = lay_out(&mut alloc, (&live, &stale), &mut live_map, base, base + size, stream, pool, None, device)?;
        if ids.len() > 1 {
            for id in ids {
                let n = alloc.node(id);
                if !n.active {
                    let s = n.size;
                    alloc.stats.inactive_split.increase(small, 1);
                    alloc.stats.inactive_split_bytes.increase(small, s);
                }
            }
        }
    }
    // Reservations start at these bases: an expandable segment ends by the next one above it.
    let (groups, bases) = groups.mapped_at_start(segments.keys().copied());
    // The device holds at least what is reserved at the start, these pages included.
    let mapped_at_start: u64 = groups.iter().flat_map(|g| g.mapped.iter()).map(|(&a, &b)| b - a).sum();
    let reservation = alloc.reservation_bytes(mapped_at_start);
    for g in groups {
        let page_bytes = if g.pool.1 == Pool::Small { SMALL_BUFFER_BYTES } else { LARGE_BUFFER_BYTES };
        // Mapped ranges spread wider than the usual reservation widen it, so that nothing is placed over them.
        let span = g.mapped.values().next_back().map_or(0, |&last| last - g.base);
        let next = bases.get(bases.partition_point(|&base| base <= g.base)).map_or(u64::MAX, |&next| next - g.base);
        let size = reservation.min(next).min(ADDRESS_LIMIT.saturating_sub(g.base)).max(span);
        alloc.expandable.push(Some(ExpandableSegment { base: g.base, size, page_bytes, from_trace: true, owner: g.pool.0 }));
        let index = alloc.expandable.len() - 1;
        let end = g.base + size;
        let mut ids: Vec<BlockId> = Vec::new();
        let mut cursor = g.base;
        for (&a, &b) in &g.mapped {
            if a > cursor {
                ids.push(unmapped_node(&mut alloc, cursor, a, g.stream, g.pool, index));
            }
            alloc.total_allocated_memory += b - a;
            alloc.stats.reserved_bytes.increase(g.pool.1 == Pool::Small, b - a);
            ids.extend(lay_out(&mut alloc, (&live, &stale), &mut live_map, a, b, g.stream, g.pool, Some(index), device)?);
            cursor = b;
        }
        if cursor < end {
            ids.push(unmapped_node(&mut alloc, cursor, end, g.stream, g.pool, index));
        }
        link(&mut alloc, &ids);
    }
    let left_out = live.keys().filter(|address| !live_map.contains_key(address)).count();
    Ok((alloc, live_map, left_out))
}

/// The start state of a what-if with the other kind of memory than the recording's (expandable segments turned on or
/// off): the allocations live in `rebuilt` (the recorded layout, [`rebuild_start_state`]) allocated afresh, in address
/// order, each in its stream and memory pool, by `fresh` (an empty allocator with the what-if's settings, placing
/// memory by the driver's rule): the recorded segments are of the kind this run does not use, so their layout, and
/// the fragmentation in it, cannot be this run's. A block freed by its caller before the start stays so (its
/// `free_completed` is in the trace). Counters start at these values as a rebuilt state's do: no device call
/// counted. Returns the allocator, where each recorded address is now, and how many allocations `fresh` refused (a
/// request no device holds, in a file that contradicts itself): left out, as the rebuild leaves out what lies in no
/// segment.
pub(super) fn reallocate_start_state(
    rebuilt: &CachingAllocator,
    live: &LiveMap,
    mut fresh: CachingAllocator,
) -> (CachingAllocator, LiveMap, usize) {
    let mut blocks: Vec<(u64, u64)> = live.iter().map(|(&recorded, &address)| (address, recorded)).collect();
    blocks.sort_unstable();
    let mut moved = LiveMap::default();
    let mut refused = 0;
    for (address, recorded) in blocks {
        let Some(&id) = rebuilt.active.get(&address) else { continue };
        let node = rebuilt.node(id);
        // What was asked for, at most the block (a file may record a request larger than its block).
        let request = node.requested.min(node.size);
        match fresh.malloc_in(rebuilt.pools[node.owner].id, request, node.stream, None) {
            Ok(new_address) => {
                if !node.allocated {
                    fresh.free_requested(new_address);
                }
                moved.insert(recorded, new_address);
            }
            Err(_) => refused += 1,
        }
    }
    fresh.stats.num_device_alloc = 0;
    fresh.stats.num_device_free = 0;
    fresh.stats.num_ooms = 0;
    // A block freed before the start was allocated and its free requested above; the rebuild counts it in neither
    // (PyTorch's counters of a run begun there would not).
    fresh.stats.allocation.as_started();
    fresh.stats.allocated_bytes.as_started();
    fresh.stats.oversize_allocations.as_started();
    fresh.events.clear();
    (fresh, moved, refused)
}

fn overlap(device: usize, origin: Origin, address: u64, other: Origin) -> EmulationError {
    origin.error(device, format!("the range at {address:#x} overlaps {}", other.path(device)))
}

/// Reserved ranges at the start (whole segments and expandable mapped ranges) must not overlap.
fn check_disjoint(
    device: usize,
    segments: &StartSegments,
    groups: &[Group],
    mapped_origin: &BTreeMap<u64, Origin>,
) -> Result<(), EmulationError> {
    let mut ranges: Vec<(u64, u64, Origin)> =
        segments.iter().map(|(&base, &(size, _, _, origin))| (base, base + size, origin)).collect();
    for g in groups {
        for (&a, &b) in &g.mapped {
            // A range merged from several (or cut by a `segment_map`): named by the last final segment or
            // `segment_unmap` that starts before its end; every mapped range has one.
            if let Some((_, &origin)) = mapped_origin.range(..b).next_back() {
                ranges.push((a, b, origin));
            }
        }
    }
    ranges.sort_by_key(|&(a, b, _)| (a, b));
    for w in ranges.windows(2) {
        let ((_, end, first), (start, _, second)) = (w[0], w[1]);
        if start < end {
            return Err(second.error(
                device,
                format!(
                    "the range at {start:#x} overlaps {} (which ends at {end:#x}) at the start of the recording",
                    first.path(device)
                ),
            ));
        }
    }
    Ok(())
}

fn unmapped_node(alloc: &mut CachingAllocator, start: u64, end: u64, stream: u64, pool: (usize, Pool), index: usize) -> BlockId {
    let id = alloc.new_node(Node::free(start, end - start, stream, pool, false, Some(index)));
    alloc.insert_unmapped(id);
    id
}

/// The final segments' free blocks: address -> (bytes, requested bytes). PyTorch keeps a free block's requested
/// size from its last allocation (`free_block` leaves it, a split's remainder keeps its own, merges keep the freed
/// block's), and writes it in every snapshot; a free gap at the start that is one of these blocks takes it (if the
/// trace uses the block, its allocations set it again).
type StaleRequests = heapscope_core::hash::FastMap<u64, (u64, u64)>;

/// Creates the blocks of the mapped range `[start, end)`: live blocks and the free gaps between them.
/// Links them (for a non-expandable segment) and returns them in address order.
#[allow(clippy::too_many_arguments)]
fn lay_out(
    alloc: &mut CachingAllocator,
    (live, stale): (&BTreeMap<u64, LiveBlock>, &StaleRequests),
    live_map: &mut LiveMap,
    start: u64,
    end: u64,
    stream: u64,
    pool: (usize, Pool),
    expandable: Option<usize>,
    device: usize,
) -> Result<Vec<BlockId>, EmulationError> {
    let max_split = alloc.max_split_size();
    let small = pool.1 == Pool::Small;
    let blocks: Vec<(u64, LiveBlock)> = live.range(start..end).map(|(&a, &b)| (a, b)).collect();
    let mut ids = Vec::new();
    let mut cursor = start;
    let template = Node::free(start, 0, stream, pool, true, expandable);
    let gap = |addr: u64, size: u64| {
        let requested = stale.get(&addr).filter(|&&(bytes, _)| bytes == size).map_or(0, |&(_, requested)| requested);
        Node { addr, size, requested, ..template.clone() }
    };
    for (k, &(addr, b)) in blocks.iter().enumerate() {
        if addr > cursor {
            ids.push(alloc.new_node(gap(cursor, addr - cursor)));
        }
        let boundary = blocks.get(k + 1).map_or(end, |n| n.0);
        if let Some(size) = b.size
            && size > boundary - addr
        {
            return Err(b.origin.error(
                device,
                format!(
                    "the live block at {addr:#x} of {size} bytes runs past {boundary:#x} (the next live block or the end of \
                     its segment at the start of the recording)"
                ),
            ));
        }
        // An allocation the trace placed above it while it was live bounds it as the next live block does.
        let limit = b.observed_end.filter(|&observed| observed > addr && observed <= boundary).unwrap_or(boundary);
        let size = b.size.unwrap_or_else(|| {
            let rounded = round_size(b.requested, &alloc.conf).min(limit - addr);
            let gap = limit - addr - rounded;
            if pool.1 == Pool::Large && expandable.is_none() && (gap <= SMALL_SIZE_BYTES || rounded >= max_split) {
                limit - addr
            } else {
                rounded
            }
        });
        let allocated = !b.pending;
        let id = alloc.new_node(Node { addr, size, requested: b.requested, allocated, active: true, ..template.clone() });
        ids.push(id);
        alloc.active.insert(addr, id);
        live_map.insert(addr, addr);
        let st = &mut alloc.stats;
        if allocated {
            st.allocation.increase(small, 1);
            st.allocated_bytes.increase(small, size);
            if size >= max_split {
                st.oversize_allocations.increase(1);
            }
        }
        st.active.increase(small, 1);
        st.active_bytes.increase(small, size);
        st.requested_bytes.increase(small, b.requested);
        cursor = addr + size;
    }
    if cursor < end {
        ids.push(alloc.new_node(gap(cursor, end - cursor)));
    }
    for &id in &ids {
        if !alloc.node(id).active {
            alloc.insert_free(id);
        }
    }
    if expandable.is_none() {
        link(alloc, &ids);
    }
    Ok(ids)
}

fn link(alloc: &mut CachingAllocator, ids: &[BlockId]) {
    for w in ids.windows(2) {
        alloc.node_mut(w[0]).next = Some(w[1]);
        alloc.node_mut(w[1]).prev = Some(w[0]);
    }
}
