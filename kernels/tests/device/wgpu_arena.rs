//! Arenas on a device: every policy under random traffic verified by the kernels, the binding and alignment
//! rules, the release of arenas, and wgpu errors surfacing as test failures. Each test runs on plain wgpu and on
//! wgpu over heapscope's Vulkan device, validation on (skipped without a device unless `HEAPSCOPE_REQUIRE_GPU=1`).
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::common::Rng;
use crate::common::wgpu::{devices, finish};
use heapscope_core::units::MIB;
use heapscope_core::{HeapConfig, PolicyKind, ReleaseRule};
use heapscope_kernels::{ArenaOps, WgpuKernelError, WgpuKernels};
use heapscope_kernels::{KernelRunner, Op, VerifyResult};
use heapscope_wgpu::{ArenaAllocation, ArenaConfig, ArenaHeap, KernelBuffer, WgpuDevice, WgpuError};

/// Small arenas, so that traffic makes and releases many of them.
fn config(policy: PolicyKind, release: ReleaseRule) -> ArenaConfig {
    let heap = HeapConfig { block_size_bytes: 4 * MIB, dedicated_threshold_bytes: 2 * MIB, release, ..HeapConfig::new(policy) };
    ArenaConfig { heap, ..ArenaConfig::new(policy) }
}

/// What every allocation must satisfy: aligned as asked and to the storage offset alignment, inside its arena,
/// bindable whole.
fn check_placement(heap: &ArenaHeap, allocation: &ArenaAllocation, align: u64) {
    let offset = allocation.offset_bytes();
    assert_eq!(offset % align, 0, "offset {offset} not aligned to {align}");
    assert_eq!(offset % heap.offset_alignment_bytes(), 0, "offset {offset} not a storage offset");
    assert!(allocation.binding_bytes() <= heap.binding_limit_bytes());
    assert!(allocation.binding_bytes() >= allocation.size_bytes() && allocation.binding_bytes().is_multiple_of(4));
    assert!(offset + allocation.binding_bytes() <= allocation.buffer().size(), "past the end of its arena");
    let binding = allocation.binding();
    assert_eq!((binding.offset, binding.size.map(u64::from)), (offset, Some(allocation.binding_bytes())));
}

/// Random allocations and frees through `policy`; new allocations filled with their id's pattern, every live one
/// verified after each batch. Returns (allocations made, bytes verified).
fn random_traffic(device: &Arc<WgpuDevice>, policy: PolicyKind, seed: u64, batches: u32) -> (u64, u64) {
    let mut kernels = WgpuKernels::new(Arc::clone(device)).unwrap();
    let mut heap = ArenaHeap::new(Arc::clone(device), config(policy, ReleaseRule::KeepOne)).unwrap();
    let mut rng = Rng::new(seed);
    let mut live: BTreeMap<u32, ArenaAllocation> = BTreeMap::new();
    let (mut next_id, mut made, mut verified) = (0_u32, 0_u64, 0_u64);
    for _ in 0..batches {
        let mut fresh = Vec::new();
        for _ in 0..40 {
            if !live.is_empty() && (live.len() >= 60 || rng.range(0, 99) < 40) {
                let nth = rng.range(0, live.len() as u64 - 1) as usize;
                let id = *live.keys().nth(nth).unwrap();
                let allocation = live.remove(&id).unwrap();
                fresh.retain(|&fresh_id| fresh_id != id);
                heap.free(allocation).unwrap();
            } else {
                // 4 B .. 3 MiB, log-uniform (some above the dedicated threshold), any size (not only words).
                let size = 1_u64 << rng.range(2, 21);
                let size = (size + rng.range(0, size)).min(3 * MIB);
                let align = 1_u64 << rng.range(0, 12);
                let allocation = heap.allocate(size, align, Some("traffic")).unwrap_or_else(|error| panic!("{policy}: {error}"));
                check_placement(&heap, &allocation, align);
                live.insert(next_id, allocation);
                fresh.push(next_id);
                next_id += 1;
                made += 1;
            }
        }
        let fills: Vec<Op<KernelBuffer<'_>>> = fresh.iter().map(|id| live[id].fill(*id)).collect();
        kernels.run(&fills).unwrap();
        let verifies: Vec<Op<KernelBuffer<'_>>> = live.iter().map(|(id, allocation)| allocation.verify(*id)).collect();
        let results = kernels.run(&verifies).unwrap();
        for ((id, allocation), result) in live.iter().zip(&results) {
            assert_eq!(
                *result,
                VerifyResult::default(),
                "{policy}: allocation {id} at {:#x} lost its data",
                allocation.address()
            );
            verified += allocation.binding_bytes();
        }
    }
    // Live allocations never overlap within an arena.
    let mut ranges: Vec<(u64, u64)> = live.values().map(|a| (a.address(), a.address() + a.binding_bytes())).collect();
    ranges.sort_unstable();
    assert!(ranges.windows(2).all(|pair| pair[0].1 <= pair[1].0), "{policy}: overlapping allocations");
    for allocation in std::mem::take(&mut live).into_values() {
        heap.free(allocation).unwrap();
    }
    heap.release_empty_arenas();
    assert_eq!((heap.live_arenas(), heap.stats().reserved_bytes), (0, 0), "{policy}: arenas left");
    let (created, destroyed) = heap.heap().source().arena_counts();
    assert_eq!(created, destroyed);
    assert!(created >= 2, "{policy}: the traffic should need several arenas, got {created}");
    (made, verified)
}

