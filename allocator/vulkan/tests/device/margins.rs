//! `GuardedHeap`: debug margins with canary checks over real, mapped `vkAllocateMemory` blocks, validated.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::sync::Arc;

use crate::common::Rng;
use heapscope_core::units::{KIB, MIB};
use heapscope_core::{Error, Heap, HeapConfig, PolicyKind, ReleaseRule, Request};
use heapscope_vulkan::memory_types::MemoryUsage;
use heapscope_vulkan::{
    Corruption, DeviceMemorySource, DeviceSourceConfig, GuardedAllocation, GuardedHeap, MAGIC, MarginError, Side, VulkanContext,
};

fn heap(context: &Arc<VulkanContext>, config: DeviceSourceConfig) -> Heap<DeviceMemorySource> {
    let source = DeviceMemorySource::new(Arc::clone(context), config).expect("a memory type for the usage");
    let config = HeapConfig {
        block_size_bytes: MIB,
        dedicated_threshold_bytes: 512 * KIB,
        release: ReleaseRule::KeepOne,
        ..HeapConfig::new(PolicyKind::Tlsf)
    };
    Heap::new(config, source).unwrap()
}

fn guarded(context: &Arc<VulkanContext>, margin_bytes: u64) -> GuardedHeap {
    GuardedHeap::new(heap(context, DeviceSourceConfig::new(MemoryUsage::Upload)), margin_bytes).unwrap()
}

/// Frees everything left and checks that no device memory is left behind.
fn drain(mut guarded: GuardedHeap, live: Vec<GuardedAllocation>, context: &Arc<VulkanContext>) {
    for allocation in live {
        guarded.free(allocation).unwrap();
    }
    assert_eq!(guarded.live_allocations(), 0);
    let mut heap = guarded.into_inner();
    assert_eq!(heap.live_allocations(), 0);
    heap.release_empty_blocks();
    assert!(heap.source().leak_report().is_empty());
    drop(heap);
    assert_eq!(context.live_allocation_count(), 0);
}

#[test]
fn random_allocs_and_frees_with_margins_report_no_corruption() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    for (margin_bytes, seed) in [(16, 1), (64, 2)] {
        let mut guarded = guarded(&context, margin_bytes);
        let mut rng = Rng::new(seed);
        let mut live: Vec<GuardedAllocation> = Vec::new();
        for step in 0..600 {
            if !live.is_empty() && rng.range(0, 99) < 45 {
                let allocation = live.swap_remove(rng.range(0, live.len() as u64 - 1) as usize);
                guarded.free(allocation).unwrap_or_else(|error| panic!("step {step}: {error}"));
            } else {
                let size_bytes = if rng.range(0, 19) == 0 { rng.range(512 * KIB, 2 * MIB) } else { rng.range(1, 64 * KIB) };
                let align_bytes = 1 << rng.range(0, 12);
                let allocation = guarded.allocate(Request::new(size_bytes, align_bytes).unwrap(), None).unwrap();
                assert_eq!((allocation.size_bytes(), allocation.offset() % align_bytes), (size_bytes, 0), "step {step}");
                assert_eq!(allocation.address() % align_bytes, 0);
                let inner = allocation.inner();
                assert!(inner.size_bytes() >= size_bytes + 2 * margin_bytes);
                assert!(allocation.offset() >= inner.offset() + margin_bytes);
                // The caller writes all of its bytes, and only those.
                guarded.source().write_bytes(allocation.address(), &vec![0xA5; size_bytes as usize]).unwrap();
                live.push(allocation);
            }
            if step % 100 == 0 {
                assert_eq!(guarded.check_all().unwrap(), Vec::<Corruption>::new(), "step {step}");
            }
        }
        // The margins hold the pattern.
        let allocation = live[0];
        let mut before = [0; 4];
        guarded.source().read_bytes(allocation.address() - 4, &mut before).unwrap();
        assert_eq!(before, MAGIC.to_le_bytes(), "the front margin is a multiple of 4: its last u32 is whole");
        assert!(guarded.check_all().unwrap().is_empty());
        drain(guarded, live, &context);
    }
    crate::common::finish(context);
}

