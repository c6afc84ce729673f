//! Shared by the end-to-end tests: the built binary and its output (as text, or one JSON object per line), the
//! assets, scratch folders, and whether CI requires a device (`HEAPSCOPE_REQUIRE_GPU=1`).
#![allow(dead_code, reason = "each test binary uses a part")]
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The built `heapscope` binary, to be given arguments, environment or a folder.
pub fn binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_heapscope"))
}

/// Runs `command` to its end and returns what it wrote and its status.
pub fn output(command: &mut Command) -> Output {
    command.output().expect("the binary runs")
}

/// Runs the binary with `args`.
pub fn heapscope(args: &[&str]) -> Output {
    output(binary().args(args))
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The JSON objects of a successful run, one a line.
pub fn json_lines(output: &Output) -> Vec<Value> {
    assert!(output.status.success(), "stderr: {}", stderr(output));
    stdout(output).lines().map(|line| serde_json::from_str(line).expect("one JSON object per line")).collect()
}

/// A file of `assets/traces/` (`name` may name a subfolder: `pytorch/frag_oom-default.pickle.gz`).
pub fn trace(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/traces").join(name)
}

/// A scratch folder of this test process, named by `tag`, created.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("heapscope-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A scattered heap as a CSV trace in `temp_dir(tag)`: eight 60 MiB allocations, every other one freed, then 200 MiB
/// (on a 512 MiB device in 256 MiB blocks, refused for fragmentation until the heap compacts).
pub fn scattered_trace(tag: &str) -> PathBuf {
    let file = temp_dir(tag).join("scattered.csv");
    let mut csv = String::from("# eight 60 MiB, every other one freed, then 200 MiB\n");
    for id in 0..8 {
        csv.push_str(&format!("a,{id},{}\n", 60 << 20));
    }
    for id in [1, 3, 5, 7] {
        csv.push_str(&format!("f,{id}\n"));
    }
    csv.push_str(&format!("a,8,{}\n", 200 << 20));
    std::fs::write(&file, csv).unwrap();
    file
}

/// Whether the device tests must run (and pictures render): CI sets `HEAPSCOPE_REQUIRE_GPU=1` where lavapipe is
/// installed.
pub fn gpu_required() -> bool {
    std::env::var("HEAPSCOPE_REQUIRE_GPU").is_ok_and(|value| value.trim() == "1")
}

/// The Vulkan device's largest single allocation (`maxMemoryAllocationSize`) and its type (`CPU` for lavapipe), as
/// `heapscope probe --json` says them for the first adapter; `None` (the test skipped) without a device, a failure
/// where `HEAPSCOPE_REQUIRE_GPU=1`. Tests of a device limit build their inputs from it, so that they hold on any device.
pub fn device_largest_allocation() -> Option<(u64, String)> {
    let output = heapscope(&["probe", "--json"]);
    let adapter: Option<Value> = stdout(&output).lines().next().and_then(|line| serde_json::from_str(line).ok());
    let largest = adapter.and_then(|adapter| {
        Some((adapter["max_memory_allocation_bytes"].as_u64()?, adapter["device_type"].as_str()?.to_owned()))
    });
    assert!(largest.is_some() || !gpu_required(), "no Vulkan device: {}", stderr(&output));
    largest
}
