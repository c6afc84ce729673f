//! `DeviceMemorySource` under heapscope's `Heap`: real `vkAllocateMemory` blocks, validated.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::common::Rng;
use heapscope_core::units::{KIB, MIB};
use heapscope_core::{
    Error, Heap, HeapAllocation, HeapConfig, MemorySource, OomCause, PolicyKind, ReleaseRule, Request, SourceError,
};
use heapscope_vulkan::memory_types::MemoryUsage;
use heapscope_vulkan::{DeviceMemorySource, DeviceSourceConfig, VulkanContext};

fn source(context: &Arc<VulkanContext>, config: DeviceSourceConfig) -> DeviceMemorySource {
    DeviceMemorySource::new(Arc::clone(context), config).expect("a memory type for the usage")
}

/// 1 MiB blocks, dedicated blocks from 512 KiB: small enough to make many blocks quickly.
fn heap_config(policy: PolicyKind) -> HeapConfig {
    HeapConfig {
        block_size_bytes: MIB,
        dedicated_threshold_bytes: 512 * KIB,
        release: ReleaseRule::KeepOne,
        ..HeapConfig::new(policy)
    }
}

/// Live allocations by address; panics on an overlap, or an allocation outside its source block.
fn insert_checked(live: &mut BTreeMap<u64, HeapAllocation>, heap: &Heap<DeviceMemorySource>, allocation: HeapAllocation) {
    let (start, end) = (allocation.address(), allocation.address() + allocation.size_bytes());
    if let Some((_, before)) = live.range(..start).next_back() {
        assert!(before.address() + before.size_bytes() <= start, "{before:?} overlaps {allocation:?}");
    }
    if let Some((_, after)) = live.range(start..).next() {
        assert!(end <= after.address(), "{allocation:?} overlaps {after:?}");
    }
    let (block, offset) = heap.source().locate(start).expect("the allocation lies in a live block");
    assert!(offset + allocation.size_bytes() <= block.size_bytes, "{allocation:?} runs past {block:?}");
    live.insert(start, allocation);
}

/// The bytes an allocation is filled with: its address, repeated.
fn pattern(allocation: &HeapAllocation) -> Vec<u8> {
    let seed = allocation.address().to_le_bytes();
    (0..allocation.size_bytes()).map(|i| seed[(i % 8) as usize] ^ (i / 8) as u8).collect()
}

fn random_allocs_and_frees(context: &Arc<VulkanContext>, policy: PolicyKind, seed: u64) {
    let mut heap = Heap::new(heap_config(policy), source(context, DeviceSourceConfig::new(MemoryUsage::Upload))).unwrap();
    let mut rng = Rng::new(seed);
    let mut live = BTreeMap::new();
    let mut order: Vec<u64> = Vec::new();
    for step in 0..1000 {
        if !order.is_empty() && rng.range(0, 99) < 45 {
            let address = order.swap_remove(rng.range(0, order.len() as u64 - 1) as usize);
            let allocation = live.remove(&address).unwrap();
            heap.free(allocation).unwrap();
        } else {
            // Mostly small, sometimes past the dedicated threshold.
            let size_bytes = if rng.range(0, 19) == 0 { rng.range(512 * KIB, 2 * MIB) } else { rng.range(1, 64 * KIB) };
            let align_bytes = 1 << rng.range(0, 12);
            let allocation = heap.allocate(Request::new(size_bytes, align_bytes).unwrap(), None).unwrap();
            assert_eq!((allocation.offset() % align_bytes, allocation.address() % align_bytes), (0, 0), "step {step}");
            order.push(allocation.address());
            insert_checked(&mut live, &heap, allocation);
        }
    }
    // The allocations do not overlap in real memory either: fill each with its pattern, then read all back.
    for allocation in live.values() {
        heap.source().write_bytes(allocation.address(), &pattern(allocation)).unwrap();
    }
    for allocation in live.values() {
        let mut read = vec![0; allocation.size_bytes() as usize];
        heap.source().read_bytes(allocation.address(), &mut read).unwrap();
        assert!(read == pattern(allocation), "{allocation:?} was overwritten");
    }
    let stats = heap.stats().clone();
    assert_eq!(stats.reserved_bytes, heap.source().used_bytes(), "the heap reserved what the source allocated");
    assert_eq!(heap.source().live_blocks(), heap.report().blocks.len());
    eprintln!(
        "{}: {} live, {} blocks reserved, {} released, peak reserved {} KiB",
        policy.name(),
        live.len(),
        stats.blocks_reserved,
        stats.blocks_released,
        stats.peak_reserved_bytes / KIB
    );
    for allocation in live.into_values() {
        heap.free(allocation).unwrap();
    }
    heap.release_empty_blocks();
    assert!(heap.source().leak_report().is_empty());
    assert_eq!(context.live_allocation_count(), 0);
}

