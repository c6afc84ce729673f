//! Live mode on a real device: a workload of the kernels crate (train, serve, churn) runs through one contender
//! on the Vulkan device ([`VulkanTarget`]) on a worker thread, and every allocation, free, block reserved or
//! released and page run mapped or unmapped it makes arrives in the app as one [`LiveStep`] of a
//! [`ChannelSource`], with the offsets the heap really used.
//!
//! ## Design
//!
//! - The run is the bench runner's ([`run_observed`]), which replays the workload's allocations and frees through the
//!   lab's one driver: the same fills, verifies, copies and matvecs, so the kernels check the memory the map shows.
//!   [`LiveObserver`] is an observer of that driver: each allocation, refusal and free it hears, with the device
//!   events the target logged for it ([`VulkanTarget::take_device_events`]) and the allocation's footprint
//!   ([`heapscope_kernels::VulkanHandle::footprint`]), becomes timeline [`Change`]s ([`RegionTracker`]); an
//!   out-of-memory verdict becomes the step's [`Refusal`].
//! - What is not a layout change — kernel mismatches, refusals so far, the run's end or failure — goes to a shared
//!   [`LiveProgress`] the app reads each frame.
//! - Stopping sets a flag the observer checks before each allocation or free: the driver stops at once with an error,
//!   the target is dropped on the worker (its memory released), and the map keeps what arrived.
//! - The kernels and device crates know nothing of this module; it only uses their public API.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use heapscope_core::DeviceEvent;
use heapscope_core::units::exact_size;
use heapscope_kernels::bench::{BenchSettings, KernelDriver, Placed, RunReport, run_observed};
use heapscope_kernels::workload::{ChurnConfig, ServeConfig, TrainConfig, Workload, churn, serve, train};
use heapscope_kernels::{VulkanHandle, VulkanTarget};
use heapscope_lab::contender::Contender;
use heapscope_lab::driver::{Observer, Step as DriverStep};
use heapscope_lab::recording::Moment;
use heapscope_lab::timeline::{Change, Refusal, RegionTracker, Span};
use heapscope_vulkan::{ContextOptions, ValidationLog, VulkanContext};

use crate::live::{ChannelSource, LiveStep};

/// The message a stopped run ends with.
pub const STOPPED: &str = "stopped";

/// A workload live mode can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LiveWorkload {
    /// Training steps: weights, activations, gradients.
    Train,
    /// An inference server: KV caches growing and moving.
    Serve,
    /// Random sizes and lifetimes.
    Churn,
}

impl LiveWorkload {
    /// Every workload, in menu order.
    pub const ALL: [LiveWorkload; 3] = [LiveWorkload::Serve, LiveWorkload::Train, LiveWorkload::Churn];

    /// The name in menus and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LiveWorkload::Train => "train",
            LiveWorkload::Serve => "serve",
            LiveWorkload::Churn => "churn",
        }
    }

    /// Its default budget (the one `heapscope bench` uses).
    pub fn default_budget_bytes(self) -> u64 {
        match self {
            LiveWorkload::Train => TrainConfig::DEFAULT_BUDGET_BYTES,
            LiveWorkload::Serve => ServeConfig::DEFAULT_BUDGET_BYTES,
            LiveWorkload::Churn => ChurnConfig::DEFAULT_BUDGET_BYTES,
        }
    }

    /// The stream of `steps` steps (the workload's default when `None`) from `seed`.
    pub fn build(self, steps: Option<u32>, seed: u64) -> Workload {
        match self {
            LiveWorkload::Train => {
                let base = TrainConfig::new(seed);
                train(&TrainConfig { steps: steps.unwrap_or(base.steps), ..base })
            }
            LiveWorkload::Serve => {
                let base = ServeConfig::new(seed);
                serve(&ServeConfig { steps: steps.unwrap_or(base.steps), ..base })
            }
            LiveWorkload::Churn => {
                let base = ChurnConfig::new(seed);
                churn(&ChurnConfig { steps: steps.unwrap_or(base.steps), ..base })
            }
        }
    }
}

impl fmt::Display for LiveWorkload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LiveWorkload {
    type Err = heapscope_core::UnknownName;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|workload| workload.name() == text).ok_or_else(|| heapscope_core::UnknownName {
            what: "live workload",
            name: text.to_owned(),
            expected: "one of serve, train, churn (replay runs through `heapscope bench`)".to_owned(),
        })
    }
}

