//! Import speed and memory of a large snapshot. Ignored by default; run in release:
//!
//! ```text
//! scripts/synthetic_snapshot.py /tmp/syn400k.pickle              # 400 000 events, ~35 MB
//! scripts/synthetic_snapshot.py /tmp/syn400k.pickle.gz --gzip    # the same, 5.5 MB gzipped
//! HEAPSCOPE_SNAPSHOT=/tmp/syn400k.pickle cargo test --release -p heapscope-core \
//!     --test snapshot_import_speed -- --ignored --nocapture
//! ```
//!
//! Without `HEAPSCOPE_SNAPSHOT` it generates the 400 000-event file with python3 into a temporary
//! directory. It prints the best of five imports and the process's peak resident memory (VmHWM). A
//! relative `HEAPSCOPE_SNAPSHOT` is relative to `allocator/core` (the test's working directory). The
//! numbers measured are in the module doc of `src/pytorch/pickle_read.rs`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use heapscope_pytorch::read_snapshot;

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
#[ignore = "a benchmark: run in release with --ignored --nocapture"]
fn import_a_large_snapshot() {
    let path = match std::env::var_os("HEAPSCOPE_SNAPSHOT") {
        Some(path) => PathBuf::from(path),
        None => {
            let path = std::env::temp_dir().join(format!("heapscope-syn400k-{}.pickle", std::process::id()));
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/synthetic_snapshot.py");
            let status = Command::new("python3").arg(script).arg(&path).status().expect("python3 runs");
            assert!(status.success());
            path
        }
    };
    let file_bytes = std::fs::metadata(&path).unwrap().len();
    let before_kib = status_kib("VmRSS:").unwrap_or(0);
    let mut best = f64::INFINITY;
    let mut entries = 0;
    for _ in 0..5 {
        let start = Instant::now();
        let snapshot = read_snapshot(&path).unwrap();
        best = best.min(start.elapsed().as_secs_f64());
        entries = snapshot.device_traces.iter().map(Vec::len).sum::<usize>();
    }
    let peak_kib = status_kib("VmHWM:").unwrap_or(0);
    println!(
        "{}: {file_bytes} bytes, {entries} trace entries: best import {:.1} ms; peak RSS {:.1} MiB ({:.1} MiB before), {:.2}x the file",
        path.display(),
        best * 1e3,
        peak_kib as f64 / 1024.0,
        before_kib as f64 / 1024.0,
        (peak_kib.saturating_sub(before_kib) * 1024) as f64 / file_bytes as f64,
    );
    assert!(entries > 0);
}
