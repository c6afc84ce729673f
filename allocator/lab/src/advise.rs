//! [`advise`]: which settings of PyTorch's caching allocator would have fit a recording, how much memory each
//! needs, and the proof — every setting a replay of the same recording through the emulation, on the one driver.
//!
//! The question people bring a snapshot with is "my run died with memory free — what do I set?". The emulation
//! reproduces real runs decision for decision, so the answer is a replay per setting: a grid of
//! `PYTORCH_CUDA_ALLOC_CONF` settings ([`grid`]: `expandable_segments` off and on, each with `max_split_size_mb`
//! 64 to 1024, `roundup_power2_divisions` 4 to 16, and `garbage_collection_threshold` 0.6 or 0.8 beside a max split
//! size), the recording's own settings, and heapscope's `paged` with CUDA's 2 MiB pages as what a paging allocator
//! would need. For each: the figures of its run on the device (peak reserved and live, device allocations and
//! frees, the estimated time of those driver calls, [`crate::cuda_cost`]), its out-of-memory errors and the first
//! verdict, and the smallest capacity at which it runs without one, found by bisection (`min_capacity`) between
//! the peak of allocated bytes (below it nothing fits) and the peak reserved without a limit — and then checked
//! above: more memory can change the allocator's decisions (garbage collection, the release of cached segments), so
//! larger capacities are replayed too, and a setting that fails at one of them is reported as not monotone. Each
//! probe stops at the first refusal; a snapshot's probes resume from copies of the run without a limit taken along
//! it (`Checkpoints`: the runs are the same up to the first request past the probe's capacity), a plain trace's
//! replay from the start ([`crate::compare::first_refusal`]). With no capacity the row's own run is the run without
//! a limit, and keeps the copies itself ([`crate::caching_target::SnapshotTarget::keep_copies`]). Settings the
//! recording cannot tell apart ([`settings_in_effect`]: a `max_split_size_mb` no block of it can reach) replay
//! once; the other rows are that run's, named for them and marked [`SettingAdvice::same_run_as`].
//!
//! The device's capacity is the one given, else what the recording tells: at its first `oom` entry the reserved
//! bytes plus the driver's free bytes it recorded ([`crate::capacity`]). With a capacity the settings that fit
//! rank first, by peak reserved; without one, by the smallest capacity they need. A recording that starts mid-run is
//! advised from the start state rebuilt from its final segments, as every replay of it is.

use std::cell::RefCell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::caching_target::Copies;
use crate::capacity::{Capacity, CapacityFrom};
use crate::compare::{
    Figures, FirstOom, alloc_conf, emulate_pytorch_copied, emulation_error, first_refusal, start_reserved_bytes, starts_afresh,
    summed,
};
use crate::cuda_cost::{CUDA_PAGE_BYTES, CudaCost};
use crate::driver::{HeapTarget, Statistics, Stream, drive};
use crate::recording::{Recording, counted};
use heapscope_core::trace::Event;
use heapscope_core::units::{Bytes, BytesAtLeast, parse_size};
use heapscope_core::{LARGEST_DEVICE_BYTES, PagedConfig, PagedHeap, Result, UnmapRule};
use heapscope_pytorch::alloc_conf::items_of;
use heapscope_pytorch::caching::{get_allocation_size, largest_block_bound, round_size, settings_in_effect};
use heapscope_pytorch::{AllocConf, Emulator, LARGE_BUFFER_BYTES, MemoryStats, Snapshot};

/// The capacity searches' grid: capacities are multiples of CUDA's 2 MiB granularity.
pub const CAPACITY_STEP_BYTES: u64 = CUDA_PAGE_BYTES;

/// The name of the paging allocator's row.
pub const PAGED: &str = "paged";

/// The grid of settings, as `PYTORCH_CUDA_ALLOC_CONF` strings (`""` is PyTorch's defaults).
pub fn grid() -> Vec<String> {
    let mut settings = Vec::new();
    for expandable in [false, true] {
        let base = if expandable { "expandable_segments:True" } else { "" };
        let with = |extra: String| if base.is_empty() { extra } else { format!("{base},{extra}") };
        settings.push(base.to_owned());
        for mb in [64, 128, 256, 512, 1024] {
            settings.push(with(format!("max_split_size_mb:{mb}")));
        }
        for divisions in [4, 8, 16] {
            settings.push(with(format!("roundup_power2_divisions:{divisions}")));
        }
        for (mb, threshold) in [(256, "0.6"), (256, "0.8"), (512, "0.6"), (512, "0.8")] {
            settings.push(with(format!("max_split_size_mb:{mb},garbage_collection_threshold:{threshold}")));
        }
    }
    settings
}

/// What one setting would have done.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SettingAdvice {
    /// The `PYTORCH_CUDA_ALLOC_CONF` string (`""`: PyTorch's defaults), or `paged`.
    pub setting: String,
    /// Whether these are the recording's own settings.
    pub as_recorded: bool,
    /// The run on the device of the advice (without a limit when its capacity is unknown).
    #[cfg_attr(feature = "serde", serde(skip))]
    pub figures: Figures,
    /// The most bytes reserved from the device at once.
    pub peak_reserved_bytes: u64,
    /// The most bytes requested and live at once.
    pub peak_live_bytes: u64,
    /// `cudaMalloc` calls (pages mapped, for expandable segments and `paged`: map calls).
    pub device_allocs: u64,
    /// `cudaFree` calls (unmap calls).
    pub device_frees: u64,
    /// The estimated time of those driver calls on an H200, µs ([`crate::cuda_cost`]).
    pub driver_time_us: f64,
    /// Requests refused on the device of the advice.
    pub ooms: u64,
    /// The first of them.
    pub first_oom: Option<FirstOom>,
    /// The smallest capacity at which it runs without an out-of-memory error, on the search's grid (2 MiB or 1/1024 of
    /// the peak reserved without a limit, whichever is coarser; at most that peak); `None` when no capacity does (a
    /// request larger than any device).
    pub min_capacity_bytes: Option<u64>,
    /// Whether the larger capacities tried (one grid step above the need, and half-way to the peak reserved without a
    /// limit) also run: more memory can change the allocator's decisions, and two probes are no proof for every
    /// capacity above.
    pub monotone: bool,
    /// A larger capacity at which it failed again, when not monotone.
    pub fails_again_at_bytes: Option<u64>,
    /// On a device of its need (`min_capacity_bytes`), the times PyTorch freed its whole cache and retried a `cudaMalloc`
    /// that failed (`num_alloc_retries`; each waits for the device to finish its work): what running at the need costs.
    /// `None` for `paged` and where nothing fits.
    pub retries_at_need: Option<u64>,
    /// 1 for the best; 0 for `paged`, a reference rather than a setting.
    pub rank: usize,
    /// The setting whose run this one is, when what it adds cannot change a decision on this recording
    /// ([`heapscope_pytorch::caching::settings_in_effect`]: a `max_split_size_mb` no block can reach): replayed once.
    pub same_run_as: Option<String>,
    /// Whether its run allocates what was live at the start afresh: a setting of the other kind of memory than a
    /// recording begun mid-run (expandable segments turned on or off), which cannot know the fragmentation the program
    /// built before the recording, so its figures may be too low. Ranked after the settings of the recording's kind,
    /// and never the answer: [`Advice::answer`] names it as worth a recording from the start.
    pub start_afresh: bool,
    /// Whether the row's start holds more than the device of the advice ([`start_reserved_bytes`]: the recording began
    /// with more reserved, or a what-if of the other kind of memory allocating it afresh takes more): no device of that
    /// size ran it, so the row does not fit there whatever its replay refused (it replays the start state regardless).
    pub start_exceeds_capacity: bool,
}

impl SettingAdvice {
    /// Whether it fits the device of the advice: nothing refused, and the recording's start held within it.
    pub fn fits(&self) -> bool {
        self.ooms == 0 && !self.start_exceeds_capacity
    }
}

/// The advice for one recording. See the module documentation.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Advice {
    /// The device's capacity (`None`: unknown).
    pub capacity_bytes: Option<u64>,
    /// Where it comes from.
    pub capacity_from: CapacityFrom,
    /// The recording's own settings, as `PYTORCH_CUDA_ALLOC_CONF`: the string it recorded where that is the settings in
    /// effect, else those (`""`: PyTorch's defaults).
    pub recorded_setting: String,
    /// Bytes live before the recording's first entry (a recording begun mid-run is advised from its rebuilt start
    /// state).
    pub start_live_bytes: u64,
    /// Needs closer than this to the least are one need, ranked by peak reserved (see [`Advice::settings`]).
    pub tie_bytes: u64,
    /// Every setting, best first.
    pub settings: Vec<SettingAdvice>,
}

impl Advice {
    /// The best PyTorch setting (not `paged`).
    pub fn best(&self) -> Option<&SettingAdvice> {
        self.settings.iter().find(|advice| advice.setting != PAGED)
    }

    /// The recording's own settings' row.
    pub fn recorded(&self) -> Option<&SettingAdvice> {
        self.settings.iter().find(|advice| advice.as_recorded)
    }

    /// The answer: the setting to paste and why, in one sentence; then, where they apply, what else to set for it
    /// (garbage collection needs a memory fraction) and a setting of the other kind of memory that might do better on
    /// a recording begun mid-run ([`Advice::afresh_hint`]).
    pub fn answer(&self) -> String {
        let mut answer = self.answer_sentence();
        if self.answered().is_some_and(|row| {
            row.setting.contains("garbage_collection_threshold") && !row.setting.contains("per_process_memory_fraction")
        }) {
            answer.push_str(
                " Garbage collection acts only under a memory fraction: set one too \
                 (`torch.cuda.set_per_process_memory_fraction`, or `per_process_memory_fraction` in the string from \
                 PyTorch 2.10 on); the replay takes the device's capacity for it.",
            );
        }
        if let Some(hint) = self.afresh_hint() {
            answer.push(' ');
            answer.push_str(&hint);
        }
        answer
    }

