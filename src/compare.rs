//! `heapscope compare`: every contender on one recording, in a table, and the out-of-memory verdict in
//! one sentence.

use anyhow::{Context, Result};
use clap::Args;
use heapscope_lab::caveats;
use heapscope_lab::compare::{Outcome, recorded_expandable, verdict_sentence};
use heapscope_lab::contender::{Contender, PYTORCH_EXPANDABLE};
use heapscope_lab::recording::Recording;

use crate::replay::{ContenderArgs, RecordingArgs, Runner, print_header, print_legend, print_row, print_title};

/// Arguments of `heapscope compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub recording: RecordingArgs,
    #[command(flatten)]
    pub contenders: ContenderArgs,
}

/// Runs the comparison (and, with validation on, says what the validation layer reported of it).
pub fn run(args: &CompareArgs) -> Result<()> {
    let (contenders, recording, runner) = args.contenders.prepare(&args.recording)?;
    compare(args, &contenders, &recording, &runner)?;
    runner.check_validation(false)
}

/// The table and the verdict.
fn compare(args: &CompareArgs, contenders: &[Contender], recording: &Recording, runner: &Runner) -> Result<()> {
    let mut outcomes: Vec<Outcome> = Vec::new();
    for &contender in contenders {
        outcomes.push(
            runner
                .outcome(&args.recording, recording, contender)
                .and_then(|outcome| args.contenders.checked(recording, outcome))
                .with_context(|| format!("replaying through {contender}"))?,
        );
    }
    print_title(recording, &args.recording, contenders);
    print_header();
    for outcome in &outcomes {
        print_row(outcome);
    }
    print_legend(&outcomes);
    // The emulation under the recorded settings: the one run with a fidelity.
    let emulation = outcomes.iter().filter_map(Outcome::figures).find(|figures| figures.fidelity.is_some());
    let capacity_bytes = args.recording.capacity(recording).bytes;
    for note in emulation.map(|figures| caveats::emulation(recording, figures, capacity_bytes)).unwrap_or_default() {
        outln!("\n{note}");
    }
    // The verdict of the first contender that failed (PyTorch's, when it did), with who would have coped.
    let Some(failed) = outcomes.iter().filter_map(Outcome::figures).find(|figures| figures.ooms > 0) else {
        if outcomes.iter().all(Outcome::ran) {
            outln!("\nEvery contender served every request.");
        } else {
            outln!("\nEvery contender that ran served every request.");
        }
        return Ok(());
    };
    let mut extra = Vec::new();
    if failed.policy.starts_with("pytorch") && !contenders.contains(&PYTORCH_EXPANDABLE) {
        // On the device where it can run there; else (and without --vulkan) simulated, and said so.
        let on_device = runner.outcome(&args.recording, recording, PYTORCH_EXPANDABLE).context("replaying through pytorch")?;
        // The other setting than the recording's: expandable segments on, or off for a recording made with them.
        let with = if recorded_expandable(recording) { "without" } else { "with" };
        let (expandable, name) = match on_device {
            Outcome::Ran(figures) if runner.on_device() => {
                (Outcome::Ran(figures), format!("`pytorch (vulkan)` {with} expandable segments"))
            }
            Outcome::Ran(figures) => (Outcome::Ran(figures), format!("`pytorch` {with} expandable segments")),
            Outcome::NotRun { .. } => (
                heapscope_lab::compare::replay(recording, PYTORCH_EXPANDABLE, &args.recording.compare_config(recording))?,
                format!("`pytorch` {with} expandable segments (simulated: the device cannot run it)"),
            ),
        };
        if let Some(figures) = expandable.figures() {
            extra.push((name, figures.clone()));
        }
    }
    let capacity_known = args.recording.capacity(recording).bytes.is_some();
    if let Some(sentence) = verdict_sentence(failed, &outcomes, &extra, capacity_known) {
        outln!("\n{sentence}");
    }
    Ok(())
}
