//! `heapscope replay`: a recording (PyTorch snapshot, native or CSV trace) through the contenders, a table
//! or one JSON object per line and contender.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use heapscope_core::units::{Bytes, parse_size};
use heapscope_core::{PolicyKind, UnmapRule};
use heapscope_lab::capacity::Capacity;
use heapscope_lab::caveats;
use heapscope_lab::compaction::CompactRule;
use heapscope_lab::compare::{CompareConfig, Outcome, alloc_conf};
use heapscope_lab::contender::Contender;
use heapscope_lab::recording::{Recording, counted, default_device, device_overview, present_devices};

use std::sync::Arc;

use heapscope_vulkan::{ContextOptions, VulkanContext, replay_on_device};

use crate::flag_reach::{Flag, Reach, refuse_flags_reaching_none};
use crate::input;
use crate::options::HeapRules;
use crate::progress::Progress;

/// `--page-size` unless given: the simulated `paged` contender's page, CUDA's granularity (`"2MiB"` in the flag's
/// attribute; a test holds the two equal).
const DEFAULT_PAGE_BYTES: u64 = heapscope_lab::cuda_cost::CUDA_PAGE_BYTES;
/// `--align` unless given: PyTorch's rounding of every request (`"512"` in the flag's attribute).
const DEFAULT_ALIGN_BYTES: u64 = 512;

/// What every command that replays a recording accepts.
#[derive(Debug, Clone, Args)]
pub struct RecordingArgs {
    /// A PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`, gzip or not), a native heapscope
    /// trace or a compact CSV trace.
    pub file: PathBuf,
    /// Device memory available to the allocator (e.g. `3584MiB`, `14GiB`); by default what the recording's `oom`
    /// entry tells (the bytes PyTorch held then plus the driver's free bytes), else unlimited.
    #[arg(long, value_name = "SIZE", value_parser = crate::options::parse_device_capacity)]
    pub capacity: Option<u64>,
    /// PyTorch allocator settings as PYTORCH_CUDA_ALLOC_CONF would set them, in place of the file's own (keys not
    /// given at PyTorch's defaults; e.g. `expandable_segments:True,max_split_size_mb:128`).
    #[arg(long, value_name = "STR")]
    pub alloc_conf: Option<String>,
    /// Page size of the `paged` contender (simulated; on a Vulkan device the sparse page size is used).
    #[arg(long, value_name = "SIZE", default_value = "2MiB", value_parser = parse_size)]
    pub page_size: u64,
    /// When the `paged` contender unmaps pages no allocation touches: `eager` (at once) or `pressure` (kept
    /// mapped for reuse until a request needs the room).
    #[arg(long, value_name = "RULE", default_value = "eager")]
    pub paged_unmap: UnmapRule,
    /// Virtual range of the `paged` contender (default: four times the capacity, at least 1 TiB; on a Vulkan device
    /// four times the trace's peak, at most what the device's sparse buffers allow). A bounded range can fragment:
    /// `--compact` then moves allocations by remapping their pages.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub virtual_size: Option<u64>,
    /// Which device of a PyTorch snapshot (default: the one that ran out of memory, else the one with the most
    /// trace entries; a file of several devices says which and why).
    #[arg(long, value_name = "N")]
    pub device: Option<usize>,
    /// Alignment of every request for the core's contenders (PyTorch rounds to 512 B).
    #[arg(long, value_name = "SIZE", default_value = "512", value_parser = crate::options::parse_power_of_two)]
    pub align: u64,
    #[command(flatten)]
    pub heap: HeapRules,
    /// When the heap contenders move allocations to gather free space: `never`, `on-oom` (a request refused for
    /// fragmentation makes them compact, then it is tried once more) or `every:N` (a balanced pass before events N, 2N,
    /// ... counted from 0, and on a refusal as `on-oom`). The heaps copy the moved bytes (on a Vulkan device, with the
    /// GPU); `paged` remaps the moved allocations' pages, copying nothing; `pytorch`, and the policies that keep no free
    /// runs by address (buddy, slab, linear), never move anything (the title says so).
    #[arg(long, value_name = "RULE", default_value = "never")]
    pub compact: CompactRule,
}