    /// On a recording begun mid-run, a setting of the other kind of memory ([`SettingAdvice::start_afresh`]) that fits
    /// where the best does not, reserves less, or needs less: not the answer, since its start state is a guess, but
    /// named with how to find out.
    pub fn afresh_hint(&self) -> Option<String> {
        let best = self.best()?;
        let afresh = self.settings.iter().find(|row| row.start_afresh && row.setting != PAGED)?;
        // Better by more than the needs' tie, as the ranking tells needs apart.
        let less = |a: u64, b: u64| a.saturating_add(self.tie_bytes) < b;
        let reserves_less = less(afresh.peak_reserved_bytes, best.peak_reserved_bytes);
        let better = match self.capacity_bytes {
            Some(_) => afresh.fits() && (!best.fits() || reserves_less),
            None => match (afresh.min_capacity_bytes, best.min_capacity_bytes) {
                (Some(afresh_need), Some(best_need)) => {
                    less(afresh_need, best_need) || (!less(best_need, afresh_need) && reserves_less)
                }
                (Some(_), None) => true,
                (None, _) => false,
            },
        };
        if !better {
            return None;
        }
        let peak = Bytes(afresh.peak_reserved_bytes);
        let needs = match (self.capacity_bytes, afresh.min_capacity_bytes) {
            (Some(capacity), _) if afresh.fits() => format!("fits in {}, peak reserved {peak}", Bytes(capacity)),
            (_, Some(bytes)) if bytes > afresh.peak_reserved_bytes => format!(
                "needs {}, what the recording held at its start, though its own run reserves at most {peak}",
                BytesAtLeast(bytes)
            ),
            (_, Some(bytes)) => format!("needs {}, peak reserved {peak}", BytesAtLeast(bytes)),
            (_, None) => format!("fits on no device, peak reserved {peak}"),
        };
        let mut conf = AllocConf::default();
        let turned = if conf.parse_overrides(&afresh.setting).is_ok() && conf.expandable_segments { "on" } else { "off" };
        Some(format!(
            "{} might do better ({needs}): it turns expandable segments {turned}, and on a recording \
             begun mid-run such a setting allocates what was live at the start afresh, without the fragmentation the \
             program built before, so its figures can be too low. A recording of the whole run tells \
             (`torch.cuda.memory._record_memory_history(max_entries=N)` with N above the run's allocations and frees).",
            paste(&afresh.setting),
        ))
    }

    /// The setting the answer names: the best, or where none fits the device the one that needs least.
    pub fn answered(&self) -> Option<&SettingAdvice> {
        let best = self.best()?;
        match self.capacity_bytes {
            Some(_) if !best.fits() => self.least_need().map(|(_, row)| row),
            _ => Some(best),
        }
    }

    /// The PyTorch setting that needs the least memory, of the recording's kind ([`SettingAdvice::start_afresh`]), with
    /// the least need of any: of those within a tie of the least (what the search for a need tells apart), the first
    /// ranked (the fewest refusals on the device), whose own need may be up to the tie more.
    fn least_need(&self) -> Option<(u64, &SettingAdvice)> {
        let needs = || {
            self.settings
                .iter()
                .filter(|row| row.setting != PAGED && !row.start_afresh)
                .filter_map(|row| row.min_capacity_bytes.map(|bytes| (bytes, row)))
        };
        let least = needs().map(|(bytes, _)| bytes).min()?;
        needs().find(|(bytes, _)| *bytes <= least.saturating_add(self.tie_bytes)).map(|(_, row)| (least, row))
    }

    /// The answer in one sentence: the setting to paste and why.
    fn answer_sentence(&self) -> String {
        let (Some(best), Some(recorded)) = (self.best(), self.recorded()) else {
            return "No setting replayed.".to_owned();
        };
        // The recorded settings are quoted as the file records them (a setting of the grid may equal them in effect,
        // with keys that change nothing here).
        let best_paste = paste(if best.as_recorded { &self.recorded_setting } else { &best.setting });
        let below = |row: &SettingAdvice| match recorded.peak_reserved_bytes.checked_sub(row.peak_reserved_bytes) {
            Some(0) | None => String::new(),
            Some(saved) => format!(", {} below the recorded settings'", Bytes(saved)),
        };
        let devices = |row: &SettingAdvice| counted(row.device_allocs, "device allocation", "device allocations");
        // The rows of the other kind of memory (`~`) rank after the recording's kind: what the sentence says of "no
        // setting" is said of the recording's kind, and the hint after it may name one of the other.
        let kind = if self.settings.iter().any(|row| row.start_afresh) { " of the recording's kind of memory" } else { "" };
        match self.capacity_bytes {
            Some(capacity) if !best.fits() => match self.least_need() {
                Some((least, row)) => format!(
                    "No setting{kind} fits in {}: {}, needs {}{}{}.",
                    Bytes(capacity),
                    // Another may need a little less, within what the search tells apart: said so, not "the least".
                    match row.min_capacity_bytes {
                        Some(need) if need > least => format!(
                            "of those that need least (within {} of {}, what the search for a need tells apart), the one \
                             ranked first, {}",
                            Bytes(self.tie_bytes),
                            BytesAtLeast(least),
                            paste(&row.setting)
                        ),
                        _ => format!("the one that needs least, {}", paste(&row.setting)),
                    },
                    need_words(row),
                    retries_words(row).map(|words| format!("; {words}")).unwrap_or_default(),
                    fewer_refusals(row, recorded, capacity).map(|words| format!("; {words}")).unwrap_or_default()
                ),
                None => format!("No setting{kind} fits in {}, nor on any device.", Bytes(capacity)),
            },
            Some(capacity) => {
                let fits = format!(
                    "{best_paste} — fits in {} (peak reserved {}{}), {}",
                    Bytes(capacity),
                    Bytes(best.peak_reserved_bytes),
                    below(best),
                    devices(best)
                );
                match &recorded.first_oom {
                    Some(oom) if !best.as_recorded => format!(
                        "{fits}; the recorded settings ran out of memory at entry {} ({}): {}",
                        oom.event_index,
                        oom.verdict.name(),
                        oom.message
                    ),
                    _ if best.as_recorded => {
                        format!("Keep the recorded settings: {fits}; no other setting{kind} that fits reserves less.")
                    }
                    _ => format!("{fits}."),
                }
            }
            // Unlimited memory refused a request (larger than any device): no need to name.
            None if best.min_capacity_bytes.is_none() => match &best.first_oom {
                Some(oom) => format!(
                    "No setting serves every request, on any device: {best_paste} ran out of memory at entry {} ({}): {}",
                    oom.event_index,
                    oom.verdict.name(),
                    oom.message
                ),
                None => "No setting serves every request, on any device.".to_owned(),
            },
            None => {
                let need = need_words(best);
                let line = format!(
                    "{best_paste} — needs {need} (peak reserved {}{}), {}{}",
                    Bytes(best.peak_reserved_bytes),
                    below(best),
                    devices(best),
                    retries_words(best).map(|words| format!("; {words}")).unwrap_or_default()
                );
                if best.as_recorded {
                    format!(
                        "Keep the recorded settings: {}; no other setting{kind} needs less by {} or more, and none that \
                         needs about as much reserves less at its peak.",
                        line,
                        Bytes(self.tie_bytes)
                    )
                } else {
                    format!("{line}.")
                }
            }
        }
    }
}

/// What `row` needs, in words: its least capacity, and a larger one where it failed again when it is not monotone
/// (the table's `(!)`).
fn need_words(row: &SettingAdvice) -> String {
    match (row.min_capacity_bytes, row.fails_again_at_bytes) {
        (None, _) => "no device".to_owned(),
        (Some(bytes), Some(again)) if !row.monotone => format!(
            "{} (but it ran out of memory again at {}: more memory changed its decisions, so leave room)",
            BytesAtLeast(bytes),
            Bytes(again)
        ),
        (Some(bytes), _) => BytesAtLeast(bytes).to_string(),
    }
}

/// Where `row` refuses fewer requests than the `recorded` settings on the device of `capacity_bytes`: how many each.
fn fewer_refusals(row: &SettingAdvice, recorded: &SettingAdvice, capacity_bytes: u64) -> Option<String> {
    (row.ooms < recorded.ooms && !row.as_recorded && !row.start_exceeds_capacity).then(|| {
        format!(
            "in {} it refuses {} where the recorded settings refuse {}",
            Bytes(capacity_bytes),
            counted(row.ooms, "request", "requests"),
            recorded.ooms
        )
    })
}

/// What running at `row`'s need costs, when PyTorch retries a `cudaMalloc` there ([`SettingAdvice::retries_at_need`]).
fn retries_words(row: &SettingAdvice) -> Option<String> {
    let (Some(need), Some(retries @ 1..)) = (row.min_capacity_bytes, row.retries_at_need) else { return None };
    Some(format!(
        "on {} PyTorch frees its cache and retries a failed cudaMalloc {}, each waiting for the device",
        BytesAtLeast(need),
        counted(retries, "time", "times")
    ))
}

/// What to paste for `setting`.
pub fn paste(setting: &str) -> String {
    if setting.is_empty() {
        "PYTORCH_CUDA_ALLOC_CONF unset (PyTorch's defaults)".to_owned()
    } else {
        format!("PYTORCH_CUDA_ALLOC_CONF={setting}")
    }
}

/// What [`advise`] does.
#[derive(Clone, Debug)]
pub struct AdviseConfig {
    /// The device's capacity; `None`: what the recording tells ([`Capacity::of`]), else unknown.
    pub capacity_bytes: Option<u64>,
    /// The settings to try ([`grid`] by default); the recording's own are added when missing.
    pub settings: Vec<String>,
    /// Settings replayed at once.
    pub threads: usize,
}

impl Default for AdviseConfig {
    fn default() -> Self {
        Self { capacity_bytes: None, settings: grid(), threads: std::thread::available_parallelism().map_or(1, usize::from) }
    }
}

/// One row to replay: a PyTorch setting, or the paging allocator.
#[derive(Clone, Debug)]
#[expect(clippy::large_enum_variant, reason = "a few dozen rows, each built once per advice")]
enum Row {
    Pytorch { setting: String, conf: AllocConf },
    Paged,
}

/// Replays `recording` under every setting of `config` and ranks them. `progress` hears each setting as it is done
/// (done, of how many), one call at a time and in order (the settings replay on `config.threads` threads).
///
/// # Errors
/// A setting PyTorch would refuse (named), or a recording the emulation cannot replay.
pub fn advise(recording: &Recording, config: &AdviseConfig, progress: &(dyn Fn(usize, usize) + Sync)) -> Result<Advice> {
    advise_until(recording, config, progress, &AtomicBool::new(false))?
        .ok_or_else(|| heapscope_core::Error::InvalidConfig { what: "the advice was cancelled".to_owned() })
}

