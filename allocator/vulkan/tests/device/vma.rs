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

/// VMA's own defragmentation through the heap (`DeviceHeap::compact`, VMA's full algorithm): 96 allocations of 64 KiB
/// to 2 MiB in 16 MiB blocks, each written with its own bytes, half of them freed at random, a tenth of the rest pinned
/// (not listed). VMA proposes moves; the heap ignores the pinned ones, copies the others on the device and VMA frees
/// the blocks it emptied. Every allocation then reads back its own bytes at its (new) place, no pinned one moved, the
/// old handles of moved ones are refused, and fewer bytes are reserved.
#[test]
fn defragmentation_moves_allocations_and_keeps_their_bytes() {
    use heapscope_core::compaction::{Algorithm, Budget};
    use heapscope_vulkan::VmaHandle;

    let config = VmaConfig { block_size_bytes: 16 * MIB, budget_cap_bytes: None };
    with_heap::<VmaBackend>(config, |_, heap| {
        let mut rng = Rng::new(0xdef7a9);
        let bytes_of = |id: u32, len: u64| -> Vec<u8> {
            (0..len).map(|i| (i as u32).wrapping_mul(31).wrapping_add(id * 7919) as u8).collect()
        };
        let mut live: Vec<(VmaHandle, Request, u32)> = Vec::new();
        for id in 0..96_u32 {
            let request = Request::new(rng.range(64, 2048) * 1024, 256).unwrap();
            let handle = heap.allocate_request(request).unwrap();
            heap.write(&handle, &bytes_of(id, request.size_bytes())).unwrap();
            live.push((handle, request, id));
        }
        let mut kept = Vec::new();
        for entry in live {
            if rng.chance(0.5) { heap.free_handle(entry.0).unwrap() } else { kept.push(entry) }
        }
        let pinned: Vec<VmaHandle> = kept.iter().step_by(10).map(|&(handle, ..)| handle).collect();
        let movable: Vec<(VmaHandle, Request)> =
            kept.iter().filter(|(handle, ..)| !pinned.contains(handle)).map(|&(handle, request, _)| (handle, request)).collect();
        let reserved_before = heap.reserved_bytes();
        let moves = heap.compact(&movable, Algorithm::Full, Budget::UNLIMITED).unwrap();
        assert!(!moves.is_empty(), "a scattered VMA heap defragments");
        let mut now: Vec<(VmaHandle, Request, u32)> = kept.clone();
        for &(index, to) in &moves {
            let from = movable[index].0;
            assert!(!pinned.contains(&from), "a pinned allocation moved");
            let entry = now.iter_mut().find(|(handle, ..)| *handle == from).unwrap();
            entry.0 = to;
            assert!(heap.read(&from, 1).is_err(), "the old handle is refused");
        }
        for (handle, request, id) in &now {
            let back = heap.read(handle, request.size_bytes() as usize).unwrap();
            assert!(back == bytes_of(*id, request.size_bytes()), "allocation {id} at {handle:?} lost its bytes");
        }
        assert!(
            heap.reserved_bytes() < reserved_before,
            "{} B reserved before, {} B after",
            reserved_before,
            heap.reserved_bytes()
        );
        eprintln!(
            "vma defragmentation: {} moves, {} of {} MiB reserved left, 0 mismatches, {:.2} ms copying",
            moves.len(),
            heap.reserved_bytes() / MIB,
            reserved_before / MIB,
            heap.copy_nanos() as f64 / 1e6
        );
        for (handle, ..) in now {
            heap.free_handle(handle).unwrap();
        }
    });
}
