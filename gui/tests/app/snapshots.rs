//! Image snapshots of the heap map, rendered headless through egui_kittest's wgpu renderer (lavapipe here
//! and in CI; the CPU adapter is preferred, so images match across machines). `UPDATE_SNAPSHOTS=1` rewrites
//! the PNGs in `tests/snapshots/`. Without any adapter the tests skip, unless `HEAPSCOPE_REQUIRE_GPU=1`.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use egui_kittest::Harness;
use heapscope_gui::palette::ColourBy;
use heapscope_gui::panes::{self, PaneStyle, ScaleRule};
use heapscope_gui::{RenderOptions, Session};
use heapscope_lab::contender::Contender;

/// Whether a wgpu adapter renders here; panics when none does and `HEAPSCOPE_REQUIRE_GPU=1`. Takes the test's turn
/// with the validation layer first: wgpu turns it on in debug builds.
fn renderer_available() -> bool {
    heapscope_vulkan::testing::validation_turn();
    let probe = std::panic::catch_unwind(|| {
        let mut session = Session::story_named("frag_oom", &[Contender::Paged]).unwrap();
        heapscope_gui::render(&mut session, RenderOptions { width: 64, height: 64, ..RenderOptions::default() }).is_ok()
    });
    let available = probe.unwrap_or(false);
    assert!(
        available || std::env::var("HEAPSCOPE_REQUIRE_GPU").as_deref() != Ok("1"),
        "HEAPSCOPE_REQUIRE_GPU=1 but nothing renders"
    );
    if !available {
        eprintln!("skipped: no wgpu adapter renders here");
    }
    available
}

/// The maps of `contenders` on `story` after `steps` steps, `width` x `height`, as a snapshot called `name`.
fn snapshot(name: &str, story: &str, contenders: &[Contender], steps: u64, colour_by: ColourBy, scale: ScaleRule) {
    let mut session = Session::story_named(story, contenders).unwrap();
    session.seek(steps);
    let too_small: Vec<Option<u64>> = session
        .panes
        .iter()
        .map(|pane| steps.checked_sub(1).and_then(|step| pane.timeline.refusal_at(step)).map(|refusal| refusal.requested_bytes))
        .collect();
    let style = PaneStyle { shown_steps: steps, progress: 1.0, colour_by, interactive: false, selected: None, scale };
    let mut harness = Harness::builder().with_size([640.0, 220.0]).with_pixels_per_point(1.0).wgpu().build_ui(|ui| {
        panes::show(ui, &mut session, style, &[], &too_small);
    });
    harness.run_steps(2);
    harness.snapshot(name);
}

#[test]
fn frag_oom_when_pytorch_fails_and_paging_does_not() {
    if renderer_available() {
        snapshot(
            "frag_oom_oom",
            "frag_oom",
            &[Contender::Pytorch { expandable: false }, Contender::Paged],
            61,
            ColourBy::SizeClass,
            ScaleRule::OneOverTheRecording,
        );
    }
}

#[test]
fn frag_oom_halfway_by_age_in_blocks() {
    if renderer_available() {
        let tlsf = [Contender::Heap(heapscope_core::PolicyKind::Tlsf)];
        snapshot("frag_oom_halfway_age", "frag_oom", &tlsf, 45, ColourBy::Age, ScaleRule::FitEach);
    }
}

/// Issue 19: once entry 40 of frag_oom is done PyTorch holds 2.93 GiB of segments for 100 MiB live, and `paged` maps
/// only the 100 MiB: drawn at one scale, paged's resident pages are a thirtieth of PyTorch's blocks (each used to
/// fill its own pane); the line above says the scale and the device's size in rows, the bar under each name its
/// reserved share of the device.
#[test]
fn two_panes_of_different_sizes_at_one_scale() {
    if renderer_available() {
        let panes = [Contender::Pytorch { expandable: false }, Contender::Paged];
        snapshot("one_scale_pytorch_paged", "frag_oom", &panes, 41, ColourBy::SizeClass, ScaleRule::OneAtTheMoment);
    }
}

/// Issue 19: every built-in story renders, at its middle and its end, with the lesson's caption in force there and the
/// title naming any refusal; the internal-waste lesson is kept as a picture.
#[test]
fn every_story_renders_with_its_caption() {
    if !renderer_available() {
        return;
    }
    for name in heapscope_lab::story::NAMES {
        let mut session = Session::story_named(name, &[]).unwrap();
        let steps = session.steps();
        for at in [steps / 2, steps] {
            assert!(session.caption(at).is_some(), "{name} at {at}: a caption");
            let options = RenderOptions {
                width: 640,
                height: 260,
                at: Some(heapscope_lab::recording::Moment::at_position(at)),
                ..RenderOptions::default()
            };
            let image = heapscope_gui::render(&mut session, options).unwrap_or_else(|error| panic!("{name}: {error:#}"));
            assert_eq!(image.dimensions(), (640, 260), "{name}");
        }
        let title = heapscope_gui::render::title(&session, steps);
        if name == "internal_waste" {
            assert!(title.contains("buddy refused 300.00 MiB (internal waste)"), "{title}");
        }
    }
    let mut session = Session::story_named("internal_waste", &[]).unwrap();
    session.seek(session.steps());
    let mut harness = Harness::builder().with_size([900.0, 300.0]).with_pixels_per_point(1.0).wgpu().build_ui(|ui| {
        let style = PaneStyle {
            shown_steps: session.steps(),
            progress: 1.0,
            colour_by: ColourBy::SizeClass,
            interactive: false,
            selected: None,
            scale: ScaleRule::OneAtTheMoment,
        };
        let too_small: Vec<Option<u64>> =
            session.panes.iter().map(|pane| pane.timeline.refusal_at(1).map(|r| r.requested_bytes)).collect();
        panes::show(ui, &mut session, style, &[], &too_small);
    });
    harness.run_steps(2);
    harness.snapshot("internal_waste_buddy_tlsf_paged");
}

