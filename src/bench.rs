//! `heapscope bench`: a workload that behaves like a GPU program (training, LLM serving, churn, or a recording)
//! through each contender, on a Vulkan device or through wgpu (every allocation filled, computed on and verified
//! by the kernels) or simulated; per contender, peak live and reserved bytes, out-of-memory verdicts under the
//! budget, kernel mismatches, allocations per second and wall time, as a table or one JSON object per line.
//!
//! `--backend wgpu` opens the adapter `HEAPSCOPE_DEVICE` selects among wgpu's. When it is a Vulkan adapter, wgpu
//! runs on heapscope's own Vulkan device for it (`WgpuDevice::from_vulkan_adapter`): the same kernels and arenas,
//! and sparse binding reaches wgpu, so `paged` and `pytorch-expandable` run too. Otherwise (Metal, DX12, the
//! interop failing, or `--plain-wgpu`) plain wgpu runs every other contender and reports those two as not run,
//! saying why.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use heapscope_core::units::{Bytes, parse_size};
use heapscope_core::{OomCause, PagedConfig, PolicyKind};
use heapscope_kernels::bench::{BenchSettings, RunReport, Target, run, run_simulated};
use heapscope_kernels::workload::{
    ChurnConfig, KvLayout, ServeConfig, StreamStats, TrainConfig, Workload, churn, replay, serve, train,
};
use heapscope_kernels::{VulkanKernelError, VulkanTarget, WgpuKernelError, WgpuTarget};
use heapscope_lab::compaction::CompactRule;
use heapscope_lab::compare::FirstOom;
use heapscope_lab::contender::{Contender, LargestAllocation};
use heapscope_pytorch::AllocConf;
use heapscope_vulkan::{ContextOptions, VulkanContext, VulkanError};
use heapscope_wgpu::{DeviceOptions, WgpuDevice, WgpuError};

use crate::options::HeapRules;

/// A workload of `heapscope bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkloadName {
    /// Transformer training steps: activations, backward frees in reverse, gradients, optimizer state.
    Train,
    /// LLM serving: requests arrive and finish, a KV cache grows per token.
    Serve,
    /// Random sizes and lifetimes.
    Churn,
    /// A recording (PyTorch snapshot, native or CSV trace): FILE.
    Replay,
}

/// Where the contenders run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendName {
    /// A Vulkan device (`HEAPSCOPE_DEVICE` chooses it): real memory, kernels run.
    Vulkan,
    /// wgpu on the adapter `HEAPSCOPE_DEVICE` chooses among wgpu's (on heapscope's own Vulkan device when it is a
    /// Vulkan adapter): arenas, buffers per segment, kernels run.
    Wgpu,
    /// No device: the same stream through the simulated heaps, kernels skipped.
    Sim,
}

/// Arguments of `heapscope bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The workload.
    #[arg(long, value_name = "NAME")]
    pub workload: WorkloadName,
    /// The recording for `--workload replay`.
    pub file: Option<PathBuf>,
    /// Contenders (repeat the flag): pytorch, pytorch-expandable, tlsf, best-fit, first-fit, buddy, paged (the
    /// default set), or any policy of `heapscope policies`.
    #[arg(long = "policy", value_name = "NAME")]
    pub policies: Vec<Contender>,
    /// vulkan, wgpu or sim; default: vulkan where a device exists, else sim.
    #[arg(long, value_name = "BACKEND")]
    pub backend: Option<BackendName>,
    /// When the heap policies compact: never (the default), on-oom (a request refused for fragmentation makes the
    /// heap move allocations, the device copying them, then it is tried once more) or every:N (a balanced pass
    /// before every N-th allocation or free, and on a refusal as on-oom); the kernels verify each moved allocation at its
    /// new place after the move, and again at its free.
    #[arg(long, value_name = "RULE", default_value = "never")]
    pub compact: CompactRule,
    /// --backend wgpu: plain wgpu even on a Vulkan adapter (not heapscope's Vulkan device; paged and
    /// pytorch-expandable then do not run).
    #[arg(long)]
    pub plain_wgpu: bool,
    /// Steps of the workload (training steps, engine steps, allocations; for replay, events).
    #[arg(long, value_name = "N")]
    pub steps: Option<u32>,
    /// The seed of the generated workloads: train, serve and churn (default 1).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// train: sequences per batch (8 by default).
    #[arg(long, value_name = "N")]
    pub batch: Option<u32>,
    /// train: gradient checkpointing (keep each layer's input, recompute the rest in backward).
    #[arg(long)]
    pub checkpointing: bool,
    /// serve: the KV cache layout, contiguous or paged (vLLM's blocks of 16 tokens; the default).
    #[arg(long, value_name = "LAYOUT")]
    pub kv: Option<KvLayout>,
    /// Page size of `paged`.
    #[arg(long, value_name = "SIZE", default_value = "64KiB", value_parser = parse_size)]
    pub page_size: u64,
    /// Virtual range of `paged` (default: four times the budget; without one, four times the workload's peak of live
    /// bytes, at least 1 GiB; on a Vulkan device at most its sparse address space). A bounded range can fragment: `--compact` then remaps pages.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub virtual_size: Option<u64>,
    /// PyTorch allocator settings for the pytorch contenders, in PYTORCH_CUDA_ALLOC_CONF syntax.
    #[arg(long, value_name = "STR")]
    pub alloc_conf: Option<String>,
    /// replay: divide every size by this (a recording from a large GPU on a small device).
    #[arg(long, value_name = "N")]
    pub scale: Option<u64>,
    /// replay: which device of a PyTorch snapshot (default: the one that ran out of memory, else the one with the
    /// most trace entries; a file of several devices lists them).
    #[arg(long, value_name = "N")]
    pub device: Option<usize>,
    /// Print one JSON object per line and contender instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write the workload's allocations and frees to PATH as a native trace instead of running it: `heapscope replay
    /// PATH --vulkan` then puts gpu-allocator and VMA beside the heaps on the same stream.
    #[arg(long, value_name = "PATH")]
    pub save_trace: Option<PathBuf>,
    #[command(flatten)]
    pub heap: HeapRules,
}

