//! Sparse binding on a real device: coalescing, contents of bound pages, remapping, a paged heap over a sparse
//! buffer under random traffic, the pool cap, and the frag_oom story through paging. Validation is on and must
//! stay silent. Only resident data is ever read (`residencyNonResidentStrict` may be false).

#![allow(
    unsafe_code,
    reason = "bytes go in and out of the sparse buffers through `Transfer`'s raw-handle copies; each block says why it is sound"
)]

use std::sync::Arc;

use crate::common::bind_cost::{gpt2_trace, replay_bind_cost};
use crate::common::{Rng, finish, sparse_context};
use heapscope_core::Request;
use heapscope_core::units::GIB;
use heapscope_vulkan::{
    BindLayout, DevicePagedConfig, DevicePagedHeap, SparseBuffer, SparseConfig, Transfer, VulkanError, measure_bind_latency,
};

const MIB: u64 = 1 << 20;

/// Bytes of a pattern that depends on `seed` and the position (no period: every page of it differs).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|index| ((seed << 32 ^ index).wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(seed) >> 56) as u8)
        .collect()
}

/// A sparse buffer moves to another thread (a live run's worker) by its fields alone: no `unsafe impl Send`.
#[test]
fn a_sparse_buffer_is_send_on_its_own() {
    crate::common::assert_send::<SparseBuffer>();
}

#[test]
fn page_size_comes_from_the_buffer_and_contiguous_pages_coalesce() {
    let Some(context) = sparse_context() else { return };
    {
        let mut buffer = SparseBuffer::new(Arc::clone(&context), SparseConfig::new(8 * MIB)).unwrap();
        let page = buffer.page_bytes();
        assert!(page.is_power_of_two(), "{page}");
        // A fresh pool hands out pages of one chunk in order: 10 pages are one bind entry.
        assert_eq!(buffer.bind(&[(0, 10 * page)]).unwrap(), 1);
        assert_eq!(buffer.stats().bind_entries, 1);
        assert_eq!(buffer.stats().pages_bound, 10);
        assert_eq!(buffer.stats().live_mappings, 1);
        // Every other page: one entry each.
        let scattered: Vec<(u64, u64)> = (0..5).map(|index| ((20 + 2 * index) * page, page)).collect();
        assert_eq!(buffer.bind(&scattered).unwrap(), 5);
        assert_eq!(buffer.stats().live_mappings, 6);
        // Binding over a bound page is refused and changes nothing.
        assert!(matches!(buffer.bind(&[(9 * page, 2 * page)]), Err(VulkanError::InvalidArgument(_))));
        assert_eq!(buffer.stats().pages_bound, 15);
        // Unbinding the middle of the run splits the mapping in two.
        assert_eq!(buffer.unbind(&[(4 * page, 2 * page)]).unwrap(), 1);
        assert_eq!(buffer.stats().live_mappings, 7);
        assert_eq!(buffer.stats().pages_bound, 13);
        assert!(buffer.unbind(&[(4 * page, page)]).is_err(), "unbinding an unbound page is refused");
        // Misaligned runs are refused.
        assert!(buffer.bind(&[(page / 2, page)]).is_err());
        let all: Vec<(u64, u64)> = [(0, 4 * page), (6 * page, 4 * page)].into_iter().chain(scattered).collect();
        buffer.unbind(&all).unwrap();
        assert_eq!(buffer.stats().pages_bound, 0);
        assert_eq!(buffer.stats().live_mappings, 0);
        assert_eq!(buffer.pool().used_pages(), 0);
        buffer.wait_binds().unwrap();
    }
    finish(context);
}

