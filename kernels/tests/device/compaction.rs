//! Compaction on a Vulkan device: a heap of real `vkAllocateMemory` blocks, each allocation written by the fill kernel
//! with its own pattern; the heap's moves copied by its source (`vkCmdCopyBuffer`, a barrier between each, before
//! emptied blocks go back); the verify kernel then reads every allocation at its new place.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::collections::HashMap;
use std::sync::Arc;

use crate::common::Rng;
use heapscope_core::compaction::{Algorithm, Budget};
use heapscope_core::units::{KIB, MIB};
use heapscope_core::{Heap, HeapAllocation, HeapConfig, HeapMove, Movable, PolicyKind, ReleaseRule, Request};
use heapscope_kernels::{KernelRunner, VulkanKernels};
use heapscope_vulkan::compute::BlockBuffer;
use heapscope_vulkan::{DeviceMemorySource, DeviceSourceConfig};

/// The allocation's block and byte range.
fn span(allocation: &HeapAllocation) -> (u32, u64, u64) {
    (allocation.block(), allocation.offset(), allocation.offset() + allocation.size_bytes())
}

/// Whether a later move writes where an earlier one read, or reads where an earlier one wrote: the order (and the
/// barrier between copies) matters.
fn moves_depend(moves: &[HeapMove]) -> bool {
    let overlap = |a: (u32, u64, u64), b: (u32, u64, u64)| a.0 == b.0 && a.1 < b.2 && b.1 < a.2;
    moves.iter().enumerate().any(|(k, later)| {
        moves[..k]
            .iter()
            .any(|earlier| overlap(span(&later.to), span(&earlier.from)) || overlap(span(&later.from), span(&earlier.to)))
    })
}

/// Random heaps of the three policies that move: allocations filled on the device, a third of them freed, a full pass
/// (slides within blocks, then blocks emptied into the others) with emptied blocks given back at once; every
/// allocation, moved or not, verified at its place afterwards: 0 mismatches. The moves include ones that depend on
/// each other, so the copies' order is exercised.
#[test]
fn compaction_copies_every_move_on_the_device() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    let mut kernels = VulkanKernels::new(Arc::clone(&context)).unwrap();
    let mut rng = Rng::new(0xdefa9);
    let (mut moves_total, mut bytes_total, mut dependent) = (0_usize, 0_u64, false);
    for policy in [PolicyKind::Tlsf, PolicyKind::BestFit, PolicyKind::FirstFit] {
        let source = DeviceMemorySource::new(Arc::clone(&context), DeviceSourceConfig::device_only(None)).unwrap();
        let config = HeapConfig {
            block_size_bytes: 4 * MIB,
            dedicated_threshold_bytes: u64::MAX,
            release: ReleaseRule::Immediately,
            grow_blocks: false,
            ..HeapConfig::new(policy)
        };
        let mut heap = Heap::new(config, source).unwrap();
        // Each live allocation with the id its pattern is made of.
        let mut live: Vec<(Movable, u32)> = Vec::new();
        for id in 0..96_u32 {
            let request = Request::new(rng.range(16, 512) * KIB, 256).unwrap();
            live.push((Movable { allocation: heap.allocate(request, None).unwrap(), request }, id));
        }
        let mut keep = Vec::new();
        for (movable, id) in live {
            if rng.chance(0.35) {
                heap.free(movable.allocation).unwrap();
            } else {
                keep.push((movable, id));
            }
        }
        let blocks_before = heap.stats().blocks_reserved - heap.stats().blocks_released;
        {
            let mut buffers: HashMap<u64, BlockBuffer<'_>> = HashMap::new();
            for (movable, id) in &keep {
                let block = movable.allocation.address() - movable.allocation.offset();
                let (info, _) = heap.source().locate(block).unwrap();
                let buffer = buffers.entry(info.handle).or_insert_with(|| BlockBuffer::new(heap.source(), info.handle).unwrap());
                kernels.fill(buffer.as_compute(), movable.allocation.offset(), movable.allocation.size_bytes(), *id).unwrap();
            }
        }
        let movable: Vec<Movable> = keep.iter().map(|(movable, _)| *movable).collect();
        let compaction = heap.compact(&movable, Algorithm::Full, Budget::UNLIMITED).unwrap();
        assert!(!compaction.moves.is_empty(), "{policy:?}: a scattered heap compacts");
        dependent |= moves_depend(&compaction.moves);
        moves_total += compaction.moves.len();
        bytes_total += compaction.bytes_moved;
        let copies = heap.source().copy_stats();
        assert_eq!((copies.copies, copies.bytes), (compaction.moves.len() as u64, compaction.bytes_moved), "{policy:?}");
        let mut now: HashMap<HeapAllocation, HeapAllocation> = keep.iter().map(|(m, _)| (m.allocation, m.allocation)).collect();
        let mut origin: HashMap<HeapAllocation, HeapAllocation> = now.clone();
        for HeapMove { from, to } in &compaction.moves {
            let first = origin.remove(from).unwrap();
            origin.insert(*to, first);
            now.insert(first, *to);
        }
        {
            let mut buffers: HashMap<u64, BlockBuffer<'_>> = HashMap::new();
            for (movable, id) in &keep {
                let at = now[&movable.allocation];
                let (info, _) = heap.source().locate(at.address() - at.offset()).unwrap();
                let buffer = buffers.entry(info.handle).or_insert_with(|| BlockBuffer::new(heap.source(), info.handle).unwrap());
                let result = kernels.verify(buffer.as_compute(), at.offset(), at.size_bytes(), *id).unwrap();
                assert!(result.is_clean(), "{policy:?}: allocation {id} at {at:?}: {result:?}");
            }
        }
        let blocks_after = heap.stats().blocks_reserved - heap.stats().blocks_released;
        assert!(blocks_after <= blocks_before, "{policy:?}: {blocks_before} blocks before, {blocks_after} after");
        for (movable, _) in &keep {
            heap.free(now[&movable.allocation]).unwrap();
        }
    }
    assert!(dependent, "some moves depend on earlier ones, so their order was exercised");
    eprintln!("compaction on the device: {moves_total} moves, {} MiB copied, 0 mismatches", bytes_total / MIB);
    drop(kernels);
    crate::common::finish(context);
}