/// The workload to run, its default budget and what that budget shows.
struct Chosen {
    workload: Workload,
    stats: StreamStats,
    default_budget: Option<u64>,
    story: String,
    /// The allocator settings a replayed snapshot recorded (or shows), which `pytorch` replays it with.
    recorded_conf: Option<AllocConf>,
}

impl BenchArgs {
    /// Knobs given to a workload that has no such knob are errors, as are a missing or stray FILE.
    fn check(&self) -> Result<()> {
        let name = self.workload;
        let knobs = [
            (self.batch.is_some(), "--batch", WorkloadName::Train, "train"),
            (self.checkpointing, "--checkpointing", WorkloadName::Train, "train"),
            (self.kv.is_some(), "--kv", WorkloadName::Serve, "serve"),
            (self.scale.is_some(), "--scale", WorkloadName::Replay, "replay"),
            (self.device.is_some(), "--device", WorkloadName::Replay, "replay"),
        ];
        if let Some((_, flag, _, owner)) = knobs.iter().find(|(given, _, owner, _)| *given && name != *owner) {
            bail!("{flag} is a knob of --workload {owner}");
        }
        if name == WorkloadName::Replay && self.seed.is_some() {
            bail!("--seed is a knob of the generated workloads (train, serve, churn): --workload replay plays the recording");
        }
        if self.scale == Some(0) {
            bail!("--scale 0: sizes are divided by it");
        }
        match (name, &self.file) {
            (WorkloadName::Replay, None) => bail!("--workload replay needs a FILE: a PyTorch snapshot, native or CSV trace"),
            (WorkloadName::Replay, Some(_)) | (_, None) => {}
            (_, Some(file)) => bail!("{}: only --workload replay takes a FILE", file.display()),
        }
        if self.steps == Some(0) {
            bail!("--steps 0: a workload needs at least one step");
        }
        // A usage error before anything runs (it was a failed row at step 0).
        if let Some(policy) = self.policies.iter().find(|policy| matches!(policy, Contender::GpuAllocator | Contender::Vma)) {
            bail!("--policy {policy}: no bench contender (it replays recordings: heapscope replay FILE --vulkan)");
        }
        let most = max_steps(name);
        if let Some(steps) = self.steps.filter(|&steps| steps > most) {
            let workload = name.to_possible_value().map(|value| value.get_name().to_owned()).unwrap_or_default();
            bail!("--steps {steps}: at most {most} for --workload {workload} (a workload is built whole before it runs)");
        }
        if self.batch == Some(0) {
            bail!("--batch 0: a batch needs at least one sequence");
        }
        if !self.page_size.is_power_of_two() || self.page_size < 4096 {
            bail!("--page-size {}: must be a power of two of at least 4 KiB", self.page_size);
        }
        if self.heap.budget == Some(0) {
            bail!("--budget 0: nothing could be allocated");
        }
        if let Some(budget) = self.heap.budget.filter(|_| self.runs_paged()) {
            budget_holds_a_page(budget, self.page_size, true)?;
        }
        // The simulation would map a last page reaching past the range, the device round the range down: refused, so
        // that both run the same range.
        if let Some(virtual_bytes) = self.virtual_size.filter(|bytes| self.runs_paged() && !bytes.is_multiple_of(self.page_size))
        {
            let exact = heapscope_core::units::exact_size;
            bail!(
                "--virtual-size {}: not a whole number of pages ({} each, --page-size)",
                exact(virtual_bytes),
                exact(self.page_size)
            );
        }
        if self.plain_wgpu && self.backend != Some(BackendName::Wgpu) {
            bail!("--plain-wgpu is a knob of --backend wgpu");
        }
        Ok(())
    }