/// Every core policy inside wgpu arenas, random traffic with fill and verify: no mismatch, every placement
/// aligned and bindable, every arena released at the end.
#[test]
fn every_policy_serves_random_traffic_in_arenas() {
    for (route, device) in devices() {
        let started = std::time::Instant::now();
        let mut totals = (0, 0);
        for (index, policy) in PolicyKind::ALL.into_iter().enumerate() {
            let (made, verified) = random_traffic(&device, policy, 0x5eed + index as u64, 12);
            totals = (totals.0 + made, totals.1 + verified);
        }
        eprintln!(
            "{route}: {} allocations, {:.1} MiB verified, {:.2} s",
            totals.0,
            totals.1 as f64 / MIB as f64,
            started.elapsed().as_secs_f64()
        );
        finish(device);
    }
}

/// A binding cap of 64 KiB: allocations above it are refused with a clear error, at it they work; the kernels
/// split ranges at an even smaller cap and still fill and verify like one range.
#[test]
fn a_small_binding_limit_is_respected() {
    for (_, device) in devices() {
        {
            let mut heap = ArenaHeap::new(
                Arc::clone(&device),
                ArenaConfig { max_binding_bytes: Some(64 << 10), ..config(PolicyKind::Tlsf, ReleaseRule::Immediately) },
            )
            .unwrap();
            assert_eq!(heap.binding_limit_bytes(), 64 << 10);
            let refused = heap.allocate((64 << 10) + 1, 4, None).unwrap_err();
            assert!(matches!(refused, WgpuError::TooLargeToBind { size_bytes: 65_537, limit_bytes: 65_536, .. }), "{refused}");
            assert!(refused.to_string().contains("65537 B cannot be bound whole"), "{refused}");
            assert_eq!(heap.stats().ooms, 1, "a refusal counts among the heap's failures");
            let full = heap.allocate(64 << 10, 4, None).unwrap();
            let odd = heap.allocate(1001, 1, None).unwrap();
            assert_eq!(odd.binding_bytes(), 1004);
            let mut kernels = WgpuKernels::new(Arc::clone(&device)).unwrap();
            kernels.set_max_binding_bytes(4096);
            assert_eq!(kernels.binding_limits().max_range_bytes, 4096);
            kernels.run(&[full.fill(7), odd.fill(8)]).unwrap();
            let results = kernels.run(&[full.verify(7), odd.verify(8), full.verify(8)]).unwrap();
            assert_eq!(&results[..2], &[VerifyResult::default(); 2]);
            assert_eq!(results[2].mismatches, 16_384, "another id's pattern differs in every word");
            let (submits, dispatches) = kernels.counts();
            assert!(dispatches >= 2 * 16 + 2, "64 KiB in 4 KiB bindings: {dispatches} dispatches in {submits} submits");
            heap.free(full).unwrap();
            heap.free(odd).unwrap();
            assert_eq!(heap.live_arenas(), 0);
        }
        finish(device);
    }
}

