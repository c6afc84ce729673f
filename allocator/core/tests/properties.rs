//! Property tests: every policy against the reference model of `heapscope_core::check`, and the heap's
//! accounting and verdicts under random operations.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use heapscope_core::check::{Checker, Op};
use heapscope_core::compaction::{Algorithm, Budget};
use heapscope_core::{
    DeviceEvent, Error, Heap, HeapConfig, OomCause, PagedConfig, PagedHeap, PolicyConfig, PolicyKind, ReleaseRule, Request,
    SimulatedSource, UnmapRule,
};
use proptest::prelude::*;

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 1u64..4096,
        6 => 4096u64..(1 << 20),
        3 => (1u64 << 20)..(64 << 20),
        1 => Just(0u64),
        1 => (u64::MAX - 4096)..=u64::MAX,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (size(), 0u8..21, any::<bool>()).prop_map(|(size_bytes, align_log2, optimal)| Op::Alloc { size_bytes, align_log2, optimal }),
        2 => (size(), 0u8..21, any::<bool>(), any::<usize>())
            .prop_map(|(size_bytes, align_log2, optimal, pick)| Op::AllocAt { size_bytes, align_log2, optimal, pick }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Op::FreeAgain { pick }),
        1 => Just(Op::FreeForeign),
    ]
}

fn capacity() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..8192, 4 => 8192u64..(4 << 20), 4 => (4u64 << 20)..(512 << 20), 1 => (1u64 << 40)..=u64::MAX]
}

fn config() -> impl Strategy<Value = PolicyConfig> {
    (0u32..9, prop_oneof![3 => Just(1u64), 1 => Just(1024u64), 1 => Just(65536u64)], any::<bool>()).prop_map(
        |(align_log2, granularity_bytes, best_fit_exact)| PolicyConfig {
            min_align_bytes: 1 << align_log2,
            granularity_bytes,
            best_fit_exact,
            ..PolicyConfig::default()
        },
    )
}

/// Cases per property: `PROPTEST_CASES` when set (for long local runs), else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(default)
}

fn run(kind: PolicyKind, capacity: u64, config: PolicyConfig, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut checker = Checker::new(kind, capacity, config).map_err(|error| TestCaseError::fail(error.to_string()))?;
    for (step, op) in ops.iter().enumerate() {
        checker.apply(*op).map_err(|violation| TestCaseError::fail(format!("step {step} {op:?}: {violation}")))?;
    }
    checker.finish().map_err(TestCaseError::fail)
}

macro_rules! policy_properties {
    ($($test:ident => $kind:expr),* $(,)?) => {$(
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(cases(128)))]
            #[test]
            fn $test(capacity in capacity(), config in config(), ops in prop::collection::vec(op(), 1..300)) {
                run($kind, capacity, config, &ops)?;
            }
        }
    )*};
}

policy_properties! {
    tlsf_keeps_the_contract => PolicyKind::Tlsf,
    best_fit_keeps_the_contract => PolicyKind::BestFit,
    first_fit_keeps_the_contract => PolicyKind::FirstFit,
    buddy_keeps_the_contract => PolicyKind::Buddy,
    linear_bump_keeps_the_contract => PolicyKind::Linear(heapscope_core::LinearMode::Bump),
    linear_stack_keeps_the_contract => PolicyKind::Linear(heapscope_core::LinearMode::Stack),
    linear_ring_keeps_the_contract => PolicyKind::Linear(heapscope_core::LinearMode::Ring),
    slab_keeps_the_contract => PolicyKind::Slab,
}

#[derive(Clone, Debug)]
enum HeapOp {
    Alloc(u64),
    Free(usize),
}

fn heap_op() -> impl Strategy<Value = HeapOp> {
    prop_oneof![
        3 => prop_oneof![1u64..(1 << 20), (1u64 << 20)..(300 << 20)].prop_map(HeapOp::Alloc),
        2 => any::<usize>().prop_map(HeapOp::Free),
    ]
}

