//! End-to-end tests of the `heapscope` binary: commands, output, and errors for bad input.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn heapscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_heapscope")).args(args).output().expect("the binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json_lines(output: &Output) -> Vec<Value> {
    assert!(output.status.success(), "stderr: {}", stderr(output));
    stdout(output).lines().map(|line| serde_json::from_str(line).expect("one JSON object per line")).collect()
}

fn asset(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/traces").join(name)
}

#[test]
fn help_and_version() {
    let help = heapscope(&["--help"]);
    assert!(help.status.success());
    for command in ["demo", "replay", "policies"] {
        assert!(stdout(&help).contains(command), "--help lists {command}: {}", stdout(&help));
    }
    let version = heapscope(&["--version"]);
    assert_eq!(stdout(&version).trim(), format!("heapscope {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn no_arguments_runs_the_demo_table() {
    let output = heapscope(&[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.starts_with("heapscope demo: frag_oom"), "{text}");
    for policy in ["tlsf", "best-fit", "first-fit", "buddy", "linear-bump", "linear-stack", "linear-ring", "slab"] {
        assert!(text.lines().any(|line| line.starts_with(policy)), "a row for {policy}: {text}");
    }
    assert!(text.contains("why the last request failed"), "{text}");
}

#[test]
fn demo_json_tells_the_fragmentation_story() {
    let lines = json_lines(&heapscope(&["demo", "--json"]));
    assert_eq!(lines.len(), 16, "8 policies x 2 layouts");
    const DEVICE: u64 = 3584 << 20;
    for line in &lines {
        let served = line["served"].as_bool().unwrap();
        let reserved = line["reserved_bytes"].as_u64().unwrap();
        assert!(reserved <= DEVICE, "{line}");
        assert!(line["live_bytes"].as_u64().unwrap() <= reserved, "{line}");
        assert_eq!(served, line["verdict"].is_null(), "a verdict exactly when the request failed: {line}");
        if let Some(verdict) = line["verdict"].as_object() {
            let total_free = verdict["free_in_blocks_bytes"].as_u64().unwrap() + verdict["unreserved_bytes"].as_u64().unwrap();
            let fragmented = verdict["cause"] == "fragmentation";
            assert_eq!(fragmented, total_free >= 1 << 30, "the cause follows the numbers: {line}");
        }
    }
    let find = |policy: &str, layout: &str| {
        lines
            .iter()
            .find(|line| line["policy"] == policy && line["layout"] == layout)
            .unwrap_or_else(|| panic!("{policy} {layout}"))
    };
    // One range: 20 x 100 MiB + 1 GiB = 3024 MiB fit the 3584 MiB device.
    assert_eq!(find("tlsf", "range")["served"], true);
    // Blocks of 256 MiB hold two 100 MiB tensors each with 56 MiB free between them: 1 GiB meets
    // fragmentation, as PyTorch's default allocator does on the real device.
    let blocks = find("tlsf", "blocks");
    assert_eq!(blocks["served"], false);
    assert_eq!(blocks["verdict"]["cause"], "fragmentation");
    // Buddy rounds 150 MiB up to 256 MiB: only 14 of the first 20 fit.
    assert_eq!(find("buddy", "range")["failed_before"], 6);
}

#[test]
fn demo_flags_change_the_heap_rules() {
    // With empty blocks released at once, the 20 x 150 MiB blocks go back and 1 GiB fits again.
    let lines = json_lines(&heapscope(&["demo", "--json", "--policy", "tlsf", "--release", "immediately"]));
    assert_eq!(lines.len(), 2);
    assert!(lines.iter().all(|line| line["served"] == true), "{lines:?}");
}

/// Peak live bytes of a compact CSV trace, computed here independently of heapscope.
fn peak_live_bytes(path: &Path) -> (u64, u64) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut live = std::collections::HashMap::new();
    let (mut now, mut peak, mut allocs) = (0u64, 0u64, 0u64);
    for line in text.lines().filter(|line| !line.starts_with('#') && !line.is_empty()) {
        let fields: Vec<&str> = line.split(',').collect();
        if fields[0] == "a" {
            let size: u64 = fields[2].parse().unwrap();
            live.insert(fields[1].to_owned(), size);
            now += size;
            peak = peak.max(now);
            allocs += 1;
        } else {
            now -= live.remove(fields[1]).unwrap();
        }
    }
    (allocs, peak)
}

#[test]
fn replay_of_the_gpt2_trace() {
    let path = asset("gpt2_train_fixed-default.csv");
    let (allocs, peak) = peak_live_bytes(&path);
    let lines = json_lines(&heapscope(&["replay", path.to_str().unwrap(), "--json", "--policy", "tlsf", "--policy", "best-fit"]));
    assert_eq!(lines.len(), 2);
    for line in &lines {
        assert_eq!(line["allocations"], allocs, "{line}");
        assert_eq!(line["failed_allocations"], 0, "{line}");
        assert_eq!(line["peak_live_bytes"], peak, "{line}");
        let ratio = line["reserved_over_live"].as_f64().unwrap();
        assert!((1.0..1.2).contains(&ratio), "a single range needs a little more than the peak: {line}");
    }
    let heap = json_lines(&heapscope(&[
        "replay",
        path.to_str().unwrap(),
        "--json",
        "--heap",
        "--policy",
        "tlsf",
        "--capacity",
        "141GiB",
    ]));
    assert_eq!(heap[0]["mode"], "heap");
    assert!(heap[0]["peak_reserved_bytes"].as_u64().unwrap() >= peak);
}

#[test]
fn bad_input_gets_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("heapscope-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "a,1,4096\nf,2\n").unwrap();
    let bad_path = bad.to_str().unwrap().to_owned();
    let good = asset("gpt2_train_fixed-default.csv");
    let good_path = good.to_str().unwrap();
    let cases: [(Vec<&str>, &str); 9] = [
        (vec!["replay", "/nonexistent/trace.csv"], "/nonexistent/trace.csv"),
        (vec!["replay", &bad_path], "bad.csv:2: free of allocation 2, which is not live"),
        (vec!["replay", good_path, "--align", "3"], "align_bytes = 3 is not a power of two"),
        (vec!["replay", good_path, "--heap", "--align", "0"], "align_bytes = 0 is not a power of two"),
        (vec!["replay", good_path, "--min-align", "3"], "min_align_bytes = 3 is not a power of two"),
        (vec!["demo", "--policy", "nope"], "unknown policy \"nope\""),
        (vec!["demo", "--block-size", "12 parsecs"], "unknown unit"),
        (vec!["demo", "--release", "sometimes"], "unknown release rule"),
        (vec!["demo", "--min-align", "48"], "min_align_bytes = 48 is not a power of two"),
    ];
    for (args, needle) in cases {
        let output = heapscope(&args);
        assert!(!output.status.success(), "{args:?} must fail");
        assert!(stderr(&output).contains(needle), "{args:?}: {}", stderr(&output));
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn sizes_that_fit_nowhere_are_failed_allocations_in_both_modes() {
    let dir = std::env::temp_dir().join(format!("heapscope-cli-huge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let huge = dir.join("huge.csv");
    std::fs::write(&huge, format!("a,1,{}\na,2,4096\nf,2\n", u64::MAX)).unwrap();
    for mode in [&[][..], &["--heap"][..]] {
        let mut args = vec!["replay", huge.to_str().unwrap(), "--json", "--policy", "tlsf"];
        args.extend_from_slice(mode);
        let lines = json_lines(&heapscope(&args));
        assert_eq!((lines[0]["allocations"].as_u64(), lines[0]["failed_allocations"].as_u64()), (Some(1), Some(1)), "{mode:?}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn policies_lists_every_policy() {
    let text = stdout(&heapscope(&["policies"]));
    assert_eq!(text.lines().count(), 8, "{text}");
    assert!(text.starts_with("tlsf "), "{text}");
}
