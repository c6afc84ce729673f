//! PyTorch's caching allocator on the device (`PytorchDeviceHeap`), validation on: segments are real blocks the
//! kernels fill and verify, out of memory is PyTorch's verdict, the device refusing is undone cleanly, segments go
//! back to the device, and expandable segments map pages of sparse buffers. `SegmentMemory` under the core's
//! emulation stops the replay at the first refusal, its typed error kept.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::sync::Arc;

use crate::common::{Rng, finish};
use heapscope_core::units::{KIB, MIB};
use heapscope_core::{Error, OomCause};
use heapscope_kernels::VulkanKernels;
use heapscope_kernels::{KernelRunner, Op};
use heapscope_pytorch::{AllocConf, CachingAllocation};
use heapscope_vulkan::{PytorchDeviceConfig, PytorchDeviceHeap, SegmentMemory, VulkanError};

fn conf(expandable: bool) -> AllocConf {
    AllocConf { expandable_segments: expandable, ..AllocConf::default() }
}

/// Fills each allocation with its pattern, then verifies all of them; returns the mismatches.
fn fill_and_verify(kernels: &mut VulkanKernels, heap: &PytorchDeviceHeap, live: &[(CachingAllocation, u32)]) -> u64 {
    heap.wait_binds().unwrap();
    let targets: Vec<_> = live
        .iter()
        .map(|(allocation, id)| (heap.compute_target(allocation).unwrap(), allocation.size_bytes() / 4 * 4, *id))
        .collect();
    let fills: Vec<_> = targets
        .iter()
        .map(|&((buffer, offset), len, id)| Op::Fill { target: buffer, offset_bytes: offset, len_bytes: len, id })
        .collect();
    let verifies: Vec<_> = targets
        .iter()
        .map(|&((buffer, offset), len, id)| Op::Verify { target: buffer, offset_bytes: offset, len_bytes: len, id })
        .collect();
    kernels.run(&fills).unwrap();
    kernels.run(&verifies).unwrap().iter().map(|result| u64::from(result.mismatches)).sum()
}

/// Random allocations across both pools (512 B to 12 MiB), every live one filled and verified after each round of
/// allocations and frees; the blocks behind them are exactly the allocator's segments; when all is freed and the
/// cache emptied, no device memory is left.
#[test]
fn segments_are_device_blocks_the_kernels_verify() {
    let Some(context) = crate::common::context().map(Arc::new) else { return };
    {
        let mut kernels = VulkanKernels::new(Arc::clone(&context)).unwrap();
        let mut heap = PytorchDeviceHeap::new(Arc::clone(&context), PytorchDeviceConfig::new(conf(false), None)).unwrap();
        let baseline = context.live_allocation_count();
        let mut rng = Rng::new(0x70c4);
        let mut live: Vec<(CachingAllocation, u32)> = Vec::new();
        let mut next_id = 1;
        for round in 0..8 {
            for _ in 0..40 {
                if !live.is_empty() && rng.range(0, 99) < 40 {
                    let (allocation, _) = live.swap_remove(rng.range(0, live.len() as u64 - 1) as usize);
                    heap.free(allocation).unwrap();
                } else {
                    let exponent = rng.range(9, 23);
                    let size = rng.range(1 << exponent, 3 << exponent).min(12 * MIB);
                    live.push((heap.allocate(size).unwrap(), next_id));
                    next_id += 1;
                }
            }
            assert_eq!(fill_and_verify(&mut kernels, &heap, &live), 0, "round {round}");
            let stats = heap.caching().allocator().stats();
            let (blocks, expandable) = heap.live_segments();
            assert_eq!(blocks as i64, stats.segment.all().current, "round {round}");
            assert_eq!(expandable, 0);
            assert!(heap.device_bytes() >= heap.caching().allocator().reserved_bytes(), "round {round}");
        }
        for (allocation, _) in live.drain(..) {
            heap.free(allocation).unwrap();
        }
        assert!(heap.live_segments().0 > 0, "freed blocks stay cached");
        heap.empty_cache().unwrap();
        assert_eq!((heap.live_segments(), heap.device_bytes()), ((0, 0), 0));
        assert_eq!(context.live_allocation_count(), baseline, "every segment's memory went back to the device");
        drop((kernels, heap));
    }
    finish(context);
}