/// [`advise`] until `cancelled` is set: no setting starts its replay after that (those replaying finish theirs), and
/// the answer is `None`. For a caller that may give the advice up (the app, when another recording opens: a large
/// recording's grid takes minutes).
pub fn advise_until(
    recording: &Recording,
    config: &AdviseConfig,
    progress: &(dyn Fn(usize, usize) + Sync),
    cancelled: &AtomicBool,
) -> Result<Option<Advice>> {
    let Capacity { bytes: capacity_bytes, from: capacity_from } = Capacity::of(config.capacity_bytes, recording);
    let recorded_conf = alloc_conf(recording, None)?;
    // The string the file records where it is the settings in effect; else (a file that records none, or a string the
    // recorded keys contradict: `caveats::settings_string_not_in_effect`) the settings the replay runs with.
    let recorded_setting = match recording.snapshot.as_ref().and_then(|snapshot| snapshot.settings.as_ref()) {
        Some(settings) if AllocConf::recorded_string_in_effect(settings) => settings.alloc_conf.clone(),
        _ => recorded_conf.overrides(),
    };
    let mut rows = Vec::with_capacity(config.settings.len() + 2);
    for setting in &config.settings {
        let setting = with_recorded_budget(setting, &recorded_conf);
        let mut conf = AllocConf::default();
        conf.parse_overrides(&setting)
            .map_err(|error| heapscope_core::Error::InvalidConfig { what: format!("setting {setting:?}: {error}") })?;
        rows.push(Row::Pytorch { setting, conf });
    }
    if !rows.iter().any(|row| matches!(row, Row::Pytorch { conf, .. } if *conf == recorded_conf)) {
        rows.push(Row::Pytorch { setting: recorded_setting.clone(), conf: recorded_conf.clone() });
    }
    rows.push(Row::Paged);
    // Rows the recording cannot tell apart replay once: each row's run is that of the rows with the same settings in
    // effect that is the recording's own settings where one is, else the one with the fewest keys (the first of those):
    // the others are its copies, the settings that change nothing here, ranked below it.
    let in_effect: Vec<Option<AllocConf>> = rows
        .iter()
        .map(|row| match row {
            Row::Pytorch { conf, .. } => Some(settings_in_effect(conf, largest_block_bound_of(recording, conf))),
            Row::Paged => None,
        })
        .collect();
    let source_key = |index: usize| match &rows[index] {
        Row::Pytorch { setting, conf } => (*conf != recorded_conf, items_of(setting).len(), index),
        Row::Paged => (true, usize::MAX, index),
    };
    let run_of: Vec<usize> = (0..rows.len())
        .map(|index| match &in_effect[index] {
            Some(conf) => (0..rows.len())
                .filter(|&other| in_effect[other].as_ref() == Some(conf))
                .min_by_key(|&other| source_key(other))
                .unwrap_or(index),
            None => index,
        })
        .collect();
    let runs: Vec<usize> = (0..rows.len()).filter(|&index| run_of[index] == index).collect();
    let done = AtomicUsize::new(0);
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<SettingAdvice>>>> = Mutex::new(vec![None; rows.len()]);
    std::thread::scope(|scope| {
        for _ in 0..config.threads.clamp(1, runs.len()) {
            scope.spawn(|| {
                while !cancelled.load(Ordering::Relaxed)
                    && let Some(&index) = runs.get(next.fetch_add(1, Ordering::Relaxed))
                {
                    let advice = advise_row(recording, &rows[index], capacity_bytes, &recorded_conf);
                    // Told under the lock, so that `progress` hears counts in order.
                    let mut results = results.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    results[index] = Some(advice);
                    let same = run_of.iter().filter(|&&run| run == index).count();
                    progress(done.fetch_add(same, Ordering::Relaxed) + same, rows.len());
                }
            });
        }
    });
    if cancelled.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let results = results.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut settings = Vec::with_capacity(rows.len());
    for (index, row) in rows.iter().enumerate() {
        let run = run_of[index];
        match (&results[run], row) {
            (Some(Ok(advice)), _) if run == index => settings.push(advice.clone()),
            (Some(Ok(advice)), Row::Pytorch { setting, conf }) => {
                // The same decisions and counters; named for this row, its fidelity kept only if it is no what-if.
                let what_if = *conf != recorded_conf;
                settings.push(SettingAdvice {
                    setting: setting.clone(),
                    as_recorded: !what_if,
                    figures: Figures {
                        policy: setting.clone(),
                        settings: Some(conf.overrides()),
                        what_if,
                        fidelity: advice.figures.fidelity.filter(|_| !what_if),
                        ..advice.figures.clone()
                    },
                    same_run_as: Some(advice.setting.clone()),
                    ..advice.clone()
                });
            }
            (Some(Err(error)), _) => return Err(error.clone()),
            _ => {}
        }
    }
    let tie_bytes = rank(&mut settings, capacity_bytes.is_some());
    Ok(Some(Advice {
        capacity_bytes,
        capacity_from,
        recorded_setting,
        start_live_bytes: recording.start_bytes(),
        tie_bytes,
        settings,
    }))
}

/// `setting` with the keys of `recorded` no setting of the grid varies — the share of the device
/// (`per_process_memory_fraction`) and `max_non_split_rounding_mb` — where the recording sets them and `setting` does
/// not: what one changes is how the allocator uses its memory, not how much of the device it may take (advising
/// `expandable_segments:True` on the whole device to a run that had 90 % of it would credit the setting with the other
/// 10 %). Written into the string, so that a row pasted is the same run.
fn with_recorded_budget(setting: &str, recorded: &AllocConf) -> String {
    let kept = [
        (
            "per_process_memory_fraction",
            AllocConf { per_process_memory_fraction: recorded.per_process_memory_fraction, ..AllocConf::default() },
        ),
        (
            "max_non_split_rounding_mb",
            AllocConf { max_non_split_rounding: recorded.max_non_split_rounding, ..AllocConf::default() },
        ),
    ];
    let items = items_of(setting);
    let sets = |name: &str| items.iter().any(|item| item.split(':').next().map(str::trim) == Some(name));
    let added: Vec<String> = kept
        .into_iter()
        .map(|(name, conf)| (name, conf.overrides()))
        .filter(|(name, key)| !key.is_empty() && !sets(name))
        .map(|(_, key)| key)
        .collect();
    if added.is_empty() {
        return setting.to_owned();
    }
    items.into_iter().map(str::to_owned).chain(added).collect::<Vec<_>>().join(",")
}

/// Orders the PyTorch settings best first and numbers them from 1: those that replay the recording's start state as
/// it was before those that allocate it afresh ([`SettingAdvice::start_afresh`]); then with a capacity, those that fit
/// first, by peak reserved, then driver time; without, by the smallest capacity they need (none last), then peak
/// reserved and driver time. `paged`, no setting one can paste, comes last, unranked (0): what a paging allocator
/// would need. Returns the needs' tie: needs closer than that to the least are one need.
fn rank(settings: &mut [SettingAdvice], capacity_known: bool) -> u64 {
    // Needs are found on a grid (`min_capacity`'s grain, which grows with the run's peak), and an expandable segment
    // grows by 20 MiB pages: needs within two steps of the coarsest grid, and at least a page, of the least need
    // (of rows alike in `start_afresh`) are the same need, and the peak reserved decides.
    let largest = settings.iter().filter_map(|advice| advice.min_capacity_bytes).max().unwrap_or(0);
    let tie_bytes = grain_bytes(largest).saturating_mul(2).max(LARGE_BUFFER_BYTES);
    // On a known device, the least need of those that do not fit it (the others need no more than the device).
    let least = |afresh: bool| {
        settings
            .iter()
            .filter(|advice| advice.setting != PAGED && advice.start_afresh == afresh && !(capacity_known && advice.fits()))
            .filter_map(|advice| advice.min_capacity_bytes)
            .min()
            .unwrap_or(0)
    };
    let least_need = [least(false), least(true)];
    settings.sort_by(|a, b| {
        let key = |advice: &SettingAdvice| {
            // On a known device the settings that fit rank by peak reserved; those that do not, by what they need,
            // then by the requests they refuse there.
            let need = match advice.min_capacity_bytes {
                _ if capacity_known && advice.fits() => 0,
                None => u64::MAX,
                Some(bytes) if bytes <= least_need[usize::from(advice.start_afresh)].saturating_add(tie_bytes) => 0,
                Some(bytes) => bytes,
            };
            let fits = !capacity_known || advice.fits();
            (advice.setting == PAGED, advice.start_afresh, !fits, need, advice.ooms, advice.peak_reserved_bytes)
        };
        // Alike in all that (the same run, a key that changes nothing here): the recorded settings, then the fewest keys
        // to set, rather than the order they were given in.
        let keys = |advice: &SettingAdvice| items_of(&advice.setting).len();
        key(a)
            .cmp(&key(b))
            .then(a.driver_time_us.total_cmp(&b.driver_time_us))
            .then(b.as_recorded.cmp(&a.as_recorded))
            .then(keys(a).cmp(&keys(b)))
    });
    // Each copy (`(=)`, the same run as another row) right below the run it names: alike in every figure, it would
    // otherwise be ranked among other runs alike in them.
    let order: Vec<usize> = {
        let is_copy = |advice: &SettingAdvice| advice.same_run_as.is_some();
        let mut order = Vec::with_capacity(settings.len());
        for (index, run) in settings.iter().enumerate().filter(|(_, advice)| !is_copy(advice)) {
            order.push(index);
            order.extend((0..settings.len()).filter(|&copy| settings[copy].same_run_as.as_deref() == Some(run.setting.as_str())));
        }
        // A copy of no row here (none is made so) keeps its place at the end.
        let orphans: Vec<usize> = (0..settings.len()).filter(|index| !order.contains(index)).collect();
        order.extend(orphans);
        order
    };
    let sorted: Vec<SettingAdvice> = order.iter().map(|&index| settings[index].clone()).collect();
    settings.clone_from_slice(&sorted);
    for (rank, advice) in (1..).zip(settings.iter_mut()) {
        advice.rank = if advice.setting == PAGED { 0 } else { rank };
    }
    tie_bytes
}

/// The largest block a run of `conf` on `recording` can hold (`None`: unbounded), for
/// [`settings_in_effect`]: a snapshot's ([`largest_block_bound`]), else from a plain trace's requests (its caching
/// heap starts empty).
fn largest_block_bound_of(recording: &Recording, conf: &AllocConf) -> Option<u64> {
    match &recording.snapshot {
        Some(snapshot) => largest_block_bound(snapshot, recording.device, conf),
        None if conf.expandable_segments => None,
        None => Some(
            recording
                .trace
                .events()
                .iter()
                .filter_map(|event| match *event {
                    Event::Alloc { size_bytes, .. } => Some(get_allocation_size(round_size(size_bytes, conf))),
                    Event::Free { .. } | Event::EmptyCache => None,
                })
                .max()
                .unwrap_or(0),
        ),
    }
}