#[test]
fn heap_with_tlsf_and_best_fit_serves_random_allocs_without_overlap() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    random_allocs_and_frees(&context, PolicyKind::Tlsf, 1);
    random_allocs_and_frees(&context, PolicyKind::BestFit, 2);
    crate::common::finish(context);
}

/// Issue 17: a block larger than the memory heap (32 GiB on lavapipe's 23.5 GiB heap) is refused as out of memory
/// before `vkAllocateMemory` is asked (which would be invalid usage), with the validation layer silent; the heap
/// serves what fits after it.
#[test]
fn a_block_larger_than_the_memory_heap_is_refused() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    let mut source = source(&context, DeviceSourceConfig::device_only(None));
    let heap_bytes = context.properties().heap_of_type(source.memory_type().index).unwrap().size_bytes;
    let too_large = (heap_bytes + 1).next_multiple_of(source.block_alignment_bytes());
    let refused = source.allocate_block(too_large);
    assert!(matches!(refused, Err(SourceError::OutOfMemory { .. })), "{refused:?}");
    let mut heap = Heap::new(heap_config(PolicyKind::Tlsf), source).unwrap();
    let Err(Error::OutOfMemory(verdict)) = heap.allocate(Request::new(heap_bytes + 1, 256).unwrap(), None) else {
        panic!("{} B on a heap of {heap_bytes} B must be refused", heap_bytes + 1)
    };
    assert_eq!(verdict.requested_bytes, heap_bytes + 1);
    let fits = heap.allocate(Request::new(MIB, 256).unwrap(), None).unwrap();
    heap.free(fits).unwrap();
    drop(heap);
    crate::common::finish(context);
}

/// A block larger than the device's `maxMemoryAllocationSize` (2 GiB on lavapipe, about 4 GiB on NVIDIA, though its heap
/// holds far more) is refused as out of memory before `vkAllocateMemory` is asked (the validation layer reports such an
/// allocation, and AMD and Intel drivers fail it); one at the limit is served.
#[test]
fn a_block_past_the_largest_allocation_is_refused() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    let Some(largest) = context.properties().limits.max_memory_allocation_size_bytes else {
        crate::common::finish(context);
        return;
    };
    let mut source = source(&context, DeviceSourceConfig::device_only(None));
    let heap_bytes = context.properties().heap_of_type(source.memory_type().index).unwrap().size_bytes;
    let alignment = source.block_alignment_bytes();
    let past = (largest + 1).next_multiple_of(alignment);
    if past <= heap_bytes {
        let refused = source.allocate_block(past);
        assert!(matches!(refused, Err(SourceError::OutOfMemory { .. })), "{past} B past {largest} B: {refused:?}");
    }
    let at_most = largest / alignment * alignment;
    if at_most <= heap_bytes.min(4 << 30) {
        let block = source.allocate_block(at_most).expect("a block of the largest allocation");
        source.free_block(block);
    }
    drop(source);
    crate::common::finish(context);
}

#[test]
fn budget_cap_is_an_out_of_memory_verdict_and_the_heap_recovers() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    let device_config =
        DeviceSourceConfig { budget_cap_bytes: Some(4 * MIB), ..DeviceSourceConfig::new(MemoryUsage::DeviceLocal) };
    let config = heap_config(PolicyKind::Tlsf);
    let mut heap =
        Heap::new(HeapConfig { dedicated_threshold_bytes: 2 * MIB, ..config }, source(&context, device_config)).unwrap();
    let request = Request::new(512 * KIB, 256).unwrap();
    let mut live = Vec::new();
    let verdict = loop {
        match heap.allocate(request, Some("tile")) {
            Ok(allocation) => live.push(allocation),
            Err(Error::OutOfMemory(verdict)) => break verdict,
            Err(other) => panic!("{other}"),
        }
        assert!(live.len() <= 8, "the cap must stop the heap");
    };
    assert_eq!(live.len(), 8, "two 512 KiB per 1 MiB block, four blocks under 4 MiB");
    assert_eq!(
        (verdict.cause, verdict.unreserved_bytes, verdict.reserved_bytes),
        (OomCause::Exhaustion, 0, 4 * MIB),
        "{verdict}"
    );
    assert_eq!(heap.source().available_bytes(), Some(0));
    assert_eq!(heap.stats().ooms, 1);
    // Consistent after the failure: frees and allocations work, in the same blocks.
    for allocation in live.drain(..2) {
        heap.free(allocation).unwrap();
    }
    let again = heap.allocate(request, None).expect("room after frees");
    assert_eq!(heap.stats().reserved_bytes, 4 * MIB);
    assert_eq!(heap.source().used_bytes(), 4 * MIB);
    live.push(again);
    for allocation in live {
        heap.free(allocation).unwrap();
    }
    heap.release_empty_blocks();
    assert_eq!(heap.source().live_blocks(), 0);
    drop(heap);
    crate::common::finish(context);
}

