//! The app: a session of panes, the transport (play / pause / step / speed), the timeline plot, the side
//! panels, opening files (command line, drag and drop, a path box, "Open…" and its [`FileBrowser`]) and the
//! keyboard.
//!
//! Keys: Ctrl+O "Open…", Space play / pause, → next step (animated), ← previous step, Home / End the start / the end,
//! `[` / `]` slower / faster, O the next refused request (of the focused pane, else of any), T "Teach me", 1 to 4
//! focus that pane; these act only without modifiers. A click on a pane (its name or its map) focuses it too: "Why it failed", O and "Next OOM" follow the focused pane,
//! never the pointer's last crossing. On a map: wheel scrolls, ctrl + wheel (or pinch) zooms around the pointer,
//! drag scrolls, double-click fits the whole heap.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use egui::{Color32, Key, Modifiers, RichText, Ui};
use heapscope_lab::contender::Contender;
use heapscope_lab::recording::Moment;
use heapscope_lab::story;
use heapscope_lab::timeline::active::{self, ActiveTimeline};
use heapscope_lab::timeline::explain::explain;
use heapscope_lab::top::{Grouping, Top, TopAt, top};
use heapscope_vulkan::{ContextOptions, VulkanContext};

use crate::active_plot::{self, TimelineView};
use crate::advice::AdviceRun;
use crate::device_live::{self, LiveConfig};
use crate::file_browser::{BrowserAction, FileBrowser};
use crate::heap_map::StepAnimation;
use crate::live::LiveSource;
use crate::live_panel::{LiveAction, LivePanel};
use crate::palette::ColourBy;
use crate::panels;
use crate::panes::{self, PaneStyle, ScaleRule};
use crate::playback::{Clock, Playback, SPEEDS, SystemClock};
use crate::plot::{self, Series};
use crate::session::{OpenOptions, Session};

/// How often a live session redraws: 30 frames a second follow a run closely, and leave the device (which draws
/// every frame, on the very queue the run submits to) to the run the rest of the time.
pub const LIVE_FRAME: std::time::Duration = std::time::Duration::from_millis(33);

/// The heapscope app. See the module documentation.
#[derive(Debug)]
pub struct HeapscopeApp {
    /// What is shown (`None` until something opens).
    pub session: Option<Session>,
    /// Position and play state, shared by every pane.
    pub playback: Playback,
    /// How allocations are coloured.
    pub colour_by: ColourBy,
    /// Whether the "Teach me" panel shows.
    pub teach: bool,
    /// Whether the "What holds it" panel shows.
    pub holders: bool,
    /// What the timeline under the panes shows: the totals, every allocation (memory_viz's active memory timeline) or
    /// the focused pane's segments.
    pub timeline_view: TimelineView,
    /// How the maps are scaled against each other (one scale over the recording unless "fit each pane").
    pub scale_rule: ScaleRule,
    /// The allocations (or a pane's segments) over time of the recording shown, built when first asked for, under
    /// what they are of.
    active: Option<(String, ActiveTimeline)>,
    /// The allocation picked on the active memory timeline (its slot), outlined in every pane.
    pub selected: Option<u32>,
    /// What it shows: the live allocations grouped by stack at the moment shown (computed when the moment changes).
    holders_at: Option<(String, Moment, Top)>,
    /// The "Advice" panel's run, while the panel shows (started when it opens, for the session shown).
    pub advice: Option<AdviceRun>,
    /// The pane "Why it failed", "Next OOM" and the `O` key follow: the one clicked last (its name or its map)
    /// or picked with the keys 1 to 4, outlined on screen.
    pub focused: usize,
    /// The last error (a file that would not open), shown until dismissed.
    pub error: Option<String>,
    /// A message for the user.
    pub notice: Option<String>,
    /// The "Live" bar and its run on the device.
    pub live: LivePanel,
    /// "Open…", while it is open.
    pub file_browser: Option<FileBrowser>,
    /// The file opened last (where "Open…" starts).
    pub opened_path: Option<PathBuf>,
    /// The device and memory every file opens with (`heapscope gui --device N --capacity SIZE`).
    pub open_options: OpenOptions,
    /// heapscope's Vulkan device when the window draws with it ([`crate::shared_device`]): live runs run on it.
    pub window_device: Option<Arc<VulkanContext>>,
    clock: Box<dyn Clock>,
    /// The clock at the start of the last frame, while the playback moves (`None` once a frame leaves it still).
    last_seconds: Option<f64>,
    path_input: String,
    series: Vec<Series>,
    /// Per pane: the step explained and its sentence.
    sentences: Vec<Option<(u64, String)>>,
    /// Per pane: the step animated and its animation (without progress).
    animations: Vec<Option<(u64, StepAnimation)>>,
    /// A file being opened on another thread: its name and the worker.
    pending: Option<(String, std::thread::JoinHandle<anyhow::Result<Session>>)>,
}