/// What a live run runs.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveConfig {
    /// The workload.
    pub workload: LiveWorkload,
    /// The contender.
    pub policy: Contender,
    /// The budget; `None`: the workload's default.
    pub budget_bytes: Option<u64>,
    /// Steps of the workload; `None`: its default.
    pub steps: Option<u32>,
    /// The workload's seed.
    pub seed: u64,
}

impl LiveConfig {
    /// `workload` through `policy` with the defaults (budget, steps, seed 1).
    pub fn new(workload: LiveWorkload, policy: Contender) -> Self {
        Self { workload, policy, budget_bytes: None, steps: None, seed: 1 }
    }

    /// The budget it runs with: the one given, else the workload's default.
    pub fn budget(&self) -> u64 {
        self.budget_bytes.unwrap_or_else(|| self.workload.default_budget_bytes())
    }

    /// What the pane is called: `live serve · tlsf · 160 MiB` (the budget exactly).
    pub fn title(&self) -> String {
        format!("live {} · {} · {}", self.workload, self.policy, exact_size(self.budget()))
    }
}

/// The Vulkan device for live mode, opened with `options` (`ContextOptions::from_env()`: `HEAPSCOPE_DEVICE` and
/// `HEAPSCOPE_VALIDATION` honoured).
///
/// # Errors
/// `no GPU/Vulkan device: …` with the reason, for the app to show.
pub fn open_device(options: &ContextOptions) -> anyhow::Result<Arc<VulkanContext>> {
    VulkanContext::new(options).map(Arc::new).map_err(|error| anyhow::anyhow!("no GPU/Vulkan device: {error}"))
}

/// How a live run is going, shared between the worker and the app.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveProgress {
    /// Events sent (allocations and frees, refusals included).
    pub events: u64,
    /// Words the kernels found different from what they should hold, so far.
    pub mismatches: u64,
    /// Allocations refused (out of memory) so far.
    pub ooms: u64,
    /// The run's end: its report, or why it stopped.
    pub finished: Option<Result<RunReport, String>>,
}

impl LiveProgress {
    /// One line for the app: steps, OOMs, mismatches, and the end.
    pub fn describe(&self) -> String {
        let state = match &self.finished {
            None => "running".to_owned(),
            Some(Ok(report)) => format!(
                "finished in {:.1} s: {} allocs, peak reserved {} MiB over peak live {} MiB",
                report.wall.as_secs_f64(),
                report.allocs,
                report.peak_reserved_bytes >> 20,
                report.peak_live_bytes >> 20
            ),
            Some(Err(message)) if message.ends_with(STOPPED) => "stopped".to_owned(),
            Some(Err(message)) => format!("failed: {message}"),
        };
        // The events replayed (allocations and frees), not the workload's steps the bar's field sets (a training step
        // is hundreds of them).
        let events = heapscope_lab::recording::counted(self.events, "event", "events");
        format!("{state} · {events} · OOMs {} · kernel mismatches {}", self.ooms, self.mismatches)
    }
}