/// A size that ends inside a page makes a buffer of whole pages: its last page binds, and the size it gives (what
/// descriptors and wgpu are told) is what the buffer was made with. Its page chunks count as the device's memory
/// allocations, and its range in the device's sparse address space, which all sparse buffers share.
#[test]
fn a_size_inside_a_page_makes_whole_pages() {
    let Some(context) = sparse_context() else { return };
    {
        let page = SparseBuffer::page_bytes_on(&context).unwrap();
        let before = context.live_allocation_count();
        let mut buffer = SparseBuffer::new(Arc::clone(&context), SparseConfig::new(2 * page + 1)).unwrap();
        assert_eq!(buffer.size_bytes(), 3 * page);
        assert_eq!(buffer.bind(&[(0, 3 * page)]).unwrap(), 1, "the last page too");
        // Its page chunk is an allocation of the device's maxMemoryAllocationCount, as a source's block is.
        assert_eq!(context.live_allocation_count(), before + 1);
        buffer.unbind(&[(0, 3 * page)]).unwrap();
        buffer.wait_binds().unwrap();
        drop(buffer);
        assert_eq!(context.live_allocation_count(), before, "given back with the pool");
        // sparseAddressSpaceSize bounds every sparse buffer together: two halves fit, a third buffer does not until one
        // goes.
        let half = context.properties().limits.sparse_address_space_size_bytes / 2 / page * page;
        let first = SparseBuffer::new(Arc::clone(&context), SparseConfig::new(half)).unwrap();
        let second = SparseBuffer::new(Arc::clone(&context), SparseConfig::new(half)).unwrap();
        let third = SparseBuffer::new(Arc::clone(&context), SparseConfig::new(half));
        assert!(
            matches!(&third, Err(error @ VulkanError::Unsupported(why)) if error.is_device_limit()
                && why.contains("live sparse buffers hold")),
            "{third:?}"
        );
        drop((first, third));
        SparseBuffer::new(Arc::clone(&context), SparseConfig::new(half)).unwrap();
        drop(second);
    }
    finish(context);
}

#[test]
fn bound_pages_keep_what_is_written_and_a_remapped_page_takes_its_contents_along() {
    let Some(context) = sparse_context() else { return };
    {
        let mut buffer = SparseBuffer::new(Arc::clone(&context), SparseConfig::new(4 * MIB)).unwrap();
        let page = buffer.page_bytes();
        let mut transfer = Transfer::new(Arc::clone(&context), 64 << 10).unwrap();
        buffer.bind(&[(0, 16 * page), (100 * page, 3 * page)]).unwrap();
        buffer.wait_binds().unwrap();
        let data = pattern(1, (16 * page) as usize);
        // SAFETY: the buffer is the test's sparse buffer (transfer usage) on this device; the range is bound, its
        // binds waited for, and inside the buffer; nothing else touches it meanwhile.
        unsafe { transfer.upload(buffer.buffer(), 0, &data) }.unwrap();
        let tail = pattern(2, (3 * page) as usize);
        // SAFETY: the buffer is the test's sparse buffer (transfer usage) on this device; the range is bound, its
        // binds waited for, and inside the buffer; nothing else touches it meanwhile.
        unsafe { transfer.upload(buffer.buffer(), 100 * page, &tail) }.unwrap();
        let mut back = vec![0; data.len()];
        // SAFETY: the buffer is the test's sparse buffer (transfer usage) on this device; the range is bound, its
        // binds waited for, and inside the buffer; nothing else touches it meanwhile.
        unsafe { transfer.download(buffer.buffer(), 0, &mut back) }.unwrap();
        assert!(back == data, "the bound pages read back what was written");

        // Move page 3 to page 200: its bytes follow it.
        let physical = buffer.page_at(3 * page).unwrap();
        buffer.remap(3 * page, 200 * page).unwrap();
        assert_eq!(buffer.page_at(200 * page), Some(physical));
        assert_eq!(buffer.page_at(3 * page), None);
        assert!(buffer.remap(3 * page, 201 * page).is_err(), "page 3 is no longer bound");
        buffer.wait_binds().unwrap();
        let mut moved = vec![0; page as usize];
        // SAFETY: the buffer is the test's sparse buffer (transfer usage) on this device; the range is bound, its
        // binds waited for, and inside the buffer; nothing else touches it meanwhile.
        unsafe { transfer.download(buffer.buffer(), 200 * page, &mut moved) }.unwrap();
        assert!(moved[..] == data[(3 * page) as usize..(4 * page) as usize], "the remapped page kept its contents");
        let mut rest = vec![0; tail.len()];
        // SAFETY: the buffer is the test's sparse buffer (transfer usage) on this device; the range is bound, its
        // binds waited for, and inside the buffer; nothing else touches it meanwhile.
        unsafe { transfer.download(buffer.buffer(), 100 * page, &mut rest) }.unwrap();
        assert!(rest == tail);
    }
    finish(context);
}