impl RecordingArgs {
    /// Opens the recording; a `--budget` not below the device capacity of its replay is refused, as a flag that would
    /// change nothing (the capacity already bounds every contender).
    pub fn open(&self) -> Result<Recording> {
        let recording = input::open_device(&self.file, self.device)?;
        let capacity = self.capacity(&recording);
        if let (Some(budget), Some(capacity_bytes)) = (self.heap.budget, capacity.bytes)
            && budget >= capacity_bytes
        {
            anyhow::bail!(
                "--budget {}: not below the device's {capacity}, which bounds every contender already: it would change \
                 nothing (a budget is what a contender may reserve of the device)",
                Bytes(budget)
            );
        }
        Ok(recording)
    }

    /// The device memory of the replay of `recording`: `--capacity`, else what the recording tells, else unlimited.
    pub fn capacity(&self, recording: &Recording) -> Capacity {
        Capacity::of(self.capacity, recording)
    }

    /// The settings shared by the contenders, on the capacity of [`RecordingArgs::capacity`].
    pub fn compare_config(&self, recording: &Recording) -> CompareConfig {
        CompareConfig {
            capacity_bytes: self.capacity(recording).bytes,
            page_bytes: self.page_size,
            paged_unmap: self.paged_unmap,
            paged_virtual_bytes: self.virtual_size,
            align_bytes: self.align,
            heap: self.heap.heap_config(PolicyKind::Tlsf),
            alloc_conf: self.alloc_conf.clone(),
            pytorch_settings: None,
            compact: self.compact,
        }
    }

    /// Checks the flags that matter to `contenders` before anything runs (`on_device`: `paged` runs on a Vulkan
    /// device, in its own sparse pages, not `--page-size`'s).
    pub fn check(&self, contenders: &[Contender], on_device: bool) -> Result<()> {
        let paged = contenders.contains(&Contender::Paged);
        refuse_flags_reaching_none(&self.flags(), contenders, "this run replays")?;
        if on_device && self.page_size != DEFAULT_PAGE_BYTES {
            anyhow::bail!(
                "--page-size sets the pages of the simulated `paged` contender; with --vulkan `paged` binds the device's \
                 own sparse pages (their size is the device's), so it would change nothing: leave it out, or drop --vulkan"
            );
        }
        // Exact sizes: a size a byte off a power of two or a page reads in units as one that is.
        let exact = heapscope_core::units::exact_size;
        if paged && !self.page_size.is_power_of_two() {
            anyhow::bail!("--page-size {} is not a power of two", exact(self.page_size));
        }
        if let Some(virtual_bytes) = self.virtual_size.filter(|&bytes| bytes < self.page_size) {
            anyhow::bail!("--virtual-size {}: smaller than one page ({})", Bytes(virtual_bytes), Bytes(self.page_size));
        }
        // A range that ends inside a page had its last page mapped past its end.
        if let Some(virtual_bytes) =
            self.virtual_size.filter(|&bytes| paged && !on_device && !bytes.is_multiple_of(self.page_size))
        {
            anyhow::bail!(
                "--virtual-size {}: not a whole number of pages ({} each)",
                exact(virtual_bytes),
                exact(self.page_size)
            );
        }
        Ok(())
    }
}