#[test]
fn max_blocks_is_a_clear_source_error() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    let mut source =
        source(&context, DeviceSourceConfig { max_blocks: Some(2), ..DeviceSourceConfig::new(MemoryUsage::DeviceLocal) });
    let unit = source.block_alignment_bytes();
    let blocks = [source.allocate_block(unit).unwrap(), source.allocate_block(unit).unwrap()];
    let Err(SourceError::Failed(message)) = source.allocate_block(unit) else { panic!("a third block is refused") };
    assert!(message.contains("max_blocks"), "{message}");
    assert!(matches!(source.allocate_block(unit + 1), Err(SourceError::Failed(_))), "not a multiple of the alignment");
    assert_eq!(context.live_allocation_count(), 2);
    for block in blocks {
        source.free_block(block);
        source.free_block(block);
    }
    assert_eq!(source.block_counts(), (2, 2), "a second free is ignored");
    drop(source);
    crate::common::finish(context);
}

#[test]
fn dedicated_block_owns_its_buffer() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    let mut source = source(&context, DeviceSourceConfig::new(MemoryUsage::Upload));
    let size_bytes = 3 * MIB + 123;
    let block = source.allocate_dedicated_block(size_bytes).unwrap();
    let info = *source.block(block.handle).unwrap();
    assert!(info.dedicated_buffer.is_some());
    assert!(info.allocation_size_bytes >= size_bytes && info.size_bytes == size_bytes, "{info:?}");
    assert!(source.used_bytes() == info.allocation_size_bytes);
    // The last bytes are reachable through the mapping; one past the end is not.
    let tail = block.base_address + size_bytes - 4;
    source.write_bytes(tail, &[1, 2, 3, 4]).unwrap();
    let mut read = [0; 4];
    source.read_bytes(tail, &mut read).unwrap();
    assert_eq!(read, [1, 2, 3, 4]);
    assert!(source.write_bytes(tail, &[0; 5]).is_err());
    let report = source.leak_report();
    assert!(report.blocks.len() == 1 && report.blocks[0].dedicated, "{report}");
    source.free_block(block);
    assert_eq!((source.live_blocks(), source.used_bytes(), context.live_allocation_count()), (0, 0, 0));
    // A buffer past the device's maxBufferSize (where it says one) is refused before it is made, naming the limit.
    if let Some(max) = context.properties().limits.max_buffer_size_bytes.filter(|&max| max < u64::MAX) {
        let refused = source.allocate_dedicated_block(max + 1).unwrap_err().to_string();
        assert!(refused.contains(&format!("larger than the device's maxBufferSize ({max} B)")), "{refused}");
        assert_eq!(context.live_allocation_count(), 0);
    }
    drop(source);
    crate::common::finish(context);
}

#[test]
fn leak_report_and_drop_free_live_blocks() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    let config = DeviceSourceConfig { report_leaks_on_drop: false, ..DeviceSourceConfig::new(MemoryUsage::Readback) };
    let mut source = source(&context, config);
    let unit = source.block_alignment_bytes().max(64 * KIB);
    let first = source.allocate_block(unit).unwrap();
    let second = source.allocate_block(2 * unit).unwrap();
    let dedicated = source.allocate_dedicated_block(100 * KIB).unwrap();
    source.free_block(second);
    let report = source.leak_report();
    let listed: Vec<(u64, u64, bool)> = report.blocks.iter().map(|b| (b.handle, b.size_bytes, b.dedicated)).collect();
    assert_eq!(listed, [(first.handle, unit, false), (dedicated.handle, 100 * KIB, true)], "{report}");
    assert!(report.to_string().starts_with("2 live block(s)"), "{report}");
    assert_eq!(source.release_all(), report);
    assert!(source.leak_report().is_empty());
    assert_eq!(context.live_allocation_count(), 0);

    // Dropping a source with live blocks frees them: the layer would report leaked memory at vkDestroyDevice.
    let mut source = source;
    source.allocate_block(unit).unwrap();
    source.allocate_dedicated_block(unit).unwrap();
    assert_eq!(context.live_allocation_count(), 2);
    drop(source);
    assert_eq!(context.live_allocation_count(), 0);
    crate::common::finish(context);
}

#[test]
fn sources_move_between_threads_and_contexts_are_shared() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<DeviceMemorySource>();
    send::<Heap<DeviceMemorySource>>();
    send_sync::<VulkanContext>();
    send::<heapscope_vulkan::SparseBuffer>();
    send::<heapscope_vulkan::DevicePagedHeap>();
    send::<heapscope_vulkan::Transfer>();
}