/// `paged` compacts by remapping: a sparse buffer of 1,024 pages filled with allocations of a quarter page to twelve
/// pages (many share pages), two in five freed at random, until a request finds no run of the virtual range although
/// enough of it is free (fragmentation); each allocation written by the fill kernel. A full pass moves the clusters of
/// allocations down the buffer by rebinding their physical pages (`vkQueueBindSparse`, one batch); nothing is copied,
/// and the verify kernel finds every allocation's bytes at its new place. The refused request then fits.
#[test]
fn paged_compaction_remaps_pages_and_copies_nothing() {
    use crate::paged_pressure::fill_and_verify;
    use heapscope_core::{Allocation, Error, OomCause};
    use heapscope_vulkan::{DevicePagedConfig, DevicePagedHeap};

    let Some(context) = crate::common::sparse_context() else { return };
    let mut kernels = VulkanKernels::new(Arc::clone(&context)).unwrap();
    let page = heapscope_vulkan::SparseBuffer::page_bytes_on(&context).unwrap();
    let mut heap = DevicePagedHeap::new(Arc::clone(&context), DevicePagedConfig::new(1024 * page, None)).unwrap();
    let mut rng = Rng::new(0x9a6e5);
    let mut live: Vec<(Allocation, Request, u32)> = Vec::new();
    for id in 0..400_u32 {
        // Whole words: the kernels read and write 4 bytes at a time.
        let request = Request::new(rng.range(page / 4, 12 * page) / 4 * 4, 256).unwrap();
        match heap.allocate(request) {
            Ok(allocation) => live.push((allocation, request, id)),
            Err(_) => break,
        }
        if rng.chance(0.4) && !live.is_empty() {
            let (allocation, ..) = live.swap_remove(rng.range(0, live.len() as u64 - 1) as usize);
            heap.free(allocation).unwrap();
        }
    }
    let with_ids: Vec<(Allocation, u32)> = live.iter().map(|&(a, _, id)| (a, id)).collect();
    fill_and_verify(&mut kernels, &heap, &with_ids, &with_ids);
    // A page more than the largest free run of the virtual range: no run holds it, its free bytes would.
    let free: Vec<u64> = heap
        .heap()
        .report()
        .ranges
        .iter()
        .filter(|r| r.state == heapscope_core::RangeState::Free)
        .map(|r| r.size_bytes)
        .collect();
    let big = Request::new(free.iter().max().unwrap().next_multiple_of(page) + page, page).unwrap();
    assert!(free.iter().sum::<u64>() >= 2 * big.size_bytes(), "free runs {free:?}");
    let Err(heapscope_vulkan::VulkanError::Heap(Error::OutOfMemory(verdict))) = heap.allocate(big) else {
        panic!("the scattered range holds {} B in one run", big.size_bytes())
    };
    assert_eq!(verdict.cause, OomCause::Fragmentation, "{verdict}");
    let bound_before = heap.stats().sparse.pages_bound;
    let movable: Vec<(Allocation, Request)> = live.iter().map(|&(a, r, _)| (a, r)).collect();
    let compaction = heap.compact(&movable, Algorithm::Full, Budget::UNLIMITED).unwrap();
    assert!(compaction.remaps.len() >= 2, "{compaction:?}");
    assert!(compaction.largest_free_after_bytes >= big.size_bytes(), "{compaction:?}");
    let stats = heap.stats();
    assert_eq!(stats.sparse.pages_remapped * page, compaction.bytes_remapped);
    assert_eq!(stats.sparse.pages_bound, bound_before, "the same physical pages, bound elsewhere");
    let mut now: HashMap<Allocation, Allocation> = live.iter().map(|&(a, ..)| (a, a)).collect();
    let mut origin: HashMap<Allocation, Allocation> = now.clone();
    for &(from, to) in &compaction.moves {
        let first = origin.remove(&from).unwrap();
        origin.insert(to, first);
        now.insert(first, to);
    }
    let moved: Vec<(Allocation, u32)> = live.iter().map(|&(a, _, id)| (now[&a], id)).collect();
    fill_and_verify(&mut kernels, &heap, &[], &moved);
    let served = heap.allocate(big).unwrap();
    fill_and_verify(&mut kernels, &heap, &[(served, 9999)], &moved);
    eprintln!(
        "paged compaction on the device: {} allocations moved in {} remaps, {} KiB remapped, 0 bytes copied, 0 mismatches",
        compaction.moves.len(),
        compaction.remaps.len(),
        compaction.bytes_remapped / KIB
    );
    heap.free(served).unwrap();
    for (allocation, _) in moved {
        heap.free(allocation).unwrap();
    }
    assert_eq!(heap.stats().sparse.pages_bound, 0);
    drop(heap);
    drop(kernels);
    crate::common::finish(context);
}
