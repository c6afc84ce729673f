//! End-to-end test of `heapscope replay --vulkan` on a real Vulkan device (lavapipe in CI): heap contenders and
//! gpu-allocator replay the GPT-2 trace on device memory, beside the simulated contenders. Skipped without a
//! device unless `HEAPSCOPE_REQUIRE_GPU=1`.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn heapscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_heapscope")).args(args).output().expect("the binary runs")
}

fn lines(output: &Output) -> Vec<Value> {
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

#[test]
fn heaps_and_gpu_allocator_replay_on_the_device() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/traces/gpt2_train_fixed-default.hst");
    let trace = trace.to_str().unwrap();
    let args = ["replay", trace, "--json", "--policy", "tlsf", "--policy", "gpu-allocator", "--policy", "paged"];
    let output = heapscope(&[&args[..], &["--vulkan"]].concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let required = std::env::var("HEAPSCOPE_REQUIRE_GPU").is_ok_and(|value| value.trim() == "1");
    if !output.status.success() && stderr.contains("Vulkan") && !required {
        eprintln!("skipped: {stderr}");
        return;
    }
    let on_device = lines(&output);
    let policies: Vec<&str> = on_device.iter().map(|line| line["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["tlsf (vulkan)", "gpu-allocator (vulkan)", "paged"]);
    // The same requests as the simulated replay: every allocation served, the same peak of live bytes.
    let simulated = lines(&heapscope(&["replay", trace, "--json", "--policy", "tlsf"]));
    for line in &on_device {
        assert_eq!((line["allocs"].as_u64(), line["ooms"].as_u64()), (Some(6179), Some(0)), "{line}");
        assert_eq!(line["peak_live_bytes"], simulated[0]["peak_live_bytes"], "{line}");
        assert!(line["peak_reserved_bytes"].as_u64() >= line["peak_live_bytes"].as_u64(), "{line}");
    }
    assert!(on_device[1]["device_allocs"].as_u64().unwrap() > 0);
    // gpu-allocator needs the device.
    let refused = heapscope(&args);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("gpu-allocator runs on a Vulkan device: add --vulkan"));
}