impl Default for HeapscopeApp {
    fn default() -> Self {
        Self::new(Box::new(SystemClock::default()))
    }
}

impl HeapscopeApp {
    /// Computes what the "What holds it" panel shows at `shown` steps, unless it already shows that moment of the
    /// recording open.
    fn update_holders(&mut self, shown: u64) {
        let Some(session) = &self.session else {
            self.holders_at = None;
            return;
        };
        let moment = Moment::at_position(shown);
        let name = session.recording.shown_name();
        // Coloured by category, the rows are the categories.
        let grouping = if self.colour_by == ColourBy::Category { Grouping::Category } else { Grouping::UserFrame };
        if self.holders_at.as_ref().is_some_and(|(held, at, found)| *held == name && *at == moment && found.grouping == grouping)
        {
            return;
        }
        self.holders_at = top(&session.recording, TopAt::Moment(moment), grouping).ok().map(|found| (name, moment, found));
    }

    /// An app on `clock` showing the frag_oom story through PyTorch (default and expandable), TLSF and paging.
    pub fn new(clock: Box<dyn Clock>) -> Self {
        let mut app = Self {
            session: None,
            playback: Playback::default(),
            colour_by: ColourBy::default(),
            teach: false,
            holders: false,
            holders_at: None,
            timeline_view: TimelineView::Totals,
            scale_rule: ScaleRule::OneOverTheRecording,
            active: None,
            selected: None,
            advice: None,
            focused: 0,
            error: None,
            notice: None,
            live: LivePanel::default(),
            file_browser: None,
            opened_path: None,
            open_options: OpenOptions::default(),
            window_device: None,
            clock,
            last_seconds: None,
            path_input: String::new(),
            series: Vec::new(),
            sentences: Vec::new(),
            animations: Vec::new(),
            pending: None,
        };
        app.open_story("frag_oom");
        app
    }

    /// The contenders a newly opened recording gets: the panes open now (not the advice's settings: they were
    /// the recording's own), or the side-by-side four.
    pub(crate) fn contenders(&self) -> Vec<Contender> {
        let open: Vec<Contender> = self
            .session
            .iter()
            .flat_map(|session| session.panes.iter().filter(|pane| pane.setting.is_none()).filter_map(|pane| pane.contender))
            .collect();
        if open.is_empty() { Contender::SIDE_BY_SIDE.to_vec() } else { open }
    }

    /// Shows `session` in place of the one shown: what was picked, built or advised for the other goes (a file
    /// opened again under its own name may hold another recording).
    pub(crate) fn set_session(&mut self, session: Session) {
        self.playback = self.playback.for_steps(session.steps());
        self.session = Some(session);
        self.focused = 0;
        (self.selected, self.active, self.holders_at, self.advice) = (None, None, None, None);
        self.refresh_caches();
    }

    fn refresh_caches(&mut self) {
        let panes = self.session.as_ref().map_or(0, |session| session.panes.len());
        self.series =
            self.session.iter().flat_map(|session| session.panes.iter().map(|pane| Series::of(&pane.timeline))).collect();
        self.sentences = vec![None; panes];
        self.animations = vec![None; panes];
        self.focused = self.focused.min(panes.saturating_sub(1));
    }

    /// Opens the recording at `path` with the current contenders, at once; an error is kept for display.
    pub fn open_path(&mut self, path: &Path) {
        self.opened_path = Some(path.to_path_buf());
        let opened = Session::open(path, &self.contenders(), &self.open_options);
        self.opened(opened);
    }

    /// Starts opening the recording at `path` on another thread (reading and replaying a large file takes
    /// seconds); the window stays live and shows it once ready ([`HeapscopeApp::loading`]).
    pub fn open_path_in_background(&mut self, path: PathBuf) {
        let (contenders, options) = (self.contenders(), self.open_options.clone());
        let name = heapscope_core::path_name(&path);
        self.opened_path = Some(path.clone());
        let worker =
            std::thread::Builder::new().name("heapscope-open".into()).spawn(move || Session::open(&path, &contenders, &options));
        match worker {
            Ok(worker) => self.pending = Some((name, worker)),
            Err(error) => self.error = Some(format!("cannot open {name}: no thread to read it on ({error})")),
        }
    }

    /// The file being opened in the background, if any.
    pub fn loading(&self) -> Option<&str> {
        self.pending.as_ref().map(|(name, _)| name.as_str())
    }

    fn opened(&mut self, opened: anyhow::Result<Session>) {
        self.opened_on(opened, true);
    }

