//! What the app shows: a recording (a file, a built-in story, or a live source) replayed by 1 to 4
//! contenders, each in a pane with its own timeline, layout and view, all at one position.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use anyhow::{Result, bail};
use heapscope_core::UnmapRule;
use heapscope_core::trace::Event;
use heapscope_lab::capacity::Capacity;
use heapscope_lab::compare::CompareConfig;
use heapscope_lab::contender::Contender;
use heapscope_lab::recording::{DeviceOverview, Moment, Recording, device_overview};
use heapscope_lab::story::{self, Story};
use heapscope_lab::timeline::record::record;
use heapscope_lab::timeline::{Change, Layout, Timeline};
use heapscope_lab::top::{TopAt, TopError, moment_to_draw};
use heapscope_pytorch::AllocConf;

use crate::heap_map::{MapView, Rows, Scale};
use crate::live::LiveSource;
use crate::palette::{ColourBy, GroupHues, RecordingHues};
pub use crate::slot::SlotInfo;

/// The most panes side by side.
pub const MAX_PANES: usize = 4;
/// Moves forward by at most this many steps replay changes from the current layout; longer ones (and
/// moves back) seek from the nearest checkpoint.
const SHORT_MOVE_STEPS: u64 = 2048;

/// Layouts holding at least this many allocations are freed on a thread of their own when a seek replaces them.
const FREE_ELSEWHERE_ALLOCATIONS: u64 = 10_000;

/// Checks a moment asked for by `--at start|ENTRY` (`heapscope gui` and `heapscope render` alike) against a
/// recording of `steps` entries, and returns its position: the start is 0, entry `N` is `N + 1` ([`Moment`]); an
/// entry past the last is refused, naming the flag and the entries there are, never drawn as the last one.
///
/// # Errors
/// `at` is past the last entry.
pub fn check_at(at: Moment, steps: u64) -> Result<u64> {
    if at.position() > steps {
        match steps {
            0 => bail!("--at {at}: the recording has no entry (only `--at start`)"),
            _ => bail!("--at {at}: the recording has {steps} entries (`--at start`, or entry 0 to {})", steps - 1),
        }
    }
    Ok(at.position())
}

/// Recordings of more entries than this open in one pane ([`Session::open`]): four panes of a 1 GB file (14 million
/// entries) held 7.7 times the file where one holds 2.5 times (BENCHMARKS.md, "A 1 GB snapshot in the app").
pub const ONE_PANE_ENTRIES: u64 = 2_000_000;

/// How a file opens: which device of a PyTorch snapshot, on how much memory, by which rules. The app keeps them for
/// every file it opens (`heapscope gui FILE --device N --capacity SIZE --block-size SIZE ...`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// The device of a PyTorch snapshot; `None`: the one that ran out of memory, else the one with the most trace
    /// entries ([`heapscope_lab::recording::default_device`]).
    pub device: Option<usize>,
    /// Device memory of the replays; `None`: unlimited.
    pub capacity_bytes: Option<u64>,
    /// The heap rules over the defaults (or a story's own).
    pub rules: RuleOverrides,
}

/// Heap rules given on the command line of `gui` and `render`, each over the defaults (or a story's own) where given:
/// what a lesson sets to show one rule at work.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleOverrides {
    /// The heap contenders' preferred block size (`--block-size`).
    pub block_size_bytes: Option<u64>,
    /// Requests from this size get a block of their own (`--dedicated-threshold`).
    pub dedicated_threshold_bytes: Option<u64>,
    /// When empty blocks go back (`--release`).
    pub release: Option<heapscope_core::ReleaseRule>,
    /// PyTorch's settings (`--alloc-conf`, `PYTORCH_CUDA_ALLOC_CONF` syntax).
    pub alloc_conf: Option<String>,
    /// `paged`'s page size (`--page-size`).
    pub page_bytes: Option<u64>,
}

impl RuleOverrides {
    /// Whether any rule is given.
    pub fn any(&self) -> bool {
        *self != Self::default()
    }

    /// `config` with these rules over it for opening `recording`: without `--block-size`, a small recording (its peak
    /// under an eighth of the default block) gets blocks of twice its peak (at least 2 MiB), so that its allocations
    /// are not slivers of a 256 MiB block on the map.
    pub fn apply_to(&self, recording: &Recording, config: CompareConfig) -> CompareConfig {
        let mut config = self.apply(config);
        if self.block_size_bytes.is_none() {
            // A walk over the recording's events: only when the block size is not given.
            let peak_bytes = heapscope_lab::top::peak(recording).1;
            if peak_bytes < config.heap.block_size_bytes / 8 {
                config.heap.block_size_bytes = (2 * peak_bytes).next_power_of_two().max(2 << 20);
            }
        }
        config
    }

    /// `config` with these rules over it.
    pub fn apply(&self, config: CompareConfig) -> CompareConfig {
        let mut config = config;
        if let Some(bytes) = self.block_size_bytes {
            config.heap.block_size_bytes = bytes;
        }
        if let Some(bytes) = self.dedicated_threshold_bytes {
            config.heap.dedicated_threshold_bytes = bytes;
        }
        if let Some(release) = self.release {
            config.heap.release = release;
        }
        if let Some(conf) = &self.alloc_conf {
            config.alloc_conf = Some(conf.clone());
        }
        if let Some(bytes) = self.page_bytes {
            config.page_bytes = bytes;
        }
        config
    }
}

/// Where a pane reserved the most (the first such step), and its layout there.
#[derive(Debug)]
struct Peak {
    /// The last step looked at.
    scanned: u64,
    /// The step.
    position: u64,
    /// The layout after it.
    layout: Layout,
}

/// One contender's view of the recording.
#[derive(Debug)]
pub struct Pane {
    /// Who replays; `None` for a live source.
    pub contender: Option<Contender>,
    /// The advice's setting it replays with, when it is one of its rows ([`Session::add_setting_pane`]).
    pub setting: Option<String>,
    /// Its replay, step by step.
    pub timeline: Timeline,
    /// The layout after `layout_steps` steps.
    pub layout: Layout,
    /// Steps `layout` has seen.
    pub layout_steps: u64,
    /// Zoom and scroll of its map.
    pub view: MapView,
    /// The layout one step before `layout` (after `layout_steps - 1` steps), once asked for: what the step shown
    /// changed, for its animation and explanation. Kept in step with `layout` by short moves, dropped by seeks.
    before: Option<Layout>,
    /// The layout where it reserved the most, once asked for: what one scale over the whole recording must fit.
    peak: Option<Peak>,
}

