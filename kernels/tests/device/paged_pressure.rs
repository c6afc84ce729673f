//! `DevicePagedHeap` under `UnmapRule::UnderPressure`, on the sparse buffer itself, checked by the WGSL kernels:
//! freed pages stay bound (cached), later allocations reuse them without a bind and their data holds; when a
//! request needs more pages than the capacity leaves, the cached pages are unbound first and the request fits.
//! Validation is on and must stay silent; only resident ranges are given to the kernels.

#![allow(
    unsafe_code,
    reason = "the kernels run on the sparse buffer through `ComputeBuffer::from_raw`; each block says why it is sound"
)]
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::common::{Rng, finish, sparse_context};
use heapscope_core::units::MIB;
use heapscope_core::{Allocation, Request, UnmapRule};
use heapscope_kernels::VulkanKernels;
use heapscope_kernels::{KernelRunner, Op};
use heapscope_vulkan::compute::ComputeBuffer;
use heapscope_vulkan::{DevicePagedConfig, DevicePagedHeap, VulkanContext};

/// The heap's sparse buffer as a kernel target.
pub(crate) fn target(heap: &DevicePagedHeap) -> ComputeBuffer<'static> {
    // SAFETY: the buffer is the heap's (same device as the kernels), created with storage usage, `size_bytes()`
    // long; the heap outlives every `run` it is passed to, and the callers give the kernels only ranges of live
    // allocations, whose pages are bound (after `wait_binds`).
    unsafe { ComputeBuffer::from_raw(heap.buffer(), heap.sparse().size_bytes()) }
}

fn pressure_heap(context: &Arc<VulkanContext>, virtual_bytes: u64, capacity_bytes: u64) -> DevicePagedHeap {
    let mut config = DevicePagedConfig::new(virtual_bytes, Some(capacity_bytes));
    config.unmap = UnmapRule::UnderPressure;
    DevicePagedHeap::new(Arc::clone(context), config).unwrap()
}

/// Fills the `fresh` allocations with their ids' patterns, then verifies every live one; panics on a mismatch.
pub(crate) fn fill_and_verify(
    kernels: &mut VulkanKernels,
    heap: &DevicePagedHeap,
    fresh: &[(Allocation, u32)],
    live: &[(Allocation, u32)],
) {
    heap.wait_binds().unwrap();
    let buffer = target(heap);
    let mut ops: Vec<_> = fresh
        .iter()
        .map(|&(allocation, id)| Op::Fill {
            target: buffer,
            offset_bytes: allocation.offset(),
            len_bytes: allocation.size_bytes(),
            id,
        })
        .collect();
    ops.extend(live.iter().map(|&(allocation, id)| Op::Verify {
        target: buffer,
        offset_bytes: allocation.offset(),
        len_bytes: allocation.size_bytes(),
        id,
    }));
    let results = kernels.run(&ops).unwrap();
    for ((allocation, id), result) in live.iter().zip(&results) {
        assert!(result.is_clean(), "allocation #{id} ({allocation:?}): {result:?}");
    }
}

