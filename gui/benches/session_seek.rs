//! Scrubbing the app's side-by-side panes through a 1,000,000-event trace: the < 50 ms seek target of issue 6,
//! measured where the user feels it (every pane of a [`Session`] moving at once), against seeking the same panes
//! one after the other (what the app did before panes sought in parallel).
//!
//! `cargo bench -p heapscope-gui --bench session_seek` replays a synthetic trace of 1,000,000 events keeping about
//! 100,000 allocations live, 512 B to 4 MiB (`heapscope_core::synthetic::steady_churn`) through the four side-by-side contenders,
//! then, at 100 pseudo-random positions:
//! - **seek**: `Session::seek` (panes in parallel) against `Timeline::layout_at` of each pane in turn;
//! - **step**: one step of playback after the seek with the step's animation and explanation prepared (the
//!   layout before the step, kept by the pane) against rebuilding that layout per pane.
//!
//! It prints median and worst times, the ratios, and writes the table to `target/heapscope-bench/session_seek.md`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use heapscope_core::synthetic::steady_churn;
use heapscope_gui::session::Session;
use heapscope_lab::compare::CompareConfig;
use heapscope_lab::contender::Contender;
use heapscope_lab::recording::Recording;
use heapscope_lab::timeline::explain::explain;

const EVENTS: u64 = 1_000_000;
const LIVE: usize = 100_000;
/// Sizes up to 4 MiB: about 46 GB live, what one big GPU holds (the paged contender's virtual range is 1 TiB).
const MAX_SIZE_BYTES: u64 = 4 << 20;

fn positions(steps: u64) -> Vec<u64> {
    heapscope_core::synthetic::positions(100, 1..steps - 1, 42)
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Median and worst of `times`, in ms.
fn summary(times: &mut [Duration]) -> (f64, f64) {
    times.sort();
    (ms(times[times.len() / 2]), ms(times[times.len() - 1]))
}

fn main() {
    let recording = Recording::from_trace(steady_churn(EVENTS, LIVE, MAX_SIZE_BYTES, 0x9e37_79b9_7f4a_7c15));
    let started = Instant::now();
    let mut session = Session::new(recording, CompareConfig::default(), &Contender::SIDE_BY_SIDE).expect("the trace replays");
    println!("recorded {} panes of {} steps in {:.1} s", session.panes.len(), session.steps(), started.elapsed().as_secs_f64());
    let checkpoint_mib: Vec<String> = session
        .panes
        .iter()
        .map(|pane| format!("{} {:.0} MiB", pane.name(), pane.timeline.checkpoint_bytes() as f64 / f64::from(1 << 20)))
        .collect();
    let (mut seeks, mut serial_seeks, mut steps, mut rebuilt_steps) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for position in positions(session.steps()) {
        let started = Instant::now();
        session.seek(position);
        seeks.push(started.elapsed());

        let started = Instant::now();
        for pane in &session.panes {
            black_box(pane.timeline.layout_at(position));
        }
        serial_seeks.push(started.elapsed());

        // The step's animation and sentence need the layout before it: the first step after a seek builds it
        // once, every step after that keeps it.
        for pane in &mut session.panes {
            black_box(pane.layout_before(position - 1).1.totals());
        }
        let started = Instant::now();
        session.seek(position + 1);
        for pane in &mut session.panes {
            let (timeline, before) = pane.layout_before(position);
            black_box(explain(timeline, &before, position));
        }
        steps.push(started.elapsed());

        let started = Instant::now();
        for pane in &session.panes {
            let before = pane.timeline.layout_at(position);
            black_box(explain(&pane.timeline, &before, position));
        }
        rebuilt_steps.push(started.elapsed());
    }
    let live = session.panes[0].layout.totals().live_allocations;
    let rows = [
        ("seek, 4 panes", summary(&mut seeks), summary(&mut serial_seeks)),
        ("step after a seek, with its explanation", summary(&mut steps), summary(&mut rebuilt_steps)),
    ];
    let mut lines = vec![
        format!(
            "1,000,000 events, {live} live at the last position, {} cores",
            std::thread::available_parallelism().map_or(1, usize::from)
        ),
        String::new(),
        "| move | median ms | worst ms | peer median ms | peer worst ms | median ratio |".to_owned(),
        "|---|---|---|---|---|---|".to_owned(),
    ];
    for (name, (median, worst), (peer_median, peer_worst)) in rows {
        lines.push(format!(
            "| {name} | {median:.2} | {worst:.2} | {peer_median:.2} | {peer_worst:.2} | {:.2}x |",
            median / peer_median
        ));
    }
    lines.push(String::new());
    lines.push(format!("Checkpoints held: {}.", checkpoint_mib.join(", ")));
    lines.push(
        "Peers: the same panes sought one after the other from their checkpoints; the step's layout rebuilt per pane.".to_owned(),
    );
    let text = lines.join("\n");
    println!("{text}");
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/heapscope-bench");
    if std::fs::create_dir_all(out).is_ok() {
        std::fs::write(format!("{out}/session_seek.md"), &text).ok();
    }
}
