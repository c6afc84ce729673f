//! Import speed and memory of a large snapshot. Ignored by default; run in release:
//!
//! ```text
//! scripts/synthetic_snapshot.py /tmp/syn400k.pickle              # 400 000 events, ~35 MB
//! scripts/synthetic_snapshot.py /tmp/syn400k.pickle.gz --gzip    # the same, 5.5 MB gzipped
//! # PyTorch >= 2.5's opcodes (the shared H200 files'), no frames: 280 000 events, ~21 MB
//! scripts/synthetic_snapshot.py /tmp/pt280k.pickle --events 280000 --layout pytorch --no-frames --one-stream
//! HEAPSCOPE_SNAPSHOT=/tmp/syn400k.pickle cargo test --release -p heapscope-pytorch \
//!     --test snapshot_import_speed -- --ignored --nocapture
//! ```
//!
//! Without `HEAPSCOPE_SNAPSHOT` it generates the 400 000-event file with python3 into a temporary
//! directory. It prints the best of five imports, the process's peak resident memory (VmHWM), and, in the
//! same run, the best of five of python3's `pickle.load` of the same file and the ratio (a gzipped file is
//! read through `gzip.open` there). A relative `HEAPSCOPE_SNAPSHOT` is relative to `allocator/pytorch` (the
//! test's working directory). The numbers measured are in the module doc of `src/pickle_read.rs`.

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
    // python3's pickle.load of the same file, same run, best of five.
    let script = r#"
import gzip, pickle, sys, time
path = sys.argv[1]
best = float("inf")
for _ in range(5):
    start = time.perf_counter()
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        pickle.load(f)
    best = min(best, time.perf_counter() - start)
print(best)
"#;
    match Command::new("python3").arg("-c").arg(script).arg(&path).output() {
        Ok(output) if output.status.success() => {
            let python: f64 = String::from_utf8_lossy(&output.stdout).trim().parse().unwrap_or(f64::NAN);
            println!(
                "python3 pickle.load: best {:.1} ms; heapscope's import takes {:.2}x its time ({:.1}x faster)",
                python * 1e3,
                best / python,
                python / best
            );
        }
        _ => println!("python3 pickle.load: not measured (python3 failed or is missing)"),
    }
    assert!(entries > 0);
}