    /// Shows the session opened, with what to say of it: how it opened, its caveats and (`say_device`: on opening a
    /// file rather than switching device) which device of several is shown.
    fn opened_on(&mut self, opened: anyhow::Result<Session>, say_device: bool) {
        match opened {
            Ok(session) => {
                let device = say_device.then(|| self.default_device_notice(&session)).flatten();
                let said: Vec<String> = session.note.iter().chain(&session.caveats).chain(&device).cloned().collect();
                self.notice = (!said.is_empty()).then(|| said.join("\n"));
                self.set_session(session);
                self.error = None;
            }
            Err(error) => self.error = Some(format!("{error:#}")),
        }
    }

    /// Takes the session opened in the background, once it is ready.
    fn poll_pending(&mut self, ui: &Ui) {
        let Some((_, worker)) = &self.pending else { return };
        if !worker.is_finished() {
            ui.ctx().request_repaint_after(std::time::Duration::from_millis(50));
            return;
        }
        if let Some((name, worker)) = self.pending.take() {
            let opened = worker.join().unwrap_or_else(|_| Err(anyhow::anyhow!("opening {name} failed (the reader panicked)")));
            self.opened(opened);
        }
    }

    /// What to say of a file of several devices opened on its default device (no `--device`): which is shown, why,
    /// and that the picker shows the others.
    fn default_device_notice(&self, session: &Session) -> Option<String> {
        let snapshot = session.recording.snapshot.as_ref().filter(|_| session.devices.len() > 1)?;
        let chosen = heapscope_lab::recording::default_device(snapshot);
        (self.open_options.device.is_none() && chosen.device == session.recording.device).then(|| {
            format!(
                "{} records {} devices: showing device {} ({}); the device picker shows the others",
                session.recording.name,
                session.devices.len(),
                chosen.device,
                chosen.why
            )
        })
    }

    /// Reopens the recording shown on `device` of its snapshot (the device picker), with the same panes and memory.
    pub fn switch_device(&mut self, device: usize) {
        let Some(session) = &self.session else { return };
        if session.recording.device == device {
            return;
        }
        let opened = session.on_device(device, &self.open_options);
        self.opened_on(opened, false);
    }

    /// Opens the built-in story `name`.
    pub fn open_story(&mut self, name: &str) {
        // A lesson with panes of its own opens with them; the others with the panes open.
        let contenders = match story::named(name) {
            Some(story) if !story.panes.is_empty() => Vec::new(),
            _ => self.contenders(),
        };
        match Session::story_named(name, &contenders) {
            Ok(session) => {
                self.set_session(session);
                // What was said of a file opened before (its streams, its device) is not the lesson's.
                (self.error, self.notice) = (None, None);
            }
            Err(error) => self.error = Some(format!("{error:#}")),
        }
    }

    /// Shows what `source` reports, live, in one pane.
    pub fn attach_live(&mut self, name: &str, source: Box<dyn LiveSource>) {
        self.set_session(Session::live(name, source));
        self.notice = None;
    }

    /// Runs `config` live in one pane: on the device the window draws with ([`HeapscopeApp::window_device`]), else
    /// on a Vulkan device of its own (`HEAPSCOPE_DEVICE`, `HEAPSCOPE_VALIDATION` honoured); without a device the bar
    /// says `no GPU/Vulkan device: …` and the stories stay.
    pub fn start_live(&mut self, config: LiveConfig) {
        match self.window_device.clone() {
            Some(context) => self.start_live_on(&context, config),
            None => self.start_live_with(&ContextOptions::from_env(), config),
        }
    }

    /// [`HeapscopeApp::start_live`] on the device `options` select.
    pub fn start_live_with(&mut self, options: &ContextOptions, config: LiveConfig) {
        match device_live::open_device(options) {
            Ok(context) => self.start_live_on(&context, config),
            Err(why) => {
                self.live.set_config(&config);
                self.live.open = true;
                self.live.unavailable = Some(format!("{why:#}"));
            }
        }
    }

    /// Runs `config` live on `context`'s device in one pane (what [`HeapscopeApp::start_live`] does once the device
    /// is open); a contender the device cannot host is an error on screen.
    pub fn start_live_on(&mut self, context: &Arc<VulkanContext>, config: LiveConfig) {
        self.live.open = true;
        self.live.unavailable = None;
        self.live.run = None;
        // The bar shows what runs, and "Start run" starts it again.
        self.live.set_config(&config);
        let title = config.title();
        match device_live::start(context, config) {
            Ok((source, mut run)) => {
                self.attach_live(&title, Box::new(source));
                run.draws_here = self.window_device.as_ref().is_some_and(|window| Arc::ptr_eq(window, context));
                self.live.run = Some(run);
                self.error = None;
            }
            Err(error) => self.error = Some(format!("live: {error:#}")),
        }
    }

