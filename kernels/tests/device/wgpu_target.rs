//! The bench runner on wgpu (`WgpuTarget`), validation on: every contender plays small workloads with every
//! allocation filled, computed on, copied and verified by the kernels — no mismatch — and counts what the simulated
//! run counts (allocations, refusals and the first one's step, peak live and reserved bytes). On wgpu over
//! heapscope's Vulkan device every contender runs; on plain wgpu, `paged` and `pytorch-expandable` are refused
//! with the reason (skipped without a device unless `HEAPSCOPE_REQUIRE_GPU=1`).
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use crate::common::wgpu::{devices, finish};
use heapscope_core::PolicyKind;
use heapscope_kernels::bench::conformance::{check_target, small_serve};
use heapscope_kernels::bench::{BenchSettings, run};
use heapscope_kernels::workload::KvLayout;
use heapscope_kernels::{WgpuKernelError, WgpuTarget};
use heapscope_lab::contender::Contender;
use heapscope_wgpu::WgpuError;

fn needs_sparse(policy: Contender) -> bool {
    matches!(policy, Contender::Paged | Contender::Pytorch { expandable: true })
}

/// The checks every device target must pass (`heapscope_kernels::bench::conformance`), on every route; on plain
/// wgpu the contenders that need sparse binding are refused with the reason.
#[test]
fn every_contender_verifies_clean_and_matches_the_simulation() {
    for (route, device) in devices() {
        let make = |policy: Contender, settings: &BenchSettings| match WgpuTarget::new(&device, policy, settings) {
            Err(WgpuKernelError::Wgpu(WgpuError::Unsupported(why))) if !device.is_vulkan_interop() && needs_sparse(policy) => {
                assert!(
                    why.starts_with(policy.name()) && why.contains("sparse binding") && why.contains("--backend vulkan"),
                    "{why}"
                );
                Ok(None)
            }
            other => other.map(Some),
        };
        let runs = check_target(make, WgpuTarget::kernel_counts).unwrap_or_else(|error| panic!("{route}: {error}"));
        for run in runs {
            eprintln!("{route:<34} {run}");
        }
        finish(device);
    }
}

/// A target gives its device memory back when dropped: what it held after the run (arenas, cached segments) is
/// gone — heapscope's Vulkan allocations back to where they were, and `finish` finds no handle kept.
#[test]
fn a_dropped_target_leaves_nothing_behind() {
    let workload = small_serve(KvLayout::Paged);
    for (route, device) in devices() {
        let baseline = device.vulkan_context().map(|context| context.live_allocation_count());
        for policy in [
            Contender::Heap(PolicyKind::Tlsf),
            Contender::Pytorch { expandable: false },
            Contender::Paged,
            Contender::Pytorch { expandable: true },
        ] {
            if needs_sparse(policy) && !device.is_vulkan_interop() {
                continue;
            }
            let mut target = WgpuTarget::new(&device, policy, &BenchSettings::new(None)).unwrap();
            run(&workload, &mut target).unwrap();
            if !needs_sparse(policy) {
                assert!(target.device_bytes() > 0, "{route}: {policy}: memory stays cached after the run");
            }
            drop(target);
            let now = device.vulkan_context().map(|context| context.live_allocation_count());
            assert_eq!(now, baseline, "{route}: {policy}: heapscope's device memory is freed");
        }
        finish(device);
    }
}

/// Settings a heap refuses are an error naming them, never a panic; an allocation larger than a storage binding
/// stops the run with the limit named.
#[test]
fn bad_settings_and_unbindable_allocations_are_clear_errors() {
    for (route, device) in devices() {
        {
            let settings = BenchSettings { block_alignment_bytes: 3 << 10, ..BenchSettings::new(None) };
            let error = WgpuTarget::new(&device, Contender::Heap(PolicyKind::Tlsf), &settings).unwrap_err();
            assert!(error.to_string().contains("not a power of two"), "{route}: {error}");
            let limit = device.limits().max_storage_buffer_binding_size;
            let mut target = WgpuTarget::new(&device, Contender::Heap(PolicyKind::Tlsf), &BenchSettings::new(None)).unwrap();
            let error = heapscope_kernels::bench::Target::allocate(&mut target, limit + 4).unwrap_err();
            let message = error.to_string();
            assert!(
                message.contains("max_storage_buffer_binding_size") && message.contains("--backend vulkan"),
                "{route}: {message}"
            );
        }
        finish(device);
    }
}
