//! The allocator state at the start of a recording, rebuilt from the snapshot's final `segments` and its
//! trace walked backwards — the way MemoryViz (`torch/utils/viz/MemoryViz.js`) builds its initial state
//! for a trace that began mid-run: an `alloc` seen going backwards means the block was not live before
//! it, a `free_completed` means it was; `segment_alloc` / `segment_map` remove memory that the recording
//! saw being reserved, `segment_free` / `segment_unmap` restore memory it saw being returned (also in a virtual
//! segment the final segments no longer show, every page of it unmapped by the end).
//!
//! Free blocks are the gaps between live blocks (free neighbours always merge). A live block known only
//! from its free entry carries the requested size; its block size is `round_size` of it, grown to the next
//! boundary where PyTorch would not have split the remainder (`should_split`: a large-pool remainder of at
//! most 1 MiB, or an oversize block) — unless the trace shows where it ends: the first allocation placed
//! after it while it is still live takes the front of the free block that follows it. A recording that starts from an empty allocator rebuilds to empty.
//! Counters start at the rebuilt values (peak = current, nothing freed yet).

use std::collections::BTreeMap;

use super::validate::{EmulationError, Origin};
use super::{
    BlockId, CachingAllocator, EXPANDABLE_VIRTUAL_BYTES, ExpandableSegment, LARGE_BUFFER_BYTES, Node, SMALL_BUFFER_BYTES,
};
use super::{SMALL_SIZE_BYTES, round_size};
use crate::alloc_conf::AllocConf;
use crate::snapshot::{Action, BlockState, Pool, Snapshot};

/// Addresses of live allocations: recorded address -> emulated address.
pub(super) type LiveMap = heapscope_core::hash::FastMap<u64, u64>;

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

/// A group of expandable mapped ranges: one virtual segment.
#[derive(Clone, Debug)]
struct Group {
    stream: u64,
    pool: Pool,
    base: u64,
    /// Mapped ranges: start -> end.
    mapped: BTreeMap<u64, u64>,
}

