//! The active memory timeline at a million allocations: building its bands and one frame's shapes.
//!
//! `cargo bench -p heapscope-gui --bench active_timeline` writes a training-like trace of 1,000,000 allocations
//! (2,000 weights that live throughout, then 249 steps of 4,008 activations, log-uniform from 4 KiB to 64 MiB, freed
//! newest first except one in ten freed out of order while the step is still running), builds the lab's
//! `timeline::active` bands (timed once, with the pieces they come to), then times `active_plot::band_shapes` for a
//! 1600 x 220 plot (the app's timeline strip), the whole recording fitted: the best of 20 runs, then criterion. Last,
//! whole frames of the strip as the app draws it (egui's layout and tessellation, then wgpu on the machine's adapter,
//! lavapipe here, the image read back), the moment shown moving across the recording frame by frame.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use egui::{Pos2, Rect, Vec2};
use heapscope_core::trace::TraceBuilder;
use heapscope_gui::active_plot::band_shapes;
use heapscope_gui::palette::{ColourBy, RecordingHues};
use heapscope_lab::recording::Recording;
use heapscope_lab::timeline::active;

const WEIGHTS: u64 = 2_000;
const STEPS: u64 = 249;
const PER_STEP: u64 = 4_008;

fn recording() -> Recording {
    let mut rng = heapscope_core::rng::Rng::new(0x2545_f491_4f6c_dd1d);
    let mut random = move |below: u64| rng.below(below);
    let size = |random: &mut dyn FnMut(u64) -> u64| {
        let class = 12 + random(14);
        (1u64 << class) + random(1u64 << class)
    };
    let mut trace = TraceBuilder::new("training-like, 1M allocations");
    let mut next = 0u64;
    for _ in 0..WEIGHTS {
        trace.alloc(next, size(&mut random)).expect("fresh id");
        next += 1;
    }
    for _ in 0..STEPS {
        let first = next;
        let mut live: Vec<u64> = Vec::new();
        for _ in 0..PER_STEP {
            trace.alloc(next, size(&mut random)).expect("fresh id");
            live.push(next);
            next += 1;
            // One in ten frees an older activation of the step, out of order.
            if random(10) == 0 && live.len() > 2 {
                let index = random(live.len() as u64 - 1) as usize;
                trace.free(live.remove(index)).expect("live");
            }
        }
        while let Some(id) = live.pop() {
            trace.free(id).expect("live");
        }
        debug_assert!(next - first == PER_STEP);
    }
    Recording::from_trace(trace.finish())
}

fn main() {
    let recording = recording();
    let started = Instant::now();
    let timeline = active::build(&recording);
    let built = started.elapsed();
    let pieces: usize = timeline.bands.iter().map(|band| band.pieces.len()).sum();
    println!(
        "{} allocations, {} positions: bands built in {:.1} ms, {pieces} pieces",
        timeline.bands.len(),
        timeline.positions,
        built.as_secs_f64() * 1e3
    );
    let rect = Rect::from_min_size(Pos2::ZERO, Vec2::new(1600.0, 220.0));
    let max_bytes = timeline.peak_bytes as f64 * 1.05;
    let mut best = Duration::MAX;
    let mut shapes = 0;
    for _ in 0..20 {
        let started = Instant::now();
        let built = black_box(band_shapes(&timeline, rect, max_bytes, (ColourBy::StackGroup, &RecordingHues::default())));
        // The quads of the fills' mesh (the first shape), and the outlines beside it.
        let quads = match built.first() {
            Some(egui::Shape::Mesh(mesh)) => mesh.vertices.len() / 4,
            _ => 0,
        };
        shapes = quads + built.len().saturating_sub(1);
        best = best.min(started.elapsed());
    }
    println!("one frame, 1600 x 220, whole recording: {shapes} rectangles, best {:.2} ms", best.as_secs_f64() * 1e3);
    let mut criterion = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(5)).configure_from_args();
    criterion.bench_function("active timeline frame, 1M allocations", |bench| {
        bench.iter(|| black_box(band_shapes(&timeline, rect, max_bytes, (ColourBy::StackGroup, &RecordingHues::default()))));
    });
    criterion.final_summary();
    whole_frames(recording, &timeline);
}

/// Frames of the strip drawn whole by egui and wgpu (through egui_kittest, offscreen), the moment moving by a
/// fiftieth of the recording each frame: the median and the worst of 50, after 5 to warm up.
fn whole_frames(recording: Recording, timeline: &active::ActiveTimeline) {
    use heapscope_gui::Session;
    use heapscope_lab::compare::CompareConfig;
    use heapscope_lab::contender::Contender;
    let session = Session::new(recording, CompareConfig::default(), &[Contender::Heap(heapscope_core::PolicyKind::Tlsf)])
        .expect("the replay runs");
    let series = heapscope_gui::plot::Series::of(&session.panes[0].timeline);
    let positions = timeline.positions as f64;
    let mut harness =
        egui_kittest::Harness::builder().with_size([1600.0, 260.0]).with_pixels_per_point(1.0).wgpu().build_ui_state(
            |ui, position: &mut f64| {
                let named: [(&str, &heapscope_gui::plot::Series); 1] = [("tlsf", &series)];
                heapscope_gui::active_plot::show(ui, timeline, &named, (&session, ColourBy::StackGroup), *position, 220.0);
            },
            0.0,
        );
    // The peer in the same run: the same harness drawing one label, what any frame costs here.
    let mut empty =
        egui_kittest::Harness::builder().with_size([1600.0, 260.0]).with_pixels_per_point(1.0).wgpu().build_ui(|ui| {
            ui.label("an empty strip");
        });
    let (mut steps, mut renders, mut peers) = (Vec::new(), Vec::new(), Vec::new());
    for frame in 0..55 {
        *harness.state_mut() = positions * f64::from(frame % 50) / 50.0;
        let started = Instant::now();
        harness.step();
        let stepped = started.elapsed();
        if harness.render().is_err() {
            println!("whole frames: no graphics adapter here");
            return;
        }
        let rendered = started.elapsed() - stepped;
        let started = Instant::now();
        empty.step();
        let _ = empty.render();
        if frame >= 5 {
            steps.push(stepped);
            renders.push(rendered);
            peers.push(started.elapsed());
        }
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort_unstable();
        times[times.len() / 2].as_secs_f64() * 1e3
    };
    let (step, render, peer) = (median(&mut steps), median(&mut renders), median(&mut peers));
    println!(
        "whole frames, 1600 x 260, median of 50: egui {step:.2} ms + wgpu draw and read back {render:.2} ms = {:.2} ms; \
         a frame of one label on the same harness {peer:.2} ms ({:.1}x)",
        step + render,
        (step + render) / peer
    );
}