impl RecordingArgs {
    /// The flags as given (away from their defaults), each with what it changes: the heap's rules change the core
    /// policies' heaps, `paged`'s flags `paged`, `--budget`, `--align` and `--compact` every contender but PyTorch's
    /// emulation (which keeps its own rules; its limit is `per_process_memory_fraction`), `--alloc-conf` PyTorch's
    /// emulation alone.
    fn flags(&self) -> [Flag; 12] {
        let defaults = HeapRules::default();
        let rules = &self.heap;
        [
            (rules.block_size != defaults.block_size, "--block-size", Reach::Heaps),
            (rules.dedicated_threshold != defaults.dedicated_threshold, "--dedicated-threshold", Reach::Heaps),
            (rules.release.is_some(), "--release", Reach::Heaps),
            (rules.fixed_blocks, "--fixed-blocks", Reach::Heaps),
            (rules.min_align != defaults.min_align, "--min-align", Reach::Heaps),
            (self.page_size != DEFAULT_PAGE_BYTES, "--page-size", Reach::Paged),
            (self.paged_unmap != UnmapRule::default(), "--paged-unmap", Reach::Paged),
            (self.virtual_size.is_some(), "--virtual-size", Reach::Paged),
            (rules.budget.is_some(), "--budget", Reach::NotPytorch),
            (self.align != DEFAULT_ALIGN_BYTES, "--align", Reach::NotPytorch),
            (self.compact != CompactRule::Never, "--compact", Reach::NotPytorch),
            (self.alloc_conf.is_some(), "--alloc-conf", Reach::Pytorch),
        ]
    }
}

/// Where the contenders run: simulated devices, or (`--vulkan`) `pytorch`, heaps, `paged`, gpu-allocator and VMA
/// on a Vulkan device.
pub struct Runner {
    context: Option<Arc<VulkanContext>>,
    progress: Progress,
}

impl Runner {
    /// Brings up the Vulkan device (`HEAPSCOPE_DEVICE`, `HEAPSCOPE_VALIDATION`) when `vulkan` is set; `progress`
    /// (`--progress`) and `contenders` for the progress of the contenders on it ([`Progress`]).
    pub fn new(vulkan: bool, progress: bool, contenders: usize) -> Result<Self> {
        let context = if vulkan {
            Some(Arc::new(VulkanContext::new(&ContextOptions::from_env()).context("--vulkan: bringing up the Vulkan device")?))
        } else {
            None
        };
        Ok(Self { context, progress: Progress::new(vulkan, progress, contenders) })
    }

    /// Whether the contenders run on a Vulkan device.
    pub fn on_device(&self) -> bool {
        self.context.is_some()
    }

    /// With validation on (`HEAPSCOPE_VALIDATION=1`), what the validation layer said of the replays on the device:
    /// its count on a table's last line (not in JSON), and any message fails the command, listed, as `bench` does.
    ///
    /// # Errors
    /// The layer's messages.
    pub fn check_validation(&self, json: bool) -> Result<()> {
        let Some(context) = self.context.as_ref().filter(|context| context.validation_enabled()) else { return Ok(()) };
        let messages = context.validation_messages();
        if !json {
            outln!("validation: {} message(s)", messages.len());
        }
        if !messages.is_empty() {
            anyhow::bail!("the validation layer reported {} message(s):\n{}", messages.len(), messages.join("\n"));
        }
        Ok(())
    }

    /// Replays `recording` through `contender`: on the device when there is one, else simulated. A contender the
    /// device cannot run (a limit it exceeds, a feature it lacks), or a device-only one without a device, is an
    /// outcome that says why ([`Outcome::NotRun`](heapscope_lab::outcome::Outcome::NotRun)), so the others still run.
    pub fn outcome(&self, args: &RecordingArgs, recording: &Recording, contender: Contender) -> Result<Outcome> {
        let config = args.compare_config(recording);
        let Some(context) = &self.context else {
            return Ok(heapscope_lab::compare::replay(recording, contender, &config)?);
        };
        // What `compare::replay` says of a start larger than the capacity, on the device too.
        if let Contender::Pytorch { expandable } = contender
            && let Some(why) = heapscope_lab::compare::start_exceeds(
                recording,
                &config.pytorch_conf(recording, expandable)?,
                config.capacity_bytes,
            )
        {
            return Ok(Outcome::not_run(format!("{} (vulkan)", config.pytorch_name(recording, expandable)), why));
        }
        let name = contender.to_string();
        self.progress.around(&name, recording.trace.events().len(), || {
            match replay_on_device(context, recording, contender, &config) {
                Ok(figures) => Ok(Outcome::Ran(figures)),
                Err(error) if error.is_device_limit() => {
                    Ok(Outcome::not_run(format!("{contender} (vulkan)"), format!("not run on this device: {error}")))
                }
                Err(error) => Err(error.into()),
            }
        })
    }
}

