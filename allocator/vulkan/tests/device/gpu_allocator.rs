//! gpu-allocator as a heapscope `DeviceHeap` on a real device, validated.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use crate::common::Rng;
use crate::common::external::{capped_traffic, free_all, random_traffic, replay_gpt2, with_heap};
use heapscope_core::units::MIB;
use heapscope_core::{DeviceHeap, Error, OomCause, Request};
use heapscope_vulkan::{GpuAllocatorBackend, GpuAllocatorConfig, GpuAllocatorHeap};

#[test]
fn random_allocs_and_frees_do_not_overlap() {
    // 4 MiB blocks (gpu-allocator's smallest), so that many blocks come and go.
    let config = GpuAllocatorConfig { block_size_bytes: 4 * MIB, budget_cap_bytes: None };
    with_heap::<GpuAllocatorBackend>(config, |context, heap| {
        let traffic = random_traffic(heap, &mut Rng::new(7), 1000, 4 * MIB..=6 * MIB, |_, _| {});
        assert_eq!(heap.reserved_and_live_bytes().1, traffic.live_bytes());
        assert_eq!(heap.report().total_capacity_bytes, heap.reserved_bytes());
        let blocks = free_all(heap, traffic);
        assert!(blocks.len() <= 1, "at most gpu-allocator's last general block stays: {blocks:?}");
        assert_eq!(context.live_allocation_count() as usize, blocks.len(), "its blocks count on the device");
        assert_eq!(heap.reserved_and_live_bytes(), (blocks.values().sum(), 0));
    });
}

#[test]
fn heaps_move_between_threads() {
    crate::common::assert_send::<GpuAllocatorHeap>();
}

#[test]
fn budget_cap_refuses_with_a_verdict() {
    let cap = 16 * MIB;
    let config = GpuAllocatorConfig { block_size_bytes: 4 * MIB, budget_cap_bytes: Some(cap) };
    with_heap::<GpuAllocatorBackend>(config, |_, heap| {
        let mut handles = Vec::new();
        let verdict = loop {
            match heap.allocate_request(Request::new(3 * MIB, 256).unwrap()) {
                Ok(handle) => handles.push(handle),
                Err(Error::OutOfMemory(verdict)) => break verdict,
                Err(other) => panic!("{other}"),
            }
            assert!(handles.len() < 100, "the cap never bit");
        };
        assert_eq!(handles.len(), 4, "one 3 MiB allocation per 4 MiB block, four blocks under 16 MiB");
        assert!(heap.reserved_bytes() <= cap);
        assert_eq!(verdict.policy, "gpu-allocator");
        assert_eq!((verdict.reserved_bytes, verdict.capacity_bytes, verdict.unreserved_bytes), (16 * MIB, Some(cap), 0));
        assert_eq!(verdict.live_bytes, 12 * MIB);
        assert_eq!(verdict.largest_free_run_bytes, MIB);
        assert_eq!(verdict.cause, OomCause::Fragmentation, "4 MiB free in blocks, in 1 MiB runs");
        assert_eq!(heap.ooms(), 1);
        // Small requests still fit in the blocks' free tails.
        handles.push(heap.allocate_request(Request::new(MIB, 256).unwrap()).unwrap());
        for handle in handles {
            heap.free_handle(handle).unwrap();
        }
    });
}

/// The cap is checked before gpu-allocator allocates: under random traffic near the cap (shared 4 MiB blocks,
/// blocks of their own for larger requests) the peak of reserved bytes never exceeds it, every refusal is an
/// out-of-memory verdict, and requests that fit a free run of a live block are still served at the cap.
#[test]
fn budget_cap_is_never_crossed() {
    let cap = 26 * MIB;
    let config = GpuAllocatorConfig { block_size_bytes: 4 * MIB, budget_cap_bytes: Some(cap) };
    with_heap::<GpuAllocatorBackend>(config, |_, heap| {
        let traffic = capped_traffic(heap, &mut Rng::new(0x0cab), 3000, 4 * MIB + 1..=9 * MIB, |rng| 1 << rng.range(0, 12));
        let (refused, served_at_the_cap) = (traffic.verdicts.len(), traffic.served_at_the_cap);
        assert!(
            refused > 0 && served_at_the_cap > 0,
            "the cap bit ({refused} refused) and free runs were reused ({served_at_the_cap})"
        );
        eprintln!("cap {cap}: peak {} B, {refused} refused, {served_at_the_cap} served near the cap", heap.peak_reserved_bytes());
        for handle in traffic.live {
            heap.free_handle(handle).unwrap();
        }
    });
}

#[test]
fn gpt2_trace_replays_through_gpu_allocator() {
    with_heap::<GpuAllocatorBackend>(GpuAllocatorConfig::default(), |context, heap| replay_gpt2(context, heap));
}