    fn choose(&self) -> Result<Chosen> {
        let mut recorded_conf = None;
        // The generated workloads' seed.
        let seed = self.seed.unwrap_or(1);
        let (workload, default_budget, story) = match self.workload {
            WorkloadName::Train => {
                let base = TrainConfig::new(seed);
                let config = TrainConfig {
                    steps: self.steps.unwrap_or(base.steps),
                    batch: self.batch.unwrap_or(base.batch),
                    checkpointing: self.checkpointing,
                    ..base
                };
                (train(&config), Some(TrainConfig::DEFAULT_BUDGET_BYTES), TrainConfig::STORY.to_owned())
            }
            WorkloadName::Serve => {
                let base = ServeConfig::new(seed);
                let config = ServeConfig { steps: self.steps.unwrap_or(base.steps), kv: self.kv.unwrap_or(base.kv), ..base };
                (serve(&config), Some(ServeConfig::DEFAULT_BUDGET_BYTES), ServeConfig::STORY.to_owned())
            }
            WorkloadName::Churn => {
                let base = ChurnConfig::new(seed);
                let config = ChurnConfig { steps: self.steps.unwrap_or(base.steps), ..base };
                (churn(&config), Some(ChurnConfig::DEFAULT_BUDGET_BYTES), ChurnConfig::STORY.to_owned())
            }
            WorkloadName::Replay => {
                let file = self.file.as_ref().context("--workload replay needs a FILE")?;
                let recording = crate::input::open_device(file, self.device)?;
                let overview = heapscope_lab::compare::CompareConfig::default();
                for line in crate::replay::devices_overview(&recording, self.device, &overview) {
                    errln!("{line}");
                }
                recorded_conf = recording.snapshot.as_ref().map(AllocConf::of_snapshot);
                // The device the recording tells (its oom entry), as `replay` and `compare` take it, scaled as its
                // requests are: a recorded out of memory is one here too. Where `paged` runs and the scaled device is
                // below one page, it holds nothing paged could map: no budget then.
                let scale = self.scale.unwrap_or(1).max(1);
                let capacity = heapscope_lab::capacity::Capacity::of(None, &recording);
                let scaled = capacity
                    .bytes
                    .map(|bytes| bytes.div_ceil(scale))
                    .filter(|&bytes| !self.runs_paged() || bytes >= self.page_size);
                let story = match (scaled, capacity.bytes) {
                    (Some(_), _) if scale > 1 => format!("the recording's device divided by --scale {scale} ({capacity})"),
                    (Some(_), _) => capacity.to_string(),
                    (None, Some(bytes)) => format!(
                        "no budget: the recording's device{} is {}, less than one page of paged (--page-size {}); every \
                         allocation of the recording filled and verified",
                        if scale > 1 { format!(" divided by --scale {scale}") } else { String::new() },
                        heapscope_core::units::exact_size(bytes.div_ceil(scale)),
                        heapscope_core::units::exact_size(self.page_size)
                    ),
                    (None, None) => "no budget: every allocation of the recording filled and verified".to_owned(),
                };
                (replay(&recording, self.steps.map(u64::from), scale), scaled, story)
            }
        };
        let stats = workload.check().with_context(|| format!("{}: the generated stream is not well formed", workload.name))?;
        Ok(Chosen { workload, stats, default_budget, story, recorded_conf })
    }

    /// The run's settings: PyTorch's allocator settings are `--alloc-conf` over PyTorch's defaults, else the ones a
    /// replayed snapshot recorded (`recorded`), as `compare` takes them.
    /// Without a budget or `--virtual-size`, `paged`'s virtual range (and the expandable segments' on a device) is
    /// four times the workload's peak of live bytes, at least 1 GiB: a recording's replay has no budget unless its `oom`
    /// entry tells the device, and the range was 1 GiB whatever it held (frag_oom's 2.95 GiB ran out of it, even
    /// simulated).
    fn settings(&self, budget: Option<u64>, chosen: &Chosen) -> Result<BenchSettings> {
        // An explicit --budget is checked with the flags (`check`); the workload's own, known only now, here.
        if self.heap.budget.is_none()
            && self.runs_paged()
            && let Some(budget) = budget
        {
            budget_holds_a_page(budget, self.page_size, false)?;
        }
        let mut settings = BenchSettings::new(budget);
        settings.heap = self.heap.heap_config(PolicyKind::Tlsf);
        settings.page_bytes = self.page_size;
        if budget.is_none() {
            let room = chosen.stats.peak_live_bytes.saturating_mul(4).clamp(1 << 30, PagedConfig::MAX_DEFAULT_VIRTUAL_BYTES);
            settings.virtual_bytes = room.checked_next_multiple_of(self.page_size).unwrap_or(room);
        }
        let recorded = chosen.recorded_conf.as_ref();
        if let Some(virtual_bytes) = self.virtual_size {
            if virtual_bytes < self.page_size {
                bail!("--virtual-size {}: smaller than one page ({})", Bytes(virtual_bytes), Bytes(self.page_size));
            }
            settings.virtual_bytes = virtual_bytes;
        }
        settings.compact = self.compact;
        match (&self.alloc_conf, recorded) {
            (Some(overrides), _) => {
                settings.alloc_conf.parse_overrides(overrides).map_err(|error| anyhow::anyhow!("--alloc-conf: {error}"))?;
            }
            (None, Some(recorded)) => settings.alloc_conf = recorded.clone(),
            (None, None) => {}
        }
        Ok(settings)
    }

    fn policies(&self) -> Vec<Contender> {
        if self.policies.is_empty() { Contender::BENCH.to_vec() } else { self.policies.clone() }
    }