    /// Replaces pane `index`'s contender.
    pub fn switch_contender(&mut self, index: usize, contender: Contender) {
        if let Some(session) = &mut self.session {
            match session.set_contender(index, contender) {
                Ok(()) => self.refresh_caches(),
                Err(error) => self.error = Some(format!("{error:#}")),
            }
        }
    }

    /// Adds a pane (the first contender not shown yet); not to a live session (its one pane is the device's).
    pub fn add_pane(&mut self) {
        let Some(session) = &mut self.session else { return };
        if session.live.is_some() {
            return;
        }
        let shown: Vec<Contender> = session.panes.iter().filter_map(|pane| pane.contender).collect();
        let Some(next) = Contender::SIDE_BY_SIDE
            .into_iter()
            .chain(Contender::all())
            .find(|contender| !contender.needs_device() && !shown.contains(contender))
        else {
            return;
        };
        match session.add_pane(next) {
            Ok(()) => {
                let steps = self.playback.shown_steps();
                session.seek(steps);
                self.refresh_caches();
            }
            Err(error) => self.error = Some(format!("{error:#}")),
        }
    }

    /// Adds a pane replaying the advice's `setting` (the run that fits, beside the one that failed).
    pub fn add_setting_pane(&mut self, setting: &str) {
        let Some(session) = &mut self.session else { return };
        match session.add_setting_pane(setting) {
            Ok(()) => {
                let steps = self.playback.shown_steps();
                session.seek(steps);
                self.refresh_caches();
            }
            Err(error) => self.error = Some(format!("{error:#}")),
        }
    }

    /// Steps of the session.
    pub fn steps(&self) -> u64 {
        self.session.as_ref().map_or(0, Session::steps)
    }

    /// Jumps just past the next refused request of the focused pane (wrapping around); when that pane refused
    /// nothing, to the next refused request of any pane, and focuses that pane.
    pub fn next_refusal(&mut self) {
        let Some(session) = &self.session else { return };
        let shown = self.playback.shown_steps();
        // A pane's next refusal after the step shown, else its first (wrapping around).
        let next_of = |pane: &crate::session::Pane| {
            let refusals = pane.timeline.refusals();
            refusals.iter().find(|(step, _)| step + 1 > shown).or(refusals.first()).map(|(step, _)| *step)
        };
        let target = session.panes.get(self.focused).and_then(next_of).map(|step| (self.focused, step)).or_else(|| {
            session
                .panes
                .iter()
                .enumerate()
                .filter_map(|(index, pane)| next_of(pane).map(|step| (index, step)))
                .min_by_key(|&(index, step)| (step < shown, step, index))
        });
        if let Some((index, step)) = target {
            self.focused = index;
            self.playback.seek(step + 1);
        }
    }

    /// Opens "Open…" in the folder of the file opened last, else the working directory.
    pub fn open_file_browser(&mut self) {
        self.file_browser = Some(FileBrowser::starting_at(self.opened_path.as_deref()));
    }

    /// Shows "Open…" while it is open, and does what it asks.
    fn file_browser(&mut self, ui: &Ui) {
        let Some(browser) = &mut self.file_browser else { return };
        match browser.show(ui.ctx()) {
            Some(BrowserAction::Open(path)) => {
                self.file_browser = None;
                self.open_path_in_background(path);
            }
            Some(BrowserAction::Cancel) => self.file_browser = None,
            None => {}
        }
    }

    fn keyboard(&mut self, ui: &Ui) {
        // Ctrl+O opens the browser; while it is open, it leaves it as it is (its folder, its selection).
        if ui.input_mut(|input| input.consume_key(Modifiers::COMMAND, Key::O)) && self.file_browser.is_none() {
            self.open_file_browser();
        }
        // The browser's keys are its own while it is open.
        if self.file_browser.is_some() || ui.ctx().egui_wants_keyboard_input() {
            return;
        }
        let steps = self.steps();
        // The app's keys come without modifiers: Alt+T or Ctrl+Space belong to someone else.
        // (The press's own modifiers, as the integration reported them with it; key repeats count.)
        let pressed = |key| {
            ui.input(|input| {
                input.events.iter().any(|event| {
                    matches!(event, egui::Event::Key { key: pressed, pressed: true, modifiers, .. }
                        if *pressed == key && modifiers.is_none())
                })
            })
        };
        if pressed(Key::Space) {
            self.playback.toggle(steps);
        }
        if pressed(Key::ArrowRight) {
            self.playback.step(steps);
        }
        if pressed(Key::ArrowLeft) {
            self.playback.back();
        }
        if pressed(Key::Home) {
            self.playback.seek(0);
        }
        if pressed(Key::End) {
            self.playback.seek(steps);
        }
        if pressed(Key::OpenBracket) {
            self.playback.change_speed(false);
        }
        if pressed(Key::CloseBracket) {
            self.playback.change_speed(true);
        }
        if pressed(Key::O) {
            self.next_refusal();
        }
        if pressed(Key::T) {
            self.teach = !self.teach;
        }
        let panes = self.session.as_ref().map_or(0, |session| session.panes.len());
        for (index, key) in [Key::Num1, Key::Num2, Key::Num3, Key::Num4].into_iter().enumerate() {
            if index < panes && pressed(key) {
                self.focused = index;
            }
        }
    }

