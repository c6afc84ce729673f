//! `heapscope bench` end to end, through the built binary. On a Vulkan device (lavapipe in CI, validation layer
//! on: any message fails the command), directly or through wgpu, the kernels fill, compute on and verify every
//! allocation; without one the command falls back to the simulated backend (or `--backend wgpu` fails and its
//! tests skip), unless `HEAPSCOPE_REQUIRE_GPU=1` makes that a failure.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::process::Output;

use crate::common::{gpu_required, json_lines, stderr, stdout};
use serde_json::Value;

/// Runs the binary with `args`, validation on.
fn heapscope(args: &[&str]) -> Output {
    crate::common::output(crate::common::binary().args(args).env("HEAPSCOPE_VALIDATION", "1"))
}

fn by_policy<'a>(lines: &'a [Value], policy: &str) -> &'a Value {
    lines.iter().find(|line| line["policy"] == policy).unwrap_or_else(|| panic!("no line for {policy}: {lines:?}"))
}

const KEYS: [&str; 10] = [
    "policy",
    "workload",
    "backend",
    "peak_live_bytes",
    "peak_reserved_bytes",
    "ooms",
    "first_oom",
    "mismatches",
    "allocs_per_sec",
    "wall_ms",
];

/// Every key of the issue, and numbers that agree with each other.
fn check_line(line: &Value) {
    for key in KEYS {
        assert!(line.get(key).is_some(), "{key} missing: {line}");
    }
    let (live, reserved) = (line["peak_live_bytes"].as_u64().unwrap(), line["peak_reserved_bytes"].as_u64().unwrap());
    assert!(live > 0 && reserved >= live, "{line}");
    if let Some(budget) = line["budget_bytes"].as_u64() {
        assert!(reserved <= budget, "{line}");
    }
    let ratio = line["reserved_over_live"].as_f64().unwrap();
    assert!((ratio - reserved as f64 / live as f64).abs() < 1e-9, "{line}");
    let ooms = line["ooms"].as_u64().unwrap();
    assert_eq!(ooms == 0, line["first_oom"].is_null(), "{line}");
    let (allocs, wall_ms) = (line["allocs"].as_f64().unwrap(), line["wall_ms"].as_f64().unwrap());
    let rate = line["allocs_per_sec"].as_f64().unwrap();
    assert!(wall_ms > 0.0 && (rate * wall_ms / 1000.0 - allocs).abs() <= allocs * 1e-6 + 1e-6, "{line}");
    assert_eq!(line["mismatches"], 0, "{line}");
}

/// The serve story: `pytorch` runs out of memory from internal waste (a 20 MiB segment for a 2 MiB block), `paged` completes, no kernel mismatch, and
/// `sim` agrees with `device` on who runs out of memory, when, and on every byte count.
fn check_serve_story(device: &[Value], sim: &[Value]) {
    assert_eq!((device.len(), sim.len()), (2, 2));
    for line in device.iter().chain(sim) {
        check_line(line);
        assert!(line["workload"].as_str().unwrap().starts_with("serve (paged KV, 16 tokens a block"), "{line}");
        assert_eq!(line["budget_bytes"], 160 << 20, "the serve default budget");
    }
    for lines in [device, sim] {
        let (pytorch, paged) = (by_policy(lines, "pytorch"), by_policy(lines, "paged"));
        assert!(pytorch["ooms"].as_u64().unwrap() > 0, "{pytorch}");
        assert_eq!(pytorch["first_oom"]["verdict"], "internal_waste", "{pytorch}");
        assert_eq!(pytorch["first_oom"]["needed_bytes"], 20 << 20, "{pytorch}");
        assert_eq!(paged["ooms"], 0, "{paged}");
    }
    if device[0]["backend"] != "sim" {
        for line in device {
            assert_eq!(line["kernels_ran"], true, "{line}");
            assert!(line["bytes_verified"].as_u64().unwrap() > 500 << 20, "{line}");
        }
    }
    assert!(sim.iter().all(|line| line["backend"] == "sim" && line["kernels_ran"] == false && line["adapter"].is_null()));
    for policy in ["pytorch", "paged"] {
        let (on_device, simulated) = (by_policy(device, policy), by_policy(sim, policy));
        for key in ["ooms", "allocs", "frees", "peak_live_bytes", "peak_reserved_bytes", "first_oom"] {
            assert_eq!(on_device[key], simulated[key], "{policy}: {key}");
        }
    }
}

