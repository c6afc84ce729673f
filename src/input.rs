//! Opening a recording: a PyTorch snapshot (gzip or raw pickle), a native heapscope trace or a CSV trace,
//! told apart by their first bytes. A spinner on stderr shows for large files (hidden when stderr is not a
//! terminal).

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use heapscope_core::Trace;
use heapscope_core::pytorch::read_snapshot;
use heapscope_core::recording::Recording;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Files above this size get a spinner while they load.
const SPINNER_FROM_BYTES: u64 = 8 << 20;

/// What a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `torch.cuda.memory._dump_snapshot` output, gzip-compressed or not.
    PytorchSnapshot,
    /// heapscope's native binary trace.
    Native,
    /// heapscope's compact CSV trace.
    Csv,
}

/// The format of a file starting with `head`.
pub fn sniff(head: &[u8]) -> Format {
    match head {
        [0x1f, 0x8b, ..] | [0x80, 2..=5, ..] => Format::PytorchSnapshot,
        _ if Trace::is_native(head) => Format::Native,
        _ => Format::Csv,
    }
}

/// The format of the file at `path`.
pub fn format_of(path: &Path) -> Result<Format> {
    let mut head = [0u8; 8];
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let read = file.read(&mut head).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(sniff(&head[..read]))
}

/// Opens the recording at `path` (device `device` of a PyTorch snapshot).
pub fn open(path: &Path, device: usize) -> Result<Recording> {
    let name = path.display().to_string();
    if std::fs::metadata(path).with_context(|| format!("cannot read {name}"))?.len() == 0 {
        anyhow::bail!("{name}: the file is empty");
    }
    let format = format_of(path)?;
    if device != 0 && format != Format::PytorchSnapshot {
        anyhow::bail!("{name}: --device {device} applies to PyTorch snapshots only; a heapscope trace has one device");
    }
    match format {
        Format::PytorchSnapshot => {
            let snapshot = with_spinner(path, "reading", || Ok(read_snapshot(path)?))?;
            Ok(Recording::from_snapshot(&name, snapshot, device)?)
        }
        Format::Native | Format::Csv => Ok(Recording::from_trace(with_spinner(path, "reading", || Ok(Trace::read(path)?))?)),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniff_table() {
        let cases: [(&[u8], Format); 6] = [
            (&[0x1f, 0x8b, 8, 0], Format::PytorchSnapshot),
            (&[0x80, 4, 0x95], Format::PytorchSnapshot),
            (&[0x80, 2, b'}'], Format::PytorchSnapshot),
            (b"HSTRACE\0", Format::Native),
            (b"a,1,10\n", Format::Csv),
            (&[], Format::Csv),
        ];
        for (head, format) in cases {
            assert_eq!(sniff(head), format, "{head:?}");
        }
    }
}
