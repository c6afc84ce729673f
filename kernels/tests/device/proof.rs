//! Proof on the device: what `DevicePagedHeap` hands out is real, resident, disjoint memory, checked by the WGSL
//! kernels on the sparse buffer itself; the frag_oom story at full scale (a heap of blocks fails, paging serves);
//! and what binding pages costs under the GPT-2 trace. Validation is on and must stay silent. Only resident
//! ranges are ever given to the kernels (`residencyNonResidentStrict` may be false).

#![allow(
    unsafe_code,
    reason = "the kernels run on the sparse buffer through `ComputeBuffer::from_raw`; each block says why it is sound"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crate::common::{Rng, finish, sparse_context};
use heapscope_core::units::{GIB, MIB};
use heapscope_core::{Allocation, Error, Heap, HeapConfig, OomCause, PolicyKind, ReleaseRule, Request};
use heapscope_kernels::VulkanKernels;
use heapscope_kernels::{KernelRunner, Op, VerifyResult};
use heapscope_vulkan::compute::ComputeBuffer;
use heapscope_vulkan::memory_types::MemoryUsage;
use heapscope_vulkan::{DeviceMemorySource, DevicePagedConfig, DevicePagedHeap, DeviceSourceConfig, SparseBuffer, SparseConfig};

/// The heap's sparse buffer as a kernel target.
fn target(heap: &DevicePagedHeap) -> ComputeBuffer<'static> {
    // SAFETY: the buffer is the heap's (same device as the kernels), created with storage usage, `size_bytes()`
    // long; the heap outlives every `run` it is passed to, and the callers give the kernels only ranges of live
    // allocations, whose pages are bound (after `wait_binds`).
    unsafe { ComputeBuffer::from_raw(heap.buffer(), heap.sparse().size_bytes()) }
}

/// 10,000 random allocations and frees through a `DevicePagedHeap` (TLSF, 4 KiB to 1 MiB, 64 MiB pool cap) in
/// batches of 100; after each batch the binds are waited for, the new allocations are filled with their id's
/// pattern by the fill kernel and every live allocation is verified by the verify kernel on the sparse buffer.
/// Zero mismatches: live allocations never share a page's bytes, and no bind lost or moved data.
#[test]
fn random_traffic_through_the_paged_heap_verified_by_the_kernels() {
    let Some(context) = sparse_context() else { return };
    {
        let mut kernels = VulkanKernels::new(Arc::clone(&context)).unwrap();
        let mut heap = DevicePagedHeap::new(Arc::clone(&context), DevicePagedConfig::new(512 * MIB, Some(64 * MIB))).unwrap();
        let page = heap.sparse().page_bytes();
        let mut rng = Rng::new(0x9a9e);
        let mut live: BTreeMap<u64, (Allocation, u32)> = BTreeMap::new();
        let (mut next_id, mut ops_done, mut ooms, mut verified_bytes, mut max_live) = (1_u32, 0, 0, 0_u64, 0);
        let started = Instant::now();
        for batch in 0..100 {
            let mut fresh = Vec::new();
            for _ in 0..100 {
                let free = !live.is_empty() && (live.len() >= 150 || rng.range(0, 99) < 45);
                if free {
                    let nth = rng.range(0, live.len() as u64 - 1) as usize;
                    let offset = *live.keys().nth(nth).unwrap();
                    let (allocation, _) = live.remove(&offset).unwrap();
                    fresh.retain(|&at| at != offset);
                    heap.free(allocation).unwrap();
                } else {
                    // 4 KiB .. 1 MiB, log-uniform, multiples of 4.
                    let exponent = rng.range(12, 19);
                    let size = rng.range(1 << exponent, 2 << exponent).min(MIB) / 4 * 4;
                    match heap.allocate(Request::new(size, 256).unwrap()) {
                        Ok(allocation) => {
                            assert!(live.insert(allocation.offset(), (allocation, next_id)).is_none(), "batch {batch}");
                            fresh.push(allocation.offset());
                            next_id += 1;
                        }
                        Err(error) if error.is_out_of_memory() => ooms += 1,
                        Err(error) => panic!("batch {batch}: {error}"),
                    }
                }
                ops_done += 1;
            }
            max_live = max_live.max(live.len());
            let stats = heap.stats();
            assert_eq!(stats.sparse.pages_bound * page, stats.heap.mapped_bytes, "batch {batch}");
            heap.wait_binds().unwrap();
            let buffer = target(&heap);
            let mut ops = Vec::with_capacity(fresh.len() + live.len());
            for offset in &fresh {
                let (allocation, id) = live[offset];
                ops.push(Op::Fill { target: buffer, offset_bytes: *offset, len_bytes: allocation.size_bytes(), id });
            }
            for (&offset, &(allocation, id)) in &live {
                ops.push(Op::Verify { target: buffer, offset_bytes: offset, len_bytes: allocation.size_bytes(), id });
                verified_bytes += allocation.size_bytes();
            }
            let results = kernels.run(&ops).unwrap();
            assert_eq!(results.len(), live.len());
            for ((offset, (allocation, id)), result) in live.iter().zip(&results) {
                assert!(result.is_clean(), "batch {batch}: allocation #{id} at {offset:#x} ({allocation:?}): {result:?}");
            }
        }
        assert_eq!(ops_done, 10_000);
        let stats = heap.stats();
        eprintln!(
            "paged integrity: {ops_done} ops, {ooms} out of memory, at most {max_live} live, {} MiB verified, 0 mismatches; \
             {} batches, {} bind entries, peak {} pages bound; {:.2?}",
            verified_bytes / MIB,
            stats.sparse.batches,
            stats.sparse.bind_entries,
            stats.sparse.peak_pages_bound,
            started.elapsed()
        );
        for (_, (allocation, _)) in std::mem::take(&mut live) {
            heap.free(allocation).unwrap();
        }
        assert_eq!(heap.stats().sparse.pages_bound, 0);
        heap.wait_binds().unwrap();
        drop(kernels);
    }
    finish(context);
}