/// Requests no binding can cover, or that are invalid, fail with errors that say why; nothing panics.
#[test]
fn bad_requests_are_refused_clearly() {
    for (_, device) in devices() {
        {
            let limit = device.limits().max_storage_buffer_binding_size;
            let mut heap = ArenaHeap::new(Arc::clone(&device), ArenaConfig::new(PolicyKind::Tlsf)).unwrap();
            let error = heap.allocate(limit + 4, 4, None).unwrap_err();
            assert!(matches!(error, WgpuError::TooLargeToBind { .. }), "{error}");
            assert!(error.to_string().contains("max_storage_buffer_binding_size"), "{error}");
            let zero = heap.allocate(0, 4, None).unwrap_err();
            assert!(zero.to_string().contains("size_bytes is 0"), "{zero}");
            let align = heap.allocate(64, 48, None).unwrap_err();
            assert!(align.to_string().contains("not a power of two"), "{align}");
            let budget =
                HeapConfig { capacity_bytes: Some(8 * MIB), block_size_bytes: 4 * MIB, ..HeapConfig::new(PolicyKind::Tlsf) };
            let mut capped =
                ArenaHeap::new(Arc::clone(&device), ArenaConfig { heap: budget, ..ArenaConfig::new(PolicyKind::Tlsf) }).unwrap();
            let first = capped.allocate(3 * MIB, 256, None).unwrap();
            let second = capped.allocate(3 * MIB, 256, None).unwrap();
            let oom = capped.allocate(3 * MIB, 256, None).unwrap_err();
            assert!(oom.is_out_of_memory(), "{oom}");
            assert!(oom.to_string().contains("out of memory"), "{oom}");
            let zero_cap = ArenaHeap::new(
                Arc::clone(&device),
                ArenaConfig { max_binding_bytes: Some(3), ..ArenaConfig::new(PolicyKind::Tlsf) },
            );
            assert!(matches!(zero_cap, Err(WgpuError::InvalidConfig(_))));
            for allocation in [first, second] {
                capped.free(allocation).unwrap();
            }
        }
        finish(device);
    }
}

/// Arenas grow with demand and go back by the heap's release rule; a released arena is destroyed, so a kernel
/// given a stale clone of it fails with wgpu's error instead of touching freed memory.
#[test]
fn arenas_grow_and_are_released() {
    for (_, device) in devices() {
        {
            let mut heap = ArenaHeap::new(Arc::clone(&device), config(PolicyKind::BestFit, ReleaseRule::Immediately)).unwrap();
            let allocations: Vec<ArenaAllocation> = (0..10).map(|_| heap.allocate(MIB + 512, 256, None).unwrap()).collect();
            let arenas = heap.live_arenas();
            assert!(arenas >= 4, "10 x 1 MiB in 4 MiB arenas: {arenas} arenas");
            assert!(heap.report().blocks.iter().all(|block| block.size_bytes == 4 * MIB));
            let stale = allocations[0].buffer().clone();
            let big = heap.allocate(3 * MIB, 256, None).unwrap();
            assert!(heap.report().blocks.iter().any(|block| block.dedicated), "a request above 2 MiB gets its own arena");
            heap.free(big).unwrap();
            assert_eq!(heap.live_arenas(), arenas, "the dedicated arena went at once");
            for allocation in allocations {
                heap.free(allocation).unwrap();
            }
            assert_eq!(heap.live_arenas(), 0);
            assert_eq!(heap.stats().blocks_released, heap.stats().blocks_reserved);
            let mut kernels = WgpuKernels::new(Arc::clone(&device)).unwrap();
            let error = kernels.fill(KernelBuffer::new(&stale), 0, 256, 1).unwrap_err();
            assert!(matches!(error, WgpuKernelError::Wgpu(WgpuError::Device { .. })), "{error}");
            assert!(error.to_string().to_lowercase().contains("destroyed"), "{error}");
        }
        finish(device);
    }
}