/// A live run on a worker thread: its progress, and the way to stop it. Dropping it stops the run
/// ([`wait_for_stopped_runs`] waits for its worker to let go of the device).
#[derive(Debug)]
pub struct LiveRun {
    /// The configuration it runs.
    pub config: LiveConfig,
    /// The device it runs on.
    pub device: String,
    /// Whether that is the device the window draws with ([`crate::shared_device`]).
    pub draws_here: bool,
    /// The device's validation log (empty without validation), readable after the device is gone.
    pub validation: ValidationLog,
    progress: Arc<Mutex<LiveProgress>>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

/// Workers of dropped runs still stopping (each before its next allocation or free: within one kernel batch).
static STOPPING: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// Waits up to `patience` for the workers of dropped runs to stop and release their device memory (the window
/// calls it once closed, so the device outlives no allocation of theirs); returns how many are still going.
pub fn wait_for_stopped_runs(patience: Duration) -> usize {
    let deadline = Instant::now() + patience;
    loop {
        let mut stopping = STOPPING.lock().unwrap_or_else(PoisonError::into_inner);
        let (done, going): (Vec<_>, Vec<_>) = std::mem::take(&mut *stopping).into_iter().partition(JoinHandle::is_finished);
        *stopping = going;
        let left = stopping.len();
        drop(stopping);
        for worker in done {
            // A worker's panic was reported when it happened; nothing is left to undo.
            let _ = worker.join();
        }
        if left == 0 || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl LiveRun {
    /// A copy of the progress now.
    pub fn progress(&self) -> LiveProgress {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Whether the run has ended (finished, failed or stopped).
    pub fn finished(&self) -> bool {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner).finished.is_some()
    }

    /// The device it runs on, in words: `on llvmpipe, the device this window draws with`.
    pub fn where_it_runs(&self) -> String {
        if self.draws_here {
            format!("on {}, the device this window draws with", self.device)
        } else {
            format!("on {} (a device of its own)", self.device)
        }
    }

    /// Asks the run to stop before its next allocation or free.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for LiveRun {
    /// Stops the run without waiting for it (the window stays responsive); [`wait_for_stopped_runs`] waits.
    fn drop(&mut self) {
        self.stop();
        if let Some(worker) = self.worker.take() {
            STOPPING.lock().unwrap_or_else(PoisonError::into_inner).push(worker);
        }
    }
}

/// Starts `config` on `context`'s device: the source the app shows, and the run.
///
/// # Errors
/// A workload that is not well formed, or a contender the device cannot host (no sparse binding for `paged`).
pub fn start(context: &Arc<VulkanContext>, config: LiveConfig) -> anyhow::Result<(ChannelSource, LiveRun)> {
    let workload = config.workload.build(config.steps, config.seed);
    workload.check().map_err(|error| anyhow::anyhow!("{}: {error}", workload.name))?;
    let budget = config.budget();
    let settings = BenchSettings::new(Some(budget));
    let mut target = VulkanTarget::new(context, config.policy, &settings)
        .map_err(|error| anyhow::anyhow!("{} with a budget of {} on the device: {error}", config.policy, exact_size(budget)))?;
    target.record_device_events(true);
    let (source, sender) = ChannelSource::new();
    let progress = Arc::new(Mutex::new(LiveProgress::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let (worker_progress, worker_stop) = (Arc::clone(&progress), Arc::clone(&stop));
    let worker = std::thread::Builder::new()
        .name("heapscope-live".into())
        .spawn(move || {
            let mut observer = LiveObserver::new(sender, Arc::clone(&worker_progress), worker_stop);
            let result = run_observed(&workload, &mut target, &mut [&mut observer]);
            drop(observer);
            // The device memory goes back before the run is said to be over.
            drop(target);
            let mut progress = worker_progress.lock().unwrap_or_else(PoisonError::into_inner);
            // Every verify that ran counts, a stopped or failed run's last batch too.
            progress.mismatches = match &result {
                Ok(report) => report.mismatches,
                Err(error) => error.mismatches,
            };
            progress.finished = Some(result.map_err(|error| error.to_string()));
        })
        .map_err(|error| anyhow::anyhow!("cannot start the live worker: {error}"))?;
    let device = context.properties().name.clone();
    let validation = context.validation_log();
    Ok((source, LiveRun { config, device, draws_here: false, validation, progress, stop, worker: Some(worker) }))
}

/// The span of an allocation served at `step`: its footprint `(address, footprint_bytes, lead_bytes)` and the bytes
/// asked for.
pub fn span_of(footprint: (u64, u64, u64), requested_bytes: u64, slot: u32, step: u64) -> Span {
    let (address, footprint_bytes, lead_bytes) = footprint;
    Span { address, footprint_bytes, lead_bytes, requested_bytes, slot, before_recording: false, born: step }
}

/// What the bench runner does on the device, as the lab's driver tells its observers, sent to a live source. See
/// the module documentation.
#[derive(Debug)]
pub struct LiveObserver {
    sender: Sender<LiveStep>,
    progress: Arc<Mutex<LiveProgress>>,
    stop: Arc<AtomicBool>,
    regions: RegionTracker,
    steps: u64,
    slots: u32,
}

impl LiveObserver {
    /// Reporting through `sender`, the progress to `progress`, stopping the run once `stop` is set.
    pub fn new(sender: Sender<LiveStep>, progress: Arc<Mutex<LiveProgress>>, stop: Arc<AtomicBool>) -> Self {
        Self { sender, progress, stop, regions: RegionTracker::default(), steps: 0, slots: 0 }
    }

    /// Sends one step: `leading` (a free), the changes of the device events, `trailing` (an allocation).
    fn send(
        &mut self,
        leading: Option<Change>,
        trailing: Option<Change>,
        refusal: Option<Refusal>,
        events: &[DeviceEvent],
        target: &VulkanTarget,
    ) -> heapscope_core::Result<()> {
        let mut changes: Vec<Change> = leading.into_iter().collect();
        self.regions.changes(events, &target.virtual_ranges(), &mut changes);
        changes.extend(trailing);
        let refused = refusal.is_some();
        self.sender
            .send(LiveStep { changes, refusal })
            .map_err(|_| heapscope_core::Error::Source(format!("the live view closed; {STOPPED}")))?;
        self.steps += 1;
        let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        progress.events = self.steps;
        progress.ooms += u64::from(refused);
        Ok(())
    }
}

impl Observer<KernelDriver<'_, VulkanTarget>> for LiveObserver {
    fn before_event(&mut self, _event: u64) -> heapscope_core::Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(heapscope_core::Error::Source(STOPPED.to_owned()));
        }
        Ok(())
    }

    fn step(
        &mut self,
        _event: u64,
        _moment: Moment,
        step: DriverStep<'_, Placed<VulkanHandle>>,
        device_events: &[DeviceEvent],
        runner: &KernelDriver<'_, VulkanTarget>,
    ) -> heapscope_core::Result<()> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner).mismatches = runner.report().mismatches;
        let target = runner.target();
        match step {
            DriverStep::Placed { size_bytes, handle, .. } => {
                let span = span_of(handle.handle.footprint(), size_bytes, self.slots, self.steps);
                self.slots += 1;
                self.send(None, Some(Change::Allocated(span)), None, device_events, target)
            }
            DriverStep::Refused { verdict, .. } => self.send(None, None, verdict.map(Refusal::from), device_events, target),
            DriverStep::Freed { handle, .. } => {
                let address = handle.handle.footprint().0;
                self.send(Some(Change::Freed { address }), None, None, device_events, target)
            }
            // The free of an allocation the device refused: nothing of its own to show.
            DriverStep::Unserved { .. } | DriverStep::CacheEmptied if device_events.is_empty() => Ok(()),
            DriverStep::Unserved { .. } | DriverStep::CacheEmptied => self.send(None, None, None, device_events, target),
            // Live mode's targets move nothing (they run no compaction rule); a move would slide the allocation.
            DriverStep::Moved { from, to, .. } => {
                let address = from.handle.footprint().0;
                let requested = <KernelDriver<'_, VulkanTarget> as heapscope_lab::driver::Target>::allocation(to).size_bytes();
                let span = span_of(to.handle.footprint(), requested, self.slots, self.steps);
                self.send(Some(Change::Freed { address }), Some(Change::Allocated(span)), None, device_events, target)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_lab::timeline::Timeline;

    /// The changes of a block, an allocation in it and its free make a timeline that grows and shrinks.
    #[test]
    fn changes_apply_to_a_timeline() {
        let mut tracker = RegionTracker::default();
        let mut changes = Vec::new();
        tracker.changes(&[DeviceEvent::Reserved { address: 0, size_bytes: 1 << 20 }], &[], &mut changes);
        changes.push(Change::Allocated(span_of((256, 4096, 0), 4000, 0, 0)));
        let mut timeline = Timeline::new("live");
        timeline.push(&changes, None).unwrap();
        let grown = timeline.layout_at(1).totals();
        assert_eq!((grown.reserved_bytes, grown.live_bytes), (1 << 20, 4000));
        timeline.push(&[Change::Freed { address: 256 }], None).unwrap();
        assert_eq!(timeline.layout_at(2).totals().live_bytes, 0);
    }

    #[test]
    fn workloads_parse_and_unknown_ones_are_named() {
        for workload in LiveWorkload::ALL {
            assert_eq!(workload.name().parse::<LiveWorkload>(), Ok(workload));
        }
        assert!("replay".parse::<LiveWorkload>().unwrap_err().to_string().contains("\"replay\""));
    }
}