fn release_rule() -> impl Strategy<Value = ReleaseRule> {
    prop_oneof![
        Just(ReleaseRule::Immediately),
        Just(ReleaseRule::KeepOne),
        Just(ReleaseRule::OnPressure),
        Just(ReleaseRule::Never)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(48)))]
    #[test]
    fn heap_accounting_and_verdicts(
        kind in prop::sample::select(PolicyKind::ALL.to_vec()),
        release in release_rule(),
        device_mib in 64u64..2048,
        budget_mib in prop::option::of(64u64..2048),
        block_mib in 1u64..512,
        dedicated_mib in 1u64..1024,
        policy_config in config(),
        ops in prop::collection::vec(heap_op(), 1..120),
    ) {
        let granularity_bytes = policy_config.granularity_bytes;
        let config = HeapConfig {
            release,
            capacity_bytes: budget_mib.map(|mib| mib << 20),
            block_size_bytes: block_mib << 20,
            dedicated_threshold_bytes: dedicated_mib << 20,
            policy_config,
            ..HeapConfig::new(kind)
        };
        let mut heap = Heap::new(config, SimulatedSource::new(device_mib << 20, 2 << 20)).unwrap();
        let mut live = Vec::new();
        for op in ops {
            match op {
                HeapOp::Alloc(size) => match heap.allocate(Request::new(size, 256).unwrap(), None) {
                    Ok(allocation) => live.push(allocation),
                    Err(Error::OutOfMemory(verdict)) => {
                        let total_free = verdict.free_in_blocks_bytes + verdict.unreserved_bytes;
                        prop_assert!(verdict.needed_bytes >= size, "{}", verdict);
                        prop_assert_eq!(verdict.cause == OomCause::Fragmentation, total_free >= verdict.needed_bytes, "{}", verdict);
                        // The heap tried every block it could use: none had a run that holds the request (allowing
                        // for alignment padding and a granularity page at each end).
                        let slack = 255 + 2 * granularity_bytes;
                        prop_assert!(verdict.largest_free_run_bytes < verdict.needed_bytes + slack, "{}", verdict);
                        prop_assert!(verdict.largest_free_run_bytes <= verdict.free_in_blocks_bytes);
                    }
                    Err(other) => prop_assert!(false, "unexpected error {other}"),
                },
                HeapOp::Free(pick) if !live.is_empty() => {
                    let allocation = live.swap_remove(pick % live.len());
                    heap.free(allocation).unwrap();
                    prop_assert!(heap.free(allocation).is_err(), "double free must be refused");
                }
                HeapOp::Free(_) => {}
            }
            let report = heap.report();
            let stats = heap.stats();
            let live_bytes: u64 = live.iter().map(heapscope_core::HeapAllocation::size_bytes).sum();
            prop_assert_eq!(report.totals.live_bytes, live_bytes);
            prop_assert_eq!(stats.live_bytes, live_bytes);
            prop_assert_eq!(report.totals.reserved_bytes, stats.reserved_bytes);
            prop_assert_eq!(heap.source().used_bytes(), stats.reserved_bytes);
            let accounted = report.totals.rounded_bytes + report.totals.free_bytes + report.totals.retired_bytes;
            prop_assert_eq!(accounted, stats.reserved_bytes, "every reserved byte is live, padding, free or retired");
            prop_assert!(stats.reserved_bytes <= device_mib << 20);
            if let Some(budget) = budget_mib {
                prop_assert!(stats.reserved_bytes <= budget << 20);
            }
            for block in &report.blocks {
                let end: u64 = block.layout.ranges.last().map_or(0, heapscope_core::RangeReport::end);
                prop_assert_eq!(end, block.layout.capacity_bytes);
                prop_assert_eq!(block.layout.capacity_bytes, block.size_bytes);
            }
        }
        for allocation in live {
            heap.free(allocation).unwrap();
        }
        if release == ReleaseRule::Immediately {
            prop_assert_eq!(heap.stats().reserved_bytes, 0);
        }
        heap.release_empty_blocks();
        prop_assert_eq!(heap.stats().reserved_bytes, 0);
    }
}