/// The advice of one row: its run on the device of the advice, and its smallest capacity.
fn advise_row(recording: &Recording, row: &Row, capacity_bytes: Option<u64>, recorded: &AllocConf) -> Result<SettingAdvice> {
    if let Row::Pytorch { setting, conf } = row
        && let Some(fraction) = conf.per_process_memory_fraction
        && !conf.expandable_segments
    {
        // The allocator sees the device only through its share (`AllocConf::allowed_bytes`): the row is the setting
        // without the fraction on a device of that share, and a capacity it needs is that need over the fraction. (Not
        // with expandable segments: under a fraction PyTorch refuses their request by its whole segment size before
        // mapping the pages it needs, which a device of the share alone does not do; see `gated` below.)
        let alone =
            Row::Pytorch { setting: setting.clone(), conf: AllocConf { per_process_memory_fraction: None, ..conf.clone() } };
        let mut advice = advise_row(recording, &alone, conf.allowed_bytes(capacity_bytes), recorded)?;
        // The smallest device whose share holds `share`; none past the largest device heapscope models.
        let device_for = |share: u64| {
            let bytes = (share as f64 / fraction).ceil();
            if bytes > LARGEST_DEVICE_BYTES as f64 {
                return None;
            }
            let mut bytes = bytes as u64;
            while conf.allowed_bytes(Some(bytes)).is_some_and(|allowed| allowed < share) {
                bytes += 1;
            }
            (bytes <= LARGEST_DEVICE_BYTES).then_some(bytes)
        };
        advice.min_capacity_bytes = advice.min_capacity_bytes.and_then(device_for);
        advice.fails_again_at_bytes = advice.fails_again_at_bytes.and_then(device_for);
        advice.as_recorded = conf == recorded;
        return Ok(advice);
    }
    // Without a capacity, the largest device heapscope models: a recorded `oom` entry is then tried with all that room,
    // not the driver's free bytes it recorded.
    let device = capacity_bytes.unwrap_or(LARGEST_DEVICE_BYTES);
    // Expandable segments under a memory fraction (or garbage collection, taken to have set one): a request is refused
    // by its whole segment size against the share before the pages it needs are mapped, a read of the capacity beyond
    // what the run reserves. The run's copies, which a probe resumes from as long as the run never reserved past the
    // probe's capacity, do not hold then: every probe replays from the start, on the device itself (not a device of the
    // share), and the run's peak says nothing of the device it fits.
    let gated = matches!(row, Row::Pytorch { conf, .. }
        if conf.expandable_segments && (conf.per_process_memory_fraction.is_some() || conf.garbage_collection_threshold > 0.0));
    // The run without a limit bounds the search, and a snapshot's probes resume from copies of it (see `Checkpoints`):
    // with no capacity it is the row's own run, which keeps the copies; else a lean run that keeps them; else (a
    // plain trace) one more run.
    let (setting, as_recorded, (figures, driver_time_us), checkpoints, unlimited) = match row {
        Row::Pytorch { setting, conf } => {
            let copy_every = recording
                .snapshot
                .as_ref()
                .filter(|_| capacity_bytes.is_none() && !gated)
                .map(|snapshot| Checkpoints::every(recording, snapshot));
            let (run, copies) = pytorch_run(recording, setting, conf, device, copy_every)?;
            let (checkpoints, unlimited) = match (copies, &recording.snapshot) {
                (Some(copies), _) => (Some(Checkpoints::new(recording, copies.saved, conf)), Unlimited::of(&run.0)),
                (None, Some(snapshot)) if !gated => {
                    let (checkpoints, end) = Checkpoints::of(recording, snapshot, conf)?;
                    (Some(checkpoints), Unlimited::of_stats(&end))
                }
                (None, _) if capacity_bytes.is_none() => (None, Unlimited::of(&run.0)),
                (None, _) => (None, Unlimited::of(&pytorch_run(recording, setting, conf, LARGEST_DEVICE_BYTES, None)?.0.0)),
            };
            (setting.clone(), conf == recorded, run, checkpoints, unlimited)
        }
        Row::Paged => {
            let run = paged_run(recording, device)?;
            let unlimited = match capacity_bytes {
                None => Unlimited::of(&run.0),
                Some(_) => Unlimited::of(&paged_run(recording, LARGEST_DEVICE_BYTES)?.0),
            };
            (PAGED.to_owned(), false, run, None, unlimited)
        }
    };
    // PyTorch's allocator holds the segments of a recording begun mid-run from the start (a what-if of the other kind
    // of memory, what was live then allocated afresh): a smaller device never held them.
    let start = match row {
        Row::Pytorch { conf, .. } => start_reserved_bytes(recording, conf),
        Row::Paged => 0,
    };
    let fits = |capacity: u64| -> Result<bool> {
        if capacity < start {
            return Ok(false);
        }
        match (row, &checkpoints) {
            (Row::Pytorch { .. }, Some(saved)) => Ok(saved.fits(capacity)),
            (Row::Pytorch { conf, .. }, None) => Ok(first_refusal(recording, conf, Some(capacity))?.is_none()),
            (Row::Paged, _) => Ok(paged_run(recording, capacity)?.0.ooms == 0),
        }
    };
    // Only garbage collection, and a fraction's refusal of an expandable request by its segment size, read the capacity
    // before the allocator reaches it.
    let ceiling_fits = match row {
        Row::Pytorch { conf, .. } => conf.garbage_collection_threshold == 0.0 && !gated,
        Row::Paged => true,
    };
    // The device whose share holds the run's peak (the device itself without a fraction).
    let device_of_share = |share: u64| match row {
        Row::Pytorch { conf, .. } if gated => {
            let fraction = conf.per_process_memory_fraction.unwrap_or(1.0).clamp(f64::MIN_POSITIVE, 1.0);
            ((share as f64 / fraction).ceil() as u64).min(LARGEST_DEVICE_BYTES)
        }
        _ => share,
    };
    let search = if unlimited.ooms == 0 {
        // A what-if of the other kind of memory may reserve less than the recording held at its start: never below it.
        min_capacity(
            unlimited.allocated_peak_bytes.max(start),
            device_of_share(unlimited.reserved_peak_bytes.max(start)),
            ceiling_fits,
            &fits,
        )?
    } else {
        None
    };
    let (min_capacity_bytes, fails_again_at_bytes) = match search {
        Some((need, None)) => (Some(need), fails_again_above(need, capacity_bytes, figures.ooms, &fits)?),
        Some((need, fails_again)) => (Some(need), fails_again),
        None => (None, None),
    };
    let monotone = fails_again_at_bytes.is_none();
    let retries_at_need = match (row, min_capacity_bytes) {
        (Row::Pytorch { setting, conf }, Some(need)) => Some(match &checkpoints {
            Some(saved) => saved.retries(need),
            None => {
                let ((run, _), _) = pytorch_run(recording, setting, conf, need, None)?;
                run.memory_stats.map_or(0, |stats| u64::try_from(stats.num_alloc_retries).unwrap_or(0))
            }
        }),
        _ => None,
    };
    Ok(SettingAdvice {
        setting,
        as_recorded,
        peak_reserved_bytes: figures.peak_reserved_bytes,
        peak_live_bytes: figures.peak_live_bytes,
        device_allocs: figures.device_allocs,
        device_frees: figures.device_frees,
        driver_time_us,
        ooms: figures.ooms,
        first_oom: figures.first_oom.clone(),
        figures,
        min_capacity_bytes,
        monotone,
        fails_again_at_bytes,
        retries_at_need,
        rank: 0,
        same_run_as: None,
        start_afresh: matches!(row, Row::Pytorch { conf, .. } if starts_afresh(recording, conf)),
        start_exceeds_capacity: capacity_bytes.is_some_and(|capacity| capacity < start),
    })
}

/// The grid of [`min_capacity`] under a ceiling of `ceiling_bytes`: [`CAPACITY_STEP_BYTES`] or a 1/1024 of the
/// ceiling, whichever is coarser.
fn grain_bytes(ceiling_bytes: u64) -> u64 {
    (ceiling_bytes / 1024).next_multiple_of(CAPACITY_STEP_BYTES).max(CAPACITY_STEP_BYTES)
}

/// The smallest capacity at which `fits`, by bisection between `floor` (the peak of bytes handed out: nothing below
/// it fits) and `ceiling` (the peak reserved without a limit), galloping up from the floor then bisecting, on a grid of
/// [`CAPACITY_STEP_BYTES`] or a 1/1024 of the
/// ceiling, whichever is coarser; and a larger capacity at which it fails again, if one of the two tried above it
/// does (one grid step above, and half-way to the ceiling). `ceiling_fits`: a run that never reaches its capacity
/// decides as without one, so the ceiling fits unless something else reads the capacity (garbage collection's
/// threshold); otherwise the ceiling itself is tried: where it fits it bounds the answer, where it fails the grid point
/// above it is doubled until one fits. `None` when nothing up to an unlimited device fits.
fn min_capacity(
    floor: u64,
    ceiling: u64,
    ceiling_fits: bool,
    fits: &dyn Fn(u64) -> Result<bool>,
) -> Result<Option<(u64, Option<u64>)>> {
    let grain = grain_bytes(ceiling);
    // A run that reads the capacity before it reaches it (garbage collection) may fail at its own peak reserved: that
    // is tried first, and where it fits it bounds the answer as for any other run (else the answer could be the grid
    // step above a ceiling off the grid, more than a device the run fits).
    let bounded = ceiling_fits || fits(ceiling)?;
    let mut high = ceiling.div_ceil(grain).max(1);
    if !bounded {
        while !fits(high * grain)? {
            high *= 2;
            if high * grain >= LARGEST_DEVICE_BYTES {
                return Ok(None);
            }
        }
    }
    let mut low = (floor / grain).min(high - 1);
    let found = if low > 0 && fits(low * grain)? {
        low
    } else {
        // `low` fails (or is 0), `high` fits. Gallop up from the floor first: the answer usually lies just above the
        // peak of live bytes, far below the peak reserved without a limit, and a probe that fails stops at its first
        // refusal where one that fits replays to the end.
        let mut stride = 1;
        while low + stride < high {
            if fits((low + stride) * grain)? {
                high = low + stride;
                break;
            }
            low += stride;
            stride *= 2;
        }
        while high - low > 1 {
            let middle = low + (high - low) / 2;
            if fits(middle * grain)? {
                high = middle;
            } else {
                low = middle;
            }
        }
        high
    } * grain;
    // The grid step above the ceiling is no need: the ceiling itself fits (a run that never reaches its capacity decides
    // as without one).
    let found = if bounded { found.min(ceiling) } else { found };
    let halfway = (found + ceiling.saturating_sub(found) / 2) / grain * grain;
    for capacity in [found + grain, halfway] {
        if capacity > found && (capacity < ceiling || !ceiling_fits) && !fits(capacity)? {
            return Ok(Some((found, Some(capacity))));
        }
    }
    Ok(Some((found, None)))
}

/// A capacity above `need` (where the search found none) at which the row fails again, found without another search:
/// the device of the advice (`capacity_bytes`), where the row's own run there refused (`ooms`); else the need as shown,
/// rounded up to two decimals (what one pastes as `--capacity`), where it fails. The search tries two capacities above
/// its answer; fitting need not be monotone between them, and these two are the ones a user meets.
fn fails_again_above(
    need: u64,
    capacity_bytes: Option<u64>,
    ooms: u64,
    fits: &dyn Fn(u64) -> Result<bool>,
) -> Result<Option<u64>> {
    if let Some(capacity) = capacity_bytes
        && ooms > 0
        && capacity >= need
    {
        return Ok(Some(capacity));
    }
    let shown = parse_size(&BytesAtLeast(need).to_string()).unwrap_or(need);
    Ok((shown > need && !fits(shown)?).then_some(shown))
}

