//! The virtual segments of expandable segments at the start of a recording: one address-space reservation per
//! stream and pool (small or large, of the allocator's own memory pool or of a private one), with the page ranges
//! mapped in it ([`Group`]), found from the final segments marked expandable and from the trace's `segment_map` /
//! `segment_unmap` entries ([`Groups::add_seen_only_in_trace`]), and looked up by stream, pool and address in
//! logarithmic time ([`Groups::holding`]): a hostile file of a hundred thousand reservations costs no more than its
//! entries. A memory pool is the allocator's index of it (0 for its own; a final segment's `segment_pool_id`, a trace
//! entry's `pool_id`).
//!
//! Reservations lie [`EXPANDABLE_VIRTUAL_BYTES`] apart at most as this emulation allows for each (or as far as the final
//! segments show one mapped, on a GPU above 114 GiB: [`Group::reach`]), but on a GPU of less
//! memory than that (PyTorch reserves about 1.125 times the device's memory) a reservation of one pool or stream lies
//! in reach of another's: so a page run belongs only to a reservation of its own stream and pool, and the pool of a
//! run comes from the allocations the trace places in it (the small pool's are of at most 1 MiB), else from its
//! length (a run that is no multiple of the large pool's 20 MiB page is the small pool's).

use std::collections::BTreeMap;

use super::{EXPANDABLE_VIRTUAL_BYTES, LARGE_BUFFER_BYTES, SMALL_SIZE_BYTES};
use crate::snapshot::{Action, Pool, TraceEntry};

/// A group of expandable mapped ranges: one virtual segment.
#[derive(Clone, Debug)]
pub(super) struct Group {
    pub(super) stream: u64,
    /// (memory pool, small or large).
    pub(super) pool: (usize, Pool),
    pub(super) base: u64,
    /// Mapped ranges: start -> end.
    pub(super) mapped: BTreeMap<u64, u64>,
    /// The end of the highest range known to lie in it (0 for none): a range a final segment shows mapped, a page run
    /// the trace maps or unmaps from inside it. The reservation reaches at least that far.
    known_end: u64,
}

impl Group {
    pub(super) fn new(stream: u64, pool: (usize, Pool), base: u64) -> Self {
        Group { stream, pool, base, mapped: BTreeMap::new(), known_end: 0 }
    }

    /// Adds `[start, end)`, a range a final segment shows mapped.
    pub(super) fn show_mapped(&mut self, start: u64, end: u64) {
        self.mapped.insert(start, end);
        self.holds_up_to(end);
    }

    /// Something ending at `end` lies in the reservation.
    fn holds_up_to(&mut self, end: u64) {
        self.known_end = self.known_end.max(end);
    }

    /// How far above its base the reservation reaches at least: [`EXPANDABLE_VIRTUAL_BYTES`], or as far as what is
    /// known to lie in it (PyTorch reserves 9/8 of the device, more than that on a device above 114 GiB).
    fn reach(&self) -> u64 {
        EXPANDABLE_VIRTUAL_BYTES.max(self.known_end.saturating_sub(self.base))
    }
}

/// The virtual segments, indexed by stream, pool and base.
#[derive(Debug, Default)]
pub(super) struct Groups {
    pub(super) list: Vec<Group>,
    /// (stream, pool, base) -> index into `list`; a group merged into another is no longer here.
    by_base: BTreeMap<(u64, (usize, Pool), u64), usize>,
    /// How many groups of each stream and memory pool begin at each base (small or large).
    bases: BTreeMap<(u64, usize, u64), usize>,
    /// The memory pools with a group.
    owners: Vec<usize>,
}

impl Groups {
    /// The group of `stream` and `pool` holding final segments (one a stream and pool: there are no new ones yet),
    /// created at `base` if there is none yet, and its base lowered to `base`.
    pub(super) fn of_final(&mut self, stream: u64, pool: (usize, Pool), base: u64) -> usize {
        let found = self.by_base.range((stream, pool, 0)..=(stream, pool, u64::MAX)).next().map(|(_, &index)| index);
        match found {
            Some(index) => {
                if base < self.list[index].base {
                    self.set_base(index, base);
                }
                index
            }
            None => self.insert(Group::new(stream, pool, base)),
        }
    }