const SERVE: [&str; 8] = ["bench", "--workload", "serve", "--policy", "pytorch", "--policy", "paged", "--json"];

fn serve_with(extra: &[&str]) -> Output {
    heapscope(&[&SERVE[..], extra].concat())
}

/// The acceptance test of the issue: `serve` with paged KV blocks (the default) under its default budget — on
/// lavapipe with validation on — `paged` completes where `pytorch` runs out of memory from internal waste, with no
/// kernel mismatch; `--backend sim` agrees on who runs out of memory, when, and on every byte count.
#[test]
fn serve_paged_completes_where_pytorch_runs_out() {
    let device = json_lines(&serve_with(&[]));
    let sim = json_lines(&serve_with(&["--backend", "sim"]));
    let backend = device[0]["backend"].as_str().unwrap();
    assert!(backend == "vulkan" || !gpu_required(), "HEAPSCOPE_REQUIRE_GPU=1 but the bench ran on {backend}");
    if backend == "vulkan" {
        assert_eq!(device[0]["adapter"]["api"], "vulkan", "{}", device[0]);
    }
    check_serve_story(&device, &sim);
}

/// `--compact on-oom` on the device: churn in 8 MiB blocks under 72 MiB, where the heap policies run out of memory
/// from fragmentation without it; compacting serves those requests (the device copying every move between blocks,
/// validation on), the kernels find every moved allocation's pattern where it went (0 mismatches), and `--backend
/// sim` makes the same moves.
#[test]
fn compacting_serves_churn_with_every_moved_allocation_verified() {
    let args = [
        "bench",
        "--workload",
        "churn",
        "--steps",
        "600",
        "--policy",
        "tlsf",
        "--policy",
        "first-fit",
        "--budget",
        "72MiB",
        "--block-size",
        "8MiB",
        "--fixed-blocks",
        "--json",
    ];
    let without = json_lines(&heapscope(&args));
    let device = json_lines(&heapscope(&[&args[..], &["--compact", "on-oom"]].concat()));
    let sim = json_lines(&heapscope(&[&args[..], &["--compact", "on-oom", "--backend", "sim"]].concat()));
    let backend = device[0]["backend"].as_str().unwrap();
    assert!(backend == "vulkan" || !gpu_required(), "HEAPSCOPE_REQUIRE_GPU=1 but the bench ran on {backend}");
    for policy in ["tlsf", "first-fit"] {
        let (before, after, simulated) = (by_policy(&without, policy), by_policy(&device, policy), by_policy(&sim, policy));
        check_line(after);
        assert!(before["ooms"].as_u64() > Some(0), "{policy} fragments without compacting: {before}");
        assert_eq!(before["compaction"], Value::Null, "{before}");
        let compaction = &after["compaction"];
        assert_eq!(after["ooms"], 0, "{after}");
        assert!(compaction["moves"].as_u64() > Some(0) && compaction["ooms_avoided"].as_u64() > Some(0), "{after}");
        for key in ["moves", "bytes_moved", "ooms_avoided"] {
            assert_eq!(compaction[key], simulated["compaction"][key], "{policy}: the device makes the simulation's moves");
        }
        assert_eq!(simulated["compaction"]["device_copy_ns"], Value::Null, "nothing to copy on sim");
        if backend == "vulkan" {
            assert_eq!(after["kernels_ran"], true, "{after}");
            assert!(compaction["device_copy_ns"].as_u64() > Some(0), "the copies' time on the device: {after}");
        }
    }
    // Through wgpu: the arenas copy the moves with `copy_buffer_to_buffer`, and the kernels find them intact.
    let output = heapscope(&[&args[..], &["--compact", "on-oom", "--backend", "wgpu"]].concat());
    if !output.status.success() && !gpu_required() {
        eprintln!("skipped wgpu: {}", stderr(&output));
        return;
    }
    // Every move counted, an allocation moved twice too (the arenas listed each once: 109 of tlsf's 156).
    for line in json_lines(&output) {
        check_line(&line);
        assert_eq!(line["ooms"], 0, "{line}");
        let policy = line["policy"].as_str().unwrap();
        assert!(line["compaction"]["moves"].as_u64() > Some(0), "{line}");
        for key in ["moves", "bytes_moved", "ooms_avoided"] {
            assert_eq!(line["compaction"][key], by_policy(&sim, policy)["compaction"][key], "{policy}: {line}");
        }
    }
}