#[test]
fn pool_cap_and_mapping_limit_fail_cleanly() {
    let Some(context) = sparse_context() else { return };
    {
        let probe = SparseBuffer::new(Arc::clone(&context), SparseConfig::new(MIB)).unwrap();
        let page = probe.page_bytes();
        drop(probe);
        let mut config = SparseConfig::new(4 * MIB).with_pool_capacity(Some(10 * page));
        // Mappings plus memory chunks: the pool is one chunk of 10 pages.
        config.max_live_mappings = Some(5);
        let mut buffer = SparseBuffer::new(Arc::clone(&context), config).unwrap();
        buffer.bind(&[(0, 8 * page)]).unwrap();
        let error = buffer.bind(&[(20 * page, 3 * page)]).unwrap_err();
        assert!(error.is_out_of_memory(), "{error}");
        assert!(error.to_string().contains("out of device memory"), "{error}");
        assert_eq!(buffer.stats().pages_bound, 8);
        // Five scattered pages fit the pool but not the limit: 5 mappings + 1 chunk > 5.
        buffer.unbind(&[(0, 8 * page)]).unwrap();
        let scattered: Vec<(u64, u64)> = (0..5).map(|index| (2 * index * page, page)).collect();
        let error = buffer.bind(&scattered).unwrap_err();
        assert!(matches!(error, VulkanError::TooManyMappings { needed: 6, limit: 5 }), "{error}");
        assert!(error.to_string().contains("too many sparse mappings"), "{error}");
        assert_eq!(buffer.stats().pages_bound, 0);
        assert_eq!(buffer.pool().used_pages(), 0, "refused pages went back to the pool");
        assert_eq!(buffer.bind(&scattered[..4]).unwrap(), 4);
    }
    finish(context);
}

/// Random allocations and frees through a paged heap over a sparse buffer; every allocation is filled with its
/// own pattern and checked before it is freed (no lost data, no overlap).
#[test]
fn random_traffic_through_a_device_paged_heap_keeps_every_allocation_intact() {
    let Some(context) = sparse_context() else { return };
    {
        let mut heap = DevicePagedHeap::new(Arc::clone(&context), DevicePagedConfig::new(256 * MIB, Some(32 * MIB))).unwrap();
        let page = heap.sparse().page_bytes();
        let mut transfer = Transfer::new(Arc::clone(&context), 256 << 10).unwrap();
        let mut rng = Rng::new(7);
        let mut live: Vec<(heapscope_core::Allocation, u64)> = Vec::new();
        let mut ooms = 0;
        for step in 0..2_000_u64 {
            let free = !live.is_empty() && (live.len() > 60 || rng.range(0, 99) < 45);
            if free {
                let index = rng.range(0, live.len() as u64 - 1) as usize;
                let (allocation, seed) = live.swap_remove(index);
                heap.wait_binds().unwrap();
                let mut back = vec![0; allocation.size_bytes() as usize];
                // SAFETY: the buffer is the test's sparse buffer (transfer usage) on this device; the range is bound, its
                // binds waited for, and inside the buffer; nothing else touches it meanwhile.
                unsafe { transfer.download(heap.buffer(), allocation.offset(), &mut back) }.unwrap();
                assert!(back == pattern(seed, back.len()), "step {step}: allocation at {:#x} lost data", allocation.offset());
                heap.free(allocation).unwrap();
            } else {
                // Mostly small (inside a page or two), sometimes many pages.
                let size = if rng.range(0, 9) == 0 { rng.range(page, 64 * page) } else { rng.range(1, 2 * page) };
                match heap.allocate(Request::new(size, 256).unwrap()) {
                    Ok(allocation) => {
                        heap.wait_binds().unwrap();
                        // SAFETY: the buffer is the test's sparse buffer (transfer usage) on this device; the range is bound, its
                        // binds waited for, and inside the buffer; nothing else touches it meanwhile.
                        unsafe { transfer.upload(heap.buffer(), allocation.offset(), &pattern(step, size as usize)) }.unwrap();
                        live.push((allocation, step));
                    }
                    Err(error) if error.is_out_of_memory() => ooms += 1,
                    Err(error) => panic!("{error}"),
                }
            }
            let stats = heap.stats();
            assert_eq!(stats.sparse.pages_bound * page, stats.heap.mapped_bytes, "step {step}");
        }
        assert_eq!(ooms, 0, "32 MiB is never exhausted by at most 60 live allocations");
        for (allocation, seed) in live.drain(..) {
            let mut back = vec![0; allocation.size_bytes() as usize];
            // SAFETY: the buffer is the test's sparse buffer (transfer usage) on this device; the range is bound, its
            // binds waited for, and inside the buffer; nothing else touches it meanwhile.
            unsafe { transfer.download(heap.buffer(), allocation.offset(), &mut back) }.unwrap();
            assert!(back == pattern(seed, back.len()));
            heap.free(allocation).unwrap();
        }
        let stats = heap.stats();
        assert_eq!(stats.sparse.pages_bound, 0);
        assert_eq!(stats.sparse.live_mappings, 0);
        assert!(stats.sparse.bind_entries > 0 && stats.sparse.batches > 0);
        heap.wait_binds().unwrap();
    }
    finish(context);
}