/// The kernels see what is really there: one word changed behind their back is reported exactly, and travels
/// with copies between arenas and within one.
#[test]
fn kernels_find_a_corrupted_word_and_copy_it_along() {
    for (_, device) in devices() {
        {
            let mut heap = ArenaHeap::new(Arc::clone(&device), config(PolicyKind::Tlsf, ReleaseRule::Immediately)).unwrap();
            let mut kernels = WgpuKernels::new(Arc::clone(&device)).unwrap();
            let a = heap.allocate(3 * MIB, 256, None).unwrap();
            let b = heap.allocate(3 * MIB, 256, None).unwrap();
            assert_ne!(a.buffer(), b.buffer(), "two dedicated arenas");
            kernels.run(&[a.fill(3), b.fill(4)]).unwrap();
            device.queue().write_buffer(a.buffer(), a.offset_bytes() + 4 * 1000, &0xdead_beef_u32.to_le_bytes());
            let corrupted = VerifyResult { mismatches: 1, first_mismatch: Some(1000) };
            assert_eq!(kernels.verify(a.kernel_buffer(), a.offset_bytes(), a.binding_bytes(), 3).unwrap(), corrupted);
            let between = Op::Copy {
                src: a.kernel_buffer(),
                src_offset_bytes: a.offset_bytes(),
                dst: b.kernel_buffer(),
                dst_offset_bytes: b.offset_bytes() + 256,
                len_bytes: MIB,
            };
            let within = Op::Copy {
                src: a.kernel_buffer(),
                src_offset_bytes: a.offset_bytes(),
                dst: a.kernel_buffer(),
                dst_offset_bytes: a.offset_bytes() + 2 * MIB,
                len_bytes: MIB / 2,
            };
            let verify_b = Op::Verify { target: b.kernel_buffer(), offset_bytes: b.offset_bytes() + 256, len_bytes: MIB, id: 3 };
            let verify_a =
                Op::Verify { target: a.kernel_buffer(), offset_bytes: a.offset_bytes() + 2 * MIB, len_bytes: MIB / 2, id: 3 };
            let untouched = Op::Verify { target: b.kernel_buffer(), offset_bytes: b.offset_bytes(), len_bytes: 256, id: 4 };
            let results = kernels.run(&[between, within, verify_b, verify_a, untouched]).unwrap();
            assert_eq!(results, [corrupted, corrupted, VerifyResult::default()]);
            heap.free(a).unwrap();
            heap.free(b).unwrap();
        }
        finish(device);
    }
}

