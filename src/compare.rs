//! `heapscope compare`: every contender on one recording, in a table, and the out-of-memory verdict in
//! one sentence.

use anyhow::{Context, Result};
use clap::Args;
use heapscope_core::compare::{Outcome, alloc_conf, replay_pytorch, verdict_sentence};

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
    print_title(&recording, args.recording.capacity);
    let mut outcomes: Vec<Outcome> = Vec::new();
    for contender in contenders {
        outcomes.push(
            runner.outcome(&args.recording, &recording, contender).with_context(|| format!("replaying through {contender}"))?,
        );
    }
    print_header();
    for outcome in &outcomes {
        print_row(outcome);
    }
    // The verdict of the first contender that failed (PyTorch's, when it did), with who would have coped.
    let Some(failed) = outcomes.iter().find(|outcome| outcome.ooms > 0) else {
        outln!("\nEvery contender served every request.");
        return Ok(());
    };
    let mut extra = Vec::new();
    if failed.policy == "pytorch" && recording.snapshot.is_some() {
        let conf = match &args.recording.alloc_conf {
            Some(conf) => format!("{conf},expandable_segments:True"),
            None => "expandable_segments:True".to_owned(),
        };
        let expandable = replay_pytorch(&recording, &alloc_conf(&recording, Some(&conf))?, args.recording.capacity)?;
        if expandable.ooms == 0 {
            extra.push("`pytorch` with expandable segments".to_owned());
        }
    }
    if let Some(sentence) = verdict_sentence(failed, &outcomes, &extra) {
        outln!("\n{sentence}");
    }
    Ok(())
}
