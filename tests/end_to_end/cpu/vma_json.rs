//! End-to-end: `heapscope export --vma-json` writes the heap's final state in VMA's JSON statistics format.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use crate::common::{heapscope, stderr};
use serde_json::Value;

#[test]
fn export_vma_json_for_heap_contenders_only() {
    let dir = crate::common::temp_dir("vma-json");
    let source = crate::common::trace("pytorch/gpt2_train_fixed-default.pickle.gz");
    let (pickle, json_path) = (dir.join("out.pickle"), dir.join("out.json"));
    let args = |policy: &'static str| {
        ["export", source.to_str().unwrap(), "--policy", policy, "--out", pickle.to_str().unwrap()]
            .into_iter()
            .chain(["--vma-json", json_path.to_str().unwrap()])
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let tlsf: Vec<String> = args("tlsf");
    let output = heapscope(&tlsf.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(output.status.success(), "{}", stderr(&output));

    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(json["General"]["API"], "Vulkan");
    let pool = &json["DefaultPools"]["Type 0"];
    let (mut blocks, mut block_bytes) = (0, 0);
    for block in pool["Blocks"].as_object().unwrap().values() {
        let size = block["TotalBytes"].as_u64().unwrap();
        let tiled: u64 = block["Suballocations"].as_array().unwrap().iter().map(|s| s["Size"].as_u64().unwrap()).sum();
        assert_eq!(tiled, size, "the suballocations tile the block");
        blocks += 1;
        block_bytes += size;
    }
    for allocation in pool["DedicatedAllocations"].as_array().unwrap() {
        blocks += 1;
        block_bytes += allocation["Size"].as_u64().unwrap();
    }
    assert_eq!(json["Total"]["BlockCount"], blocks);
    assert_eq!(json["Total"]["BlockBytes"], block_bytes);
    assert_eq!(json["MemoryInfo"]["Heap 0"]["Stats"], json["Total"]);

    let pytorch: Vec<String> = args("pytorch");
    let output = heapscope(&pytorch.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!output.status.success());
    assert!(stderr(&output).contains("--vma-json needs a heap contender"));
}
