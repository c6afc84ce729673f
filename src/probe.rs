//! `heapscope probe`: every Vulkan adapter with its heaps, memory types, budget, sparse support, sparse page
//! size and measured sparse bind/unbind latencies (best of three runs of one batch each); a table, or one JSON
//! object per adapter and line. Without a Vulkan device it fails with "no Vulkan device" (exit status 1).

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use heapscope_core::units::Bytes;
use heapscope_vulkan::{
    BindLatency, ContextOptions, SparseBuffer, SparseConfig, VulkanContext, VulkanError, measure_bind_latency,
};
use serde_json::{Value, json};

/// Arguments of `heapscope probe`.
#[derive(Debug, Default, Args)]
pub struct ProbeArgs {
    /// Print one JSON object per adapter instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The page counts the bind latency is measured for, each contiguous and scattered.
const LATENCY_PAGES: [u32; 3] = [1, 64, 1024];

/// Runs per measurement; the fastest is reported.
const LATENCY_RUNS: usize = 3;

/// `"A | B"` flag names as a list (ash's `Debug` of a flag set); empty flags: an empty list.
fn flag_names(debug: &str, empty: bool) -> Vec<String> {
    if empty { Vec::new() } else { debug.split(" | ").map(str::to_owned).collect() }
}

/// What the probe found about one adapter.
fn probe_adapter(index: usize) -> Result<Value> {
    let options = ContextOptions { validation: false, device_selector: Some(index.to_string()) };
    let context = Arc::new(VulkanContext::new(&options).with_context(|| format!("bringing up adapter {index}"))?);
    let properties = context.properties();
    let budgets = context.heap_budgets();
    let heaps: Vec<Value> = (0..)
        .zip(&properties.memory_heaps)
        .map(|(heap_index, heap)| {
            let budget = budgets.iter().find(|budget| budget.heap_index == heap_index);
            json!({
                "size_bytes": heap.size_bytes,
                "flags": flag_names(&format!("{:?}", heap.flags), heap.flags.is_empty()),
                "budget_bytes": budget.map(|budget| budget.budget_bytes),
                "usage_bytes": budget.and_then(|budget| budget.usage_bytes),
            })
        })
        .collect();
    let memory_types: Vec<Value> = properties
        .memory_types
        .iter()
        .map(|info| {
            json!({
                "index": info.index,
                "heap": info.heap_index,
                "flags": flag_names(&format!("{:?}", info.property_flags), info.property_flags.is_empty()),
            })
        })
        .collect();
    let supported = properties.supported_features;
    let (sparse_page_bytes, latencies) = match SparseBuffer::new(Arc::clone(&context), SparseConfig::new(1 << 20)) {
        Ok(buffer) => {
            let page_bytes = buffer.page_bytes();
            drop(buffer);
            let mut latencies = Vec::new();
            for pages in LATENCY_PAGES {
                for contiguous in [true, false] {
                    // Best of a few runs: single runs on a loaded machine are noisy.
                    let mut best = measure_bind_latency(&context, pages, contiguous)?;
                    for _ in 1..LATENCY_RUNS {
                        let run = measure_bind_latency(&context, pages, contiguous)?;
                        best.bind_us = best.bind_us.min(run.bind_us);
                        best.unbind_us = best.unbind_us.min(run.unbind_us);
                    }
                    latencies.push(best);
                }
            }
            (Some(page_bytes), latencies)
        }
        Err(VulkanError::Unsupported(_)) => (None, Vec::new()),
        Err(error) => return Err(error.into()),
    };
    let latency = |latency: &BindLatency| {
        json!({
            "pages": latency.pages,
            "layout": latency.layout.as_str(),
            "bind_us": (latency.bind_us * 10.0).round() / 10.0,
            "unbind_us": (latency.unbind_us * 10.0).round() / 10.0,
        })
    };
    Ok(json!({
        "index": index,
        "name": properties.name,
        "vendor_id": properties.vendor_id,
        "device_type": format!("{:?}", properties.device_type),
        "api_version": properties.api_version_text(),
        "heaps": heaps,
        "memory_types": memory_types,
        "sparse_binding": supported.sparse_binding,
        "sparse_residency_buffer": supported.sparse_residency_buffer,
        "sparse_residency_aliased": supported.sparse_residency_aliased,
        "sparse_address_space_bytes": properties.limits.sparse_address_space_size_bytes,
        "max_buffer_bytes": properties.limits.max_buffer_size_bytes,
        "max_memory_allocation_bytes": properties.limits.max_memory_allocation_size_bytes,
        "residency_non_resident_strict": properties.sparse.residency_non_resident_strict,
        "sparse_page_bytes": sparse_page_bytes,
        "bind_latency_us": latencies.iter().map(latency).collect::<Vec<_>>(),
    }))
}

/// A byte count for the table, or `-`.
fn bytes(value: &Value) -> String {
    value.as_u64().map_or_else(|| "-".to_owned(), |bytes| Bytes(bytes).to_string())
}

/// The flags of a JSON flag list, `A|B`, or `-`.
fn flags(value: &Value) -> String {
    let names: Vec<&str> = value.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if names.is_empty() { "-".to_owned() } else { names.join("|") }
}

fn print_table(adapter: &Value) {
    outln!(
        "adapter {}: {} (vendor {:#x}, {}, Vulkan {})",
        adapter["index"],
        adapter["name"].as_str().unwrap_or_default(),
        adapter["vendor_id"].as_u64().unwrap_or_default(),
        adapter["device_type"].as_str().unwrap_or_default(),
        adapter["api_version"].as_str().unwrap_or_default()
    );
    for (index, heap) in adapter["heaps"].as_array().into_iter().flatten().enumerate() {
        outln!(
            "  heap {index}: {} [{}], budget {}, used {}",
            bytes(&heap["size_bytes"]),
            flags(&heap["flags"]),
            bytes(&heap["budget_bytes"]),
            bytes(&heap["usage_bytes"])
        );
    }
    for memory_type in adapter["memory_types"].as_array().into_iter().flatten() {
        outln!("  type {} (heap {}): {}", memory_type["index"], memory_type["heap"], flags(&memory_type["flags"]));
    }
    outln!(
        "  largest: allocation {}, buffer {}, sparse address space {}",
        bytes(&adapter["max_memory_allocation_bytes"]),
        bytes(&adapter["max_buffer_bytes"]),
        bytes(&adapter["sparse_address_space_bytes"])
    );
    outln!(
        "  sparse: binding {}, residency buffer {}, residency aliased {}, non-resident strict {}, page {}",
        adapter["sparse_binding"],
        adapter["sparse_residency_buffer"],
        adapter["sparse_residency_aliased"],
        adapter["residency_non_resident_strict"],
        bytes(&adapter["sparse_page_bytes"])
    );
    let latencies = adapter["bind_latency_us"].as_array().cloned().unwrap_or_default();
    if !latencies.is_empty() {
        outln!("  {:>6}  {:<10}  {:>10}  {:>10}", "pages", "layout", "bind µs", "unbind µs");
        for latency in latencies {
            outln!(
                "  {:>6}  {:<10}  {:>10.1}  {:>10.1}",
                latency["pages"].as_u64().unwrap_or_default(),
                latency["layout"].as_str().unwrap_or_default(),
                latency["bind_us"].as_f64().unwrap_or_default(),
                latency["unbind_us"].as_f64().unwrap_or_default()
            );
        }
    }
}

/// Runs `heapscope probe`.
///
/// # Errors
/// No Vulkan device ("no Vulkan device"), or an adapter that fails to come up.
pub fn run(args: &ProbeArgs) -> Result<()> {
    let devices = match VulkanContext::enumerate_devices() {
        Ok(devices) => devices,
        Err(error) if error.means_no_vulkan() => bail!("no Vulkan device: {error}"),
        Err(error) => return Err(error.into()),
    };
    if devices.is_empty() {
        bail!("no Vulkan device: the loader lists no physical device");
    }
    for index in 0..devices.len() {
        let adapter = probe_adapter(index)?;
        if args.json {
            outln!("{adapter}");
        } else {
            print_table(&adapter);
        }
    }
    Ok(())
}
