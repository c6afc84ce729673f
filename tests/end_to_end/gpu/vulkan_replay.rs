//! End-to-end tests of `heapscope replay --vulkan` and `compare --vulkan` on a real Vulkan device (lavapipe in
//! CI): `pytorch`, heap contenders, `paged` on a sparse buffer, gpu-allocator and VMA replay traces on device
//! memory; a contender the device cannot run is a row that says why. Skipped without a device unless
//! `HEAPSCOPE_REQUIRE_GPU=1`.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::process::Output;

use crate::common::{gpu_required, heapscope, json_lines as lines, stderr, stdout};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// Runs `args` with `--vulkan` and the validation layer on (`HEAPSCOPE_VALIDATION=1`: any message fails the
/// command); `None` (skipped) when the machine has no Vulkan device, unless `HEAPSCOPE_REQUIRE_GPU=1`.
fn on_device(args: &[&str]) -> Option<Output> {
    let output =
        crate::common::output(crate::common::binary().args([args, &["--vulkan"]].concat()).env("HEAPSCOPE_VALIDATION", "1"));
    let stderr = stderr(&output);
    if !output.status.success() && stderr.contains("bringing up the Vulkan device") && !gpu_required() {
        eprintln!("skipped: {stderr}");
        return None;
    }
    Some(output)
}

fn gpt2() -> String {
    crate::common::trace("gpt2_train_fixed-default.hst").to_str().unwrap().to_owned()
}