/// A page filled by the fill kernel and remapped to another offset is found there by the verify kernel; the
/// pages left in place are intact, and a wrong id is caught everywhere.
#[test]
fn a_remapped_page_verified_by_the_kernel() {
    let Some(context) = sparse_context() else { return };
    {
        let mut kernels = VulkanKernels::new(Arc::clone(&context)).unwrap();
        let mut buffer = SparseBuffer::new(Arc::clone(&context), SparseConfig::new(4 * MIB)).unwrap();
        let page = buffer.page_bytes();
        buffer.bind(&[(0, 16 * page)]).unwrap();
        buffer.wait_binds().unwrap();
        // SAFETY: the sparse buffer is of this device, has storage usage, is `size_bytes()` long and outlives the
        // runs below; only bound pages are given to the kernels.
        let target = unsafe { ComputeBuffer::from_raw(buffer.buffer(), buffer.size_bytes()) };
        let fills: Vec<_> = (0..16_u32)
            .map(|index| Op::Fill { target, offset_bytes: u64::from(index) * page, len_bytes: page, id: 100 + index })
            .collect();
        kernels.run(&fills).unwrap();
        buffer.remap(3 * page, 200 * page).unwrap();
        buffer.wait_binds().unwrap();
        let verify = |offset_page: u64, id: u32| Op::Verify { target, offset_bytes: offset_page * page, len_bytes: page, id };
        let mut ops: Vec<_> =
            (0..16_u32).filter(|&index| index != 3).map(|index| verify(u64::from(index), 100 + index)).collect();
        ops.push(verify(200, 103));
        ops.push(verify(200, 104));
        let results = kernels.run(&ops).unwrap();
        assert!(results[..16].iter().all(VerifyResult::is_clean), "{results:?}");
        let words = (page / 4) as u32;
        assert_eq!(results[16], VerifyResult { mismatches: words, first_mismatch: Some(0) }, "a wrong id fails every word");
        buffer.unbind(&[(0, 3 * page), (4 * page, 12 * page), (200 * page, page)]).unwrap();
        assert_eq!(buffer.stats().pages_bound, 0);
        buffer.wait_binds().unwrap();
        drop(kernels);
    }
    finish(context);
}

