//! End-to-end tests of the `heapscope` binary: commands, output, and errors for bad input.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{gpu_required, heapscope, json_lines, stderr, stdout, temp_dir, trace};
use heapscope_lab::recording::Recording;
use serde_json::Value;

#[test]
fn help_and_version() {
    let help = heapscope(&["--help"]);
    assert!(help.status.success());
    for command in ["demo", "replay", "compare", "summary", "export", "convert", "policies", "probe", "bench", "gui", "render"] {
        assert!(stdout(&help).contains(command), "--help lists {command}: {}", stdout(&help));
    }
    let version = heapscope(&["--version"]);
    assert_eq!(stdout(&version).trim(), format!("heapscope {}", env!("CARGO_PKG_VERSION")));
}

/// Runs the binary with no display (so that no window opens), in `dir`.
fn heapscope_headless(args: &[&str], dir: &Path) -> Output {
    crate::common::output(crate::common::binary().args(args).env_remove("DISPLAY").env_remove("WAYLAND_DISPLAY").current_dir(dir))
}

fn is_png(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|bytes| bytes.starts_with(b"\x89PNG\r\n\x1a\n"))
}

#[test]
fn no_arguments_runs_the_demo_table_and_draws_the_heap() {
    let dir = temp_dir("no-arguments");
    let output = heapscope_headless(&[], &dir);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    // Issue 19: the headline first, in the app's words: PyTorch refuses the 1 GiB for fragmentation with the device's
    // free memory in the same line; expandable segments and paging serve it; then the policy table.
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("The story: 20 x 150 MiB allocated and freed"), "{text}");
    assert!(
        lines[1].contains("`pytorch` (PyTorch's caching allocator, default settings) refuses the 1.00 GiB. Fragmentation")
            && lines[1].contains("584.00 MiB more on the device, 1.55 GiB in all"),
        "{text}"
    );
    assert!(lines[2].contains("`pytorch-expandable` and `paged` serve it"), "{text}");
    assert!(text.contains("\nheapscope demo: frag_oom"), "{text}");
    for policy in ["tlsf", "best-fit", "first-fit", "buddy", "linear-bump", "linear-stack", "linear-ring", "slab"] {
        assert!(text.lines().any(|line| line.starts_with(policy)), "a row for {policy}: {text}");
    }
    assert!(text.contains("why the last request failed"), "{text}");
    let png = dir.join("heapscope-demo.png");
    if gpu_required() || is_png(&png) {
        assert!(is_png(&png), "the demo draws the heap: {}", stderr(&output));
        assert!(text.contains("the heap at the end of the story: heapscope-demo.png"), "{text}");
    } else {
        assert!(stderr(&output).contains("no picture of the heap"), "{}", stderr(&output));
    }
}

#[test]
fn render_draws_a_recording_or_a_story_into_a_png() {
    let dir = temp_dir("render");
    let story = dir.join("story.png");
    let story_args =
        ["render", "--story", "frag_oom", "--policy", "pytorch", "--policy", "paged", "--at", "60", "--out", "story.png"];
    let output = heapscope_headless(&story_args, &dir);
    let file = dir.join("gpt2.png");
    let gpt2 = snapshot("gpt2_train_fixed-default");
    let file_args = [
        "render",
        gpt2.to_str().unwrap(),
        "--policy",
        "tlsf",
        "--at",
        "5000",
        "--width",
        "640",
        "--height",
        "240",
        "--out",
        "gpt2.png",
    ];
    let from_file = heapscope_headless(&file_args, &dir);
    if !gpu_required() && !output.status.success() {
        assert!(stderr(&output).contains("cannot render") || stderr(&output).contains("adapter"), "{}", stderr(&output));
        return;
    }
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("wrote story.png (frag_oom · entry 60 of 61 entries · out of memory: pytorch refused 1.00 GiB"),
        "{}",
        stdout(&output)
    );
    assert!(is_png(&story));
    assert!(from_file.status.success(), "{}", stderr(&from_file));
    assert!(is_png(&file));
    // `--at peak` and `--at oom` name the moments `top` names: frag_oom's peak at entry 39, its refused 1 GiB at 100.
    let frag_oom = trace("pytorch/frag_oom-default.pickle.gz");
    // Every pane replays on the device the recording tells (its oom entry), as `compare` does: tlsf refuses the
    // 1 GiB there too, and the line says each pane's refusal, as the picture's title does.
    let oom = "entry 100 of 141 entries · out of memory: pytorch refused 1.00 GiB (fragmentation, free runs too small \
               for it in red); tlsf refused 1.00 GiB (fragmentation, free runs too small for it in red)";
    for (at, entry) in [("peak", "entry 39 of 141 entries)"), ("oom", oom)] {
        let args =
            ["render", frag_oom.to_str().unwrap(), "--policy", "pytorch", "--policy", "tlsf", "--at", at, "--out", "at.png"];
        let drawn = heapscope_headless(&args, &dir);
        assert!(drawn.status.success() && stdout(&drawn).contains(entry), "--at {at}: {}{}", stdout(&drawn), stderr(&drawn));
    }
    // A recording with no oom entry, on a capacity its replay runs out of: `--at oom` is the first refusal there (GPT-2
    // at 13 GiB, entry 5866, as `replay` says), and said so.
    let gpt2 = trace("pytorch/gpt2_train_fixed-default.pickle.gz");
    let args = ["render", gpt2.to_str().unwrap(), "--capacity", "13GiB", "--at", "oom", "--out", "refused.png"];
    let drawn = heapscope_headless(&args, &dir);
    let text = stdout(&drawn);
    assert!(drawn.status.success(), "{}", stderr(&drawn));
    assert!(
        text.contains("records no out-of-memory entry: --at oom draws the first request a pane refused, pytorch's at entry 5866"),
        "{text}"
    );
    assert!(text.contains("entry 5866 of 18685 entries · out of memory: pytorch refused"), "{text}");
    // Issue 19: a lesson written as a CSV, with its captions, the rules on the command line, the timeline strip, and
    // text scaled to a 2400-pixel image.
    let lesson = "# heapscope trace v1: lesson\n# Three blocks\na,1,40MiB\na,2,60MiB\na,3,40MiB\n# A hole\nf,2\na,4,50MiB\n";
    std::fs::write(dir.join("lesson.csv"), lesson).unwrap();
    let args = [
        "render",
        "lesson.csv",
        "--policy",
        "best-fit",
        "--policy",
        "buddy",
        "--capacity",
        "200MiB",
        "--block-size",
        "64MiB",
        "--timeline",
        "--width",
        "2400",
        "--height",
        "900",
        "--out",
        "lesson.png",
    ];
    let rendered = heapscope_headless(&args, &dir);
    assert!(rendered.status.success(), "{}", stderr(&rendered));
    let png = std::fs::read(dir.join("lesson.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let (width, height) =
        (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap()));
    assert_eq!((width, height), (2400, 900), "the size asked for, text drawn at 1.875 pixels a point");
    let bad = heapscope_headless(&["render", "lesson.csv", "--page-size", "3MiB", "--out", "x.png"], &dir);
    assert!(stderr(&bad).contains("--page-size 3.00 MiB: not a power of two"), "{}", stderr(&bad));
    // Coloured by the entries' categories, with their legend.
    labelled_frag_oom(&dir);
    let by_category =
        heapscope_headless(&["render", "labelled.pickle", "--colour", "category", "--at", "39", "--out", "labelled.png"], &dir);
    assert!(by_category.status.success(), "{}", stderr(&by_category));
    assert!(is_png(&dir.join("labelled.png")));
    // Text no bundled font draws (CJK and emoji, in the frames' file and function names, and in the recording's
    // own name in the title) is drawn with a font the system has for it, else as boxes, as in the app: not a panic.
    let mut foreign = heapscope_pytorch::read_snapshot(&snapshot("frag_oom-default")).unwrap();
    for frame in foreign.frame_stacks.iter_mut().flatten() {
        frame.filename = "/home/用户/模型_🔥.py".into();
        frame.name = "训练".into();
    }
    heapscope_pytorch::write_snapshot(&foreign, std::fs::File::create(dir.join("模型_🔥.pickle")).unwrap()).unwrap();
    for colour in ["stack", "category", "size-class"] {
        let args = ["render", "模型_🔥.pickle", "--colour", colour, "--at", "39", "--out", "foreign.png"];
        let rendered = heapscope_headless(&args, &dir);
        assert!(rendered.status.success(), "--colour {colour}: {}", stderr(&rendered));
        assert!(is_png(&dir.join("foreign.png")));
    }
}

#[test]
fn render_animates_a_story_into_a_gif() {
    use image::AnimationDecoder;
    let dir = temp_dir("render-gif");
    let args = [
        "render",
        "--story",
        "frag_oom",
        "--policy",
        "pytorch",
        "--policy",
        "paged",
        "--frames",
        "8",
        "--width",
        "480",
        "--height",
        "200",
        "--out",
        "story.gif",
    ];
    let output = heapscope_headless(&args, &dir);
    if !gpu_required() && !output.status.success() {
        assert!(stderr(&output).contains("cannot render") || stderr(&output).contains("adapter"), "{}", stderr(&output));
        return;
    }
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("wrote story.gif (frag_oom, 8 frames from entry 6 to entry 60)"), "{}", stdout(&output));
    let file = std::fs::File::open(dir.join("story.gif")).unwrap();
    let decoder = image::codecs::gif::GifDecoder::new(std::io::BufReader::new(file)).unwrap();
    let frames = decoder.into_frames().collect_frames().unwrap();
    assert_eq!(frames.len(), 8);
    let delays: Vec<u32> = frames.iter().map(|frame| frame.delay().numer_denom_ms().0).collect();
    assert_eq!((delays[0], delays[7]), (250, 2500), "the last frame stays longer: {delays:?}");
    for frame in &frames {
        assert_eq!(frame.buffer().dimensions(), (480, 200));
    }
    // The story moves: the first frame (7 events in) and the last (the refusal) differ.
    assert_ne!(frames[0].buffer(), frames[7].buffer());
}

#[test]
fn render_and_gui_refuse_bad_requests_clearly() {
    let dir = temp_dir("render-bad");
    // (arguments, words the error holds)
    let cases: [(&[&str], &str); 27] = [
        (&["render", "--story", "nope", "--out", "x.png"], "no built-in story \"nope\""),
        // A rule no pane follows is refused (the image was drawn as without it).
        (
            &["render", "--story", "frag_oom", "--policy", "pytorch", "--page-size", "64KiB", "--out", "x.png"],
            "--page-size applies to the `paged` contender only, and this image draws pytorch: it would change nothing",
        ),
        (
            &[
                "render",
                "--story",
                "frag_oom",
                "--policy",
                "tlsf",
                "--policy",
                "paged",
                "--alloc-conf",
                "max_split_size_mb:128",
                "--out",
                "x.png",
            ],
            "--alloc-conf applies to PyTorch's emulation (pytorch, pytorch-expandable) only, and this image draws tlsf, paged",
        ),
        (&["render", "--out", "x.png"], "required"),
        (&["render", "--story", "frag_oom", "--policy", "tlfs", "--out", "x.png"], "pytorch-expandable"),
        (&["gui"], "no display"),
        (&["gui", "--live", "serve"], "no display"),
        (&["gui", "--live", "replay"], "unknown live workload \"replay\""),
        (&["gui", "--live", "serve", "--budget", "0"], "--budget 0"),
        (&["gui", "--live", "serve", "--budget", "2000000TiB"], "more than the largest device heapscope models"),
        (&["gui", "--live", "serve", "--steps", "0"], "--steps 0"),
        (&["gui", "--live", "serve", "--policy", "tlfs"], "pytorch-expandable"),
        (&["gui", "--budget", "1G"], "--live"),
        (&["render", "--story", "frag_oom", "--frames", "8", "--out", "x.png"], "apply to a GIF"),
        (&["render", "--story", "frag_oom", "--at", "8", "--out", "x.gif"], "--at applies to a PNG"),
        (&["render", "--story", "frag_oom", "--frames", "0", "--out", "x.gif"], "--frames 0"),
        (&["render", "--story", "frag_oom", "--frame-ms", "0", "--out", "x.gif"], "--frame-ms 0"),
        (&["render", "--story", "frag_oom", "--frame-ms", "4294967295", "--out", "x.gif"], "10 to 655350 ms"),
        (&["gui", "--quit-after-frames", "0"], "--quit-after-frames 0"),
        (&["render", "--story", "frag_oom", "--width", "0", "--out", "x.png"], "--width 0"),
        (&["render", "--story", "frag_oom", "--height", "0", "--out", "x.png"], "--height 0"),
        (&["render", "--story", "frag_oom", "--width", "8193", "--out", "x.png"], "--width 8193"),
        (&["render", "--story", "frag_oom", "--height", "9000", "--out", "x.gif"], "--height 9000"),
        // The timeline under the maps needs room for both (at 300 pixels the maps drew nothing).
        (
            &["render", "--story", "frag_oom", "--timeline", "--width", "640", "--height", "300", "--out", "x.png"],
            "--height 300 with --timeline: below 360 pixels (at --width 640)",
        ),
        (&["gui", "--live", "serve", "--capacity", "1GiB"], "a --live run has its --budget"),
        (&["gui", "--live", "serve", "--policy", "tlsf", "--policy", "paged"], "a --live run has one contender"),
        (
            &["gui", "--policy", "tlsf", "--policy", "paged", "--policy", "buddy", "--policy", "slab", "--policy", "pytorch"],
            "1 to 4",
        ),
    ];
    for (args, words) in cases {
        let output = heapscope_headless(args, &dir);
        assert!(!output.status.success(), "{args:?}");
        assert!(stderr(&output).contains(words), "{args:?}: {}", stderr(&output));
    }
}

