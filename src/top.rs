//! `heapscope top`: what holds the memory of a recording at a moment (the peak by default, an out-of-memory entry,
//! any entry), grouped by the code that allocated it — a table, or one JSON object.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use heapscope_core::units::Bytes;
use heapscope_lab::recording::{Moment, counted};
use heapscope_lab::top::{Grouping, Top, TopAt, top};

use crate::input;

/// `heapscope top FILE [--at EVENT|peak|oom] [--full-stack | --by-category] [--limit N] [--json]`.
#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    /// A PyTorch memory snapshot (its frames say where each allocation was made), a native or CSV trace.
    pub file: PathBuf,
    /// When: `peak` (the first moment the live bytes are highest), `oom` (when the first out-of-memory request was
    /// refused), `start` or an entry number.
    #[arg(long, value_name = "EVENT|peak|oom", default_value = "peak", allow_negative_numbers = true)]
    pub at: TopAt,
    /// Which device of a PyTorch snapshot (default: the one that ran out of memory, else the busiest).
    #[arg(long, value_name = "N")]
    pub device: Option<usize>,
    /// Group by the whole stack (allocator and interpreter frames folded) instead of the innermost user frame.
    #[arg(long, conflicts_with = "by_category")]
    pub full_stack: bool,
    /// Group by the category each allocation's entry was labelled with: `user_metadata`
    /// (`torch.cuda.memory._set_memory_metadata`), `compile_context` (a `torch.compile` region) or the profiler's
    /// `category`, the first of them naming one.
    #[arg(long)]
    pub by_category: bool,
    /// Rows of the table (every row with `--json`).
    #[arg(long, value_name = "N", default_value = "20")]
    pub limit: usize,
    /// One JSON object: `moment`, `event_index`, `live_bytes`, `live_count`, `grouping`, `rows` (`frames`, `bytes`,
    /// `count`, `share`, and `category` by category) and `refused`.
    #[arg(long)]
    pub json: bool,
}

/// Runs `heapscope top`.
pub fn run(args: &TopArgs) -> Result<()> {
    let recording = input::open_device(&args.file, args.device)?;
    let grouping = match (args.full_stack, args.by_category) {
        (true, _) => Grouping::FullStack,
        (_, true) => Grouping::Category,
        _ => Grouping::UserFrame,
    };
    let found = top(&recording, args.at, grouping)?;
    if args.json {
        outln!("{}", crate::output::json_line(&json(&found, args.at, grouping), &recording)?);
        return Ok(());
    }
    let when = match args.at {
        TopAt::Peak => format!("at the peak ({})", found.moment),
        TopAt::Oom => format!("when the request was refused ({})", found.moment),
        TopAt::Moment(moment) => format!("at {moment}"),
    };
    outln!(
        "{}: {} live {when}, in {}",
        recording.shown_name(),
        at_least(found.live_bytes, found.saturated),
        counted(found.live_count, "allocation", "allocations")
    );
    // What the live set may not say of the recorded run (actions heapscope does not know, final segments that disagree).
    for note in heapscope_lab::caveats::of_recording(&recording) {
        outln!("{note}");
    }
    if let Some(refused) = &found.refused {
        outln!("refused at entry {}: {}, from {}", refused.entry, Bytes(refused.bytes), where_from(&refused.frames));
        for frame in refused.frames.iter().skip(1) {
            outln!("{:>42}{frame}", "");
        }
    }
    if found.rows.is_empty() {
        return Ok(());
    }
    let header = match grouping {
        Grouping::FullStack => "where (the stack, innermost first)",
        Grouping::UserFrame => "where (the innermost user frame)",
        Grouping::Category => "category (the entry's label)",
    };
    outln!("{:>12} {:>7} {:>6}  {header}", "bytes", "count", "share");
    for row in found.rows.iter().take(args.limit) {
        let what = match grouping {
            Grouping::Category => row.category.as_deref().unwrap_or("(no category recorded)"),
            Grouping::UserFrame | Grouping::FullStack => where_from(&row.frames),
        };
        outln!("{:>12} {:>7} {:>5.1}%  {what}", at_least(row.bytes, found.saturated), row.count, row.share * 100.0);
        for frame in row.frames.iter().skip(1) {
            outln!("{:>30}{frame}", "");
        }
    }
    if found.rows.len() > args.limit {
        let rest = &found.rows[args.limit..];
        // Saturated: sizes read from a file may add up past a u64 (it overflowed, a panic).
        let bytes = rest.iter().fold(0u64, |sum, row| sum.saturating_add(row.bytes));
        outln!("{:>12} ... {} more ({})", "", counted(rest.len() as u64, "group", "groups"), at_least(bytes, found.saturated));
    }
    if found.saturated {
        outln!("≥: the bytes saturated at 2^64 - 1 (sizes read from the file add up past it); the true figure is larger");
    }
    Ok(())
}

/// The first frame, or why there is none.
fn where_from(frames: &[String]) -> &str {
    frames.first().map_or("(no stack recorded)", String::as_str)
}

/// `found` as the JSON object of `--json`.
fn json(found: &Top, at: TopAt, grouping: Grouping) -> serde_json::Value {
    let event_index = match found.moment {
        Moment::Start => None,
        Moment::Entry(entry) => Some(entry),
    };
    serde_json::json!({
        "at": match at { TopAt::Peak => "peak", TopAt::Oom => "oom", TopAt::Moment(_) => "moment" },
        "moment": found.moment.to_string(),
        "event_index": event_index,
        "live_bytes": found.live_bytes,
        "saturated": found.saturated,
        "live_count": found.live_count,
        "grouping": grouping.name(),
        "rows": found.rows,
        "refused": found.refused,
    })
}

/// `bytes` in units, with `≥` before a figure that saturated at `u64::MAX` (`saturated`: sizes read from a file add
/// up past it): a lower bound, as `summary` shows its saturated counters.
fn at_least(bytes: u64, saturated: bool) -> String {
    if saturated && bytes == u64::MAX { format!("≥{}", Bytes(bytes)) } else { Bytes(bytes).to_string() }
}