/// A page-by-page model of a paged heap: the pages live allocations touch (with counts) and the cached ones.
#[derive(Default)]
struct PageModel {
    live: std::collections::HashMap<u64, u32>,
    cached: std::collections::BTreeSet<u64>,
}

impl PageModel {
    fn pages(allocation: &heapscope_core::Allocation, page_bytes: u64) -> std::ops::RangeInclusive<u64> {
        let offset = allocation.footprint_offset();
        offset / page_bytes..=(offset + allocation.footprint_bytes() - 1) / page_bytes
    }

    fn mapped_pages(&self) -> u64 {
        (self.live.len() + self.cached.len()) as u64
    }
}

fn unmap_rule() -> impl Strategy<Value = UnmapRule> {
    prop_oneof![Just(UnmapRule::Eager), Just(UnmapRule::UnderPressure)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(64)))]
    /// A paged heap under either unmap rule against a page-by-page model: mapped and cached bytes, which pages
    /// are mapped, the device events (applied to a set of pages: never a page mapped twice or unmapped while
    /// not mapped), the capacity never exceeded, and a refusal exactly when the model cannot find the pages
    /// even with the cache unmapped.
    #[test]
    fn paged_heap_matches_a_page_model_under_both_unmap_rules(
        unmap in unmap_rule(),
        page_log2 in 12u32..22,
        capacity_pages in prop::option::of(1u64..64),
        ops in prop::collection::vec(heap_op(), 1..160),
    ) {
        let page = 1u64 << page_log2;
        let capacity_bytes = capacity_pages.map(|pages| pages * page);
        let config = PagedConfig { page_bytes: page, unmap, ..PagedConfig::new(capacity_bytes) };
        let mut heap = PagedHeap::new(config).unwrap();
        heap.record_device_events(true);
        let mut model = PageModel::default();
        let mut device: std::collections::BTreeSet<u64> = std::collections::BTreeSet::new();
        let mut live = Vec::new();
        for op in ops {
            match op {
                HeapOp::Alloc(size) => {
                    // Sizes scaled to the page so that requests span from part of a page to many pages.
                    let size = (size % (page * 8)).max(1);
                    let releases_before = heap.stats().cache_releases;
                    match heap.allocate(Request::new(size, 256).unwrap()) {
                        Ok(allocation) => {
                            let span = PageModel::pages(&allocation, page);
                            let new = span.clone().filter(|p| !model.live.contains_key(p) && !model.cached.contains(p)).count() as u64;
                            let reused: Vec<u64> = span.clone().filter(|p| model.cached.contains(p)).collect();
                            if let Some(capacity) = capacity_pages
                                && model.mapped_pages() + new > capacity
                            {
                                // Only by unmapping the cache (all but the pages it reuses) could it fit.
                                prop_assert_eq!(unmap, UnmapRule::UnderPressure);
                                model.cached.retain(|p| reused.contains(p));
                                prop_assert!(model.mapped_pages() + new <= capacity);
                            }
                            for p in span {
                                model.cached.remove(&p);
                                *model.live.entry(p).or_insert(0) += 1;
                            }
                            live.push(allocation);
                        }
                        Err(Error::OutOfMemory(verdict)) => {
                            // The virtual range (1 TiB) never runs out here: only the capacity refuses, and
                            // `needed_bytes` is then the new pages the placement needed.
                            prop_assert_eq!(verdict.policy, "paged");
                            let capacity = capacity_pages.expect("without a capacity every request fits") * page;
                            let cached_after: std::collections::BTreeSet<u64> = heap
                                .mapped_runs()
                                .iter()
                                .flat_map(|&(offset, size)| offset / page..(offset + size) / page)
                                .filter(|p| !model.live.contains_key(p))
                                .collect();
                            prop_assert!(cached_after.is_subset(&model.cached), "a refusal caches nothing");
                            if heap.stats().cache_releases > releases_before {
                                // Under pressure the cache went (all but the pages the placement would have
                                // reused), and still the new pages did not fit.
                                prop_assert_eq!(unmap, UnmapRule::UnderPressure);
                                model.cached = cached_after;
                            } else {
                                prop_assert_eq!(&cached_after, &model.cached);
                            }
                            prop_assert!(model.mapped_pages() * page + verdict.needed_bytes > capacity, "{}", verdict);
                            prop_assert_eq!(verdict.reserved_bytes, model.mapped_pages() * page);
                        }
                        Err(other) => prop_assert!(false, "unexpected error {other}"),
                    }
                }
                HeapOp::Free(pick) if !live.is_empty() => {
                    let allocation = live.swap_remove(pick % live.len());
                    heap.free(allocation).unwrap();
                    prop_assert!(heap.free(allocation).is_err(), "double free must be refused");
                    for p in PageModel::pages(&allocation, page) {
                        let count = model.live.get_mut(&p).unwrap();
                        *count -= 1;
                        if *count == 0 {
                            model.live.remove(&p);
                            if unmap == UnmapRule::UnderPressure {
                                model.cached.insert(p);
                            }
                        }
                    }
                }
                HeapOp::Free(_) => {}
            }
            for event in heap.take_device_events() {
                match event {
                    DeviceEvent::Mapped { address, size_bytes } => {
                        for p in address / page..(address + size_bytes) / page {
                            prop_assert!(device.insert(p), "page {} mapped twice", p);
                        }
                    }
                    DeviceEvent::Unmapped { address, size_bytes } => {
                        for p in address / page..(address + size_bytes) / page {
                            prop_assert!(device.remove(&p), "page {} unmapped while not mapped", p);
                        }
                    }
                    other => prop_assert!(false, "unexpected {other:?}"),
                }
            }
            let stats = heap.stats();
            prop_assert_eq!(stats.mapped_bytes, model.mapped_pages() * page);
            prop_assert_eq!(stats.cached_bytes, model.cached.len() as u64 * page);
            prop_assert_eq!(device.len() as u64 * page, stats.mapped_bytes, "the device holds what the heap maps");
            let mapped: std::collections::BTreeSet<u64> =
                heap.mapped_runs().iter().flat_map(|&(offset, size)| offset / page..(offset + size) / page).collect();
            prop_assert_eq!(&mapped, &device);
            if let Some(capacity) = capacity_bytes {
                prop_assert!(stats.mapped_bytes <= capacity);
            }
            if unmap == UnmapRule::Eager {
                prop_assert_eq!((stats.cached_bytes, stats.pages_reused), (0, 0));
            }
        }
        for allocation in live {
            heap.free(allocation).unwrap();
        }
        let stats = heap.stats();
        prop_assert_eq!(stats.mapped_bytes, stats.cached_bytes);
        if unmap == UnmapRule::Eager {
            prop_assert_eq!(stats.mapped_bytes, 0);
        }
    }
}