/// The same story through wgpu: on a Vulkan adapter wgpu runs on heapscope's own Vulkan device, so `paged` (sparse
/// binding) runs there too, the kernels verify everything through wgpu, and the numbers are the simulation's.
#[test]
fn serve_through_wgpu_agrees_with_the_simulation() {
    let output = serve_with(&["--backend", "wgpu"]);
    if !output.status.success() && !gpu_required() {
        eprintln!("skipped: no wgpu device ({})", stderr(&output));
        return;
    }
    let device = json_lines(&output);
    for line in &device {
        assert_eq!(line["backend"], "wgpu", "{line}");
        assert!(line["adapter"]["name"].as_str().is_some_and(|name| !name.is_empty()), "{line}");
    }
    let sim = json_lines(&serve_with(&["--backend", "sim"]));
    if device[0]["adapter"]["api"] != "vulkan" {
        // Metal, DX12: no sparse binding reaches wgpu, so paged is reported as not run; pytorch still agrees.
        assert!(by_policy(&device, "paged")["not_run"].as_str().unwrap().contains("sparse binding"));
        let (on_device, simulated) = (by_policy(&device, "pytorch"), by_policy(&sim, "pytorch"));
        check_line(on_device);
        for key in ["ooms", "allocs", "frees", "peak_live_bytes", "peak_reserved_bytes", "first_oom"] {
            assert_eq!(on_device[key], simulated[key], "pytorch: {key}");
        }
        return;
    }
    for line in &device {
        assert_eq!(line["adapter"]["heapscope_vulkan_device"], true, "a Vulkan adapter: wgpu on heapscope's device: {line}");
    }
    check_serve_story(&device, &sim);
}

/// Plain wgpu (`--plain-wgpu`): the contenders that need sparse binding are reported as not run, with the reason
/// and what to use instead; the others run and verify clean. The table says so too.
#[test]
fn plain_wgpu_reports_paged_as_not_run() {
    let args = ["bench", "--workload", "churn", "--steps", "300", "--backend", "wgpu", "--plain-wgpu", "--policy", "tlsf"];
    let output = heapscope(&[&args[..], &["--policy", "paged", "--json"]].concat());
    if !output.status.success() && !gpu_required() {
        eprintln!("skipped: no wgpu device ({})", stderr(&output));
        return;
    }
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let (tlsf, paged) = (by_policy(&lines, "tlsf"), by_policy(&lines, "paged"));
    check_line(tlsf);
    assert_eq!((tlsf["kernels_ran"].as_bool(), tlsf["adapter"]["heapscope_vulkan_device"].as_bool()), (Some(true), Some(false)));
    let why = paged["not_run"].as_str().unwrap();
    assert!(why.contains("sparse binding") && why.contains("--backend vulkan"), "{why}");
    assert!(paged.get("peak_live_bytes").is_none(), "{paged}");
    // Nothing runs: an error, not an empty success.
    let output =
        heapscope(&["bench", "--workload", "churn", "--steps", "50", "--backend", "wgpu", "--plain-wgpu", "--policy", "paged"]);
    assert!(!output.status.success());
    let text = stdout(&output);
    assert!(text.contains("plain wgpu (--plain-wgpu: paged and pytorch-expandable do not run)"), "{text}");
    assert!(text.lines().any(|line| line.starts_with("paged ") && line.contains("not run: paged maps pages")), "{text}");
    assert!(stderr(&output).contains("no contender could run"), "{}", stderr(&output));
}