/// The fragmentation pattern at small scale under a 40 MiB capacity: three 12 MiB segments cached, 8 MiB live in
/// each, a 12 MiB request is refused with PyTorch's numbers as a fragmentation verdict; the device holds no more
/// than the capacity.
#[test]
fn out_of_memory_is_pytorchs_verdict() {
    let Some(context) = crate::common::context().map(Arc::new) else { return };
    {
        let mut heap =
            PytorchDeviceHeap::new(Arc::clone(&context), PytorchDeviceConfig::new(conf(false), Some(40 * MIB))).unwrap();
        let big: Vec<_> = (0..3).map(|_| heap.allocate(12 * MIB).unwrap()).collect();
        for allocation in big {
            heap.free(allocation).unwrap();
        }
        let medium: Vec<_> = (0..3).map(|_| heap.allocate(8 * MIB).unwrap()).collect();
        let error = heap.allocate(12 * MIB).unwrap_err();
        assert!(error.is_out_of_memory(), "{error}");
        let VulkanError::Heap(Error::OutOfMemory(verdict)) = error else { panic!("{error}") };
        assert_eq!((verdict.policy, verdict.cause), ("pytorch", OomCause::Fragmentation), "{verdict}");
        assert_eq!(
            (verdict.reserved_bytes, verdict.free_in_blocks_bytes, verdict.largest_free_run_bytes),
            (36 * MIB, 12 * MIB, 4 * MIB)
        );
        assert_eq!(heap.device_bytes(), 36 * MIB);
        assert_eq!(heap.device_refusals(), 0, "the allocator refused, not the device");
        for allocation in medium {
            heap.free(allocation).unwrap();
        }
        drop(heap);
    }
    finish(context);
}

/// The device refusing below the allocator's capacity (a 30 MiB device cap, no capacity): the request is undone
/// (the cache emptied) and refused as exhaustion; what is live stays intact and the heap keeps serving.
#[test]
fn a_device_refusal_is_undone() {
    let Some(context) = crate::common::context().map(Arc::new) else { return };
    {
        let mut kernels = VulkanKernels::new(Arc::clone(&context)).unwrap();
        let config = PytorchDeviceConfig { device_cap_bytes: Some(30 * MIB), ..PytorchDeviceConfig::new(conf(false), None) };
        let mut heap = PytorchDeviceHeap::new(Arc::clone(&context), config).unwrap();
        let first = heap.allocate(12 * MIB).unwrap();
        let spare = heap.allocate(12 * MIB).unwrap();
        heap.free(spare).unwrap();
        let live = vec![(first, 1), (heap.allocate(6 * MIB).unwrap(), 2)];
        assert_eq!(fill_and_verify(&mut kernels, &heap, &live), 0);
        let error = heap.allocate(12 * MIB).unwrap_err();
        let VulkanError::Heap(Error::OutOfMemory(verdict)) = error else { panic!("{error}") };
        assert_eq!((verdict.cause, verdict.unreserved_bytes), (OomCause::Exhaustion, 0), "{verdict}");
        assert_eq!(heap.device_refusals(), 1);
        // The cached 12 MiB segment went back to the device; the live allocations are untouched.
        let verifies: Vec<_> = live
            .iter()
            .map(|(allocation, id)| {
                let (buffer, offset) = heap.compute_target(allocation).unwrap();
                Op::Verify { target: buffer, offset_bytes: offset, len_bytes: allocation.size_bytes(), id: *id }
            })
            .collect();
        assert!(kernels.run(&verifies).unwrap().iter().all(heapscope_kernels::VerifyResult::is_clean));
        let small = heap.allocate(256 * KIB).unwrap();
        for (allocation, _) in live {
            heap.free(allocation).unwrap();
        }
        heap.free(small).unwrap();
        heap.empty_cache().unwrap();
        assert_eq!(heap.device_bytes(), 0);
        drop((kernels, heap));
    }
    finish(context);
}

