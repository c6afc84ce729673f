//! Seeking in the timeline of a 1,000,000-event trace: the < 50 ms target of the GUI's scrubbing.
//!
//! `cargo bench -p heapscope-core --bench timeline_seek` builds synthetic traces of 1,000,000 events that
//! keep about 1,000 and about 100,000 allocations live (sizes log-uniform from 512 B to 128 MiB, frees of
//! random live allocations), records their timelines through a TLSF heap and through the PyTorch
//! emulation, and measures `Timeline::layout_at` at 200 pseudo-random positions (the worst and the median
//! count: scrubbing must stay smooth everywhere), then criterion on the same seeks. It prints a table and
//! writes it to `target/heapscope-bench/timeline_seek.md`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use heapscope_core::PolicyKind;
use heapscope_core::synthetic::steady_churn;
use heapscope_lab::compare::CompareConfig;
use heapscope_lab::contender::Contender;
use heapscope_lab::recording::Recording;
use heapscope_lab::timeline::Timeline;
use heapscope_lab::timeline::record::record;

const EVENTS: u64 = 1_000_000;

/// `EVENTS` events keeping about `live` allocations live.
fn trace(live: usize) -> Recording {
    Recording::from_trace(steady_churn(EVENTS, live, 128 << 20, 0x9e37_79b9_7f4a_7c15))
}

fn positions(steps: u64) -> Vec<u64> {
    heapscope_core::synthetic::positions(200, 0..steps + 1, 42)
}

fn ms(duration: Duration) -> String {
    format!("{:.2}", duration.as_secs_f64() * 1e3)
}

fn main() {
    let config = CompareConfig::default();
    let mut lines = vec![
        "| trace | contender | record s | checkpoints | checkpoint MiB | live at end | seek median ms | seek max ms |".to_owned(),
        "|---|---|---|---|---|---|---|---|".to_owned(),
    ];
    let mut timelines: Vec<(String, Timeline)> = Vec::new();
    for live in [1_000, 100_000] {
        let recording = trace(live);
        for contender in [Contender::Heap(PolicyKind::Tlsf), Contender::Pytorch { expandable: false }] {
            let started = Instant::now();
            let timeline = record(&recording, contender, &config).expect("the synthetic trace records");
            let record_time = started.elapsed();
            let mut seeks: Vec<Duration> = positions(timeline.steps())
                .into_iter()
                .map(|position| {
                    let started = Instant::now();
                    black_box(timeline.layout_at(position));
                    started.elapsed()
                })
                .collect();
            seeks.sort();
            let line = format!(
                "| {} | {contender} | {:.2} | {} | {:.0} | {} | {} | {} |",
                recording.trace.name,
                record_time.as_secs_f64(),
                timeline.checkpoints(),
                timeline.checkpoint_bytes() as f64 / f64::from(1 << 20),
                timeline.head().totals().live_allocations,
                ms(seeks[seeks.len() / 2]),
                ms(seeks[seeks.len() - 1]),
            );
            println!("{line}");
            lines.push(line);
            timelines.push((format!("seek {} {contender}", recording.trace.name), timeline));
        }
    }
    let text = lines.join("\n");
    println!("\n{text}");
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/heapscope-bench");
    if std::fs::create_dir_all(out).is_ok() {
        std::fs::write(format!("{out}/timeline_seek.md"), &text).ok();
    }

    let mut criterion = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3)).configure_from_args();
    for (name, timeline) in &timelines {
        let positions = positions(timeline.steps());
        let mut next = positions.iter().cycle();
        criterion.bench_function(name, |bench| {
            bench.iter(|| black_box(timeline.layout_at(*next.next().expect("cycles"))));
        });
    }
    criterion.final_summary();
}
