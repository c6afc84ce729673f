//! What binding pages costs: the GPT-2 training trace (`assets/traces/gpt2_train_fixed-default.hst`), every size
//! divided by a scale (16 by default), replayed through a `DevicePagedHeap` (TLSF; virtual range 2 GiB and pool
//! cap 1 GiB at scale 16, both scaled with it). Each allocate / free that submits a sparse batch is timed up to
//! the batch's completion on the host; prints batches, bind entries, pages bound, and the amortised
//! microseconds per page bound, best of the runs.
//!
//! ```sh
//! cargo run --release -p heapscope-vulkan --example paged_bind_cost [-- SCALE [RUNS]]
//! ```

use std::sync::Arc;

use heapscope_vulkan::{ContextOptions, VulkanContext};

#[path = "../tests/device/common/bind_cost.rs"]
#[allow(dead_code, reason = "shared with the tests")]
mod bind_cost;

fn main() {
    let mut args = std::env::args().skip(1);
    let scale: u64 = args.next().map_or(16, |arg| arg.parse().expect("SCALE: a positive integer"));
    let runs: u32 = args.next().map_or(3, |arg| arg.parse().expect("RUNS: a positive integer"));
    assert!(scale > 0 && runs > 0, "SCALE and RUNS must be positive");
    let context = match VulkanContext::new(&ContextOptions::from_env()) {
        Ok(context) => Arc::new(context),
        Err(error) => {
            eprintln!("no Vulkan device: {error}");
            std::process::exit(2);
        }
    };
    let features = context.enabled_features();
    if !(features.sparse_binding && features.sparse_residency_buffer && features.timeline_semaphore) {
        eprintln!("{} has no sparse residency for buffers", context.properties().name);
        std::process::exit(2);
    }
    let trace = bind_cost::gpt2_trace();
    let (virtual_bytes, capacity_bytes) = ((32 << 30) / scale, (16 << 30) / scale);
    println!("device: {}; trace: {} ({} events), sizes / {scale}", context.properties().name, trace.name, trace.events().len());
    let mut best: Option<bind_cost::BindCost> = None;
    for run in 1..=runs {
        let cost = bind_cost::replay_bind_cost(&context, &trace, scale, virtual_bytes, capacity_bytes);
        println!("run {run}: {}", cost.summary());
        if best.as_ref().is_none_or(|best| cost.us_per_page_bound() < best.us_per_page_bound()) {
            best = Some(cost);
        }
    }
    if let Some(best) = best {
        println!(
            "best: {:.3} us per {} KiB page bound ({} pages in {} batches, {} bind entries); target <= 2 us: {}",
            best.us_per_page_bound(),
            best.page_bytes >> 10,
            best.pages_bound,
            best.bind_batches,
            best.bind_entries,
            if best.us_per_page_bound() <= 2.0 { "met" } else { "not met" }
        );
    }
}