/// Arguments of `heapscope replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub recording: RecordingArgs,
    #[command(flatten)]
    pub contenders: ContenderArgs,
    /// Print one JSON object per line and contender instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Which contenders run, and where (shared by `replay` and `compare`).
#[derive(Debug, Args)]
pub struct ContenderArgs {
    /// Contenders to run (repeat the flag): pytorch, tlsf, best-fit, first-fit, buddy, paged (the
    /// default set), pytorch-expandable, any other policy of `heapscope policies`, or gpu-allocator and vma
    /// (with --vulkan).
    #[arg(long = "policy", value_name = "NAME")]
    pub policies: Vec<Contender>,
    /// Run the contenders on a Vulkan device (`HEAPSCOPE_DEVICE` chooses it): `pytorch` on device memory, the
    /// heap contenders in device blocks, `paged` on a sparse buffer, with gpu-allocator and vma added to the
    /// default set. A contender the device cannot run (a limit it exceeds) is reported as not run, with why.
    #[arg(long)]
    pub vulkan: bool,
    /// With --vulkan and stderr no terminal (a log): a line on stderr as each contender starts on the device and
    /// when it is done (or failed). On a terminal a spinner shows the same without the flag. Standard output is
    /// unchanged. A simulated replay is quick and has none: refused without --vulkan.
    #[arg(long, requires = "vulkan")]
    pub progress: bool,
}

impl ContenderArgs {
    /// The named contenders, or the default set (with gpu-allocator and vma when on a Vulkan device).
    pub fn list(&self) -> Vec<Contender> {
        if !self.policies.is_empty() {
            return self.policies.clone();
        }
        let mut all = Contender::DEFAULT.to_vec();
        if self.vulkan {
            all.extend(Contender::DEVICE_ONLY);
        }
        all
    }

    /// Checks the flags, opens the recording, brings up the device if asked: what a replay needs, in that order
    /// (bad flags fail before any file is read).
    pub fn prepare(&self, recording_args: &RecordingArgs) -> Result<(Vec<Contender>, Recording, Runner)> {
        let contenders = self.list();
        recording_args.check(&contenders, self.vulkan)?;
        if !self.vulkan
            && let Some(device_only) = contenders.iter().find(|contender| contender.needs_device())
        {
            anyhow::bail!("{device_only} runs on a Vulkan device: add --vulkan");
        }
        let recording = recording_args.open()?;
        let runner = Runner::new(self.vulkan, self.progress, contenders.len())?;
        Ok((contenders, recording, runner))
    }

    /// `outcome` as the command shows it: when the user named one contender only and the device cannot run it,
    /// the reason is the command's error, naming the recording; otherwise a contender that did not run is a row that
    /// says why.
    pub fn checked(&self, recording: &Recording, outcome: Outcome) -> Result<Outcome> {
        let mut named = self.policies.clone();
        named.dedup();
        if let Some(reason) = outcome.why_not_run()
            && named.len() == 1
        {
            anyhow::bail!("{}: {reason}", recording.shown_name());
        }
        Ok(outcome)
    }
}

/// The lines that name what is replayed and on how much memory: the entries, what was live at the start (the
/// same for every contender), and what no contender, or one that ignores the recording's streams, tells apart.
pub fn print_title(recording: &Recording, args: &RecordingArgs, contenders: &[Contender]) {
    let asked = CompareConfig { capacity_bytes: args.capacity, ..args.compare_config(recording) };
    for line in devices_overview(recording, args.device, &asked) {
        outln!("{line}");
    }
    outln!("{}: {} entries, device capacity {}", recording.shown_name(), recording.entries, args.capacity(recording));
    if contenders.iter().any(|contender| matches!(contender, Contender::Pytorch { .. })) {
        outln!("{}", settings_line(recording, args));
        if let Some(budget) = args.heap.budget {
            outln!(
                "--budget {}: bounds every contender but PyTorch's emulation, which runs on the device capacity (its own \
                 limit: per_process_memory_fraction in --alloc-conf)",
                Bytes(budget)
            );
        }
    }
    if recording.start_events > 0 {
        let (were, them) = if recording.start_events == 1 { ("was", "it") } else { ("were", "them") };
        outln!(
            "recorded mid-run: {} ({}) {were} live before entry 0; every contender holds {them} from the start",
            counted(recording.start_events as u64, "allocation", "allocations"),
            Bytes(recording.start_bytes())
        );
    }
    for line in caveats::all(recording, contenders, &args.compare_config(recording)) {
        outln!("{line}");
    }
    if recording.unknown_frees > 0 {
        outln!(
            "{} frees of allocations the recording never shows (neither live at the start nor allocated since) were skipped",
            recording.unknown_frees
        );
    }
}

