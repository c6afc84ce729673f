//! `heapscope demo`: the fragmentation out-of-memory story through every policy, headless: once with the
//! whole device as one range, once in a heap of blocks, so the part the block structure plays shows.

use anyhow::Result;
use clap::Args;
use heapscope_core::trace::Event;
use heapscope_core::units::Bytes;
use heapscope_core::{Heap, HeapConfig, OomVerdict, PolicyKind, ReleaseRule, SimulatedSource};
use heapscope_lab::driver::replay_heap;
use heapscope_lab::story::{self, Story};
use serde_json::json;

use crate::options::HeapArgs;

/// Arguments of `heapscope demo`.
#[derive(Debug, Default, Args)]
pub struct DemoArgs {
    #[command(flatten)]
    pub heap: HeapArgs,
    /// Print one JSON object per policy and layout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also draw the story's heap at its end (PyTorch in both modes, TLSF, paging) into this PNG (with --json, where it
    /// went is said on standard error).
    #[arg(long, value_name = "PNG")]
    pub png: Option<std::path::PathBuf>,
    /// The picture is a bonus (`heapscope` with no command draws one where a graphics adapter allows): failing to
    /// draw it is said, not an error. One asked for with `--png` that cannot be drawn or written fails the command.
    #[arg(skip)]
    pub png_optional: bool,
}

/// Where `heapscope` with no command (and no display) draws the heap.
pub const DEFAULT_PNG: &str = "heapscope-demo.png";

/// How the device is carved up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// One block spanning the device.
    Range,
    /// Blocks by the heap rules.
    Blocks,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Self::Range => "range",
            Self::Blocks => "blocks",
        }
    }
}

/// How one policy fared in a story.
struct Outcome {
    policy: PolicyKind,
    layout: Layout,
    served: bool,
    failed_before: u64,
    reserved_bytes: u64,
    live_bytes: u64,
    free_bytes: u64,
    largest_free_run_bytes: u64,
    blocks: usize,
    verdict: Option<OomVerdict>,
}

/// The release rule of the demo's blocks: `--release`, else the story's (frag_oom's blocks cache what empties until a
/// request needs the room, as PyTorch's allocator does: the heap's own default, `keep-one`, returns a dedicated block
/// at once, as VMA does, and then serves the 1 GiB).
fn release(story: &Story, heap_args: &HeapArgs) -> ReleaseRule {
    heap_args.rules.release(story.rules.release.unwrap_or_default())
}

fn heap_config(story: &Story, heap_args: &HeapArgs, policy: PolicyKind, layout: Layout) -> HeapConfig {
    let config = HeapConfig { release: release(story, heap_args), ..heap_args.rules.heap_config(policy) };
    match layout {
        Layout::Blocks => config,
        Layout::Range => config.one_range(story.device_bytes.min(heap_args.rules.budget.unwrap_or(u64::MAX))),
    }
}

/// Replays `story` through a heap of `policy` on a simulated device of the story's size.
fn outcome(story: &Story, heap_args: &HeapArgs, policy: PolicyKind, layout: Layout) -> Result<Outcome> {
    let source = SimulatedSource::new(story.device_bytes, SimulatedSource::DEFAULT_ALIGNMENT_BYTES);
    let mut heap = Heap::new(heap_config(story, heap_args, policy, layout), source)?;
    let replay = replay_heap(&story.trace, &mut heap, heap_args.rules.min_align)?;
    let report = heap.report();
    let served = replay.stats.last_event_ok;
    Ok(Outcome {
        policy,
        layout,
        served,
        failed_before: replay.stats.failed_allocations - u64::from(!served),
        reserved_bytes: report.totals.reserved_bytes,
        live_bytes: report.totals.live_bytes,
        free_bytes: report.totals.free_bytes,
        largest_free_run_bytes: report.totals.largest_free_run_bytes,
        blocks: report.blocks.len(),
        verdict: if served { None } else { replay.last_oom },
    })
}

fn result_word(outcome: &Outcome) -> String {
    match &outcome.verdict {
        None => "served".to_owned(),
        Some(verdict) => format!("oom ({})", verdict.cause.name()),
    }
}