    fn insert(&mut self, group: Group) -> usize {
        let index = self.list.len();
        self.by_base.insert((group.stream, group.pool, group.base), index);
        *self.bases.entry((group.stream, group.pool.0, group.base)).or_default() += 1;
        if !self.owners.contains(&group.pool.0) {
            self.owners.push(group.pool.0);
        }
        self.list.push(group);
        index
    }

    fn set_base(&mut self, index: usize, base: u64) {
        let (stream, pool, old) = (self.list[index].stream, self.list[index].pool, self.list[index].base);
        self.unindex(stream, pool, old);
        self.list[index].base = base;
        self.by_base.insert((stream, pool, base), index);
        *self.bases.entry((stream, pool.0, base)).or_default() += 1;
    }

    /// The group of `stream` and `pool` at `base` is no longer indexed.
    fn unindex(&mut self, stream: u64, pool: (usize, Pool), base: u64) {
        self.by_base.remove(&(stream, pool, base));
        if let Some(count) = self.bases.get_mut(&(stream, pool.0, base)) {
            *count -= 1;
            if *count == 0 {
                self.bases.remove(&(stream, pool.0, base));
            }
        }
    }

    /// The group of `stream` and memory pool `owner`'s `pool` (either pool for `None`) whose address space holds
    /// `addr`: the highest base at or below it, if `addr` is in its reach ([`Group::reach`]) and no group of
    /// another memory pool begins between.
    pub(super) fn holding(&self, stream: u64, owner: usize, pool: Option<Pool>, addr: u64) -> Option<usize> {
        let pools: &[Pool] = match &pool {
            Some(pool) => std::slice::from_ref(pool),
            None => &[Pool::Small, Pool::Large],
        };
        pools
            .iter()
            .map(|&pool| (owner, pool))
            .filter_map(|pool| self.by_base.range((stream, pool, 0)..=(stream, pool, addr)).next_back())
            .filter(|&(&(_, _, base), &index)| {
                addr - base < self.list[index].reach() && !self.other_owner_begins_between(stream, owner, base, addr)
            })
            .max_by_key(|&(&(_, _, base), _)| base)
            .map(|(_, &index)| index)
    }

    /// Whether a group of `stream` and another memory pool than `owner` begins in `(from, to]`: two reservations
    /// never overlap, so a run above one of another memory pool's is not in the reservation below it. (A group of the
    /// same memory pool's other pool is let be here: which pool a run is comes from a guess, `RunPools`.)
    fn other_owner_begins_between(&self, stream: u64, owner: usize, from: u64, to: u64) -> bool {
        from < to
            && self
                .owners
                .iter()
                .filter(|&&other| other != owner)
                .any(|&other| self.bases.range((stream, other, from + 1)..=(stream, other, to)).next().is_some())
    }

    /// Whether a group of `stream` and the other pool of `owner`'s than `pool` begins in `(from, to]`.
    fn other_pool_begins_between(&self, stream: u64, (owner, pool): (usize, Pool), from: u64, to: u64) -> bool {
        let other = (owner, if pool == Pool::Small { Pool::Large } else { Pool::Small });
        from < to && self.by_base.range((stream, other, from + 1)..=(stream, other, to)).next().is_some()
    }