#[test]
fn heaps_gpu_allocator_and_vma_replay_on_the_device() {
    let trace = gpt2();
    let args =
        ["replay", &trace, "--json", "--policy", "tlsf", "--policy", "gpu-allocator", "--policy", "vma", "--policy", "pytorch"];
    let Some(output) = on_device(&args) else { return };
    let on_device = lines(&output);
    let policies: Vec<&str> = on_device.iter().map(|line| line["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["tlsf (vulkan)", "gpu-allocator (vulkan)", "vma (vulkan)", "pytorch (vulkan)"]);
    // The same requests as the simulated replay: every allocation served, the same peak of live bytes.
    let simulated = lines(&heapscope(&["replay", &trace, "--json", "--policy", "tlsf", "--policy", "pytorch"]));
    for line in &on_device {
        assert_eq!((line["allocs"].as_u64(), line["ooms"].as_u64()), (Some(6179), Some(0)), "{line}");
        assert_eq!(line["peak_live_bytes"], simulated[0]["peak_live_bytes"], "{line}");
        assert!(line["peak_reserved_bytes"].as_u64() >= line["peak_live_bytes"].as_u64(), "{line}");
        assert!(line["device_allocs"].as_u64().unwrap() > 0, "{line}");
        assert!(line["not_run"].is_null(), "{line}");
    }
    // PyTorch's allocator on device memory: the simulated contender's numbers, reserved bytes and device
    // allocations measured on the device.
    for key in ["peak_reserved_bytes", "device_allocs", "device_frees", "frees"] {
        assert_eq!(on_device[3][key], simulated[1][key], "{key}");
    }
    // The allocators of today need the device, and say so before reading anything.
    for name in ["gpu-allocator", "vma"] {
        let refused = heapscope(&["replay", "/nonexistent", "--policy", name]);
        assert!(!refused.status.success());
        let stderr = stderr(&refused);
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
    let stderr = stderr(&output);
    if output.status.success() {
        let line = &lines(&output)[0];
        assert_eq!((line["policy"].as_str(), line["ooms"].as_u64()), (Some("paged (vulkan)"), Some(0)), "{line}");
    } else {
        // Asked for `paged` alone: the reason is the command's error, and nothing is printed.
        assert!(
            stderr.contains("the paged contender needs a virtual range of at least 12.")
                && stderr.contains("sparseAddressSpaceSize")
                && stderr.contains("without --vulkan for the simulated paged contender"),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(output.stdout.is_empty(), "{}", stdout(&output));
    }
}

/// A budget smaller than a page (`--budget 0`) bounds every contender but PyTorch's emulation on the device too:
/// `paged`'s sparse buffer is at least one page long (its range was 4 B, refused, and the whole run with it), so its
/// row refuses every request as the simulated one does, and the other rows are there.
#[test]
fn a_budget_below_a_page_is_a_row_of_refusals_on_the_device() {
    let file = crate::common::trace("pytorch/frag_oom-default.pickle.gz");
    let file = file.to_str().unwrap();
    for budget in ["0", "1000"] {
        let Some(output) = on_device(&["replay", file, "--json", "--budget", budget, "--policy", "tlsf", "--policy", "paged"])
        else {
            return;
        };
        assert!(output.status.success(), "--budget {budget}: {}", stderr(&output));
        let rows = lines(&output);
        assert_eq!(rows.len(), 2, "--budget {budget}: {rows:?}");
        for row in &rows {
            assert_eq!((row["allocs"].as_u64(), row["peak_reserved_bytes"].as_u64()), (Some(0), Some(0)), "{row}");
            assert!(row["ooms"].as_u64() > Some(0), "{row}");
        }
    }
}

/// The default set on the device, on a trace `paged` cannot take on a small device (the GPT-2 trace, 12.7 GiB
/// live at once, against lavapipe's 2 GiB of sparse address space): every other contender's row is there, and
/// `paged`'s says why it did not run — the limit, and what to do — in the table and in `--json` (`not_run`);
/// the command succeeds.
#[test]
fn the_default_set_runs_the_others_when_paged_cannot() {
    let trace = gpt2();
    let Some(json) = on_device(&["replay", &trace, "--json"]) else { return };
    let replays = lines(&json);
    let policies: Vec<&str> = replays.iter().map(|line| line["policy"].as_str().unwrap()).collect();
    assert_eq!(
        policies,
        [
            "pytorch (vulkan)",
            "tlsf (vulkan)",
            "best-fit (vulkan)",
            "first-fit (vulkan)",
            "buddy (vulkan)",
            "paged (vulkan)",
            "gpu-allocator (vulkan)",
            "vma (vulkan)"
        ]
    );
    let paged = &replays[5];
    let ran: Vec<&Value> = replays.iter().filter(|line| line["not_run"].is_null()).collect();
    if paged["not_run"].is_null() {
        // A device with room for the range runs it like the others.
        assert_eq!(ran.len(), 8);
    } else {
        let reason = paged["not_run"].as_str().unwrap();
        for expected in
            ["needs a virtual range of at least 12.", "sparseAddressSpaceSize", "--capacity", "more sparse address space"]
        {
            assert!(reason.contains(expected), "{expected:?} in {reason}");
        }
        assert_eq!((paged["events"].as_u64(), paged["allocs"].as_u64()), (Some(0), Some(0)), "{paged}");
        assert_eq!(ran.len(), 7);
    }
    for line in ran {
        assert_eq!((line["allocs"].as_u64(), line["ooms"].as_u64()), (Some(6179), Some(0)), "{line}");
    }
    // The table: a row per contender, `paged`'s with the reason.
    let table = on_device(&["replay", &trace]).unwrap();
    assert!(table.status.success(), "{}", stderr(&table));
    let stdout = stdout(&table);
    for policy in policies {
        assert!(stdout.lines().any(|line| line.starts_with(policy)), "{policy}: {stdout}");
    }
    if !paged["not_run"].is_null() {
        let row = stdout.lines().find(|line| line.starts_with("paged (vulkan)")).unwrap();
        assert!(row.contains("not run on this device: the paged contender needs a virtual range"), "{row}");
    }
}

/// A recorded PyTorch snapshot through `pytorch` on device memory: the out-of-memory PyTorch had (entry 100, a
/// 1 GiB request, fragmentation) with every segment event and placement as recorded, the same numbers as the
/// simulated contender; `compare` names it in its verdict.
#[test]
fn pytorch_on_the_device_reproduces_a_snapshot() {
    let file = crate::common::trace("pytorch/frag_oom-default.pickle.gz");
    let file = file.to_str().unwrap();
    let args = ["replay", file, "--capacity", "3584MiB", "--json", "--policy", "pytorch"];
    let Some(output) = on_device(&args) else { return };
    let on_device = &lines(&output)[0];
    let simulated = &lines(&heapscope(&args))[0];
    assert_eq!(on_device["policy"], "pytorch (vulkan)");
    for key in ["allocs", "ooms", "peak_live_bytes", "peak_reserved_bytes", "device_allocs", "first_oom", "fidelity"] {
        assert_eq!(on_device[key], simulated[key], "{key}");
    }
    let oom = &on_device["first_oom"];
    assert_eq!((oom["event_index"].as_u64(), oom["verdict"].as_str()), (Some(100), Some("fragmentation")), "{oom}");
    let compare = on_device_compare(file);
    assert!(compare.contains("`pytorch (vulkan)` ran out of memory on a 1.00 GiB request"), "{compare}");
}

fn on_device_compare(file: &str) -> String {
    let output = on_device(&["compare", file, "--capacity", "3584MiB", "--policy", "pytorch", "--policy", "tlsf"]).unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    // The validation layer's count is the table's last line (issue 17: it used to be never read).
    assert!(stdout(&output).trim_end().ends_with("validation: 0 message(s)"), "{}", stdout(&output));
    stdout(&output)
}

/// Issue 17: 32 GiB in one allocation, more than lavapipe's memory heap: every device heap refuses it as out of
/// memory (it used to be "served" by an invalid `vkAllocateMemory`), validation silent.
#[test]
fn an_allocation_larger_than_the_memory_heap_is_refused_on_the_device() {
    let dir = crate::common::temp_dir("over-heap");
    let big = dir.join("big.csv");
    std::fs::write(&big, "a,1,34359738368\nf,1\n").unwrap();
    let big = big.to_str().unwrap();
    let Some(output) = on_device(&["replay", big, "--json", "--policy", "tlsf", "--policy", "vma", "--policy", "gpu-allocator"])
    else {
        return;
    };
    for line in lines(&output) {
        if line["policy"] == "tlsf (vulkan)" {
            // Its one block would be past the device's largest allocation before it is past the heap: not run here.
            let why = line["not_run"].as_str().unwrap_or_default();
            assert!(why.contains("exceeds the device's largest allocation (maxMemoryAllocationSize"), "{line}");
            continue;
        }
        assert_eq!((line["allocs"].as_u64(), line["ooms"].as_u64()), (Some(0), Some(1)), "{line}");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A request past the device's largest allocation (lavapipe's `maxMemoryAllocationSize` is 2 GiB) but within its heap:
/// the heap contenders and `pytorch`, whose one block or segment it would need, are rows that say so (they read as
/// fragmentation of 22 GiB free, and `pytorch`'s as a pool of 2^64 - 1 bytes out of pages); gpu-allocator and VMA ask the
/// driver, and run.
#[test]
fn a_request_past_the_largest_allocation_is_a_row_that_says_so() {
    let dir = crate::common::temp_dir("past-largest-allocation");
    let file = dir.join("big.csv");
    // Half again the device's largest allocation (lavapipe: 3 GiB), then a request within it.
    let Some((largest_bytes, _)) = crate::common::device_largest_allocation() else { return };
    let request_bytes = largest_bytes + largest_bytes / 2;
    std::fs::write(&file, format!("a,1,{request_bytes}\nf,1\na,2,1GiB\n")).unwrap();
    let file = file.to_str().unwrap();
    let request = heapscope_core::units::exact_size(request_bytes);
    let args = ["replay", file, "--json", "--policy", "tlsf", "--policy", "buddy", "--policy", "pytorch", "--policy", "vma"];
    let Some(output) = on_device(&args) else { return };
    for line in lines(&output).iter().filter(|line| line["policy"].is_string()) {
        let why = line["not_run"].as_str().unwrap_or_default();
        match line["policy"].as_str().unwrap() {
            "tlsf (vulkan)" => assert!(
                why.starts_with(&format!("not run on this device: its largest request, {request} ("))
                    && why.contains("as a block), exceeds the device's largest "),
                "{line}"
            ),
            "buddy (vulkan)" => assert!(why.contains("as a buddy's power of two), exceeds"), "{line}"),
            policy if policy.starts_with("pytorch") => assert!(why.contains("as PyTorch's segment), exceeds"), "{line}"),
            _ => assert!(line["not_run"].is_null(), "{line}"),
        }
    }
    // Under a capacity it passes, the request is an out of memory as without the device, and the row runs.
    let Some(output) = on_device(&["replay", file, "--json", "--policy", "tlsf", "--capacity", "1GiB"]) else { return };
    let tlsf = &lines(&output)[0];
    assert_eq!((tlsf["not_run"].as_str(), tlsf["ooms"].as_u64(), tlsf["allocs"].as_u64()), (None, Some(1), Some(1)), "{tlsf}");
    std::fs::remove_dir_all(dir).ok();
}

/// More live sparse mappings than a CPU device holds (lavapipe's limit, 16,384): `paged`'s row says so and the other
/// contenders' rows stand (the whole command failed, the others' results thrown away).
#[test]
fn too_many_live_mappings_is_a_row_that_says_so() {
    let dir = crate::common::temp_dir("many-mappings");
    let file = dir.join("scattered.csv");
    // 40,000 live 4 KiB allocations, every other one freed (20,000 scattered pages), then a bind past the limit.
    let mut text: String = (0..40_000).map(|id| format!("a,{id},4096\n")).collect();
    text.extend((0..40_000).step_by(2).map(|id| format!("f,{id}\n")));
    text.push_str("a,40000,1MiB\na,40001,4096\n");
    std::fs::write(&file, text).unwrap();
    let file = file.to_str().unwrap();
    // Without the validation layer: it checks each of the 20,000 binds (seven minutes on lavapipe, ten seconds without);
    // the other tests validate paged's binds.
    let output = crate::common::output(
        crate::common::binary().args(["replay", file, "--json", "--policy", "tlsf", "--policy", "paged", "--vulkan"]),
    );
    if !output.status.success() && stderr(&output).contains("bringing up the Vulkan device") && !gpu_required() {
        eprintln!("skipped: {}", stderr(&output));
        return;
    }
    assert!(output.status.success(), "{}", stderr(&output));
    let lines = lines(&output);
    let tlsf = lines.iter().find(|line| line["policy"] == "tlsf (vulkan)").unwrap();
    assert_eq!((tlsf["allocs"].as_u64(), tlsf["ooms"].as_u64()), (Some(40_002), Some(0)), "{tlsf}");
    let paged = lines.iter().find(|line| line["policy"] == "paged (vulkan)").unwrap();
    // The limit holds on a CPU device only (lavapipe's mmap per bind); a GPU's run completes.
    let cpu_device = crate::common::device_largest_allocation().is_some_and(|(_, kind)| kind == "CPU");
    if cpu_device {
        let why = paged["not_run"].as_str().unwrap_or_default();
        assert!(why.contains("past a limit of the device: too many sparse mappings"), "{paged}");
    } else {
        assert_eq!((paged["not_run"].as_str(), paged["ooms"].as_u64()), (None, Some(0)), "{paged}");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// gpu-allocator under a cap smaller than its block: the refusal is the block it would reserve, not fragmentation of a
/// heap that holds nothing.
#[test]
fn gpu_allocator_refused_for_its_block_says_so() {
    let dir = crate::common::temp_dir("gpu-allocator-block");
    let file = dir.join("three.csv");
    std::fs::write(&file, "a,1,3MiB\n").unwrap();
    let file = file.to_str().unwrap();
    let Some(output) = on_device(&["replay", file, "--json", "--policy", "gpu-allocator", "--capacity", "3MiB"]) else { return };
    let line = &lines(&output)[0];
    let oom = &line["first_oom"];
    assert_eq!(line["ooms"], 1, "{line}");
    assert_ne!(oom["verdict"], "fragmentation", "{line}");
    assert!(oom["needed_bytes"].as_u64().unwrap() > 3 * MIB, "the block it would reserve: {line}");
    std::fs::remove_dir_all(dir).ok();
}

/// The frag_oom story at a quarter of its size (20 x 37.5 MiB allocated and freed, 20 x 25 MiB, then 256 MiB,
/// within 896 MiB): best fit in blocks configured like PyTorch's fails with fragmentation on device memory,
/// `paged` on the sparse buffer serves everything with either unmap rule, and every contender stays within the
/// capacity; `compare` says so in one sentence.
#[test]
fn frag_oom_on_the_device_paged_serves_what_blocks_cannot() {
    let dir = crate::common::temp_dir("vulkan-replay");
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
    // Under pressure the freed pages stay bound for the 25 MiB allocations: fewer binds, the same peak. (The heap
    // rules change no `paged`: refused beside it alone.)
    let pressure =
        on_device(&["replay", csv, "--json", "--policy", "paged", "--paged-unmap", "pressure", "--capacity", "896MiB"]);
    let pressure = &lines(&pressure.unwrap())[0];
    assert_eq!((pressure["ooms"].as_u64(), pressure["peak_reserved_bytes"].as_u64()), (Some(0), Some(756 * MIB)), "{pressure}");
    assert!(pressure["device_allocs"].as_u64() < paged["device_allocs"].as_u64(), "{pressure} vs {paged}");
    let compare = on_device(&[&["compare", csv][..], &rules, &["--policy", "best-fit", "--policy", "paged"]].concat()).unwrap();
    let stdout = stdout(&compare);
    assert!(
        stdout.contains("`best-fit (vulkan)` ran out of memory on a 256.00 MiB request")
            && stdout.contains("`paged (vulkan)` would have served it"),
        "{stdout}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Device contenders serve the same stream as the simulated ones on a recording begun mid-run: the start state first
/// (written here: the GPT-2 snapshot with the first half of its trace cut), so every one peaks at the same live bytes.
#[test]
fn device_contenders_replay_a_mid_run_recording_from_its_start() {
    let dir = crate::common::temp_dir("vulkan-mid-run");
    let mut snapshot =
        heapscope_pytorch::read_snapshot(&crate::common::trace("pytorch/gpt2_train_fixed-default.pickle.gz")).unwrap();
    let entries = snapshot.device_traces[0].len();
    snapshot.device_traces[0].drain(..entries / 2);
    let path = dir.join("mid-run.pickle");
    heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
    let file = path.to_str().unwrap();
    let args = ["replay", file, "--json", "--policy", "pytorch", "--policy", "tlsf", "--policy", "vma"];
    let Some(output) = on_device(&args) else { return };
    assert!(output.status.success(), "{}", stderr(&output));
    let on_device = lines(&output);
    let simulated = lines(&heapscope(&["replay", file, "--json", "--policy", "pytorch"]));
    assert_eq!(on_device.len(), 3);
    for line in &on_device {
        assert!(line["not_run"].is_null() && line["ooms"] == 0, "{line}");
        assert_eq!(line["peak_live_bytes"], simulated[0]["peak_live_bytes"], "the same stream: {line}");
    }
}

/// `--progress` on a log (stderr no terminal): a line as each contender starts on the device and one when it is done,
/// on stderr only — standard output, JSON or table, is what it is without the flag; without the flag a log gets none.
#[test]
fn replay_on_the_device_says_its_progress_on_stderr_only() {
    let dir = crate::common::temp_dir("vulkan-progress");
    let path = dir.join("churn.csv");
    let events: String = (0..400)
        .map(|id| {
            format!("a,{id},{}\n{}", 4096 * (1 + id % 7), if id % 2 == 1 { format!("f,{}\n", id - 1) } else { String::new() })
        })
        .collect();
    std::fs::write(&path, events).unwrap();
    let file = path.to_str().unwrap();
    let args = ["replay", file, "--json", "--policy", "tlsf", "--policy", "paged"];
    let Some(quiet) = on_device(&args) else { return };
    let Some(shown) = on_device(&[&args[..], &["--progress"]].concat()) else { return };
    assert!(quiet.status.success() && shown.status.success(), "{}{}", stderr(&quiet), stderr(&shown));
    assert!(!stderr(&quiet).contains("progress:"), "{}", stderr(&quiet));
    let progress = stderr(&shown);
    for line in [
        "progress: tlsf on the device (contender 1 of 2): 600 events",
        "progress: tlsf on the device: done in ",
        "progress: paged on the device (contender 2 of 2): 600 events",
        "progress: paged on the device: done in ",
    ] {
        assert!(progress.contains(line), "{line:?} missing from {progress}");
    }
    let without_timing = |output: &Output| -> Vec<Value> {
        lines(output)
            .into_iter()
            .map(|mut line| {
                line.as_object_mut().unwrap().remove("ns_per_event");
                line
            })
            .collect()
    };
    assert_eq!(without_timing(&shown), without_timing(&quiet), "standard output changed");
    let table = on_device(&["replay", file, "--policy", "tlsf", "--progress"]).unwrap();
    assert!(stdout(&table).lines().all(|line| !line.starts_with("progress:")), "{}", stdout(&table));
    assert!(stderr(&table).contains("progress: tlsf on the device (contender 1 of 1)"), "{}", stderr(&table));
    // A contender the device cannot run (paged: 3 GiB live, past lavapipe's 2 GiB of sparse address space) is said not
    // run, as its row says, not failed.
    let large = dir.join("large.csv");
    std::fs::write(&large, "a,1,3GiB\nf,1\n").unwrap();
    let args = ["replay", large.to_str().unwrap(), "--policy", "paged", "--policy", "tlsf", "--progress"];
    let output = on_device(&args).unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    if stdout(&output).contains("not run") {
        assert!(stderr(&output).contains("progress: paged on the device: not run in "), "{}", stderr(&output));
    }
    assert!(!stderr(&output).contains("failed in"), "{}", stderr(&output));
    std::fs::remove_dir_all(dir).ok();
}

/// `--compact on-oom` on the device: the scattered heap of eight 60 MiB allocations (every other one freed) refuses
/// 200 MiB; compacting moves four allocations' bytes within and between device blocks (`vkCmdCopyBuffer`, validated), and the
/// request is served; the row says how long the copies took.
#[test]
fn compacting_on_a_refusal_copies_on_the_device() {
    let file = crate::common::scattered_trace("compact-vulkan");
    let path = file.to_str().unwrap();
    let args = [
        "replay",
        path,
        "--capacity",
        "512MiB",
        "--policy",
        "tlsf",
        "--policy",
        "first-fit",
        "--fixed-blocks",
        "--compact",
        "on-oom",
    ];
    let Some(output) = on_device(&[&args[..], &["--json"]].concat()) else { return };
    assert!(output.status.success(), "{}", stderr(&output));
    for line in lines(&output) {
        assert_eq!(line["ooms"].as_u64(), Some(0), "{line}");
        let compaction = &line["compaction"];
        assert_eq!((compaction["moves"].as_u64(), compaction["bytes_moved"].as_u64()), (Some(4), Some(240 * MIB)), "{line}");
        assert_eq!(compaction["ooms_avoided"].as_u64(), Some(1), "{line}");
        assert!(compaction["device_copy_ns"].as_u64() > Some(0), "{line}");
    }
    let Some(table) = on_device(&args) else { return };
    assert!(stdout(&table).contains("compaction: 4 moves, 240.00 MiB copied on the device in"), "{}", stdout(&table));
}

/// `--compact on-oom` for `paged` on the device, in a sparse buffer of 512 MiB: the scattered trace's 200 MiB request
/// finds no run of the buffer; compacting rebinds three allocations' pages lower in the buffer (`vkQueueBindSparse`,
/// validated) with nothing copied, and the request is served.
#[test]
fn paged_compacts_on_the_device_by_rebinding_pages() {
    let file = crate::common::scattered_trace("compact-paged-vulkan");
    let path = file.to_str().unwrap();
    let args = ["replay", path, "--capacity", "512MiB", "--policy", "paged", "--virtual-size", "512MiB", "--json"];
    let Some(without) = on_device(&args) else { return };
    assert_eq!(lines(&without)[0]["ooms"].as_u64(), Some(1), "{}", stdout(&without));
    let Some(output) = on_device(&[&args[..], &["--compact", "on-oom"]].concat()) else { return };
    assert!(output.status.success(), "{}", stderr(&output));
    let line = &lines(&output)[0];
    assert_eq!(line["ooms"].as_u64(), Some(0), "{line}");
    let compaction = &line["compaction"];
    assert_eq!((compaction["bytes_moved"].as_u64(), compaction["bytes_remapped"].as_u64()), (Some(0), Some(180 * MIB)), "{line}");
    assert_eq!(compaction["ooms_avoided"].as_u64(), Some(1), "{line}");
    let too_large = on_device(&["replay", path, "--policy", "paged", "--virtual-size", "1TiB"]).unwrap();
    assert!(stderr(&too_large).contains("the device's sparse buffers hold at most"), "{}", stderr(&too_large));
}

/// VMA's own defragmentation beside heapscope's compaction, same run, same device: 48 allocations of 5 MiB under a
/// 256 MiB budget, every other one freed, then 100 MiB. Both refuse it for fragmentation and compact on the refusal:
/// VMA (`vmaBeginDefragmentation`, full) moves allocations with copies on the device and frees blocks it emptied;
/// `tlsf`'s compaction serves the request.
#[test]
fn vma_defragments_beside_heapscope_compaction() {
    let dir = crate::common::temp_dir("vma-defrag");
    let file = dir.join("holes.csv");
    let mut csv = String::from("# 48 x 5 MiB, every other one freed, then 100 MiB\n");
    for id in 0..48 {
        csv.push_str(&format!("a,{id},{}\n", 5 * MIB));
    }
    for id in (1..48).step_by(2) {
        csv.push_str(&format!("f,{id}\n"));
    }
    csv.push_str(&format!("a,48,{}\n", 100 * MIB));
    std::fs::write(&file, csv).unwrap();
    let path = file.to_str().unwrap();
    let args = ["replay", path, "--capacity", "256MiB", "--policy", "vma", "--policy", "tlsf", "--compact", "on-oom", "--json"];
    let Some(output) = on_device(&args) else { return };
    assert!(output.status.success(), "{}", stderr(&output));
    let rows = lines(&output);
    let (vma, tlsf) = (&rows[0], &rows[1]);
    assert_eq!(vma["first_oom"]["verdict"].as_str(), Some("fragmentation"), "{vma}");
    let defrag = &vma["compaction"];
    assert!(defrag["moves"].as_u64() > Some(0) && defrag["bytes_moved"].as_u64() > Some(0), "{vma}");
    assert!(defrag["device_copy_ns"].as_u64() > Some(0), "{vma}");
    assert_eq!((tlsf["ooms"].as_u64(), tlsf["compaction"]["ooms_avoided"].as_u64()), (Some(0), Some(1)), "{tlsf}");
    std::fs::remove_dir_all(dir).ok();
}

/// Moves copy whole 4-byte words only where the heap's alignment makes every offset and size a multiple of 4: with
/// `--min-align 1` a 1001-byte allocation moved down within its block copies exactly its bytes (whole words read as a
/// copy overlapping itself, and could have written over a neighbour).
#[test]
fn moves_at_byte_alignment_copy_exactly_their_bytes() {
    let dir = crate::common::temp_dir("byte-aligned-moves");
    let file = dir.join("odd.csv");
    std::fs::write(&file, "a,0,1001\na,1,1001\nf,0\na,2,8\nf,1\nf,2\n").unwrap();
    let file = file.to_str().unwrap();
    let args = ["replay", file, "--json", "--policy", "first-fit", "--min-align", "1", "--align", "1", "--compact", "every:3"];
    let Some(output) = on_device(&args) else { return };
    assert!(output.status.success(), "{}", stderr(&output));
    let line = &lines(&output)[0];
    assert!(line["compaction"]["moves"].as_u64().unwrap() > 0, "{line}");
    assert_eq!(line["ooms"], 0, "{line}");
    std::fs::remove_dir_all(dir).ok();
}

/// gpu-allocator reserves blocks of one size (256 MiB for device memory): a 1 MiB request on a 100 MiB device is refused
/// for the new block it needs, and every form says so, never that the request was rounded to 256 MiB.
#[test]
fn a_refusal_for_a_new_block_names_the_block() {
    let dir = crate::common::temp_dir("vulkan-new-block");
    let path = dir.join("one.csv");
    std::fs::write(&path, "a,1,1MiB\nf,1\n").unwrap();
    let file = path.to_str().unwrap();
    let args = ["compare", file, "--capacity", "100MiB", "--policy", "gpu-allocator"];
    let Some(table) = on_device(&args) else { return };
    let said = stdout(&table);
    assert!(said.contains("1.00 MiB (which needs a new block of 256.00 MiB)"), "{said}");
    assert!(said.contains("enough for the request as asked but not for the new 256.00 MiB block it needed"), "{said}");
    assert!(!said.contains("256.00 MiB once rounded"), "{said}");
    let json = on_device(&["replay", file, "--capacity", "100MiB", "--policy", "gpu-allocator", "--json"]).unwrap();
    let line = &lines(&json)[0];
    assert_eq!(line["first_oom"]["new_block_bytes"].as_u64(), Some(256 << 20), "{line}");
    assert_eq!(line["first_oom"]["needed_bytes"].as_u64(), Some(256 << 20), "{line}");
    std::fs::remove_dir_all(dir).ok();
}
