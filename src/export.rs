//! `heapscope export` and `heapscope summary`: a replay written down in PyTorch's own forms — a memory
//! snapshot that PyTorch's memory_viz opens, and the `torch.cuda.memory_summary()` table.

use std::io::BufWriter;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use heapscope_core::whole_file::write_whole;

use crate::input;
use heapscope_lab::contender::Contender;
use heapscope_lab::export::replayed::{Replayed, emulated_snapshot, replayed_snapshot};
use heapscope_lab::export::vma_json::{VmaDeviceInfo, heap_report_to_vma_json};
use heapscope_lab::recording::Recording;
use heapscope_pytorch::write_snapshot;

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
    /// Also write the heap's final state as VMA's detailed JSON statistics (what `vmaBuildStatsString` writes
    /// and VMA's GpuMemDumpVis.py draws); heap contenders only.
    #[arg(long = "vma-json", value_name = "OUT.json")]
    pub vma_json: Option<PathBuf>,
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

/// Replays the recording through `contender` and writes it down; with the name the run goes by (a PyTorch
/// contender's with the settings it ran with, which `pytorch-expandable` turns off on a recording made with them on).
fn replayed(args: &RecordingArgs, recording: &Recording, contender: Contender) -> Result<(Replayed, String)> {
    Ok(match contender {
        Contender::Pytorch { expandable } => {
            // The settings it runs with, written into the snapshot as the PYTORCH_CUDA_ALLOC_CONF it saw.
            let config = args.compare_config(recording);
            let conf = config.pytorch_conf(recording, expandable)?;
            // A device smaller than what the recording held at its start never ran it (as `replay` and `compare` say).
            if let Some(why) = heapscope_lab::compare::start_exceeds(recording, &conf, args.capacity(recording).bytes) {
                bail!("{}: {why}", recording.shown_name());
            }
            let overrides = conf.overrides();
            let shown =
                format!("{contender} with PYTORCH_CUDA_ALLOC_CONF={}", if overrides.is_empty() { "\"\"" } else { &overrides });
            (emulated_snapshot(recording, &conf, &overrides, args.capacity(recording).bytes)?, shown)
        }
        Contender::GpuAllocator | Contender::Vma => {
            bail!("{contender} runs on a Vulkan device only: export and summary replay simulated contenders")
        }
        other => (replayed_snapshot(recording, other, &args.compare_config(recording))?, other.to_string()),
    })
}

/// The overview of a file of several devices (none for one): each device, the one replayed marked, with the capacity
/// asked for (not the one a device's `oom` entry tells: every device is its own).
fn devices_overview(args: &RecordingArgs, recording: &Recording) -> Vec<String> {
    let asked = heapscope_lab::compare::CompareConfig { capacity_bytes: args.capacity, ..args.compare_config(recording) };
    crate::replay::devices_overview(recording, args.device, &asked)
}

/// Runs the export.
pub fn run_export(args: &ExportArgs) -> Result<()> {
    args.recording.check(&[args.policy], false)?;
    if args.vma_json.is_some() && !matches!(args.policy, Contender::Heap(_)) {
        bail!("--vma-json needs a heap contender (a core policy such as tlsf), not {}", args.policy);
    }
    let recording = args.recording.open()?;
    for out in std::iter::once(&args.out).chain(&args.vma_json) {
        input::refuse_overwriting(&args.recording.file, out)?;
    }
    if let Some(json) = &args.vma_json
        && input::same_file(json, &args.out)
    {
        bail!("--vma-json {} and --out {} name the same file: one would overwrite the other", json.display(), args.out.display());
    }
    // A file of several devices: which one is written (the snapshot holds that device alone), and the others.
    for line in devices_overview(&args.recording, &recording) {
        errln!("{line}");
    }
    let (replayed, shown) =
        replayed(&args.recording, &recording, args.policy).with_context(|| format!("replaying through {}", args.policy))?;
    // Each file is written whole or not at all, the JSON inside the pickle's write: an export that fails leaves
    // neither, nor a truncated one where an older file was.
    let write_json = |report: &heapscope_core::HeapReport| -> Result<()> {
        let Some(path) = &args.vma_json else { return Ok(()) };
        // The heap's final layout from the same run that wrote the snapshot.
        let config = args.recording.compare_config(&recording);
        // The simulated device: the capacity given, else as large as the most the heap ever reserved.
        let mut device =
            VmaDeviceInfo::simulated(args.recording.capacity(&recording).bytes.unwrap_or(report.stats.peak_reserved_bytes));
        device.preferred_block_size = config.heap.block_size_bytes;
        let json = heap_report_to_vma_json(report, &device);
        write_whole(path, |file| std::io::Write::write_all(file, json.as_bytes()))
            .with_context(|| format!("cannot write {}", path.display()))
    };
    write_whole(&args.out, |file| -> Result<()> {
        write_snapshot(&replayed.snapshot, BufWriter::new(file))?;
        replayed.heap_report.as_ref().map_or(Ok(()), write_json)
    })
    .with_context(|| format!("writing {}", args.out.display()))?;
    let entries: usize = replayed.snapshot.device_traces.iter().map(Vec::len).sum();
    errln!(
        "{} through {shown}: {}, {} -> {}",
        recording.shown_name(),
        heapscope_lab::recording::counted(replayed.snapshot.segments.len() as u64, "segment", "segments"),
        heapscope_lab::recording::counted(entries as u64, "trace entry", "trace entries"),
        args.out.display()
    );
    if let (Some(path), Some(report)) = (&args.vma_json, &replayed.heap_report) {
        errln!(
            "{} through {}: {} blocks -> {} (VMA JSON)",
            recording.shown_name(),
            args.policy,
            report.blocks.len(),
            path.display()
        );
    }
    Ok(())
}

/// Runs the summary.
pub fn run_summary(args: &SummaryArgs) -> Result<()> {
    args.recording.check(&[args.policy], false)?;
    let recording = args.recording.open()?;
    let (replayed, shown) =
        replayed(&args.recording, &recording, args.policy).with_context(|| format!("replaying through {}", args.policy))?;
    for line in devices_overview(&args.recording, &recording) {
        outln!("{line}");
    }
    // Whose table this is, on stderr: PyTorch's own layout says nothing of the contender, or of settings that are a
    // what-if, and stdout stays the table as `torch.cuda.memory_summary()` prints it.
    errln!("{} replayed through {shown}", recording.shown_name());
    if let Contender::Pytorch { .. } = args.policy {
        errln!("{}", crate::replay::settings_line(&recording, &args.recording));
    }
    out!("{}", replayed.stats.summary_table(recording.device));
    let caveats = heapscope_lab::caveats::of_recording(&recording);
    if recording.start_events > 0 && heapscope_lab::caveats::no_trace(&recording).is_none() {
        // PyTorch's own table counts from the process's start: this one cannot, and says so (compare and replay do); a
        // file with no trace says why its counters hold only the state, below.
        outln!(
            "\nrecorded mid-run: the counters start at entry 0, with what was allocated then counted as allocated; \
             torch.cuda.memory_summary() counted from the process's start (allocations, peaks, retries and OOMs before \
             the recording are not in these)"
        );
    }
    // What the file cannot tell (no trace, actions heapscope does not know, final segments unlike the trace's end), as
    // advise and top say it.
    for note in caveats {
        outln!("\n{note}");
    }
    if let Some(note) = heapscope_lab::caveats::emulation_departs(
        &recording,
        replayed.fidelity.as_ref(),
        args.recording.capacity(&recording).bytes,
    ) {
        outln!("\n{note}");
    }
    Ok(())
}
