//! End-to-end tests of `heapscope replay --vulkan` and `compare --vulkan` on a real Vulkan device (lavapipe in
//! CI): heap contenders, `paged` on a sparse buffer, gpu-allocator and VMA replay traces on device memory,
//! beside the simulated contenders. Skipped without a device unless `HEAPSCOPE_REQUIRE_GPU=1`.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const MIB: u64 = 1 << 20;

fn heapscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_heapscope")).args(args).output().expect("the binary runs")
}

fn lines(output: &Output) -> Vec<Value> {
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// Runs `args` with `--vulkan`; `None` (skipped) when the machine has no Vulkan device, unless
/// `HEAPSCOPE_REQUIRE_GPU=1`.
fn on_device(args: &[&str]) -> Option<Output> {
    let output = heapscope(&[args, &["--vulkan"]].concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let required = std::env::var("HEAPSCOPE_REQUIRE_GPU").is_ok_and(|value| value.trim() == "1");
    if !output.status.success() && stderr.contains("bringing up the Vulkan device") && !required {
        eprintln!("skipped: {stderr}");
        return None;
    }
    Some(output)
}

fn gpt2() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/traces/gpt2_train_fixed-default.hst").to_str().unwrap().to_owned()
}

#[test]
fn heaps_gpu_allocator_and_vma_replay_on_the_device() {
    let trace = gpt2();
    let args =
        ["replay", &trace, "--json", "--policy", "tlsf", "--policy", "gpu-allocator", "--policy", "vma", "--policy", "pytorch"];
    let Some(output) = on_device(&args) else { return };
    let on_device = lines(&output);
    let policies: Vec<&str> = on_device.iter().map(|line| line["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["tlsf (vulkan)", "gpu-allocator (vulkan)", "vma (vulkan)", "pytorch"]);
    // The same requests as the simulated replay: every allocation served, the same peak of live bytes.
    let simulated = lines(&heapscope(&["replay", &trace, "--json", "--policy", "tlsf"]));
    for line in &on_device[..3] {
        assert_eq!((line["allocs"].as_u64(), line["ooms"].as_u64()), (Some(6179), Some(0)), "{line}");
        assert_eq!(line["peak_live_bytes"], simulated[0]["peak_live_bytes"], "{line}");
        assert!(line["peak_reserved_bytes"].as_u64() >= line["peak_live_bytes"].as_u64(), "{line}");
        assert!(line["device_allocs"].as_u64().unwrap() > 0, "{line}");
    }
    // The allocators of today need the device, and say so before reading anything.
    for name in ["gpu-allocator", "vma"] {
        let refused = heapscope(&["replay", "/nonexistent", "--policy", name]);
        assert!(!refused.status.success());
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains(&format!("{name} runs on a Vulkan device: add --vulkan")), "{stderr}");
    }
}

/// `paged` on the device sizes its sparse buffer from the trace and the device's limits: the GPT-2 trace
/// (12.7 GiB live at once) needs more than lavapipe's 2 GiB sparse address space, which is a clear error naming
/// the limit; a device with room serves it.
#[test]
fn paged_on_the_device_names_the_limit_a_trace_exceeds() {
    let trace = gpt2();
    let Some(output) = on_device(&["replay", &trace, "--json", "--policy", "paged"]) else { return };
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() {
        let line = &lines(&output)[0];
        assert_eq!((line["policy"].as_str(), line["ooms"].as_u64()), (Some("paged (vulkan)"), Some(0)), "{line}");
    } else {
        assert!(
            stderr.contains("the paged contender needs a virtual range of at least 12.")
                && stderr.contains("sparseAddressSpaceSize")
                && stderr.contains("without --vulkan for the simulated paged contender"),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// The frag_oom story at a quarter of its size (20 x 37.5 MiB allocated and freed, 20 x 25 MiB, then 256 MiB,
/// within 896 MiB): best fit in blocks configured like PyTorch's fails with fragmentation on device memory,
/// `paged` on the sparse buffer serves everything with either unmap rule, and every contender stays within the
/// capacity; `compare` says so in one sentence.
#[test]
fn frag_oom_on_the_device_paged_serves_what_blocks_cannot() {
    let dir: PathBuf = std::env::temp_dir().join(format!("heapscope-vulkan-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("frag_oom_quarter.csv");
    let mut text = String::new();
    for id in 0..20 {
        text.push_str(&format!("a,{id},{}\n", 75 * MIB / 2));
    }
    for id in 0..20 {
        text.push_str(&format!("f,{id}\n"));
    }
    for id in 100..120 {
        text.push_str(&format!("a,{id},{}\n", 25 * MIB));
    }
    text.push_str(&format!("a,999,{}\n", 256 * MIB));
    std::fs::write(&csv, text).unwrap();
    let csv = csv.to_str().unwrap();
    let rules = ["--capacity", "896MiB", "--release", "on-pressure", "--block-size", "64MiB", "--dedicated-threshold", "32MiB"];
    let contenders = ["--policy", "best-fit", "--policy", "paged", "--policy", "gpu-allocator", "--policy", "vma"];
    let Some(output) = on_device(&[&["replay", csv, "--json"][..], &rules, &contenders].concat()) else { return };
    let replays = lines(&output);
    let find = |policy: &str| replays.iter().find(|line| line["policy"] == policy).unwrap();
    let oom = &find("best-fit (vulkan)")["first_oom"];
    assert_eq!((oom["request_bytes"].as_u64(), oom["verdict"].as_str()), (Some(256 * MIB), Some("fragmentation")), "{oom}");
    assert_eq!(oom["free_bytes"].as_u64(), Some(250 * MIB), "{oom}");
    let paged = find("paged (vulkan)");
    assert_eq!((paged["allocs"].as_u64(), paged["ooms"].as_u64()), (Some(41), Some(0)), "{paged}");
    assert_eq!(paged["peak_reserved_bytes"].as_u64(), Some(756 * MIB), "the 37.5 MiB pages were unbound: {paged}");
    assert!(paged["device_allocs"].as_u64().unwrap() > 0 && paged["device_frees"].as_u64().unwrap() > 0, "{paged}");
    for line in &replays {
        assert!(line["peak_reserved_bytes"].as_u64().unwrap() <= 896 * MIB, "within the capacity: {line}");
    }
    // Under pressure the freed pages stay bound for the 25 MiB allocations: fewer binds, the same peak.
    let pressure =
        on_device(&[&["replay", csv, "--json", "--policy", "paged", "--paged-unmap", "pressure"][..], &rules].concat());
    let pressure = &lines(&pressure.unwrap())[0];
    assert_eq!((pressure["ooms"].as_u64(), pressure["peak_reserved_bytes"].as_u64()), (Some(0), Some(756 * MIB)), "{pressure}");
    assert!(pressure["device_allocs"].as_u64() < paged["device_allocs"].as_u64(), "{pressure} vs {paged}");
    let compare = on_device(&[&["compare", csv][..], &rules, &["--policy", "best-fit", "--policy", "paged"]].concat()).unwrap();
    let stdout = String::from_utf8_lossy(&compare.stdout);
    assert!(
        stdout.contains("`best-fit (vulkan)` ran out of memory on a 256.00 MiB request")
            && stdout.contains("`paged (vulkan)` would have succeeded"),
        "{stdout}"
    );
    std::fs::remove_dir_all(dir).ok();
}