/// Freed pages stay bound and a later allocation on them binds nothing, its data verified with the survivors';
/// then 2,000 random operations under a cap that forces cache releases, every live allocation verified after each
/// batch of 50, pages bound = the heap's mapped bytes (cached ones included) throughout.
#[test]
fn cached_pages_are_reused_without_a_bind_and_keep_working() {
    let Some(context) = sparse_context() else { return };
    {
        let mut kernels = VulkanKernels::new(Arc::clone(&context)).unwrap();
        let mut heap = pressure_heap(&context, 256 * MIB, 24 * MIB);
        let page = heap.sparse().page_bytes();
        let request = |bytes: u64| Request::new(bytes, 256).unwrap();
        let first: Vec<(Allocation, u32)> = (0..8).map(|id| (heap.allocate(request(MIB)).unwrap(), id)).collect();
        fill_and_verify(&mut kernels, &heap, &first, &first);
        let bound = heap.stats().sparse;
        // Free every other one: their pages stay bound, cached.
        let (freed, kept): (Vec<_>, Vec<_>) = first.into_iter().partition(|&(_, id)| id % 2 == 0);
        for &(allocation, _) in &freed {
            heap.free(allocation).unwrap();
        }
        let stats = heap.stats();
        assert_eq!((stats.sparse.pages_bound, stats.sparse.unbind_entries), (bound.pages_bound, 0), "nothing unbound");
        assert_eq!(stats.heap.cached_bytes, 4 * MIB);
        // The same sizes land in the freed holes: served from the cache, no bind.
        let again: Vec<(Allocation, u32)> = (100..104).map(|id| (heap.allocate(request(MIB)).unwrap(), id)).collect();
        let stats = heap.stats();
        assert_eq!((stats.sparse.bind_entries, stats.sparse.batches), (bound.bind_entries, bound.batches), "no bind: {stats:?}");
        assert_eq!((stats.heap.pages_reused, stats.heap.cached_bytes), (4 * MIB / page, 0));
        let live: Vec<_> = kept.iter().chain(&again).copied().collect();
        fill_and_verify(&mut kernels, &heap, &again, &live);

        // Random traffic: 4 KiB to 512 KiB, at most 100 live (~25 MiB), under a 24 MiB cap: the cache is
        // released under pressure from time to time, and some requests are refused.
        let mut rng = Rng::new(0x5ca1e);
        let mut ooms = 0;
        let mut live: BTreeMap<u64, (Allocation, u32)> = live.into_iter().map(|entry| (entry.0.offset(), entry)).collect();
        let mut next_id = 1000;
        for batch in 0..40 {
            let mut fresh = Vec::new();
            for _ in 0..50 {
                if !live.is_empty() && (live.len() >= 100 || rng.range(0, 99) < 45) {
                    let offset = *live.keys().nth(rng.range(0, live.len() as u64 - 1) as usize).unwrap();
                    let (allocation, _) = live.remove(&offset).unwrap();
                    fresh.retain(|&(fresh_allocation, _): &(Allocation, u32)| fresh_allocation.offset() != offset);
                    heap.free(allocation).unwrap();
                } else {
                    let size = rng.range(4096, 512 << 10) / 4 * 4;
                    match heap.allocate(request(size)) {
                        Ok(allocation) => {
                            live.insert(allocation.offset(), (allocation, next_id));
                            fresh.push((allocation, next_id));
                            next_id += 1;
                        }
                        Err(error) if error.is_out_of_memory() => ooms += 1,
                        Err(error) => panic!("batch {batch}: {error}"),
                    }
                }
            }
            let stats = heap.stats();
            assert_eq!(stats.sparse.pages_bound * page, stats.heap.mapped_bytes, "batch {batch}");
            let all: Vec<_> = live.values().copied().collect();
            fill_and_verify(&mut kernels, &heap, &fresh, &all);
        }
        let stats = heap.stats();
        eprintln!(
            "pressure paging: {} pages reused without a bind, {} cached, {} cache releases, {ooms} refused; {} bind \
             entries, {} unbind entries, {} MiB bound at the end ({} MiB cached)",
            stats.heap.pages_reused,
            stats.heap.pages_cached,
            stats.heap.cache_releases,
            stats.sparse.bind_entries,
            stats.sparse.unbind_entries,
            stats.heap.mapped_bytes / MIB,
            stats.heap.cached_bytes / MIB
        );
        assert!(stats.heap.pages_reused > 4 * MIB / page, "the random traffic reused cached pages too");
        assert!(stats.heap.cache_releases > 0, "the cap made the heap release its cache");
        assert!(stats.heap.peak_mapped_bytes <= 24 * MIB);
        for (_, (allocation, _)) in live {
            heap.free(allocation).unwrap();
        }
        assert_eq!(heap.stats().heap.mapped_bytes, heap.stats().heap.cached_bytes, "everything left bound is cached");
        heap.wait_binds().unwrap();
        drop(kernels);
    }
    finish(context);
}

/// 16 MiB cap: 12 MiB freed and cached below a live 1 MiB allocation; a 14 MiB request cannot land in the 12 MiB
/// hole and needs 14 MiB of new pages, more than the 3 MiB the cap leaves: the cache is unbound, the request is
/// bound and served, and both live allocations hold their data.
#[test]
fn pressure_unbinds_the_cache_so_a_request_fits() {
    let Some(context) = sparse_context() else { return };
    {
        let mut kernels = VulkanKernels::new(Arc::clone(&context)).unwrap();
        let mut heap = pressure_heap(&context, 256 * MIB, 16 * MIB);
        let page = heap.sparse().page_bytes();
        let request = |bytes: u64| Request::new(bytes, 256).unwrap();
        let cached: Vec<_> = (0..12).map(|_| heap.allocate(request(MIB)).unwrap()).collect();
        let pin = heap.allocate(request(MIB)).unwrap();
        fill_and_verify(&mut kernels, &heap, &[(pin, 7)], &[(pin, 7)]);
        for allocation in cached {
            heap.free(allocation).unwrap();
        }
        let before = heap.stats();
        assert_eq!((before.heap.mapped_bytes, before.heap.cached_bytes), (13 * MIB, 12 * MIB));
        assert_eq!(before.sparse.pages_bound * page, 13 * MIB, "the cache is still bound");
        let big = heap.allocate(request(14 * MIB)).unwrap();
        assert!(big.offset() >= pin.offset() + pin.size_bytes(), "placed past the pin: {big:?}");
        let after = heap.stats();
        assert_eq!((after.heap.cache_releases, after.heap.cached_bytes, after.heap.mapped_bytes), (1, 0, 15 * MIB));
        assert_eq!(after.sparse.pages_bound * page, 15 * MIB, "the cache was unbound, the request bound");
        assert!(after.sparse.unbind_entries > before.sparse.unbind_entries);
        fill_and_verify(&mut kernels, &heap, &[(big, 8)], &[(pin, 7), (big, 8)]);
        // Nothing cached is left to release: past the cap now is a verdict.
        let error = heap.allocate(request(2 * MIB)).unwrap_err();
        assert!(error.is_out_of_memory(), "{error}");
        assert_eq!(heap.stats().sparse.pages_bound * page, 15 * MIB, "the refusal bound nothing");
        heap.free(big).unwrap();
        heap.free(pin).unwrap();
        heap.wait_binds().unwrap();
        drop(kernels);
    }
    finish(context);
}
