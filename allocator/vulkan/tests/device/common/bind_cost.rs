//! What binding pages costs under a real workload: a trace replayed through a [`DevicePagedHeap`], every
//! allocate / free that submits a sparse batch timed from the call to the batch's completion on the host.
//! Shared by `tests/device/sparse.rs` and `examples/paged_bind_cost.rs` (included there with `#[path]`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use heapscope_core::{Event, Request, Trace};
use heapscope_vulkan::{DevicePagedConfig, DevicePagedHeap, VulkanContext};

/// The GPT-2 training trace of the repository.
pub fn gpt2_trace() -> Trace {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/traces/gpt2_train_fixed-default.hst");
    Trace::read(Path::new(path)).expect("the gpt2 trace reads")
}

/// Counters and times of one replay.
#[derive(Clone, Debug, Default)]
pub struct BindCost {
    /// Trace events replayed.
    pub events: u64,
    /// Requests the heap refused (out of memory, too many mappings).
    pub failed: u64,
    /// Sparse batches that bound pages, and that unbound pages.
    pub bind_batches: u64,
    /// Batches that unbound pages.
    pub unbind_batches: u64,
    /// `VkSparseMemoryBind` entries binding memory.
    pub bind_entries: u64,
    /// `VkSparseMemoryBind` entries unbinding.
    pub unbind_entries: u64,
    /// Pages bound over the replay (not at once).
    pub pages_bound: u64,
    /// Pages unbound over the replay.
    pub pages_unbound: u64,
    /// The most pages bound at once.
    pub peak_pages_bound: u64,
    /// Wall time of the allocate calls that bound pages, each up to its batch's completion.
    pub bind_time: Duration,
    /// The same for the free calls that unbound pages.
    pub unbind_time: Duration,
    /// Wall time of the whole replay.
    pub total_time: Duration,
    /// The page size.
    pub page_bytes: u64,
}

impl BindCost {
    /// Amortised microseconds per page bound (bind time / pages bound).
    pub fn us_per_page_bound(&self) -> f64 {
        self.bind_time.as_secs_f64() * 1e6 / self.pages_bound.max(1) as f64
    }

    /// Amortised microseconds per page unbound.
    pub fn us_per_page_unbound(&self) -> f64 {
        self.unbind_time.as_secs_f64() * 1e6 / self.pages_unbound.max(1) as f64
    }

    /// One line for a log.
    pub fn summary(&self) -> String {
        format!(
            "{} events ({} failed); binds: {} batches, {} entries, {} pages of {} KiB (peak {} at once), {:.1} ms -> \
             {:.3} us/page bound; unbinds: {} batches, {} entries, {} pages, {:.1} ms -> {:.3} us/page; replay {:.2?}",
            self.events,
            self.failed,
            self.bind_batches,
            self.bind_entries,
            self.pages_bound,
            self.page_bytes >> 10,
            self.peak_pages_bound,
            self.bind_time.as_secs_f64() * 1e3,
            self.us_per_page_bound(),
            self.unbind_batches,
            self.unbind_entries,
            self.pages_unbound,
            self.unbind_time.as_secs_f64() * 1e3,
            self.us_per_page_unbound(),
            self.total_time,
        )
    }
}

/// Replays `trace` through a [`DevicePagedHeap`] (TLSF, `virtual_bytes`, pool cap `capacity_bytes`, 4096
/// pages a chunk), every size divided by `scale` (rounded up to 4 bytes), alignment 512. Every allocate or free that
/// submits a batch is timed up to `wait_binds`. Frees everything still live at the end (timed too).
pub fn replay_bind_cost(
    context: &Arc<VulkanContext>,
    trace: &Trace,
    scale: u64,
    virtual_bytes: u64,
    capacity_bytes: u64,
) -> BindCost {
    let mut config = DevicePagedConfig::new(virtual_bytes, Some(capacity_bytes));
    // 4096 pages a chunk (16 MiB of 4 KiB pages): few memory chunks, so live mappings stay far from the limit.
    config.pages_per_chunk = 4096;
    let mut heap = DevicePagedHeap::new(Arc::clone(context), config).expect("a device paged heap");
    let page_bytes = heap.sparse().page_bytes();
    let mut cost = BindCost { page_bytes, ..BindCost::default() };
    let mut slots = vec![None; trace.slots() as usize];
    let started = Instant::now();
    let timed = |heap: &mut DevicePagedHeap, cost: &mut BindCost, call: &mut dyn FnMut(&mut DevicePagedHeap) -> bool| {
        let before = heap.stats().sparse;
        let at = Instant::now();
        let served = call(heap);
        let after = heap.stats().sparse;
        if after.batches > before.batches {
            heap.wait_binds().expect("binds complete");
            let elapsed = at.elapsed();
            if after.bind_entries > before.bind_entries {
                cost.bind_batches += after.batches - before.batches;
                cost.bind_entries += after.bind_entries - before.bind_entries;
                cost.pages_bound += after.pages_bound.saturating_sub(before.pages_bound);
                cost.bind_time += elapsed;
            } else {
                cost.unbind_batches += after.batches - before.batches;
                cost.unbind_entries += after.unbind_entries - before.unbind_entries;
                cost.pages_unbound += before.pages_bound.saturating_sub(after.pages_bound);
                cost.unbind_time += elapsed;
            }
        }
        served
    };
    for event in trace.events() {
        cost.events += 1;
        match *event {
            Event::Alloc { slot, size_bytes } => {
                let size = size_bytes.div_ceil(scale).next_multiple_of(4).max(4);
                let request = Request::new(size, 512).expect("a valid request");
                let mut placed = None;
                let served = timed(&mut heap, &mut cost, &mut |heap| match heap.allocate(request) {
                    Ok(allocation) => {
                        placed = Some(allocation);
                        true
                    }
                    Err(error) => {
                        assert!(
                            error.is_out_of_memory() || matches!(error, heapscope_vulkan::VulkanError::TooManyMappings { .. }),
                            "{error}"
                        );
                        false
                    }
                });
                if !served {
                    cost.failed += 1;
                }
                slots[slot as usize] = placed;
            }
            Event::Free { slot } => {
                if let Some(allocation) = slots[slot as usize].take() {
                    timed(&mut heap, &mut cost, &mut |heap| heap.free(allocation).is_ok());
                }
            }
            // The measured traces (GPT-2's) call no `empty_cache()`.
            Event::EmptyCache => {}
        }
    }
    for allocation in slots.into_iter().flatten() {
        timed(&mut heap, &mut cost, &mut |heap| heap.free(allocation).is_ok());
    }
    heap.wait_binds().expect("binds complete");
    cost.total_time = started.elapsed();
    cost.peak_pages_bound = heap.stats().sparse.peak_pages_bound;
    assert_eq!(heap.stats().sparse.pages_bound, 0, "everything was unbound");
    cost
}
