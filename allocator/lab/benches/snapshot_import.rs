//! Import and replay of a large PyTorch snapshot, against the alternatives measured in the same run.
//!
//! `cargo bench -p heapscope-lab --bench snapshot_import` writes a synthetic snapshot of 400,000 trace
//! events with `scripts/synthetic_snapshot.py` (python3's standard library; set `HEAPSCOPE_SNAPSHOT` to use
//! another file), then measures, best of 5 runs each:
//! - heapscope's import (`read_snapshot`: the streaming pickle reader and the typed model);
//! - serde-pickle 1.2 decoding the same file into its generic `Value` tree (the general-purpose crate this
//!   reader was chosen against; it does not even build the typed model);
//! - python3's `pickle.load` of the file, when python3 is there;
//! - the whole `heapscope replay --policy tlsf` path: import, recording, replay through a TLSF heap;
//! - the pytorch emulation of the same recording.
//!
//! and the peak resident memory of the import alone (a child process, so earlier runs do not count)
//! against the file's size. It prints a table and writes it to `target/heapscope-bench/snapshot_import.md`.
//!
//! For profilers, the binary also runs one path alone on `FILE`: `--import-only FILE` (the import once, printing
//! its peak resident KiB), `--replay-only FILE` (import and replay through tlsf, best of 5), `--without-import FILE`
//! (the replay through tlsf of a recording imported once, best of 5).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use heapscope_core::{PolicyKind, units::Bytes};
use heapscope_lab::compare::{CompareConfig, alloc_conf, replay, replay_pytorch};
use heapscope_lab::contender::Contender;
use heapscope_lab::recording::Recording;
use heapscope_pytorch::read_snapshot;

const RUNS: usize = 5;

fn best_of<T>(mut run: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        let value = run();
        best = best.min(started.elapsed());
        last = Some(value);
    }
    (best, last.expect("at least one run"))
}

fn ms(duration: Duration) -> String {
    format!("{:.1}", duration.as_secs_f64() * 1e3)
}

/// The snapshot to measure: `HEAPSCOPE_SNAPSHOT`, or a 400k-event synthetic one made once under target/.
fn snapshot_file() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("HEAPSCOPE_SNAPSHOT") {
        return Some(PathBuf::from(path));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join("target/heapscope-bench/synthetic-400k.pickle");
    if !path.exists() {
        std::fs::create_dir_all(path.parent()?).ok()?;
        let status = Command::new("python3").arg(root.join("scripts/synthetic_snapshot.py")).arg(&path).status().ok()?;
        if !status.success() {
            return None;
        }
    }
    Some(path)
}

/// Peak resident memory (KiB) of a child running only the import, when this binary is called with
/// `--import-only FILE`.
fn peak_rss_of_import(path: &Path) -> Option<u64> {
    let output = Command::new(std::env::current_exe().ok()?).arg("--import-only").arg(path).output().ok()?;
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

fn vm_hwm_kib() -> Option<u64> {
    status_kib("VmHWM:")
}

/// A line of /proc/self/status in KiB (`VmHWM:`, `VmRSS:`).
fn status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find(|line| line.starts_with(key))?.split_whitespace().nth(1)?.parse().ok()
}