    /// Adds the virtual segments that the trace maps or unmaps pages of but the final segments do not show (every
    /// page of them unmapped by the end, as after `empty_cache`): without them, the pages such a segment had mapped at
    /// the start of a recording begun mid-run, and the allocations live in them, would be lost. The runs no group
    /// holds, by stream and address, each begin a group of their pool unless one begun below holds it (in reach, and
    /// no group of the other pool between); a new group just below a final one of the same stream and pool is that
    /// group, which then begins lower. `owner` is the memory pool of entry `k`.
    pub(super) fn add_seen_only_in_trace(&mut self, trace: &[TraceEntry], pools: &RunPools, owner: impl Fn(usize) -> usize) {
        let mut runs: Vec<(u64, usize, u64, u64, Option<Pool>)> = trace
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap))
            .map(|(k, e)| (e.stream, owner(k), e.addr, e.addr.saturating_add(e.size), pools.of(e.addr)))
            .collect();
        if runs.is_empty() {
            return;
        }
        // By address, so that a run a final group holds widens its reach before the runs above it are asked.
        runs.sort_unstable_by_key(|&(stream, owner, addr, ..)| (stream, owner, addr));
        let mut unseen = Vec::new();
        for (stream, owner, addr, end, pool) in runs {
            match self.holding(stream, owner, pool, addr) {
                Some(index) => self.list[index].holds_up_to(end),
                None => unseen.push((stream, owner, addr, end, pool)),
            }
        }
        let finals = self.list.len();
        // The group each pool of the current stream and memory pool has open: ((stream, owner), [large, small]).
        let mut open: (Option<(u64, usize)>, [Option<usize>; 2]) = (None, [None, None]);
        for (stream, owner, addr, end, pool) in unseen {
            if open.0 != Some((stream, owner)) {
                open = (Some((stream, owner)), [None, None]);
            }
            let joinable = |pool: Pool| {
                open.1[usize::from(pool == Pool::Small)].filter(|&index| {
                    let base = self.list[index].base;
                    addr - base < self.list[index].reach()
                        && !self.other_pool_begins_between(stream, (owner, pool), base, addr)
                        && !self.other_owner_begins_between(stream, owner, base, addr)
                })
            };
            let joined = match pool {
                Some(pool) => joinable(pool),
                None => [joinable(Pool::Large), joinable(Pool::Small)].into_iter().flatten().max_by_key(|&i| self.list[i].base),
            };
            let index = match joined {
                Some(index) => index,
                None => {
                    let pool = pool.unwrap_or(Pool::Large);
                    let index = self.insert(Group::new(stream, (owner, pool), addr));
                    open.1[usize::from(pool == Pool::Small)] = Some(index);
                    index
                }
            };
            self.list[index].holds_up_to(end);
        }
        for final_group in 0..finals {
            let Group { stream, pool, base, .. } = self.list[final_group];
            let below =
                self.by_base.range((stream, pool, 0)..(stream, pool, base)).next_back().map(|(&key, &index)| (key, index));
            if let Some(((_, _, new_base), new)) = below
                && new >= finals
                && base - new_base < self.list[new].reach()
            {
                self.unindex(stream, pool, new_base);
                self.set_base(final_group, new_base);
                let known_end = self.list[new].known_end;
                self.list[final_group].holds_up_to(known_end);
            }
        }
    }

    /// The groups with pages mapped at the start, and every reservation's base (with `more`, the ordinary segments'),
    /// sorted: an expandable segment ends by the next base above its own.
    ///
    /// Reservations never overlap. Layouts no PyTorch run makes (pools guessed wrong for runs that mix small and
    /// large requests, a file another allocator's replay wrote) can have them do so, and mapping the unmapped range of
    /// one would place blocks over the other's, still live: so a group that shares its base with another begins at its
    /// first mapped range instead, and a group with ranges mapped at or above the next base is split there, its ranges
    /// above beginning a reservation of their own (until none is).
    pub(super) fn mapped_at_start(self, more: impl Iterator<Item = u64>) -> (Vec<Group>, Vec<u64>) {
        let mut groups: Vec<Group> = self.list.into_iter().filter(|g| !g.mapped.is_empty()).collect();
        let more: Vec<u64> = more.collect();
        // Each move raises a base to its group's first range (which no other group's range shares): done when none is
        // shared, or no group sharing one can move.
        loop {
            let mut shared: BTreeMap<u64, usize> = BTreeMap::new();
            for group in &groups {
                *shared.entry(group.base).or_default() += 1;
            }
            let mut moved = false;
            for group in &mut groups {
                if shared[&group.base] > 1
                    && let Some(&first) = group.mapped.keys().next()
                    && first > group.base
                {
                    group.base = first;
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        loop {
            let mut bases: Vec<u64> = groups.iter().map(|g| g.base).chain(more.iter().copied()).collect();
            bases.sort_unstable();
            let mut split = Vec::new();
            for group in &mut groups {
                if let Some(&next) = bases.get(bases.partition_point(|&base| base <= group.base)) {
                    let above = group.mapped.split_off(&next);
                    if let Some(&start) = above.keys().next() {
                        split.push(Group { base: start, mapped: above, ..Group::new(group.stream, group.pool, start) });
                    }
                }
            }
            if split.is_empty() {
                groups.retain(|g| !g.mapped.is_empty());
                return (groups, bases);
            }
            groups.extend(split);
        }
    }
}

/// The pool of a page run of the trace, where something tells it: a final expandable segment the run overlaps (its
/// `segment_type`, what the file says), else the allocations the trace places in the run (the small pool serves
/// requests of at most 1 MiB), else the run's length (no multiple of the large pool's 20 MiB page: the small pool's).
/// (A paged heap's export maps its large segments in pages of 2 MiB: guessed by length, their runs were the small
/// pool's, beside the final segments' large reservation over the same pages, and the start state held them twice.)
/// Runs that overlap are pages of one reservation, so of one pool: the answer is one for each set of
/// overlapping runs (or runs an allocation crosses between), taken from all of them (runs told apart one by one gave a
/// page to both pools where a layout mixes requests, as a paged heap's does, and the start state then held it twice).
#[derive(Debug)]
pub(super) struct RunPools {
    /// The trace's runs merged where they overlap: start -> (end, pool).
    merged: BTreeMap<u64, (u64, Option<Pool>)>,
}

impl RunPools {
    /// Nothing to index (no allocation gathered, nor sorted) for a trace that maps and unmaps no page: most
    /// recordings, and every emulation of them starts here.
    /// `finals`: the final expandable segments, as start -> (end, pool).
    pub(super) fn new(trace: &[TraceEntry], finals: &BTreeMap<u64, (u64, Pool)>) -> Self {
        let mut runs: Vec<(u64, u64)> = trace
            .iter()
            .filter(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap))
            .map(|e| (e.addr, e.addr.saturating_add(e.size)))
            .collect();
        if runs.is_empty() {
            return RunPools { merged: BTreeMap::new() };
        }
        runs.sort_unstable();
        let mut allocations: Vec<(u64, u64)> = trace
            .iter()
            .filter(|e| matches!(e.action, Action::Alloc | Action::FreeCompleted))
            .map(|e| (e.addr, e.size))
            .collect();
        allocations.sort_unstable();
        // Whether an allocation runs across `boundary` (the nearest one below it, enough where they lie side by side).
        let crossed = |boundary: u64| {
            let below = allocations.partition_point(|&(at, _)| at < boundary);
            below.checked_sub(1).is_some_and(|index| allocations[index].0.saturating_add(allocations[index].1) > boundary)
        };
        // (start, end, whether a run is no multiple of the large pool's page); runs that meet where an allocation
        // crosses from one to the other are one reservation's too.
        let mut sets: Vec<(u64, u64, bool)> = Vec::new();
        for (start, end) in runs {
            let small_length = !(end - start).is_multiple_of(LARGE_BUFFER_BYTES);
            match sets.last_mut() {
                Some(last) if start < last.1 || (start == last.1 && crossed(start)) => {
                    last.1 = last.1.max(end);
                    last.2 |= small_length;
                }
                _ => sets.push((start, end, small_length)),
            }
        }
        let merged = sets
            .into_iter()
            .map(|(start, end, small_length)| {
                let first = allocations.partition_point(|&(at, _)| at < start);
                let shown = finals.range(..end).next_back().filter(|&(_, &(final_end, _))| final_end > start);
                let pool = match allocations.get(first) {
                    _ if shown.is_some() => shown.map(|(_, &(_, pool))| pool),
                    Some(&(at, requested)) if at < end => {
                        Some(if requested <= SMALL_SIZE_BYTES { Pool::Small } else { Pool::Large })
                    }
                    _ if small_length => Some(Pool::Small),
                    _ => None,
                };
                (start, (end, pool))
            })
            .collect();
        RunPools { merged }
    }

    /// The pool of the trace's run at `addr` (`None` where nothing tells it, or for no run of the trace).
    pub(super) fn of(&self, addr: u64) -> Option<Pool> {
        self.merged.range(..=addr).next_back().filter(|(_, (end, _))| addr < *end).and_then(|(_, &(_, pool))| pool)
    }
}

/// Removes `[start, end)` from disjoint `ranges` (start -> end).
pub fn remove_range(ranges: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    let overlapping: Vec<(u64, u64)> =
        ranges.range(..end).rev().take_while(|&(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
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

/// Adds `[start, end)` to disjoint `ranges` (start -> end), merging the ranges it touches.
pub fn add_range(ranges: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    let (mut s, mut e) = (start, end);
    let touching: Vec<(u64, u64)> = ranges.range(..=end).rev().take_while(|&(_, &x)| x >= start).map(|(&a, &b)| (a, b)).collect();
    for (a, b) in touching {
        ranges.remove(&a);
        s = s.min(a);
        e = e.max(b);
    }
    ranges.insert(s, e);
}