/// `--at` past the last entry is refused by `render` as by `gui` (`tests/end_to_end/gui/window.rs`), in the same words: one
/// rule, `heapscope_gui::session::check_at`, before anything is drawn (so no GPU is needed here).
#[test]
fn render_refuses_a_moment_past_the_end_as_gui_does() {
    let dir = temp_dir("render-at");
    let snapshot = trace("pytorch/frag_oom-default.pickle.gz");
    let gpt2 = trace("pytorch/gpt2_train_fixed-default.pickle.gz");
    // (recording, --at, words of the error)
    let cases = [
        (
            vec![snapshot.to_str().unwrap()],
            "500",
            "frag_oom-default.pickle.gz: --at entry 500: the recording has 141 entries (`--at start`, or entry 0 to 140)",
        ),
        (vec![snapshot.to_str().unwrap()], "141", "--at entry 141: the recording has 141 entries"),
        (vec!["--story", "frag_oom"], "61", "--at entry 61: the recording has 61 entries"),
        (
            vec!["--story", "frag_oom"],
            "soon",
            "\"soon\" is no moment: expected `peak`, `oom`, `start` or an entry number (from 0)",
        ),
        // No oom entry and no pane refusing anything on its capacity (the story's refusals are drawn instead).
        (
            vec![gpt2.to_str().unwrap()],
            "oom",
            "gpt2_train_fixed-default.pickle.gz has no out-of-memory entry: nothing was refused",
        ),
    ];
    for (recording, at, words) in cases {
        let args: Vec<&str> = ["render"].into_iter().chain(recording).chain(["--at", at, "--out", "x.png"]).collect();
        let output = heapscope_headless(&args, &dir);
        assert!(!output.status.success(), "{args:?}");
        assert!(stderr(&output).contains(words), "{args:?}: {}", stderr(&output));
        assert!(!dir.join("x.png").exists(), "{args:?}: nothing is drawn");
    }
}

/// Two live allocations of 2^63 bytes each: `top` and `render` summed the live bytes in a u64 and panicked.
#[test]
fn top_and_render_take_live_bytes_past_a_u64() {
    let dir = temp_dir("huge-live");
    std::fs::write(dir.join("huge.csv"), "a,1,9223372036854775808\na,2,9223372036854775808\n").unwrap();
    let top = heapscope_headless(&["top", "huge.csv"], &dir);
    assert!(top.status.success(), "{}", stderr(&top));
    assert!(stdout(&top).contains("live at the peak (entry 1), in 2 allocations"), "{}", stdout(&top));
    // 2^64 B saturated: shown as a lower bound, and said.
    assert!(stdout(&top).contains(": ≥16777216.00 TiB live at the peak"), "{}", stdout(&top));
    assert!(stdout(&top).contains("\n≥: the bytes saturated at 2^64 - 1"), "{}", stdout(&top));
    // One allocation of 2^64 - 1 B is exact: no mark.
    std::fs::write(dir.join("max.csv"), format!("a,1,{}\n", u64::MAX)).unwrap();
    let exact = stdout(&heapscope_headless(&["top", "max.csv"], &dir));
    assert!(exact.contains(": 16777216.00 TiB live at the peak") && !exact.contains('≥'), "{exact}");
    for (file, saturated) in [("huge.csv", true), ("max.csv", false)] {
        let json = json_lines(&heapscope_headless(&["top", file, "--json"], &dir));
        assert_eq!((json[0]["live_bytes"].as_u64(), json[0]["saturated"].as_bool()), (Some(u64::MAX), Some(saturated)));
    }
    let render = heapscope_headless(&["render", "huge.csv", "--out", "huge.png"], &dir);
    assert!(render.status.success(), "{}", stderr(&render));
    assert!(is_png(&dir.join("huge.png")));
    // The bench's stream check and counters summed them in a u64 too: it panicked where replay reported refusals.
    let bench = heapscope_headless(&["bench", "--workload", "replay", "huge.csv", "--backend", "sim", "--json"], &dir);
    assert!(bench.status.success(), "{}", stderr(&bench));
    let rows = json_lines(&bench);
    assert!(rows.iter().any(|row| row["ooms"].as_u64() > Some(0)), "the block heaps refuse 2^63 B: {rows:?}");
    // On a device of no stated capacity every refusal says the request fits no device, as the title says the device
    // is unlimited: no "reservable" figure of the simulated device (64 PiB, then 0 B past 2^64 once aligned), no
    // "left on the device" from `advise`.
    std::fs::write(
        dir.join("past.csv"),
        "a,1,18446744073709551615
",
    )
    .unwrap();
    for file in ["huge.csv", "past.csv"] {
        let replay = heapscope_headless(&["replay", file], &dir);
        let said = stdout(&replay);
        assert!(said.contains("device capacity unlimited"), "{said}");
        let heaps: Vec<&str> = said.lines().filter(|line| line.contains("first OOM at entry 0: tried to allocate")).collect();
        assert_eq!(heaps.len(), 5, "every heap contender and paged refuse it: {said}");
        for line in heaps {
            assert!(line.contains("more than any device holds") && !line.contains("reservable"), "{file}: {line}");
        }
        let advise = stdout(&heapscope_headless(&["advise", file], &dir));
        assert!(advise.contains("No setting serves every request") && !advise.contains("left on the device"), "{file}: {advise}");
    }
    // The bench refuses a request that overflows once aligned as replay does (every contender failed, exit 1), and
    // paged no longer serves what no device holds there either.
    let bench = heapscope_headless(&["bench", "--workload", "replay", "past.csv", "--backend", "sim", "--json"], &dir);
    assert!(bench.status.success(), "{}", stderr(&bench));
    assert!(json_lines(&bench).iter().all(|row| row["ooms"] == 1), "{}", stdout(&bench));
    // PyTorch's emulation runs on the same largest device as the others: 1 EiB - 1 MiB beside 1 GiB is refused by all
    // (it reserved 1 EiB + 1 GiB while the heaps refused it).
    let near = (1u64 << 60) - (1 << 20);
    std::fs::write(dir.join("near.csv"), format!("a,1,1073741824\na,2,{near}\n")).unwrap();
    let rows = json_lines(&heapscope_headless(&["replay", "near.csv", "--json"], &dir));
    assert!(rows.iter().all(|row| row["ooms"] == 1 && row["peak_reserved_bytes"].as_u64() <= Some(1 << 60)), "{rows:?}");
    // A memory fraction whose device would pass 2^64 B: `advise` panicked adding to u64::MAX; the row needs no device.
    std::fs::write(dir.join("half.csv"), format!("a,0,{}\nf,0\n", 1u64 << 59)).unwrap();
    let advise = heapscope_headless(&["advise", "half.csv", "--setting", "per_process_memory_fraction:0.01", "--json"], &dir);
    assert!(advise.status.success(), "{}", stderr(&advise));
    let rows = json_lines(&advise);
    let row = rows.iter().find(|row| row["setting"] == "per_process_memory_fraction:0.01").unwrap();
    assert!(row["min_capacity_bytes"].is_null(), "{row}");
    // paged's range near 2^64 B (given, or four times the largest budget) compacting every event: its planner
    // overflowed.
    let huge_budget = (1u64 << 60).to_string();
    for flags in [["--budget", huge_budget.as_str()], ["--virtual-size", "18446744073707454464"]] {
        let args = [&["replay", "half.csv", "--policy", "paged", "--compact", "every:1"][..], &flags].concat();
        let replay = heapscope_headless(&args, &dir);
        assert!(replay.status.success() && !stderr(&replay).contains("panicked"), "{flags:?}: {}", stderr(&replay));
    }
}

/// A replay bench names its first out-of-memory by the recording's entry, as `compare` does: its steps skip the
/// recording's `empty_cache` entries (five here), and the step's index was given as the entry's.
#[test]
fn a_bench_replay_names_the_recordings_entry() {
    let dir = temp_dir("bench-entry");
    std::fs::write(dir.join("ec.csv"), "e\ne\ne\ne\ne\na,1,100MB\na,2,100MB\nf,1\nf,2\n").unwrap();
    let compare = stdout(&heapscope_headless(&["compare", "ec.csv", "--budget", "150MiB", "--policy", "tlsf"], &dir));
    assert!(compare.contains("first OOM at entry 6:"), "{compare}");
    let args = ["bench", "--workload", "replay", "ec.csv", "--backend", "sim", "--budget", "150MiB", "--policy", "tlsf"];
    let rows = json_lines(&heapscope_headless(&[&args[..], &["--json"]].concat(), &dir));
    assert_eq!(rows[0]["first_oom"]["event_index"], 6, "{rows:?}");
    let text = stdout(&heapscope_headless(&args, &dir));
    assert!(text.contains("tlsf at step 1 of 4 (entry 6 of the recording):"), "{text}");
}

/// `convert x.csv --out x.csv` replaced the recording by its conversion; every command that writes a file refuses
/// to write over the recording it reads, however the path names it, and leaves it as it was.
#[test]
fn no_command_writes_over_the_recording_it_reads() {
    let dir = temp_dir("over-the-input");
    let text = "# a caption\na,1,4096\nf,1\n";
    std::fs::write(dir.join("x.csv"), text).unwrap();
    let whole_path = dir.join("x.csv");
    for args in [
        vec!["convert", "x.csv", "--out", "x.csv"],
        vec!["convert", "x.csv", "--out", "./x.csv"],
        vec!["export", "x.csv", "--policy", "tlsf", "--out", "x.csv"],
        vec!["export", "x.csv", "--policy", "tlsf", "--out", "y.pickle", "--vma-json", "x.csv"],
        vec!["render", "x.csv", "--out", whole_path.to_str().unwrap()],
        vec!["bench", "--workload", "replay", "x.csv", "--backend", "sim", "--save-trace", "x.csv"],
    ] {
        let output = heapscope_headless(&args, &dir);
        assert!(!output.status.success(), "{args:?}");
        assert!(
            stderr(&output).contains("is the recording being read: writing there would replace it"),
            "{args:?}: {}",
            stderr(&output)
        );
        assert_eq!(std::fs::read_to_string(dir.join("x.csv")).unwrap(), text, "{args:?}");
        assert!(!dir.join("y.pickle").exists(), "{args:?}");
    }
    // The recording named as the partial file its output is written to first (cleared before writing) is kept too.
    std::fs::write(dir.join(".x.hst.partial"), text).unwrap();
    let output = heapscope_headless(&["convert", ".x.hst.partial", "--out", "x.hst"], &dir);
    assert!(!output.status.success() && stderr(&output).contains("writing there would remove it"), "{}", stderr(&output));
    assert_eq!(std::fs::read_to_string(dir.join(".x.hst.partial")).unwrap(), text);
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
    // The demo's blocks cache what empties, as PyTorch does: the twenty 150 MiB blocks stay, each 100 MiB tensor
    // takes one and leaves 50 MiB free, and 1 GiB meets fragmentation with 2.93 GiB reserved, as PyTorch's default
    // allocator does on the real device.
    let blocks = find("tlsf", "blocks");
    assert_eq!(blocks["served"], false);
    assert_eq!(blocks["verdict"]["cause"], "fragmentation");
    assert_eq!(blocks["reserved_bytes"], 3000_u64 << 20);
    assert_eq!(blocks["largest_free_run_bytes"], 50_u64 << 20);
    // Buddy rounds 150 MiB up to 256 MiB: only 14 of the first 20 fit.
    assert_eq!(find("buddy", "range")["failed_before"], 6);
}

#[test]
fn demo_flags_change_the_heap_rules() {
    // With empty blocks released at once, or by the heap's default rule (keep one shared empty block; a dedicated
    // block goes back as it empties, as VMA does), the 20 x 150 MiB blocks go back and 1 GiB fits again.
    for release in ["immediately", "keep-one"] {
        let lines = json_lines(&heapscope(&["demo", "--json", "--policy", "tlsf", "--release", release]));
        assert_eq!(lines.len(), 2);
        assert!(lines.iter().all(|line| line["served"] == true), "{release}: {lines:?}");
    }
    // A verdict in the table reads as its name does everywhere ("internal waste", not the variant's "internalwaste").
    let text = stdout(&heapscope(&["demo", "--min-align", "1GiB", "--policy", "tlsf"]));
    assert!(text.contains("oom (internal waste)") && !text.contains("internalwaste"), "{text}");
    // The header says what the blocks do once empty, by the rule in force (it said "cached" whatever the rule).
    for (release, words) in [
        ("on-pressure", "in blocks cached once empty until a reservation fails"),
        ("keep-one", "in blocks given back once empty but one"),
        ("never", "in blocks never given back"),
    ] {
        let text = stdout(&heapscope(&["demo", "--policy", "tlsf", "--release", release]));
        assert!(text.contains(words), "{release}: {text}");
    }
    // --png beside --json draws the picture too (it was never drawn), saying where on standard error.
    let dir = temp_dir("demo-json-png");
    let output = heapscope_headless(&["demo", "--json", "--png", "j.png"], &dir);
    if gpu_required() || output.status.success() {
        assert!(output.status.success(), "{}", stderr(&output));
        assert!(is_png(&dir.join("j.png")), "{}", stderr(&output));
        assert!(stderr(&output).contains("the heap at the end of the story: j.png"), "{}", stderr(&output));
        assert_eq!(json_lines(&output).len(), 16, "{}", stdout(&output));
    }
}

fn snapshot(name: &str) -> PathBuf {
    trace(&format!("pytorch/{name}.pickle.gz"))
}

/// PyTorch's own `memory_stats` and `memory_summary` for a snapshot (recorded beside it).
fn ground_truth(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(trace(&format!("pytorch/{name}.json"))).unwrap()).unwrap()
}

const JSON_KEYS: [&str; 13] = [
    "policy",
    "events",
    "allocs",
    "frees",
    "peak_live_bytes",
    "peak_reserved_bytes",
    "device_allocs",
    "device_frees",
    "ooms",
    "first_oom",
    "ns_per_event",
    "fidelity",
    "entries",
];

#[test]
fn replay_of_a_real_snapshot_reproduces_pytorch() {
    for name in ["gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
        let truth = &ground_truth(name)["memory_stats"];
        let lines = json_lines(&heapscope(&["replay", snapshot(name).to_str().unwrap(), "--json"]));
        let policies: Vec<&str> = lines.iter().map(|line| line["policy"].as_str().unwrap()).collect();
        assert_eq!(policies, ["pytorch", "tlsf", "best-fit", "first-fit", "buddy", "paged"]);
        for line in &lines {
            for key in JSON_KEYS {
                assert!(line.get(key).is_some(), "{name}: key {key} in {line}");
            }
            assert_eq!(line["entries"], lines[0]["entries"], "one numbering for every contender: {line}");
            assert!(line["entries"].as_u64() > Some(0), "{line}");
            // Every contender saw the same requests: PyTorch's own peak of requested bytes.
            assert_eq!(line["peak_live_bytes"], truth["requested_bytes.all.peak"], "{name}: {line}");
            assert_eq!((line["allocs"].as_u64(), line["ooms"].as_u64()), (Some(6179), Some(0)), "{name}: {line}");
            assert!(line["peak_reserved_bytes"].as_u64() >= line["peak_live_bytes"].as_u64(), "{line}");
        }
        let pytorch = &lines[0];
        assert_eq!(pytorch["peak_reserved_bytes"], truth["reserved_bytes.all.peak"], "{name}");
        assert_eq!(pytorch["device_allocs"], truth["num_device_alloc"], "{name}");
        let fidelity = &pytorch["fidelity"];
        assert_eq!(fidelity["matched"], fidelity["recorded"], "{name}: {fidelity}");
        assert!(fidelity["recorded"].as_u64().unwrap() > 100, "{name}: {fidelity}");
        assert_eq!((fidelity["placement_matched"].as_u64(), fidelity["allocs"].as_u64()), (Some(6179), Some(6179)), "{name}");
        assert!(fidelity["first_mismatch"].is_null(), "{name}: {fidelity}");
        assert!(lines[1..].iter().all(|line| line["fidelity"].is_null()));
    }
}

