//! The active memory timeline at a million allocations: building its bands and one frame's shapes.
//!
//! `cargo bench -p heapscope-gui --bench active_timeline` writes a training-like trace of 1,000,000 allocations
//! (2,000 weights that live throughout, then 249 steps of 4,008 activations, log-uniform from 4 KiB to 64 MiB, freed
//! newest first except one in ten freed out of order while the step is still running), builds the lab's
//! `timeline::active` bands (timed once, with the pieces they come to), then times `active_plot::band_shapes` for a
//! 1600 x 220 plot (the app's timeline strip), the whole recording fitted: the best of 20 runs, then criterion.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use egui::{Pos2, Rect, Vec2};
use heapscope_core::trace::TraceBuilder;
use heapscope_gui::active_plot::band_shapes;
use heapscope_gui::palette::ColourBy;
use heapscope_lab::recording::Recording;
use heapscope_lab::timeline::active;

const WEIGHTS: u64 = 2_000;
const STEPS: u64 = 249;
const PER_STEP: u64 = 4_008;

fn recording() -> Recording {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut random = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
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
        shapes = black_box(band_shapes(&timeline, rect, max_bytes, ColourBy::StackGroup)).len();
        best = best.min(started.elapsed());
    }
    println!("one frame, 1600 x 220, whole recording: {shapes} shapes, best {:.2} ms", best.as_secs_f64() * 1e3);
    let mut criterion = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(5)).configure_from_args();
    criterion.bench_function("active timeline frame, 1M allocations", |bench| {
        bench.iter(|| black_box(band_shapes(&timeline, rect, max_bytes, ColourBy::StackGroup)));
    });
    criterion.final_summary();
}