impl Pane {
    fn new(contender: Option<Contender>, timeline: Timeline) -> Self {
        Self {
            contender,
            setting: None,
            layout: timeline.layout_at(0),
            timeline,
            layout_steps: 0,
            view: MapView::default(),
            before: None,
            peak: None,
        }
    }

    /// The scale that fits, in maps `height` points tall, its layout at the first step where it reserved the most.
    pub fn peak_fit(&mut self, height: f32) -> Scale {
        let steps = self.timeline.steps();
        let timeline = &self.timeline;
        let reserved = |position: u64| timeline.sample_at(position).reserved_bytes;
        // Only the steps a growing (live) timeline added since the last call are scanned; the layout is rebuilt only
        // when the peak moves.
        let (from, known) = self.peak.as_ref().map_or((0, 0), |peak| (peak.scanned + 1, peak.position));
        let position =
            (from..=steps).fold(known, |best, position| if reserved(position) > reserved(best) { position } else { best });
        match &mut self.peak {
            Some(peak) if peak.position == position => peak.scanned = steps,
            _ => self.peak = Some(Peak { scanned: steps, position, layout: timeline.layout_at(position) }),
        }
        let layout = self.peak.as_ref().map_or(&self.layout, |peak| &peak.layout);
        Rows::fit(layout, &self.timeline, height)
    }

    /// The name in its header.
    pub fn name(&self) -> &str {
        &self.timeline.contender
    }

    /// Moves the layout to `steps` steps: forward by replaying when the move is short, else from a checkpoint.
    pub fn seek(&mut self, steps: u64) {
        let steps = steps.min(self.timeline.steps());
        if steps == self.layout_steps {
            return;
        }
        if self.is_short_move(steps) {
            if let Some(before) = &mut self.before {
                self.timeline.advance(before, self.layout_steps - 1, steps - 1);
            }
            self.timeline.advance(&mut self.layout, self.layout_steps, steps);
        } else {
            let old = (std::mem::replace(&mut self.layout, self.timeline.layout_at(steps)), self.before.take());
            // Freeing a big layout costs about as much as building one: off the frame's path.
            if old.0.totals().live_allocations >= FREE_ELSEWHERE_ALLOCATIONS {
                // Without a thread (none to be had) it is freed here, as any other.
                let _ = std::thread::Builder::new().name("heapscope-free-layout".into()).spawn(move || drop(old));
            }
        }
        self.layout_steps = steps;
    }

    /// Whether moving to `steps` steps replays from the current layout (cheap) rather than seeking from a
    /// checkpoint.
    fn is_short_move(&self, steps: u64) -> bool {
        let steps = steps.min(self.timeline.steps());
        steps == self.layout_steps || (steps > self.layout_steps && steps - self.layout_steps <= SHORT_MOVE_STEPS)
    }

    /// The timeline, and the layout before its step `step` (after `step` steps): borrowed when `step` is the step
    /// just shown (kept from then on as playback moves forward), else sought.
    pub fn layout_before(&mut self, step: u64) -> (&Timeline, Cow<'_, Layout>) {
        if step + 1 != self.layout_steps {
            return (&self.timeline, Cow::Owned(self.timeline.layout_at(step)));
        }
        let timeline = &self.timeline;
        (timeline, Cow::Borrowed(self.before.get_or_insert_with(|| timeline.layout_at(step))))
    }
}

/// A recording and its panes.
#[derive(Debug)]
pub struct Session {
    /// What to call it (the file or the story).
    pub name: String,
    /// One sentence about it (a story's summary).
    pub summary: String,
    /// The recording (empty for a live source).
    pub recording: Recording,
    /// Settings shared by the contenders.
    pub config: CompareConfig,
    /// Every device of the recording's snapshot that records something (the device picker's choices; empty for a
    /// trace).
    pub devices: Vec<DeviceOverview>,
    /// Per trace slot.
    pub slots: Vec<SlotInfo>,
    /// The colours of the recording's stacks and categories (those allocating the most bytes, a hue each).
    pub hues: RecordingHues,
    /// The panes, left to right.
    pub panes: Vec<Pane>,
    /// What the app should say about how it opened (a large recording in one pane).
    pub note: Option<String>,
    /// What the panes side by side do not tell apart ([`heapscope_lab::caveats`]: private memory pools, streams that
    /// some pane ignores), said when the recording opens.
    pub caveats: Vec<String>,
    /// A live source feeding the first pane, if any.
    pub live: Option<Box<dyn LiveSource>>,
    /// For a live source: the slot of the allocation live at each address, so a free finds its slot.
    live_slots: HashMap<u64, u32>,
}