/// A wgpu error outside heapscope's error scopes reaches the device's error log (and so fails `finish`); inside a
/// heapscope operation it is returned. A buffer the kernels cannot bind is refused before wgpu sees it.
#[test]
fn wgpu_errors_are_caught() {
    for (_, device) in devices() {
        {
            let uniform = device.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some("not storage"),
                size: 1024,
                usage: wgpu::BufferUsages::UNIFORM,
                mapped_at_creation: false,
            });
            let mut kernels = WgpuKernels::new(Arc::clone(&device)).unwrap();
            let refused = kernels.fill(KernelBuffer::new(&uniform), 0, 1024, 1).unwrap_err();
            assert!(refused.to_string().contains("without STORAGE usage"), "{refused}");
            assert!(device.errors().messages().is_empty());
            // Outside any scope: a copy into a buffer without COPY_DST usage.
            let mut encoder = device.device().create_command_encoder(&Default::default());
            let other = device.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some("no copies"),
                size: 1024,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
            encoder.copy_buffer_to_buffer(&other, 0, &uniform, 512, 256);
            device.queue().submit([encoder.finish()]);
            device.wait(None).unwrap();
            let messages = device.errors().messages();
            assert!(!messages.is_empty(), "the invalid copy was not reported");
            assert!(messages.iter().any(|message| message.contains("COPY_SRC")), "{messages:?}");
        }
        // The device's log is not empty now: `finish` would fail, as a test with a wgpu error must.
        let errors = device.errors().clone();
        drop(device);
        assert!(!errors.messages().is_empty());
    }
}

/// Compaction in wgpu arenas: allocations filled by the fill kernel, a third freed, a full pass (slides and arenas
/// emptied into the others, released at once); the arenas copy every move (`copy_buffer_to_buffer`, in order) and the
/// verify kernel finds each allocation's pattern where it is now. On plain wgpu and on heapscope's Vulkan device.
#[test]
fn compaction_copies_every_move_through_wgpu() {
    use heapscope_core::compaction::{Algorithm, Budget};
    for (route, device) in devices() {
        let mut kernels = WgpuKernels::new(Arc::clone(&device)).unwrap();
        let mut rng = Rng::new(0xa7e4a);
        for policy in [PolicyKind::Tlsf, PolicyKind::BestFit, PolicyKind::FirstFit] {
            let heap_config = HeapConfig {
                block_size_bytes: 4 * MIB,
                dedicated_threshold_bytes: u64::MAX,
                release: ReleaseRule::Immediately,
                grow_blocks: false,
                ..HeapConfig::new(policy)
            };
            let mut heap =
                ArenaHeap::new(Arc::clone(&device), ArenaConfig { heap: heap_config, ..ArenaConfig::new(policy) }).unwrap();
            let mut live: Vec<(u32, ArenaAllocation)> = Vec::new();
            for id in 0..80_u32 {
                let size = rng.range(16, 400) * 1024 + rng.range(0, 1023);
                live.push((id, heap.allocate(size, 1 << rng.range(2, 10), None).unwrap()));
            }
            let fills: Vec<Op<KernelBuffer<'_>>> = live.iter().map(|(id, allocation)| allocation.fill(*id)).collect();
            kernels.run(&fills).unwrap();
            drop(fills);
            let mut kept = Vec::new();
            for (id, allocation) in live {
                if rng.chance(0.35) {
                    heap.free(allocation).unwrap();
                } else {
                    kept.push((id, allocation));
                }
            }
            let arenas_before = heap.live_arenas();
            let movable: Vec<ArenaAllocation> = kept.iter().map(|(_, allocation)| allocation.clone()).collect();
            let moves = heap.compact(&movable, Algorithm::Full, Budget::UNLIMITED).unwrap();
            assert!(!moves.is_empty(), "{route} {policy}: a scattered heap compacts");
            for (index, now) in moves {
                kept[index].1 = now;
            }
            let verifies: Vec<Op<KernelBuffer<'_>>> = kept.iter().map(|(id, allocation)| allocation.verify(*id)).collect();
            let results = kernels.run(&verifies).unwrap();
            for ((id, allocation), result) in kept.iter().zip(&results) {
                assert_eq!(*result, VerifyResult::default(), "{route} {policy}: allocation {id} at {:#x}", allocation.address());
            }
            drop(verifies);
            assert!(heap.live_arenas() <= arenas_before, "{route} {policy}: arenas {arenas_before} before");
            for (_, allocation) in kept {
                heap.free(allocation).unwrap();
            }
        }
        drop(kernels);
        finish(device);
    }
}
