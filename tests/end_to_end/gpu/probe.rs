//! End-to-end test of `heapscope probe --json` on a real Vulkan device (lavapipe in CI): the keys of every
//! adapter, and lavapipe's 4 KiB sparse pages. Skipped without a device unless `HEAPSCOPE_REQUIRE_GPU=1`.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use crate::common::{gpu_required, json_lines, stderr};
use serde_json::Value;

#[test]
fn probe_json_lists_every_adapter_with_its_memory_and_sparse_latencies() {
    let output = crate::common::output(crate::common::binary().args(["probe", "--json"]).env("HEAPSCOPE_VALIDATION", "1"));
    let stderr = stderr(&output);
    if !output.status.success() && stderr.contains("no Vulkan") && !gpu_required() {
        eprintln!("skipped: {stderr}");
        return;
    }
    let adapters: Vec<Value> = json_lines(&output);
    assert!(!adapters.is_empty());
    for adapter in &adapters {
        for key in [
            "name",
            "vendor_id",
            "device_type",
            "api_version",
            "heaps",
            "memory_types",
            "sparse_binding",
            "sparse_residency_buffer",
            "sparse_residency_aliased",
            "sparse_page_bytes",
            "bind_latency_us",
            "max_memory_allocation_bytes",
        ] {
            assert!(adapter.get(key).is_some(), "{key} missing from {adapter}");
        }
        let heaps = adapter["heaps"].as_array().unwrap();
        assert!(!heaps.is_empty());
        for heap in heaps {
            assert!(heap["size_bytes"].as_u64().unwrap() > 0);
            assert!(heap["flags"].is_array());
            assert!(heap.get("budget_bytes").is_some() && heap.get("usage_bytes").is_some());
        }
        for memory_type in adapter["memory_types"].as_array().unwrap() {
            assert!(memory_type["index"].is_u64() && memory_type["heap"].is_u64() && memory_type["flags"].is_array());
        }
        if adapter["sparse_residency_buffer"] == true {
            let latencies = adapter["bind_latency_us"].as_array().unwrap();
            assert_eq!(latencies.len(), 6, "1, 64 and 1024 pages, contiguous and scattered");
            for latency in latencies {
                assert!([1, 64, 1024].contains(&latency["pages"].as_u64().unwrap()));
                assert!(["contiguous", "scattered"].contains(&latency["layout"].as_str().unwrap()));
                assert!(latency["bind_us"].as_f64().unwrap() > 0.0 && latency["unbind_us"].as_f64().unwrap() > 0.0);
            }
        }
        if adapter["name"].as_str().unwrap().starts_with("llvmpipe") {
            assert_eq!(adapter["sparse_page_bytes"], 4096, "lavapipe's sparse pages are 4 KiB");
            assert!(adapter["max_memory_allocation_bytes"].as_u64() > Some(0), "lavapipe is Vulkan 1.1 or later: {adapter}");
        }
    }
}