#[test]
fn the_heap_refuses_past_the_pool_cap_and_stays_consistent() {
    let Some(context) = sparse_context() else { return };
    {
        let mut heap = DevicePagedHeap::new(Arc::clone(&context), DevicePagedConfig::new(64 * MIB, Some(4 * MIB))).unwrap();
        let first = heap.allocate(Request::new(3 * MIB, 256).unwrap()).unwrap();
        let error = heap.allocate(Request::new(2 * MIB, 256).unwrap()).unwrap_err();
        assert!(error.is_out_of_memory(), "{error}");
        assert_eq!(heap.heap().live_allocations(), 1);
        assert_eq!(heap.stats().sparse.pages_bound * heap.sparse().page_bytes(), heap.stats().heap.mapped_bytes);
        let second = heap.allocate(Request::new(MIB, 256).unwrap()).unwrap();
        heap.free(first).unwrap();
        heap.free(second).unwrap();
        assert_eq!(heap.stats().sparse.pages_bound, 0);
        heap.wait_binds().unwrap();
    }
    finish(context);
}

/// frag_oom scaled down 64 times: 20 x 150 MiB allocated and freed, 20 x 100 MiB allocated, then 1 GiB,
/// within 3584 MiB. A heap of blocks fails the last request; paging serves it, since a fragmented virtual range
/// costs nothing.
#[test]
fn frag_oom_scaled_down_succeeds_through_paging() {
    let Some(context) = sparse_context() else { return };
    {
        let scale = 64;
        let capacity = 3584 * MIB / scale;
        let mut heap = DevicePagedHeap::new(Arc::clone(&context), DevicePagedConfig::new(4 * capacity, Some(capacity))).unwrap();
        let big: Vec<_> = (0..20).map(|_| heap.allocate(Request::new(150 * MIB / scale, 512).unwrap()).unwrap()).collect();
        for allocation in big {
            heap.free(allocation).unwrap();
        }
        let medium: Vec<_> = (0..20).map(|_| heap.allocate(Request::new(100 * MIB / scale, 512).unwrap()).unwrap()).collect();
        let last = heap.allocate(Request::new(1024 * MIB / scale, 512).unwrap()).unwrap();
        let stats = heap.stats();
        assert!(stats.heap.mapped_bytes <= capacity);
        assert_eq!(stats.sparse.pages_bound * heap.sparse().page_bytes(), stats.heap.mapped_bytes);
        heap.free(last).unwrap();
        for allocation in medium {
            heap.free(allocation).unwrap();
        }
        heap.wait_binds().unwrap();
    }
    finish(context);
}

#[test]
fn bind_latency_is_measured_for_both_layouts() {
    let Some(context) = sparse_context() else { return };
    for contiguous in [true, false] {
        let latency = measure_bind_latency(&context, 64, contiguous).unwrap();
        assert_eq!(latency.pages, 64);
        assert_eq!(latency.layout, if contiguous { BindLayout::Contiguous } else { BindLayout::Scattered });
        assert!(latency.bind_us > 0.0 && latency.unbind_us > 0.0, "{latency:?}");
        eprintln!("{latency:?}");
    }
    finish(context);
}

/// What binding pages costs: the GPT-2 trace, sizes divided by 16, through a `DevicePagedHeap` (2 GiB virtual,
/// 1 GiB pool cap); binds, entries, pages and the time of each binding call up to its completion. The issue's
/// target is at most 2 us per 4 KiB page bound on lavapipe; the number is printed, not asserted (debug build;
/// `cargo run --release -p heapscope-vulkan --example paged_bind_cost` for the release number).
#[test]
fn gpt2_bind_cost_scaled_down() {
    let Some(context) = sparse_context() else { return };
    let trace = gpt2_trace();
    let cost = replay_bind_cost(&context, &trace, 16, 2 * GIB, GIB);
    eprintln!("gpt2 / 16 through DevicePagedHeap (debug build): {}", cost.summary());
    assert_eq!(cost.events, trace.events().len() as u64);
    assert_eq!(cost.failed, 0, "{}", cost.summary());
    assert!(cost.pages_bound > 0 && cost.pages_bound == cost.pages_unbound, "{}", cost.summary());
    finish(context);
}
