//! VMA (vk-mem 0.5) as a heapscope `DeviceHeap` on a real device, validated.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use crate::common::Rng;
use crate::common::external::{Capped, capped_traffic, free_all, random_traffic, replay_gpt2, with_heap};
use heapscope_core::units::MIB;
use heapscope_core::{DeviceHeap, OomCause, Request};
use heapscope_vulkan::{VmaBackend, VmaConfig, VmaHeap};

/// 2,000 random allocations and frees (1 B to 256 KiB, one in ten 3 to 40 MiB; alignments to 4 KiB) with 16 MiB
/// preferred blocks: no overlap, every allocation inside a block the device events reserved, reserved bytes =
/// the sum of those blocks and = VMA's own block bytes after every step.
#[test]
fn random_allocs_and_frees_do_not_overlap() {
    let config = VmaConfig { block_size_bytes: 16 * MIB, budget_cap_bytes: None };
    with_heap::<VmaBackend>(config, |context, heap| {
        let traffic = random_traffic(heap, &mut Rng::new(0x0e3a), 2000, 3 * MIB..=40 * MIB, |_, blocks| {
            assert_eq!(context.live_allocation_count() as usize, blocks.len(), "its blocks count on the device");
        });
        assert!(traffic.released > 0, "blocks came and went");
        let live_bytes = traffic.live_bytes();
        assert_eq!(heap.reserved_and_live_bytes().1, live_bytes);
        let (allocated, _) = heap.allocated_and_largest_free_bytes().unwrap();
        assert!(allocated >= live_bytes && allocated <= heap.reserved_bytes(), "{allocated} {live_bytes}");
        let blocks = free_all(heap, traffic);
        assert!(blocks.len() <= 1, "at most the empty block VMA keeps stays: {blocks:?}");
        assert_eq!(heap.reserved_and_live_bytes(), (blocks.values().sum(), 0));
    });
}

#[test]
fn heaps_move_between_threads() {
    crate::common::assert_send::<VmaHeap>();
}

/// The cap is VMA's heap size limit: under random traffic the peak of reserved bytes never exceeds it, every
/// refusal is an out-of-memory verdict named `vma`, and after frees the heap serves again.
#[test]
fn budget_cap_is_never_crossed() {
    let cap = 48 * MIB;
    with_heap::<VmaBackend>(VmaConfig { block_size_bytes: 16 * MIB, budget_cap_bytes: Some(cap) }, |_, heap| {
        let Capped { live, verdicts, .. } = capped_traffic(heap, &mut Rng::new(0x0cab), 3000, 4 * MIB..=12 * MIB, |_| 256);
        for verdict in &verdicts {
            assert!(verdict.live_bytes <= verdict.reserved_bytes, "{verdict}");
            assert!(verdict.largest_free_run_bytes <= verdict.free_in_blocks_bytes, "{verdict}");
        }
        assert!(!verdicts.is_empty(), "the cap bit");
        let fragmentation = verdicts.iter().filter(|verdict| verdict.cause == OomCause::Fragmentation).count();
        eprintln!(
            "vma cap {cap}: peak {} B, {} refused ({fragmentation} fragmentation); first: {}",
            heap.peak_reserved_bytes(),
            verdicts.len(),
            verdicts[0]
        );
        for handle in live {
            heap.free_handle(handle).unwrap();
        }
        let again = heap.allocate_request(Request::new(12 * MIB, 256).unwrap()).unwrap();
        heap.free_handle(again).unwrap();
    });
}

#[test]
fn gpt2_trace_replays_through_vma() {
    with_heap::<VmaBackend>(VmaConfig::default(), |context, heap| replay_gpt2(context, heap));
}
