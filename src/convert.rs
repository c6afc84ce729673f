//! `heapscope convert`: any recording to heapscope's native trace format.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use heapscope_core::units::exact_size;
use heapscope_lab::capacity::Capacity;
use heapscope_lab::compare::{CompareConfig, alloc_conf};
use heapscope_lab::recording::{Recording, counted};
use heapscope_pytorch::Action;

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
    input::refuse_overwriting(&args.file, &args.out)?;
    let mut recording = input::open_device(&args.file, args.device)?;
    for line in crate::replay::devices_overview(&recording, args.device, &CompareConfig::default()) {
        errln!("{line}");
    }
    // The trace remembers where it came from: the file's name (not the path it was read through).
    let file_name =
        args.file.file_name().map_or_else(|| args.file.display().to_string(), |name| name.to_string_lossy().into_owned());
    recording.trace.name = if recording.snapshot.is_some() {
        format!("{file_name}, device {}", recording.device)
    } else {
        // A native trace keeps the name it holds (converting it again changes nothing), a CSV trace takes its file's.
        native_name(&args.file).unwrap_or(file_name)
    };
    recording.trace.write_native(&args.out).with_context(|| format!("converting {}", args.file.display()))?;
    let start = match recording.start_events {
        0 => String::new(),
        1 => " (the first allocates what was live before the recording started)".to_owned(),
        events => format!(" (the first {events} allocate what was live before the recording started)"),
    };
    let events = counted(recording.trace.events().len() as u64, "event", "events");
    errln!("{}: {events}{start} -> {}", recording.shown_name(), args.out.display());
    if let Some(line) = left_out(&recording) {
        errln!("{line}");
    }
    if recording.unknown_frees > 0 {
        // As `replay` says them: a native trace has no event for a free of nothing it allocated.
        errln!(
            "{} of allocations the recording never shows (neither live at the start nor allocated since) left out",
            counted(recording.unknown_frees, "free", "frees")
        );
    }
    Ok(())
}

/// The name a native trace at `path` holds (`None`: no native trace, or no name).
fn native_name(path: &std::path::Path) -> Option<String> {
    let mut head = [0u8; 16];
    let read = std::io::Read::read(&mut std::fs::File::open(path).ok()?, &mut head).ok()?;
    if !heapscope_core::trace::Trace::is_native(&head[..read]) {
        return None;
    }
    Some(heapscope_core::trace::Trace::read(path).ok()?.name).filter(|name| !name.is_empty())
}

/// What a snapshot holds that its native trace does not (allocations and frees, numbered by event), with how to
/// give it back to a replay of the trace; `None` for a trace, which loses nothing.
fn left_out(recording: &Recording) -> Option<String> {
    let snapshot = recording.snapshot.as_ref()?;
    let trace = snapshot.device_traces.get(recording.device).map_or(&[][..], Vec::as_slice);
    let mut lost = Vec::new();
    let ooms = trace.iter().filter(|entry| entry.action == Action::Oom).count();
    if ooms > 0 {
        let capacity = Capacity::of(None, recording);
        let replay_on = capacity.bytes.map_or_else(String::new, |bytes| {
            format!(": --capacity {} replays on the device it tells", exact_size(bytes).replace(' ', ""))
        });
        let requests = if ooms == 1 { "its request is" } else { "their requests are" };
        lost.push(format!(
            "{} ({requests} in the trace as any other allocation, freed by the next event: `top` and `render --at peak` \
             count it live in between){replay_on}",
            counted(ooms as u64, "oom entry", "oom entries")
        ));
    }
    if let Ok(conf) = alloc_conf(recording, None)
        && !conf.overrides().is_empty()
    {
        lost.push(format!("the allocator settings: --alloc-conf {} replays with them", conf.overrides()));
    }
    if recording.start_events > 0 {
        lost.push(format!(
            "the segments that held the {} live at the start (the trace allocates them afresh: PyTorch's replay of it lays them out anew)",
            counted(recording.start_events as u64, "allocation", "allocations")
        ));
    }
    let streams = recording.streams();
    if streams > 1 {
        lost.push(format!("its {streams} CUDA streams (one stream in the trace)"));
    }
    // The recording's `empty_cache()` calls are events of the trace (`Recording::empty_caches`); the other segment
    // frees are PyTorch's own releases, which a replay makes again by its rules.
    if let Some(untold) = heapscope_lab::caveats::empty_caches_untold(recording) {
        lost.push(untold);
    }
    let kept = if recording.empty_caches_untold.is_none() {
        " (the `empty_cache()` calls among their frees are kept as events)"
    } else {
        ""
    };
    lost.push(format!(
        "segment events{kept}, stacks and times; the file's entry numbers (events are numbered instead); the segments' \
         recorded addresses (`pytorch` places its segments, and so its blocks, by the addresses a snapshot records: on the \
         trace it may place blocks otherwise, even with the recorded settings, and its totals of allocations and \
         non-releasable bytes differ where it does; its peaks of reserved memory and its segments stay)"
    ));
    Some(format!("the native trace keeps allocations and frees; left out: {}", lost.join("; ")))
}