    /// Whether `paged`, the one contender `--page-size` sizes the pages of, is among those run.
    fn runs_paged(&self) -> bool {
        self.policies().contains(&Contender::Paged)
    }
}

/// The backend that runs, and why.
enum Device {
    Vulkan(Arc<VulkanContext>),
    Wgpu {
        device: Arc<WgpuDevice>,
        /// Why wgpu is not on heapscope's Vulkan device (`None`: it is).
        plain: Option<String>,
    },
    Sim {
        why: String,
    },
}

/// The most steps `--steps` asks of a workload: it is built whole in memory before it runs, and its steps differ in
/// size: measured (sim, the default knobs) about 18 KiB a training step (some 130 allocations and frees, and their
/// kernels), 1 KiB a serving step, 240 B a churn allocation, and a replay's events are the recording's. Each limit holds
/// a run under about 2 GiB (10 million training steps took the machine's 23 GiB).
fn max_steps(name: WorkloadName) -> u32 {
    match name {
        WorkloadName::Train => 100_000,
        WorkloadName::Serve => 2_000_000,
        WorkloadName::Churn => 8_000_000,
        WorkloadName::Replay => 10_000_000,
    }
}

/// What became of a contender: its run's report, or why the device cannot host it (sparse binding missing).
type Outcome = heapscope_lab::outcome::Outcome<Box<RunReport>>;

impl Device {
    fn open(asked: Option<BackendName>, plain_wgpu: bool) -> Result<Self> {
        match asked {
            Some(BackendName::Sim) => Ok(Device::Sim { why: "asked".into() }),
            Some(BackendName::Vulkan) => {
                let context =
                    VulkanContext::new(&ContextOptions::from_env()).context("--backend vulkan: bringing up the device")?;
                Ok(Device::Vulkan(Arc::new(context)))
            }
            Some(BackendName::Wgpu) => Self::open_wgpu(plain_wgpu),
            None => match VulkanContext::new(&ContextOptions::from_env()) {
                Ok(context) => Ok(Device::Vulkan(Arc::new(context))),
                // A device asked for by name that is not there is an error, not a run without one.
                Err(error @ VulkanError::NoMatchingDevice { .. }) => {
                    Err(anyhow::Error::new(error).context("bringing up the Vulkan device HEAPSCOPE_DEVICE names"))
                }
                Err(error) => Ok(Device::Sim { why: format!("no Vulkan device: {error}") }),
            },
        }
    }

    /// wgpu on heapscope's own Vulkan device when the selected adapter is a Vulkan one (unless `plain`), else plain
    /// wgpu; a failed interop falls back to plain wgpu and says why.
    fn open_wgpu(plain: bool) -> Result<Self> {
        let options = DeviceOptions::from_env();
        let adapter = WgpuDevice::selected_adapter(&options).context("--backend wgpu: choosing the adapter")?;
        let why_plain = if plain {
            "--plain-wgpu".to_owned()
        } else if adapter.backend != heapscope_wgpu::wgpu::Backend::Vulkan {
            format!("a {} adapter", adapter.backend)
        } else {
            match WgpuDevice::from_vulkan_adapter(&options) {
                Ok(device) => return Ok(Device::Wgpu { device: Arc::new(device), plain: None }),
                Err(error) => format!("heapscope's Vulkan device could not be used: {error}"),
            }
        };
        if options.validation {
            heapscope_wgpu::hal_log::install();
        }
        let device = WgpuDevice::new(&options).context("--backend wgpu: bringing up the device")?;
        Ok(Device::Wgpu { device: Arc::new(device), plain: Some(why_plain) })
    }