/// The settings PyTorch's contender runs with: the recording's, or `--alloc-conf` in their place (a what-if).
pub(crate) fn settings_line(recording: &Recording, args: &RecordingArgs) -> String {
    let shown = |conf: &heapscope_pytorch::AllocConf| {
        let text = conf.overrides();
        if text.is_empty() { "PyTorch's defaults".to_owned() } else { text }
    };
    let Ok(recorded) = alloc_conf(recording, None) else { return "pytorch's settings: as recorded".to_owned() };
    // A what-if as the replay judges it (`PytorchReplay::what_if`): settings unlike the recorded ones.
    match (&args.alloc_conf, alloc_conf(recording, args.alloc_conf.as_deref())) {
        (Some(overrides), Ok(conf)) if conf != recorded => format!(
            "pytorch's settings: {} (--alloc-conf {overrides}, in place of the recording's {}): a what-if, whose decisions \
             are not the recorded ones (no fidelity)",
            shown(&conf),
            shown(&recorded)
        ),
        _ => format!("pytorch's settings: {}", recorded_settings_words(recording, &shown(&recorded))),
    }
}

/// The recording's own settings, `shown`, with where they come from: recorded, assumed where the file records none,
/// or shown by its expandable segments.
pub fn recorded_settings_words(recording: &Recording, shown: &str) -> String {
    if let Some(why) = inferred_expandable(recording) {
        return format!("{shown}, as the recording's expandable segments show ({why})");
    }
    match &recording.snapshot {
        None => format!("{shown}, assumed (a trace records no settings)"),
        Some(snapshot) if snapshot.settings.is_none() => format!("{shown}, assumed (the file records none)"),
        Some(_) => format!("{shown}, as recorded"),
    }
}

/// Why the replay runs `recording` with expandable segments that its file shows but does not record as a setting
/// ([`heapscope_pytorch::AllocConf::expandable_from_file`]); `None` otherwise.
fn inferred_expandable(recording: &Recording) -> Option<&'static str> {
    let snapshot = recording.snapshot.as_ref()?;
    heapscope_pytorch::AllocConf::expandable_from_file(snapshot).then_some("the file records no allocator settings")
}

/// Entries of another device up to which the overview runs the emulation on it under `--capacity` (about a second).
const EMULATE_OTHERS_UP_TO_ENTRIES: u64 = 200_000;

