//! `heapscope convert`: any recording to heapscope's native trace format.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use heapscope_lab::compare::CompareConfig;

use crate::input;

/// Arguments of `heapscope convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// A PyTorch snapshot, a native trace or a CSV trace.
    pub file: PathBuf,
    /// Where to write the native trace.
    #[arg(long, value_name = "OUT")]
    pub out: PathBuf,
    /// Which device of a PyTorch snapshot (default: the one that ran out of memory, else the one with the most trace
    /// entries; a file of several devices lists them).
    #[arg(long, value_name = "N")]
    pub device: Option<usize>,
}

/// Runs the conversion.
pub fn run(args: &ConvertArgs) -> Result<()> {
    let mut recording = input::open_device(&args.file, args.device)?;
    for line in crate::replay::devices_overview(&recording, args.device, &CompareConfig::default()) {
        eprintln!("{line}");
    }
    // The trace remembers where it came from: the file's name (not the path it was read through).
    let file_name =
        args.file.file_name().map_or_else(|| args.file.display().to_string(), |name| name.to_string_lossy().into_owned());
    recording.trace.name = if recording.snapshot.is_some() {
        format!("{file_name} (device {})", recording.device)
    } else {
        recording.trace.name.clone()
    };
    recording.trace.write_native(&args.out).with_context(|| format!("converting {}", args.file.display()))?;
    eprintln!(
        "{}: {} events (the first {} allocate what was live before the recording started) -> {}",
        recording.shown_name(),
        recording.trace.events().len(),
        recording.start_events,
        args.out.display()
    );
    Ok(())
}