    fn name(&self) -> &'static str {
        match self {
            Device::Vulkan(_) => "vulkan",
            Device::Wgpu { .. } => "wgpu",
            Device::Sim { .. } => "sim",
        }
    }

    /// The adapter, for JSON: its name, its API, and whether it is heapscope's own Vulkan device.
    fn adapter(&self) -> serde_json::Value {
        match self {
            Device::Vulkan(context) => {
                serde_json::json!({ "name": context.properties().name, "api": "vulkan", "heapscope_vulkan_device": true })
            }
            Device::Wgpu { device, plain } => serde_json::json!({
                "name": device.info().name,
                "api": device.info().backend.to_str(),
                "heapscope_vulkan_device": plain.is_none(),
            }),
            Device::Sim { .. } => serde_json::Value::Null,
        }
    }

    fn describe(&self) -> String {
        const KERNELS: &str = "every allocation filled, computed on, copied and verified by the kernels";
        match self {
            Device::Vulkan(context) => format!(
                "vulkan on {}{}: {KERNELS}",
                context.properties().name,
                if context.validation_enabled() { ", validation on" } else { "" }
            ),
            Device::Wgpu { device, plain } => {
                let info = device.info();
                let route = match plain {
                    None => "on heapscope's own Vulkan device (sparse binding: paged and pytorch-expandable run)".to_owned(),
                    Some(why) => format!("plain wgpu ({why}: paged and pytorch-expandable do not run)"),
                };
                format!(
                    "wgpu on {} ({}), {route}{}: {KERNELS}",
                    info.name,
                    info.backend,
                    if self.validation() { ", validation on" } else { "" }
                )
            }
            Device::Sim { why } => format!("sim ({why}): no device, kernels skipped, so mismatches are 0 by construction"),
        }
    }

    /// Runs `workload` through `policy`; [`Outcome::NotRun`] when the device cannot host the contender (`paged` and
    /// `pytorch-expandable` without sparse residency, or on wgpu that is not heapscope's Vulkan device), or for
    /// `pytorch-expandable` beside a `pytorch` row (`pytorch_too`) whose settings turn expandable segments on already.
    fn run(&self, workload: &Workload, policy: Contender, settings: &BenchSettings, pytorch_too: bool) -> Result<Outcome> {
        if policy == (Contender::Pytorch { expandable: true }) && settings.alloc_conf.expandable_segments && pytorch_too {
            // The `pytorch` row runs with expandable segments already: the same run, measured twice.
            return Ok(Outcome::not_run(
                policy.name(),
                "pytorch's settings turn expandable segments on already (as the recording tells, or --alloc-conf): the \
                 `pytorch` row is this run",
            ));
        }
        if let Some(why) = self.too_large(workload, policy, settings) {
            return Ok(Outcome::not_run(policy.name(), why));
        }
        let unsupported = match self {
            Device::Vulkan(context) => match VulkanTarget::new(context, policy, settings) {
                Err(VulkanKernelError::Vulkan(VulkanError::Unsupported(why))) => format!("unsupported on this device: {why}"),
                made => return play(workload, made, "the device", policy),
            },
            Device::Wgpu { device, .. } => match WgpuTarget::new(device, policy, settings) {
                Err(WgpuKernelError::Wgpu(WgpuError::Unsupported(why))) => why,
                made => return play(workload, made, "wgpu", policy),
            },
            Device::Sim { .. } => {
                let report = run_simulated(workload, policy, settings).context("running simulated")?;
                return Ok(Outcome::Ran(Box::new(report)));
            }
        };
        Ok(Outcome::not_run(policy.name(), unsupported))
    }

    /// Why the device cannot hold `workload`'s largest request as `policy` asks for it (a buffer of its own, or in a
    /// block, a buddy's power of two, PyTorch's 2 MiB segment): larger than the device's largest buffer (lavapipe's
    /// `maxBufferSize` is 4 GiB; such a run failed on `vkCreateBuffer` or read as out of memory) or, on Vulkan, than
    /// its largest allocation (`maxMemoryAllocationSize`, 2 GiB on lavapipe: heapscope's memory source refuses a larger
    /// block as out of memory, which read as a verdict of fragmentation or exhaustion where the simulation served
    /// it). `None`: it can.
    fn too_large(&self, workload: &Workload, policy: Contender, settings: &BenchSettings) -> Option<String> {
        if matches!(self, Device::Sim { .. }) {
            return None;
        }
        // A request past the budget is refused as out of memory whatever the device: it does not count.
        let largest = workload
            .steps
            .iter()
            .filter_map(|step| match *step {
                heapscope_kernels::workload::Step::Alloc { size_bytes, .. }
                    if settings.budget_bytes.is_none_or(|budget| size_bytes <= budget) =>
                {
                    Some(size_bytes)
                }
                _ => None,
            })
            .max()?;
        // wgpu's arenas bind every allocation whole: one past the storage binding limit is refused mid-run.
        if let (Device::Wgpu { device, .. }, Contender::Heap(_)) = (self, policy) {
            let binding_bytes = device.device().limits().max_storage_buffer_binding_size / 4 * 4;
            if largest > binding_bytes {
                return Some(format!(
                    "its largest request, {}, exceeds the device's largest storage binding (max_storage_buffer_binding_size \
                     {}): wgpu's arenas bind every allocation whole",
                    heapscope_core::units::exact_size(largest),
                    heapscope_core::units::exact_size(binding_bytes)
                ));
            }
        }
        let sparse = match policy {
            Contender::Paged => Some(("paged needs", settings.virtual_bytes, 1)),
            Contender::Pytorch { expandable } if expandable || settings.alloc_conf.expandable_segments => {
                Some(("PyTorch's expandable segments need", settings.pytorch_device_config(true).expandable_virtual_bytes, 2))
            }
            _ => None,
        };
        if let Some((what, asked_bytes, share)) = sparse {
            return self.sparse_too_small((workload, policy), settings, what, asked_bytes, share);
        }
        match self {
            // The device's largest buffer and allocation, as a replay on the device holds them.
            Device::Vulkan(context) => context.properties().limits.largest_allocation(),
            // wgpu says its largest buffer.
            Device::Wgpu { device, .. } => Some(LargestAllocation {
                bytes: device.device().limits().max_buffer_size,
                limit: "max_buffer_size",
                what: "buffer",
            }),
            Device::Sim { .. } => None,
        }
        .and_then(|device_largest| policy.allocation_too_large(largest, &settings.alloc_conf, device_largest))
        .map(|too_large| too_large.to_string())
    }

    /// Why the device's sparse buffers cannot hold what `what` (its subject and verb) maps of `workload` at its peak (what
    /// `policy`'s simulation maps, at least the live bytes, or the budget when that is less): the range asked (`asked_bytes`) is cut to 1/`share` of the sparse address space
    /// (expandable segments: half, a segment for each pool) and `maxBufferSize`, and the need is past that cut. A run
    /// there refused requests as "exhaustion" where the budget had room. `None`: it fits, or no Vulkan device decides.
    fn sparse_too_small(
        &self,
        (workload, policy): (&Workload, Contender),
        settings: &BenchSettings,
        what: &str,
        asked_bytes: u64,
        share: u64,
    ) -> Option<String> {
        let context = match self {
            Device::Vulkan(context) => context,
            Device::Wgpu { device, .. } => device.vulkan_context()?,
            Device::Sim { .. } => return None,
        };
        let limits = &context.properties().limits;
        let space_bytes = limits.sparse_address_space_size_bytes / share;
        let largest_bytes = heapscope_vulkan::largest_sparse_buffer_bytes(limits, space_bytes);
        let stats = workload.check().ok()?;
        if asked_bytes <= largest_bytes {
            return None;
        }
        // What the contender maps at its peak, as its simulation finds it: its live bytes at least, more where
        // requests round up to pages (expandable segments' 20 MiB: two 512 MiB requests map 1,040 MiB, past a 1 GiB
        // range, and were refused as "exhaustion" where the budget had room). Under a budget, no more than it.
        let mapped_bytes = run_simulated(workload, policy, settings).map_or(0, |report| report.peak_reserved_bytes);
        let peak_bytes = stats.peak_live_bytes.max(mapped_bytes);
        let needed_bytes = settings.budget_bytes.map_or(peak_bytes, |budget| budget.min(peak_bytes));
        (needed_bytes > largest_bytes).then(|| {
            let space =
                if share == 1 { "sparseAddressSpaceSize".to_owned() } else { format!("sparseAddressSpaceSize / {share}") };
            format!(
                "{what} {} of virtual range at the workload's peak; the device's sparse buffers hold at most {} \
                 ({space}, maxBufferSize)",
                Bytes(needed_bytes),
                Bytes(largest_bytes)
            )
        })
    }

    /// Whether validation is on: the Vulkan layer, or on plain wgpu wgpu's own (`HEAPSCOPE_VALIDATION`).
    fn validation(&self) -> bool {
        match self {
            Device::Vulkan(context) => context.validation_enabled(),
            Device::Wgpu { device, plain } => match device.vulkan_context() {
                Some(context) => context.validation_enabled(),
                None => plain.is_some() && DeviceOptions::from_env().validation,
            },
            Device::Sim { .. } => false,
        }
    }

    /// What the validation layer (or wgpu) reported, and whether validation was on.
    fn messages(&self) -> (bool, Vec<String>) {
        let messages = match self {
            Device::Vulkan(context) => context.validation_messages(),
            Device::Wgpu { device, .. } => {
                let mut messages = device.errors().messages();
                match device.vulkan_context() {
                    Some(context) => messages.extend(context.validation_messages()),
                    None => messages.extend(heapscope_wgpu::hal_log::messages(device.info().backend)),
                }
                messages
            }
            Device::Sim { .. } => Vec::new(),
        };
        (self.validation(), messages)
    }
}