/// Overwrites one byte at `offset_from_start` (relative to the caller's first byte) of one allocation among
/// others, and checks that exactly it is reported, then freed, with the heap still serving.
fn one_byte_overwrite(context: &Arc<VulkanContext>, offset_from_start: i64, side: Side) {
    let mut guarded = guarded(context, 16);
    let request = Request::new(100, 4).unwrap();
    let mut live: Vec<GuardedAllocation> = (0..5).map(|_| guarded.allocate(request, None).unwrap()).collect();
    let victim = live.remove(2);
    let address = victim.address().checked_add_signed(offset_from_start).unwrap();
    guarded.source().write_bytes(address, &[0x42]).unwrap();

    let bad_byte_offset = victim.offset().checked_add_signed(offset_from_start).unwrap();
    let expected = MAGIC.to_le_bytes()[match side {
        Side::After => 0,
        Side::Before => 3,
    }];
    let corruption = Corruption {
        block: victim.block(),
        allocation_offset: victim.offset(),
        address: victim.address(),
        size_bytes: 100,
        side,
        bad_byte_offset,
        found: 0x42,
        expected,
    };
    assert_eq!(guarded.check_all().unwrap(), vec![corruption]);
    assert!(corruption.to_string().contains(&format!("byte at block offset {bad_byte_offset}")), "{corruption}");

    // Freeing it reports the corruption, and frees it all the same.
    let error = guarded.free(victim).unwrap_err();
    assert_eq!(error, MarginError::Corrupted(vec![corruption]));
    assert_eq!(guarded.live_allocations(), 4);
    assert_eq!(guarded.heap().live_allocations(), 4);
    assert!(guarded.check_all().unwrap().is_empty(), "the others are intact");
    // A second free of the same handle is a double free, not a second report.
    assert!(matches!(guarded.free(victim), Err(MarginError::Heap(Error::DoubleFree { .. }))));
    // The heap serves again, with fresh margins where the damage was.
    let again = guarded.allocate(request, None).unwrap();
    assert!(guarded.check_all().unwrap().is_empty());
    live.push(again);
    drain(guarded, live, context);
}

#[test]
fn one_byte_past_the_end_is_reported_after() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    one_byte_overwrite(&context, 100, Side::After);
    crate::common::finish(context);
}

#[test]
fn one_byte_before_the_start_is_reported_before() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    one_byte_overwrite(&context, -1, Side::Before);
    crate::common::finish(context);
}

#[test]
fn margin_zero_changes_nothing_and_checks_nothing() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    let mut guarded = guarded(&context, 0);
    let mut live = Vec::new();
    let mut total = 0;
    for (size_bytes, align_bytes) in [(1, 1), (100, 4), (4096, 4096), (1000, 256)] {
        let allocation = guarded.allocate(Request::new(size_bytes, align_bytes).unwrap(), None).unwrap();
        assert_eq!(allocation.inner().size_bytes(), size_bytes);
        assert_eq!((allocation.offset(), allocation.address()), (allocation.inner().offset(), allocation.inner().address()));
        total += size_bytes;
        live.push(allocation);
    }
    assert_eq!(guarded.heap().stats().live_bytes, total, "no overhead");
    // Nothing is checked: writing past an allocation (into its neighbour or free space) is not seen.
    guarded.source().write_bytes(live[1].address() + 100, &[0x42]).unwrap();
    assert!(guarded.check_all().unwrap().is_empty());
    drain(guarded, live, &context);
    crate::common::finish(context);
}

#[test]
fn margins_must_be_a_multiple_of_4_and_mapped() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    for margin_bytes in [1, 2, 3, 6, 17] {
        let error = GuardedHeap::new(heap(&context, DeviceSourceConfig::new(MemoryUsage::Upload)), margin_bytes).unwrap_err();
        assert_eq!(error, MarginError::InvalidMargin { margin_bytes });
        assert!(error.to_string().contains("multiple of 4"), "{error}");
    }
    let unmapped = DeviceSourceConfig { persistent_mapping: false, ..DeviceSourceConfig::new(MemoryUsage::Upload) };
    let error = GuardedHeap::new(heap(&context, unmapped), 16).unwrap_err();
    assert!(matches!(error, MarginError::NotMapped(_)), "{error}");
    assert!(error.to_string().contains("host-visible"), "{error}");
    // Without margins nothing is read or written, so any memory will do.
    let guarded = GuardedHeap::new(heap(&context, unmapped), 0).unwrap();
    drop(guarded);
    crate::common::finish(context);
}