    fn dropped_files(&mut self, ui: &Ui) {
        let dropped: Vec<PathBuf> =
            ui.input(|input| input.raw.dropped_files.iter().map(|file| file.path().to_path_buf()).collect());
        if let Some(path) = dropped.into_iter().next() {
            self.open_path_in_background(path);
        }
    }

    /// Moves time on: the clock drives the playback, live sources report, every pane follows.
    fn advance(&mut self, ui: &Ui) {
        let now = self.clock.seconds();
        // Time counts from the last frame the playback moved in: egui draws no frames while nothing moves, so a step
        // or play started after a pause would otherwise jump by the idle time at once. A stall (a long load, a
        // debugger) does not jump it by more than a second.
        let elapsed = self.last_seconds.map_or(0.0, |last| (now - last).clamp(0.0, 1.0));
        if let Some(session) = &mut self.session
            && session.live.is_some()
        {
            // Following the newest step (the default) keeps following it as steps arrive.
            let following = self.playback.position >= session.steps() as f64;
            if let Err(error) = session.poll_live() {
                self.error = Some(error.to_string());
            }
            for (pane, series) in session.panes.iter().zip(self.series.iter_mut()) {
                if series.steps != pane.timeline.steps() {
                    *series = Series::of(&pane.timeline);
                }
            }
            if following {
                self.playback.seek(session.steps());
            }
        }
        self.last_seconds = Some(now);
        let steps = self.steps();
        self.playback.tick(elapsed, steps);
        let shown = self.playback.shown_steps();
        if let Some(session) = &mut self.session {
            session.seek(shown);
        }
        if self.session.as_ref().is_some_and(|session| session.live.is_some()) {
            // A live session, animating or not, draws at most every LIVE_FRAME: its frames share the device.
            ui.ctx().request_repaint_after(LIVE_FRAME);
        } else if self.playback.moving() {
            ui.ctx().request_repaint();
        }
    }

    /// The animation of the step being shown, per pane (cached by step).
    fn current_animations(&mut self) -> Vec<Option<StepAnimation>> {
        let Some(session) = &mut self.session else { return Vec::new() };
        let shown = self.playback.shown_steps();
        let progress = self.playback.progress();
        // Faster than this, a step lasts less than a few frames: nothing to see grow or fade.
        let too_fast = self.playback.playing && self.playback.steps_per_second() > 20.0;
        if progress >= 1.0 || shown == 0 || too_fast {
            return vec![None; session.panes.len()];
        }
        let step = shown - 1;
        let mut out = Vec::new();
        for (pane, cached) in session.panes.iter_mut().zip(self.animations.iter_mut()) {
            if cached.as_ref().is_none_or(|(at, _)| *at != step) {
                let (timeline, before) = pane.layout_before(step);
                *cached = Some((step, panes::step_animation(timeline, &before, step, progress)));
            }
            out.push(cached.as_ref().map(|(_, animation)| StepAnimation { progress, ..animation.clone() }));
        }
        out
    }

    /// The sentence explaining the step just shown, per pane (cached by step).
    fn current_sentences(&mut self) -> Vec<String> {
        let Some(session) = &mut self.session else { return Vec::new() };
        let shown = self.playback.shown_steps();
        let Some(step) = shown.checked_sub(1) else { return Vec::new() };
        session
            .panes
            .iter_mut()
            .zip(self.sentences.iter_mut())
            .map(|(pane, cached)| {
                if cached.as_ref().is_none_or(|(at, _)| *at != step) {
                    let text = if step < pane.timeline.steps() {
                        let (timeline, before) = pane.layout_before(step);
                        explain(timeline, &before, step)
                    } else {
                        "(this contender's replay has ended)".to_owned()
                    };
                    *cached = Some((step, text));
                }
                cached.as_ref().map(|(_, text)| text.clone()).unwrap_or_default()
            })
            .collect()
    }

    /// The bytes whose too-small free runs each pane highlights: what the policy needed for its refusal at the step
    /// shown (the request once rounded to its unit).
    fn too_small(&self) -> Vec<Option<u64>> {
        let Some(session) = &self.session else { return Vec::new() };
        let shown = self.playback.shown_steps();
        session
            .panes
            .iter()
            .map(|pane| shown.checked_sub(1).and_then(|step| pane.timeline.refusal_at(step)).map(|refusal| refusal.needed_bytes))
            .collect()
    }