/// The allocator at the start of device `device`'s recording, the live allocations (recorded address -> emulated
/// address, equal here), and how many allocations live at the start lie in no segment the recording shows (PyTorch
/// could not have held them: left out).
///
/// Expects a snapshot that passed `validate` (every range ends by `ADDRESS_LIMIT`); reserved ranges that
/// overlap at the start, or a live block of known size that runs into the next live block or past its
/// segment, are errors naming where they come from.
pub(super) fn rebuild_start_state(
    snapshot: &Snapshot,
    device: usize,
    conf: &AllocConf,
    capacity_bytes: Option<u64>,
) -> Result<(CachingAllocator, LiveMap, usize), EmulationError> {
    let mut alloc = CachingAllocator::new(conf.clone(), capacity_bytes);
    let mut live_map = LiveMap::default();
    let empty = Vec::new();
    let trace = snapshot.device_traces.get(device).unwrap_or(&empty);

    let mut segments: BTreeMap<u64, (u64, u64, Pool, Origin)> = BTreeMap::new();
    let mut groups: Vec<Group> = Vec::new();
    // A hash map while walking (most entries insert or remove), ordered by address once at the end.
    let mut live: heapscope_core::hash::FastMap<u64, LiveBlock> = heapscope_core::hash::FastMap::default();
    // Expandable mapped ranges: start -> origin, for errors.
    let mut mapped_origin: BTreeMap<u64, Origin> = BTreeMap::new();
    for (i, s) in snapshot.segments.iter().enumerate().filter(|(_, s)| s.device as usize == device) {
        if s.is_expandable {
            let gi = match groups.iter().position(|g| g.stream == s.stream && g.pool == s.segment_type) {
                Some(i) => i,
                None => {
                    groups.push(Group { stream: s.stream, pool: s.segment_type, base: s.address, mapped: BTreeMap::new() });
                    groups.len() - 1
                }
            };
            let g = &mut groups[gi];
            g.base = g.base.min(s.address);
            if let Some(&other) = mapped_origin.get(&s.address) {
                return Err(overlap(device, Origin::Segment(i), s.address, other));
            }
            mapped_origin.insert(s.address, Origin::Segment(i));
            g.mapped.insert(s.address, s.address + s.total_size);
        } else {
            if let Some(&(_, _, _, other)) = segments.get(&s.address) {
                return Err(overlap(device, Origin::Segment(i), s.address, other));
            }
            segments.insert(s.address, (s.total_size, s.stream, s.segment_type, Origin::Segment(i)));
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
    let group_of = |groups: &[Group], addr: u64| -> Option<usize> {
        groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.base <= addr && addr < g.base + EXPANDABLE_VIRTUAL_BYTES)
            .max_by_key(|(_, g)| g.base)
            .map(|(i, _)| i)
    };
    groups_seen_only_in_trace(trace, &mut groups, group_of);
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
                segments.insert(e.addr, (e.size, e.stream, pool, Origin::Entry(k)));
            }
            Action::SegmentMap => {
                if let Some(gi) = group_of(&groups, e.addr) {
                    let g = &mut groups[gi];
                    g.base = g.base.min(e.addr);
                    remove_range(&mut g.mapped, e.addr, e.addr + e.size);
                }
            }
            Action::SegmentUnmap => {
                if let Some(gi) = group_of(&groups, e.addr) {
                    let g = &mut groups[gi];
                    g.base = g.base.min(e.addr);
                    add_range(&mut g.mapped, e.addr, e.addr + e.size);
                    mapped_origin.entry(e.addr).or_insert(Origin::Entry(k));
                }
            }
            _ => {}
        }
    }
    let mut live: BTreeMap<u64, LiveBlock> = live.into_iter().collect();
    // Where a block of unknown size ends: the first allocation placed after it while it is still live
    // takes the front of the free block that follows it.
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
    check_disjoint(device, &segments, &groups, &mapped_origin)?;
    // Pending frees at the start are completed by the trace; blocks whose free was never requested before
    // the start stay allocated.
    let max_split = conf.max_split_size.unwrap_or(u64::MAX);
    for (&base, &(size, stream, pool, _)) in &segments {
        alloc.insert_segment(base, size);
        let small = pool == Pool::Small;
        alloc.stats.segment.increase(small, 1);
        alloc.stats.reserved_bytes.increase(small, size);
        if size >= max_split {
            alloc.stats.oversize_segments.increase(1);
        }
        alloc.total_allocated_memory += size;
        let ids = lay_out(&mut alloc, &live, &mut live_map, base, base + size, stream, pool, None, device)?;
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
    let groups: Vec<Group> = groups.into_iter().filter(|g| !g.mapped.is_empty()).collect();
    // Reservations start at these bases: an expandable segment ends by the next one above it.
    let bases: Vec<u64> = groups.iter().map(|g| g.base).chain(segments.keys().copied()).collect();
    for g in groups {
        let page_bytes = if g.pool == Pool::Small { SMALL_BUFFER_BYTES } else { LARGE_BUFFER_BYTES };
        // Mapped ranges spread wider than the usual reservation widen it, so that nothing is placed over them.
        let span = g.mapped.values().next_back().map_or(0, |&last| last - g.base);
        let next = bases.iter().filter(|&&base| base > g.base).min().map_or(u64::MAX, |&next| next - g.base);
        let size = EXPANDABLE_VIRTUAL_BYTES.min(next).max(span);
        alloc.expandable.push(Some(ExpandableSegment { base: g.base, size, page_bytes, from_trace: true }));
        let index = alloc.expandable.len() - 1;
        let end = g.base + size;
        let mut ids: Vec<BlockId> = Vec::new();
        let mut cursor = g.base;
        for (&a, &b) in &g.mapped {
            if a > cursor {
                ids.push(unmapped_node(&mut alloc, cursor, a, g.stream, g.pool, index));
            }
            alloc.total_allocated_memory += b - a;
            alloc.stats.reserved_bytes.increase(g.pool == Pool::Small, b - a);
            ids.extend(lay_out(&mut alloc, &live, &mut live_map, a, b, g.stream, g.pool, Some(index), device)?);
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

/// Adds the virtual segments that the trace maps or unmaps pages of but the final segments do not show (every
/// page of them unmapped by the end, as after `empty_cache`): without them, the pages such a segment had mapped
/// at the start of a recording begun mid-run, and the allocations live in them, would be lost.
///
/// Their `segment_map` and `segment_unmap` entries, by stream and address: a page run that is no multiple of the large
/// pool's page ([`LARGE_BUFFER_BYTES`]) is the small pool's, and the small pool's runs make a segment from the lowest
/// up (within [`EXPANDABLE_VIRTUAL_BYTES`]); another run inside the span of one is that segment's, else the large
/// pool's runs make segments the same way, never across a small one (two reservations of a GPU with less memory lie
/// closer together than the address space allowed for each; so a small run in reach of a final large segment's group
/// is not that group's). A new segment just below a final segment's group of the same stream and pool is that group,
/// which then begins lower.
fn groups_seen_only_in_trace(
    trace: &[crate::snapshot::TraceEntry],
    groups: &mut Vec<Group>,
    group_of: impl Fn(&[Group], u64) -> Option<usize>,
) {
    // A run is seen when a final segment's group holds its address, and is of the small pool where the run is.
    let seen = |addr: u64, size: u64| {
        group_of(groups, addr).is_some_and(|g| groups[g].pool == Pool::Small || size.is_multiple_of(LARGE_BUFFER_BYTES))
    };
    let mut unseen: Vec<(u64, u64, u64)> = trace
        .iter()
        .filter(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap) && !seen(e.addr, e.size))
        .map(|e| (e.stream, e.addr, e.size))
        .collect();
    if unseen.is_empty() {
        return;
    }
    unseen.sort_unstable();
    let new_group = |stream: u64, pool: Pool, base: u64| Group { stream, pool, base, mapped: BTreeMap::new() };
    // The small pool's segments, each with the end of its highest run.
    let mut small: Vec<(Group, u64)> = Vec::new();
    for &(stream, addr, size) in unseen.iter().filter(|&&(_, _, size)| !size.is_multiple_of(LARGE_BUFFER_BYTES)) {
        let end = addr.saturating_add(size);
        match small.last_mut() {
            Some((g, g_end)) if g.stream == stream && addr < g.base + EXPANDABLE_VIRTUAL_BYTES => *g_end = (*g_end).max(end),
            _ => small.push((new_group(stream, Pool::Small, addr), end)),
        }
    }
    let mut large: Vec<Group> = Vec::new();
    for &(stream, addr, _) in unseen.iter().filter(|&&(_, _, size)| size.is_multiple_of(LARGE_BUFFER_BYTES)) {
        if small.iter().any(|(g, end)| g.stream == stream && g.base <= addr && addr < *end) {
            continue;
        }
        let joins = large.last().is_some_and(|g| {
            g.stream == stream
                && addr < g.base + EXPANDABLE_VIRTUAL_BYTES
                && !small.iter().any(|(s, _)| s.stream == stream && g.base < s.base && s.base <= addr)
        });
        if !joins {
            large.push(new_group(stream, Pool::Large, addr));
        }
    }
    for new in small.into_iter().map(|(g, _)| g).chain(large) {
        let above = groups.iter_mut().filter(|g| {
            g.stream == new.stream && g.pool == new.pool && new.base < g.base && g.base < new.base + EXPANDABLE_VIRTUAL_BYTES
        });
        match above.min_by_key(|g| g.base) {
            Some(g) => g.base = new.base,
            None => groups.push(new),
        }
    }
}

fn overlap(device: usize, origin: Origin, address: u64, other: Origin) -> EmulationError {
    origin.error(device, format!("the range at {address:#x} overlaps {}", other.path(device)))
}

/// Reserved ranges at the start (whole segments and expandable mapped ranges) must not overlap.
fn check_disjoint(
    device: usize,
    segments: &BTreeMap<u64, (u64, u64, Pool, Origin)>,
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

fn unmapped_node(alloc: &mut CachingAllocator, start: u64, end: u64, stream: u64, pool: Pool, index: usize) -> BlockId {
    let id = alloc.new_node(Node::free(start, end - start, stream, pool, false, Some(index)));
    alloc.insert_unmapped(id);
    id
}

/// Creates the blocks of the mapped range `[start, end)`: live blocks and the free gaps between them.
/// Links them (for a non-expandable segment) and returns them in address order.
#[allow(clippy::too_many_arguments)]
fn lay_out(
    alloc: &mut CachingAllocator,
    live: &BTreeMap<u64, LiveBlock>,
    live_map: &mut LiveMap,
    start: u64,
    end: u64,
    stream: u64,
    pool: Pool,
    expandable: Option<usize>,
    device: usize,
) -> Result<Vec<BlockId>, EmulationError> {
    let max_split = alloc.max_split_size();
    let small = pool == Pool::Small;
    let blocks: Vec<(u64, LiveBlock)> = live.range(start..end).map(|(&a, &b)| (a, b)).collect();
    let mut ids = Vec::new();
    let mut cursor = start;
    let template = Node::free(start, 0, stream, pool, true, expandable);
    for (k, &(addr, b)) in blocks.iter().enumerate() {
        if addr > cursor {
            ids.push(alloc.new_node(Node { addr: cursor, size: addr - cursor, ..template.clone() }));
        }
        let boundary = blocks.get(k + 1).map_or(end, |n| n.0);
        let observed = b.observed_end.filter(|&e| e <= boundary).map(|e| e - addr);
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
        let size = b.size.or(observed).unwrap_or_else(|| {
            let rounded = round_size(b.requested, &alloc.conf).min(boundary - addr);
            let gap = boundary - addr - rounded;
            if pool == Pool::Large && expandable.is_none() && (gap <= SMALL_SIZE_BYTES || rounded >= max_split) {
                boundary - addr
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
        ids.push(alloc.new_node(Node { addr: cursor, size: end - cursor, ..template }));
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

fn remove_range(ranges: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    let overlapping: Vec<(u64, u64)> = ranges.range(..end).filter(|&(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
    for (s, e) in overlapping {
        ranges.remove(&s);
        if s < start {
            ranges.insert(s, start);
        }
        if e > end {
            ranges.insert(end, e);
        }
    }
}

fn add_range(ranges: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    let (mut s, mut e) = (start, end);
    let touching: Vec<(u64, u64)> = ranges.range(..=end).filter(|&(_, &x)| x >= start).map(|(&a, &b)| (a, b)).collect();
    for (a, b) in touching {
        ranges.remove(&a);
        s = s.min(a);
        e = e.max(b);
    }
    ranges.insert(s, e);
}
