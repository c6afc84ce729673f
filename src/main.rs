//! `heapscope`: the command line. Thin by design: the work happens in `heapscope-core` (and, in later
//! issues, the backend and GUI crates); this file parses arguments and prints.

mod demo;
mod options;
mod replay;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Cross-vendor GPU memory allocator and testbench: allocation policies, trace replay and
/// out-of-memory verdicts.
#[derive(Debug, Parser)]
#[command(name = "heapscope", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a built-in story through every policy and say who survives (the default command).
    Demo(demo::DemoArgs),
    /// Replay a heapscope trace (compact CSV) through policies.
    Replay(replay::ReplayArgs),
    /// List the allocation policies.
    Policies,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Demo(demo::DemoArgs::default())) {
        Command::Demo(args) => demo::run(&args),
        Command::Replay(args) => replay::run(&args),
        Command::Policies => {
            options::print_policies();
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("heapscope: {error:#}");
            ExitCode::FAILURE
        }
    }
}
