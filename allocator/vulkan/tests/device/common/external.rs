//! Shared by the tests of the external allocators as heapscope heaps (gpu-allocator, VMA): their random traffic
//! and its checks (for any [`DeviceHeap`]), their random traffic under a budget cap, their GPT-2 replay, and the
//! validated context and heap each test runs on ([`with_heap`]).
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeInclusive;

use heapscope_core::trace::Trace;
use heapscope_core::units::KIB;
use heapscope_core::units::MIB;
use heapscope_core::{DeviceEvent, DeviceHeap, Error, OomVerdict, Request};
use heapscope_lab::driver::replay_device_heap;
use std::sync::Arc;

use heapscope_vulkan::{ExternalAllocator, ExternalConfig, ExternalHandle, ExternalHeap, VulkanContext};

/// Runs `test` on a new heap of `A` with `config`, over a validated context ([`super::with_context`]); after the
/// test drops the heap, checks that it gave every block back to the device and that the validation layer said
/// nothing. Skipped where the machine has no Vulkan.
pub fn with_heap<A: ExternalAllocator>(config: ExternalConfig, test: impl FnOnce(&Arc<VulkanContext>, &mut ExternalHeap<A>)) {
    super::with_context(|context| {
        let mut heap = ExternalHeap::<A>::new(Arc::clone(context), config).unwrap();
        test(context, &mut heap);
        drop(heap);
        assert_eq!(context.live_allocation_count(), 0, "dropping the heap gave its blocks back");
    });
}

/// Live allocations by address; panics on an overlap or an allocation outside its block (`blocks`: base address
/// to size, as the device events reserved them).
pub fn insert_checked<H: DeviceHeap>(live: &mut BTreeMap<u64, H::Handle>, blocks: &BTreeMap<u64, u64>, handle: H::Handle)
where
    H::Handle: Debug,
{
    let end_of = |handle: &H::Handle| H::address(handle) + H::allocation(handle).size_bytes();
    let (start, end) = (H::address(&handle), end_of(&handle));
    if let Some((_, before)) = live.range(..start).next_back() {
        assert!(end_of(before) <= start, "{before:?} overlaps {handle:?}");
    }
    if let Some((_, after)) = live.range(start..).next() {
        assert!(end <= H::address(after), "{handle:?} overlaps {after:?}");
    }
    let block_size = blocks.get(&H::block_base(&handle)).copied().expect("the allocation lies in a reserved block");
    let allocation = H::allocation(&handle);
    assert!(allocation.offset() + allocation.size_bytes() <= block_size, "{handle:?} runs past its block of {block_size}");
    live.insert(start, handle);
}