/// Refuses a budget below one page of `page_bytes`, which `paged` maps at the least (checked where `paged` runs):
/// it could allocate nothing. `given`: the budget is `--budget`'s, else the workload's default.
fn budget_holds_a_page(budget_bytes: u64, page_bytes: u64, given: bool) -> Result<()> {
    if budget_bytes >= page_bytes {
        return Ok(());
    }
    let (budget, page) = (heapscope_core::units::exact_size(budget_bytes), heapscope_core::units::exact_size(page_bytes));
    if given {
        bail!(
            "--budget {budget}: less than one page ({page}, --page-size), which paged maps at the least: it could allocate nothing"
        );
    }
    bail!(
        "--page-size {page}: larger than the workload's default budget ({budget}), and paged maps one page at the least: it \
         could allocate nothing (give a --budget of at least one page)"
    );
}

/// Plays `workload` on the target made for `policy` on `device` (`the device`, `wgpu`), or fails naming where (the
/// contender is named by its row and the list of failures). Something the device cannot do at all, met during the run
/// (more live sparse mappings than a CPU device holds), makes the row one the device cannot run, as `replay --vulkan`
/// says it: the bench goes on and succeeds.
fn play<T: Target, E>(workload: &Workload, made: Result<T, E>, device: &str, policy: Contender) -> Result<Outcome>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut target = made.with_context(|| format!("setting up on {device}"))?;
    match run(workload, &mut target) {
        Ok(report) => Ok(Outcome::Ran(Box::new(report))),
        Err(error) if error.device_limit => {
            Ok(Outcome::not_run(policy.name(), format!("past a limit of the device at step {}: {}", error.step, error.message)))
        }
        Err(error) => Err(anyhow::Error::new(error).context(format!("running on {device}"))),
    }
}