#[test]
fn the_fragmentation_oom_happens_where_pytorch_had_it() {
    const MIB: u64 = 1 << 20;
    let default =
        json_lines(&heapscope(&["replay", snapshot("frag_oom-default").to_str().unwrap(), "--capacity", "3584MiB", "--json"]));
    let find = |lines: &[Value], policy: &str| lines.iter().find(|line| line["policy"] == policy).unwrap().clone();
    let pytorch = find(&default, "pytorch");
    assert_eq!(pytorch["ooms"], 1);
    let oom = &pytorch["first_oom"];
    assert_eq!(oom["request_bytes"], 1024 * MIB);
    assert_eq!(oom["free_bytes"], 1000 * MIB, "1000 MiB reserved but unallocated, as PyTorch said: {oom}");
    assert_eq!(oom["reserved_bytes"], 3000 * MIB);
    assert_eq!(oom["verdict"], "fragmentation");
    assert_eq!(oom["event_index"], 100, "the recorded oom entry");
    assert_eq!(find(&default, "paged")["ooms"], 0);
    // Frees count real frees: the refused request has none, and the run frees everything it allocated.
    for line in &default {
        assert_eq!(line["frees"], line["allocs"], "{line}");
    }
    let expandable = json_lines(&heapscope(&[
        "replay",
        snapshot("frag_oom-expandable").to_str().unwrap(),
        "--capacity",
        "3584MiB",
        "--json",
        "--policy",
        "pytorch",
    ]));
    assert_eq!(expandable.len(), 1);
    assert_eq!(expandable[0]["ooms"], 0);
    // The same file replayed with expandable segments switched on by hand.
    let by_hand = json_lines(&heapscope(&[
        "replay",
        snapshot("frag_oom-default").to_str().unwrap(),
        "--capacity",
        "3584MiB",
        "--json",
        "--policy",
        "pytorch",
        "--alloc-conf",
        "expandable_segments:True",
    ]));
    assert_eq!(by_hand[0]["ooms"], 0);
}

#[test]
fn paged_under_pressure_reuses_its_pages_and_still_serves_frag_oom() {
    let file = snapshot("frag_oom-default");
    let run = |rule: &str| {
        let args = ["replay", file.to_str().unwrap(), "--capacity", "3584MiB", "--json", "--policy", "paged"];
        json_lines(&heapscope(&[&args[..], &["--paged-unmap", rule]].concat())).remove(0)
    };
    let (eager, pressure) = (run("eager"), run("pressure"));
    assert_eq!((eager["ooms"].as_u64(), pressure["ooms"].as_u64()), (Some(0), Some(0)));
    // Under pressure the 150 MiB pages stay mapped for the 100 MiB allocations: fewer map calls, same peak.
    assert!(pressure["device_allocs"].as_u64() < eager["device_allocs"].as_u64(), "{pressure} vs {eager}");
    assert_eq!(pressure["peak_reserved_bytes"], eager["peak_reserved_bytes"]);
}

/// `--compact on-oom`: a heap refused 200 MiB with 272 MiB free in two blocks; compacting empties one block and the
/// request is served. The row says what moved; `--vulkan` refuses the flag for now.
#[test]
fn compacting_on_a_refusal_is_reported() {
    let file = crate::common::scattered_trace("compact");
    let path = file.to_str().unwrap();
    let args = ["replay", path, "--capacity", "512MiB", "--policy", "tlsf", "--fixed-blocks"];
    let lines = json_lines(&heapscope(&[&args[..], &["--json", "--compact", "on-oom"]].concat()));
    assert_eq!(lines[0]["ooms"].as_u64(), Some(0), "{}", lines[0]);
    assert_eq!(lines[0]["compaction"]["ooms_avoided"].as_u64(), Some(1), "{}", lines[0]);
    let table = stdout(&heapscope(&[&args[..], &["--compact", "on-oom"]].concat()));
    assert!(table.contains("compaction: 4 moves, 240.00 MiB copied, 1 of its refusals served after compacting"), "{table}");
    let without = json_lines(&heapscope(&[&args[..], &["--json"]].concat()));
    assert_eq!((without[0]["ooms"].as_u64(), &without[0]["compaction"]), (Some(1), &Value::Null));
    let bad = heapscope(&[&args[..], &["--compact", "every:0"]].concat());
    assert!(stderr(&bad).contains("never, on-oom or every:N"), "{}", stderr(&bad));
}

/// `paged` in a virtual range of 512 MiB: the same scattered trace leaves 272 MiB of the range free in runs of at
/// most 92 MiB, so 200 MiB is refused for fragmentation of the range; compacting slides three allocations down by
/// remapping their pages (nothing copied) and the request is served. A virtual range under a page is refused.
#[test]
fn paged_compacts_by_remapping_its_pages() {
    let file = crate::common::scattered_trace("compact-paged");
    let path = file.to_str().unwrap();
    let args = ["replay", path, "--capacity", "512MiB", "--policy", "paged", "--virtual-size", "512MiB"];
    let without = json_lines(&heapscope(&[&args[..], &["--json"]].concat())).remove(0);
    assert_eq!(without["ooms"].as_u64(), Some(1), "{without}");
    let with = json_lines(&heapscope(&[&args[..], &["--json", "--compact", "on-oom"]].concat())).remove(0);
    assert_eq!(with["ooms"].as_u64(), Some(0), "{with}");
    let compaction = &with["compaction"];
    assert_eq!(
        (compaction["moves"].as_u64(), compaction["bytes_moved"].as_u64(), compaction["bytes_remapped"].as_u64()),
        (Some(3), Some(0), Some(180 << 20)),
        "{with}"
    );
    // The eight 60 MiB allocations at once; the moved ones kept their pages (440 MiB mapped at the end).
    assert_eq!(with["peak_reserved_bytes"].as_u64(), Some(480 << 20), "{with}");
    let table = stdout(&heapscope(&[&args[..], &["--compact", "on-oom"]].concat()));
    assert!(table.contains("compaction: 3 moves, 0 B copied, 180.00 MiB remapped, 1 of its refusals served"), "{table}");
    let tiny = heapscope(&["replay", path, "--policy", "paged", "--virtual-size", "4KiB"]);
    assert!(stderr(&tiny).contains("--virtual-size 4.00 KiB: smaller than one page (2.00 MiB)"), "{}", stderr(&tiny));
}

/// frag_oom with its first ten allocations labelled `user_metadata: warm-up` and the rest `compile_context: step`
/// (what `torch.cuda.memory._set_memory_metadata` and `torch.compile` write), written as a pickle in `dir`.
fn labelled_frag_oom(dir: &Path) -> PathBuf {
    let mut labelled = heapscope_pytorch::read_snapshot(&snapshot("frag_oom-default")).unwrap();
    labelled.categories = vec![
        heapscope_pytorch::Category::none(),
        heapscope_pytorch::Category { key: heapscope_pytorch::CategoryKey::UserMetadata, name: "warm-up".into() },
        heapscope_pytorch::Category { key: heapscope_pytorch::CategoryKey::CompileContext, name: "step".into() },
    ];
    let mut allocs = 0;
    for entry in &mut labelled.device_traces[0] {
        if entry.action == heapscope_pytorch::Action::Alloc {
            allocs += 1;
        }
        entry.category = heapscope_pytorch::CategoryId(if allocs <= 10 { 1 } else { 2 });
    }
    let path = dir.join("labelled.pickle");
    heapscope_pytorch::write_snapshot(&labelled, std::fs::File::create(&path).unwrap()).unwrap();
    path
}

/// `top`'s table past `--limit` sums the rows left out: seventeen allocations of 2^60 B (the most PyTorch asks of the
/// driver) from three places add up past a u64, shown saturated (the sum overflowed: a panic, exit 101).
#[test]
fn top_sums_the_rows_left_out_saturated() {
    use heapscope_pytorch::{Action, Frame, Snapshot, StackId, TraceEntry};
    let dir = temp_dir("top-huge");
    let frame = |line: i64| Frame { filename: "train.py".into(), line, name: "step".into() };
    let snapshot = Snapshot {
        device_traces: vec![
            (0..17u32)
                .map(|k| TraceEntry::new(Action::Alloc, u64::from(k) * 512, 1 << 60).with_frames(StackId(1 + k % 3)))
                .collect(),
        ],
        frame_stacks: vec![Vec::new(), vec![frame(1)], vec![frame(2)], vec![frame(3)]],
        ..Snapshot::default()
    };
    let path = dir.join("huge.pickle");
    heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
    let output = heapscope(&["top", path.to_str().unwrap(), "--limit", "1"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("... 2 groups more"), "{}", stdout(&output));
    std::fs::remove_dir_all(dir).ok();
}

/// `top` says what its answer cannot tell, as `advise` does: an entry of an action heapscope does not know (it said
/// nothing), here a pickle written byte by byte with an allocation and a `teleport`.
#[test]
fn top_says_what_the_recording_cannot_tell() {
    let dir = temp_dir("top-unknown");
    let path = dir.join("unknown.pickle");
    let bytes = [
        b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]](".as_slice(),
        b"}(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00\x10\x8c\x04sizeM\x00\x02\x8c\x06streamK\x00u",
        b"}(\x8c\x06action\x8c\x08teleport\x8c\x04addrK\x00\x8c\x04sizeK\x00\x8c\x06streamK\x00u",
        b"eau.",
    ]
    .concat();
    std::fs::write(&path, bytes).unwrap();
    let text = stdout(&heapscope(&["top", path.to_str().unwrap()]));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].ends_with("512 B live at the peak (entry 0), in 1 allocation"), "{text}");
    assert!(lines[1].starts_with("1 entry of an action heapscope does not know (\"teleport\", the first at entry 1)"), "{text}");
    std::fs::remove_dir_all(dir).ok();
}

/// `heapscope top`: what holds the memory. frag_oom's peak is twenty allocations from one line of the capture script;
/// at the out-of-memory entry, 1.95 GiB are live from another line and the refused 1 GiB request names its own frames.
/// A recording that refused nothing has no `--at oom`.
#[test]
fn top_says_what_holds_the_memory() {
    let file = snapshot("frag_oom-default");
    let path = file.to_str().unwrap();
    let oom = json_lines(&heapscope(&["top", path, "--at", "oom", "--json"])).remove(0);
    assert_eq!(
        (oom["at"].as_str(), oom["event_index"].as_u64(), oom["moment"].as_str()),
        (Some("oom"), Some(99), Some("entry 99"))
    );
    assert_eq!((oom["live_bytes"].as_u64(), oom["live_count"].as_u64()), (Some(2000 << 20), Some(20)), "{oom}");
    let row = &oom["rows"][0];
    assert_eq!((row["bytes"].as_u64(), row["count"].as_u64(), row["share"].as_f64()), (Some(2000 << 20), Some(20), Some(1.0)));
    assert_eq!(row["frames"][0].as_str(), Some("wl_frag_oom (capture.py:85)"), "{oom}");
    assert_eq!((oom["refused"]["entry"].as_u64(), oom["refused"]["bytes"].as_u64()), (Some(100), Some(1 << 30)), "{oom}");
    assert_eq!(oom["refused"]["frames"][0].as_str(), Some("wl_frag_oom (capture.py:88)"), "{oom}");
    let table = stdout(&heapscope(&["top", path]));
    assert!(table.starts_with(&format!("{path}: 2.93 GiB live at the peak (entry 39), in 20 allocations")), "{table}");
    assert!(table.contains("    2.93 GiB      20 100.0%  wl_frag_oom (capture.py:83)"), "{table}");
    let full = json_lines(&heapscope(&["top", path, "--at", "39", "--full-stack", "--json"])).remove(0);
    assert_eq!(full["grouping"].as_str(), Some("full_stack"));
    assert_eq!(full["rows"][0]["frames"], serde_json::json!(["wl_frag_oom (capture.py:83)", "<module> (capture.py:166)"]));
    let gpt2 = snapshot("gpt2_train_fixed-default");
    let refused = heapscope(&["top", gpt2.to_str().unwrap(), "--at", "oom"]);
    assert!(stderr(&refused).contains("has no out-of-memory entry: nothing was refused"), "{}", stderr(&refused));
    let bad = heapscope(&["top", path, "--at", "later"]);
    assert!(stderr(&bad).contains("\"later\" is no moment: expected `peak`, `oom`"), "{}", stderr(&bad));
    // By category (see `labelled_frag_oom`).
    let dir = temp_dir("top-categories");
    let labelled_path = labelled_frag_oom(&dir);
    let labelled_file = labelled_path.to_str().unwrap();
    let by_category = json_lines(&heapscope(&["top", labelled_file, "--by-category", "--json"])).remove(0);
    assert_eq!(by_category["grouping"].as_str(), Some("category"));
    let rows: Vec<(Option<&str>, Option<u64>)> =
        by_category["rows"].as_array().unwrap().iter().map(|row| (row["category"].as_str(), row["count"].as_u64())).collect();
    // Equal bytes and counts: by name.
    assert_eq!(rows, [(Some("compile_context: step"), Some(10)), (Some("user_metadata: warm-up"), Some(10))], "{by_category}");
    let table = stdout(&heapscope(&["top", labelled_file, "--by-category"]));
    assert!(table.contains("category (the entry's label)") && table.contains("50.0%  user_metadata: warm-up"), "{table}");
    let both = heapscope(&["top", labelled_file, "--by-category", "--full-stack"]);
    assert!(!both.status.success() && stderr(&both).contains("cannot be used with"), "{}", stderr(&both));
}