    /// The device picker of a file of several devices: each with its entries and whether it ran out of memory;
    /// the device picked, when another than the one shown.
    fn device_picker(&self, ui: &mut Ui) -> Option<usize> {
        let session = self.session.as_ref().filter(|session| session.devices.len() > 1)?;
        let shown = session.recording.device;
        let mut picked = shown;
        egui::ComboBox::from_id_salt("device")
            .selected_text(format!("device {shown}"))
            .show_ui(ui, |ui| {
                for device in &session.devices {
                    let oom = if device.ooms > 0 { ", ran out of memory" } else { "" };
                    let label = format!("device {}: {} entries{oom}", device.device, device.entries);
                    ui.selectable_value(&mut picked, device.device, label);
                }
            })
            .response
            .on_hover_text("the file records several devices: the one to replay");
        (picked != shown).then_some(picked)
    }

    fn top_bar(&mut self, ui: &mut Ui) {
        ui.horizontal_wrapped(|ui| {
            ui.label(RichText::new("heapscope").strong());
            if let Some(session) = &self.session {
                ui.label(RichText::new(&session.name).monospace());
            }
            if let Some(device) = self.device_picker(ui) {
                self.switch_device(device);
            }
            ui.separator();
            let path_box = ui.add(
                egui::TextEdit::singleline(&mut self.path_input)
                    .hint_text("file to open (or drop one here)")
                    .desired_width(220.0),
            );
            let enter = path_box.lost_focus() && ui.input(|input| input.key_pressed(Key::Enter));
            if (ui.button("Open").clicked() || enter) && !self.path_input.trim().is_empty() {
                self.open_path_in_background(PathBuf::from(self.path_input.trim()));
            }
            if ui.button("Open…").on_hover_text("browse for a recording (Ctrl+O)").clicked() {
                self.open_file_browser();
            }
            if let Some(name) = self.loading() {
                ui.spinner();
                ui.label(format!("opening {name}"));
            }
            ui.menu_button("Stories", |ui| {
                for story in story::all() {
                    if ui.button(story.name).on_hover_text(story.summary).clicked() {
                        self.open_story(story.name);
                    }
                }
            });
            ui.toggle_value(&mut self.live.open, "Live").on_hover_text("run a workload on the GPU and watch its heap");
            ui.separator();
            ui.toggle_value(&mut self.teach, "Teach me");
            ui.toggle_value(&mut self.holders, "What holds it")
                .on_hover_text("the live allocations at the moment shown, grouped by the code that made them (heapscope top)");
            let can_advise = self.session.as_ref().is_some_and(|session| session.live.is_none());
            let mut advising = self.advice.is_some();
            let toggle = ui.add_enabled(can_advise, egui::Button::selectable(advising, "Advice"));
            if toggle.on_hover_text("which allocator settings would have fit, and what each needs").clicked() {
                advising = !advising;
                self.advice = match (&self.session, advising) {
                    (Some(session), true) => Some(AdviceRun::start(session.recording.clone(), session.config.capacity_bytes)),
                    _ => None,
                };
            }
            ui.menu_button(format!("colour: {}", self.colour_by.name()), |ui| {
                for mode in ColourBy::ALL {
                    ui.selectable_value(&mut self.colour_by, mode, mode.name());
                }
                ui.separator();
                ui.label(RichText::new("Legend").strong());
                crate::palette::legend_ui(ui, self.colour_by);
            });
            let mut fit_each = self.scale_rule == ScaleRule::FitEach;
            if ui
                .toggle_value(&mut fit_each, "fit each pane")
                .on_hover_text(
                    "each map fills its pane (for exploring one heap); off, every pane is drawn at one scale over the \
                     whole recording, so areas compare across panes and moments",
                )
                .changed()
            {
                self.scale_rule = if fit_each { ScaleRule::FitEach } else { ScaleRule::OneOverTheRecording };
            }
            let panes = self.session.as_ref().map_or(0, |session| session.panes.len());
            // A live session records one contender on the device: another pane would replay an empty recording.
            let live = self.session.as_ref().is_some_and(|session| session.live.is_some());
            let add = ui
                .add_enabled(panes < crate::session::MAX_PANES && !live, egui::Button::new("+ pane"))
                .on_disabled_hover_text(if live { "a live run feeds one pane" } else { "4 panes at most" });
            if add.clicked() {
                self.add_pane();
            }
        });
        if self.live.open {
            match self.live.show(ui) {
                Some(Ok(LiveAction::Start(config))) => self.start_live(config),
                Some(Ok(LiveAction::Stop)) => {
                    if let Some(run) = &self.live.run {
                        run.stop();
                    }
                }
                Some(Err(error)) => self.error = Some(format!("{error:#}")),
                None => {}
            }
        }
        // The button first: the message takes the rest of the line and wraps within the window.
        if let Some(error) = self.error.clone() {
            ui.horizontal(|ui| {
                if ui.small_button("dismiss").clicked() {
                    self.error = None;
                }
                ui.add(egui::Label::new(RichText::new(error).color(Color32::from_rgb(240, 100, 90))).wrap());
            });
        }
        if let Some(notice) = self.notice.clone() {
            ui.horizontal(|ui| {
                if ui.small_button("ok").clicked() {
                    self.notice = None;
                }
                ui.add(egui::Label::new(RichText::new(notice).italics()).wrap());
            });
        }
    }