/// The overview of a file of several devices (issue 14): every device that records something — its entries,
/// peak reserved bytes and out-of-memory entries, the one shown marked `*` — which is shown and why (`asked`: the
/// `--device` given), and any other device that ran out of memory. With a capacity asked for (`config`'s, set by
/// the callers from `--capacity` only: a capacity inferred from one device's oom entry says nothing of another's),
/// each other device of up to [`EMULATE_OTHERS_UP_TO_ENTRIES`] entries also runs through PyTorch's emulation on it,
/// and its OOMs there are said. Nothing for a file of one device.
pub fn devices_overview(recording: &Recording, asked: Option<usize>, config: &CompareConfig) -> Vec<String> {
    let Some(snapshot) = &recording.snapshot else { return Vec::new() };
    // Counted first: the overview walks every device's entries.
    if present_devices(snapshot).len() < 2 {
        return Vec::new();
    }
    let overview = device_overview(snapshot);
    let shown = recording.device;
    let why = match asked {
        Some(device) => format!("--device {device}"),
        None => format!("{}; --device N shows another", default_device(snapshot).why),
    };
    let mut lines = vec![format!("{} records {} devices; showing device {shown} ({why}):", recording.name, overview.len())];
    // PyTorch's emulation of another device on the capacity given, where that is cheap.
    let emulated = |device: &heapscope_lab::recording::DeviceOverview| {
        let capacity = config.capacity_bytes?;
        // A state with no trace has nothing to emulate: its start is as recorded.
        if device.device == shown || device.entries == 0 || device.entries > EMULATE_OTHERS_UP_TO_ENTRIES {
            return None;
        }
        let other = Recording::from_snapshot(&recording.name, snapshot.clone(), device.device).ok()?;
        let outcome = heapscope_lab::compare::replay(&other, Contender::Pytorch { expandable: false }, config).ok()?;
        Some((
            Bytes(capacity),
            outcome.figures().map(|figures| figures.ooms).ok_or_else(|| outcome.why_not_run().map(str::to_owned)),
        ))
    };
    let mut ran_out = Vec::new();
    for device in &overview {
        let mark = if device.device == shown { "*" } else { " " };
        let mut line = format!("{mark} {}", device.line());
        match emulated(device) {
            Some((capacity, Ok(ooms))) => {
                line.push_str(&format!("; emulated on {capacity}: {}", counted(ooms, "OOM", "OOMs")));
                if ooms > 0 && device.ooms == 0 {
                    ran_out.push(format!(
                        "device {0} would run out of memory on {capacity} (PyTorch's emulation): --device {0} replays it",
                        device.device
                    ));
                }
            }
            // It cannot run there at all (a recording begun mid-run with more reserved than the capacity): said, as
            // `--device` would say it.
            Some((capacity, Err(why))) => {
                line.push_str(&format!("; not emulated on {capacity}"));
                ran_out.push(format!(
                    "device {0} cannot run on {capacity}: {1}; --device {0} replays it",
                    device.device,
                    why.as_deref().unwrap_or("PyTorch's emulation did not run it")
                ));
            }
            None => {}
        }
        lines.push(line);
    }
    for other in overview.iter().filter(|device| device.device != shown && device.ooms > 0) {
        lines.push(format!(
            "device {} ran out of memory in the recording ({}): --device {} replays it",
            other.device,
            counted(other.ooms, "oom entry", "oom entries"),
            other.device
        ));
    }
    lines.extend(ran_out);
    lines
}

/// Runs the replay.
pub fn run(args: &ReplayArgs) -> Result<()> {
    let (contenders, recording, runner) = args.contenders.prepare(&args.recording)?;
    let mut shown = Vec::new();
    for (index, contender) in contenders.into_iter().enumerate() {
        let outcome = runner
            .outcome(&args.recording, &recording, contender)
            .and_then(|outcome| args.contenders.checked(&recording, outcome))
            .with_context(|| format!("replaying through {contender}"))?;
        if args.json {
            outln!("{}", crate::output::json_line(&outcome, &recording)?);
        } else {
            // The title once the first contender ran: a lone contender the device cannot run prints nothing.
            if index == 0 {
                print_title(&recording, &args.recording, &args.contenders.list());
                print_header();
            }
            print_row(&outcome);
            shown.push(outcome);
        }
    }
    if !args.json {
        print_legend(&shown);
    }
    runner.check_validation(args.json)
}

/// The table header of [`print_row`].
pub fn print_header() {
    outln!(
        "{:<36} {:>8} {:>20} {:>14} {:>8} {:>9} {:>5} {:>10}  fidelity",
        "policy",
        "allocs",
        "peak live @ entry",
        "peak reserved",
        "res/live",
        "dev alloc",
        "OOMs",
        "ns/event"
    );
}

