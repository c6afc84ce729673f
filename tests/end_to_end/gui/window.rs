//! The real window: `heapscope gui` on a PyTorch snapshot under Xvfb (an X server in memory), eframe on wgpu on
//! whatever Vulkan device is there (lavapipe in CI), scripted to take a screenshot of itself and close after a
//! few frames. Checks that it exits cleanly, that the Vulkan validation layer said nothing (the binary fails a
//! scripted run otherwise), and that the screenshot is a real picture of the app, not a blank window.
//!
//! Needs `xvfb-run` (scripts/test.sh installs it): without it the test says so and passes, unless
//! `HEAPSCOPE_REQUIRE_GPU=1` (CI), where it fails.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::collections::HashSet;
use std::process::Command;
use std::time::Instant;

/// Whether `xvfb-run` is there; without it the test is skipped (said on stdout), unless `HEAPSCOPE_REQUIRE_GPU=1`,
/// where that is a failure.
fn xvfb_run_available() -> bool {
    let available = Command::new("sh").args(["-c", "command -v xvfb-run"]).output().is_ok_and(|output| output.status.success());
    if !available {
        assert!(!crate::common::gpu_required(), "HEAPSCOPE_REQUIRE_GPU=1 but xvfb-run is missing (install xvfb)");
        println!("skipped: xvfb-run is missing (install xvfb to run the real window)");
    }
    available
}