    fn transport(&mut self, ui: &mut Ui) {
        let steps = self.steps();
        ui.horizontal(|ui| {
            if ui.button("Start").clicked() {
                self.playback.seek(0);
            }
            if ui.button("Back").clicked() {
                self.playback.back();
            }
            let label = if self.playback.playing { "Pause" } else { "Play" };
            if ui.button(label).clicked() {
                self.playback.toggle(steps);
            }
            if ui.button("Step").clicked() {
                self.playback.step(steps);
            }
            if ui.button("End").clicked() {
                self.playback.seek(steps);
            }
            ui.separator();
            if ui.button("Slower").clicked() {
                self.playback.change_speed(false);
            }
            ui.label(format!("{} steps/s", SPEEDS[self.playback.speed]));
            if ui.button("Faster").clicked() {
                self.playback.change_speed(true);
            }
            ui.separator();
            ui.label(format!("{} / {} entries", Moment::at_position(self.playback.shown_steps()), steps));
            if ui.button("Next OOM").clicked() {
                self.next_refusal();
            }
            ui.separator();
            let views = [
                (
                    TimelineView::Allocations,
                    "allocations",
                    "every allocation over time, stacked (memory_viz's active memory timeline), instead of the totals",
                ),
                (
                    TimelineView::Segments,
                    "segments",
                    "every segment the focused pane's allocator held over time, stacked (memory_viz's cached memory \
                     view), instead of the totals",
                ),
            ];
            // A live run has no recording to stack the allocations of (its pane's segments it has).
            let live = self.session.as_ref().is_some_and(|session| session.live.is_some());
            for (view, name, hover) in views {
                let mut on = self.timeline_view == view;
                let enabled = !(live && view == TimelineView::Allocations);
                let toggle = ui
                    .add_enabled(enabled, egui::Button::selectable(on, name))
                    .on_hover_text(hover)
                    .on_disabled_hover_text("not for a live run: it records no allocations to stack (the totals show it)");
                if toggle.clicked() {
                    on = !on;
                    self.timeline_view = if on { view } else { TimelineView::Totals };
                }
            }
        });
        let names: Vec<String> =
            self.session.iter().flat_map(|session| session.panes.iter().map(|pane| pane.name().to_owned())).collect();
        let series: Vec<(&str, &Series)> = names.iter().map(String::as_str).zip(self.series.iter()).collect();
        let seek = match (&self.session, self.timeline_view) {
            (Some(session), TimelineView::Allocations) if session.live.is_some() => {
                plot::show(ui, &series, self.playback.position, 210.0)
            }
            (Some(session), view @ (TimelineView::Allocations | TimelineView::Segments)) => {
                let pane = session.panes.get(self.focused).or(session.panes.first());
                let name = match (view, pane) {
                    (TimelineView::Segments, Some(pane)) => {
                        format!("{}: segments of {} at {}", session.recording.shown_name(), pane.name(), pane.timeline.steps())
                    }
                    _ => session.recording.shown_name(),
                };
                if self.active.as_ref().is_none_or(|(built, _)| *built != name) {
                    let built = match (view, pane) {
                        (TimelineView::Segments, Some(pane)) => active::build_segments(&pane.timeline),
                        _ => active::build(&session.recording),
                    };
                    self.active = Some((name, built));
                }
                let timeline = self.active.as_ref().map(|(_, timeline)| timeline);
                let clicked = timeline.map(|timeline| {
                    active_plot::show(ui, timeline, &series, (session, self.colour_by), self.playback.position, 210.0)
                });
                if let Some(picked) = clicked.and_then(|clicked| clicked.picked) {
                    self.selected = picked;
                }
                clicked.and_then(|clicked| clicked.seek)
            }
            _ => plot::show(ui, &series, self.playback.position, 210.0),
        };
        if let Some(step) = seek {
            self.playback.seek(step);
        }
    }