/// What the table's short column names mean, printed once under it; the fidelity's too when a row has one.
pub fn print_legend(outcomes: &[Outcome]) {
    let fidelity = if outcomes.iter().any(|outcome| outcome.figures().is_some_and(|figures| figures.fidelity.is_some())) {
        "; fidelity: of the recording's segment events and placements, those PyTorch's emulation reproduced, and of its \
         cudaMalloc bases, those the driver's rule foretold"
    } else {
        ""
    };
    outln!(
        "(allocs: allocations served, those live at the start included (PyTorch's emulation counts as PyTorch does: not a \
         block whose free was requested before the start); peak live: the most bytes requested and \
         live at once, PyTorch's requested_bytes (its max_memory_allocated counts whole blocks); {}; dev alloc: device allocations made, blocks, segments or map calls; ns/event: this machine's \
         time per recorded entry{fidelity})",
        crate::output::RES_LIVE_LEGEND
    );
}

/// One contender's row (what stopped it, for a contender that did not run).
pub fn print_row(outcome: &Outcome) {
    let outcome = match outcome {
        Outcome::Ran(figures) => figures,
        Outcome::NotRun { name, why } => {
            outln!("{name:<36} {why}");
            return;
        }
    };
    let fidelity = match &outcome.fidelity {
        _ if outcome.what_if => "what-if (settings differ from the recording's)".to_owned(),
        Some(fidelity) => {
            let mut text = format!(
                "segments {}/{}, placements {}/{}",
                fidelity.matched, fidelity.recorded, fidelity.placement_matched, fidelity.allocs
            );
            let rule = fidelity.driver_rule;
            if rule.placed > 0 {
                text.push_str(&format!(", driver's rule {}/{}", rule.foretold, rule.placed));
            }
            if fidelity.start_left_out > 0 {
                text.push_str(&format!(
                    ", {} live at the start in no segment the recording shows: left out",
                    counted(fidelity.start_left_out as u64, "allocation", "allocations")
                ));
            }
            text
        }
        None => String::new(),
    };
    let peak_live = match outcome.peak_live_moment {
        Some(heapscope_lab::recording::Moment::Entry(entry)) => format!("{} @ {entry}", Bytes(outcome.peak_live_bytes)),
        Some(heapscope_lab::recording::Moment::Start) => format!("{} @ start", Bytes(outcome.peak_live_bytes)),
        None => Bytes(outcome.peak_live_bytes).to_string(),
    };
    outln!(
        "{:<36} {:>8} {:>20} {:>14} {:>8.4} {:>9} {:>5} {:>10.1}  {fidelity}",
        outcome.policy,
        outcome.allocs,
        peak_live,
        Bytes(outcome.peak_reserved_bytes).to_string(),
        outcome.reserved_over_live(),
        outcome.device_allocs,
        outcome.ooms,
        outcome.ns_per_event,
    );
    if let Some(oom) = &outcome.first_oom {
        outln!("{:<36} first OOM at {}: {}", "", oom.moment, oom.message);
    }
    if let Some(compaction) = &outcome.compaction {
        outln!("{:<36} {compaction}", "");
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::flag_reach::flag_reaching_none;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        recording: RecordingArgs,
    }

    /// The defaults the flags' attributes write as text are the ones `flag_reaching_none` compares against: a flag
    /// left out is never taken for one given.
    #[test]
    fn the_flags_defaults_are_the_named_ones() {
        let args = Flags::try_parse_from(["replay", "file.pickle"]).unwrap().recording;
        let defaults = HeapRules::default();
        let rules = &args.heap;
        assert_eq!((args.page_size, args.align), (DEFAULT_PAGE_BYTES, DEFAULT_ALIGN_BYTES));
        assert_eq!(
            (rules.block_size, rules.dedicated_threshold, rules.min_align, rules.release, rules.fixed_blocks, rules.budget),
            (defaults.block_size, defaults.dedicated_threshold, defaults.min_align, None, false, None)
        );
        assert_eq!(
            (args.paged_unmap, args.compact, args.virtual_size, args.alloc_conf.as_deref()),
            (UnmapRule::default(), CompactRule::Never, None, None)
        );
        let every_contender = [Contender::DEFAULT.as_slice(), Contender::DEVICE_ONLY.as_slice()].concat();
        assert_eq!(flag_reaching_none(&args.flags(), &every_contender), None);
        assert_eq!(flag_reaching_none(&args.flags(), &[Contender::Heap(PolicyKind::Tlsf)]), None);
    }
}
