//! Standard output that tolerates a closed pipe: `heapscope replay ... | head` ends quietly instead of
//! panicking the way `println!` does when the reader has gone; standard error that tolerates being closed or full.

use std::fmt;
use std::io::{ErrorKind, Write};

/// `eprintln!` through [`write_err()`].
macro_rules! errln {
    ($($arg:tt)*) => { $crate::output::write_err(format_args!("{}\n", format_args!($($arg)*))) };
}

/// The legend of the `res/live` column, under every table that has one (`replay`, `compare`, `bench`, `advise`).
pub const RES_LIVE_LEGEND: &str =
    "res/live: peak reserved over peak live bytes, 1.0000 when nothing beyond the live bytes was held";

/// `value` as one JSON line, with the device it is about last (`device`: `null` for a trace, which has none): a file
/// may hold several, and the one replayed by default is the one that ran out of memory, not always device 0.
///
/// # Errors
/// `value`'s serialization errors.
pub fn json_line(value: &impl serde::Serialize, recording: &heapscope_lab::recording::Recording) -> serde_json::Result<String> {
    #[derive(serde::Serialize)]
    struct OnDevice<'a, T: serde::Serialize> {
        #[serde(flatten)]
        value: &'a T,
        device: Option<usize>,
    }
    serde_json::to_string(&OnDevice { value, device: recording.snapshot.is_some().then_some(recording.device) })
}

/// Writes `args` to standard output; exits with success when the reader closed the pipe, with failure on
/// any other write error.
pub fn write(args: fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_fmt(args) {
        if error.kind() == ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        errln!("heapscope: cannot write to standard output: {error}");
        std::process::exit(1);
    }
}

/// `println!` through [`write()`].
macro_rules! outln {
    () => { $crate::output::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::write(format_args!("{}\n", format_args!($($arg)*))) };
}

/// Writes `args` to standard error, ignoring a failed write: a closed or full standard error has nowhere to say so,
/// and is no reason to stop (`eprintln!` panics there).
pub fn write_err(args: fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// `print!` through [`write()`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write(format_args!($($arg)*)) };
}
