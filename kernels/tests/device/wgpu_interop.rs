//! Vulkan interop: wgpu on heapscope's own device (sparse features enabled), heapscope's device-memory blocks and
//! sparse buffer as wgpu buffers, and the same kernels through wgpu on arena, device-memory and paged
//! allocations. Validation on, heapscope's messenger must stay silent; skipped without Vulkan unless
//! `HEAPSCOPE_REQUIRE_GPU=1`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::common::Rng;
use crate::common::wgpu::{finish, vulkan_device};
use heapscope_core::units::MIB;
use heapscope_core::{Allocation, Heap, HeapConfig, PolicyKind, Request};
use heapscope_kernels::WgpuKernels;
use heapscope_kernels::{KernelRunner, Op, VerifyResult};
use heapscope_vulkan::memory_types::MemoryUsage;
use heapscope_vulkan::{
    ContextOptions, DeviceMemorySource, DevicePagedConfig, DeviceSourceConfig, PytorchDeviceConfig, PytorchDeviceHeap,
    VulkanContext,
};
use heapscope_wgpu::{ArenaConfig, ArenaHeap, DeviceOptions, KernelBuffer, WgpuDevice, WgpuError};

/// A buffer and an offset in it.
type At<'a> = (KernelBuffer<'a>, u64);

