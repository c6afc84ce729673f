//! `heapscope export` and `heapscope summary`: a replay written down in PyTorch's own forms — a memory
//! snapshot that PyTorch's memory_viz opens, and the `torch.cuda.memory_summary()` table.

use std::io::BufWriter;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use heapscope_core::compare::{Contender, alloc_conf};
use heapscope_core::pytorch::replayed::{Replayed, emulated_snapshot, replayed_snapshot};
use heapscope_core::pytorch::write_snapshot;
use heapscope_core::recording::Recording;

use crate::replay::RecordingArgs;

/// Arguments of `heapscope export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub recording: RecordingArgs,
    /// The contender whose layout to export.
    #[arg(long = "policy", value_name = "NAME")]
    pub policy: Contender,
    /// Where to write the snapshot (pickle protocol 4, like `torch.cuda.memory._dump_snapshot`).
    #[arg(long, value_name = "OUT.pickle")]
    pub out: PathBuf,
}

/// Arguments of `heapscope summary`.
#[derive(Debug, Args)]
pub struct SummaryArgs {
    #[command(flatten)]
    pub recording: RecordingArgs,
    /// The contender (default: pytorch).
    #[arg(long = "policy", value_name = "NAME", default_value = "pytorch")]
    pub policy: Contender,
}

/// Replays the recording through `contender` and writes it down.
fn replayed(args: &RecordingArgs, recording: &Recording, contender: Contender) -> Result<Replayed> {
    Ok(match contender {
        Contender::Pytorch => {
            let conf = alloc_conf(recording, args.alloc_conf.as_deref())?;
            let recorded = recording
                .snapshot
                .as_ref()
                .and_then(|snapshot| snapshot.settings.as_ref())
                .map(|settings| settings.alloc_conf.as_str());
            let text = match (recorded, args.alloc_conf.as_deref()) {
                (Some(recorded), Some(extra)) if !recorded.is_empty() => format!("{recorded},{extra}"),
                (_, Some(extra)) => extra.to_owned(),
                (recorded, None) => recorded.unwrap_or_default().to_owned(),
            };
            emulated_snapshot(recording, &conf, &text, args.capacity)?
        }
        other => replayed_snapshot(recording, other, &args.compare_config())?,
    })
}

/// Runs the export.
pub fn run_export(args: &ExportArgs) -> Result<()> {
    let recording = args.recording.open()?;
    let replayed =
        replayed(&args.recording, &recording, args.policy).with_context(|| format!("replaying through {}", args.policy))?;
    let file = std::fs::File::create(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    write_snapshot(&replayed.snapshot, BufWriter::new(file)).with_context(|| format!("writing {}", args.out.display()))?;
    let entries: usize = replayed.snapshot.device_traces.iter().map(Vec::len).sum();
    eprintln!(
        "{} through {}: {} segments, {entries} trace entries -> {}",
        recording.name,
        args.policy,
        replayed.snapshot.segments.len(),
        args.out.display()
    );
    Ok(())
}

/// Runs the summary.
pub fn run_summary(args: &SummaryArgs) -> Result<()> {
    let recording = args.recording.open()?;
    let replayed =
        replayed(&args.recording, &recording, args.policy).with_context(|| format!("replaying through {}", args.policy))?;
    out!("{}", replayed.stats.summary_table(recording.device));
    Ok(())
}
