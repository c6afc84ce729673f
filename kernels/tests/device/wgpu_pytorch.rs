//! `PytorchHeap`: PyTorch's caching allocator with a `wgpu::Buffer` per segment — segments as PyTorch sizes them,
//! buffers as large as the segments, allocations filled and verified in them, the cache released, a segment wgpu
//! cannot make undone into an exhaustion verdict, expandable segments refused. On plain wgpu and on wgpu over
//! heapscope's Vulkan device, validation on (skipped without a device unless `HEAPSCOPE_REQUIRE_GPU=1`).
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::sync::Arc;

use crate::common::wgpu::{devices, finish};
use heapscope_core::OomCause;
use heapscope_core::units::MIB;
use heapscope_kernels::KernelRunner;
use heapscope_kernels::WgpuKernels;
use heapscope_pytorch::AllocConf;
use heapscope_wgpu::{KernelBuffer, PytorchHeap, WgpuError};

#[test]
fn segments_are_buffers_sized_as_pytorch_sizes_them() {
    for (route, device) in devices() {
        {
            let mut heap = PytorchHeap::new(Arc::clone(&device), AllocConf::default(), None).unwrap();
            let mut kernels = WgpuKernels::new(Arc::clone(&device)).unwrap();
            // Small requests share a 2 MiB segment; 1–10 MiB ones a 20 MiB segment (PyTorch's sizes).
            let small = [heap.allocate(4096).unwrap(), heap.allocate(100_000).unwrap()];
            let large = heap.allocate(3 * MIB).unwrap();
            assert_eq!(small[0].segment_base(), small[1].segment_base(), "{route}");
            assert_eq!(heap.live_segments(), 2, "{route}");
            assert_eq!(heap.device_bytes(), 22 * MIB, "{route}");
            assert_eq!(heap.device_bytes(), heap.caching().allocator().reserved_bytes(), "{route}");
            assert_eq!(heap.segment(&small[0]).unwrap().size(), 2 * MIB, "{route}");
            assert_eq!(heap.segment(&large).unwrap().size(), 20 * MIB, "{route}");
            let at = |allocation: &heapscope_pytorch::CachingAllocation| {
                (KernelBuffer::new(heap.segment(allocation).unwrap()), allocation.offset(), allocation.size_bytes())
            };
            let ops: Vec<_> = [small[0], small[1], large]
                .iter()
                .zip(1..)
                .flat_map(|(allocation, id)| {
                    let (buffer, offset_bytes, len_bytes) = at(allocation);
                    [
                        heapscope_kernels::Op::Fill { target: buffer, offset_bytes, len_bytes, id },
                        heapscope_kernels::Op::Verify { target: buffer, offset_bytes, len_bytes, id },
                    ]
                })
                .collect();
            let results = kernels.run(&ops).unwrap();
            assert!(results.iter().all(heapscope_kernels::VerifyResult::is_clean), "{route}: {results:?}");
            // Freed blocks stay cached; empty_cache destroys the buffers.
            for allocation in small.into_iter().chain([large]) {
                heap.free(allocation).unwrap();
            }
            assert_eq!(heap.device_bytes(), 22 * MIB, "{route}: cached");
            heap.empty_cache().unwrap();
            assert_eq!((heap.live_segments(), heap.device_bytes()), (0, 0), "{route}");
            let error = heap.free(large).unwrap_err();
            assert!(matches!(error, WgpuError::Heap(heapscope_core::Error::DoubleFree { .. })), "{route}: {error}");
        }
        finish(device);
    }
}

/// A segment wgpu cannot make (larger than `max_buffer_size`, below the allocator's capacity) is undone and refused
/// as exhaustion, and the heap goes on; expandable segments are refused with the reason.
#[test]
fn what_wgpu_refuses_is_undone_and_expandable_segments_are_refused() {
    for (route, device) in devices() {
        {
            let expandable = AllocConf { expandable_segments: true, ..AllocConf::default() };
            let error = PytorchHeap::new(Arc::clone(&device), expandable, None).unwrap_err();
            assert!(matches!(&error, WgpuError::Unsupported(why) if why.contains("sparse binding")), "{route}: {error}");

            let mut heap = PytorchHeap::new(Arc::clone(&device), AllocConf::default(), None).unwrap();
            let kept = heap.allocate(MIB).unwrap();
            let too_large = device.limits().max_buffer_size.saturating_add(1);
            let error = heap.allocate(too_large).unwrap_err();
            assert!(error.is_out_of_memory(), "{route}: {error}");
            let WgpuError::Heap(heapscope_core::Error::OutOfMemory(verdict)) = &error else { panic!("{error}") };
            assert_eq!((verdict.cause, verdict.requested_bytes), (OomCause::Exhaustion, too_large), "{route}");
            assert_eq!(heap.device_refusals(), 1, "{route}");
            assert_eq!(heap.device_bytes(), heap.caching().allocator().reserved_bytes(), "{route}: the refused segment is gone");
            let again = heap.allocate(MIB).unwrap();
            heap.free(kept).unwrap();
            heap.free(again).unwrap();
        }
        finish(device);
    }
}