/// Runs the bench.
pub fn run_bench(args: &BenchArgs) -> Result<()> {
    args.check()?;
    if let (Some(file), Some(path)) = (&args.file, &args.save_trace) {
        crate::input::refuse_overwriting(file, path)?;
    }
    let chosen = args.choose()?;
    if let Some(path) = &args.save_trace {
        let stream = chosen
            .workload
            .trace()
            .map_err(|error| anyhow::anyhow!("{}: step {}: {}", chosen.workload, error.step, error.what))?;
        stream.trace.write_native(path).with_context(|| format!("--save-trace {}", path.display()))?;
        let events = stream.trace.events().len();
        if args.json {
            let written = serde_json::json!({ "workload": chosen.workload.name, "events": events, "saved_trace": path });
            outln!("{written}");
        } else {
            outln!("{}: {events} events written to {}", chosen.workload, path.display());
        }
        return Ok(());
    }
    let budget = args.heap.budget.or(chosen.default_budget);
    let settings = args.settings(budget, &chosen)?;
    let device = Device::open(args.backend, args.plain_wgpu)?;
    if !args.json {
        let overrides = settings.alloc_conf.overrides();
        let conf = (!overrides.is_empty()).then(|| {
            let whence = if args.alloc_conf.is_some() { "--alloc-conf" } else { "as the recording tells" };
            format!("{overrides} ({whence})")
        });
        print_title(&chosen, budget, args.heap.budget.is_none(), &device, conf.as_deref());
    }
    let mut reports = Vec::new();
    // A contender that fails (a Vulkan call refused) is said in its row and the others still run; the bench fails
    // at the end, after the validation layer's messages.
    let mut failed = Vec::new();
    let policies = args.policies();
    let pytorch_too = policies.contains(&Contender::Pytorch { expandable: false });
    for policy in policies {
        let outcome = match device.run(&chosen.workload, policy, &settings, pytorch_too) {
            Ok(outcome) => outcome,
            Err(error) => {
                let why = format!("{error:#}");
                if args.json {
                    outln!("{}", line(policy, &chosen.workload, &device, budget, serde_json::json!({ "failed": why })));
                } else {
                    outln!("{:<20} failed: {why}", policy.name());
                }
                failed.push(format!("{policy}: {why}"));
                continue;
            }
        };
        match outcome {
            Outcome::Ran(report) => {
                if args.json {
                    outln!("{}", json_line(policy, &chosen.workload, &device, budget, &report));
                } else {
                    print_row(policy, &report);
                }
                reports.push((policy, *report));
            }
            Outcome::NotRun { why, .. } => {
                if args.json {
                    outln!("{}", not_run_line(policy, &chosen.workload, &device, budget, &why));
                } else {
                    outln!("{:<20} not run: {why}", policy.name());
                }
            }
        }
    }
    if !args.json {
        outln!("({})", crate::output::RES_LIVE_LEGEND);
        outln!(
            "(allocs/s: allocations over the run's wall time, the kernels filling, verifying and computing on every \
             allocation included: the speed of the whole run, not of the allocator alone; wall ms: the run's wall time)"
        );
        print_verdicts(&reports, &chosen.workload);
    }
    let (validation, messages) = device.messages();
    if validation && !args.json {
        outln!("validation: {} message(s)", messages.len());
    }
    if !messages.is_empty() {
        bail!("the validation layer or wgpu reported {} message(s):\n{}", messages.len(), messages.join("\n"));
    }
    if !failed.is_empty() {
        bail!("{} contender(s) failed:\n{}", failed.len(), failed.join("\n"));
    }
    if reports.is_empty() {
        bail!("no contender could run");
    }
    Ok(())
}

/// The run's header; `conf`: PyTorch's allocator settings where they are not its defaults, and whence.
fn print_title(chosen: &Chosen, budget: Option<u64>, default: bool, device: &Device, conf: Option<&str>) {
    let stats = &chosen.stats;
    outln!(
        "workload: {}: {} allocations ({} allocated), peak live {}, {} matvecs, {} copies",
        chosen.workload.name,
        stats.allocs,
        Bytes(stats.allocated_bytes),
        Bytes(stats.peak_live_bytes),
        stats.matvecs,
        stats.copies
    );
    outln!("backend: {}", device.describe());
    let budget = budget.map_or_else(|| "none".to_owned(), |bytes| Bytes(bytes).to_string());
    if default {
        outln!("budget: {budget} (the default: {})", chosen.story);
    } else {
        outln!("budget: {budget}");
    }
    if let Some(conf) = conf {
        outln!("pytorch's settings: {conf}");
    }
    outln!(
        "{:<20} {:>13} {:>14} {:>8} {:>5} {:>10} {:>11} {:>9}",
        "policy",
        "peak live",
        "peak reserved",
        "res/live",
        "OOMs",
        "mismatches",
        "allocs/s",
        "wall ms"
    );
}

fn print_row(policy: Contender, report: &RunReport) {
    let mismatches = if report.kernels_ran { report.mismatches.to_string() } else { "-".to_owned() };
    outln!(
        "{:<20} {:>13} {:>14} {:>8.4} {:>5} {:>10} {:>11} {:>9.1}",
        policy.name(),
        Bytes(report.peak_live_bytes).to_string(),
        Bytes(report.peak_reserved_bytes).to_string(),
        report.reserved_over_live(),
        report.ooms,
        mismatches,
        rate(report.allocs_per_sec()),
        report.wall.as_secs_f64() * 1000.0
    );
    if let Some(compaction) = &report.compaction {
        outln!("{:<20} {compaction}", "");
    }
}