#[test]
fn compare_says_why_in_one_sentence() {
    let output = heapscope(&["compare", snapshot("frag_oom-default").to_str().unwrap(), "--capacity", "3584MiB"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    for policy in ["pytorch", "tlsf", "best-fit", "first-fit", "buddy", "paged"] {
        assert!(text.lines().any(|line| line.starts_with(policy)), "a row for {policy}: {text}");
    }
    // The short column names explained under the table, the fidelity's with the emulation's row.
    let legend = text.lines().find(|line| line.starts_with("(allocs: ")).unwrap_or_default();
    for term in [
        "allocs: allocations served, those live at the start included",
        "peak live: ",
        "res/live: peak reserved over peak live",
        "dev alloc: ",
        "ns/event: ",
        "the driver's rule foretold",
    ] {
        assert!(legend.contains(term), "{term}: {legend}");
    }
    let sentence = text.lines().last().unwrap();
    // Issue 19: the device's free memory in the same line, so that 1000 MiB against 1 GiB does not read as too little.
    assert!(
        sentence.contains(
            "1000.00 MiB free in reserved memory and 584.00 MiB more on the device, 1.55 GiB in all, but the largest free \
             run is 50.00 MiB (fragmentation)"
        ),
        "{sentence}"
    );
    assert!(sentence.ends_with("`paged` and `pytorch` with expandable segments would have served it."), "{sentence}");

    // PyTorch's free blocks that a request cannot use (here large ones, for a small request) are said apart: a 60 MiB
    // segment half live on a device of 61 MiB, then a 100 KiB request, which needs a 2 MiB small segment.
    let dir = temp_dir("pools-apart");
    let csv = dir.join("pools.csv");
    std::fs::write(&csv, "a,0,62914560\nf,0\na,1,31457280\na,2,102400\n").unwrap();
    let output = heapscope(&["compare", csv.to_str().unwrap(), "--capacity", "61MiB", "--policy", "pytorch"]);
    let sentence = stdout(&output).lines().last().unwrap_or_default().to_owned();
    assert!(
        sentence.contains(
            "30.00 MiB free in reserved memory and 1.00 MiB more on the device, 31.00 MiB in all, but 30.00 MiB of it is \
             cached in blocks this request cannot use (PyTorch keeps small and large blocks, streams and pools apart) and \
             the largest free block it could use is 0 B (fragmentation)"
        ),
        "{sentence}"
    );
    let line =
        &json_lines(&heapscope(&["replay", csv.to_str().unwrap(), "--capacity", "61MiB", "--policy", "pytorch", "--json"]))[0];
    let oom = &line["first_oom"];
    assert_eq!((oom["free_bytes"].as_u64(), oom["unusable_free_bytes"].as_u64()), (Some(30 << 20), Some(30 << 20)), "{line}");
    assert_eq!(oom["largest_free_bytes"], 0, "{line}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn summary_is_pytorchs_memory_summary() {
    for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
        let output = heapscope(&["summary", snapshot(name).to_str().unwrap()]);
        assert!(output.status.success(), "{}", stderr(&output));
        assert_eq!(stdout(&output), ground_truth(name)["memory_summary"].as_str().unwrap(), "{name}");
    }
    // Other contenders get the same layout with their own numbers; stderr says whose table it is, and a what-if's.
    let output = heapscope(&["summary", snapshot("gpt2_train_fixed-default").to_str().unwrap(), "--policy", "tlsf"]);
    let text = stdout(&output);
    assert!(text.contains("PyTorch CUDA memory summary, device ID 0") && text.contains("GPU reserved memory"), "{text}");
    assert_ne!(text, ground_truth("gpt2_train_fixed-default")["memory_summary"].as_str().unwrap());
    assert!(stderr(&output).contains("gpt2_train_fixed-default.pickle.gz replayed through tlsf"), "{}", stderr(&output));
    let what_if =
        heapscope(&["summary", snapshot("frag_oom-default").to_str().unwrap(), "--alloc-conf", "expandable_segments:True"]);
    assert!(
        stderr(&what_if).contains("replayed through pytorch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
            && stderr(&what_if).contains("a what-if"),
        "{}",
        stderr(&what_if)
    );
}

#[test]
fn export_writes_a_snapshot_pytorch_and_heapscope_read() {
    let dir = temp_dir("export");
    let source = snapshot("gpt2_train_fixed-default");
    for policy in ["pytorch", "tlsf"] {
        let out = dir.join(format!("{policy}.pickle"));
        let output = heapscope(&["export", source.to_str().unwrap(), "--policy", policy, "--out", out.to_str().unwrap()]);
        assert!(output.status.success(), "{}", stderr(&output));
        let said = if policy == "pytorch" { "through pytorch with PYTORCH_CUDA_ALLOC_CONF=\"\":" } else { "through tlsf:" };
        assert!(stderr(&output).contains(said), "{}", stderr(&output));
        // heapscope reads it back: the same requests, and the exported contender's own layout.
        let lines =
            json_lines(&heapscope(&["replay", out.to_str().unwrap(), "--json", "--policy", "pytorch", "--policy", "tlsf"]));
        assert_eq!(
            lines[1]["peak_live_bytes"],
            ground_truth("gpt2_train_fixed-default")["memory_stats"]["requested_bytes.all.peak"]
        );
        if policy == "pytorch" {
            // The emulation's own export replays exactly through the emulation.
            assert_eq!(lines[0]["fidelity"]["matched"], lines[0]["fidelity"]["recorded"], "{}", lines[0]);
        }
        // python3's pickle reads it with PyTorch's schema.
        let check = r#"
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
assert set(s) >= {"segments", "device_traces"}, s.keys()
for seg in s["segments"]:
    assert set(seg) >= {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream", "segment_type", "is_expandable", "frames", "blocks"}, seg.keys()
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    for b in seg["blocks"]:
        assert b["state"] in ("active_allocated", "active_pending_free", "inactive"), b
actions = {e["action"] for e in s["device_traces"][0]}
assert {"alloc", "free_requested", "free_completed"} <= actions, actions
assert actions & {"segment_alloc", "segment_map"}, actions
print(len(s["device_traces"][0]))
"#;
        match Command::new("python3").arg("-c").arg(check).arg(&out).output() {
            Ok(python) => assert!(python.status.success(), "{policy}: {}", String::from_utf8_lossy(&python.stderr)),
            Err(error) => eprintln!("python3 is not available ({error}): schema check skipped"),
        }
    }
    // The settings each what-if ran with are said: `pytorch-expandable` is the other setting than the recording's.
    for (name, said) in [
        ("gpt2_train_fixed-default", "pytorch-expandable with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True:"),
        ("gpt2_train_fixed-expandable", "pytorch-expandable with PYTORCH_CUDA_ALLOC_CONF=\"\":"),
    ] {
        let out = dir.join(format!("{name}.pickle"));
        let source = snapshot(name);
        let args = ["export", source.to_str().unwrap(), "--policy", "pytorch-expandable", "--out", out.to_str().unwrap()];
        let output = heapscope(&args);
        assert!(output.status.success() && stderr(&output).contains(said), "{name}: {}", stderr(&output));
    }
    // A heap contender's export of frag_oom replays through `pytorch` as the recording does: its segment frees are
    // TLSF's own releases, not `empty_cache()` calls (taken for 29 of them, the 1 GiB was served).
    let source = snapshot("frag_oom-default");
    let out = dir.join("frag_oom-tlsf.pickle");
    let output = heapscope(&["export", source.to_str().unwrap(), "--policy", "tlsf", "--out", out.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let of = |file: &Path| json_lines(&heapscope(&["replay", file.to_str().unwrap(), "--json", "--policy", "pytorch"]));
    let (recorded, exported) = (of(&source), of(&out));
    for key in ["events", "allocs", "frees", "ooms"] {
        assert_eq!(recorded[0][key], exported[0][key], "{key}: {} vs {}", recorded[0], exported[0]);
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn convert_to_the_native_format_keeps_the_replay() {
    let dir = temp_dir("convert");
    let native = dir.join("gpt2.hst");
    let source = snapshot("gpt2_train_fixed-default");
    let output = heapscope(&["convert", source.to_str().unwrap(), "--out", native.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let from_pickle =
        json_lines(&heapscope(&["replay", source.to_str().unwrap(), "--json", "--policy", "best-fit", "--policy", "paged"]));
    let from_native =
        json_lines(&heapscope(&["replay", native.to_str().unwrap(), "--json", "--policy", "best-fit", "--policy", "paged"]));
    for (a, b) in from_pickle.iter().zip(&from_native) {
        for key in ["events", "allocs", "frees", "peak_live_bytes", "peak_reserved_bytes", "device_allocs", "ooms"] {
            assert_eq!(a[key], b[key], "{key}: {a} vs {b}");
        }
    }
    assert!(std::fs::metadata(&native).unwrap().len() < 64 << 10, "compact");
    // What the native trace leaves out of a snapshot is said, with the flag that gives it back to the replay: the
    // device an oom entry tells, the recorded settings. With it, the replay of the trace is the snapshot's.
    for (name, flag, policy) in [("frag_oom-default", "--capacity", "tlsf"), ("frag_oom-expandable", "--alloc-conf", "pytorch")] {
        let source = snapshot(name);
        let native = dir.join(format!("{name}.hst"));
        let output = heapscope(&["convert", source.to_str().unwrap(), "--out", native.to_str().unwrap()]);
        let said = stderr(&output);
        assert!(output.status.success() && said.contains("the native trace keeps allocations and frees; left out: "), "{said}");
        let value = said.split(&format!("{flag} ")).nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap();
        let of_pickle = json_lines(&heapscope(&["replay", source.to_str().unwrap(), "--json", "--policy", policy]));
        let of_native = json_lines(&heapscope(&["replay", native.to_str().unwrap(), "--json", "--policy", policy, flag, value]));
        for key in ["allocs", "peak_live_bytes", "peak_reserved_bytes", "device_allocs", "ooms"] {
            assert_eq!(of_pickle[0][key], of_native[0][key], "{name}, {flag} {value}: {key}");
        }
        assert!(said.contains("the segments' recorded addresses"), "what a what-if may place otherwise: {said}");
        if flag == "--capacity" {
            // compare's verdict on the trace names who would have served it as on the snapshot: expandable segments
            // too (a trace's `pytorch` was never tried with them).
            let verdict = |file: &Path, extra: &[&str]| {
                let mut args = vec!["compare", file.to_str().unwrap()];
                args.extend(extra);
                stdout(&heapscope(&args)).lines().last().unwrap_or_default().to_owned()
            };
            let of_snapshot = verdict(&source, &[]);
            assert!(of_snapshot.ends_with("`paged` and `pytorch` with expandable segments would have served it."));
            assert_eq!(verdict(&native, &[flag, value]), of_snapshot);
        }
    }
    // A recording's `empty_cache()` (a segment freed, then the memory allocated afresh) is an event of the trace: kept
    // (it was left out, and said).
    {
        use heapscope_pytorch::{Action, Snapshot, TraceEntry};
        let mib = 1u64 << 20;
        let trace = vec![
            TraceEntry::new(Action::SegmentAlloc, 0x1000_0000, 30 * mib),
            TraceEntry::new(Action::Alloc, 0x1000_0000, 30 * mib),
            TraceEntry::new(Action::FreeCompleted, 0x1000_0000, 30 * mib),
            TraceEntry::new(Action::SegmentFree, 0x1000_0000, 30 * mib),
            TraceEntry::new(Action::SegmentAlloc, 0x2000_0000, 40 * mib),
            TraceEntry::new(Action::Alloc, 0x2000_0000, 40 * mib),
        ];
        let snapshot = Snapshot { device_traces: vec![trace], ..Snapshot::default() };
        let path = dir.join("empty-cache.pickle");
        heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
        let converted = dir.join("empty-cache.hst");
        let output = heapscope(&["convert", path.to_str().unwrap(), "--out", converted.to_str().unwrap()]);
        assert!(
            stderr(&output).contains("the `empty_cache()` calls among their frees are kept as events"),
            "{}",
            stderr(&output)
        );
        let events = heapscope_core::trace::Trace::read(&converted).unwrap().events().to_vec();
        assert_eq!(events.iter().filter(|&&event| event == heapscope_core::trace::Event::EmptyCache).count(), 1, "{events:?}");
    }
    // A CSV trace converted holds its file's name, not the path it was read through, and converting the native trace
    // again gives the same bytes (the name nested `(from ...)` once more each time).
    std::fs::write(dir.join("small.csv"), "a,1,4096\nf,1\n").unwrap();
    let once = dir.join("once.hst");
    let twice = dir.join("twice.hst");
    assert!(heapscope(&["convert", dir.join("small.csv").to_str().unwrap(), "--out", once.to_str().unwrap()]).status.success());
    assert!(heapscope(&["convert", once.to_str().unwrap(), "--out", twice.to_str().unwrap()]).status.success());
    assert_eq!(heapscope_core::trace::Trace::read(&once).unwrap().name, "small.csv");
    assert_eq!(std::fs::read(&once).unwrap(), std::fs::read(&twice).unwrap());
    // Frees of blocks a snapshot never shows have no event in a native trace: said, as `replay` says it skips them.
    let mut recorded = heapscope_pytorch::read_snapshot(&snapshot("frag_oom-default")).unwrap();
    // A block freed twice: the second free is of nothing live.
    let trace = &mut recorded.device_traces[0];
    let freed = trace.iter().rev().find(|entry| entry.action == heapscope_pytorch::Action::FreeCompleted).unwrap().clone();
    trace.push(freed);
    let stray = dir.join("stray.pickle");
    heapscope_pytorch::write_snapshot(&recorded, std::fs::File::create(&stray).unwrap()).unwrap();
    let output = heapscope(&["convert", stray.to_str().unwrap(), "--out", dir.join("stray.hst").to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).contains("1 free of allocations the recording never shows"), "{}", stderr(&output));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn bad_input_gets_a_clear_error() {
    let dir = temp_dir("bad");
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "a,1,4096\nf,2\n").unwrap();
    let truncated = dir.join("truncated.pickle.gz");
    let bytes = std::fs::read(snapshot("frag_oom-default")).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let foreign = dir.join("foreign.pickle");
    std::fs::write(&foreign, [0x80, 4, 0x95, 3, 0, 0, 0, 0, 0, 0, 0, b'K', 7, b'.']).unwrap();
    let (bad_path, truncated_path, foreign_path) =
        (bad.to_str().unwrap().to_owned(), truncated.to_str().unwrap().to_owned(), foreign.to_str().unwrap().to_owned());
    let good = snapshot("frag_oom-default");
    let good_path = good.to_str().unwrap();
    let empty = dir.join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    let empty_path = empty.to_str().unwrap().to_owned();
    // Issue 17: a FIFO with no writer (it used to block forever), a folder; a pickle of protocol 0 (it used to be
    // read as CSV).
    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().is_ok_and(|status| status.success());
    assert!(made, "mkfifo makes the FIFO");
    let fifo_path = fifo.to_str().unwrap().to_owned();
    let dir_path = dir.to_str().unwrap().to_owned();
    let protocol0 = dir.join("old.pickle");
    std::fs::write(&protocol0, "(dp0\nVsegments\np1\n(lp2\ns.").unwrap();
    let protocol0_path = protocol0.to_str().unwrap().to_owned();
    // Text named as a snapshot: said to be no pickle, not read as a CSV trace.
    let text = dir.join("text.pickle");
    std::fs::write(&text, "hello world\n").unwrap();
    let text_path = text.to_str().unwrap().to_owned();
    // Issue 17: an unwritable --vma-json is refused before the pickle is written.
    let exported = dir.join("exported.pickle");
    let exported_path = exported.to_str().unwrap().to_owned();
    // An older file at --out: an export that fails leaves it as it was.
    std::fs::write(&exported, b"older").unwrap();
    // A name with control characters (a newline, an escape sequence) is printed escaped: the message stays one line and
    // nothing reaches the terminal as a command.
    let odd = dir.join("odd\nname\u{1b}[31m.csv");
    std::fs::write(&odd, "a,1,64\nx,1\n").unwrap();
    let odd_path = odd.to_str().unwrap().to_owned();
    let cases: [(Vec<&str>, &str); 56] = [
        (vec!["replay", "/nonexistent/trace.csv"], "/nonexistent/trace.csv"),
        (vec!["replay", &odd_path], "odd\\nname\\u{1b}[31m.csv:2: unknown event \"x\""),
        (vec!["replay", &bad_path], "bad.csv:2: free of allocation 2, which is not live"),
        (vec!["replay", &truncated_path], "truncated.pickle.gz"),
        (vec!["replay", &foreign_path], "foreign.pickle"),
        (vec!["replay", good_path, "--align", "3"], "'--align <SIZE>': 3 B is not a power of two"),
        // A flag that changes none of the contenders run is refused, not passed over (summary printed the same table).
        (
            vec!["summary", good_path, "--budget", "1GiB"],
            "--budget applies to the contenders other than PyTorch's emulation only, and this run replays pytorch: it would change nothing",
        ),
        (
            vec!["summary", good_path, "--policy", "tlsf", "--page-size", "4MiB"],
            "--page-size applies to the `paged` contender only, and this run replays tlsf",
        ),
        // A budget at or above the device capacity bounds nothing the capacity does not (it was echoed in the title
        // and named in --vulkan's verdicts as what a contender may reserve).
        (
            vec!["replay", good_path, "--capacity", "64MiB", "--budget", "1GiB", "--policy", "tlsf"],
            "--budget 1.00 GiB: not below the device's 64.00 MiB (--capacity), which bounds every contender already",
        ),
        (
            vec!["compare", good_path, "--capacity", "64MiB", "--budget", "64MiB"],
            "--budget 64.00 MiB: not below the device's 64.00 MiB",
        ),
        // With --vulkan `paged` binds the device's own sparse pages: refused before any device is brought up.
        (
            vec!["replay", good_path, "--vulkan", "--policy", "paged", "--page-size", "64KiB"],
            "--page-size sets the pages of the simulated `paged` contender; with --vulkan `paged` binds the device's own sparse pages",
        ),
        (
            vec!["compare", good_path, "--vulkan", "--page-size", "4MiB"],
            "with --vulkan `paged` binds the device's own sparse pages (their size is the device's), so it would change nothing",
        ),
        (
            vec!["replay", good_path, "--policy", "pytorch", "--policy", "paged", "--block-size", "64MiB"],
            "--block-size applies to the core policies' heaps (tlsf, best-fit, ...) only, and this run replays pytorch, paged",
        ),
        (
            vec!["export", good_path, "--policy", "pytorch", "--out", &exported_path, "--compact", "on-oom"],
            "--compact applies to the contenders other than PyTorch's emulation only",
        ),
        (
            vec!["compare", good_path, "--policy", "pytorch-expandable", "--align", "4096"],
            "--align applies to the contenders other than PyTorch's emulation only",
        ),
        (vec!["replay", good_path, "--min-align", "3"], "'--min-align <SIZE>': 3 B is not a power of two"),
        (vec!["replay", good_path, "--policy", "tlfs"], "unknown policy \"tlfs\""),
        (vec!["replay", good_path, "--alloc-conf", "expandable_segmnts:True"], "expandable_segmnts"),
        (vec!["replay", good_path, "--page-size", "3MiB"], "--page-size 3 MiB is not a power of two"),
        // A range ending inside a page had that page mapped past its end.
        (vec!["replay", good_path, "--virtual-size", "3MiB"], "--virtual-size 3 MiB: not a whole number of pages (2 MiB each)"),
        (vec!["replay", good_path, "--paged-unmap", "lazy"], "unknown unmap rule \"lazy\": expected eager or pressure"),
        (vec!["replay", good_path, "--device", "3"], "no device 3"),
        (vec!["replay", &bad_path, "--device", "1"], "applies to PyTorch snapshots only"),
        (vec!["replay", &empty_path, "--json"], "the file is empty"),
        (vec!["replay", "/dev/zero"], "/dev/zero: not a regular file (a device)"),
        // A file of no size that yields bytes is made as it is read: it may never end.
        (vec!["replay", "/proc/self/pagemap"], "/proc/self/pagemap: not a regular file (a file the system makes as it is read"),
        (vec!["summary", "/dev/urandom"], "/dev/urandom: not a regular file (a device)"),
        (vec!["replay", &fifo_path], "not a regular file (a FIFO)"),
        (vec!["compare", &dir_path], "not a regular file (a folder)"),
        (vec!["replay", &protocol0_path], "old.pickle"),
        (
            vec!["compare", &text_path],
            "text.pickle: not a PyTorch snapshot, as its name says: a pickle starts with 0x80 and its protocol (2 to 5), a \
             gzip file with 1f 8b; this one starts with 68 65 6c 6c 6f 20 77 6f (\"hello wo\")",
        ),
        (vec!["compare", good_path, "--alloc-conf", "backend:cudaMallocAsync"], "native caching allocator only"),
        (vec!["replay", good_path, "--capacity", "0.0004KB"], "would round to 0 bytes"),
        (vec!["replay", good_path, "--capacity", "3.5"], "a fraction of a byte: give it a unit"),
        // Past the largest device modelled: it would be simulated as 1 EiB, and answers named a device it is not.
        (
            vec!["advise", good_path, "--capacity", "18446744073709551615B"],
            "18446744073709551615 B is more than the largest device heapscope models, 1048576 TiB",
        ),
        (vec!["render", good_path, "--capacity", "1048577TiB", "--out", "x.png"], "more than the largest device"),
        // A budget past it let `paged` map 1.5 EiB.
        (vec!["replay", good_path, "--budget", "2097152TiB"], "--budget <SIZE>': 2097152 TiB is more than the largest device"),
        // Just past it: said exactly, not rounded to the largest itself.
        (
            vec!["replay", good_path, "--capacity", "1152921504606846977"],
            "1152921504606846977 B is more than the largest device heapscope models, 1048576 TiB",
        ),
        // A negative moment is the moment's error (clap took it for a flag and hinted at `-- -1`, the FILE).
        (vec!["top", good_path, "--at", "-1"], "\"-1\" is no moment"),
        (vec!["demo", "--budget", "0"], "--budget 0: nothing could be allocated"),
        (vec!["replay", good_path, "--capacity", "0"], "0 B: a device of no memory holds nothing"),
        // Progress is the device's: a simulated replay took the flag and said nothing.
        (vec!["replay", good_path, "--progress"], "--vulkan"),
        // A device-only allocator is no workload's contender: said before anything runs (it was a failed row).
        (vec!["bench", "--workload", "churn", "--backend", "sim", "--policy", "vma"], "--policy vma: no bench contender"),
        // A picture asked for that cannot be drawn or written fails the command (it exited 0).
        (vec!["demo", "--png", "/nonexistent/x.png"], "--png /nonexistent/x.png: /nonexistent does not exist"),
        (
            vec!["render", "--story", "frag_oom", "--out", "/nonexistent/x.gif"],
            "--out /nonexistent/x.gif: /nonexistent does not exist",
        ),
        // A story brings its own device: a --capacity beside it was drawn without it.
        (
            vec!["render", "--story", "frag_oom", "--capacity", "1GiB", "--out", "x.png"],
            "--device and --capacity apply to a recording FILE",
        ),
        (vec!["demo", "--png", "x.jpg"], "--png x.jpg: heapscope writes a PNG: give a name ending in .png"),
        (vec!["demo", "--png", &dir_path], "a folder, not a file"),
        (vec!["render", "--story", "frag_oom", "--out", &dir_path], "a folder, not a file"),
        (
            vec!["export", good_path, "--policy", "tlsf", "--out", &exported_path, "--vma-json", "/nonexistent/out.json"],
            "cannot write /nonexistent/out.json",
        ),
        (
            vec!["export", good_path, "--policy", "tlsf", "--out", &exported_path, "--vma-json", &exported_path],
            "name the same file: one would overwrite the other",
        ),
        (vec!["demo", "--policy", "nope"], "unknown policy \"nope\""),
        (vec!["demo", "--block-size", "12 parsecs"], "unknown unit"),
        (vec!["demo", "--release", "sometimes"], "unknown release rule"),
        (vec!["demo", "--min-align", "48"], "'--min-align <SIZE>': 48 B is not a power of two"),
        (vec!["demo", "--block-size", "0"], "'--block-size <SIZE>': 0 bytes: nothing fits"),
    ];
    for (args, needle) in cases {
        let output = heapscope(&args);
        assert!(!output.status.success(), "{args:?} must fail");
        assert!(stderr(&output).contains(needle), "{args:?}: {}", stderr(&output));
        assert!(!stderr(&output).contains("panicked"), "{args:?}: {}", stderr(&output));
    }
    assert_eq!(std::fs::read(&exported).unwrap(), b"older", "no pickle written beside a --vma-json that cannot be");
    assert_eq!(
        std::fs::read_dir(&dir)
            .unwrap()
            .filter(|entry| entry.as_ref().unwrap().file_name() == ".exported.pickle.partial")
            .count(),
        0
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn sizes_that_fit_nowhere_are_failed_allocations() {
    let dir = temp_dir("huge");
    let huge = dir.join("huge.csv");
    std::fs::write(&huge, format!("a,1,{}\na,2,4096\nf,2\n", u64::MAX)).unwrap();
    let lines = json_lines(&heapscope(&["replay", huge.to_str().unwrap(), "--json"]));
    for line in &lines {
        assert_eq!((line["allocs"].as_u64(), line["ooms"].as_u64()), (Some(1), Some(1)), "{line}");
    }
    // Issue 17: 2^64 - 512 B under the largest capacity modelled (2^60 B; a larger one is refused) and less: no page
    // count wraps to 0 B reserved.
    let near = dir.join("near.csv");
    std::fs::write(&near, format!("a,1,{}\n", u64::MAX - 511)).unwrap();
    for capacity in ["1048576TiB", "4096TiB"] {
        let lines =
            json_lines(&heapscope(&["replay", near.to_str().unwrap(), "--policy", "paged", "--capacity", capacity, "--json"]));
        assert_eq!((lines[0]["allocs"].as_u64(), lines[0]["ooms"].as_u64()), (Some(0), Some(1)), "{capacity}: {}", lines[0]);
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn policies_lists_every_policy() {
    let text = stdout(&heapscope(&["policies"]));
    assert_eq!(text.lines().count(), 8, "{text}");
    assert!(text.starts_with("tlsf "), "{text}");
}

/// A recording begun mid-run (written here: a shared snapshot with the first half of its trace cut, as
/// `_record_memory_history()` switched on late leaves it) puts every contender on the same stream: each holds the
/// start state, so every one that refuses nothing peaks at the same live bytes; the table says what was live at the
/// start; every command takes every contender name.
#[test]
fn every_contender_replays_a_mid_run_recording_from_its_start() {
    let dir = temp_dir("mid-run");
    let mut snapshot = heapscope_pytorch::read_snapshot(&snapshot("gpt2_train_fixed-default")).unwrap();
    let entries = snapshot.device_traces[0].len();
    snapshot.device_traces[0].drain(..entries / 2);
    let path = dir.join("mid-run.pickle");
    heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
    let file = path.to_str().unwrap();
    let names = ["pytorch", "pytorch-expandable", "tlsf", "best-fit", "first-fit", "buddy", "paged"];
    let mut args = vec!["replay", file, "--json"];
    for name in names {
        args.extend(["--policy", name]);
    }
    let lines = json_lines(&heapscope(&args));
    assert_eq!(lines.len(), names.len());
    for line in &lines {
        assert_eq!(line["ooms"], 0, "{line}");
        assert_eq!(line["peak_live_bytes"], lines[0]["peak_live_bytes"], "the same stream: {line}");
        // What holds the start state counts as device allocations for every contender, PyTorch's segments too.
        assert!(line["device_allocs"].as_u64() > Some(0), "{line}");
    }
    let compare = heapscope(&["compare", file, "--policy", "pytorch", "--policy", "pytorch-expandable", "--policy", "tlsf"]);
    assert!(compare.status.success(), "{}", stderr(&compare));
    let text = stdout(&compare);
    assert!(text.contains(&format!("{} entries", entries - entries / 2)), "{text}");
    assert!(
        text.contains("recorded mid-run: ") && text.contains("were live before entry 0; every contender holds them"),
        "{text}"
    );
    for command in
        [vec!["summary", file, "--policy", "pytorch-expandable"], vec!["export", file, "--policy", "pytorch-expandable"]]
    {
        let mut command = command;
        let out = dir.join("export.pickle");
        if command[0] == "export" {
            command.extend(["--out", out.to_str().unwrap()]);
        }
        let output = heapscope(&command);
        assert!(output.status.success(), "{command:?}: {}", stderr(&output));
        if command[0] == "summary" {
            // Its counters start at entry 0, not with the process as PyTorch's own: said under the table.
            assert!(stdout(&output).contains("\nrecorded mid-run: the counters start at entry 0"), "{}", stdout(&output));
        }
    }
    let refused = heapscope(&["summary", file, "--policy", "vma"]);
    assert!(stderr(&refused).contains("vma runs on a Vulkan device only"), "{}", stderr(&refused));
    // A device smaller than what the recording held at its start never ran it: every command that runs PyTorch's
    // emulation says so and writes nothing.
    let out = dir.join("small.pickle");
    for command in [
        &["replay", file, "--policy", "pytorch", "--capacity", "1GiB"][..],
        &["summary", file, "--capacity", "1GiB"],
        &["export", file, "--policy", "pytorch", "--capacity", "1GiB", "--out", out.to_str().unwrap()],
    ] {
        let output = heapscope(command);
        assert!(!output.status.success(), "{command:?}: {}", stdout(&output));
        assert!(
            stderr(&output).contains(&format!("{file}: the recording began with "))
                && stderr(&output).contains("more than the device's 1.00 GiB: no device of that size ran it"),
            "{command:?}: {}",
            stderr(&output)
        );
    }
    assert!(!out.exists());
}

/// A recording made with expandable segments by a PyTorch that recorded no `allocator_settings` (before 2.5) replays
/// with them, as its segments and page maps show, says so, and every segment event and placement matches.
#[test]
fn expandable_segments_a_file_does_not_record_are_taken_from_its_maps() {
    let dir = temp_dir("unrecorded-settings");
    let mut old = heapscope_pytorch::read_snapshot(&snapshot("frag_oom-expandable")).unwrap();
    old.settings = None;
    let path = dir.join("old.pickle");
    heapscope_pytorch::write_snapshot(&old, std::fs::File::create(&path).unwrap()).unwrap();
    let output = heapscope(&["compare", path.to_str().unwrap(), "--policy", "pytorch"]);
    let text = stdout(&output);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(text.contains("pytorch's settings: expandable_segments:True, as the recording's expandable segments show"), "{text}");
    let fidelity = text.lines().find(|line| line.starts_with("pytorch ")).and_then(|line| line.split("segments ").nth(1));
    let matched = |part: &str| part.split_once('/').is_some_and(|(matched, of)| matched == of.trim_end_matches(','));
    let parts: Vec<&str> = fidelity.unwrap_or_default().split_whitespace().filter(|part| part.contains('/')).collect();
    assert!(parts.len() == 2 && parts.iter().all(|part| matched(part)), "every segment event and placement: {text}");
}

/// A recording of PyTorch 2.12 (every trace entry names its memory pool) from an empty allocator: a CUDA graph captured
/// into its private pool while the default pool caches a block that would fit, the graph deleted, `empty_cache()`.
/// `compare` says the requests went to a private pool, and PyTorch's emulation replays every decision and placement.
#[test]
fn a_cuda_graphs_private_pool_is_served_apart_and_said() {
    use heapscope_pytorch::{Action, Block, BlockState, Pool, PoolId, Segment, Snapshot, TraceEntry};
    let dir = temp_dir("cuda-graph");
    let (d, p) = (0x7000_0000_0000_u64, 0x7000_0020_0000_u64);
    let mib = 1 << 20;
    // (action, address, bytes, in the graph's pool)
    let steps = [
        (Action::SegmentAlloc, d, 2 * mib, false),
        (Action::Alloc, d, 1000, false),
        (Action::FreeRequested, d, 1000, false),
        (Action::FreeCompleted, d, 1000, false),
        (Action::SegmentAlloc, p, 2 * mib, true),
        (Action::Alloc, p, 1000, true),
        (Action::Alloc, p + 1024, 3000, true),
        (Action::Alloc, d, 1000, false),
        (Action::FreeRequested, p, 1000, true),
        (Action::FreeCompleted, p, 1000, true),
        (Action::FreeRequested, p + 1024, 3000, true),
        (Action::FreeCompleted, p + 1024, 3000, true),
        (Action::SegmentFree, p, 2 * mib, true),
    ];
    let trace = steps
        .iter()
        .enumerate()
        .map(|(index, &(action, addr, size, graph))| {
            let pool = if graph { PoolId(1) } else { PoolId::DEFAULT };
            TraceEntry::new(action, addr, size).with_time_us(Some(index as i64)).with_pool_id(pool)
        })
        .collect();
    // The final state: the default pool's segment, holding the block allocated last.
    let blocks = vec![
        Block::new(d, 1024, 1000, BlockState::ActiveAllocated),
        Block::new(d + 1024, 2 * mib - 1024, 0, BlockState::Inactive),
    ];
    let segments = vec![Segment::from_blocks(0, d, 2 * mib, Pool::Small, blocks)];
    let snapshot = Snapshot { segments, device_traces: vec![trace], pool_ids: vec![(0, 0), (0, 1)], ..Snapshot::default() };
    let path = dir.join("graph.pickle");
    heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
    let output = heapscope(&["compare", path.to_str().unwrap(), "--policy", "pytorch", "--policy", "tlsf"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("2 requests of the recording went to 1 private memory pool, which PyTorch serves apart"), "{text}");
    let fidelity = text.lines().find(|line| line.starts_with("pytorch ")).unwrap_or_default();
    assert!(fidelity.contains("segments 3/3, placements 4/4"), "{text}");
    assert!(!text.contains("final segments"), "the final state matches the trace: {text}");
}

/// A file whose final segments do not match the end of its trace (emptied here, as an edited file may be) is read,
/// and `replay`, `compare` and `summary` say how it disagrees.
#[test]
fn final_segments_that_disagree_with_the_trace_are_said() {
    let dir = temp_dir("final-mismatch");
    let mut edited = heapscope_pytorch::read_snapshot(&snapshot("gpt2_train_fixed-default")).unwrap();
    let whole = Recording::from_snapshot("whole", edited.clone(), 0).unwrap();
    assert!(whole.final_mismatch.is_none(), "the shared file agrees with itself: {:?}", whole.final_mismatch);
    edited.segments.clear();
    let path = dir.join("emptied.pickle");
    heapscope_pytorch::write_snapshot(&edited, std::fs::File::create(&path).unwrap()).unwrap();
    let live = Recording::from_snapshot("emptied", edited, 0).unwrap().final_mismatch.live_not_in_segments;
    assert!(live > 0);
    let said = format!(
        "the file's final segments do not match the end of its trace: {live} allocations the trace leaves live are in none \
         of them (the first at 0x"
    );
    let file = path.to_str().unwrap();
    for command in [&["replay", file, "--policy", "tlsf"][..], &["compare", file], &["summary", file]] {
        let output = heapscope(command);
        assert!(output.status.success(), "{command:?}: {}", stderr(&output));
        assert!(stdout(&output).contains(&said), "{command:?}: {}", stdout(&output));
    }
}

/// A recording of three GPUs and a fourth listed with nothing, written here (issue 14, part 4): device 0 the
/// gpt2 run (the busiest), device 1 the frag_oom run (it ran out of memory), device 2 gpt2's final segments and
/// no trace (a state with no trace), device 3 nothing. Frames are left out (each run numbers its own).
fn three_gpu_snapshot(dir: &Path) -> (PathBuf, [usize; 2]) {
    use heapscope_pytorch::{Snapshot, StackId};
    let strip = |mut snapshot: Snapshot, device: u32| {
        for segment in &mut snapshot.segments {
            segment.device = device;
            segment.frames = StackId::default();
            segment.blocks.iter_mut().for_each(|block| block.frames = StackId::default());
        }
        snapshot.device_traces[0].iter_mut().for_each(|entry| entry.frames = StackId::default());
        snapshot
    };
    let gpt2 = strip(heapscope_pytorch::read_snapshot(&snapshot("gpt2_train_fixed-default")).unwrap(), 0);
    let frag = strip(heapscope_pytorch::read_snapshot(&snapshot("frag_oom-default")).unwrap(), 1);
    let state = strip(gpt2.clone(), 2);
    let entries = [gpt2.device_traces[0].len(), frag.device_traces[0].len()];
    let snapshot = Snapshot {
        categories: Vec::new(),
        pool_ids: Vec::new(),
        unknown_actions: Vec::new(),
        contender_export: None,
        segments: [&gpt2, &frag, &state].iter().flat_map(|snapshot| snapshot.segments.clone()).collect(),
        device_traces: vec![gpt2.device_traces[0].clone(), frag.device_traces[0].clone(), Vec::new(), Vec::new()],
        settings: gpt2.settings.clone(),
        frame_stacks: Vec::new(),
    };
    let path = dir.join("three-gpus.pickle");
    heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
    (path, entries)
}

/// Issue 14, part 4: a file of several devices opens on the one that ran out of memory and says so; `compare`,
/// `summary` and `render` print every device (entries, peak reserved, OOMs) and which one is shown, and name
/// another device that ran out of memory; a device the file lacks, or records nothing on, is an error listing
/// the devices it has.
#[test]
fn issue_14_several_devices_are_overviewed_and_chosen() {
    let dir = temp_dir("three-gpus");
    let (path, [gpt2_entries, frag_entries]) = three_gpu_snapshot(&dir);
    let file = path.to_str().unwrap();
    let listed = format!(
        "the file records device 0 ({gpt2_entries} entries), device 1 ({frag_entries} entries, ran out of memory), device 2 \
         (no trace entries, "
    );
    // (the device asked, what the error says)
    for (device, what) in [("3", "device 3 records nothing (no trace entries, no segments)"), ("9", "no device 9")] {
        for command in ["replay", "compare", "summary", "render"] {
            let mut args = vec![command, file, "--device", device];
            if command == "render" {
                args.extend(["--out", "x.png"]);
            }
            let output = heapscope(&args);
            assert_eq!(output.status.code(), Some(1), "{args:?}");
            let error = stderr(&output);
            assert!(error.contains(&format!("{file}: {what}; {listed}")), "{args:?}: {error}");
            assert!(stdout(&output).is_empty(), "{args:?}: nothing replayed, nothing printed");
        }
    }

    // By default: device 1, which ran out of memory, and said so.
    let lines = json_lines(&heapscope(&["replay", file, "--json", "--policy", "pytorch"]));
    assert_eq!(lines[0]["entries"], frag_entries, "{}", lines[0]);
    // A script reading the JSON learns which device it is about.
    assert_eq!(lines[0]["device"], 1, "{}", lines[0]);
    let top = json_lines(&heapscope(&["top", file, "--json"]));
    assert_eq!(top[0]["device"], 1, "{}", top[0]);
    let advised = json_lines(&heapscope(&["advise", file, "--json", "--setting", "expandable_segments:True"]));
    assert!(!advised.is_empty() && advised.iter().all(|line| line["device"] == 1), "{advised:?}");
    assert!(lines[0]["ooms"].as_u64() > Some(0), "{}", lines[0]);
    let overview = |text: &str, shown: usize, why: &str| {
        let head = format!("{file} records 3 devices; showing device {shown} ({why}):");
        assert!(text.contains(&head), "{head:?} in {text}");
        for device in 0..3 {
            let mark = if device == shown { '*' } else { ' ' };
            assert!(text.contains(&format!("\n{mark} device {device}: ")), "device {device} marked {mark:?}: {text}");
        }
        assert!(text.contains(&format!("device 1: {frag_entries} entries, peak reserved ")), "{text}");
        assert!(text.contains("entries, peak reserved 2.93 GiB, 1 OOM"), "device 1's OOM: {text}");
        assert!(text.contains("device 2: no trace entries ("), "{text}");
    };
    let compare = heapscope(&["compare", file, "--policy", "pytorch", "--policy", "paged"]);
    assert!(compare.status.success(), "{}", stderr(&compare));
    let text = stdout(&compare);
    overview(&text, 1, "it ran out of memory; --device N shows another");
    assert!(text.contains(&format!("{file} (device 1): {frag_entries} entries")), "{text}");
    assert!(text.contains("`pytorch` ran out of memory"), "{text}");
    assert!(!text.contains("ran out of memory in the recording"), "the device shown is the one: {text}");
    // The capacity device 1's oom entry tells is device 1's: no other device is emulated on it.
    assert!(text.contains("device capacity 3.50 GiB, as the recording tells"), "{text}");
    assert!(!text.contains("emulated on") && !text.contains("would run out of memory on"), "{text}");

    // Device 0 asked: the table is its, and device 1's OOM is named.
    let compare = heapscope(&["compare", file, "--device", "0", "--policy", "tlsf"]);
    let text = stdout(&compare);
    overview(&text, 0, "--device 0");
    assert!(text.contains(&format!("{file} (device 0): {gpt2_entries} entries")), "{text}");
    assert!(text.contains("device 1 ran out of memory in the recording (1 oom entry): --device 1 replays it"), "{text}");
    assert!(text.contains("Every contender served every request."), "{text}");

    // On a capacity, PyTorch's emulation of the other devices (cheap here) says who would run out of it.
    let compare = heapscope(&["compare", file, "--capacity", "3GiB", "--policy", "pytorch"]);
    let text = stdout(&compare);
    assert!(compare.status.success(), "{}", stderr(&compare));
    let gpt2_line = text.lines().find(|line| line.starts_with("  device 0: ")).unwrap();
    assert!(gpt2_line.contains("; emulated on 3.00 GiB: ") && !gpt2_line.ends_with(": 0 OOMs"), "{text}");
    assert!(text.contains("device 0 would run out of memory on 3.00 GiB (PyTorch's emulation): --device 0 replays it"), "{text}");
    for (device, why) in [(1, "the table has it"), (2, "a state: nothing to emulate")] {
        let line = text.lines().find(|line| line.contains(&format!("device {device}: "))).unwrap();
        assert!(!line.contains("emulated"), "{why}: {text}");
    }

    let summary = heapscope(&["summary", file, "--device", "0"]);
    assert!(summary.status.success(), "{}", stderr(&summary));
    let text = stdout(&summary);
    overview(&text, 0, "--device 0");
    assert!(text.contains("device 1 ran out of memory in the recording"), "{text}");
    assert!(text.find("* device 0") < text.find("PyTorch CUDA memory summary, device ID 0"), "overview first: {text}");

    let render = heapscope(&["render", file, "--out", dir.join("default.png").to_str().unwrap()]);
    if gpu_required() || render.status.success() {
        assert!(render.status.success(), "{}", stderr(&render));
        let text = stdout(&render);
        overview(&text, 1, "it ran out of memory; --device N shows another");
        assert!(text.contains("three-gpus.pickle (device 1) · "), "{text}");
    }

    // `convert` takes the same device and lists the others (on stderr), and the trace it writes names its source and
    // device beside its own name.
    let converted = dir.join("default.trace");
    let convert = heapscope(&["convert", file, "--out", converted.to_str().unwrap()]);
    assert!(convert.status.success(), "{}", stderr(&convert));
    overview(&stderr(&convert), 1, "it ran out of memory; --device N shows another");
    let replayed = stdout(&heapscope(&["replay", converted.to_str().unwrap(), "--policy", "tlsf"]));
    let named = format!("{} (from three-gpus.pickle, device 1): ", converted.display());
    assert!(replayed.starts_with(&named), "{replayed}");

    // `export` of device 1 writes its segments and its trace under device 1, whichever contender, and lists the others.
    for policy in ["pytorch", "tlsf"] {
        let out = dir.join(format!("exported-{policy}.pickle"));
        let export = heapscope(&["export", file, "--device", "1", "--policy", policy, "--out", out.to_str().unwrap()]);
        assert!(export.status.success(), "{policy}: {}", stderr(&export));
        overview(&stderr(&export), 1, "--device 1");
        let written = heapscope_pytorch::read_snapshot(&out).unwrap();
        assert!(!written.device_traces[1].is_empty(), "{policy}");
        let devices: Vec<u32> = written.segments.iter().map(|segment| segment.device).collect();
        assert!(!devices.is_empty() && devices.iter().all(|&device| device == 1), "{policy}: {devices:?}");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// The overview on a capacity names another device that cannot run on it at all (begun mid-run with more reserved than
/// the capacity), as `--device` on it says, instead of leaving it out.
#[test]
fn the_overview_names_a_device_that_cannot_run_on_the_capacity() {
    let dir = temp_dir("three-gpus-mid-run");
    let (path, [gpt2_entries, _]) = three_gpu_snapshot(&dir);
    let mut snapshot = heapscope_pytorch::read_snapshot(&path).unwrap();
    // Device 0 begins mid-run: the first half of its trace gone, what it allocated live at the start.
    snapshot.device_traces[0].drain(..gpt2_entries / 2);
    let path = dir.join("mid-run.pickle");
    heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
    let file = path.to_str().unwrap();
    // A lone contender that cannot run is an error saying why.
    let own = stderr(&heapscope(&["compare", file, "--device", "0", "--capacity", "1GiB", "--policy", "pytorch"]));
    let why = own.lines().find_map(|line| line.split_once("the recording began with ")).map(|(_, why)| why.trim()).unwrap();
    let text = stdout(&heapscope(&["compare", file, "--device", "1", "--capacity", "1GiB", "--policy", "tlsf"]));
    let line = text.lines().find(|line| line.starts_with("  device 0: ")).unwrap();
    assert!(line.ends_with("; not emulated on 1.00 GiB"), "{text}");
    let said = format!("device 0 cannot run on 1.00 GiB: the recording began with {why}; --device 0 replays it");
    assert!(text.contains(&said), "{said:?} in {text}");
    std::fs::remove_dir_all(dir).ok();
}

/// Issue 14, part 2: what `torch.cuda.memory_snapshot()` returns — a list of segments, no trace — written here
/// from the gpt2 run's final segments (and, for a second device, frag_oom's): `replay`, `summary`, `export` (also
/// `--vma-json`) and `render` work on its one moment, the start; a device it has no segments on is an error.
#[test]
fn issue_14_a_state_with_no_trace_summarises_exports_and_renders() {
    let dir = temp_dir("state");
    let gpt2 = heapscope_pytorch::read_snapshot(&snapshot("gpt2_train_fixed-default")).unwrap();
    let path = dir.join("state.pickle");
    heapscope_pytorch::write_segments(&gpt2, std::fs::File::create(&path).unwrap()).unwrap();
    let file = path.to_str().unwrap();
    let reserved: u64 = gpt2.segments.iter().map(|segment| segment.total_size).sum();
    let live = gpt2
        .segments
        .iter()
        .flat_map(|segment| &segment.blocks)
        .filter(|block| block.state != heapscope_pytorch::BlockState::Inactive && block.requested_size > 0)
        .count();

    let lines = json_lines(&heapscope(&["replay", file, "--json", "--policy", "pytorch", "--policy", "tlsf"]));
    for line in &lines {
        assert_eq!((line["entries"].as_u64(), line["ooms"].as_u64()), (Some(0), Some(0)), "{line}");
        assert_eq!(line["allocs"].as_u64(), Some(live as u64), "the start state's allocations: {line}");
    }
    assert_eq!(lines[0]["peak_reserved_bytes"].as_u64(), Some(reserved), "pytorch holds the segments listed");
    // frag_oom's final segments hold nothing live: no ratio of reserved to live bytes, not reserved over 1 byte.
    let frag = heapscope_pytorch::read_snapshot(&snapshot("frag_oom-default")).unwrap();
    let empty = dir.join("empty-state.pickle");
    heapscope_pytorch::write_segments(&frag, std::fs::File::create(&empty).unwrap()).unwrap();
    let table = stdout(&heapscope(&["replay", empty.to_str().unwrap(), "--policy", "pytorch"]));
    let row: Vec<&str> = table.lines().find(|line| line.starts_with("pytorch ")).unwrap_or_default().split_whitespace().collect();
    let ratio = row.iter().position(|word| *word == "GiB").and_then(|unit| row.get(unit + 1));
    assert_eq!(ratio, Some(&"-"), "the ratio after the peak reserved 2.93 GiB: {table}");

    let summary = heapscope(&["summary", file]);
    assert!(summary.status.success(), "{}", stderr(&summary));
    let text = stdout(&summary);
    assert!(text.contains("GPU reserved memory"), "{text}");
    assert!(!text.contains("records 2"), "one device: no overview: {text}");
    // Its counters hold the state alone, and the table says why (not that it was recorded mid-run: nothing was).
    assert!(text.contains("\nthe file records no allocation history for device 0 (its trace is empty: "), "{text}");
    assert!(!text.contains("recorded mid-run"), "{text}");

    let (out, json) = (dir.join("tlsf.pickle"), dir.join("tlsf.json"));
    let export =
        heapscope(&["export", file, "--policy", "tlsf", "--out", out.to_str().unwrap(), "--vma-json", json.to_str().unwrap()]);
    assert!(export.status.success(), "{}", stderr(&export));
    let exported = heapscope_pytorch::read_snapshot(&out).unwrap();
    let blocks = exported
        .segments
        .iter()
        .flat_map(|segment| &segment.blocks)
        .filter(|block| block.state != heapscope_pytorch::BlockState::Inactive)
        .count();
    assert_eq!(blocks, live, "every allocation of the state, placed by tlsf");
    let vma: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(vma["Total"]["AllocationCount"].as_u64(), Some(live as u64), "the same run, in VMA's JSON");
    let pytorch = heapscope(&["export", file, "--policy", "pytorch", "--out", dir.join("pytorch.pickle").to_str().unwrap()]);
    assert!(pytorch.status.success(), "{}", stderr(&pytorch));
    assert_eq!(heapscope_pytorch::read_snapshot(&dir.join("pytorch.pickle")).unwrap().segments.len(), gpt2.segments.len());

    let render = heapscope(&["render", file, "--policy", "tlsf", "--out", dir.join("state.png").to_str().unwrap()]);
    if gpu_required() || render.status.success() {
        assert!(render.status.success(), "{}", stderr(&render));
        assert!(stdout(&render).contains("state.pickle · start of 0 entries)"), "{}", stdout(&render));
        assert!(is_png(&dir.join("state.png")));
    }

    // Two devices' states: an overview of both, the first shown; a third device is an error naming them.
    let mut two = gpt2.clone();
    let frag = heapscope_pytorch::read_snapshot(&snapshot("frag_oom-default")).unwrap();
    two.segments.extend(frag.segments.iter().map(|segment| heapscope_pytorch::Segment { device: 1, ..segment.clone() }));
    two.frame_stacks.clear();
    for segment in &mut two.segments {
        segment.frames = heapscope_pytorch::StackId::default();
        segment.blocks.iter_mut().for_each(|block| block.frames = heapscope_pytorch::StackId::default());
    }
    let path = dir.join("two-states.pickle");
    heapscope_pytorch::write_segments(&two, std::fs::File::create(&path).unwrap()).unwrap();
    let file = path.to_str().unwrap();
    let summary = heapscope(&["summary", file, "--device", "1"]);
    assert!(summary.status.success(), "{}", stderr(&summary));
    let text = stdout(&summary);
    assert!(text.contains(&format!("{file} records 2 devices; showing device 1 (--device 1):")), "{text}");
    assert!(text.contains("* device 1: no trace entries ("), "{text}");
    let text = stdout(&heapscope(&["summary", file]));
    assert!(text.contains("showing device 0 (the first device with segments; --device N shows another)"), "{text}");
    let error = stderr(&heapscope(&["summary", file, "--device", "2"]));
    assert!(
        error.contains(&format!(
            "{file}: no device 2; the file records device 0 (no trace entries, {} segments)",
            gpt2.segments.len()
        )),
        "{error}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// `advise` on the shared frag_oom recording: the capacity its `oom` entry tells, a setting that fits ranked first
/// and pasted, why the recorded settings failed; JSON with the contract's keys, best first; a setting PyTorch would
/// refuse named in the error.
#[test]
fn advise_ranks_a_setting_that_fits_and_says_why_the_default_failed() {
    let file = trace("pytorch/frag_oom-default.pickle.gz");
    let file = file.to_str().unwrap();
    let settings = ["--setting", "", "--setting", "expandable_segments:True", "--setting", "max_split_size_mb:128"];
    let output = heapscope(&[&["advise", file][..], &settings].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(
        text.contains("device capacity 3.50 GiB, as the recording tells: at its oom (entry 100) PyTorch held 2.93 GiB reserved"),
        "{text}"
    );
    assert!(text.contains("*(PyTorch's defaults)"), "{text}");
    let answer = text.lines().last().unwrap();
    assert!(
        answer.starts_with("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True — fits in 3.50 GiB")
            && answer
                .contains("the recorded settings ran out of memory at entry 100 (fragmentation): Tried to allocate 1024.00 MiB"),
        "{answer}"
    );
    assert!(!stderr(&output).contains("progress:"), "a log gets no progress unasked: {}", stderr(&output));
    // With --progress and stderr a pipe (a log): a line per setting replayed (the three asked for and `paged`).
    let with_progress = heapscope(&[&["advise", file, "--json", "--progress"][..], &settings].concat());
    let progress = stderr(&with_progress);
    let lines: Vec<&str> = progress.lines().filter(|line| line.starts_with("progress: ")).collect();
    assert_eq!(lines.len(), 4, "{progress}");
    for (done, line) in (1..).zip(&lines) {
        assert!(line.starts_with(&format!("progress: {done} of 4 settings replayed, ")), "in order: {progress}");
    }
    let rows = json_lines(&with_progress);
    assert!(
        text.contains("(res/live: peak reserved over peak live bytes, 1.0000 when nothing beyond the live bytes was held; dev alloc / dev free: "),
        "{text}"
    );
    let keys = [
        "setting",
        "peak_reserved_bytes",
        "peak_live_bytes",
        "device_allocs",
        "device_frees",
        "driver_time_us",
        "ooms",
        "first_oom",
        "min_capacity_bytes",
        "monotone",
        "retries_at_need",
        "rank",
        "start_afresh",
        "start_exceeds_capacity",
    ];
    for row in &rows {
        for key in keys {
            assert!(row.get(key).is_some(), "{key} missing: {row}");
        }
    }
    let ranks: Vec<u64> = rows.iter().map(|row| row["rank"].as_u64().unwrap()).collect();
    assert_eq!(ranks, [1, 2, 3, 0]);
    assert_eq!((rows[0]["setting"].as_str(), rows[0]["ooms"].as_u64()), (Some("expandable_segments:True"), Some(0)));
    let refused = heapscope(&["advise", file, "--setting", "max_split_size_mb:10"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("setting \"max_split_size_mb:10\""), "{}", stderr(&refused));
}

/// A row of `advise` pasted into `--alloc-conf` is the same run: both read the string as `PYTORCH_CUDA_ALLOC_CONF`
/// would, every key it leaves out at PyTorch's default — on a recording made with expandable segments,
/// `max_split_size_mb:64` turns them off (it was merged into the recorded settings, a run with them on).
#[test]
fn a_row_of_advise_pasted_into_alloc_conf_is_the_same_run() {
    let file = trace("pytorch/frag_oom-expandable.pickle.gz");
    let file = file.to_str().unwrap();
    for setting in ["max_split_size_mb:64", "expandable_segments:True,roundup_power2_divisions:4", ""] {
        let advised = json_lines(&heapscope(&["advise", file, "--json", "--setting", setting]));
        let row = advised.iter().find(|row| row["setting"] == setting).unwrap();
        let replayed = json_lines(&heapscope(&["replay", file, "--json", "--policy", "pytorch", "--alloc-conf", setting]));
        for key in ["peak_reserved_bytes", "device_allocs", "device_frees", "ooms"] {
            assert_eq!(row[key], replayed[0][key], "{setting:?}: {key}");
        }
    }
    let off = json_lines(&heapscope(&["replay", file, "--json", "--policy", "pytorch", "--alloc-conf", "max_split_size_mb:64"]));
    let on = json_lines(&heapscope(&["replay", file, "--json", "--policy", "pytorch"]));
    assert_ne!(off[0]["device_allocs"], on[0]["device_allocs"], "expandable segments off: whole segments, not pages");
}

/// `--budget` bounds every contender but PyTorch's emulation (`paged` reserved 2.95 GiB under a 1 GiB budget, and
/// `compare` said it would have served a request no page under the budget could), and the title says so.
#[test]
fn a_budget_bounds_paged_as_the_heaps() {
    const GIB: u64 = 1 << 30;
    let file = trace("pytorch/frag_oom-default.pickle.gz");
    let file = file.to_str().unwrap();
    let rows = json_lines(&heapscope(&["replay", file, "--json", "--budget", "1GiB"]));
    for row in &rows {
        let reserved = row["peak_reserved_bytes"].as_u64().unwrap();
        match row["policy"].as_str().unwrap() {
            "pytorch" => assert!(reserved > GIB, "PyTorch runs on the device: {row}"),
            policy => assert!(reserved <= GIB, "{policy} under the budget: {row}"),
        }
    }
    assert!(rows.iter().any(|row| row["policy"] == "paged" && row["ooms"].as_u64() > Some(0)), "{rows:?}");
    let title = stdout(&heapscope(&["replay", file, "--budget", "1GiB"]));
    assert!(title.contains("--budget 1.00 GiB: bounds every contender but PyTorch's emulation"), "{title}");
    let verdict = stdout(&heapscope(&["compare", file, "--budget", "0"]));
    let last = verdict.lines().last().unwrap();
    assert!(!last.contains("`paged`") && last.contains("with expandable segments would have served it"), "{last}");
}

/// Sizes past what PyTorch's emulation and `paged` held on their own: a request above the usual 128 GiB expandable
/// reservation on a device that holds it is served (it was refused whatever the device), `paged` on an unlimited device
/// serves what the others serve (its range was 1 TiB), a memory fraction's refusal is judged against the share
/// (fragmentation, with the whole device left, before), and `compare`'s sentence names the range or "no device"
/// instead of device figures that do not apply.
#[test]
fn large_devices_and_shares_are_judged_on_what_bounds_them() {
    let dir = temp_dir("large-devices");
    std::fs::write(dir.join("e600.csv"), format!("a,1,{}\n", 600u64 << 30)).unwrap();
    let rows = json_lines(&heapscope_headless(
        &[
            "replay",
            "e600.csv",
            "--json",
            "--capacity",
            "2TiB",
            "--alloc-conf",
            "expandable_segments:True",
            "--policy",
            "pytorch",
        ],
        &dir,
    ));
    assert_eq!((rows[0]["allocs"].as_u64(), rows[0]["ooms"].as_u64()), (Some(1), Some(0)), "{}", rows[0]);
    std::fs::write(dir.join("two.csv"), format!("a,1,{0}\na,2,{0}\n", 600u64 << 30)).unwrap();
    let rows = json_lines(&heapscope_headless(&["replay", "two.csv", "--json", "--policy", "paged"], &dir));
    assert_eq!((rows[0]["allocs"].as_u64(), rows[0]["ooms"].as_u64()), (Some(2), Some(0)), "{}", rows[0]);
    // A range too small for the request: the sentence names it, not the device.
    let said = stdout(&heapscope_headless(&["compare", "two.csv", "--policy", "paged", "--virtual-size", "1TiB"], &dir));
    let last = said.lines().last().unwrap();
    assert!(last.contains("free in its 1.00 TiB virtual range") && !last.contains("on the device"), "{last}");
    // Above the largest device: no device figure.
    std::fs::write(dir.join("past.csv"), format!("a,1,{}\n", (1u64 << 60) + 1)).unwrap();
    let said = stdout(&heapscope_headless(&["compare", "past.csv"], &dir));
    let last = said.lines().last().unwrap();
    assert!(last.contains("more than any device holds") && !last.contains("on the device"), "{last}");
    // A tenth of frag_oom's 3.5 GiB device: the third 150 MiB request is refused for want of the share.
    let file = trace("pytorch/frag_oom-default.pickle.gz");
    let rows = json_lines(&heapscope(&[
        "replay",
        file.to_str().unwrap(),
        "--json",
        "--policy",
        "pytorch",
        "--alloc-conf",
        "per_process_memory_fraction:0.1",
    ]));
    let oom = &rows[0]["first_oom"];
    assert_eq!(oom["verdict"], "exhaustion", "{oom}");
    assert!(oom["unreserved_bytes"].as_u64() < Some(360 << 20), "counted against the share: {oom}");
}

/// A standard error that cannot be written (full, or closed by its reader) is no reason to panic: `convert`'s lines
/// there panicked with exit status 101; the conversion is written and the command succeeds.
#[test]
fn a_full_standard_error_is_no_panic() {
    let dir = temp_dir("full-stderr");
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else { return };
    let source = trace("pytorch/frag_oom-default.pickle.gz");
    let out = dir.join("x.hst");
    let status = crate::common::binary()
        .args(["convert", source.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .stderr(full)
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(out.exists());
    std::fs::remove_dir_all(dir).ok();
}

/// `bench --save-trace --json` says what it wrote as one JSON object (it printed its text line), and the trace replays
/// with as many events.
#[test]
fn a_saved_workload_trace_is_said_in_json_and_replays() {
    let dir = temp_dir("save-trace");
    let out = dir.join("churn.hst");
    let args = ["bench", "--workload", "churn", "--steps", "100", "--save-trace", out.to_str().unwrap(), "--json"];
    let said = json_lines(&heapscope(&args));
    assert_eq!((said.len(), &said[0]["saved_trace"]), (1, &serde_json::json!(out)));
    assert!(said[0]["workload"].as_str().is_some_and(|workload| workload.starts_with("churn ")), "{}", said[0]);
    let replayed = json_lines(&heapscope(&["replay", out.to_str().unwrap(), "--json", "--policy", "tlsf"]));
    assert_eq!(replayed[0]["events"], said[0]["events"]);
}

/// Settings PyTorch reads as its defaults are the recorded run, not a what-if: one division rounds nothing.
#[test]
fn settings_the_same_in_effect_as_the_recordings_keep_the_fidelity() {
    let file = trace("pytorch/frag_oom-default.pickle.gz");
    let file = file.to_str().unwrap();
    let recorded = json_lines(&heapscope(&["replay", file, "--json", "--policy", "pytorch"]));
    assert_eq!(recorded[0]["what_if"], false);
    assert!(recorded[0]["fidelity"].is_object(), "{}", recorded[0]);
    for setting in ["roundup_power2_divisions:1", "roundup_power2_divisions:[>:1]", "expandable_segments:False"] {
        let replayed = json_lines(&heapscope(&["replay", file, "--json", "--policy", "pytorch", "--alloc-conf", setting]));
        assert_eq!(replayed[0]["what_if"], false, "{setting}");
        assert_eq!(replayed[0]["fidelity"], recorded[0]["fidelity"], "{setting}");
    }
    let what_if =
        json_lines(&heapscope(&["replay", file, "--json", "--policy", "pytorch", "--alloc-conf", "roundup_power2_divisions:2"]));
    assert_eq!((&what_if[0]["what_if"], &what_if[0]["fidelity"]), (&serde_json::json!(true), &Value::Null));
}

/// Two final segments that share addresses are refused naming both, by every command, whichever contenders it runs
/// (the start state is walked back from them): they were read without a word, and the fidelity dropped to 0 of 1.
#[test]
fn overlapping_final_segments_are_refused_naming_both() {
    let dir = temp_dir("overlapping-segments");
    let mut snapshot = heapscope_pytorch::read_snapshot(&snapshot("frag_oom-default")).unwrap();
    let mut copy = snapshot.segments[0].clone();
    copy.address += 1 << 20;
    for block in &mut copy.blocks {
        block.address += 1 << 20;
    }
    let last = snapshot.segments.len();
    snapshot.segments.push(copy);
    let path = dir.join("overlap.pickle");
    heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
    let commands: [&[&str]; 7] = [
        &["replay", "overlap.pickle"],
        &["replay", "overlap.pickle", "--policy", "tlsf"],
        &["compare", "overlap.pickle", "--policy", "paged"],
        &["summary", "overlap.pickle"],
        &["render", "overlap.pickle", "--out", "overlap.png"],
        &["top", "overlap.pickle"],
        &["convert", "overlap.pickle", "--out", "overlap.hst"],
    ];
    for command in commands {
        let output = heapscope_headless(command, &dir);
        assert!(!output.status.success(), "{command:?}: {}", stdout(&output));
        let said = stderr(&output);
        assert!(
            said.contains("overlap.pickle") && said.contains(&format!("segments[{last}]: the range at ")),
            "{command:?}: {said}"
        );
        assert!(said.contains("overlaps segments[0]") && !said.contains("panicked"), "{command:?}: {said}");
    }
    assert!(!dir.join("overlap.png").exists() && !dir.join("overlap.hst").exists());
}

/// frag_oom-default continued as an OOM-retry loop runs on: the 1 GiB refusal caught, the cache emptied, 1 GiB
/// allocated, then a 4 GiB request no 3.5 GiB device holds. `compare` judges each contender on the request refused
/// first (paged and expandable segments serve it and refuse the later one), and `advise`, where no setting fits,
/// ranks by need and then by refusals: expandable segments before the recorded defaults, and says so.
#[test]
fn a_later_refusal_does_not_hide_who_served_the_first() {
    use heapscope_pytorch::{Action, BlockState, TraceEntry};
    const GIB: u64 = 1 << 30;
    let dir = temp_dir("two-ooms");
    let mut snapshot = heapscope_pytorch::read_snapshot(&snapshot("frag_oom-default")).unwrap();
    let trace = &mut snapshot.device_traces[0];
    let opened: Vec<TraceEntry> = trace.iter().filter(|entry| entry.action == Action::SegmentAlloc).cloned().collect();
    for segment in &opened {
        let mut freed = segment.clone();
        freed.action = Action::SegmentFree;
        trace.push(freed);
    }
    let base = opened.iter().map(|segment| segment.addr).min().unwrap();
    trace.push(TraceEntry::new(Action::SegmentAlloc, base, GIB));
    trace.push(TraceEntry::new(Action::Alloc, base, GIB));
    let mut refused = TraceEntry::new(Action::Oom, 0, 4 * GIB);
    refused.set_device_free(Some((3584 << 20) - GIB - (2 << 20)));
    trace.push(refused);
    let entries = trace.len();
    let mut last = snapshot.segments[0].clone();
    (last.address, last.total_size, last.allocated_size, last.active_size, last.requested_size) = (base, GIB, GIB, GIB, GIB);
    last.blocks = vec![heapscope_pytorch::Block::new(base, GIB, GIB, BlockState::ActiveAllocated)];
    snapshot.segments = vec![last];
    let path = dir.join("two_ooms.pickle");
    heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
    let file = path.to_str().unwrap();

    let output = heapscope(&["compare", file]);
    assert!(output.status.success(), "{}", stderr(&output));
    let later = entries - 1;
    let sentence = stdout(&output).lines().last().unwrap_or_default().to_owned();
    assert!(
        sentence.starts_with("`pytorch` ran out of memory on a 1.00 GiB request")
            && sentence.ends_with(&format!(
                "`paged` (until entry {later}) and `pytorch` with expandable segments (until entry {later}) would have \
                 served it."
            )),
        "{sentence}"
    );
    let output = heapscope(&["advise", file]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let first = text.lines().find(|line| line.trim_start().starts_with("1 ")).unwrap_or_default();
    assert!(first.contains("expandable_segments:True"), "{text}");
    let answer = text.lines().last().unwrap_or_default();
    assert!(
        answer.starts_with(
            "No setting fits in 3.50 GiB: the one that needs least, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        ) && answer.ends_with("in 3.50 GiB it refuses 1 request where the recorded settings refuse 2."),
        "{answer}"
    );
}

/// A request near 2^64 in a plain trace (the emulation refuses it on any device): `advise` says no setting serves
/// every request on any device, naming the refusal, where it once overflowed (a panic) and then said "needs no device".
#[test]
fn advise_on_a_request_no_device_holds() {
    let dir = temp_dir("advise-huge");
    std::fs::write(dir.join("huge.csv"), "a,1,18446744073709551000\n").unwrap();
    let output = heapscope(&["advise", dir.join("huge.csv").to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let answer = stdout(&output).lines().last().unwrap_or_default().to_owned();
    assert!(
        answer.starts_with("No setting serves every request, on any device: PYTORCH_CUDA_ALLOC_CONF unset (PyTorch's defaults) ran out of memory at entry 0"),
        "{answer}"
    );
}

/// Settings strings as PyTorch reads them (issue 14's review): `>` in a `roundup_power2_divisions` list sets the
/// intervals after the last one named (PyTorch's documented example rounds 1100 MiB to 1280 MiB, where heapscope
/// read 1152), and `per_process_memory_fraction` limits the allocator to its share of the device (it was accepted and
/// dropped: a 50 GiB request on 80 GiB at 0.5 was served, and advise called the fraction the recorded settings).
#[test]
fn settings_strings_mean_what_pytorch_reads() {
    let dir = temp_dir("settings-strings");
    let file = dir.join("one.csv");
    std::fs::write(&file, "a,1,1100MiB\n").unwrap();
    let file = file.to_str().unwrap();
    let rounded = json_lines(&heapscope(&[
        "replay",
        file,
        "--policy",
        "pytorch",
        "--json",
        "--alloc-conf",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    ]));
    assert_eq!(rounded[0]["peak_reserved_bytes"].as_u64(), Some(1280 << 20), "{}", rounded[0]);

    let file = dir.join("fifty.csv");
    std::fs::write(&file, "a,1,50GiB\n").unwrap();
    let file = file.to_str().unwrap();
    let replay = |conf: &str| {
        json_lines(&heapscope(&["replay", file, "--policy", "pytorch", "--json", "--capacity", "80GiB", "--alloc-conf", conf]))
    };
    assert_eq!(replay("per_process_memory_fraction:0.5")[0]["ooms"].as_u64(), Some(1));
    assert_eq!(replay("per_process_memory_fraction:0.7")[0]["ooms"].as_u64(), Some(0));
    let advised = json_lines(&heapscope(&[
        "advise",
        file,
        "--json",
        "--capacity",
        "80GiB",
        "--setting",
        "per_process_memory_fraction:0.5",
    ]));
    let row = advised.iter().find(|row| row["setting"] == "per_process_memory_fraction:0.5").unwrap();
    assert_eq!((row["as_recorded"].as_bool(), row["ooms"].as_u64()), (Some(false), Some(1)), "{row}");
    assert_eq!(row["min_capacity_bytes"].as_u64(), Some(100 << 30), "50 GiB needs a device of twice that: {row}");

    let refused = heapscope(&["replay", file, "--alloc-conf", "pinned_num_register_threads:3"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("bad value `3` for PYTORCH_CUDA_ALLOC_CONF key `pinned_num_register_threads`"),
        "{}",
        stderr(&refused)
    );
}

/// `bench --workload replay` runs `pytorch` with the settings the snapshot recorded, as `replay` does (it ran
/// PyTorch's defaults: 14.24 GiB reserved for gpt2's expandable run against PyTorch's own 13.54 GiB), and says so.
#[test]
fn bench_replays_a_snapshot_with_its_recorded_settings() {
    let file = trace("pytorch/gpt2_train_fixed-expandable.pickle.gz");
    let file = file.to_str().unwrap();
    let replayed = json_lines(&heapscope(&["replay", file, "--policy", "pytorch", "--json"]));
    let benched =
        json_lines(&heapscope(&["bench", "--workload", "replay", file, "--backend", "sim", "--policy", "pytorch", "--json"]));
    assert_eq!(benched[0]["peak_reserved_bytes"], replayed[0]["peak_reserved_bytes"], "{}", benched[0]);
    let text = heapscope(&["bench", "--workload", "replay", file, "--backend", "sim", "--policy", "pytorch"]);
    assert!(stdout(&text).contains("pytorch's settings: expandable_segments:True (as the recording tells)"), "{}", stdout(&text));
    // `pytorch-expandable` there would be the same run again (it was measured twice): a row that says so.
    let both =
        ["bench", "--workload", "replay", file, "--backend", "sim", "--policy", "pytorch", "--policy", "pytorch-expandable"];
    let rows = json_lines(&heapscope(&[&both[..], &["--json"]].concat()));
    let why = rows[1]["not_run"].as_str().unwrap_or_default();
    assert!(why.contains("turn expandable segments on already") && rows[0]["not_run"].is_null(), "{rows:?}");
    // Asked alone, it runs (no `pytorch` row is the same run).
    let alone = ["bench", "--workload", "replay", file, "--backend", "sim", "--policy", "pytorch-expandable", "--json"];
    let output = heapscope(&alone);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(json_lines(&output)[0]["not_run"].is_null(), "{}", stdout(&output));
}