    /// The whole UI, in `ui` (the window, or a test harness).
    pub fn show(&mut self, ui: &mut Ui) {
        self.poll_pending(ui);
        self.dropped_files(ui);
        self.keyboard(ui);
        self.advance(ui);
        egui::Panel::top("top").show(ui, |ui| self.top_bar(ui));
        egui::Panel::bottom("transport").resizable(false).show(ui, |ui| self.transport(ui));
        let shown = self.playback.shown_steps();
        let sentences = if self.teach { self.current_sentences() } else { Vec::new() };
        let has_refusals =
            self.session.as_ref().is_some_and(|session| session.panes.iter().any(|pane| !pane.timeline.refusals().is_empty()));
        // An advice about another recording than the one shown goes.
        if let (Some(run), Some(session)) = (&self.advice, &self.session)
            && run.name != session.recording.shown_name()
        {
            self.advice = None;
        }
        let mut add_setting = None;
        if self.holders {
            self.update_holders(shown);
        }
        let mut seek_to_peak = false;
        if self.teach || has_refusals || self.advice.is_some() || self.holders {
            egui::Panel::right("side").default_size(320.0).show(ui, |ui| {
                egui::ScrollArea::vertical().show(ui, |ui| {
                    let Some(session) = &self.session else { return };
                    if self.teach {
                        let actions = panels::teach_me(ui, session, &sentences, shown);
                        if let Some(story) = actions.story {
                            self.open_story(story);
                            self.teach = true;
                            return;
                        }
                        if actions.step {
                            self.playback.step(session.steps());
                        }
                        if actions.back {
                            self.playback.back();
                        }
                        ui.separator();
                    }
                    if let Some(run) = &self.advice {
                        add_setting = panels::advice(ui, run, session.panes.len() < crate::session::MAX_PANES).add;
                        ui.separator();
                    }
                    if let (true, Some((_, _, top))) = (self.holders, &self.holders_at) {
                        seek_to_peak = panels::what_holds_it(ui, top);
                        ui.separator();
                    }
                    if has_refusals {
                        let asked = panels::why_it_failed(ui, session, self.focused, shown);
                        if let Some(step) = asked.seek_to {
                            self.playback.seek(step);
                        }
                        if let Some(index) = asked.focus {
                            self.focused = index;
                            self.next_refusal();
                        }
                    }
                });
            });
        }
        if let Some(setting) = add_setting {
            self.add_setting_pane(&setting);
        }
        if seek_to_peak && let Some(session) = &self.session {
            self.playback.seek(heapscope_lab::top::peak(&session.recording).0.position());
        }
        let animations = self.current_animations();
        let too_small = self.too_small();
        let style = PaneStyle {
            shown_steps: shown,
            progress: self.playback.progress(),
            colour_by: self.colour_by,
            interactive: true,
            selected: self.selected,
            scale: self.scale_rule,
        };
        let mut actions = panes::PaneActions::default();
        let focused = self.focused;
        egui::CentralPanel::default_margins().show(ui, |ui| {
            let hovering_files = ui.input(|input| !input.raw.hovered_files.is_empty());
            match &mut self.session {
                Some(session) if !hovering_files => {
                    actions = panes::show(ui, session, style, &animations, &too_small);
                    // The focused pane is outlined in its colour when there is more than one.
                    if actions.pane_rects.len() > 1
                        && let Some(rect) = actions.pane_rects.get(focused)
                    {
                        let names = session.panes.iter().map(crate::session::Pane::name);
                        let colour = plot::pane_colours(names).get(focused).copied().unwrap_or(Color32::WHITE);
                        ui.painter().rect_stroke(
                            rect.expand(3.0),
                            4.0,
                            egui::Stroke::new(2.0, colour),
                            egui::StrokeKind::Outside,
                        );
                    }
                }
                _ => {
                    ui.centered_and_justified(|ui| ui.heading("Drop a PyTorch snapshot or a heapscope trace to open it"));
                }
            }
        });
        self.file_browser(ui);
        if let Some(index) = actions.clicked_pane {
            self.focused = index;
        }
        if let Some((index, contender)) = actions.switch {
            self.switch_contender(index, contender);
        }
        if let Some(index) = actions.close
            && let Some(session) = &mut self.session
            && session.panes.len() > 1
        {
            session.panes.remove(index);
            // The focused pane stays focused when one before it closes.
            if index < self.focused {
                self.focused -= 1;
            }
            self.refresh_caches();
        }
        // A frame that leaves the playback still starts the count afresh (see `advance`).
        if !self.playback.moving() {
            self.last_seconds = None;
        }
    }
}

impl eframe::App for HeapscopeApp {
    fn ui(&mut self, ui: &mut Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
    }
}