#[test]
fn rendering_writes_a_png() {
    if !renderer_available() {
        return;
    }
    let mut session = Session::story_named("frag_oom", &Contender::SIDE_BY_SIDE).unwrap();
    let path = std::env::temp_dir().join(format!("heapscope-render-{}.png", std::process::id()));
    heapscope_gui::render_png(
        &mut session,
        RenderOptions {
            width: 800,
            height: 300,
            at: Some(heapscope_lab::recording::Moment::Entry(60)),
            ..RenderOptions::default()
        },
        &path,
    )
    .unwrap();
    let image = image::open(&path).unwrap().to_rgba8();
    assert_eq!(image.dimensions(), (800, 300));
    // The red of free runs too small for the refused request is there.
    let red = heapscope_gui::palette::FREE_TOO_SMALL;
    assert!(image.pixels().any(|pixel| pixel.0[..3] == [red.r(), red.g(), red.b()]), "too-small free runs drawn");
    std::fs::remove_file(&path).ok();
}

/// The active memory timeline of the shipped recording `name` (memory_viz's view; with `segments`, the pytorch
/// contender's segments instead of the allocations), the peak marked and named, the pointer `up` pixels above the
/// bottom of the stack at the peak, its hover shown (size, lifetime, stack frames where the file has them), as
/// snapshot `snapshot`.
fn active_timeline_snapshot(name: &str, up: f32, snapshot: &str, segments: bool) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../assets/traces/pytorch/{name}.pickle.gz"));
    let options = heapscope_gui::session::OpenOptions::default();
    let session = Session::open(&path, &[Contender::Pytorch { expandable: false }], &options).unwrap();
    let timeline = if segments {
        heapscope_lab::timeline::active::build_segments(&session.panes[0].timeline)
    } else {
        heapscope_lab::timeline::active::build(&session.recording)
    };
    let series = heapscope_gui::plot::Series::of(&session.panes[0].timeline);
    let position = timeline.peak_position as f64;
    let mut harness = Harness::builder().with_size([900.0, 260.0]).with_pixels_per_point(1.0).wgpu().build_ui(|ui| {
        ui.ctx().global_style_mut(|style| style.interaction.tooltip_delay = 0.0);
        let named: [(&str, &heapscope_gui::plot::Series); 1] = [("pytorch", &series)];
        heapscope_gui::active_plot::show(ui, &timeline, &named, (&session, ColourBy::StackGroup), position, 220.0);
    });
    harness.run_steps(2);
    // The plot spans x from 44 to 896 and y from about 26 to 224 (its legend row above).
    let peak_x = 44.0 + (timeline.peak_position as f32 + 0.5) / timeline.positions as f32 * (900.0 - 48.0);
    harness.hover_at(egui::pos2(peak_x - 1.0, 224.0 - up));
    harness.run_steps(3);
    harness.snapshot(snapshot);
}

/// GPT-2: four training steps of activations stacked over the weights; the hover names a 48 MiB activation.
#[test]
fn active_memory_timeline_of_gpt2_with_the_peak_and_a_hover() {
    if renderer_available() {
        active_timeline_snapshot("gpt2_train_fixed-default", 44.0, "active_memory_timeline_gpt2", false);
    }
}

/// GPT-2 at the peak, higher up: the allocations under half a pixel, merged into one band per stack on top of the
/// bands; the hover says how much is live there and from where.
#[test]
fn active_memory_timeline_of_gpt2_merged_small_allocations() {
    if renderer_available() {
        active_timeline_snapshot("gpt2_train_fixed-default", 110.0, "active_memory_timeline_gpt2_merged", false);
    }
}

/// frag_oom: its allocations stacked in two waves, the peak at entry 39; the hover shows the stack frames the file
/// recorded.
#[test]
fn active_memory_timeline_of_frag_oom_with_frames() {
    if renderer_available() {
        active_timeline_snapshot("frag_oom-default", 120.0, "active_memory_timeline_frag_oom", false);
    }
}

/// GPT-2's segments as PyTorch's allocator held them (memory_viz's cached memory view): the blocks stacked in the
/// order they were reserved; the hover names a segment, its address and when it was reserved.
#[test]
fn segments_timeline_of_gpt2_with_a_hover() {
    if renderer_available() {
        active_timeline_snapshot("gpt2_train_fixed-default", 44.0, "segments_timeline_gpt2", true);
    }
}
