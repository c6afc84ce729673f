//! Shared by the tests of the external allocators as heapscope heaps (gpu-allocator, VMA): the checks their random
//! traffic and their GPT-2 replay make, for any [`DeviceHeap`].
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::collections::BTreeMap;
use std::fmt::Debug;

use heapscope_core::DeviceEvent;
use heapscope_core::DeviceHeap;
use heapscope_core::replay::replay_device_heap;
use heapscope_core::trace::Trace;
use heapscope_vulkan::VulkanContext;

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

/// Replays the GPT-2 trace through `heap` (named `policy`, on `context`'s device, whose peak reserved bytes
/// `peak_reserved_bytes` reads): every event replayed; on a device with the ~13.1 GiB the trace needs at once
/// nothing refused and the peak reserved at least the peak live, on a smaller one every refusal a verdict of
/// `policy`. Prints the peaks.
pub fn replay_gpt2<H: DeviceHeap>(
    context: &VulkanContext,
    heap: &mut H,
    policy: &str,
    peak_reserved_bytes: impl Fn(&H) -> u64,
    live_blocks: impl Fn(&H) -> usize,
) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/traces/gpt2_train_fixed-default.hst");
    let trace = Trace::read(std::path::Path::new(path)).unwrap();
    let replay = replay_device_heap(&trace, heap, 512).unwrap();
    assert_eq!(replay.stats.events, trace.events().len() as u64);
    let largest_heap = context.heap_budgets().iter().map(heapscope_vulkan::HeapBudget::available_bytes).max().unwrap();
    if largest_heap >= 14 << 30 {
        assert_eq!(replay.stats.failed_allocations, 0, "{:?}", replay.first_oom);
        assert!(peak_reserved_bytes(heap) >= replay.stats.peak_live_bytes);
    } else if replay.stats.failed_allocations > 0 {
        assert_eq!(replay.first_oom.unwrap().policy, policy);
    }
    eprintln!(
        "gpt2 through {policy}: peak live {} MiB, peak reserved {} MiB, {} blocks left",
        replay.stats.peak_live_bytes >> 20,
        peak_reserved_bytes(heap) >> 20,
        live_blocks(heap)
    );
}