impl Session {
    /// `recording` replayed by `contenders` (1 to 4) with `config`.
    ///
    /// # Errors
    /// No contender or more than [`MAX_PANES`], or a replay that fails (bad settings).
    pub fn new(recording: Recording, config: CompareConfig, contenders: &[Contender]) -> Result<Self> {
        if contenders.is_empty() || contenders.len() > MAX_PANES {
            bail!("{} contenders: a session shows 1 to {MAX_PANES}", contenders.len());
        }
        let slots = slot_infos(&recording);
        let hues = recording_hues(&recording, &slots);
        // A snapshot of several devices shows one: say which.
        let name = recording.shown_name();
        let devices = recording.snapshot.as_ref().map(device_overview).unwrap_or_default();
        let caveats = heapscope_lab::caveats::all(&recording, contenders, &config);
        let mut session = Self {
            name,
            summary: String::new(),
            recording,
            config,
            devices,
            slots,
            hues,
            panes: Vec::new(),
            live: None,
            live_slots: HashMap::new(),
            note: None,
            caveats,
        };
        // Each contender replays the recording on a thread of its own: opening a big trace costs its slowest
        // contender, not all of them in turn.
        let timelines: Vec<Result<Timeline, heapscope_core::Error>> = std::thread::scope(|scope| {
            let (recording, config) = (&session.recording, &session.config);
            let replays: Vec<_> =
                contenders.iter().map(|&contender| scope.spawn(move || record(recording, contender, config))).collect();
            replays.into_iter().map(|replay| replay.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
        });
        for (&contender, timeline) in contenders.iter().zip(timelines) {
            session.panes.push(Pane::new(Some(contender), timeline?));
        }
        Ok(session)
    }

    /// The built-in story `story` on a device of its size, the heap contenders by its rules (blocks of 256 MiB, or one
    /// range that compacts).
    ///
    /// # Errors
    /// A replay that fails.
    pub fn story(story: Story, contenders: &[Contender]) -> Result<Self> {
        // No contender named: the lesson's own panes, else the side-by-side four.
        let contenders = match (contenders, story.panes) {
            ([], []) => Contender::SIDE_BY_SIDE.to_vec(),
            ([], panes) => panes.to_vec(),
            (named, _) => named.to_vec(),
        };
        let contenders = contenders.as_slice();
        let config = story.config();
        let summary = story.summary.to_owned();
        let mut session = Self::new(Recording::from_trace(story.trace), config, contenders)?;
        session.name = story.name.to_owned();
        session.summary = summary;
        Ok(session)
    }

    /// The built-in story called `name`.
    ///
    /// # Errors
    /// No story of that name, or a replay that fails.
    pub fn story_named(name: &str, contenders: &[Contender]) -> Result<Self> {
        let Some(story) = story::named(name) else {
            let names: Vec<&str> = story::all().iter().map(|story| story.name).collect();
            bail!("no built-in story {name:?}: the stories are {}", names.join(", "));
        };
        Self::story(story, contenders)
    }

    /// The recording in the file at `path`, on the device and with the memory `options` say.
    ///
    /// # Errors
    /// The file cannot be read or parsed, or has no such device (the error names it), or a replay fails.
    pub fn open(path: &Path, contenders: &[Contender], options: &OpenOptions) -> Result<Self> {
        // The core's errors name the file already ("cannot read F: …", "F: the file is empty", "F:2: …").
        let recording = Recording::open_device(path, options.device)?;
        // Every pane replays the whole recording and keeps its own timeline: a large one opens in one pane.
        let entries = recording.entries;
        if entries > ONE_PANE_ENTRIES && contenders.len() > 1 {
            let mut session = Self::opened(recording, &contenders[..1], options)?;
            session.note = Some(format!(
                "{} entries: opened in one pane ({}); each pane replays the whole recording and keeps its own timeline \
                 (about 190 bytes an entry), so add the others with \"+ pane\" as memory allows",
                entries,
                contenders[0].name()
            ));
            return Ok(session);
        }
        Self::opened(recording, contenders, options)
    }

    /// `recording` (a file's, on its device) through `contenders`, on the memory and by the rules `options` say: the
    /// capacity and the heaps' block size follow the device's own recording (its `oom` entry, its peak). (The device
    /// picker keeps the panes the user has, however large the recording: [`Session::open`] alone opens a large one in
    /// one pane.)
    fn opened(recording: Recording, contenders: &[Contender], options: &OpenOptions) -> Result<Self> {
        // The capacity asked for, else the device the recording tells (its oom entry), else unlimited.
        let capacity_bytes = Capacity::of(options.capacity_bytes, &recording).bytes;
        let config = options.rules.apply_to(&recording, CompareConfig { capacity_bytes, ..CompareConfig::default() });
        Self::new(recording, config, contenders)
    }

    /// The same recording replayed again under `rules` over its settings (a story opened with rules of its own).
    ///
    /// # Errors
    /// A replay that fails (bad settings).
    pub fn with_rules(self, rules: &RuleOverrides) -> Result<Self> {
        if !rules.any() {
            return Ok(self);
        }
        let contenders: Vec<Contender> = self.panes.iter().filter_map(|pane| pane.contender).collect();
        let (name, summary) = (self.name.clone(), self.summary.clone());
        let mut session = Self::new(self.recording, rules.apply(self.config), &contenders)?;
        (session.name, session.summary) = (name, summary);
        Ok(session)
    }

    /// The same recording on `device` of its snapshot (the app's device picker), with the same contenders, opened
    /// as a file opens with `options` (the memory asked for, else what that device's recording tells; the heaps'
    /// block size from its peak, not the device shown before).
    ///
    /// # Errors
    /// A recording that is no snapshot, a device it records nothing on (the error lists those it has), or a replay
    /// that fails.
    pub fn on_device(&self, device: usize, options: &OpenOptions) -> Result<Self> {
        let Some(snapshot) = &self.recording.snapshot else {
            bail!("{} is no PyTorch snapshot: it has one device", self.recording.name);
        };
        let recording = Recording::from_snapshot(&self.recording.name, snapshot.clone(), device)?;
        let mut contenders: Vec<Contender> =
            self.panes.iter().filter(|pane| pane.setting.is_none()).filter_map(|pane| pane.contender).collect();
        // Every pane a setting of the advice: a plain pane opens first (a session has one at least) and goes once the
        // first setting's pane is there, so as many panes as before fit.
        let only_settings = contenders.is_empty();
        if only_settings {
            contenders.push(Contender::Pytorch { expandable: false });
        }
        let mut session = Self::opened(recording, &contenders, options)?;
        for setting in self.panes.iter().filter_map(|pane| pane.setting.as_deref()) {
            session.add_setting_pane(setting)?;
            if only_settings && session.panes[0].setting.is_none() {
                session.panes.remove(0);
            }
        }
        Ok(session)
    }

    /// A session fed by `source`, in one pane, growing as it reports.
    pub fn live(name: &str, source: Box<dyn LiveSource>) -> Self {
        Self {
            name: name.to_owned(),
            summary: String::new(),
            recording: Recording::from_trace(heapscope_core::Trace::default()),
            config: CompareConfig::default(),
            devices: Vec::new(),
            slots: Vec::new(),
            hues: RecordingHues::default(),
            panes: vec![Pane::new(None, Timeline::new(name))],
            live: Some(source),
            live_slots: HashMap::new(),
            note: None,
            caveats: Vec::new(),
        }
    }

    /// Adds a pane replaying with `contender` (no more than [`MAX_PANES`]).
    ///
    /// # Errors
    /// A replay that fails, or too many panes.
    pub fn add_pane(&mut self, contender: Contender) -> Result<()> {
        if self.panes.len() >= MAX_PANES {
            bail!("at most {MAX_PANES} panes side by side");
        }
        let timeline = record(&self.recording, contender, &self.config)?;
        self.panes.push(Pane::new(Some(contender), timeline));
        Ok(())
    }

    /// Adds a pane replaying with PyTorch's allocator under `setting`, a `PYTORCH_CUDA_ALLOC_CONF` string over
    /// PyTorch's defaults (a row of the advice: the run that fits, beside the one that failed), or `paged` with
    /// CUDA's 2 MiB pages.
    ///
    /// # Errors
    /// A setting PyTorch would refuse, a replay that fails, or too many panes.
    pub fn add_setting_pane(&mut self, setting: &str) -> Result<()> {
        if self.panes.len() >= MAX_PANES {
            bail!("at most {MAX_PANES} panes side by side");
        }
        let (contender, config) = if setting == heapscope_lab::advise::PAGED {
            let page_bytes = heapscope_lab::cuda_cost::CUDA_PAGE_BYTES;
            (Contender::Paged, CompareConfig { page_bytes, paged_unmap: UnmapRule::UnderPressure, ..self.config.clone() })
        } else {
            let mut conf = AllocConf::default();
            conf.parse_overrides(setting).map_err(|error| anyhow::anyhow!("setting {setting:?}: {error}"))?;
            (Contender::Pytorch { expandable: false }, CompareConfig { pytorch_settings: Some(conf), ..self.config.clone() })
        };
        let mut timeline = record(&self.recording, contender, &config)?;
        let shown = if setting.is_empty() { "PyTorch's defaults" } else { setting };
        timeline.contender = format!("{} ({shown})", timeline.contender);
        self.panes.push(Pane { setting: Some(setting.to_owned()), ..Pane::new(Some(contender), timeline) });
        Ok(())
    }

    /// Replaces pane `index`'s contender.
    ///
    /// # Errors
    /// A replay that fails; the pane is unchanged then.
    pub fn set_contender(&mut self, index: usize, contender: Contender) -> Result<()> {
        let timeline = record(&self.recording, contender, &self.config)?;
        let Some(pane) = self.panes.get_mut(index) else { bail!("no pane {index}") };
        let steps = pane.layout_steps;
        *pane = Pane::new(Some(contender), timeline);
        pane.seek(steps);
        Ok(())
    }

    /// The trace's caption shown once `shown_steps` positions are played (a lesson's `#` line): the last one at or
    /// before the event just done (at the start, one placed before the first event).
    pub fn caption(&self, shown_steps: u64) -> Option<&str> {
        let trace = &self.recording.trace;
        if trace.captions().is_empty() {
            return None;
        }
        // The events done by then: moments grow with the events.
        let (mut low, mut high) = (0usize, trace.events().len());
        while low < high {
            let middle = low + (high - low) / 2;
            if self.recording.moment_of(middle as u64).position() <= shown_steps { low = middle + 1 } else { high = middle }
        }
        trace.caption_at(low.saturating_sub(1)).map(|caption| caption.text.as_str())
    }

    /// Steps of the longest timeline.
    pub fn steps(&self) -> u64 {
        self.panes.iter().map(|pane| pane.timeline.steps()).max().unwrap_or(0)
    }

    /// The position of moment `at`, checked against this session's length (see [`check_at`]).
    ///
    /// # Errors
    /// `at` is past the last entry.
    pub fn check_at(&self, at: Moment) -> Result<u64> {
        check_at(at, self.steps())
    }

    /// The moment `--at` names (`gui` and `render`, [`moment_to_draw`]), except that `oom` on a recording with no
    /// out-of-memory entry, where a pane refused a request on the capacity it replays on, is the first such refusal
    /// (the earliest of the panes'), with the sentence that says so: the map shows a request refused either way.
    ///
    /// # Errors
    /// [`TopError::NoOom`] for `oom` where nothing was refused at all.
    pub fn moment_at(&self, at: TopAt) -> Result<(Moment, Option<String>)> {
        match moment_to_draw(&self.recording, at) {
            Err(TopError::NoOom { .. })
                if let Some((pane, step)) = self
                    .panes
                    .iter()
                    .filter_map(|pane| pane.timeline.refusals().first().map(|&(step, _)| (pane, step)))
                    .min_by_key(|&(_, step)| step) =>
            {
                let moment = Moment::at_position(step + 1);
                let said = format!(
                    "{} records no out-of-memory entry: --at oom draws the first request a pane refused, {}'s at {moment}",
                    self.recording.shown_name(),
                    pane.name()
                );
                Ok((moment, Some(said)))
            }
            drawn => Ok((drawn?, None)),
        }
    }

    /// Moves every pane to `steps` steps. Panes that must seek from a checkpoint do it in parallel (each costs a
    /// rebuild of its layout); short moves replay in place.
    pub fn seek(&mut self, steps: u64) {
        let seeking = self.panes.iter().filter(|pane| !pane.is_short_move(steps)).count();
        if seeking < 2 {
            for pane in &mut self.panes {
                pane.seek(steps);
            }
            return;
        }
        std::thread::scope(|scope| {
            for pane in &mut self.panes {
                scope.spawn(move || pane.seek(steps));
            }
        });
    }

    /// Takes what the live source reported into the first pane.
    ///
    /// # Errors
    /// A report that contradicts the layout so far (the source is then dropped).
    pub fn poll_live(&mut self) -> Result<()> {
        let Some(source) = &mut self.live else { return Ok(()) };
        let steps = source.poll();
        let pane = &mut self.panes[0];
        for step in steps {
            let index = pane.timeline.steps();
            if let Err(error) = pane.timeline.push(&step.changes, step.refusal) {
                self.live = None;
                bail!("live source: {error}");
            }
            // Each allocation's steps, as a recording's slots have them (hover: its lifetime).
            for change in &step.changes {
                match *change {
                    Change::Allocated(span) if span.is_before_recording() => {}
                    Change::Allocated(span) => {
                        let slot = span.slot as usize;
                        if slot >= self.slots.len() + MAX_LIVE_SLOT_GAP {
                            self.live = None;
                            bail!(
                                "live source: step {index} allocates slot {slot}, {} past the slots so far \
                                 (slots number a source's allocations from 0)",
                                slot - self.slots.len()
                            );
                        }
                        if self.slots.len() <= slot {
                            self.slots.resize(slot + 1, SlotInfo::default());
                        }
                        self.slots[slot] = SlotInfo { alloc_step: index, free_step: None, stack: 0, category: 0 };
                        self.live_slots.insert(span.address, span.slot);
                    }
                    Change::Freed { address } => {
                        if let Some(info) = self.live_slots.remove(&address).and_then(|slot| self.slots.get_mut(slot as usize)) {
                            info.free_step = Some(index);
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// The stack frames of the allocation in `slot`, innermost first, as `function (file:line)`, folded as
    /// memory_viz folds them ([`heapscope_pytorch::frames`]), and how many frames the fold dropped.
    pub fn frames(&self, slot: u32) -> Folded {
        self.stack(self.slots.get(slot as usize).map_or(0, |slot| slot.stack))
    }

    /// The folded stack frames of the request of entry `entry` (a refused one's own stack, at an `oom` entry).
    pub fn entry_frames(&self, entry: u64) -> Folded {
        let entries = self.recording.snapshot.as_ref().and_then(|snapshot| snapshot.device_traces.get(self.recording.device));
        let stack = entries.and_then(|entries| entries.get(usize::try_from(entry).ok()?)).map_or(0, |entry| entry.frames.0);
        self.stack(stack)
    }

    /// The category of the allocation in `slot` as `key: text`, if its entry names one.
    pub fn category(&self, slot: u32) -> Option<String> {
        let id = self.slots.get(slot as usize).map_or(0, |slot| slot.category);
        self.category_name(id)
    }

    /// Category `id` of the snapshot as `key: text` (`None` for none).
    fn category_name(&self, id: u32) -> Option<String> {
        let id = heapscope_pytorch::CategoryId(u16::try_from(id).ok()?);
        self.recording.snapshot.as_ref()?.category(id).map(ToString::to_string)
    }

    /// The groups of `colour_by` (stacks, or categories for [`ColourBy::Category`]) the allocations live in the first
    /// pane belong to, by their bytes, largest first, at most `limit`: each with its colour group (what
    /// [`Session::hues`] colours), its name (a stack's innermost user frame, a category as `key: text`;
    /// `None` where the file recorded none) and the bytes live from it. What a render coloured by group says in its
    /// legend.
    pub fn group_legend(&self, colour_by: ColourBy, limit: usize) -> Vec<(u32, Option<String>, u64)> {
        let Some(pane) = self.panes.first() else { return Vec::new() };
        let mut bytes: HashMap<u32, u64> = HashMap::new();
        for span in pane.layout.spans() {
            let group = self.slots.get(span.slot as usize).map_or(0, |slot| slot.group(colour_by));
            *bytes.entry(group).or_insert(0) += span.requested_bytes;
        }
        let mut rows: Vec<(u32, u64)> = bytes.into_iter().collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let name = |group: u32| {
            if colour_by == ColourBy::Category {
                return self.category_name(group);
            }
            let stacks = &self.recording.snapshot.as_ref()?.frame_stacks;
            heapscope_pytorch::frames::user_frame(stacks.get(group as usize)?).map(heapscope_pytorch::frames::describe)
        };
        rows.into_iter().take(limit).map(|(group, bytes)| (group, name(group), bytes)).collect()
    }

    /// The frame list `stack` of the snapshot, folded.
    pub fn stack(&self, stack: u32) -> Folded {
        let Some(frames) = self.recording.snapshot.as_ref().and_then(|snapshot| snapshot.frame_stacks.get(stack as usize)) else {
            return Folded::default();
        };
        let kept: Vec<String> = heapscope_pytorch::frames::folded(frames).map(heapscope_pytorch::frames::describe).collect();
        Folded { dropped: frames.len() - kept.len(), frames: kept }
    }
}

/// Stack frames as shown: the kept ones, innermost first, and how many allocator, unwinder and interpreter frames
/// were folded away.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Folded {
    /// `function (file:line)`, innermost first.
    pub frames: Vec<String>,
    /// Frames dropped by the fold.
    pub dropped: usize,
}

impl Folded {
    /// The frames as text lines under `title`, at most `limit` of them, then what was left out; empty without frames.
    pub fn lines(&self, title: &str, limit: usize) -> String {
        if self.frames.is_empty() && self.dropped == 0 {
            return String::new();
        }
        let mut text = format!("\n{title}:");
        for frame in self.frames.iter().take(limit) {
            text.push_str(&format!("\n  {frame}"));
        }
        if self.frames.len() > limit {
            text.push_str(&format!("\n  ... {} more", self.frames.len() - limit));
        }
        if self.dropped > 0 {
            text.push_str(&format!("\n  ({} allocator and interpreter frames folded)", self.dropped));
        }
        text
    }
}

/// How far past the slots so far a live source's next slot may be (slots number its allocations from 0; a gap this
/// large is a source that does not, and would cost memory for nothing).
const MAX_LIVE_SLOT_GAP: usize = 1 << 20;

/// Allocation and free steps, and stack frames, per slot of `recording`.
pub fn slot_infos(recording: &Recording) -> Vec<SlotInfo> {
    let mut slots = vec![SlotInfo::default(); recording.trace.slots() as usize];
    let origins = heapscope_lab::top::allocation_origins(recording);
    for (event_index, event) in (0..).zip(recording.trace.events()) {
        // Steps are entries: an allocation live at the start is born at entry 0 (its span says "before").
        let step = match recording.moment_of(event_index) {
            Moment::Start => 0,
            Moment::Entry(entry) => entry,
        };
        match *event {
            Event::Alloc { slot, .. } => {
                let origin = origins[event_index as usize];
                let (stack, category) = (origin.stack.0, u32::from(origin.category.0));
                slots[slot as usize] = SlotInfo { alloc_step: step, free_step: None, stack, category };
            }
            Event::Free { slot } => slots[slot as usize].free_step = Some(step),
            Event::EmptyCache => {}
        }
    }
    slots
}

/// The colours of `recording`'s stacks and categories: each ranked by the bytes its allocations request over the
/// recording (`slots`: what [`slot_infos`] found).
pub fn recording_hues(recording: &Recording, slots: &[SlotInfo]) -> RecordingHues {
    let allocations: Vec<(SlotInfo, u64)> = recording
        .trace
        .events()
        .iter()
        .filter_map(|event| match *event {
            Event::Alloc { slot, size_bytes } => Some((slots.get(slot as usize).copied()?, size_bytes)),
            _ => None,
        })
        .collect();
    RecordingHues {
        stack: GroupHues::ranked(allocations.iter().map(|(slot, bytes)| (slot.stack, *bytes))),
        category: GroupHues::ranked(allocations.iter().map(|(slot, bytes)| (slot.category, *bytes))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_core::PolicyKind;
    use heapscope_lab::timeline::Span;

    use crate::live::{ChannelSource, LiveStep};

    /// A live source's allocations get their steps as a recording's slots do: born where allocated, freed where
    /// freed (an address reused by a later allocation belongs to that one).
    #[test]
    fn live_allocations_know_their_lifetimes() {
        let (source, sender) = ChannelSource::new();
        let mut session = Session::live("live", Box::new(source));
        let span = |address, slot, born| Span {
            address,
            footprint_bytes: 256,
            lead_bytes: 0,
            requested_bytes: 200,
            slot,
            before_recording: false,
            born,
        };
        let region = Change::RegionAdded { address: 0, size_bytes: 4096, kind: heapscope_lab::timeline::RegionKind::Block };
        let steps = [
            vec![region, Change::Allocated(span(0, 0, 0))],
            vec![Change::Allocated(span(256, 1, 1))],
            vec![Change::Freed { address: 0 }],
            vec![Change::Allocated(span(0, 2, 3))],
        ];
        for changes in steps {
            sender.send(LiveStep { changes, refusal: None }).unwrap();
        }
        session.poll_live().unwrap();
        let lifetimes: Vec<(u64, Option<u64>)> = session.slots.iter().map(|slot| (slot.alloc_step, slot.free_step)).collect();
        assert_eq!(lifetimes, [(0, Some(2)), (1, None), (3, None)]);
        // A slot far past the others is refused, named, not allocated for.
        sender.send(LiveStep { changes: vec![Change::Allocated(span(512, u32::MAX - 1, 4))], refusal: None }).unwrap();
        let error = session.poll_live().unwrap_err().to_string();
        assert!(error.contains("step 4 allocates slot 4294967294"), "{error}");
        assert!(session.live.is_none() && session.slots.len() == 3, "the source is dropped, what arrived stays");
    }

    #[test]
    fn at_is_checked_against_the_recording() {
        // (at, steps, the position or the error)
        let cases: [(Moment, u64, Result<u64, &str>); 7] = [
            (Moment::Start, 82, Ok(0)),
            (Moment::Entry(0), 82, Ok(1)),
            (Moment::Entry(60), 82, Ok(61)),
            (Moment::Entry(81), 82, Ok(82)),
            (Moment::Entry(82), 82, Err("--at entry 82: the recording has 82 entries (`--at start`, or entry 0 to 81)")),
            (Moment::Entry(0), 0, Err("--at entry 0: the recording has no entry (only `--at start`)")),
            (Moment::Start, 0, Ok(0)),
        ];
        for (at, steps, expected) in cases {
            let checked = check_at(at, steps).map_err(|error| error.to_string());
            assert_eq!(checked, expected.map_err(str::to_owned), "--at {at} of {steps}");
        }
        let session = Session::story_named("frag_oom", &[Contender::Paged]).unwrap();
        assert_eq!(session.check_at(Moment::Entry(60)).unwrap(), 61);
        assert!(
            session
                .check_at(Moment::Entry(61))
                .unwrap_err()
                .to_string()
                .starts_with("--at entry 61: the recording has 61 entries")
        );
    }

    #[test]
    fn panes_seek_together_and_short_moves_match_seeks() {
        let mut session = Session::story_named("frag_oom", &Contender::SIDE_BY_SIDE).unwrap();
        assert_eq!((session.panes.len(), session.steps()), (4, 61));
        for steps in [10, 45, 3, 61, 61, 0] {
            session.seek(steps);
            for pane in &session.panes {
                assert_eq!(pane.layout, pane.timeline.layout_at(steps), "{} at {steps}", pane.name());
            }
        }
        assert!(session.add_pane(Contender::Paged).is_err(), "four panes at most");
        session.set_contender(2, Contender::Heap(PolicyKind::Buddy)).unwrap();
        assert_eq!(session.panes[2].name(), "buddy");
    }

    /// The layout before the step shown is kept by short moves forward, sought again after a seek, and equals
    /// the layout sought from the timeline either way; any other step is sought.
    #[test]
    fn the_layout_before_the_step_shown_follows_playback() {
        let mut session = Session::story_named("training_step", &Contender::SIDE_BY_SIDE).unwrap();
        let steps = session.steps();
        for position in [1, 2, 3, 7, steps / 2, steps / 2 + 1, steps, 4, 5] {
            session.seek(position);
            for pane in &mut session.panes {
                let expected = pane.timeline.layout_at(position - 1);
                let (timeline, before) = pane.layout_before(position - 1);
                assert!(matches!(before, Cow::Borrowed(_)), "the step shown is kept");
                assert_eq!(*before, expected, "{} at {position}", timeline.contender);
                if position / 2 + 1 != position {
                    let (_, other) = pane.layout_before(position / 2);
                    assert!(matches!(other, Cow::Owned(_)), "another step is sought");
                }
            }
        }
    }

    #[test]
    fn slots_know_their_lifetimes() {
        let session = Session::story_named("frag_oom", &[Contender::Paged]).unwrap();
        assert_eq!(session.slots[0], SlotInfo { alloc_step: 0, free_step: Some(20), stack: 0, category: 0 });
        assert_eq!(session.slots[40], SlotInfo { alloc_step: 60, free_step: None, stack: 0, category: 0 });
        assert!(session.frames(0).frames.is_empty(), "a story records no frames");
    }

    #[test]
    fn folded_frames_read_as_lines_saying_what_was_left_out() {
        let folded = Folded { frames: (0..3).map(|i| format!("f{i} (m.py:{i})")).collect(), dropped: 5 };
        let cases = [
            (10, "\nstack:\n  f0 (m.py:0)\n  f1 (m.py:1)\n  f2 (m.py:2)\n  (5 allocator and interpreter frames folded)"),
            (1, "\nstack:\n  f0 (m.py:0)\n  ... 2 more\n  (5 allocator and interpreter frames folded)"),
        ];
        for (limit, expected) in cases {
            assert_eq!(folded.lines("stack", limit), expected, "limit {limit}");
        }
        assert_eq!(Folded::default().lines("stack", 4), "", "no frames, no lines");
    }

    /// The real GPT-2 snapshot through the four side-by-side contenders: every pane replays it, frames are
    /// known per allocation, and seeking anywhere gives the layout replayed from the start.
    #[test]
    fn a_real_snapshot_opens_in_every_pane() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/traces/pytorch/gpt2_train_fixed-default.pickle.gz");
        let mut session = Session::open(&path, &Contender::SIDE_BY_SIDE, &OpenOptions::default()).unwrap();
        let steps = session.steps();
        assert!(steps > 10_000, "{steps}");
        for position in [steps / 2, 17, steps] {
            session.seek(position);
            for pane in &session.panes {
                assert_eq!(pane.timeline.steps(), steps, "{}", pane.name());
                assert_eq!(pane.layout, pane.timeline.layout_at(position), "{} at {position}", pane.name());
                assert!(pane.timeline.refusals().is_empty(), "{}: an unlimited device serves everything", pane.name());
            }
        }
    }

    /// A recording begun mid-run opens with its start state in every pane (position 0, the start: the same live
    /// bytes and one span per allocation live then), and every pane holds the same live bytes at every entry.
    #[test]
    fn every_pane_starts_from_the_start_state_and_serves_the_same_stream() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/traces/pytorch/gpt2_train_fixed-default.pickle.gz");
        let mut snapshot = heapscope_pytorch::read_snapshot(&path).unwrap();
        let entries = snapshot.device_traces[0].len();
        snapshot.device_traces[0].drain(..entries / 3);
        let recording = Recording::from_snapshot("mid-run", snapshot, 0).unwrap();
        let (start_events, start_bytes) = (recording.start_events, recording.start_bytes());
        assert!(start_events > 0 && start_bytes > 0);
        let session = Session::new(recording, CompareConfig::default(), &Contender::SIDE_BY_SIDE).unwrap();
        for pane in &session.panes {
            let start = pane.timeline.layout_at(0);
            assert_eq!(start.spans().filter(|span| span.is_before_recording()).count(), start_events, "{}", pane.name());
            assert_eq!(pane.timeline.start_sample().live_bytes, start_bytes, "{}", pane.name());
            assert_eq!(pane.timeline.steps(), session.steps(), "{}: a step per entry", pane.name());
            for position in 0..=session.steps() {
                let live = |pane: &Pane| pane.timeline.sample_at(position).live_bytes;
                assert_eq!(live(pane), live(&session.panes[0]), "{} at {}", pane.name(), Moment::at_position(position));
            }
        }
    }

    /// The peak's fit follows a growing timeline: new steps are scanned, the layout rebuilt when the peak moves, and it
    /// is the fit of the layout at the first step that reserved the most.
    #[test]
    fn the_peak_fit_follows_a_growing_timeline() {
        let block =
            |address| Change::RegionAdded { address, size_bytes: 64 << 20, kind: heapscope_lab::timeline::RegionKind::Block };
        let mut pane = Pane::new(None, Timeline::new("live"));
        pane.timeline.push(&[block(0)], None).unwrap();
        let expected = |pane: &Pane, position| Rows::fit(&pane.timeline.layout_at(position), &pane.timeline, 300.0);
        assert_eq!(pane.peak_fit(300.0), expected(&pane, 1));
        pane.timeline.push(&[block(1 << 30)], None).unwrap();
        pane.timeline.push(&[Change::RegionRemoved { address: 0 }], None).unwrap();
        assert_eq!(pane.peak_fit(300.0), expected(&pane, 2), "the two blocks of step 2");
        assert_eq!(pane.peak.as_ref().map(|peak| (peak.scanned, peak.position)), Some((3, 2)));
        pane.timeline.push(&[block(0)], None).unwrap();
        assert_eq!(pane.peak_fit(300.0), expected(&pane, 2), "as much again later: the first step keeps it");
    }

    /// A lesson's `#` lines are captions shown from their event on, in Teach me and renders.
    #[test]
    fn captions_follow_the_step_shown() {
        let text = "# Two blocks\na,1,150MiB\na,2,150MiB\n# Free the first\nf,1\n";
        let recording = Recording::from_trace(heapscope_core::Trace::parse_csv("lesson.csv", text).unwrap());
        let session = Session::new(recording, CompareConfig::default(), &[Contender::Paged]).unwrap();
        let shown: Vec<Option<&str>> = (0..=4).map(|steps| session.caption(steps)).collect();
        assert_eq!(
            shown,
            [Some("Two blocks"), Some("Two blocks"), Some("Two blocks"), Some("Free the first"), Some("Free the first")]
        );
    }

    /// Stack frames and categories name each allocation, colour it by group, and make a render's legend.
    #[test]
    fn stack_frames_and_categories_of_a_snapshot_name_each_allocation() {
        use heapscope_pytorch::{Action, Category, CategoryId, CategoryKey, Frame, Snapshot, StackId, TraceEntry};
        let frame = |name: &str, line| Frame { filename: "model.py".into(), line, name: name.into() };
        let entry = |action, addr, frames, category| {
            TraceEntry::new(action, addr, 4096).with_frames(frames).with_category(CategoryId(category))
        };
        let snapshot = Snapshot {
            device_traces: vec![vec![
                entry(Action::Alloc, 1 << 20, StackId(1), 1),
                entry(Action::Alloc, 2 << 20, StackId(2), 0),
                entry(Action::FreeCompleted, 1 << 20, StackId(1), 1),
            ]],
            frame_stacks: vec![Vec::new(), vec![frame("forward", 10), frame("main", 3)], vec![frame("backward", 20)]],
            categories: vec![Category::none(), Category { key: CategoryKey::UserMetadata, name: "forward".into() }],
            ..Snapshot::default()
        };
        let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
        let session = Session::new(recording, CompareConfig::default(), &[Contender::Pytorch { expandable: false }]).unwrap();
        let groups = |by| session.slots.iter().map(|slot| slot.group(by)).collect::<Vec<u32>>();
        assert_eq!(groups(ColourBy::StackGroup), [1, 2], "colour groups by stack");
        assert_eq!(groups(ColourBy::Category), [1, 0], "colour groups by category");
        assert_eq!(session.frames(0).frames, ["forward (model.py:10)", "main (model.py:3)"]);
        assert_eq!(session.frames(1).frames, ["backward (model.py:20)"]);
        assert_eq!(session.slots[0], SlotInfo { alloc_step: 0, free_step: Some(2), stack: 1, category: 1 });
        assert_eq!((session.category(0).as_deref(), session.category(1)), (Some("user_metadata: forward"), None));
        // The legend of a render by stack or category: what is live in the first pane, by group.
        let mut session = session;
        session.seek(2);
        assert_eq!(
            session.group_legend(ColourBy::StackGroup, 8),
            [(1, Some("forward (model.py:10)".to_owned()), 4096), (2, Some("backward (model.py:20)".to_owned()), 4096)]
        );
        assert_eq!(
            session.group_legend(ColourBy::Category, 8),
            [(0, None, 4096), (1, Some("user_metadata: forward".to_owned()), 4096)]
        );
        session.seek(3);
        let legend = session.group_legend(ColourBy::StackGroup, 8);
        assert_eq!(legend, [(2, Some("backward (model.py:20)".to_owned()), 4096)], "the first one freed");
    }

    /// A snapshot whose activity is on device 1 opens there by default, says so, and replays on the capacity
    /// asked for (refusing what does not fit); a device named opens that one, and a device it lacks is an error.
    #[test]
    fn a_file_opens_on_its_busiest_device_with_the_capacity_asked() {
        use heapscope_pytorch::{Action, Snapshot, TraceEntry};
        let alloc = |addr: u64, size: u64| TraceEntry::new(Action::Alloc, addr, size);
        let snapshot = Snapshot {
            device_traces: vec![vec![alloc(0, 4 << 20)], (0..3).map(|index| alloc(index << 30, 256 << 20)).collect()],
            ..Snapshot::default()
        };
        let dir = std::env::temp_dir().join(format!("heapscope-gui-devices-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("two_devices.pickle");
        heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
        let pytorch = [Contender::Pytorch { expandable: false }];
        // (options, the session's name ends with, steps, requests refused)
        let cases = [
            (OpenOptions::default(), "(device 1)", 3, 0),
            (OpenOptions { device: None, capacity_bytes: Some(600 << 20), ..OpenOptions::default() }, "(device 1)", 3, 1),
            (OpenOptions { device: Some(0), capacity_bytes: None, ..OpenOptions::default() }, "(device 0)", 1, 0),
        ];
        for (options, name, steps, refused) in cases {
            let session = Session::open(&path, &pytorch, &options).unwrap();
            assert!(session.name.ends_with(name), "{options:?}: {}", session.name);
            assert_eq!(session.config.capacity_bytes, options.capacity_bytes);
            assert_eq!(session.steps(), steps, "{options:?}");
            assert_eq!(session.panes[0].timeline.refusals().len(), refused, "{options:?}");
            // `--at oom` with no oom entry in the file: the first refusal on the capacity, said; else nothing to show.
            match (session.moment_at(TopAt::Oom), refused) {
                (Ok((moment, Some(said))), 1) => {
                    assert_eq!(moment, Moment::Entry(2), "{options:?}");
                    assert!(said.ends_with("--at oom draws the first request a pane refused, pytorch's at entry 2"), "{said}");
                }
                (Err(error), 0) => assert!(error.to_string().contains("has no out-of-memory entry"), "{error}"),
                (other, _) => panic!("{options:?}: {other:?}"),
            }
        }
        // The app opens every file with its options.
        let mut app = crate::HeapscopeApp::default();
        app.open_options = OpenOptions { device: None, capacity_bytes: Some(600 << 20), ..OpenOptions::default() };
        app.open_path(&path);
        let session = app.session.as_ref().unwrap();
        assert!(session.name.ends_with("(device 1)"), "{}", session.name);
        assert_eq!(session.config.capacity_bytes, Some(600 << 20));
        let missing =
            Session::open(&path, &pytorch, &OpenOptions { device: Some(2), capacity_bytes: None, ..OpenOptions::default() })
                .unwrap_err();
        assert!(format!("{missing:#}").contains("no device 2"), "{missing:#}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A recording of more than [`ONE_PANE_ENTRIES`] entries opens in one pane (the first contender), and says why.
    #[test]
    fn a_large_recording_opens_in_one_pane() {
        let mut builder = heapscope_core::TraceBuilder::new("large");
        for id in 0..=ONE_PANE_ENTRIES / 2 {
            builder.alloc(id, 4096).unwrap();
            builder.free(id).unwrap();
        }
        let dir = std::env::temp_dir().join(format!("heapscope-gui-large-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("large.hst");
        builder.finish().write_native(&path).unwrap();
        let contenders = [Contender::Heap(PolicyKind::Tlsf), Contender::Paged];
        let session = Session::open(&path, &contenders, &OpenOptions::default()).unwrap();
        assert_eq!(session.panes.len(), 1);
        assert_eq!(session.panes[0].name(), "tlsf");
        let note = session.note.clone().unwrap();
        assert!(note.starts_with(&format!("{} entries: opened in one pane (tlsf)", ONE_PANE_ENTRIES + 2)), "{note}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Issue 19: a small recording opens in blocks sized to it (its 64 KiB allocations are not slivers of 256 MiB),
    /// unless `--block-size` says otherwise; a large one keeps the default.
    #[test]
    fn a_small_recording_gets_blocks_of_its_size() {
        let dir = std::env::temp_dir().join(format!("heapscope-gui-small-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("small.csv");
        std::fs::write(&path, (0..24).map(|id| format!("a,{id},64KiB\n")).collect::<String>()).unwrap();
        let tlsf = [Contender::Heap(PolicyKind::Tlsf)];
        let session = Session::open(&path, &tlsf, &OpenOptions::default()).unwrap();
        assert_eq!(session.config.heap.block_size_bytes, 4 << 20, "twice the 1.5 MiB peak, to a power of two");
        let rules = RuleOverrides { block_size_bytes: Some(64 << 20), ..RuleOverrides::default() };
        let asked = Session::open(&path, &tlsf, &OpenOptions { rules, ..OpenOptions::default() }).unwrap();
        assert_eq!(asked.config.heap.block_size_bytes, 64 << 20);
        let large = Recording::from_trace(heapscope_core::Trace::parse_csv("l.csv", "a,1,1GiB\n").unwrap());
        let config = RuleOverrides::default().apply_to(&large, CompareConfig::default());
        assert_eq!(config.heap.block_size_bytes, CompareConfig::default().heap.block_size_bytes);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_requests_are_errors() {
        assert!(Session::story_named("nope", &[Contender::Paged]).unwrap_err().to_string().contains("frag_oom"));
        // No contender named: the lesson's own panes, else the side-by-side four; five are too many.
        assert_eq!(Session::story_named("frag_oom", &[]).unwrap().panes.len(), 4);
        assert_eq!(Session::story_named("internal_waste", &[]).unwrap().panes[0].name(), "buddy");
        assert!(Session::story_named("frag_oom", &[Contender::Paged; 5]).is_err());
        let missing =
            Session::open(Path::new("/nonexistent/trace.hst"), &[Contender::Paged], &OpenOptions::default()).unwrap_err();
        assert!(format!("{missing:#}").contains("/nonexistent/trace.hst"), "{missing:#}");
    }
}
