//! Opening a recording (`Recording::open`: a PyTorch snapshot, gzip or raw pickle, a native heapscope trace
//! or a CSV trace, told apart by their first bytes), with a spinner on stderr for large files (hidden when
//! stderr is not a terminal).

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};
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
    spinner.set_message(format!("{what} {}", heapscope_core::path_name(path)));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let result = load();
    spinner.finish_and_clear();
    result
}

/// Whether two paths name one file: the same path, or the same file reached another way (a link, `./`), existing or
/// not.
pub fn same_file(first: &Path, second: &Path) -> bool {
    // The file a path names: its link resolved, else its folder's (`x` is in `.`).
    let resolved = |path: &Path| {
        std::fs::canonicalize(path).ok().or_else(|| {
            let folder = path.parent().filter(|folder| !folder.as_os_str().is_empty()).unwrap_or(Path::new("."));
            Some(std::fs::canonicalize(folder).ok()?.join(path.file_name()?))
        })
    };
    first == second || resolved(first).is_some_and(|file| Some(file) == resolved(second))
}

/// Refuses to write `out` over the recording being read (`convert x.csv --out x.csv` replaced the file by what was
/// made of it), or through the partial file it is written to first (`convert .x.hst.partial --out x.hst`).
///
/// # Errors
/// When `out` names the file `recording` names.
pub fn refuse_overwriting(recording: &Path, out: &Path) -> Result<()> {
    if same_file(recording, out) {
        bail!("{} is the recording being read: writing there would replace it; name another file", out.display());
    }
    // The file is written whole beside it first (`.NAME.partial`, cleared before): that must not be the recording
    // either.
    if let Ok(partial) = heapscope_core::whole_file::partial_path(out)
        && same_file(recording, &partial)
    {
        bail!(
            "{} is the recording being read, and where {} is written first: writing there would remove it; name another \
             file",
            recording.display(),
            out.display()
        );
    }
    Ok(())
}