/// The table says what ran where, the budget and its story, and the verdict in one sentence.
#[test]
fn the_table_tells_the_story() {
    let output = heapscope(&["bench", "--workload", "serve", "--backend", "sim", "--policy", "pytorch", "--policy", "paged"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    for expected in [
        "workload: serve (paged KV",
        "backend: sim (asked): no device, kernels skipped, so mismatches are 0 by construction",
        "budget: 160.00 MiB (the default: with paged KV blocks, pytorch needs a 20 MiB segment",
        "first out of memory:",
        "Internal waste:",
        "pytorch ran out of memory from internal waste where paged completed.",
    ] {
        assert!(text.contains(expected), "{expected:?} in:\n{text}");
    }
    assert!(text.lines().any(|line| line.starts_with("paged ") && line.contains(" 0 ")), "{text}");
}

/// The two remedies of `train`, simulated: batch 8 runs out of memory under the default budget; checkpointing or
/// batch 4 fit, with a lower peak.
#[test]
fn train_knobs_change_the_outcome() {
    let run = |extra: &[&str]| {
        let mut args = vec!["bench", "--workload", "train", "--backend", "sim", "--policy", "pytorch", "--json"];
        args.extend_from_slice(extra);
        json_lines(&heapscope(&args)).remove(0)
    };
    let default = run(&[]);
    let checkpointed = run(&["--checkpointing"]);
    let half = run(&["--batch", "4"]);
    assert!(default["ooms"].as_u64().unwrap() > 0, "{default}");
    for line in [&checkpointed, &half] {
        check_line(line);
        assert_eq!(line["ooms"], 0, "{line}");
        assert!(line["peak_live_bytes"].as_u64() < default["peak_live_bytes"].as_u64(), "{line}");
    }
    assert!(checkpointed["workload"].as_str().unwrap().contains("checkpointing"));
    assert!(half["workload"].as_str().unwrap().starts_with("train (batch 4"));
}

/// A PyTorch snapshot replayed (sizes / 16), every allocation filled and verified on the device.
#[test]
fn replay_a_snapshot_on_the_device() {
    let file = crate::common::trace("pytorch/frag_oom-default.pickle.gz");
    let output = heapscope(&[
        "bench",
        "--workload",
        "replay",
        file.to_str().unwrap(),
        "--scale",
        "16",
        "--policy",
        "tlsf",
        "--policy",
        "pytorch",
        "--json",
    ]);
    let lines = json_lines(&output);
    for line in &lines {
        check_line(line);
        // The device the recording's oom entry tells, scaled as the sizes are: TLSF's out of memory at the recorded one
        // (entry 100, its 1 GiB request scaled to 64 MiB, from fragmentation); PyTorch's segments (2 and 20 MiB) do not
        // scale, and its run fits.
        let ooms = line["ooms"].as_u64().unwrap();
        assert_eq!(line["allocs"].as_u64().unwrap() + ooms, 41, "{line}");
        if line["policy"] == "tlsf" {
            assert_eq!(ooms, 1, "{line}");
            assert_eq!(line["first_oom"]["event_index"], 100, "{line}");
            assert_eq!(line["first_oom"]["verdict"], "fragmentation", "{line}");
        }
        assert!(line["workload"].as_str().unwrap().ends_with("sizes / 16"), "{line}");
        assert!(line["budget_bytes"].as_u64().is_some_and(|bytes| (200 << 20..240 << 20).contains(&bytes)), "{line}");
    }
}

#[test]
fn bad_bench_input_is_refused() {
    let cases: [(&[&str], &str); 19] = [
        (&["bench", "--workload", "replay"], "needs a FILE"),
        (&["bench", "--workload", "serve", "x.pickle"], "only --workload replay takes a FILE"),
        (&["bench", "--workload", "serve", "--batch", "4"], "--batch is a knob of --workload train"),
        (&["bench", "--workload", "train", "--kv", "paged"], "--kv is a knob of --workload serve"),
        (&["bench", "--workload", "churn", "--checkpointing"], "--checkpointing is a knob of --workload train"),
        (&["bench", "--workload", "train", "--steps", "0"], "--steps 0"),
        (&["bench", "--workload", "churn", "--steps", "4294967295"], "--steps 4294967295: at most 8000000 for --workload churn"),
        // 10 million training steps took 22 GiB before the limit was the workload's.
        (&["bench", "--workload", "train", "--steps", "100001"], "--steps 100001: at most 100000 for --workload train"),
        (&["bench", "--workload", "serve", "--steps", "10000000", "--device", "1"], "--device is a knob of --workload replay"),
        (&["bench", "--workload", "churn", "--budget", "1", "--backend", "sim"], "--budget 1 B: less than one page (64 KiB"),
        // The simulation mapped a last page past such a range, the device rounded it down.
        (
            &["bench", "--workload", "churn", "--backend", "sim", "--policy", "paged", "--virtual-size", "100000"],
            "--virtual-size 100000 B: not a whole number of pages (64 KiB each, --page-size)",
        ),
        (&["bench", "--workload", "replay", "x.csv", "--seed", "99"], "--seed is a knob of the generated workloads"),
        (&["bench", "--workload", "serve", "--kv", "pages"], "expected contiguous or paged"),
        (&["bench", "--workload", "serve", "--policy", "tlfs"], "pytorch-expandable"),
        (&["bench", "--workload", "serve", "--backend", "cuda"], "possible values: vulkan, wgpu, sim"),
        (&["bench", "--workload", "serve", "--plain-wgpu"], "--plain-wgpu is a knob of --backend wgpu"),
        (&["bench", "--workload", "replay", "/nonexistent/trace.csv", "--backend", "sim"], "/nonexistent/trace.csv"),
        // A page larger than the workload's own budget: every request failed, with "0 B budget" on a device.
        (
            &["bench", "--workload", "serve", "--page-size", "256MiB"],
            "--page-size 256 MiB: larger than the workload's default budget (160 MiB)",
        ),
        (
            &["bench", "--workload", "churn", "--steps", "100", "--page-size", "1GiB", "--policy", "paged"],
            "larger than the workload's default budget (112 MiB)",
        ),
    ];
    for (args, expected) in cases {
        let output = heapscope(args);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(stderr(&output).contains(expected), "{args:?}: {expected:?} in {}", stderr(&output));
        assert!(!stderr(&output).contains("panicked"), "{args:?}: {}", stderr(&output));
    }
    // A budget below one page, a page above the default budget and a range of no whole pages concern `paged` alone: tlsf
    // runs (32 KiB holds 4 KiB requests), and pytorch-expandable maps its own pages whatever --page-size says.
    for extra in [
        &["--budget", "32KiB", "--policy", "tlsf"][..],
        &["--page-size", "256MiB", "--policy", "pytorch-expandable"],
        &["--virtual-size", "100000", "--policy", "tlsf"],
    ] {
        let output =
            heapscope(&[&["bench", "--workload", "churn", "--steps", "20", "--backend", "sim", "--json"][..], extra].concat());
        assert!(output.status.success(), "{extra:?}: {}", stderr(&output));
    }
    // A page larger than the device's sparse range: the row says what paged would map (one 4 GiB page, as its simulation
    // finds) against what the device's sparse buffers hold (a device's said 0 B).
    if gpu_required() {
        let args = ["bench", "--backend", "vulkan", "--workload", "churn", "--steps", "100", "--page-size", "4GiB"];
        let output = heapscope(&[&args[..], &["--budget", "4GiB", "--policy", "paged"]].concat());
        assert!(!output.status.success(), "{}", stdout(&output));
        let said = stdout(&output);
        assert!(
            said.contains("paged needs 4.00 GiB of virtual range at the workload's peak; the device's sparse buffers hold")
                && !said.contains("(0 B)"),
            "{said}"
        );
    }
    // A device named by HEAPSCOPE_DEVICE that is not there: an error (the bench ran on sim instead, silently in
    // JSON). Without a Vulkan loader at all the bench still runs on sim.
    let output = crate::common::output(
        crate::common::binary().args(["bench", "--workload", "churn", "--steps", "20", "--json"]).env("HEAPSCOPE_DEVICE", "7"),
    );
    if gpu_required() || !output.status.success() {
        assert!(!output.status.success(), "{}", stdout(&output));
        assert!(stderr(&output).contains("no Vulkan device matches HEAPSCOPE_DEVICE=\"7\""), "{}", stderr(&output));
    }
}

/// `paged` compacts in the bench by remapping: churn under 72 MiB in a virtual range of 70 MiB refuses requests for
/// fragmentation of the range without compacting; with `--compact on-oom` the sparse buffer's pages are rebound (0 bytes
/// copied), every refusal is served, the kernels find every moved allocation intact, and `--backend sim` makes the
/// same moves.
#[test]
fn paged_compacts_churn_by_remapping_with_every_moved_allocation_verified() {
    let args = [
        "bench",
        "--workload",
        "churn",
        "--steps",
        "600",
        "--policy",
        "paged",
        "--budget",
        "72MiB",
        "--virtual-size",
        "70MiB",
        "--json",
    ];
    let without = json_lines(&heapscope(&args));
    let device = json_lines(&heapscope(&[&args[..], &["--compact", "on-oom"]].concat()));
    let sim = json_lines(&heapscope(&[&args[..], &["--compact", "on-oom", "--backend", "sim"]].concat()));
    let backend = device[0]["backend"].as_str().unwrap();
    assert!(backend == "vulkan" || !gpu_required(), "HEAPSCOPE_REQUIRE_GPU=1 but the bench ran on {backend}");
    let (before, after, simulated) = (by_policy(&without, "paged"), by_policy(&device, "paged"), by_policy(&sim, "paged"));
    check_line(after);
    assert!(before["ooms"].as_u64() > Some(0), "the range fragments without compacting: {before}");
    assert_eq!(before["first_oom"]["verdict"].as_str(), Some("fragmentation"), "{before}");
    let compaction = &after["compaction"];
    assert_eq!(after["ooms"], 0, "{after}");
    assert_eq!(compaction["bytes_moved"].as_u64(), Some(0), "nothing copied: {after}");
    assert!(compaction["bytes_remapped"].as_u64() > Some(0) && compaction["ooms_avoided"].as_u64() > Some(0), "{after}");
    for key in ["moves", "bytes_remapped", "ooms_avoided"] {
        assert_eq!(compaction[key], simulated["compaction"][key], "the device makes the simulation's moves");
    }
    if backend == "vulkan" {
        assert_eq!(after["kernels_ran"], true, "{after}");
    }
    // Through wgpu the same sparse buffer is remapped under wgpu's own submissions: the same moves, verified.
    let output = heapscope(&[&args[..], &["--compact", "on-oom", "--backend", "wgpu"]].concat());
    if output.status.success() {
        let wgpu = json_lines(&output);
        let through_wgpu = by_policy(&wgpu, "paged");
        check_line(through_wgpu);
        assert_eq!(through_wgpu["ooms"], 0, "{through_wgpu}");
        for key in ["moves", "bytes_remapped", "ooms_avoided", "bytes_moved"] {
            assert_eq!(through_wgpu["compaction"][key], after["compaction"][key], "wgpu remaps as vulkan does: {through_wgpu}");
        }
    } else {
        assert!(!gpu_required(), "HEAPSCOPE_REQUIRE_GPU=1 but wgpu failed: {}", stderr(&output));
    }
}

/// A request larger than the device's largest buffer or allocation (lavapipe's `maxBufferSize` is 4 GiB, its
/// `maxMemoryAllocationSize` 2 GiB): each contender that would need such a block is a row that says so, naming the
/// smaller limit, and the others still run (a heap's failed `vkCreateBuffer` ended the whole bench; buddy and PyTorch
/// read it as out of memory; a 2.5 GiB request read as fragmentation where the simulation served it).
#[test]
fn a_request_past_the_largest_buffer_is_a_row_that_says_so() {
    let dir = crate::common::temp_dir("bench-largest-buffer");
    let file = dir.join("huge.csv");
    // A request a quarter past the device's largest allocation (lavapipe's 2 GiB: 2560 MiB, below its largest buffer).
    let Some((largest_bytes, _)) = crate::common::device_largest_allocation() else { return };
    let request_bytes = largest_bytes + largest_bytes / 4;
    std::fs::write(&file, format!("a,1,4096\na,2,{request_bytes}\nf,1\nf,2\n")).unwrap();
    let output = heapscope(&[
        "bench",
        "--workload",
        "replay",
        file.to_str().unwrap(),
        "--backend",
        "vulkan",
        "--policy",
        "tlsf",
        "--policy",
        "buddy",
        "--policy",
        "pytorch",
        "--json",
    ]);
    if stderr(&output).contains("no Vulkan") && !gpu_required() {
        eprintln!("skipped: no Vulkan device ({})", stderr(&output));
        return;
    }
    assert!(!output.status.success(), "no contender ran");
    let lines: Vec<Value> = stdout(&output).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    for policy in ["tlsf", "buddy", "pytorch"] {
        let why = by_policy(&lines, policy)["not_run"].as_str().unwrap_or_default().to_owned();
        assert!(
            why.starts_with(&format!("its largest request, {} (", heapscope_core::units::exact_size(request_bytes)))
                && why.contains("exceeds the device's largest ")
                && (why.contains("(maxMemoryAllocationSize ") || why.contains("(maxBufferSize ")),
            "{policy}: {why}"
        );
    }
    assert!(stderr(&output).contains("no contender could run"), "{}", stderr(&output));
}

/// On wgpu every allocation of a heap's arenas is bound whole: a request past the storage binding limit (lavapipe's is
/// 128 MiB) makes the heap contenders rows that say so before they start (they failed mid-run, and the bench with
/// them), while PyTorch's, which binds in pieces, runs.
#[test]
fn a_request_past_the_wgpu_binding_limit_is_a_row_that_says_so() {
    let dir = crate::common::temp_dir("bench-binding-limit");
    let file = dir.join("big.csv");
    std::fs::write(&file, "a,1,4096\na,2,200MiB\nf,1\nf,2\n").unwrap();
    let path = file.to_str().unwrap();
    let output = heapscope(&[
        "bench",
        "--workload",
        "replay",
        path,
        "--backend",
        "wgpu",
        "--policy",
        "tlsf",
        "--policy",
        "pytorch",
        "--json",
    ]);
    if !output.status.success() && !gpu_required() {
        eprintln!("skipped: no wgpu device ({})", stderr(&output));
        return;
    }
    let lines: Vec<Value> = stdout(&output).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let why = by_policy(&lines, "tlsf")["not_run"].as_str().unwrap_or_default().to_owned();
    assert!(
        why.starts_with(
            "its largest request, 200 MiB, exceeds the device's largest storage binding (max_storage_buffer_binding_size "
        ),
        "{why}\n{}",
        stderr(&output)
    );
    assert!(by_policy(&lines, "pytorch")["not_run"].is_null(), "{}", stdout(&output));
    assert_eq!(by_policy(&lines, "pytorch")["mismatches"], 0, "{}", stdout(&output));
    assert!(output.status.success(), "{}", stderr(&output));
}

/// A replay sizes `paged`'s virtual range (and the expandable segments' on a device) to the recording, or to four times
/// the budget its `oom` entry tells (frag_oom's 3.5 GiB) (it was 1 GiB, and frag_oom's 2.95 GiB live ran out of it, simulated too). On a device whose sparse buffers
/// cannot hold that (lavapipe: 2 GiB of sparse address space), those rows say so instead of refusing requests as out
/// of memory where the budget had room.
#[test]
fn a_replay_sizes_the_virtual_ranges_to_the_recording() {
    let file = crate::common::trace("pytorch/frag_oom-default.pickle.gz");
    let args = [
        "bench",
        "--workload",
        "replay",
        file.to_str().unwrap(),
        "--policy",
        "paged",
        "--policy",
        "pytorch-expandable",
        "--json",
    ];
    let sim = json_lines(&heapscope(&[&args[..], &["--backend", "sim"]].concat()));
    for line in &sim {
        check_line(line);
        assert_eq!(line["ooms"], 0, "{line}");
    }
    let output = heapscope(&[&args[..], &["--backend", "vulkan"]].concat());
    if stderr(&output).contains("no Vulkan") && !gpu_required() {
        eprintln!("skipped: no Vulkan device ({})", stderr(&output));
        return;
    }
    let lines: Vec<Value> = stdout(&output).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    for policy in ["paged", "pytorch-expandable"] {
        let line = by_policy(&lines, policy);
        // The range needed is what the contender maps at its peak, as its simulation found (at least the 2.95 GiB live).
        let simulated = by_policy(&sim, policy);
        let (mapped, live) = (simulated["peak_reserved_bytes"].as_u64().unwrap(), simulated["peak_live_bytes"].as_u64().unwrap());
        let needed = heapscope_core::units::Bytes(mapped.max(live));
        match line["not_run"].as_str() {
            Some(why) => assert!(
                why.contains(&format!(
                    "{needed} of virtual range at the workload's peak; the device's sparse buffers hold at most"
                )),
                "{policy}: {why}"
            ),
            None => assert_eq!(line["ooms"], 0, "a device whose sparse buffers hold the recording serves it: {line}"),
        }
    }
}

/// A compaction that moves an allocation whose size is no multiple of 4 keeps its last word whole: the kernels fill and
/// verify whole words, and a move of exactly its bytes left the last 1 to 3 bytes of padding behind, read as 2 mismatches
/// on Vulkan (wgpu copies whole words already).
#[test]
fn compaction_moves_odd_sizes_whole() {
    let dir = crate::common::temp_dir("bench-odd-moves");
    let file = dir.join("odd.csv");
    std::fs::write(&file, "a,0,4096\na,1,1001\nf,0\na,2,8\nf,1\nf,2\n").unwrap();
    for backend in ["vulkan", "wgpu"] {
        let args = ["bench", "--workload", "replay", file.to_str().unwrap(), "--backend", backend, "--policy", "tlsf"];
        let output = heapscope(&[&args[..], &["--compact", "every:3", "--json"]].concat());
        if stderr(&output).contains("no Vulkan") && !gpu_required() {
            eprintln!("skipped: no Vulkan device ({})", stderr(&output));
            return;
        }
        let lines = json_lines(&output);
        let tlsf = by_policy(&lines, "tlsf");
        assert!(tlsf["compaction"]["moves"].as_u64().unwrap() > 0, "{backend}: the 1001-byte allocation moves: {tlsf}");
        assert_eq!((tlsf["mismatches"].as_u64(), tlsf["kernels_ran"].as_bool()), (Some(0), Some(true)), "{backend}: {tlsf}");
        assert_eq!(tlsf["bytes_verified"], 4096 + 1001 + 1001 + 8, "{backend}: {tlsf}");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// More live sparse mappings than a CPU device holds (lavapipe's 16,384), met during the run: `paged`'s row says the
/// device cannot run it and the bench succeeds with the others' rows (it was a failed row and a failed bench).
#[test]
fn too_many_live_mappings_mid_run_is_a_row_that_says_so() {
    let Some((_, kind)) = crate::common::device_largest_allocation() else { return };
    let dir = crate::common::temp_dir("bench-many-mappings");
    let file = dir.join("scattered.csv");
    // 40,000 live 4 KiB allocations, every other one freed (20,000 scattered pages of 4 KiB), then a bind past the limit.
    let mut text: String = (0..40_000).map(|id| format!("a,{id},4096\n")).collect();
    text.extend((0..40_000).step_by(2).map(|id| format!("f,{id}\n")));
    text.push_str("a,40000,1MiB\n");
    std::fs::write(&file, text).unwrap();
    let args = ["bench", "--workload", "replay", file.to_str().unwrap(), "--backend", "vulkan", "--page-size", "4096"];
    // Without the validation layer (`crate::common::heapscope`, not this file's): it checks each of the 20,000 binds
    // (four minutes, six seconds without); the other tests validate paged's binds.
    let output = crate::common::heapscope(&[&args[..], &["--policy", "tlsf", "--policy", "paged", "--json"]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let lines = json_lines(&output);
    assert_eq!(by_policy(&lines, "tlsf")["mismatches"], 0);
    let paged = by_policy(&lines, "paged");
    if kind == "CPU" {
        let why = paged["not_run"].as_str().unwrap_or_default();
        assert!(why.starts_with("past a limit of the device at step ") && why.contains("too many sparse mappings"), "{paged}");
    } else {
        assert_eq!(paged["mismatches"], 0, "a GPU holds them: {paged}");
    }
    std::fs::remove_dir_all(dir).ok();
}
