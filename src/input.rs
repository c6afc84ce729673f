//! Opening a recording (`Recording::open`: a PyTorch snapshot, gzip or raw pickle, a native heapscope trace
//! or a CSV trace, told apart by their first bytes), with a spinner on stderr for large files (hidden when
//! stderr is not a terminal).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use heapscope_lab::recording::Recording;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Files above this size get a spinner while they load.
const SPINNER_FROM_BYTES: u64 = 8 << 20;

/// Opens the recording at `path` (device `device` of a PyTorch snapshot; `None`: the one that ran out of memory,
/// else the busiest).
pub fn open_device(path: &Path, device: Option<usize>) -> Result<Recording> {
    with_spinner(path, "reading", || Ok(Recording::open_device(path, device)?))
}

/// Runs `load` with a spinner on stderr when the file at `path` is large.
pub fn with_spinner<T>(path: &Path, what: &str, load: impl FnOnce() -> Result<T>) -> Result<T> {
    let large = std::fs::metadata(path).map(|meta| meta.len() >= SPINNER_FROM_BYTES).unwrap_or(false);
    if !large {
        return load();
    }
    let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}").unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    spinner.set_message(format!("{what} {}", path.display()));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let result = load();
    spinner.finish_and_clear();
    result
}
