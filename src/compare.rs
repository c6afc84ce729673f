//! `heapscope compare`: every contender on one recording, in a table, and the out-of-memory verdict in
//! one sentence.

use anyhow::{Context, Result};
use clap::Args;
use heapscope_core::compare::{Outcome, alloc_conf, replay_pytorch, verdict_sentence};
use heapscope_vulkan::DeviceContender;

use crate::replay::{ContenderArgs, RecordingArgs, print_header, print_row, print_title};

/// Arguments of `heapscope compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub recording: RecordingArgs,
    #[command(flatten)]
    pub contenders: ContenderArgs,
}

/// Runs the comparison.
pub fn run(args: &CompareArgs) -> Result<()> {
    let (contenders, recording, runner) = args.contenders.prepare(&args.recording)?;
    let mut outcomes: Vec<Outcome> = Vec::new();
    for contender in contenders {
        outcomes.push(
            runner
                .outcome(&args.recording, &recording, contender)
                .and_then(|outcome| args.contenders.checked(outcome))
                .with_context(|| format!("replaying through {contender}"))?,
        );
    }
    print_title(&recording, args.recording.capacity);
    print_header();
    for outcome in &outcomes {
        print_row(outcome);
    }
    // The verdict of the first contender that failed (PyTorch's, when it did), with who would have coped.
    let Some(failed) = outcomes.iter().find(|outcome| outcome.ooms > 0) else {
        if outcomes.iter().all(Outcome::ran) {
            outln!("\nEvery contender served every request.");
        } else {
            outln!("\nEvery contender that ran served every request.");
        }
        return Ok(());
    };
    let mut extra = Vec::new();
    if failed.policy.starts_with("pytorch") && recording.snapshot.is_some() {
        let conf = match &args.recording.alloc_conf {
            Some(conf) => format!("{conf},expandable_segments:True"),
            None => "expandable_segments:True".to_owned(),
        };
        let conf = alloc_conf(&recording, Some(&conf))?;
        // On the device where it can run there; else (and without --vulkan) simulated, and said so.
        let on_device = if runner.on_device() {
            let contender = DeviceContender::Pytorch(conf.clone());
            Some(runner.device_outcome(&args.recording, &recording, &contender).context("replaying through pytorch")?)
                .filter(Outcome::ran)
        } else {
            None
        };
        let (expandable, name) = match on_device {
            Some(outcome) => (outcome, "`pytorch (vulkan)` with expandable segments"),
            None if runner.on_device() => (
                replay_pytorch(&recording, &conf, args.recording.capacity)?,
                "`pytorch` with expandable segments (simulated: the device cannot run it)",
            ),
            None => (replay_pytorch(&recording, &conf, args.recording.capacity)?, "`pytorch` with expandable segments"),
        };
        if expandable.ooms == 0 {
            extra.push(name.to_owned());
        }
    }
    if let Some(sentence) = verdict_sentence(failed, &outcomes, &extra) {
        outln!("\n{sentence}");
    }
    Ok(())
}
