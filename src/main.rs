//! `heapscope`: the command line. Thin by design: the work happens in the library crates (core, pytorch, lab, the
//! Vulkan and wgpu backends, kernels, the GUI); this file parses arguments and dispatches to the command modules
//! beside it, which print.

#[macro_use]
mod output;

mod advise;
mod bench;
mod compare;
mod convert;
mod demo;
mod export;
mod flag_reach;
mod gui;
mod input;
mod options;
mod probe;
mod progress;
mod replay;
mod top;

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
    /// Replay a recording (PyTorch snapshot, native or CSV trace) through the contenders.
    Replay(replay::ReplayArgs),
    /// Compare every contender on a recording: a table and, on out of memory, the verdict.
    Compare(compare::CompareArgs),
    /// Which PyTorch allocator settings would have fit a recording, how much memory each needs, and what to set:
    /// every setting a replay of the recording.
    Advise(advise::AdviseArgs),
    /// Print a replay's statistics in the layout of PyTorch's `torch.cuda.memory_summary()`.
    Summary(export::SummaryArgs),
    /// What holds the memory at the peak (or an out-of-memory entry, or any entry): the live allocations grouped by
    /// the code that made them.
    Top(top::TopArgs),
    /// Write a replay as a PyTorch memory snapshot, for PyTorch's memory_viz.
    Export(export::ExportArgs),
    /// Convert a recording to heapscope's native trace format.
    Convert(convert::ConvertArgs),
    /// List the allocation policies.
    Policies,
    /// List every Vulkan adapter: heaps, memory types, budget, sparse support and measured bind latencies.
    Probe(probe::ProbeArgs),
    /// Run a workload (train, serve, churn, replay FILE) through the contenders on a device, kernels verifying
    /// every allocation: peak memory, out-of-memory verdicts, mismatches, speed.
    Bench(bench::BenchArgs),
    /// Open the animated heap in a window (the default command where a display exists).
    Gui(gui::GuiArgs),
    /// Draw the heap map of a recording at one event into a PNG, or its story playing into a GIF, without a window.
    Render(gui::RenderArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // No command: the window where a display exists, else the headless demo, which also draws the heap.
    let command = cli.command.unwrap_or_else(|| {
        if gui::display_available() {
            Command::Gui(gui::GuiArgs::default())
        } else {
            Command::Demo(demo::DemoArgs { png: Some(demo::DEFAULT_PNG.into()), png_optional: true, ..demo::DemoArgs::default() })
        }
    });
    let result = match command {
        Command::Demo(args) => demo::run(&args),
        Command::Replay(args) => replay::run(&args),
        Command::Compare(args) => compare::run(&args),
        Command::Advise(args) => advise::run(&args),
        Command::Summary(args) => export::run_summary(&args),
        Command::Top(args) => top::run(&args),
        Command::Export(args) => export::run_export(&args),
        Command::Convert(args) => convert::run(&args),
        Command::Probe(args) => probe::run(&args),
        Command::Bench(args) => bench::run_bench(&args),
        Command::Gui(args) => gui::run_gui(&args),
        Command::Render(args) => gui::run_render(&args),
        Command::Policies => {
            options::print_policies();
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            errln!("heapscope: {error:#}");
            ExitCode::FAILURE
        }
    }
}