/// Runs the demo.
pub fn run(args: &DemoArgs) -> Result<()> {
    if args.heap.rules.budget == Some(0) {
        anyhow::bail!("--budget 0: nothing could be allocated");
    }
    // A picture asked for that could not be written fails before the report, not after it.
    if let Some(path) = args.png.as_deref().filter(|_| !args.png_optional) {
        crate::gui::check_image_path(path, "--png", false)?;
    }
    let story = story::frag_oom();
    let last_request_bytes = match story.trace.events().last() {
        Some(Event::Alloc { size_bytes, .. }) => *size_bytes,
        _ => 0,
    };
    let mut rows = Vec::new();
    for policy in args.heap.policies() {
        rows.push((outcome(&story, &args.heap, policy, Layout::Range)?, outcome(&story, &args.heap, policy, Layout::Blocks)?));
    }
    if args.json {
        for outcome in rows.iter().flat_map(|(range, blocks)| [range, blocks]) {
            let line = json!({
                "story": story.name,
                "policy": outcome.policy.name(),
                "layout": outcome.layout.name(),
                "last_request_bytes": last_request_bytes,
                "served": outcome.served,
                "failed_before": outcome.failed_before,
                "reserved_bytes": outcome.reserved_bytes,
                "live_bytes": outcome.live_bytes,
                "free_bytes": outcome.free_bytes,
                "largest_free_run_bytes": outcome.largest_free_run_bytes,
                "blocks": outcome.blocks,
                "verdict": outcome.verdict,
            });
            outln!("{line}");
        }
        // Standard output holds JSON lines alone: where the picture went goes to standard error.
        return draw_png(args, |line| errln!("{line}"));
    }
    for line in story_in_words(&story)? {
        outln!("{line}");
    }
    outln!();
    let cached = match release(&story, &args.heap) {
        ReleaseRule::OnPressure => "cached once empty until a reservation fails",
        ReleaseRule::Never => "never given back",
        ReleaseRule::KeepOne => "given back once empty but one",
        ReleaseRule::Immediately => "given back once empty",
    };
    outln!("The core policies on the same stream: in one range of the device, and in blocks {cached}.");
    outln!("heapscope demo: {} — {}", story.name, story.summary);
    outln!("device: {} (simulated)", Bytes(story.device_bytes));
    outln!(
        "one range: the whole device (or budget) is one block; blocks: {}",
        args.heap.rules.describe(release(&story, &args.heap))
    );
    outln!();
    outln!(
        "{:<13} | {:<20} {:>11} {:>14} | {:<20} {:>11} {:>11} {:>17} {:>6} {:>14}",
        "",
        format!("one range: {}", Bytes(last_request_bytes)),
        "reserved",
        "refused before",
        format!("blocks: {}", Bytes(last_request_bytes)),
        "reserved",
        "live",
        "largest free run",
        "blocks",
        "refused before"
    );
    for (range, blocks) in &rows {
        outln!(
            "{:<13} | {:<20} {:>11} {:>14} | {:<20} {:>11} {:>11} {:>17} {:>6} {:>14}",
            range.policy.name(),
            result_word(range),
            Bytes(range.reserved_bytes).to_string(),
            range.failed_before,
            result_word(blocks),
            Bytes(blocks.reserved_bytes).to_string(),
            Bytes(blocks.live_bytes).to_string(),
            Bytes(blocks.largest_free_run_bytes).to_string(),
            blocks.blocks,
            blocks.failed_before
        );
    }
    print_verdicts(&rows);
    draw_png(args, |line| outln!("\n{line}"))
}

/// Draws `--png` if asked, telling where through `say`; a picture that cannot be drawn fails the command unless it
/// was optional (the headless default), when it is a notice.
fn draw_png(args: &DemoArgs, say: impl Fn(&str)) -> Result<()> {
    if let Some(path) = &args.png {
        // The table is the demo; the picture needs a graphics adapter (lavapipe will do).
        match crate::gui::demo_png(path) {
            Ok(()) => say(&format!("the heap at the end of the story: {}", path.display())),
            Err(error) if args.png_optional => errln!("heapscope: no picture of the heap: {error:#}"),
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// The headline in words, as the app says it: the story, PyTorch's allocator refusing the last request with the
/// app's verdict, and who serves it (expandable segments, paging).
fn story_in_words(story: &Story) -> Result<Vec<String>> {
    use heapscope_lab::contender::{Contender, PYTORCH, PYTORCH_EXPANDABLE};
    let recording = heapscope_lab::recording::Recording::from_trace(story.trace.clone());
    let config = story.config();
    let mut lines = vec![format!("The story: {}, on a {} device.", story.summary, Bytes(story.device_bytes))];
    let mut served = Vec::new();
    for contender in [PYTORCH, PYTORCH_EXPANDABLE, Contender::Paged] {
        let timeline = heapscope_lab::timeline::record::record(&recording, contender, &config)?;
        match timeline.refusals().last() {
            Some((_, refusal)) => {
                let (headline, _) = heapscope_gui::panels::verdict_words(refusal, 0);
                let who = if contender == PYTORCH { " (PyTorch's caching allocator, default settings)" } else { "" };
                lines.push(format!("  `{contender}`{who} refuses the {}. {headline}", Bytes(refusal.requested_bytes)));
            }
            None => served.push(format!("`{contender}`")),
        }
    }
    if !served.is_empty() {
        lines.push(format!(
            "  {} serve it: their memory is a virtual range whose pages are mapped where a request needs them.",
            served.join(" and ")
        ));
    }
    Ok(lines)
}

/// The verdicts of the failed final requests, one line per distinct verdict with the policies that met it.
fn print_verdicts(rows: &[(Outcome, Outcome)]) {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for outcome in rows.iter().flat_map(|(range, blocks)| [range, blocks]) {
        let Some(verdict) = &outcome.verdict else { continue };
        let who = format!("{} ({})", outcome.policy.name(), outcome.layout.name());
        let words = verdict.describe();
        match groups.iter_mut().find(|(text, _)| *text == words) {
            Some((_, policies)) => policies.push(who),
            None => groups.push((words, vec![who])),
        }
    }
    if groups.is_empty() {
        return;
    }
    outln!("\nwhy the last request failed:");
    for (words, policies) in groups {
        outln!("  {}: {words}", policies.join(", "));
    }
}
