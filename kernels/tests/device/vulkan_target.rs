//! The bench runner on the device (`VulkanTarget`), validation on: the conformance checks every device target
//! must pass (`heapscope_kernels::bench::conformance`: every contender plays small workloads with every allocation
//! filled, computed on, copied and verified by the kernels — no mismatch — and counts what the simulated run
//! counts), and a dropped target's device memory is gone.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use heapscope_kernels::VulkanTarget;
use heapscope_kernels::bench::conformance::{check_target, small_serve};
use heapscope_kernels::bench::{BenchSettings, run};
use heapscope_kernels::workload::KvLayout;
use heapscope_lab::contender::Contender;

/// The checks every device target must pass (`heapscope_kernels::bench::conformance`).
#[test]
fn every_contender_verifies_clean_and_matches_the_simulation() {
    let Some(context) = crate::common::sparse_context() else { return };
    let runs =
        check_target(|policy, settings| VulkanTarget::new(&context, policy, settings).map(Some), VulkanTarget::kernel_counts)
            .unwrap_or_else(|error| panic!("{error}"));
    for run in runs {
        eprintln!("{run}");
    }
    crate::common::finish(context);
}

/// Each target's device memory (blocks, cached segments) is gone when it is dropped.
#[test]
fn a_dropped_target_leaves_no_device_memory() {
    let Some(context) = crate::common::sparse_context() else { return };
    let baseline = context.live_allocation_count();
    let workload = small_serve(KvLayout::Paged);
    for policy in [Contender::Heap(heapscope_core::PolicyKind::Tlsf), Contender::Pytorch { expandable: false }] {
        let mut target = VulkanTarget::new(&context, policy, &BenchSettings::new(None)).unwrap();
        run(&workload, &mut target).unwrap();
        assert!(target.device_bytes() > 0, "{policy}: memory stays cached after the run");
        drop(target);
        assert_eq!(context.live_allocation_count(), baseline, "{policy}");
    }
    crate::common::finish(context);
}