/// What the run of a row without a limit bounds its search with: below the peak of bytes the allocator hands out
/// nothing fits, the peak reserved does (unless it refused requests even so).
struct Unlimited {
    allocated_peak_bytes: u64,
    reserved_peak_bytes: u64,
    ooms: u64,
}

impl Unlimited {
    /// From a run's figures (a heap's peak allocated is its peak live).
    fn of(figures: &Figures) -> Self {
        let allocated_peak_bytes = match &figures.memory_stats {
            Some(stats) => u64::try_from(stats.allocated_bytes.all().peak).unwrap_or(0),
            None => figures.peak_live_bytes,
        };
        Self { allocated_peak_bytes, reserved_peak_bytes: figures.peak_reserved_bytes, ooms: figures.ooms }
    }

    /// From PyTorch's counters at the end of a run.
    fn of_stats(stats: &MemoryStats) -> Self {
        let count = |value: i64| u64::try_from(value).unwrap_or(0);
        Self {
            allocated_peak_bytes: count(stats.allocated_bytes.all().peak),
            reserved_peak_bytes: count(stats.reserved_bytes.all().peak),
            ooms: count(stats.num_ooms),
        }
    }
}

/// Copies of a PyTorch setting's emulation on an unlimited device, taken every so many entries, each with the most it
/// had asked the capacity about so far ([`Emulator::capacity_read_up_to`]: its peak reserved, transient peaks
/// included, and what a request tried on a copy reserved). On a device of C the run is the same up to the first
/// request that would take it past C (with garbage collection, past its threshold times C, where collecting starts),
/// so a probe at C resumes from the last copy that never went past that instead of replaying from the start (the
/// first copy, the start state, is always one: rebuilding it reads no capacity). The searches' probes near the
/// threshold skip most of the recording's beginning, and every one skips rebuilding the start state.
struct Checkpoints<'s> {
    saved: Vec<(u64, Emulator<'s>)>,
    /// `garbage_collection_threshold` (0: off).
    gc_threshold: f64,
    /// What PyTorch held reserved at the start of the recording ([`crate::capacity::reserved_at_start`]): no smaller
    /// device ran it. A what-if of the other kind of memory, which allocates that start afresh, may take more: the
    /// first copy's read capacity is that (each probe takes the larger of the two).
    start_floor_bytes: u64,
    /// The probes run so far, by capacity: the search asks some capacities twice (a grid step above its answer, and
    /// the answer's retries), and a probe that fits replays to the end.
    probed: RefCell<heapscope_core::hash::FastMap<u64, Option<Probe>>>,
}

/// What a probe of [`Checkpoints`] found: whether the run refused a request, and its `cudaMalloc` retries up to the end
/// or that refusal.
#[derive(Clone, Copy, Debug)]
struct Probe {
    refused: bool,
    retries: u64,
}

/// Copies kept along the run.
const CHECKPOINTS: usize = 32;

impl<'s> Checkpoints<'s> {
    /// The copies `saved` of `recording`'s run with `conf`.
    fn new(recording: &Recording, saved: Vec<(u64, Emulator<'s>)>, conf: &AllocConf) -> Self {
        Self {
            saved,
            gc_threshold: conf.garbage_collection_threshold,
            start_floor_bytes: crate::capacity::reserved_at_start(recording),
            probed: RefCell::default(),
        }
    }

    /// How many entries apart the copies of `recording`'s run are.
    fn every(recording: &Recording, snapshot: &Snapshot) -> usize {
        let entries = snapshot.device_traces.get(recording.device).map_or(0, Vec::len);
        (entries / CHECKPOINTS).max(1)
    }

    /// The run of `conf` on `recording` (whose snapshot is `snapshot`) without a limit, copied along the way, and
    /// PyTorch's counters at its end.
    fn of(recording: &Recording, snapshot: &'s Snapshot, conf: &AllocConf) -> Result<(Self, MemoryStats)> {
        let mut emulator = Emulator::new(snapshot, recording.device, conf, Some(LARGEST_DEVICE_BYTES))
            .map_err(|error| emulation_error(recording, &error))?
            .lean()
            .with_empty_caches(std::sync::Arc::clone(&recording.empty_caches));
        let every = Self::every(recording, snapshot);
        let mut saved = vec![(emulator.capacity_read_up_to(), emulator.clone())];
        while let Some((entry, _)) = emulator.step() {
            if (entry + 1) % every == 0 {
                saved.push((emulator.capacity_read_up_to(), emulator.clone()));
            }
        }
        let end = emulator.allocator().stats().clone();
        Ok((Self::new(recording, saved, conf), end))
    }

    /// Whether the run fits a device of `capacity_bytes`: replayed from the last copy that never went past what the
    /// device lets it reserve undisturbed (garbage collection starts at its threshold times the capacity, as
    /// PyTorch computes it).
    fn fits(&self, capacity_bytes: u64) -> bool {
        self.probe(capacity_bytes).is_some_and(|probe| !probe.refused)
    }

    /// The `cudaMalloc` retries of the run on a device of `capacity_bytes` (to its first refusal, if any).
    fn retries(&self, capacity_bytes: u64) -> u64 {
        self.probe(capacity_bytes).map_or(0, |probe| probe.retries)
    }

    /// The run on a device of `capacity_bytes`, replayed from the last copy that never went past what the device lets
    /// it reserve undisturbed (garbage collection starts at its threshold times the capacity, as PyTorch computes it),
    /// to its end or its first refusal (once per capacity). `None` when what PyTorch held at the start does not fit.
    fn probe(&self, capacity_bytes: u64) -> Option<Probe> {
        if let Some(&probe) = self.probed.borrow().get(&capacity_bytes) {
            return probe;
        }
        let undisturbed =
            if self.gc_threshold > 0.0 { (self.gc_threshold * capacity_bytes as f64) as u64 } else { capacity_bytes };
        let probe = self.saved.first().filter(|(at_start, _)| (*at_start).max(self.start_floor_bytes) <= capacity_bytes).map(
            |(_, start)| {
                let from = self.saved.iter().rev().find(|(read, _)| *read <= undisturbed).map_or(start, |(_, from)| from);
                let mut emulator = from.clone();
                emulator.set_capacity(Some(capacity_bytes));
                let refused = emulator.run_to_refusal().is_some();
                Probe { refused, retries: u64::try_from(emulator.allocator().stats().num_alloc_retries).unwrap_or(0) }
            },
        );
        self.probed.borrow_mut().insert(capacity_bytes, probe);
        probe
    }
}

/// A PyTorch setting's run on a device of `capacity_bytes`: its figures and the estimated driver time.
/// With `copy_every`, lean copies of the emulation kept along the run (a PyTorch recording's).
fn pytorch_run<'r>(
    recording: &'r Recording,
    setting: &str,
    conf: &AllocConf,
    capacity_bytes: u64,
    copy_every: Option<usize>,
) -> Result<((Figures, f64), Option<Copies<'r>>)> {
    let mut cost = CudaCost::default();
    let (replay, copies) = emulate_pytorch_copied(recording, conf, Some(capacity_bytes), &mut cost, copy_every)?;
    Ok(((replay.figures(setting, recording, 0), cost.micros), copies))
}