#[derive(Clone, Debug)]
enum PagedOp {
    Alloc(u64),
    Free(usize),
    /// Compact, letting move the live allocations whose bit in the mask is set (the others are pinned).
    Compact {
        movable_mask: u64,
        full: bool,
    },
}

fn paged_op() -> impl Strategy<Value = PagedOp> {
    prop_oneof![
        6 => (1u64..(1 << 20)).prop_map(PagedOp::Alloc),
        4 => any::<usize>().prop_map(PagedOp::Free),
        1 => (prop_oneof![1 => Just(u64::MAX), 1 => any::<u64>()], any::<bool>())
            .prop_map(|(movable_mask, full)| PagedOp::Compact { movable_mask, full }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(64)))]
    /// Compacting a paged heap in a small virtual range, against a model of the device: each virtual page mapped holds
    /// a physical page (a fresh one when mapped, the same one when remapped), and every live allocation's bytes are
    /// where its physical pages are. After any compaction: every live allocation still sees the physical pages it
    /// had, in order, at the same offset within its first page (its bytes are preserved, nothing was copied);
    /// pinned allocations did not move; the mapped bytes are the same, less the cache let go; nothing overlaps; the
    /// largest free run of the virtual range never shrank. A refusal with too few free virtual bytes is exhaustion,
    /// one the pages no live allocation touches would hold fragmentation (compaction gathers those), one those pages
    /// and two more would not hold internal waste (a gathered run adds less than a page at either end), and any other
    /// with enough free bytes no exhaustion.
    #[test]
    fn paged_compaction_remaps_pages_and_keeps_every_byte(
        unmap in unmap_rule(),
        policy in prop_oneof![Just(PolicyKind::Tlsf), Just(PolicyKind::BestFit), Just(PolicyKind::FirstFit)],
        page_log2 in 12u32..15,
        virtual_pages in 32u64..160,
        ops in prop::collection::vec(paged_op(), 1..120),
    ) {
        let page = 1u64 << page_log2;
        let config = PagedConfig { page_bytes: page, unmap, policy, virtual_bytes: virtual_pages * page, ..PagedConfig::new(None) };
        let mut heap = PagedHeap::new(config).unwrap();
        heap.record_device_events(true);
        // Virtual page -> physical page; the physical pages each live allocation covers, first to last.
        let mut frames: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
        let mut next_frame = 0u64;
        let mut live: Vec<(heapscope_core::Allocation, Request, Vec<u64>)> = Vec::new();
        let frames_of = |frames: &std::collections::BTreeMap<u64, u64>, a: &heapscope_core::Allocation| -> Vec<u64> {
            PageModel::pages(a, page).map(|p| frames.get(&p).copied().unwrap_or(u64::MAX)).collect()
        };
        for op in ops {
            let mut compaction = None;
            match op {
                PagedOp::Alloc(size) => {
                    let size = (size % (page * 12)).max(1);
                    let request = Request::new(size, 256).unwrap();
                    match heap.allocate(request) {
                        Ok(allocation) => live.push((allocation, request, Vec::new())),
                        Err(Error::OutOfMemory(verdict)) => {
                            let free: u64 = heap.report().ranges.iter()
                                .filter(|r| r.state == heapscope_core::RangeState::Free).map(|r| r.size_bytes).sum();
                            // The pages no live allocation touches, which a compaction can always gather into one run.
                            let touched: std::collections::BTreeSet<u64> =
                                live.iter().flat_map(|(a, ..)| PageModel::pages(a, page)).collect();
                            let untouched_bytes = (virtual_pages - touched.len() as u64) * page;
                            if free < size {
                                prop_assert_eq!(verdict.cause, OomCause::Exhaustion, "{}", verdict);
                            } else if untouched_bytes >= size {
                                prop_assert_eq!(verdict.cause, OomCause::Fragmentation, "{}", verdict);
                            } else if untouched_bytes + 2 * page <= size {
                                // Beside the untouched pages a run gathers less than a page at either end: never enough.
                                prop_assert_eq!(verdict.cause, OomCause::InternalWaste, "{}", verdict);
                            } else {
                                prop_assert!(verdict.cause != OomCause::Exhaustion, "{}", verdict);
                            }
                        }
                        Err(other) => prop_assert!(false, "unexpected error {other}"),
                    }
                }
                PagedOp::Free(pick) if !live.is_empty() => {
                    let (allocation, ..) = live.swap_remove(pick % live.len());
                    heap.free(allocation).unwrap();
                }
                PagedOp::Free(_) => {}
                PagedOp::Compact { movable_mask, full } => {
                    let movable: Vec<(heapscope_core::Allocation, Request)> = live
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| movable_mask >> (i % 64) & 1 == 1)
                        .map(|(_, (a, r, _))| (*a, *r))
                        .collect();
                    let algorithm = if full { Algorithm::Full } else { Algorithm::Balanced };
                    let mapped_before = heap.stats().mapped_bytes;
                    let cached_before = heap.stats().cached_bytes;
                    let done = heap.compact(&movable, algorithm, Budget::UNLIMITED).unwrap();
                    prop_assert!(done.largest_free_after_bytes >= done.largest_free_before_bytes, "{:?}", done);
                    let released: u64 = done.cache_released.iter().map(|&(_, size)| size).sum();
                    prop_assert_eq!(released, if done.remaps.is_empty() { 0 } else { cached_before });
                    prop_assert_eq!(heap.stats().mapped_bytes, mapped_before - released);
                    prop_assert_eq!(done.bytes_remapped, done.remaps.iter().map(|r| r.size_bytes).sum::<u64>());
                    for &(from, to) in &done.moves {
                        prop_assert!(movable.iter().any(|&(a, _)| a == from), "a pinned allocation moved");
                        prop_assert_eq!(from.size_bytes(), to.size_bytes());
                        prop_assert_eq!(from.offset() % page, to.offset() % page, "its offset within the page is kept");
                        let entry = live.iter_mut().find(|(a, ..)| *a == from).unwrap();
                        entry.0 = to;
                    }
                    compaction = Some(done);
                }
            }
            // The device: the compaction's own log (an unmap and a map per remap, after the cache let go) is
            // checked for its shape and applied as moves of physical pages; other events map fresh pages or unmap.
            let events = heap.take_device_events();
            let mut events = events.as_slice();
            if let Some(done) = &compaction {
                for &(offset, size) in &done.cache_released {
                    prop_assert_eq!(events.first(), Some(&DeviceEvent::Unmapped { address: offset, size_bytes: size }));
                    events = &events[1..];
                    for p in offset / page..(offset + size) / page {
                        prop_assert!(frames.remove(&p).is_some(), "cached page {} was not mapped", p);
                    }
                }
                for remap in &done.remaps {
                    prop_assert_eq!(&events[..2], &[
                        DeviceEvent::Unmapped { address: remap.from_offset, size_bytes: remap.size_bytes },
                        DeviceEvent::Mapped { address: remap.to_offset, size_bytes: remap.size_bytes },
                    ]);
                    events = &events[2..];
                    let pages = remap.size_bytes / page;
                    let moved: Vec<u64> = (0..pages).map(|i| frames.remove(&(remap.from_offset / page + i))).collect::<Option<_>>().unwrap();
                    for (i, frame) in moved.into_iter().enumerate() {
                        prop_assert!(frames.insert(remap.to_offset / page + i as u64, frame).is_none(), "remapped onto a mapped page");
                    }
                }
            }
            for &event in events {
                match event {
                    DeviceEvent::Mapped { address, size_bytes } => {
                        for p in address / page..(address + size_bytes) / page {
                            prop_assert!(frames.insert(p, next_frame).is_none(), "page {} mapped twice", p);
                            next_frame += 1;
                        }
                    }
                    DeviceEvent::Unmapped { address, size_bytes } => {
                        for p in address / page..(address + size_bytes) / page {
                            prop_assert!(frames.remove(&p).is_some(), "page {} unmapped while not mapped", p);
                        }
                    }
                    other => prop_assert!(false, "unexpected {other:?}"),
                }
            }
            // Every live allocation sees the physical pages it first saw; nothing overlaps.
            for (allocation, _, seen) in &mut live {
                let now = frames_of(&frames, allocation);
                prop_assert!(!now.contains(&u64::MAX), "a page of {:?} is not mapped", allocation);
                if seen.is_empty() {
                    *seen = now;
                } else {
                    prop_assert_eq!(&now, seen, "the bytes of {:?} moved without their pages", allocation);
                }
            }
            let mut spans: Vec<(u64, u64)> = live.iter().map(|(a, ..)| (a.footprint_offset(), a.footprint_end())).collect();
            spans.sort_unstable();
            prop_assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "overlap: {:?}", spans);
            prop_assert_eq!(frames.len() as u64 * page, heap.stats().mapped_bytes);
        }
        for (allocation, ..) in live {
            heap.free(allocation).unwrap();
        }
        prop_assert_eq!(heap.stats().mapped_bytes, heap.stats().cached_bytes);
    }
}