/// Applies a heap's block events to `blocks` (base address to size); panics on a block reserved twice, a release
/// of another size or of no block, and on any other event.
pub fn apply(blocks: &mut BTreeMap<u64, u64>, events: Vec<DeviceEvent>) {
    for event in events {
        match event {
            DeviceEvent::Reserved { address, size_bytes } => assert!(blocks.insert(address, size_bytes).is_none()),
            DeviceEvent::Released { address, size_bytes } => assert_eq!(blocks.remove(&address), Some(size_bytes)),
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Replays the GPT-2 trace through `heap` (on `context`'s device): every event replayed; on a device with the
/// ~13.1 GiB the trace needs at once nothing refused and the peak reserved at least the peak live, on a smaller one
/// every refusal a verdict of the heap's policy. Prints the peaks.
pub fn replay_gpt2<A: ExternalAllocator>(context: &VulkanContext, heap: &mut ExternalHeap<A>) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/traces/gpt2_train_fixed-default.hst");
    let trace = Trace::read(std::path::Path::new(path)).unwrap();
    let replay = replay_device_heap(&trace, heap, 512).unwrap();
    assert_eq!(replay.stats.events, trace.events().len() as u64);
    let largest_heap = context.heap_budgets().iter().map(heapscope_vulkan::HeapBudget::available_bytes).max().unwrap();
    if largest_heap >= 14 << 30 {
        assert_eq!(replay.stats.failed_allocations, 0, "{:?}", replay.first_oom);
        assert!(heap.peak_reserved_bytes() >= replay.stats.peak_live_bytes);
    } else if replay.stats.failed_allocations > 0 {
        assert_eq!(replay.first_oom.unwrap().policy, A::POLICY);
    }
    eprintln!(
        "gpt2 through {}: peak live {} MiB, peak reserved {} MiB, {} blocks left",
        A::POLICY,
        replay.stats.peak_live_bytes >> 20,
        heap.peak_reserved_bytes() >> 20,
        heap.live_blocks()
    );
}

/// What [`capped_traffic`] leaves: the live allocations, the verdicts of the refused requests, and how many
/// requests were served near the cap (less than a block of the configured size left under it).
pub struct Capped {
    pub live: Vec<ExternalHandle>,
    pub verdicts: Vec<OomVerdict>,
    pub served_at_the_cap: u32,
}

/// `steps` random allocations and frees on `heap`, whose budget cap must be set: 40 in 100 a free of a random live
/// allocation (when there is one), else a request of 1 B to 2 MiB (one in twenty of a size in `large`) aligned to
/// `align(rng)`. Checks that every refusal is an out-of-memory verdict of the heap's policy and cap with reserved
/// bytes within the cap, that the peak of reserved bytes never exceeds the cap, and that the refusals are counted.
pub fn capped_traffic<A: ExternalAllocator>(
    heap: &mut ExternalHeap<A>,
    rng: &mut super::Rng,
    steps: usize,
    large: RangeInclusive<u64>,
    mut align: impl FnMut(&mut super::Rng) -> u64,
) -> Capped {
    let cap = heap.config().budget_cap_bytes.unwrap();
    let block_bytes = heap.config().block_size_bytes;
    let mut capped = Capped { live: Vec::new(), verdicts: Vec::new(), served_at_the_cap: 0 };
    for step in 0..steps {
        if !capped.live.is_empty() && rng.range(0, 99) < 40 {
            heap.free_handle(capped.live.swap_remove(rng.range(0, capped.live.len() as u64 - 1) as usize)).unwrap();
        } else {
            let size = if rng.range(0, 19) == 0 { rng.range(*large.start(), *large.end()) } else { rng.range(1, 2 * MIB) };
            let near_the_cap = heap.reserved_bytes() + block_bytes > cap;
            match heap.allocate_request(Request::new(size, align(rng)).unwrap()) {
                Ok(handle) => {
                    capped.served_at_the_cap += u32::from(near_the_cap);
                    capped.live.push(handle);
                }
                Err(Error::OutOfMemory(verdict)) => {
                    assert_eq!((verdict.policy, verdict.capacity_bytes), (A::POLICY, Some(cap)), "step {step}");
                    assert!(verdict.reserved_bytes <= cap, "step {step}: {verdict}");
                    capped.verdicts.push(*verdict);
                }
                Err(other) => panic!("step {step}: {other}"),
            }
        }
        assert!(heap.peak_reserved_bytes() <= cap, "step {step}: peak {} > cap {cap}", heap.peak_reserved_bytes());
    }
    assert_eq!(heap.ooms(), capped.verdicts.len() as u64);
    capped
}

/// What [`random_traffic`] leaves: the live allocations by address, the blocks (base address to size) the device
/// events reserved and did not release, and how many blocks were released on the way.
pub struct Traffic<H: DeviceHeap> {
    pub live: BTreeMap<u64, H::Handle>,
    pub blocks: BTreeMap<u64, u64>,
    pub released: usize,
}

impl<H: DeviceHeap> Traffic<H> {
    /// Bytes asked for by the live allocations.
    pub fn live_bytes(&self) -> u64 {
        self.live.values().map(|handle| H::allocation(handle).size_bytes()).sum()
    }
}

/// `steps` random allocations and frees on `heap` (recording its device events): 45 in 100 a free of a random live
/// allocation (when there is one), else a request of 1 B to 256 KiB (one in ten of a size in `large`) aligned to
/// 1 B to 4 KiB. Checks each allocation's alignment, that none overlaps another or leaves its block, and after
/// every step that the heap's reserved bytes are the sum of its blocks; then calls `after_step` with the blocks.
pub fn random_traffic<H: DeviceHeap>(
    heap: &mut H,
    rng: &mut super::Rng,
    steps: usize,
    large: RangeInclusive<u64>,
    mut after_step: impl FnMut(&H, &BTreeMap<u64, u64>),
) -> Traffic<H>
where
    H::Handle: Debug,
{
    heap.record_device_events(true);
    let mut traffic = Traffic { live: BTreeMap::new(), blocks: BTreeMap::new(), released: 0 };
    let mut order: Vec<u64> = Vec::new();
    for _ in 0..steps {
        if !order.is_empty() && rng.range(0, 99) < 45 {
            let address = order.swap_remove(rng.range(0, order.len() as u64 - 1) as usize);
            heap.free_handle(traffic.live.remove(&address).unwrap()).unwrap();
        } else {
            let size = if rng.range(0, 9) == 0 { rng.range(*large.start(), *large.end()) } else { rng.range(1, 256 * KIB) };
            let align = 1 << rng.range(0, 12);
            let handle = heap.allocate_request(Request::new(size, align).unwrap()).unwrap();
            assert_eq!(H::allocation(&handle).offset() % align, 0);
            assert_eq!(H::address(&handle) % align, 0);
            apply(&mut traffic.blocks, heap.take_device_events());
            order.push(H::address(&handle));
            insert_checked::<H>(&mut traffic.live, &traffic.blocks, handle);
        }
        let events = heap.take_device_events();
        traffic.released += events.iter().filter(|event| matches!(event, DeviceEvent::Released { .. })).count();
        apply(&mut traffic.blocks, events);
        assert_eq!(heap.reserved_and_live_bytes().0, traffic.blocks.values().sum::<u64>());
        after_step(heap, &traffic.blocks);
    }
    traffic
}

/// Frees every live allocation of `traffic`, checks that freeing one again is a double free, and returns the
/// blocks left after the device events.
pub fn free_all<H: DeviceHeap>(heap: &mut H, traffic: Traffic<H>) -> BTreeMap<u64, u64> {
    let Traffic { live, mut blocks, .. } = traffic;
    let any = *live.values().next().unwrap();
    for handle in live.into_values() {
        heap.free_handle(handle).unwrap();
    }
    assert!(matches!(heap.free_handle(any), Err(Error::DoubleFree { .. })));
    apply(&mut blocks, heap.take_device_events());
    blocks
}