/// A rate for the table: whole above 100, with two significant digits below (a run of one 2 GiB allocation reads
/// `0.45`, not `0`).
fn rate(per_sec: f64) -> String {
    if per_sec >= 100.0 || per_sec <= 0.0 {
        format!("{per_sec:.0}")
    } else {
        let decimals = (1.0 - per_sec.max(1e-9).log10().floor()).clamp(0.0, 6.0) as usize;
        format!("{per_sec:.decimals$}")
    }
}

/// The first out-of-memory of each contender that had one, and who completed.
fn print_verdicts(reports: &[(Contender, RunReport)], workload: &Workload) {
    let failed: Vec<_> = reports.iter().filter(|(_, report)| report.ooms > 0).collect();
    if failed.is_empty() {
        return;
    }
    outln!("first out of memory:");
    for (policy, report) in &failed {
        if let Some((step, verdict)) = &report.first_oom {
            // A replay's step names its entry in the recording too (steps skip empty_cache entries and segment events).
            let entry = match workload.moment_of(*step) {
                _ if workload.moments.is_empty() => String::new(),
                heapscope_lab::recording::Moment::Entry(entry) => format!(" (entry {entry} of the recording)"),
                heapscope_lab::recording::Moment::Start => " (the recording's start)".to_owned(),
            };
            outln!("  {policy} at step {step} of {}{entry}: {}", workload.steps.len(), verdict.describe());
        }
    }
    let completed: Vec<&str> = reports.iter().filter(|(_, report)| report.ooms == 0).map(|(policy, _)| policy.name()).collect();
    if completed.is_empty() {
        return;
    }
    // Those that failed for want of memory the others found: by the cause of their first refusal.
    for cause in [OomCause::Fragmentation, OomCause::InternalWaste] {
        let failed_so: Vec<&str> = failed
            .iter()
            .filter(|(_, report)| report.first_oom.as_ref().is_some_and(|(_, verdict)| verdict.cause == cause))
            .map(|(policy, _)| policy.name())
            .collect();
        if !failed_so.is_empty() {
            outln!("{} ran out of memory from {} where {} completed.", failed_so.join(", "), cause.name(), completed.join(", "));
        }
    }
}

fn json_line(policy: Contender, workload: &Workload, device: &Device, budget: Option<u64>, report: &RunReport) -> String {
    let first_oom = report.first_oom.as_ref().map(|(step, verdict)| FirstOom::from_verdict(workload.moment_of(*step), verdict));
    let first_mismatch = report.first_mismatch.map(|(id, step, result)| {
        serde_json::json!({ "allocation": id, "step": step, "mismatches": result.mismatches, "first_word": result.first_mismatch })
    });
    let fields = serde_json::json!({
        "peak_live_bytes": report.peak_live_bytes,
        "peak_reserved_bytes": report.peak_reserved_bytes,
        "reserved_over_live": report.reserved_over_live().0,
        "allocs": report.allocs,
        "frees": report.frees,
        "ooms": report.ooms,
        "first_oom": first_oom,
        "kernels_ran": report.kernels_ran,
        "mismatches": report.mismatches,
        "first_mismatch": first_mismatch,
        // Bytes the kernels checked: none where they did not run (the simulation counts what it would have).
        "bytes_verified": if report.kernels_ran { report.ops.bytes_verified } else { 0 },
        "matvecs": report.ops.matvecs,
        "copies": report.ops.copies,
        "batches": report.batches,
        "allocs_per_sec": report.allocs_per_sec(),
        "wall_ms": report.wall.as_secs_f64() * 1000.0,
        "compaction": report.compaction,
    });
    line(policy, workload, device, budget, fields)
}

/// A contender the device cannot host: who, where, and why.
fn not_run_line(policy: Contender, workload: &Workload, device: &Device, budget: Option<u64>, why: &str) -> String {
    line(policy, workload, device, budget, serde_json::json!({ "not_run": why }))
}

/// A JSON line of a contender: who, on what, where, under which budget, then `fields` (an object).
fn line(policy: Contender, workload: &Workload, device: &Device, budget: Option<u64>, fields: serde_json::Value) -> String {
    let mut line = serde_json::json!({
        "policy": policy.name(),
        "workload": workload.name,
        "backend": device.name(),
        "adapter": device.adapter(),
        "budget_bytes": budget,
    });
    if let (Some(line), serde_json::Value::Object(fields)) = (line.as_object_mut(), fields) {
        line.extend(fields);
    }
    line.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_keep_two_significant_digits_below_a_hundred() {
        let cases =
            [(1234.4, "1234"), (100.0, "100"), (45.3, "45"), (1.8, "1.8"), (0.45, "0.45"), (0.0012, "0.0012"), (0.0, "0")];
        for (per_sec, shown) in cases {
            assert_eq!(rate(per_sec), shown, "{per_sec}");
        }
    }
}
