//! `heapscope replay`: a heapscope trace through policies, on one range or in a heap of blocks.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use heapscope_core::replay::{replay_heap, replay_policy};
use heapscope_core::units::{Bytes, parse_size};
use heapscope_core::{Heap, PolicyConfig, SimulatedSource, Trace};
use serde_json::json;

use crate::options::HeapArgs;

/// Arguments of `heapscope replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A heapscope trace: compact CSV (`a,<id>,<size_bytes>` / `f,<id>` lines).
    pub file: PathBuf,
    /// Replay through a heap of blocks drawn from a simulated device instead of one contiguous range.
    #[arg(long)]
    pub heap: bool,
    /// The range (or, with --heap, the simulated device) size.
    #[arg(long, value_name = "SIZE", default_value = "32GiB", value_parser = parse_size)]
    pub capacity: u64,
    /// Alignment of every request.
    #[arg(long, value_name = "SIZE", default_value = "512", value_parser = parse_size)]
    pub align: u64,
    #[command(flatten)]
    pub heap_args: HeapArgs,
    /// Print one JSON object per policy instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the replay.
pub fn run(args: &ReplayArgs) -> Result<()> {
    let trace = Trace::read_csv(&args.file)?;
    if !args.json {
        let mode = if args.heap {
            format!("heap on a simulated device of {} ({})", Bytes(args.capacity), args.heap_args.describe())
        } else {
            format!("one range of {}", Bytes(args.capacity))
        };
        println!("{}: {} events, {mode}, requests aligned to {} B", trace.name, trace.events().len(), args.align);
        println!(
            "{:<13} {:>9} {:>7} {:>14} {:>14} {:>17}",
            "policy", "allocs", "failed", "peak live", "peak reserved", "reserved / live"
        );
    }
    for policy in args.heap_args.policies() {
        let (stats, peak_reserved, verdict) = if args.heap {
            let source = SimulatedSource::new(args.capacity, SimulatedSource::DEFAULT_ALIGNMENT_BYTES);
            let mut heap = Heap::new(args.heap_args.heap_config(policy), source)?;
            let replay = replay_heap(&trace, &mut heap, args.align).with_context(|| format!("replaying through {policy}"))?;
            (replay.stats, heap.stats().peak_reserved_bytes, replay.first_oom)
        } else {
            let config = PolicyConfig { min_align_bytes: args.heap_args.min_align, ..PolicyConfig::default() };
            let mut range = policy.build(args.capacity, &config)?;
            let stats =
                replay_policy(&trace, range.as_mut(), args.align).with_context(|| format!("replaying through {policy}"))?;
            let peak_end = stats.peak_end_bytes;
            (stats, peak_end, None)
        };
        let ratio = peak_reserved as f64 / stats.peak_live_bytes.max(1) as f64;
        if args.json {
            let line = json!({
                "trace": trace.name,
                "policy": policy.name(),
                "mode": if args.heap { "heap" } else { "range" },
                "allocations": stats.allocations,
                "failed_allocations": stats.failed_allocations,
                "first_failure_event": stats.first_failure,
                "peak_live_bytes": stats.peak_live_bytes,
                "peak_reserved_bytes": peak_reserved,
                "reserved_over_live": ratio,
                "first_verdict": verdict,
            });
            println!("{line}");
        } else {
            println!(
                "{:<13} {:>9} {:>7} {:>14} {:>14} {:>17.4}",
                policy.name(),
                stats.allocations,
                stats.failed_allocations,
                Bytes(stats.peak_live_bytes).to_string(),
                Bytes(peak_reserved).to_string(),
                ratio
            );
            if let Some(verdict) = verdict {
                println!("{:<13} first failure: {verdict}", "");
            }
        }
    }
    Ok(())
}