/// What `heapscope replay FILE --policy tlsf` does: import, recording, replay through a TLSF heap.
fn import_and_replay(path: &Path) -> heapscope_lab::compare::Figures {
    let snapshot = read_snapshot(path).expect("the snapshot reads");
    let recording = Recording::from_snapshot(&path.display().to_string(), snapshot, 0).expect("device 0");
    let outcome = replay(&recording, Contender::Heap(PolicyKind::Tlsf), &CompareConfig::default()).expect("replays");
    outcome.figures().cloned().expect("a simulated heap contender runs")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(position) = args.iter().position(|arg| arg == "--import-only") {
        let snapshot = read_snapshot(Path::new(&args[position + 1])).expect("the snapshot reads");
        std::hint::black_box(&snapshot);
        println!("{}", vm_hwm_kib().unwrap_or(0));
        eprintln!(
            "resident after the import: {} KiB ({} KiB anonymous, {} KiB file)",
            status_kib("VmRSS:").unwrap_or(0),
            status_kib("RssAnon:").unwrap_or(0),
            status_kib("RssFile:").unwrap_or(0)
        );
        return;
    }
    if let Some(position) = args.iter().position(|arg| arg == "--without-import") {
        // For profilers: the replay through tlsf alone, of a recording imported once, five times.
        let path = Path::new(&args[position + 1]);
        let recording = Recording::open(path, 0).expect("the snapshot reads");
        let (best, _) =
            best_of(|| replay(&recording, Contender::Heap(PolicyKind::Tlsf), &CompareConfig::default()).expect("replays"));
        println!("replay through tlsf without the import: {} ms", ms(best));
        return;
    }
    if let Some(position) = args.iter().position(|arg| arg == "--replay-only") {
        // For profilers: only the `heapscope replay --policy tlsf` path, five times.
        let path = Path::new(&args[position + 1]);
        let (whole, _) = best_of(|| import_and_replay(path));
        println!("import + replay through tlsf: {} ms", ms(whole));
        return;
    }
    let Some(path) = snapshot_file() else {
        eprintln!("snapshot_import: no snapshot (python3 missing and HEAPSCOPE_SNAPSHOT unset): nothing measured");
        return;
    };
    let file_bytes = std::fs::metadata(&path).map(|meta| meta.len()).unwrap_or(0);
    let name = path.display().to_string();

    let (import, snapshot) = best_of(|| read_snapshot(&path).expect("the snapshot reads"));
    let entries: usize = snapshot.device_traces.iter().map(Vec::len).sum();
    let (serde_pickle, _) = best_of(|| {
        let mut bytes = std::fs::read(&path).expect("the file reads");
        if bytes.starts_with(&[0x1f, 0x8b]) {
            let mut raw = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut raw).expect("the gzip stream reads");
            bytes = raw;
        }
        // Without this option serde-pickle refuses the file (`Syntax(Recursive)`): it resolves memo references
        // by moving values out of its memo, and a frame list shared through the memo trips it up.
        serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new().replace_recursive_structures())
            .expect("serde-pickle decodes it")
    });
    let python = Command::new("python3")
        .arg("-c")
        .arg(
            "import gzip,pickle,sys,time\nbest=1e9\nfor _ in range(3):\n t=time.perf_counter()\n f=open(sys.argv[1],'rb')\n \
             gz=f.read(2)==b'\\x1f\\x8b'; f.seek(0)\n pickle.load(gzip.GzipFile(fileobj=f) if gz else f)\n \
             best=min(best,time.perf_counter()-t)\nprint(best)",
        )
        .arg(&path)
        .output()
        .ok()
        .and_then(|output| String::from_utf8_lossy(&output.stdout).trim().parse::<f64>().ok())
        .map(Duration::from_secs_f64);
    let (whole, outcome) = best_of(|| import_and_replay(&path));
    let recording = Recording::from_snapshot(&name, snapshot, 0).expect("device 0");
    let conf = alloc_conf(&recording, None).expect("the recorded settings are valid");
    let (emulation, _) = best_of(|| replay_pytorch(&recording, &conf, None));
    let peak_kib = peak_rss_of_import(&path);

    let import_ms = import.as_secs_f64() * 1e3;
    let ratio = |other: Duration| format!("{:.2}", other.as_secs_f64() * 1e3 / import_ms);
    let mut text = format!(
        "snapshot_import: {name}, {} ({entries} trace entries), best of {RUNS}\n\n\
         | what | ms | vs heapscope import |\n|---|---|---|\n\
         | heapscope import (`read_snapshot`) | {} | 1.00 |\n\
         | serde-pickle 1.2 to a generic `Value` (`replace_recursive_structures`) | {} | {} |\n",
        Bytes(file_bytes),
        ms(import),
        ms(serde_pickle),
        ratio(serde_pickle),
    );
    if let Some(python) = python {
        text.push_str(&format!("| python3 `pickle.load` (best of 3) | {} | {} |\n", ms(python), ratio(python)));
    }
    text.push_str(&format!(
        "| import + replay through `tlsf` (the `heapscope replay --policy tlsf` path) | {} | {} |\n\
         | emulation of PyTorch's caching allocator on the imported recording | {} | {} |\n",
        ms(whole),
        ratio(whole),
        ms(emulation),
        ratio(emulation),
    ));
    if let Some(peak) = peak_kib {
        let peak_bytes = peak * 1024;
        text.push_str(&format!(
            "\nPeak resident memory of the import: {} = {:.2}x the file.\n",
            Bytes(peak_bytes),
            peak_bytes as f64 / file_bytes.max(1) as f64
        ));
    }
    text.push_str(&format!(
        "\n(tlsf replay: {} allocations, peak reserved {})\n",
        outcome.allocs,
        Bytes(outcome.peak_reserved_bytes)
    ));
    println!("{text}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/heapscope-bench/snapshot_import.md");
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(&out, text).ok();
}