/// Expandable segments on sparse buffers: the fragmentation pattern (under 64 MiB) is served (pages mapped where the request
/// needs them), every allocation filled and verified on the sparse buffers; emptying the cache unbinds every page
/// and drops the buffers.
#[test]
fn expandable_segments_map_pages_of_sparse_buffers() {
    let Some(context) = crate::common::sparse_context() else { return };
    {
        let mut kernels = VulkanKernels::new(Arc::clone(&context)).unwrap();
        let mut heap =
            PytorchDeviceHeap::new(Arc::clone(&context), PytorchDeviceConfig::new(conf(true), Some(64 * MIB))).unwrap();
        let big: Vec<_> = (0..3).map(|_| heap.allocate(12 * MIB).unwrap()).collect();
        for allocation in big {
            heap.free(allocation).unwrap();
        }
        let mut live: Vec<(CachingAllocation, u32)> = (0..3).map(|index| (heap.allocate(8 * MIB).unwrap(), index)).collect();
        live.push((heap.allocate(12 * MIB).unwrap(), 3));
        // Small-pool allocations map 2 MiB pages of a second segment.
        live.extend((4..20).map(|index| (heap.allocate(100 * KIB).unwrap(), index)));
        assert_eq!(heap.live_segments(), (0, 2));
        assert_eq!(heap.device_bytes(), heap.caching().allocator().reserved_bytes());
        // Two 20 MiB pages of the large pool's segment, one 2 MiB page of the small pool's.
        assert_eq!(heap.caching().allocator().reserved_bytes(), 42 * MIB);
        assert_eq!(fill_and_verify(&mut kernels, &heap, &live), 0);
        for (allocation, _) in live.drain(..) {
            heap.free(allocation).unwrap();
        }
        heap.empty_cache().unwrap();
        assert_eq!((heap.live_segments(), heap.device_bytes()), ((0, 0), 0));
        heap.wait_binds().unwrap();
        drop((kernels, heap));
    }
    finish(context);
}

/// Under the core's emulation nothing can be undone: with the device capped at 100 MiB below the allocator's
/// 448 MiB, the sixth 20 MiB segment is refused and the replay stops at its event, the typed refusal kept and
/// the five segments before it on the device.
#[test]
fn segment_memory_under_the_emulation_stops_at_the_first_refusal() {
    let Some(context) = crate::common::context() else { return };
    let context = Arc::new(context);
    {
        let mut builder = heapscope_core::TraceBuilder::new("20 MiB segments");
        for id in 0..10 {
            builder.alloc(id, 19 * MIB).unwrap();
        }
        let recording = heapscope_lab::recording::Recording::from_trace(builder.finish());
        let mut config = PytorchDeviceConfig::new(conf(false), Some(448 * MIB));
        config.device_cap_bytes = Some(100 * MIB);
        let mut memory = SegmentMemory::new(Arc::clone(&context), &config).unwrap();
        let error =
            heapscope_lab::compare::emulate_pytorch(&recording, &config.conf, config.capacity_bytes, &mut memory).unwrap_err();
        assert!(error.to_string().contains("entry 5: out of device memory"), "{error}");
        let refused = memory.take_error().unwrap();
        assert!(refused.is_out_of_memory(), "{refused}");
        let counts = memory.counts();
        assert_eq!((counts.device_allocs, counts.device_frees, counts.peak_device_bytes), (5, 0, 100 * MIB), "{counts:?}");
        assert_eq!(memory.live_segments(), (5, 0));
    }
    finish(context);
}
