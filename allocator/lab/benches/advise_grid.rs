//! `heapscope advise`'s whole grid on a large recording, and what the one replay driver costs PyTorch's emulation.
//!
//! `cargo bench -p heapscope-lab --bench advise_grid` reads `HEAPSCOPE_SNAPSHOT`, or the 400,000-event synthetic
//! snapshot the `snapshot_import` bench writes under `target/heapscope-bench/` (run that one first), and measures in
//! the same run:
//! - the emulation stepped alone (`heapscope_pytorch::emulate`: the `Emulator` and its own loop), best of 3;
//! - the same emulation through the lab's driver (`emulate_pytorch`: a `SnapshotTarget`, the `BackingFollower`
//!   observer), best of 3 — the ratio is what the one driver costs;
//! - `advise` over the whole grid (every setting's run on the device, its capacity search and the checks above it,
//!   settings in parallel on every core), once.
//!
//! It prints a table and writes it to `target/heapscope-bench/advise_grid.md`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use heapscope_lab::advise::{AdviseConfig, advise};
use heapscope_lab::compare::{alloc_conf, emulate_pytorch};
use heapscope_lab::recording::Recording;
use heapscope_pytorch::{Unbacked, emulate};

fn timed<T>(runs: usize, mut run: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut value = None;
    for _ in 0..runs {
        let started = Instant::now();
        value = Some(run());
        best = best.min(started.elapsed());
    }
    (best, value.expect("at least one run"))
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = std::env::var_os("HEAPSCOPE_SNAPSHOT")
        .map_or_else(|| root.join("target/heapscope-bench/synthetic-400k.pickle"), PathBuf::from);
    if !path.exists() {
        eprintln!(
            "advise_grid: {} is missing: run `cargo bench -p heapscope-lab --bench snapshot_import` first, or set \
             HEAPSCOPE_SNAPSHOT; nothing measured",
            path.display()
        );
        return;
    }
    let recording = Recording::open(&path, 0).expect("the snapshot opens");
    let snapshot = recording.snapshot.as_ref().expect("a PyTorch snapshot");
    let conf = alloc_conf(&recording, None).expect("the recorded settings are valid");
    let (alone, emulation) = timed(3, || emulate(snapshot, 0, &conf, None).expect("the emulation replays"));
    let (driven, replay) = timed(3, || emulate_pytorch(&recording, &conf, None, &mut Unbacked).expect("the emulation replays"));
    assert_eq!(emulation.stats, replay.stats, "the same emulation either way");
    let config = AdviseConfig::default();
    let (grid, advice) = timed(1, || advise(&recording, &config, &|_, _| {}).expect("the advice runs"));
    let ms = |duration: Duration| format!("{:.1}", duration.as_secs_f64() * 1e3);
    let per_emulation = |duration: Duration| format!("{:.2}", duration.as_secs_f64() / alone.as_secs_f64());
    let text = format!(
        "advise_grid: {}, {} entries, {} threads\n\n\
         | what | ms | vs the emulation alone |\n|---|---|---|\n\
         | the emulation stepped alone (`heapscope_pytorch::emulate`) | {} | 1.00 |\n\
         | the emulation through the driver (`emulate_pytorch`) | {} | {} |\n\
         | `advise`, the whole grid: {} rows, each its run, capacity search and checks | {} | {} |\n\n\
         (the answer: {})\n",
        path.display(),
        recording.entries,
        config.threads,
        ms(alone),
        ms(driven),
        per_emulation(driven),
        advice.settings.len(),
        ms(grid),
        per_emulation(grid),
        advice.answer(),
    );
    println!("{text}");
    let out = root.join("target/heapscope-bench/advise_grid.md");
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(&out, &text).ok();
}
