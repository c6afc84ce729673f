//! `heapscope replay`: a recording (PyTorch snapshot, native or CSV trace) through the contenders, a table
//! or one JSON object per line and contender.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use heapscope_core::PolicyKind;
use heapscope_core::compare::{CompareConfig, Contender, Outcome, alloc_conf, replay_contender, replay_pytorch};
use heapscope_core::recording::Recording;
use heapscope_core::units::{Bytes, parse_size};

use crate::input;
use crate::options::HeapRules;

/// What every command that replays a recording accepts.
#[derive(Debug, Clone, Args)]
pub struct RecordingArgs {
    /// A PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`, gzip or not), a native heapscope
    /// trace or a compact CSV trace.
    pub file: PathBuf,
    /// Device memory available to the allocator (e.g. `3584MiB`, `14GiB`); unlimited by default.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub capacity: Option<u64>,
    /// PyTorch allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, over the file's own
    /// (e.g. `expandable_segments:True,max_split_size_mb:128`).
    #[arg(long, value_name = "STR")]
    pub alloc_conf: Option<String>,
    /// Page size of the `paged` contender.
    #[arg(long, value_name = "SIZE", default_value = "2MiB", value_parser = parse_size)]
    pub page_size: u64,
    /// Which device's trace of a PyTorch snapshot.
    #[arg(long, value_name = "N", default_value = "0")]
    pub device: usize,
    /// Alignment of every request for the core's contenders (PyTorch rounds to 512 B).
    #[arg(long, value_name = "SIZE", default_value = "512", value_parser = parse_size)]
    pub align: u64,
    #[command(flatten)]
    pub heap: HeapRules,
}

impl RecordingArgs {
    /// Opens the recording.
    pub fn open(&self) -> Result<Recording> {
        input::open(&self.file, self.device)
    }

    /// The settings shared by the contenders.
    pub fn compare_config(&self) -> CompareConfig {
        CompareConfig {
            capacity_bytes: self.capacity,
            page_bytes: self.page_size,
            align_bytes: self.align,
            heap: self.heap.heap_config(PolicyKind::Tlsf),
        }
    }

    /// Checks the flags that matter to `contenders` before anything runs.
    pub fn check(&self, contenders: &[Contender]) -> Result<()> {
        if contenders.contains(&Contender::Paged) && !self.page_size.is_power_of_two() {
            anyhow::bail!("--page-size {} is not a power of two", self.page_size);
        }
        Ok(())
    }

    /// Replays `recording` through `contender`.
    pub fn outcome(&self, recording: &Recording, contender: Contender) -> Result<Outcome> {
        let outcome = match contender {
            Contender::Pytorch => replay_pytorch(recording, &alloc_conf(recording, self.alloc_conf.as_deref())?, self.capacity)?,
            other => replay_contender(&recording.trace, other, &self.compare_config(), &|event| recording.entry_of(event))?,
        };
        Ok(outcome)
    }
}

/// Arguments of `heapscope replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub recording: RecordingArgs,
    /// Contenders to run (repeat the flag): pytorch, tlsf, best-fit, first-fit, buddy, paged (the
    /// default set), or any other policy of `heapscope policies`.
    #[arg(long = "policy", value_name = "NAME")]
    pub policies: Vec<Contender>,
    /// Print one JSON object per line and contender instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The named contenders, or the default set.
pub fn contenders(named: &[Contender]) -> Vec<Contender> {
    if named.is_empty() { Contender::DEFAULT.to_vec() } else { named.to_vec() }
}

/// Runs the replay.
pub fn run(args: &ReplayArgs) -> Result<()> {
    let contenders = contenders(&args.policies);
    args.recording.check(&contenders)?;
    let recording = args.recording.open()?;
    if !args.json {
        let capacity = args.recording.capacity.map_or_else(|| "unlimited".to_owned(), |bytes| Bytes(bytes).to_string());
        outln!("{}: {} events, device capacity {capacity}", recording.name, recording.trace.events().len());
        print_header();
    }
    for contender in contenders {
        let outcome = args.recording.outcome(&recording, contender).with_context(|| format!("replaying through {contender}"))?;
        if args.json {
            outln!("{}", serde_json::to_string(&outcome)?);
        } else {
            print_row(&outcome);
        }
    }
    Ok(())
}

/// The table header of [`print_row`].
pub fn print_header() {
    outln!(
        "{:<12} {:>8} {:>12} {:>14} {:>8} {:>9} {:>5} {:>10}  fidelity",
        "policy",
        "allocs",
        "peak live",
        "peak reserved",
        "ratio",
        "segments",
        "OOMs",
        "ns/event"
    );
}

/// One contender's row.
pub fn print_row(outcome: &Outcome) {
    let fidelity = outcome.fidelity.as_ref().map_or_else(String::new, |fidelity| {
        format!(
            "segments {}/{}, placements {}/{}",
            fidelity.matched, fidelity.recorded, fidelity.placement_matched, fidelity.allocs
        )
    });
    outln!(
        "{:<12} {:>8} {:>12} {:>14} {:>8.4} {:>9} {:>5} {:>10.1}  {fidelity}",
        outcome.policy,
        outcome.allocs,
        Bytes(outcome.peak_live_bytes).to_string(),
        Bytes(outcome.peak_reserved_bytes).to_string(),
        outcome.reserved_over_live(),
        outcome.device_allocs,
        outcome.ooms,
        outcome.ns_per_event,
    );
    if let Some(oom) = &outcome.first_oom {
        outln!("{:<12} first OOM at entry {}: {}", "", oom.event_index, oom.message);
    }
}