#[test]
fn the_window_opens_draws_a_snapshot_and_closes() {
    if !xvfb_run_available() {
        return;
    }
    let dir = crate::common::temp_dir("gui-window");
    let screenshot = dir.join("window.png");
    let _ = std::fs::remove_file(&screenshot);
    let snapshot = crate::common::trace("pytorch/frag_oom-default.pickle.gz");
    let started = Instant::now();
    let output = Command::new("xvfb-run")
        // -a: a free display number, so parallel runs do not collide.
        .args(["-a", "-s", "-screen 0 1600x1000x24", env!("CARGO_BIN_EXE_heapscope"), "gui"])
        .arg(&snapshot)
        // The timeline as every allocation over time (memory_viz's view), drawn by the real window too.
        .args(["--at", "100", "--allocations", "--quit-after-frames", "20", "--screenshot"])
        .arg(&screenshot)
        .env_remove("WAYLAND_DISPLAY")
        // The validation layer on wgpu's instance, whatever the build; the binary fails on what it says. Without
        // naga's debug info, as heapscope's own wgpu devices run: the OpSource it writes (language 10, WGSL) is newer
        // than the SPIR-V checker of the validation layer that Debian ships, which calls the module invalid.
        .env("WGPU_VALIDATION", "1")
        // The window draws with heapscope's own device where it can: its validation layer, too.
        .env("HEAPSCOPE_VALIDATION", "1")
        .env("WGPU_DEBUG", "0")
        .env("WGPU_BACKEND", "vulkan")
        .output()
        .expect("xvfb-run runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {stderr}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(!stderr.contains("VALIDATION ["), "validation messages: {stderr}");
    println!("the window ran in {:.1} s", started.elapsed().as_secs_f64());

    let bytes = std::fs::read(&screenshot).unwrap_or_else(|error| panic!("no screenshot at {}: {error}", screenshot.display()));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(bytes.len() > 10_000, "{} bytes: too small for a 1400x900 window of the app", bytes.len());
    let image = image::load_from_memory(&bytes).unwrap().to_rgba8();
    let (width, height) = image.dimensions();
    assert!((1000..=1600).contains(&width) && (600..=1000).contains(&height), "{width}x{height}: the window's size");
    let colours: HashSet<[u8; 4]> = image.pixels().map(|pixel| pixel.0).collect();
    assert!(colours.len() >= 16, "{} distinct colours: a blank window", colours.len());
    std::fs::remove_dir_all(&dir).unwrap();

    // A moment past the end is refused before any window opens, naming the flag and the length.
    let output = Command::new("xvfb-run")
        .args(["-a", env!("CARGO_BIN_EXE_heapscope"), "gui"])
        .arg(&snapshot)
        .args(["--at", "500", "--quit-after-frames", "1"])
        .env_remove("WAYLAND_DISPLAY")
        .output()
        .expect("xvfb-run runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("--at entry 500: the recording has 141 entries"), "{stderr}");
}

/// Live mode in the real window: the window draws with heapscope's own Vulkan device, and a churn run allocates,
/// binds, fills and verifies on that very device at the same time — eframe submitting and presenting every frame
/// on the one queue lavapipe has, the workload submitting compute on it from its worker thread. With the
/// validation layer on heapscope's device (its thread-safety checks flag any unsynchronised queue use), the run
/// ends cleanly, says which device it ran on, and finds no kernel mismatch.
#[test]
fn a_live_run_shares_the_device_the_window_draws_with() {
    if !xvfb_run_available() {
        return;
    }
    let dir = crate::common::temp_dir("gui-window-live");
    let screenshot = dir.join("live.png");
    let output = Command::new("xvfb-run")
        .args(["-a", "-s", "-screen 0 1600x1000x24", env!("CARGO_BIN_EXE_heapscope"), "gui"])
        .args(["--live", "churn", "--steps", "300", "--quit-after-frames", "5", "--screenshot"])
        .arg(&screenshot)
        .env_remove("WAYLAND_DISPLAY")
        .env("HEAPSCOPE_VALIDATION", "1")
        .env_remove("HEAPSCOPE_SHARE_DEVICE")
        .env("WGPU_DEBUG", "0")
        .output()
        .expect("xvfb-run runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "exit {:?}\nstdout: {stdout}\nstderr: {stderr}", output.status);
    assert!(!stderr.contains("validation"), "validation messages: {stderr}");
    let summary = stdout.lines().find(|line| line.starts_with("live churn")).unwrap_or_else(|| panic!("no summary: {stdout}"));
    assert!(summary.contains("finished in") && summary.contains("300 allocs"), "{summary}");
    assert!(summary.contains("kernel mismatches 0"), "{summary}");
    assert!(summary.ends_with("the device this window draws with"), "{summary}");
    let image = image::open(&screenshot).unwrap().to_rgba8();
    let colours: HashSet<[u8; 4]> = image.pixels().map(|pixel| pixel.0).collect();
    assert!(colours.len() >= 16, "{} distinct colours: a blank window", colours.len());
    std::fs::remove_dir_all(&dir).unwrap();

    // With HEAPSCOPE_SHARE_DEVICE=0 the window draws with eframe's adapter and the run gets a device of its own,
    // whose validation messages are read too.
    let output = Command::new("xvfb-run")
        .args(["-a", "-s", "-screen 0 1600x1000x24", env!("CARGO_BIN_EXE_heapscope"), "gui"])
        .args(["--live", "serve", "--steps", "20", "--quit-after-frames", "3"])
        .env_remove("WAYLAND_DISPLAY")
        .env("HEAPSCOPE_VALIDATION", "1")
        .env("HEAPSCOPE_SHARE_DEVICE", "0")
        .env("WGPU_DEBUG", "0")
        .output()
        .expect("xvfb-run runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "exit {:?}\nstdout: {stdout}\nstderr: {stderr}", output.status);
    assert!(stderr.contains("the live run gets a device of its own: HEAPSCOPE_SHARE_DEVICE=0"), "{stderr}");
    let summary = stdout.lines().find(|line| line.starts_with("live serve")).unwrap_or_else(|| panic!("no summary: {stdout}"));
    assert!(summary.contains("kernel mismatches 0") && summary.ends_with("(a device of its own)"), "{summary}");

    // A run that cannot start fails the scripted run, naming the budget it was given.
    let output = Command::new("xvfb-run")
        .args(["-a", env!("CARGO_BIN_EXE_heapscope"), "gui", "--live", "churn", "--policy", "paged", "--budget", "4K"])
        .args(["--quit-after-frames", "2"])
        .env_remove("WAYLAND_DISPLAY")
        .env("WGPU_DEBUG", "0")
        .output()
        .expect("xvfb-run runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("paged with a budget of 4 KiB on the device"), "{stderr}");
}

/// A lesson opened from the command line: `gui --story training_step --teach --at 3` opens the story in "Teach me"
/// at entry 3 in the real window; a story that does not exist, or a story beside a file, is refused before any window.
#[test]
fn a_story_opens_in_teach_me_from_the_command_line() {
    if !xvfb_run_available() {
        return;
    }
    let dir = crate::common::temp_dir("gui-window-story");
    let screenshot = dir.join("lesson.png");
    let run = |args: &[&str]| {
        Command::new("xvfb-run")
            .args(["-a", "-s", "-screen 0 1600x1000x24", env!("CARGO_BIN_EXE_heapscope"), "gui"])
            .args(args)
            .env_remove("WAYLAND_DISPLAY")
            .env("HEAPSCOPE_VALIDATION", "1")
            .env("WGPU_DEBUG", "0")
            .output()
            .expect("xvfb-run runs")
    };
    let path = screenshot.to_str().unwrap();
    let output = run(&["--story", "training_step", "--teach", "--at", "3", "--quit-after-frames", "5", "--screenshot", path]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "exit {:?}\nstderr: {stderr}", output.status);
    let image = image::open(&screenshot).unwrap().to_rgba8();
    let colours: HashSet<[u8; 4]> = image.pixels().map(|pixel| pixel.0).collect();
    assert!(colours.len() >= 16, "{} distinct colours: a blank window", colours.len());
    let unknown = run(&["--story", "nope", "--quit-after-frames", "1"]);
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(!unknown.status.success() && stderr.contains("no built-in story \"nope\": the stories are frag_oom"), "{stderr}");
    let both = run(&["some.csv", "--story", "frag_oom"]);
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with '--story <STORY>'"));
    std::fs::remove_dir_all(&dir).unwrap();
}