/// The frag_oom story on the device, 3584 MiB budget: 20 x 150 MiB allocated and freed, 20 x 100 MiB allocated,
/// then 1 GiB.
///
/// (a) At full scale, a heap of blocks configured like PyTorch's caching allocator (a block of its own per 150 MiB
/// request, sized to it: a multiple of 2 MiB; empty blocks cached until a reservation fails) fails the 1 GiB
/// request: fragmentation, 1000 MiB free in blocks (largest run 50 MiB), 584 MiB reservable.
///
/// (b) A `DevicePagedHeap` capped at the budget serves it. Its virtual range is one sparse buffer, at most
/// `sparseAddressSpaceSize`: where that is under twice the budget (lavapipe: 2 GiB) the story is scaled by 1/4
/// (896 MiB cap, 37.5 / 25 / 256 MiB). The kernels fill and verify the first and last MiB of every 100 MiB
/// allocation (25 MiB scaled) and the first and last 16 MiB of the 1 GiB one (256 MiB scaled): 72 MiB, not
/// everything, which would commit all of it in RAM on lavapipe.
#[test]
fn frag_oom_fails_in_blocks_and_succeeds_through_paging() {
    let Some(context) = sparse_context() else { return };
    let budget = 3584 * MIB;
    let request = |bytes: u64| Request::new(bytes, 512).unwrap();
    let started = Instant::now();
    {
        let mut source_config = DeviceSourceConfig::new(MemoryUsage::DeviceLocal);
        source_config.budget_cap_bytes = Some(budget);
        source_config.persistent_mapping = false;
        let source = DeviceMemorySource::new(Arc::clone(&context), source_config).unwrap();
        let config =
            HeapConfig { release: ReleaseRule::OnPressure, capacity_bytes: Some(budget), ..HeapConfig::new(PolicyKind::BestFit) };
        let mut heap = Heap::new(config, source).unwrap();
        let big: Vec<_> = (0..20).map(|_| heap.allocate(request(150 * MIB), None).unwrap()).collect();
        for allocation in big {
            heap.free(allocation).unwrap();
        }
        let medium: Vec<_> = (0..20).map(|_| heap.allocate(request(100 * MIB), None).unwrap()).collect();
        assert_eq!(heap.source().live_blocks(), 20, "every 100 MiB request went into a cached 150 MiB block");
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(request(GIB), None) else {
            panic!("the heap of blocks must fail the 1 GiB request");
        };
        eprintln!("frag_oom, heap of blocks on the device: {verdict}");
        assert_eq!(verdict.cause, OomCause::Fragmentation);
        assert_eq!((verdict.reserved_bytes, verdict.live_bytes), (3000 * MIB, 2000 * MIB));
        assert_eq!((verdict.free_in_blocks_bytes, verdict.largest_free_run_bytes), (1000 * MIB, 50 * MIB));
        assert_eq!(verdict.unreserved_bytes, 584 * MIB);
        for allocation in medium {
            heap.free(allocation).unwrap();
        }
        heap.release_empty_blocks();
        assert_eq!(heap.source().live_blocks(), 0);
        drop(heap);
    }
    {
        let address_space = context.properties().limits.sparse_address_space_size_bytes;
        let scale = if address_space >= 2 * budget { 1 } else { 4 };
        let (budget, virtual_bytes) = (budget / scale, 2 * budget / scale);
        let mut kernels = VulkanKernels::new(Arc::clone(&context)).unwrap();
        let mut config = DevicePagedConfig::new(virtual_bytes, Some(budget));
        // 4096 pages a chunk: ~220 memory chunks of 4 KiB pages for 3.4 GiB, far below the mapping limit.
        config.pages_per_chunk = 4096;
        let mut heap = DevicePagedHeap::new(Arc::clone(&context), config).unwrap();
        let big: Vec<_> = (0..20).map(|_| heap.allocate(request(150 * MIB / scale)).unwrap()).collect();
        for allocation in big {
            heap.free(allocation).unwrap();
        }
        let medium: Vec<_> = (0..20).map(|_| heap.allocate(request(100 * MIB / scale)).unwrap()).collect();
        let last = heap.allocate(request(GIB / scale)).unwrap();
        let stats = heap.stats();
        assert!(stats.heap.mapped_bytes <= budget, "{stats:?}");
        assert_eq!(stats.sparse.pages_bound * heap.sparse().page_bytes(), stats.heap.mapped_bytes);
        heap.wait_binds().unwrap();
        let buffer = target(&heap);
        let mut ranges = Vec::new();
        for (index, allocation) in medium.iter().enumerate() {
            let id = 1 + index as u32;
            ranges.push((allocation.offset(), MIB, id));
            ranges.push((allocation.offset() + allocation.size_bytes() - MIB, MIB, 1000 + id));
        }
        ranges.push((last.offset(), 16 * MIB, 5000));
        ranges.push((last.offset() + last.size_bytes() - 16 * MIB, 16 * MIB, 5001));
        let fills: Vec<_> = ranges
            .iter()
            .map(|&(offset_bytes, len_bytes, id)| Op::Fill { target: buffer, offset_bytes, len_bytes, id })
            .collect();
        let verifies: Vec<_> = ranges
            .iter()
            .map(|&(offset_bytes, len_bytes, id)| Op::Verify { target: buffer, offset_bytes, len_bytes, id })
            .collect();
        kernels.run(&fills).unwrap();
        let results = kernels.run(&verifies).unwrap();
        let mismatches: u64 = results.iter().map(|result| u64::from(result.mismatches)).sum();
        eprintln!(
            "frag_oom, DevicePagedHeap (scale 1/{scale}: {} MiB cap, {} MiB virtual): {} MiB served; {} MiB bound ({} pages, \
             {} bind entries, {} batches); {} MiB filled and verified by the kernels, {mismatches} mismatches; {:.2?} in all",
            budget / MIB,
            virtual_bytes / MIB,
            last.size_bytes() / MIB,
            stats.heap.mapped_bytes / MIB,
            stats.sparse.pages_bound,
            stats.sparse.bind_entries,
            stats.sparse.batches,
            ranges.iter().map(|range| range.1).sum::<u64>() / MIB,
            started.elapsed()
        );
        assert_eq!(mismatches, 0, "{results:?}");
        heap.free(last).unwrap();
        for allocation in medium {
            heap.free(allocation).unwrap();
        }
        assert_eq!(heap.stats().sparse.pages_bound, 0);
        heap.wait_binds().unwrap();
        drop(kernels);
    }
    finish(context);
}
