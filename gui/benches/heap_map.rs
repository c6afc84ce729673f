//! The frame cost of the heap map: building the shapes for 100,000 live allocations (the < 8 ms target, in
//! release).
//!
//! `cargo bench -p heapscope-gui --bench heap_map` lays out 100,000 live allocations (sizes log-uniform
//! from 512 B to 4 MiB, with random gaps, in 256 MiB blocks, as a TLSF heap would hold them), then measures
//! `heap_map::build_shapes` for a 1600 x 900 map: the whole heap fitted, zoomed in 64 times, and with a
//! step animating. It prints the shape counts and the best time of 50 runs of each, then runs criterion.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use egui::{Pos2, Rect, Vec2};
use heapscope_gui::heap_map::{Rows, Scale, Scene, StepAnimation, build_shapes};
use heapscope_gui::palette::ColourBy;
use heapscope_lab::timeline::{Change, RegionKind, Span, Timeline};

const LIVE: u64 = 100_000;
const BLOCK_BYTES: u64 = 256 << 20;

fn timeline() -> Timeline {
    let mut rng = heapscope_core::rng::Rng::new(0x9e37_79b9_7f4a_7c15);
    let mut random = move |below: u64| rng.below(below);
    let mut timeline = Timeline::new("bench");
    let mut block_base = 0u64;
    let mut cursor = 0u64;
    timeline.push(&[Change::RegionAdded { address: 0, size_bytes: BLOCK_BYTES, kind: RegionKind::Block }], None).expect("fresh");
    for slot in 0..LIVE {
        let class = 9 + random(14);
        let size = (1u64 << class) + random(1u64 << class);
        let footprint = size.div_ceil(512) * 512;
        let gap = if random(4) == 0 { random(64) * 512 } else { 0 };
        if cursor + gap + footprint > BLOCK_BYTES {
            block_base += BLOCK_BYTES;
            cursor = 0;
            let region = Change::RegionAdded { address: block_base, size_bytes: BLOCK_BYTES, kind: RegionKind::Block };
            timeline.push(&[region], None).expect("fresh block");
        }
        cursor += gap;
        let span = Span {
            address: block_base + cursor,
            footprint_bytes: footprint,
            lead_bytes: 0,
            requested_bytes: size,
            slot: slot as u32,
            before_recording: false,
            born: slot,
        };
        cursor += footprint;
        timeline.push(&[Change::Allocated(span)], None).expect("free memory");
    }
    timeline
}

fn main() {
    let timeline = timeline();
    let layout = timeline.head();
    assert_eq!(layout.totals().live_allocations, LIVE);
    let rect = Rect::from_min_size(Pos2::ZERO, Vec2::new(1600.0, 900.0));
    let fit = Rows::fit(layout, &timeline, rect.height());
    let animation = StepAnimation {
        progress: 0.5,
        born: layout.spans().step_by(1000).map(|span| span.address).collect(),
        dying: layout.spans().step_by(997).copied().collect(),
        new_regions: vec![0],
        ..StepAnimation::default()
    };
    let scene = Scene {
        layout,
        timeline: &timeline,
        position: timeline.steps(),
        colour_by: ColourBy::Age,
        slots: &[],
        hues: &heapscope_gui::palette::GroupHues::default(),
        scale: None,
        animation: None,
        too_small_below: Some(1 << 20),
        hovered: None,
    };
    let zoomed = Scale { row_bytes: (fit.row_bytes / 64).max(1), ..fit };
    let cases: [(&str, Scale, f64, Option<&StepAnimation>); 3] = [
        ("100k live, whole heap", fit, 0.0, None),
        ("100k live, zoomed 64x", zoomed, 2000.0, None),
        ("100k live, whole heap, animating", fit, 0.0, Some(&animation)),
    ];
    let mut criterion = Criterion::default().sample_size(30).measurement_time(Duration::from_secs(3)).configure_from_args();
    for (name, scale, scroll, animation) in cases {
        let rows = Rows::new(layout, &timeline, scale);
        let scene = Scene { animation, ..scene };
        let mut shapes = Vec::new();
        let mut best = Duration::MAX;
        for _ in 0..50 {
            shapes.clear();
            let started = Instant::now();
            build_shapes(&scene, &rows, rect, scroll, &mut shapes);
            best = best.min(started.elapsed());
        }
        println!(
            "{name}: {} shapes, {} rows of {} B, best {:.2} ms",
            shapes.len(),
            rows.bands.iter().map(|band| band.rows).sum::<u64>(),
            rows.row_bytes,
            best.as_secs_f64() * 1e3
        );
        criterion.bench_function(name, |bench| {
            bench.iter(|| {
                let mut shapes = Vec::with_capacity(4096);
                build_shapes(&scene, &rows, rect, scroll, &mut shapes);
                black_box(shapes)
            });
        });
    }
    criterion.final_summary();
}