fn fill_op(at: At<'_>, len_bytes: u64, id: u32) -> Op<KernelBuffer<'_>> {
    Op::Fill { target: at.0, offset_bytes: at.1, len_bytes, id }
}

fn verify_op(at: At<'_>, len_bytes: u64, id: u32) -> Op<KernelBuffer<'_>> {
    Op::Verify { target: at.0, offset_bytes: at.1, len_bytes, id }
}

fn copy_op<'a>(from: At<'a>, to: At<'a>, len_bytes: u64) -> Op<KernelBuffer<'a>> {
    Op::Copy { src: from.0, src_offset_bytes: from.1, dst: to.0, dst_offset_bytes: to.1, len_bytes }
}

/// The device heapscope brought up for wgpu has the sparse features and wgpu's extensions at once.
#[test]
fn wgpu_runs_on_heapscopes_device_with_sparse_features() {
    let Some(device) = vulkan_device() else { return };
    {
        let context = device.vulkan_context().unwrap();
        assert!(context.is_prepared_for_wgpu());
        let features = context.enabled_features();
        assert!(features.sparse_binding && features.sparse_residency_buffer && features.timeline_semaphore, "{features:?}");
        assert!(device.is_vulkan_interop());
        assert_eq!(device.info().backend, wgpu::Backend::Vulkan);
        assert_eq!(device.info().name, context.properties().name);
        assert!(context.device_extensions().len() >= 2, "wgpu-hal's extensions: {:?}", context.device_extensions());
    }
    finish(device);
}

/// The same kernels, through wgpu, on an arena allocation, an allocation in a `DeviceMemorySource` block and a
/// paged allocation in the sparse buffer: fills, copies across the three, verifies; zero mismatches where the
/// pattern belongs and the expected count where it does not.
#[test]
fn the_same_kernels_run_on_arena_device_memory_and_paged_allocations() {
    let Some(device) = vulkan_device() else { return };
    {
        let context = Arc::clone(device.vulkan_context().unwrap());
        let mut kernels = WgpuKernels::new(Arc::clone(&device)).unwrap();
        let alignment = kernels.binding_limits().offset_alignment_bytes;
        let size = MIB + 4 * 1000;
        let mut arenas = ArenaHeap::new(Arc::clone(&device), ArenaConfig::new(PolicyKind::Tlsf)).unwrap();
        let arena = arenas.allocate(size, alignment, Some("arena")).unwrap();
        let source = DeviceMemorySource::new(Arc::clone(&context), DeviceSourceConfig::new(MemoryUsage::DeviceLocal)).unwrap();
        let mut blocks =
            Heap::new(HeapConfig { block_size_bytes: 16 * MIB, ..HeapConfig::new(PolicyKind::BestFit) }, source).unwrap();
        let _before = blocks.allocate(Request::new(4096 + 12, alignment).unwrap(), None).unwrap();
        let in_block = blocks.allocate(Request::new(size, alignment).unwrap(), None).unwrap();
        let (block, block_offset) =
            blocks.source().locate(in_block.address()).map(|(info, offset)| (info.handle, offset)).unwrap();
        assert!(block_offset > 0, "the allocation is not at the block's start");
        let block_buffer = device.block_buffer(blocks.source(), block).unwrap();
        let mut paged = device.paged_heap(DevicePagedConfig::new(64 * MIB, Some(16 * MIB))).unwrap();
        let _first = paged.allocate(Request::new(3 * 4096 + 8, alignment).unwrap()).unwrap();
        let in_pages = paged.allocate(Request::new(size, alignment).unwrap()).unwrap();

        let a = (arena.kernel_buffer(), arena.offset_bytes());
        let d = (KernelBuffer::new(block_buffer.buffer()), block_offset);
        let p = (KernelBuffer::new(paged.buffer()), in_pages.offset());
        let fill = |at, id| fill_op(at, size, id);
        let verify = |at, id| verify_op(at, size, id);
        let copy = |from, to| copy_op(from, to, size);
        // No host wait for the binds: the first submission waits for them on the device.
        let results = kernels.run(&[fill(a, 1), fill(d, 2), fill(p, 3), verify(a, 1), verify(d, 2), verify(p, 3)]).unwrap();
        assert_eq!(results, [VerifyResult::default(); 3]);
        // Rotate the contents: arena -> device memory -> pages -> arena, through a scratch arena allocation.
        let scratch = arenas.allocate(size, alignment, None).unwrap();
        let s = (scratch.kernel_buffer(), scratch.offset_bytes());
        let results = kernels
            .run(&[copy(a, s), copy(p, a), copy(d, p), copy(s, d), verify(a, 3), verify(d, 1), verify(p, 2), verify(a, 1)])
            .unwrap();
        let words = (size / 4) as u32;
        assert_eq!(&results[..3], &[VerifyResult::default(); 3]);
        assert_eq!(results[3].mismatches, words, "the arena no longer holds id 1's pattern");
        drop(block_buffer);
        drop(paged);
        arenas.free(arena).unwrap();
        arenas.free(scratch).unwrap();
        drop(blocks);
        drop(context);
    }
    finish(device);
}

/// A paged allocation is bound, filled by wgpu and verified without any host wait for the binds; freed (its pages
/// unbound once wgpu's work is done) and its range reused (pages bound again, perhaps to other memory): every
/// live allocation keeps its data through 600 operations.
#[test]
fn paged_allocations_are_bound_before_wgpu_uses_them_and_unbound_after() {
    let Some(device) = vulkan_device() else { return };
    {
        let mut kernels = WgpuKernels::new(Arc::clone(&device)).unwrap();
        let alignment = kernels.binding_limits().offset_alignment_bytes;
        let mut paged = device.paged_heap(DevicePagedConfig::new(256 * MIB, Some(32 * MIB))).unwrap();
        let page = paged.paged().sparse().page_bytes();
        let mut rng = Rng::new(0x5ba5e);
        let mut live: BTreeMap<u32, Allocation> = BTreeMap::new();
        let mut reused_offsets = 0;
        let mut freed_offsets = std::collections::BTreeSet::new();
        for step in 0..600_u32 {
            if !live.is_empty() && (live.len() >= 40 || rng.range(0, 99) < 45) {
                let nth = rng.range(0, live.len() as u64 - 1) as usize;
                let id = *live.keys().nth(nth).unwrap();
                let allocation = live.remove(&id).unwrap();
                freed_offsets.insert(allocation.offset());
                paged.free(allocation).unwrap();
                continue;
            }
            let size = (rng.range(1, 64) * page).min(rng.range(4, 1 << 18) * 4);
            let allocation = paged.allocate(Request::new(size, alignment).unwrap()).unwrap();
            reused_offsets += u32::from(freed_offsets.contains(&allocation.offset()));
            let target = KernelBuffer::new(paged.buffer());
            let (offset_bytes, len_bytes) = (allocation.offset(), allocation.size_bytes().div_ceil(4) * 4);
            let fill = Op::Fill { target, offset_bytes, len_bytes, id: step };
            let verify = Op::Verify { target, offset_bytes, len_bytes, id: step };
            let results = kernels.run(&[fill, verify]).unwrap();
            assert_eq!(results[0], VerifyResult::default(), "step {step}: a fill right after the bind was lost");
            live.insert(step, allocation);
            if step % 50 == 49 {
                let target = KernelBuffer::new(paged.buffer());
                let verifies: Vec<Op<KernelBuffer<'_>>> = live
                    .iter()
                    .map(|(&id, a)| Op::Verify {
                        target,
                        offset_bytes: a.offset(),
                        len_bytes: a.size_bytes().div_ceil(4) * 4,
                        id,
                    })
                    .collect();
                let results = kernels.run(&verifies).unwrap();
                assert!(results.iter().all(VerifyResult::is_clean), "step {step}: {results:?}");
            }
        }
        let stats = paged.paged().stats();
        assert!(stats.heap.pages_unmapped > 100 && stats.sparse.batches > 300, "{stats:?}");
        assert!(reused_offsets > 10, "ranges were reused after unbinding: {reused_offsets}");
        for allocation in std::mem::take(&mut live).into_values() {
            paged.free(allocation).unwrap();
        }
        assert_eq!(paged.paged().stats().sparse.pages_bound, 0, "every page unbound");
    }
    finish(device);
}

/// Interop refuses what it cannot do safely: a context made without wgpu's extensions, a block or a PyTorch heap
/// of another context, a released segment, a plain wgpu device asked for Vulkan buffers.
#[test]
fn interop_refuses_what_it_cannot_do() {
    let Some(device) = vulkan_device() else { return };
    {
        let plain = VulkanContext::new(&ContextOptions::from_env().with_validation(true)).unwrap();
        let log = plain.validation_log();
        let plain = Arc::new(plain);
        let error = WgpuDevice::from_vulkan_context(Arc::clone(&plain)).unwrap_err();
        assert!(error.to_string().contains("not created for wgpu"), "{error}");
        let mut foreign = DeviceMemorySource::new(Arc::clone(&plain), DeviceSourceConfig::new(MemoryUsage::DeviceLocal)).unwrap();
        let block = heapscope_core::MemorySource::allocate_block(&mut foreign, 1 << 20).unwrap();
        let error = device.block_buffer(&foreign, block.handle).unwrap_err();
        assert!(error.to_string().contains("another context"), "{error}");
        heapscope_core::MemorySource::free_block(&mut foreign, block);
        // A PyTorch heap of another context, and an allocation whose segment is gone.
        let conf = heapscope_pytorch::AllocConf::default();
        let mut foreign_pytorch =
            PytorchDeviceHeap::new(Arc::clone(&plain), PytorchDeviceConfig::new(conf.clone(), None)).unwrap();
        let allocation = foreign_pytorch.allocate(MIB).unwrap();
        let error = device.segment_buffer(&foreign_pytorch, &allocation).unwrap_err();
        assert!(error.to_string().contains("another context"), "{error}");
        foreign_pytorch.free(allocation).unwrap();
        drop(foreign_pytorch);
        let context = Arc::clone(device.vulkan_context().unwrap());
        let mut pytorch = PytorchDeviceHeap::new(context, PytorchDeviceConfig::new(conf, None)).unwrap();
        let allocation = pytorch.allocate(MIB).unwrap();
        assert!(device.segment_buffer(&pytorch, &allocation).unwrap().buffer().size() >= MIB);
        pytorch.free(allocation).unwrap();
        pytorch.empty_cache().unwrap();
        let error = device.segment_buffer(&pytorch, &allocation).unwrap_err();
        assert!(error.to_string().contains("no segment"), "{error}");
        drop(pytorch);
        drop(foreign);
        drop(plain);
        assert!(log.messages().is_empty(), "{:?}", log.messages());
    }
    if let Some(plain) = crate::common::wgpu::device() {
        let error = plain.paged_heap(DevicePagedConfig::new(16 * MIB, None)).unwrap_err();
        assert!(matches!(error, WgpuError::Vulkan(_)) && error.to_string().contains("from_vulkan"), "{error}");
        finish(plain);
    }
    finish(device);
}

/// `from_vulkan_adapter` opens heapscope's Vulkan device for the very adapter plain wgpu would open.
#[test]
fn the_interop_device_is_the_adapter_wgpu_selects() {
    heapscope_vulkan::testing::validation_turn();
    let options = DeviceOptions { validation: true, ..DeviceOptions::from_env() };
    let selected = match WgpuDevice::selected_adapter(&options) {
        Ok(selected) => selected,
        Err(error) if error.means_no_device() && !crate::common::wgpu::required() => return,
        Err(error) => panic!("{error}"),
    };
    if selected.backend != wgpu::Backend::Vulkan {
        let error = WgpuDevice::from_vulkan_adapter(&options).unwrap_err();
        assert!(matches!(error, WgpuError::Unsupported(_)), "{error}");
        return;
    }
    let device = Arc::new(WgpuDevice::from_vulkan_adapter(&options).unwrap());
    {
        assert!(device.is_vulkan_interop());
        let info = device.info();
        assert_eq!((info.name.as_str(), info.vendor, info.backend), (selected.name.as_str(), selected.vendor, selected.backend));
        assert!(device.vulkan_context().unwrap().validation_enabled());
    }
    finish(device);
}

/// What egui-wgpu does — `wgpu::Queue::submit` called directly, with no heapscope lock — on one thread, while
/// heapscope binds and unbinds sparse pages on the same `VkQueue` (lavapipe has one) on another: every wgpu queue
/// operation passes through heapscope's queue lock, so the validation layer's thread-safety checks stay silent.
#[test]
fn wgpus_own_submits_and_heapscopes_binds_share_the_queue() {
    let Some(device) = vulkan_device() else { return };
    {
        let mut paged = device.paged_heap(DevicePagedConfig::new(64 * MIB, Some(16 * MIB))).unwrap();
        let page = paged.paged().sparse().page_bytes();
        let scratch = device.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("scratch"),
            size: 4096,
            usage: wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        std::thread::scope(|scope| {
            let wgpu_side = scope.spawn(|| {
                for step in 0..3000_u32 {
                    device.queue().write_buffer(&scratch, 0, &step.to_le_bytes());
                    let encoder = device.device().create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
                    device.queue().submit([encoder.finish()]);
                }
                device.device().poll(wgpu::PollType::wait_indefinitely()).unwrap();
            });
            let mut binds = 0_u32;
            while !wgpu_side.is_finished() {
                let allocation = paged.allocate(Request::new(page * 3, page).unwrap()).unwrap();
                paged.free(allocation).unwrap();
                binds += 1;
            }
            assert!(binds > 10, "only {binds} bind/unbind pairs overlapped wgpu's submits");
        });
    }
    finish(device);
}
