//! `heapscope advise`: from one recording, which settings of PyTorch's caching allocator would have fit, how much
//! memory each needs, and the setting to paste — every row a replay of the same recording (the lab's `advise`).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use heapscope_core::units::{Bytes, BytesAtLeast, ReservedOverLive};
use heapscope_lab::advise::{Advice, AdviseConfig, PAGED, SettingAdvice, advise, grid};
use heapscope_lab::capacity::{Capacity, CapacityFrom};
use heapscope_lab::caveats;
use heapscope_lab::compare::CompareConfig;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::input;
use crate::replay::devices_overview;

/// Arguments of `heapscope advise`.
#[derive(Debug, Args)]
pub struct AdviseArgs {
    /// A PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`, gzip or not), a native heapscope trace or a
    /// compact CSV trace.
    pub file: PathBuf,
    /// The device's memory (e.g. `80GB`, `3584MiB`); default: what the recording's `oom` entry tells (reserved then
    /// plus the driver's free bytes), else unknown (settings ranked by the memory they need).
    #[arg(long, value_name = "SIZE", value_parser = crate::options::parse_device_capacity)]
    pub capacity: Option<u64>,
    /// Which device of a PyTorch snapshot (default: the one that ran out of memory, else the busiest).
    #[arg(long, value_name = "N")]
    pub device: Option<usize>,
    /// Try these PYTORCH_CUDA_ALLOC_CONF settings (repeatable) instead of the grid.
    #[arg(long = "setting", value_name = "STR")]
    pub settings: Vec<String>,
    /// One JSON object per setting and line, best first.
    #[arg(long)]
    pub json: bool,
    /// With stderr no terminal (a log), a line on stderr as each setting is replayed (a terminal gets a bar anyway).
    #[arg(long)]
    pub progress: bool,
}

/// Runs the advice and prints it.
pub fn run(args: &AdviseArgs) -> Result<()> {
    let recording = input::open_device(&args.file, args.device)?;
    let settings = if args.settings.is_empty() { grid() } else { args.settings.clone() };
    let config = AdviseConfig { capacity_bytes: args.capacity, settings, ..AdviseConfig::default() };
    let terminal = std::io::stderr().is_terminal();
    let bar = progress_bar(terminal);
    let started = Instant::now();
    let advice = advise(&recording, &config, &|done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        if args.progress && !terminal {
            errln!("progress: {done} of {total} settings replayed, {:.1} s", started.elapsed().as_secs_f64());
        }
    })
    .with_context(|| format!("advising {}", recording.shown_name()))?;
    bar.finish_and_clear();
    if args.json {
        for row in &advice.settings {
            outln!("{}", crate::output::json_line(row, &recording)?);
        }
        return Ok(());
    }
    let overview_config = CompareConfig { capacity_bytes: args.capacity, ..CompareConfig::default() };
    for line in devices_overview(&recording, args.device, &overview_config) {
        outln!("{line}");
    }
    outln!("{}: {} entries", recording.shown_name(), recording.entries);
    outln!("{}", capacity_line(&advice));
    let recorded =
        if advice.recorded_setting.is_empty() { "PyTorch's defaults".to_owned() } else { advice.recorded_setting.clone() };
    outln!("recorded settings: {}", crate::replay::recorded_settings_words(&recording, &recorded));
    for note in caveats::of_recording(&recording) {
        outln!("{note}");
    }
    if advice.start_live_bytes > 0 {
        outln!(
            "recorded mid-run: {} were live before entry 0; every setting replays from the start state rebuilt from the final segments",
            Bytes(advice.start_live_bytes)
        );
    }
    outln!();
    let names: Vec<String> = advice.settings.iter().map(shown_setting).collect();
    let width = names.iter().map(String::len).max().unwrap_or(0).max(24) + 1;
    outln!(
        "{:>4}  {:<width$} {:>13} {:>8} {:>9} {:>9} {:>11} {:>5} {:>12} {:>7}",
        "rank",
        "setting (* as recorded)",
        "peak reserved",
        "res/live",
        "dev alloc",
        "dev free",
        "driver time",
        "OOMs",
        "needs",
        "retries"
    );
    for (row, name) in advice.settings.iter().zip(&names) {
        outln!("{}", table_row(row, name, width));
    }
    outln!(
        "({}; dev alloc / dev free: cudaMalloc and cudaFree calls, or maps and unmaps with expandable segments; driver \
         time: what those calls would cost, from costs measured on an H200; needs: the least capacity at which that \
         setting serves every request, found on a grid of 2 MiB or 1/1024 of its peak reserved and checked at larger \
         ones (a grid step above, half-way to the peak, the device, the need as shown); retries: at that capacity, how often PyTorch frees its cache and retries a failed \
         cudaMalloc, each waiting for the device)",
        crate::output::RES_LIVE_LEGEND
    );
    // Why rows are marked `start`: the recording's start, or (`~` rows) that start allocated afresh; each reason once.
    let mut reasons: Vec<String> = Vec::new();
    for row in advice.settings.iter().filter(|row| row.start_exceeds_capacity) {
        let mut conf = heapscope_pytorch::AllocConf::default();
        if conf.parse_overrides(&row.setting).is_ok()
            && let Some(why) = heapscope_lab::compare::start_exceeds(&recording, &conf, advice.capacity_bytes)
            && !reasons.contains(&why)
        {
            outln!("(start) {why}; no setting so marked fits it");
            reasons.push(why);
        }
    }
    if advice.settings.iter().any(|row| !row.monotone) {
        outln!("(!) not monotone: more memory made that setting fail again at the capacity shown");
    }
    if advice.settings.iter().any(|row| row.start_afresh) {
        outln!(
            "(~) the other kind of memory than the recording's: what was live at its start is allocated afresh, without the \
             fragmentation built before it, so its figures can be too low; ranked after the recording's kind"
        );
    }
    if advice.settings.iter().any(|row| row.same_run_as.is_some()) {
        outln!(
            "(=) the same run as a row above it (`same_run_as` in --json): the same settings in effect on this recording (a \
             max_split_size_mb none of its blocks reaches, one division that rounds nothing, a list that sets the same \
             intervals)"
        );
    }
    for note in
        advice.recorded().map(|row| caveats::emulation(&recording, &row.figures, advice.capacity_bytes)).unwrap_or_default()
    {
        outln!("\n{note}");
    }
    outln!("\n{}", advice.answer());
    Ok(())
}