/// The paging allocator's run (CUDA's 2 MiB pages, pages unmapped under pressure only, as PyTorch's expandable
/// segments keep theirs) on a device of `capacity_bytes`.
fn paged_run(recording: &Recording, capacity_bytes: u64) -> Result<(Figures, f64)> {
    let capacity = (capacity_bytes < LARGEST_DEVICE_BYTES).then_some(capacity_bytes);
    let mut heap = PagedHeap::new(PagedConfig {
        page_bytes: CUDA_PAGE_BYTES,
        unmap: UnmapRule::UnderPressure,
        ..PagedConfig::new(capacity)
    })?;
    heap.record_device_events(true);
    let (mut statistics, mut cost) = (Statistics::default(), CudaCost::default());
    drive(Stream::of(recording), &mut HeapTarget::new(&mut heap), 512, &mut [&mut statistics, &mut cost])?;
    let stats = heap.stats();
    let (peak_reserved_bytes, device_allocs, device_frees) = (stats.peak_mapped_bytes, stats.map_calls, stats.unmap_calls);
    let figures =
        Figures { peak_reserved_bytes, device_allocs, device_frees, ..summed(PAGED, &statistics.into_replay(), recording, 0) };
    Ok((figures, cost.micros))
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_core::units::MIB;

    fn shared(name: &str) -> Recording {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../assets/traces/pytorch/{name}.pickle.gz"));
        Recording::open(&path, 0).unwrap()
    }

    /// PyTorch's own `memory_stats()` of a shared run, as recorded beside it.
    fn stat(name: &str, key: &str) -> u64 {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../assets/traces/pytorch/{name}.json"));
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        json["memory_stats"][key].as_u64().unwrap_or_else(|| panic!("{name}: {key}"))
    }

    /// The retries at a setting's need (resumed from the copies of its run without a limit, or replayed whole for a plain
    /// trace) are those of a whole replay on a device of that size; none for `paged`.
    #[test]
    fn retries_at_the_need_are_a_whole_replays_there() {
        let settings =
            ["", "expandable_segments:True", "max_split_size_mb:64", "max_split_size_mb:256,garbage_collection_threshold:0.6"];
        let settings: Vec<String> = settings.iter().map(|setting| (*setting).to_owned()).collect();
        let mut seen_retries = false;
        for name in ["gpt2_train_fixed-default", "frag_oom-default"] {
            let snapshot = shared(name);
            let trace = Recording::from_trace(snapshot.trace.clone());
            for recording in [&snapshot, &trace] {
                let config = AdviseConfig { capacity_bytes: None, settings: settings.clone(), threads: 2 };
                let advice = advise(recording, &config, &|_, _| {}).unwrap();
                for row in &advice.settings {
                    let context = format!("{name} ({}), {:?}", recording.name, row.setting);
                    if row.setting == PAGED {
                        assert_eq!(row.retries_at_need, None, "{context}");
                        continue;
                    }
                    let mut conf = AllocConf::default();
                    conf.parse_overrides(&row.setting).unwrap();
                    let need = row.min_capacity_bytes.unwrap();
                    let ((whole, _), _) = pytorch_run(recording, &row.setting, &conf, need, None).unwrap();
                    let retries = u64::try_from(whole.memory_stats.unwrap().num_alloc_retries).unwrap();
                    assert_eq!(row.retries_at_need, Some(retries), "{context}");
                    seen_retries |= retries > 0;
                }
            }
        }
        assert!(seen_retries, "some need costs retries");
    }

    /// Each shared H200 run predicted from the other setting's recording: peak reserved, `cudaMalloc` (or map)
    /// count and out-of-memory errors equal to PyTorch's own numbers of the separate run — frag_oom on the 3.5 GiB
    /// it had (its recorded `oom` tells), GPT-2 without a limit.
    #[test]
    fn each_shared_run_is_predicted_from_the_other_settings_recording() {
        let cases = [
            ("frag_oom-default", "expandable_segments:True", "frag_oom-expandable"),
            ("frag_oom-expandable", "", "frag_oom-default"),
            ("gpt2_train_fixed-default", "expandable_segments:True", "gpt2_train_fixed-expandable"),
            ("gpt2_train_fixed-expandable", "", "gpt2_train_fixed-default"),
        ];
        for (recorded, setting, truth) in cases {
            let recording = shared(recorded);
            let capacity_bytes = recorded.starts_with("frag_oom").then_some(3584 * MIB);
            let config = AdviseConfig { capacity_bytes, settings: vec![setting.to_owned()], threads: 2 };
            let advice = advise(&recording, &config, &|_, _| {}).unwrap();
            let row = advice.settings.iter().find(|row| row.setting == setting).unwrap();
            let context = format!("{truth} predicted from {recorded}");
            assert_eq!(row.peak_reserved_bytes, stat(truth, "reserved_bytes.all.peak"), "{context}");
            assert_eq!(row.device_allocs, stat(truth, "num_device_alloc"), "{context}");
            assert_eq!(row.ooms, stat(truth, "num_ooms"), "{context}");
        }
    }

    /// frag_oom's recording says the device: 3000 MiB reserved at its `oom` entry plus the 584 MiB the driver had
    /// left. There the default settings fail (fragmentation: 1000 MiB free in reserved memory, none of it a run of
    /// 1 GiB), and the advice ranks a setting that fits first; `paged` and expandable segments need about the 2.93 GiB
    /// live at the peak, the default far more.
    #[test]
    fn frag_oom_is_advised_on_the_device_its_recording_tells() {
        let recording = shared("frag_oom-default");
        let Capacity { bytes: Some(capacity), from } = Capacity::of(None, &recording) else { panic!("no capacity") };
        let CapacityFrom::Recorded { reserved_bytes, device_free_bytes, .. } = from else { panic!("{from:?}") };
        assert_eq!((reserved_bytes, capacity), (3000 * MIB, reserved_bytes + device_free_bytes));
        assert!(capacity.abs_diff(3584 * MIB) < MIB, "the 3.5 GiB the run had: {capacity}");
        let settings = ["", "expandable_segments:True", "max_split_size_mb:128"].map(String::from).to_vec();
        let advice = advise(&recording, &AdviseConfig { capacity_bytes: None, settings, threads: 2 }, &|_, _| {}).unwrap();
        assert_eq!((advice.capacity_bytes, advice.capacity_from), (Some(capacity), from));
        let best = advice.best().unwrap();
        assert_eq!((best.rank, best.ooms), (1, 0), "{best:?}");
        let recorded = advice.recorded().unwrap();
        assert_eq!(recorded.setting, "");
        let oom = recorded.first_oom.as_ref().unwrap();
        assert_eq!(
            (oom.request_bytes, oom.free_bytes, oom.verdict),
            (1024 * MIB, 1000 * MIB, heapscope_core::OomCause::Fragmentation)
        );
        let need = |setting: &str| advice.settings.iter().find(|row| row.setting == setting).unwrap().min_capacity_bytes.unwrap();
        let live = advice.recorded().unwrap().peak_live_bytes;
        for setting in ["expandable_segments:True", PAGED] {
            assert!(need(setting) >= live && need(setting) <= live + 64 * MIB, "{setting}: {} for {live}", need(setting));
        }
        assert!(need("") > capacity, "the default needs more than the device: {}", need(""));
        assert!(advice.settings.iter().all(|row| row.monotone), "{:?}", advice.settings);
        let ranks: Vec<usize> = advice.settings.iter().map(|row| row.rank).collect();
        assert_eq!(ranks, [1, 2, 3, 0], "paged last, unranked");
    }

    /// A file whose `PYTORCH_CUDA_ALLOC_CONF` string is not the settings its keys record (a program run with expandable
    /// segments that later set `max_split_size_mb:1024`: PyTorch keeps the last string) is advised with the settings in
    /// effect: keeping them pastes those (it pasted the string, which the answer's own table showed running out of
    /// memory), and every command says why in its notes; a string that agrees with the keys is pasted as written.
    #[test]
    fn the_recorded_settings_are_the_ones_in_effect() {
        // (the string, its keys' expandable segments and max split size, what keeping them pastes, noted)
        let cases = [
            ("max_split_size_mb:1024", true, Some(1024 * MIB), "expandable_segments:True,max_split_size_mb:1024", true),
            ("", true, None, "expandable_segments:True", true),
            ("expandable_segments:True", true, None, "expandable_segments:True", false),
            (
                "max_split_size_mb:1024 , expandable_segments:True",
                true,
                Some(1024 * MIB),
                "max_split_size_mb:1024 , expandable_segments:True",
                false,
            ),
        ];
        for (string, expandable, max_split, pasted, noted) in cases {
            let mut recording = shared("frag_oom-expandable");
            let snapshot = recording.snapshot.take().unwrap();
            let settings = heapscope_pytorch::RecordedSettings {
                alloc_conf: string.to_owned(),
                expandable_segments: expandable,
                max_split_size: max_split,
                ..snapshot.settings.clone().unwrap()
            };
            let snapshot = Snapshot { settings: Some(settings), ..snapshot };
            let recording = Recording::from_snapshot("fragx.pickle", snapshot, 0).unwrap();
            let config = AdviseConfig { capacity_bytes: Some(3584 * MIB), settings: vec![String::new()], threads: 1 };
            let advice = advise(&recording, &config, &|_, _| {}).unwrap();
            assert_eq!(advice.recorded_setting, pasted, "{string:?}");
            assert_eq!(advice.recorded().unwrap().ooms, 0, "{string:?}: the settings in effect fit");
            let note = crate::caveats::settings_string_not_in_effect(&recording);
            assert_eq!(note.is_some(), noted, "{string:?}: {note:?}");
            if let Some(note) = note {
                assert!(
                    note.contains(&format!("{string:?}")) && note.ends_with(&format!("every replay runs with {pasted}")),
                    "{note}"
                );
            }
        }
    }

    /// On a recording begun mid-run, every PyTorch setting needs at least what the recording held at its start, a what-if
    /// of the other kind of memory too (whose own run may reserve less: it used to be said to need less than `compare`
    /// then accepts); a setting of the other kind (its start allocated afresh, marked) ranks after the recording's kind
    /// and is never the answer, only named as worth a whole recording where it looks better (on gpt2's default run cut
    /// at 9000, expandable segments reserve 0.7 GiB less); and a setting is advised over the recorded one only where it needs
    /// less by more than the tie (two steps of the search's grid, at least a 20 MiB page) or, needing about the same,
    /// reserves less at its peak.
    #[test]
    fn mid_run_needs_hold_the_start_and_ties_keep_the_recorded_settings() {
        for name in ["gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
            for cut in [5866, 9000] {
                let mut snapshot = shared(name).snapshot.take().unwrap();
                snapshot.device_traces[0].drain(..cut);
                let recording = Recording::from_snapshot(name, snapshot, 0).unwrap();
                let start = crate::capacity::reserved_at_start(&recording);
                let settings = ["", "expandable_segments:True", "roundup_power2_divisions:4"].map(String::from).to_vec();
                let config = AdviseConfig { capacity_bytes: None, settings, threads: 2 };
                let advice = advise(&recording, &config, &|_, _| {}).unwrap();
                for row in advice.settings.iter().filter(|row| row.setting != PAGED) {
                    assert!(row.min_capacity_bytes.unwrap() >= start, "{name} cut at {cut}: {row:?} under {start}");
                }
                let (best, recorded) = (advice.best().unwrap(), advice.recorded().unwrap());
                let expandable = name.ends_with("expandable");
                for row in advice.settings.iter().filter(|row| row.setting != PAGED) {
                    let other_kind = row.setting.contains("expandable_segments:True") != expandable;
                    assert_eq!(row.start_afresh, other_kind, "{name} cut at {cut}: {}", row.setting);
                }
                let ranked: Vec<bool> =
                    advice.settings.iter().filter(|row| row.setting != PAGED).map(|row| row.start_afresh).collect();
                assert!(ranked.is_sorted(), "{name} cut at {cut}: the recording's kind first: {ranked:?}");
                assert!(!best.start_afresh && advice.tie_bytes >= 20 * MIB, "{name} cut at {cut}");
                let hint = advice.afresh_hint();
                // Cut at 5866 its expandable what-if reserves 14.21 GiB against 14.24: within the tie, no hint.
                if !expandable && cut == 9000 {
                    assert!(
                        hint.as_deref()
                            .is_some_and(|hint| hint.starts_with("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True might")),
                        "{name} cut at {cut}: {hint:?}"
                    );
                }
                assert!(advice.answer().ends_with(hint.as_deref().unwrap_or(".")), "{name} cut at {cut}");
                let need = |row: &SettingAdvice| row.min_capacity_bytes.unwrap();
                let tied =
                    need(best) <= need(recorded) + advice.tie_bytes && best.peak_reserved_bytes <= recorded.peak_reserved_bytes;
                assert!(
                    best.as_recorded || need(best) + advice.tie_bytes < need(recorded) || tied,
                    "{name} cut at {cut}: {} ({:?}, {}) over the recorded ({:?}, {})",
                    best.setting,
                    best.min_capacity_bytes,
                    best.peak_reserved_bytes,
                    recorded.min_capacity_bytes,
                    recorded.peak_reserved_bytes
                );
            }
        }
    }

    /// A state with no trace (`torch.cuda.memory_snapshot()`): a 20 MiB segment holding a 1 MiB block. PyTorch's
    /// settings need the 20 MiB it held, not the 1 MiB live; `paged` needs one 2 MiB page.
    #[test]
    fn what_a_recording_held_at_its_start_is_needed() {
        use heapscope_pytorch::{Block, BlockState, Pool, Segment, Snapshot};
        let address = 0x7f00_0000_0000;
        let block = Block::new;
        let blocks =
            vec![block(address, MIB, MIB, BlockState::ActiveAllocated), block(address + MIB, 19 * MIB, 0, BlockState::Inactive)];
        let segment = Segment::from_blocks(0, address, 20 * MIB, Pool::Large, blocks);
        let snapshot = Snapshot { segments: vec![segment], device_traces: vec![Vec::new()], ..Snapshot::default() };
        let recording = Recording::from_snapshot("state", snapshot, 0).unwrap();
        let config = AdviseConfig { capacity_bytes: None, settings: vec![String::new()], threads: 1 };
        let advice = advise(&recording, &config, &|_, _| {}).unwrap();
        let need = |setting: &str| advice.settings.iter().find(|row| row.setting == setting).unwrap().min_capacity_bytes;
        assert_eq!((need(""), need(PAGED)), (Some(20 * MIB), Some(2 * MIB)));
        // The answer keeps the table's caution: a need that is not monotone says where it failed again.
        let mut cautious = advice.clone();
        let row = cautious.settings.iter_mut().find(|row| row.setting.is_empty()).unwrap();
        (row.monotone, row.fails_again_at_bytes) = (false, Some(40 * MIB));
        let answer = cautious.answer();
        assert!(answer.contains("needs 20.00 MiB (but it ran out of memory again at 40.00 MiB"), "{answer}");
        assert!(advice.answer().contains("needs 20.00 MiB (peak reserved"), "{}", advice.answer());
        // Nothing replays: expandable segments keep the state as recorded, no start allocated afresh.
        let config = AdviseConfig { capacity_bytes: None, settings: vec!["expandable_segments:True".into()], threads: 1 };
        let advice = advise(&recording, &config, &|_, _| {}).unwrap();
        assert!(advice.settings.iter().all(|row| !row.start_afresh), "{:?}", advice.settings);
        // On a device smaller than the 20 MiB held at the start, no PyTorch setting fits, whatever it refused.
        for (capacity, fits) in [(19 * MIB, false), (20 * MIB, true)] {
            let config = AdviseConfig { capacity_bytes: Some(capacity), settings: vec![String::new()], threads: 1 };
            let advice = advise(&recording, &config, &|_, _| {}).unwrap();
            let recorded = advice.recorded().unwrap();
            assert_eq!((recorded.ooms, recorded.start_exceeds_capacity, recorded.fits()), (0, !fits, fits), "{capacity}");
            let answer = advice.answer();
            assert_eq!(answer.starts_with("No setting fits in 19.00 MiB"), !fits, "{capacity}: {answer}");
            if !fits {
                assert!(answer.contains(": the one that needs least, PYTORCH_CUDA_ALLOC_CONF unset"), "{answer}");
                // Ranked after it, a setting that needs a little less, within what the search tells apart: the answer
                // names the first ranked, and does not call its need the least.
                let mut tied = advice.clone();
                let mut less = tied.settings[0].clone();
                (less.setting, less.min_capacity_bytes) = ("max_split_size_mb:64".into(), Some(19 * MIB));
                tied.settings.push(less);
                let answer = tied.answer();
                let said = format!(
                    "No setting fits in 19.00 MiB: of those that need least (within {} of 19.00 MiB, what the search for a \
                     need tells apart), the one ranked first, PYTORCH_CUDA_ALLOC_CONF unset (PyTorch's defaults), needs \
                     20.00 MiB",
                    Bytes(tied.tie_bytes)
                );
                assert!(answer.starts_with(&said), "{said:?} in {answer}");
            }
        }
    }

    /// Advice given up (another recording opened in the app) replays no setting after it is cancelled: cancelled before
    /// the first, nothing; after the first (told through `progress`, on one thread), that one only.
    #[test]
    fn a_cancelled_advice_replays_no_more_settings() {
        let recording = shared("frag_oom-default");
        let settings = vec![String::new(), "expandable_segments:True".into(), "max_split_size_mb:256".into()];
        let config = AdviseConfig { capacity_bytes: None, settings, threads: 1 };
        for cancel_after in [0, 1] {
            let cancelled = AtomicBool::new(cancel_after == 0);
            let heard = AtomicUsize::new(0);
            let advice = advise_until(
                &recording,
                &config,
                &|done, _| {
                    heard.store(done, Ordering::Relaxed);
                    cancelled.store(done >= cancel_after, Ordering::Relaxed);
                },
                &cancelled,
            )
            .unwrap();
            assert!(advice.is_none(), "cancelled after {cancel_after}");
            assert_eq!(heard.load(Ordering::Relaxed), cancel_after, "settings replayed");
        }
        // Not cancelled: every setting (and paged).
        let advice = advise_until(&recording, &config, &|_, _| {}, &AtomicBool::new(false)).unwrap().unwrap();
        assert_eq!(advice.settings.len(), 4);
    }

    /// A probe resumed from a copy of the run without a limit answers as a replay from the start does: on the
    /// shared recordings, whole and begun mid-run, settings with and without garbage collection, at capacities from
    /// below the peak allocated to the peak reserved.
    #[test]
    fn probes_from_checkpoints_answer_as_replays_from_the_start() {
        let mut compared = 0;
        for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default"] {
            for mid_run in [false, true] {
                let cut = mid_run;
                let mut recording = shared(name);
                if mid_run {
                    // Begun half-way: segments and live blocks at the start.
                    let mut snapshot = recording.snapshot.take().unwrap();
                    let trace = &mut snapshot.device_traces[0];
                    trace.drain(..trace.len() / 2);
                    recording = Recording::from_snapshot(name, snapshot, 0).unwrap();
                }
                let snapshot = recording.snapshot.as_ref().unwrap();
                for setting in [
                    "",
                    "expandable_segments:True",
                    "max_split_size_mb:128",
                    "roundup_power2_divisions:4",
                    "max_split_size_mb:256,garbage_collection_threshold:0.6",
                ] {
                    let mut conf = AllocConf::default();
                    conf.parse_overrides(setting).unwrap();
                    // The copies two ways: a lean run of their own, and kept by the row's own run through the driver.
                    let every = Checkpoints::every(&recording, snapshot);
                    let ((unlimited, _), copies) =
                        pytorch_run(&recording, setting, &conf, LARGEST_DEVICE_BYTES, Some(every)).unwrap();
                    let stats = unlimited.memory_stats.as_ref().unwrap();
                    let low = u64::try_from(stats.allocated_bytes.all().peak).unwrap() / 2;
                    let high = unlimited.peak_reserved_bytes + CAPACITY_STEP_BYTES;
                    let (checkpoints, end) = Checkpoints::of(&recording, snapshot, &conf).unwrap();
                    assert_eq!(&end, stats, "{name} cut {cut} {setting:?}: the same run either way");
                    let kept = Checkpoints::new(&recording, copies.unwrap().saved, &conf);
                    for step in 0..=12u64 {
                        let capacity = low + (high - low) / 12 * step;
                        let replayed = first_refusal(&recording, &conf, Some(capacity)).unwrap().is_none();
                        let start_fits = capacity >= start_reserved_bytes(&recording, &conf);
                        for saved in [&checkpoints, &kept] {
                            assert_eq!(
                                saved.fits(capacity),
                                replayed && start_fits,
                                "{name} cut {cut} {setting:?} at {capacity}"
                            );
                            // A capacity asked again (the search's step above its answer, the answer's retries) is
                            // the probe already run, not a second replay.
                            let probes = saved.probed.borrow().len();
                            assert_eq!(saved.fits(capacity), replayed && start_fits);
                            let _retries = saved.retries(capacity);
                            assert_eq!(saved.probed.borrow().len(), probes, "{name}: one probe a capacity");
                        }
                        compared += 1;
                    }
                }
            }
        }
        assert_eq!(compared, 3 * 2 * 5 * 13);
    }

    /// A setting the recording cannot feel (a max split size above every block it can hold) replays once, under the
    /// setting without it, and its row is what its own replay gives.
    #[test]
    fn a_setting_the_recording_cannot_feel_is_the_same_run() {
        for name in ["frag_oom-default", "gpt2_train_fixed-default"] {
            let recording = shared(name);
            let settings: Vec<String> = [
                "",
                "max_split_size_mb:4096",
                "max_split_size_mb:64",
                "garbage_collection_threshold:0.8",
                "max_split_size_mb:4096,garbage_collection_threshold:0.8",
            ]
            .map(str::to_owned)
            .to_vec();
            let config = AdviseConfig { capacity_bytes: None, settings: settings.clone(), threads: 2 };
            let advice = advise(&recording, &config, &|_, _| {}).unwrap();
            let row = |setting: &str| advice.settings.iter().find(|row| row.setting == setting).unwrap();
            assert_eq!(row("max_split_size_mb:4096").same_run_as.as_deref(), Some(""), "{name}");
            assert_eq!(
                row("max_split_size_mb:4096,garbage_collection_threshold:0.8").same_run_as.as_deref(),
                Some("garbage_collection_threshold:0.8"),
                "{name}"
            );
            assert_eq!(row("max_split_size_mb:64").same_run_as, None, "{name}: GPT-2's and frag_oom's blocks reach 64 MiB");
            // A copy (`(=)`) ranks below the run it names, as the legend says; with only the setting that changes nothing
            // asked (`--setting`), the recorded settings' row is the run.
            let alone = AdviseConfig { settings: vec!["max_split_size_mb:4096".to_owned()], ..config.clone() };
            let alone = advise(&recording, &alone, &|_, _| {}).unwrap();
            for advice in [&advice, &alone] {
                for copy in advice.settings.iter().filter(|row| row.same_run_as.is_some()) {
                    let run = advice.settings.iter().find(|row| Some(&row.setting) == copy.same_run_as.as_ref()).unwrap();
                    assert!(run.rank < copy.rank && run.same_run_as.is_none(), "{name}: {copy:?} after {run:?}");
                    // Right below it: only copies of the same run between them.
                    let between = advice.settings.iter().filter(|row| run.rank < row.rank && row.rank < copy.rank);
                    assert!(between.clone().all(|row| row.same_run_as == copy.same_run_as), "{name}: {copy:?}");
                }
            }
            let copy = alone.settings.iter().find(|row| row.setting == "max_split_size_mb:4096").unwrap();
            assert_eq!(copy.same_run_as.as_deref(), Some(alone.recorded().unwrap().setting.as_str()), "{name}");
            let recorded = alloc_conf(&recording, None).unwrap();
            for setting in ["max_split_size_mb:4096", "max_split_size_mb:4096,garbage_collection_threshold:0.8"] {
                let mut conf = AllocConf::default();
                conf.parse_overrides(setting).unwrap();
                let own =
                    advise_row(&recording, &Row::Pytorch { setting: setting.to_owned(), conf }, advice.capacity_bytes, &recorded)
                        .unwrap();
                let copied = row(setting);
                assert_eq!(
                    SettingAdvice { same_run_as: copied.same_run_as.clone(), rank: copied.rank, ..own },
                    *copied,
                    "{name} {setting}"
                );
            }
        }
    }

    /// The capacity search on made-up answers: a setting that fits from a threshold on, one that fails again above
    /// it, one that fits nowhere below an unlimited device.
    #[test]
    fn the_capacity_search_finds_the_threshold_and_checks_above_it() {
        type Case = (&'static str, u64, u64, Box<dyn Fn(u64) -> bool>, Option<(u64, Option<u64>)>);
        let step = CAPACITY_STEP_BYTES;
        let cases: [Case; 4] = [
            ("threshold inside", 10 * step, 40 * step, Box::new(move |c| c >= 17 * step), Some((17 * step, None))),
            ("the floor fits", 10 * step, 40 * step, Box::new(|_| true), Some((10 * step, None))),
            ("the ceiling fails", 10 * step, 40 * step, Box::new(move |c| c >= 70 * step), Some((70 * step, None))),
            (
                "fails again above",
                10 * step,
                400 * step,
                Box::new(move |c| c >= 17 * step && c != 18 * step),
                Some((17 * step, Some(18 * step))),
            ),
        ];
        for (name, floor, ceiling, fits, expected) in cases {
            let ceiling_fits = fits(ceiling);
            let found = min_capacity(floor, ceiling, ceiling_fits, &|capacity| Ok(fits(capacity))).unwrap();
            assert_eq!(found, expected, "{name}");
            // Told the ceiling fits, the search does not try it.
            if ceiling_fits {
                let tried = RefCell::new(Vec::new());
                min_capacity(floor, ceiling, true, &|capacity| {
                    tried.borrow_mut().push(capacity);
                    Ok(fits(capacity))
                })
                .unwrap();
                assert!(!tried.borrow().contains(&ceiling), "{name}: {:?}", tried.borrow());
            }
        }
        assert_eq!(min_capacity(step, 2 * step, false, &|_| Ok(false)).unwrap(), None);
        // A large ceiling: a grid of 1/1024 of it, in whole steps.
        let ceiling = 3000 * step;
        let (found, _) = min_capacity(step, ceiling, true, &|capacity| Ok(capacity >= 1000 * step)).unwrap().unwrap();
        assert!(found >= 1000 * step && found < 1000 * step + ceiling / 1024 + step && found % step == 0, "{found}");
        // Only the ceiling fits, off the grid: the need is the ceiling, not the grid step above it (it was 14.25 GiB on
        // GPT-2 for a run whose peak reserved, 14.24 GiB, fits).
        let ceiling = 3000 * step + step / 2;
        let found = min_capacity(step, ceiling, true, &|capacity| Ok(capacity >= ceiling)).unwrap();
        assert_eq!(found, Some((ceiling, None)));
        // Likewise where the ceiling is not known to fit (garbage collection) and is tried: it was the grid step above.
        let found = min_capacity(step, ceiling, false, &|capacity| Ok(capacity >= ceiling)).unwrap();
        assert_eq!(found, Some((ceiling, None)));
        // An empty run with garbage collection needs nothing, as without (it was one grid step, 2 MiB).
        assert_eq!(min_capacity(0, 0, false, &|_| Ok(true)).unwrap(), Some((0, None)));
    }

    /// Where the search saw no failure above its answer, two capacities a user meets are checked: the device of the
    /// advice, where the row's own run there refused (no probe needed), and the need as shown, rounded up to two
    /// decimals (what one pastes), where it fails.
    #[test]
    fn the_device_and_the_need_as_shown_are_checked_above_the_need() {
        // A need off the two-decimal grid: shown as 3.49 GiB, a little more.
        let need = 3573 * MIB + 300 * 1024;
        let shown = parse_size(&BytesAtLeast(need).to_string()).unwrap();
        assert!(shown > need && shown - need < 10 * MIB, "{shown}");
        type Case = (&'static str, Option<u64>, u64, Box<dyn Fn(u64) -> bool>, Option<u64>);
        let cases: [Case; 5] = [
            ("fits everywhere above", Some(4096 * MIB), 0, Box::new(|_| true), None),
            ("the own run refused on the device", Some(4096 * MIB), 1, Box::new(|_| true), Some(4096 * MIB)),
            ("refused on a device below the need: no sign", Some(3 << 30), 1, Box::new(|_| true), None),
            ("the shown need fails", None, 0, Box::new(move |capacity| capacity != shown), Some(shown)),
            ("the shown need fails, the device too", Some(4096 * MIB), 2, Box::new(move |c| c != shown), Some(4096 * MIB)),
        ];
        for (name, capacity, ooms, fits, expected) in cases {
            assert_eq!(fails_again_above(need, capacity, ooms, &|c| Ok(fits(c))).unwrap(), expected, "{name}");
        }
        // A need on the grid of two decimals is shown as it is: nothing more to try.
        let exact = 3584 * MIB;
        assert_eq!(fails_again_above(exact, None, 0, &|_| panic!("no probe")).unwrap(), None);
    }

    /// Rows alike in everything the ranking weighs (the same run) rank the recorded settings first, then the fewest keys,
    /// not the order given; and keeping the recorded settings quotes the string the file records, not a setting equal
    /// to it in effect.
    #[test]
    fn alike_rows_rank_the_recorded_then_the_simplest_and_the_recorded_string_is_quoted() {
        let recording = shared("gpt2_train_fixed-default");
        // On 80 GiB garbage collection never starts (0.8 of it is far above GPT-2's 13.5 GiB), and one division rounds
        // nothing: the same run as the defaults.
        let settings = ["garbage_collection_threshold:0.8,roundup_power2_divisions:1", "garbage_collection_threshold:0.8", ""]
            .map(String::from)
            .to_vec();
        let config = AdviseConfig { capacity_bytes: Some(80 << 30), settings, threads: 2 };
        let advice = advise(&recording, &config, &|_, _| {}).unwrap();
        let order: Vec<&str> = advice.settings.iter().map(|row| row.setting.as_str()).collect();
        assert_eq!(
            order,
            ["", "garbage_collection_threshold:0.8", "garbage_collection_threshold:0.8,roundup_power2_divisions:1", PAGED]
        );
        assert!(advice.answer().starts_with("Keep the recorded settings: PYTORCH_CUDA_ALLOC_CONF unset"), "{}", advice.answer());
        // A key PyTorch reads elsewhere (pinned host memory) leaves the allocator as recorded: that row is the recorded
        // one, and the answer quotes what the file records.
        let recording = shared("frag_oom-expandable");
        let settings = vec!["expandable_segments:True,pinned_use_cuda_host_register:True".to_owned()];
        let advice = advise(&recording, &AdviseConfig { capacity_bytes: None, settings, threads: 1 }, &|_, _| {}).unwrap();
        assert!(advice.recorded().is_some_and(|row| row.setting.contains("pinned")));
        let answer = advice.answer();
        assert!(
            answer.starts_with("Keep the recorded settings: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True — "),
            "{answer}"
        );
    }

    /// A recording made under a share of the device (`per_process_memory_fraction` in its settings) is advised on that
    /// share: every row keeps the fraction unless it sets its own, and says so in its string (pasted, the same run).
    #[test]
    fn a_recorded_share_of_the_device_is_kept_in_every_row() {
        let mut recording = shared("frag_oom-default");
        let snapshot = recording.snapshot.as_mut().unwrap();
        snapshot.settings.get_or_insert_with(Default::default).alloc_conf = "per_process_memory_fraction:0.9".to_owned();
        let settings = ["", "expandable_segments:True", "per_process_memory_fraction:1"].map(String::from).to_vec();
        let config = AdviseConfig { capacity_bytes: Some(4 << 30), settings, threads: 2 };
        let advice = advise(&recording, &config, &|_, _| {}).unwrap();
        let names: Vec<&str> = advice.settings.iter().map(|row| row.setting.as_str()).collect();
        for expected in [
            "per_process_memory_fraction:0.9",
            "expandable_segments:True,per_process_memory_fraction:0.9",
            "per_process_memory_fraction:1",
        ] {
            assert!(names.contains(&expected), "{expected} in {names:?}");
        }
        assert_eq!(advice.recorded().unwrap().setting, "per_process_memory_fraction:0.9");
        // Each row is the replay of its string.
        for row in advice.settings.iter().filter(|row| row.setting != PAGED) {
            let compare = crate::compare::CompareConfig {
                capacity_bytes: Some(4 << 30),
                alloc_conf: Some(row.setting.clone()),
                ..crate::compare::CompareConfig::default()
            };
            let replayed =
                crate::compare::replay(&recording, crate::contender::Contender::Pytorch { expandable: false }, &compare).unwrap();
            let figures = replayed.figures().unwrap();
            assert_eq!((figures.peak_reserved_bytes, figures.ooms), (row.peak_reserved_bytes, row.ooms), "{}", row.setting);
            // And on the device it says it needs, it fits (with expandable segments under the fraction too, whose requests
            // the share refuses by their whole segment size).
            let need = row.min_capacity_bytes.unwrap();
            let at_need = crate::compare::CompareConfig { capacity_bytes: Some(need), ..compare };
            let replayed =
                crate::compare::replay(&recording, crate::contender::Contender::Pytorch { expandable: false }, &at_need).unwrap();
            assert_eq!(replayed.figures().unwrap().ooms, 0, "{} on the {need} B it needs", row.setting);
        }
        // GPT-2's run, where the share's refusal by segment size tells: the need found is a device it fits.
        let recording = shared("gpt2_train_fixed-default");
        let setting = "expandable_segments:True,per_process_memory_fraction:0.9".to_owned();
        let config = AdviseConfig { capacity_bytes: None, settings: vec![setting.clone()], threads: 1 };
        let advice = advise(&recording, &config, &|_, _| {}).unwrap();
        let need = advice.settings.iter().find(|row| row.setting == setting).unwrap().min_capacity_bytes.unwrap();
        let at_need = crate::compare::CompareConfig {
            capacity_bytes: Some(need),
            alloc_conf: Some(setting.clone()),
            ..crate::compare::CompareConfig::default()
        };
        let replayed =
            crate::compare::replay(&recording, crate::contender::Contender::Pytorch { expandable: false }, &at_need).unwrap();
        assert_eq!(replayed.figures().unwrap().ooms, 0, "{setting} on the {need} B it needs");
        assert_eq!(with_recorded_budget("max_split_size_mb:128", &AllocConf::default()), "max_split_size_mb:128");
    }

    /// Every setting of the grid is one PyTorch accepts, and the grid has no two alike.
    #[test]
    fn the_grid_is_valid_and_distinct() {
        let settings = grid();
        let mut confs: Vec<AllocConf> = Vec::new();
        for setting in &settings {
            let mut conf = AllocConf::default();
            conf.parse_overrides(setting).unwrap_or_else(|error| panic!("{setting}: {error}"));
            assert!(!confs.contains(&conf), "{setting} twice");
            confs.push(conf);
        }
        assert_eq!(settings.len(), 26);
    }
}
