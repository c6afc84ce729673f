//! Progress of the contenders replayed on a Vulkan device (`replay --vulkan`, `compare --vulkan`), on stderr: a
//! spinner naming the contender, its place among the contenders and the trace's events, with the time it has
//! taken, when stderr is a terminal; with `--progress` and stderr no terminal (a log), a line as each contender
//! starts and one when it is done. Standard output (the table, `--json`) never changes.
//!
//! A contender on the device can take minutes on a large trace (`paged` on lavapipe: 100,000 live 4 KiB
//! allocations take about 34 s, mostly in the driver); the spinner's clock says the command is alive. It counts
//! time, not events: the replay loop runs inside the lab and the Vulkan crate.

use std::cell::Cell;
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use anyhow::Result;
use heapscope_lab::compare::Outcome;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Not at all (simulated replays, or stderr no terminal without `--progress`).
    Off,
    /// A spinner on the terminal, cleared when each contender is done.
    Spinner,
    /// Lines on stderr.
    Lines,
}

/// Progress of the contenders of one command.
#[derive(Debug)]
pub struct Progress {
    mode: Mode,
    /// Contenders the command runs (a verdict may run one more).
    contenders: usize,
    started: Cell<usize>,
}

impl Progress {
    /// Progress for `contenders` contenders on a device (`on_device`): a spinner when stderr is a terminal, lines
    /// when `lines` (`--progress`) and it is not, else none.
    pub fn new(on_device: bool, lines: bool, contenders: usize) -> Self {
        Self::with_terminal(on_device, lines, contenders, std::io::stderr().is_terminal())
    }

    fn with_terminal(on_device: bool, lines: bool, contenders: usize, terminal: bool) -> Self {
        let mode = match (on_device, terminal, lines) {
            (false, _, _) => Mode::Off,
            (true, true, _) => Mode::Spinner,
            (true, false, true) => Mode::Lines,
            (true, false, false) => Mode::Off,
        };
        Self { mode, contenders, started: Cell::new(0) }
    }

    /// Runs `replay`, the replay of `events` events through `contender`, with its progress shown: done, not run (a
    /// device limit: the table's row says why) or failed.
    pub fn around(&self, contender: &str, events: usize, replay: impl FnOnce() -> Result<Outcome>) -> Result<Outcome> {
        if self.mode == Mode::Off {
            return replay();
        }
        let index = self.started.get() + 1;
        self.started.set(index);
        let place =
            if index <= self.contenders { format!("contender {index} of {}", self.contenders) } else { "verdict".to_owned() };
        let what = format!("{contender} on the device ({place}): {events} events");
        match self.mode {
            Mode::Spinner => {
                let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
                spinner.set_style(
                    ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                spinner.set_message(what);
                spinner.enable_steady_tick(Duration::from_millis(100));
                let result = replay();
                spinner.finish_and_clear();
                result
            }
            Mode::Lines | Mode::Off => {
                errln!("progress: {what}");
                let started = Instant::now();
                let result = replay();
                let how = match &result {
                    Ok(outcome) if outcome.why_not_run().is_some() => "not run",
                    Ok(_) => "done",
                    Err(_) => "failed",
                };
                errln!("progress: {contender} on the device: {how} in {:.1} s", started.elapsed().as_secs_f64());
                result
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_only_on_the_device_spinner_on_a_terminal_lines_when_asked() {
        let mode = |on_device, lines, terminal| Progress::with_terminal(on_device, lines, 2, terminal).mode;
        assert_eq!(mode(false, true, true), Mode::Off, "simulated replays are quick");
        assert_eq!(mode(true, false, true), Mode::Spinner);
        assert_eq!(mode(true, true, true), Mode::Spinner);
        assert_eq!(mode(true, true, false), Mode::Lines);
        assert_eq!(mode(true, false, false), Mode::Off, "a log gets nothing unasked");
    }
}