/// Where the capacity comes from, in words.
fn capacity_line(advice: &Advice) -> String {
    match (advice.capacity_bytes, advice.capacity_from) {
        (None, _) | (_, CapacityFrom::Unknown) => {
            "device capacity unknown (no --capacity, no oom entry): settings ranked by the memory they need".to_owned()
        }
        (bytes, from) => format!("device capacity {}", Capacity { bytes, from }),
    }
}

/// A setting as the table names it, marked `*` when it is the recording's own.
fn shown_setting(row: &SettingAdvice) -> String {
    let name = match row.setting.as_str() {
        "" => "(PyTorch's defaults)",
        PAGED => "paged (2 MiB pages, unmapped under pressure: for reference)",
        setting => setting,
    };
    let same = if row.same_run_as.is_some() { " (=)" } else { "" };
    let afresh = if row.start_afresh { " (~)" } else { "" };
    format!("{}{name}{same}{afresh}", if row.as_recorded { "*" } else { " " })
}

/// One setting's line of the table, its name `width` wide.
fn table_row(row: &SettingAdvice, name: &str, width: usize) -> String {
    let rank = if row.rank == 0 { "-".to_owned() } else { row.rank.to_string() };
    let needs = match (row.min_capacity_bytes, row.monotone) {
        (Some(bytes), true) => BytesAtLeast(bytes).to_string(),
        (Some(bytes), false) => format!("{} (!)", BytesAtLeast(bytes)),
        (None, _) => "no device".to_owned(),
    };
    let ratio = ReservedOverLive::new(row.peak_reserved_bytes, row.peak_live_bytes);
    let driver = Duration::from_secs_f64(row.driver_time_us / 1e6);
    let ooms = if row.start_exceeds_capacity { "start".to_owned() } else { row.ooms.to_string() };
    let retries = row.retries_at_need.map_or_else(|| "-".to_owned(), |retries| retries.to_string());
    format!(
        "{rank:>4}  {name:<width$} {:>13} {ratio:>8.3} {:>9} {:>9} {:>9.1}ms {ooms:>5} {needs:>12} {retries:>7}",
        Bytes(row.peak_reserved_bytes).to_string(),
        row.device_allocs,
        row.device_frees,
        driver.as_secs_f64() * 1e3,
    )
}

/// A bar on stderr while the settings replay, when stderr is a `terminal` (hidden otherwise).
fn progress_bar(terminal: bool) -> ProgressBar {
    if !terminal {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} settings replayed {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
