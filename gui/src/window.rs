//! The native window (eframe on wgpu), and a scripted run of it: quit by itself after a number of frames, with
//! a screenshot of the real window first when asked (`heapscope gui --quit-after-frames N --screenshot PNG`).
//! An error on screen, or a live run that cannot start, fails or finds a kernel mismatch, fails a scripted run.
//! With a live run (`--live`), the frames are counted once the run is over, and how it went is printed
//! (`live churn · tlsf · 112 MiB: finished in … · kernel mismatches 0, on llvmpipe, the device this window draws
//! with`).
//! That is how the end-to-end test (`tests/end_to_end/gui/window.rs` at the root, under Xvfb) checks that the window opens,
//! draws and closes cleanly, and how a picture of the whole app is taken without a person.
//!
//! The screenshot is eframe's own: [`egui::ViewportCommand::Screenshot`] asks the integration to read back the
//! next frame it renders, and hands the pixels to a callback, which writes the PNG; the window closes once it
//! is written ([`egui::ViewportCommand::Close`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egui::{Ui, ViewportCommand};

use crate::app::HeapscopeApp;
use crate::device_live::LiveConfig;
use crate::device_live::STOPPED;
use crate::session::{OpenOptions, Session, check_at};
use crate::shared_device::SharedDevice;
use heapscope_lab::contender::Contender;
use heapscope_vulkan::ValidationLog;

/// Frames waited for a screenshot after asking for it before giving up (it takes one or two).
const SCREENSHOT_PATIENCE_FRAMES: u32 = 600;

/// How long a closed window waits for a live run it held to stop (before its next allocation or free).
const LIVE_STOP_PATIENCE: Duration = Duration::from_secs(10);

/// How long a scripted run waits for a live run to end before it counts frames.
const LIVE_PATIENCE: Duration = Duration::from_secs(600);

/// How the window runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WindowOptions {
    /// Close the window after this many frames (`None`: when the user closes it).
    pub quit_after_frames: Option<u32>,
    /// Once those frames are drawn, write a screenshot of the window here (PNG) before closing.
    pub screenshot: Option<PathBuf>,
    /// Open at this moment (`None`: at the start): an entry, the start, the peak or the first `oom` entry.
    pub start_at_event: Option<heapscope_lab::top::TopAt>,
    /// What the timeline opens on: the totals, every allocation (the active memory timeline) or the first pane's
    /// segments.
    pub timeline: crate::active_plot::TimelineView,
    /// Open this built-in story instead of frag_oom (with no file).
    pub story: Option<String>,
    /// Open with "Teach me" showing.
    pub teach: bool,
}

/// What a screenshot came to: `None` until it arrives.
type Outcome = Arc<Mutex<Option<Result<(), String>>>>;

/// The app in the window, with the script of a scripted run.
#[derive(Debug)]
struct Windowed {
    app: HeapscopeApp,
    options: WindowOptions,
    frames: u32,
    /// The screenshot asked for, and what it came to.
    screenshot: Option<Outcome>,
    /// Why the scripted run failed, handed back once the window is closed.
    failure: Arc<Mutex<Option<String>>>,
    /// When the scripted run first saw a live run going.
    live_since: Option<Instant>,
    /// How the live run ended, printed once the window is closed.
    live_summary: Arc<Mutex<Option<String>>>,
    /// The validation log of the live run's device when it is not the window's, read once the window is closed.
    live_log: Arc<Mutex<Option<ValidationLog>>>,
}

impl Windowed {
    /// Counts a frame and does what the script says at it.
    fn script(&mut self, ui: &Ui) {
        if let Some(run) = self.app.live.run.as_ref().filter(|run| !run.draws_here)
            && let Ok(mut log) = self.live_log.lock()
        {
            *log = Some(run.validation.clone());
        }
        let Some(quit_after) = self.options.quit_after_frames else { return };
        self.frames = self.frames.saturating_add(1);
        let ctx = ui.ctx();
        if self.app.live.running() {
            ctx.request_repaint_after(crate::app::LIVE_FRAME);
            // A live run ends first: the frames are counted, and the picture taken, once it is over.
            self.frames = 0;
            let since = *self.live_since.get_or_insert_with(Instant::now);
            if since.elapsed() > LIVE_PATIENCE {
                self.fail(format!("the live run did not end within {} s", LIVE_PATIENCE.as_secs()));
                ctx.send_viewport_cmd(ViewportCommand::Close);
            }
            return;
        }
        // Frames come one after another, not only on input, until the window closes.
        ctx.request_repaint();
        if self.frames < quit_after {
            return;
        }
        let done = match (&self.options.screenshot, &self.screenshot) {
            (None, _) => true,
            (Some(path), None) => {
                let outcome: Outcome = Arc::default();
                let slot = Arc::clone(&outcome);
                let path = path.clone();
                ctx.request_screenshot(move |image| {
                    let written = save_png(&image, &path).map_err(|error| format!("{error:#}"));
                    if let Ok(mut slot) = slot.lock() {
                        *slot = Some(written);
                    }
                });
                self.screenshot = Some(outcome);
                false
            }
            (Some(path), Some(outcome)) => match outcome.lock().ok().and_then(|mut slot| slot.take()) {
                Some(Ok(())) => true,
                Some(Err(error)) => {
                    self.fail(error);
                    true
                }
                None if self.frames - quit_after > SCREENSHOT_PATIENCE_FRAMES => {
                    self.fail(format!("no screenshot for {} arrived within {SCREENSHOT_PATIENCE_FRAMES} frames", path.display()));
                    true
                }
                None => false,
            },
        };
        if done {
            if let Some(run) = &self.app.live.run
                && let Ok(mut summary) = self.live_summary.lock()
            {
                *summary = Some(format!("{}: {}, {}", run.config.title(), run.progress().describe(), run.where_it_runs()));
            }
            if let Some(problem) = self.problem() {
                self.fail(problem);
            }
            ctx.send_viewport_cmd(ViewportCommand::Close);
        }
    }

    /// What fails a scripted run besides the script itself: an error on screen, a live run that could not start,
    /// failed, or found its kernels' memory changed.
    fn problem(&self) -> Option<String> {
        if let Some(error) = &self.app.error {
            return Some(format!("the window shows an error: {error}"));
        }
        if let Some(why) = &self.app.live.unavailable {
            return Some(format!("the live run could not start: {why}"));
        }
        let progress = self.app.live.run.as_ref()?.progress();
        match &progress.finished {
            Some(Err(message)) if !message.ends_with(STOPPED) => Some(format!("the live run failed: {message}")),
            _ if progress.mismatches > 0 => {
                Some(format!("the live run's kernels found {} word(s) not as written", progress.mismatches))
            }
            _ => None,
        }
    }

    fn fail(&self, why: String) {
        if let Ok(mut failure) = self.failure.lock() {
            failure.get_or_insert(why);
        }
    }
}

/// Writes the window's pixels as a PNG.
fn save_png(image: &egui::ColorImage, path: &Path) -> anyhow::Result<()> {
    let [width, height] = image.size;
    let bytes: Vec<u8> = image.pixels.iter().flat_map(egui::Color32::to_srgba_unmultiplied).collect();
    let too_large = || anyhow::anyhow!("cannot write {}: a {width}x{height} screenshot is too large", path.display());
    let width = u32::try_from(width).map_err(|_| too_large())?;
    let height = u32::try_from(height).map_err(|_| too_large())?;
    let picture = image::RgbaImage::from_raw(width, height, bytes).ok_or_else(|| {
        anyhow::anyhow!("cannot write {}: the screenshot's pixels do not fill {width}x{height}", path.display())
    })?;
    write_image(&picture, path)
}

/// Writes `image` to `path` whole or not at all ([`write_whole`](heapscope_core::whole_file::write_whole)), in the
/// format its extension names.
///
/// # Errors
/// An extension that names no image format, or the file cannot be written; the error names the path.
pub(crate) fn write_image(image: &image::RgbaImage, path: &Path) -> anyhow::Result<()> {
    let written = image::ImageFormat::from_path(path).map_err(anyhow::Error::from).and_then(|format| {
        heapscope_core::whole_file::write_whole(path, |file| -> anyhow::Result<()> {
            let mut writer = std::io::BufWriter::new(file);
            image.write_to(&mut writer, format)?;
            std::io::Write::flush(&mut writer)?;
            Ok(())
        })
    });
    written.map_err(|error| anyhow::anyhow!("cannot write {}: {error}", path.display()))
}

impl eframe::App for Windowed {
    fn ui(&mut self, ui: &mut Ui, _frame: &mut eframe::Frame) {
        self.app.show(ui);
        self.script(ui);
    }
}

/// Shows `app` in a window run as `options` say, until it closes; drawn with `device` when given (heapscope's own,
/// see [`crate::shared_device`]), else with eframe's choice of adapter.
///
/// # Errors
/// The window cannot be created (no display, no graphics adapter), the scripted screenshot failed, or — in a
/// scripted run — the Vulkan validation layer reported anything on `device` or on a live run's own device
/// (`HEAPSCOPE_VALIDATION=1`; printed either way).
pub fn run_window(app: HeapscopeApp, options: WindowOptions, device: Option<&SharedDevice>) -> anyhow::Result<()> {
    if options.quit_after_frames == Some(0) {
        anyhow::bail!("--quit-after-frames 0: the window needs at least one frame");
    }
    let failure = Arc::default();
    let scripted = options.quit_after_frames.is_some();
    let live_summary = Arc::default();
    let live_log: Arc<Mutex<Option<ValidationLog>>> = Arc::default();
    let windowed = Windowed {
        app,
        options,
        frames: 0,
        screenshot: None,
        failure: Arc::clone(&failure),
        live_since: None,
        live_summary: Arc::clone(&live_summary),
        live_log: Arc::clone(&live_log),
    };
    let mut native = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("heapscope")
            .with_inner_size([1400.0, 900.0])
            .with_drag_and_drop(true),
        ..eframe::NativeOptions::default()
    };
    if let Some(device) = device {
        native.wgpu_options.wgpu_setup = device.wgpu_setup();
    }
    eframe::run_native("heapscope", native, Box::new(|_| Ok(Box::new(windowed)))).map_err(|error| match device {
        Some(device) => anyhow::anyhow!(
            "cannot open the window on {}: {error} (HEAPSCOPE_SHARE_DEVICE=0 draws with eframe's own adapter)",
            device.name()
        ),
        None => anyhow::anyhow!("cannot open the window: {error}"),
    })?;
    // The app is gone with the window: a live run it held is stopping; its memory goes back before the device's
    // messages are read (and before the process ends).
    let still_going = crate::device_live::wait_for_stopped_runs(LIVE_STOP_PATIENCE);
    if still_going > 0 {
        eprintln!("heapscope gui: {still_going} live run(s) did not stop within {} s", LIVE_STOP_PATIENCE.as_secs());
    }
    if let Some(summary) = live_summary.lock().ok().and_then(|mut summary| summary.take()) {
        println!("{summary}");
    }
    let mut messages = device.map(SharedDevice::validation_messages).unwrap_or_default();
    if let Some(log) = live_log.lock().ok().and_then(|mut log| log.take()) {
        messages.extend(log.messages());
    }
    for message in &messages {
        eprintln!("heapscope gui: Vulkan validation: {message}");
    }
    if let Some(why) = failure.lock().ok().and_then(|mut failure| failure.take()) {
        anyhow::bail!(why);
    }
    if scripted && !messages.is_empty() {
        anyhow::bail!("the window's run drew {} Vulkan validation message(s) (above)", messages.len());
    }
    Ok(())
}

/// Opens the app in a window, with the file at `path` when given (else the frag_oom story) through `contenders`
/// (none: the side-by-side four), every file opened with `open`, and `live` running on the device when given;
/// `window` can make it a scripted run (see the module documentation).
///
/// # Errors
/// The file does not open, no built-in story of `window.story`'s name, too many contenders, `window.start_at_event`
/// past the end of the recording
/// ([`check_at`], the rule of `heapscope render --at` too), the window cannot be created (no display, no graphics
/// adapter), or the scripted screenshot failed.
pub fn run(
    path: Option<&Path>,
    contenders: &[Contender],
    open: OpenOptions,
    live: Option<LiveConfig>,
    window: WindowOptions,
) -> anyhow::Result<()> {
    let mut app = HeapscopeApp::default();
    let rules = open.rules.clone();
    app.open_options = open;
    if let Some(story) = &window.story {
        // The panes asked for, else the story's own (else the side-by-side four).
        app.set_session(Session::story_named(story, contenders)?.with_rules(&rules)?);
    } else if !contenders.is_empty() || (path.is_none() && rules.any()) {
        // Files open through the panes open: the story's.
        let contenders = if contenders.is_empty() { app.contenders() } else { contenders.to_vec() };
        app.set_session(Session::story_named("frag_oom", &contenders)?.with_rules(&rules)?);
    }
    app.teach = window.teach;
    if let Some(path) = path {
        app.open_path(path);
        if let Some(error) = app.error.take() {
            anyhow::bail!(error);
        }
    }
    app.timeline_view = window.timeline;
    if let Some(at) = window.start_at_event {
        let moment = match &app.session {
            Some(session) => {
                let (moment, said) = session.moment_at(at)?;
                if let Some(said) = said {
                    eprintln!("heapscope gui: {said}");
                }
                moment
            }
            None => heapscope_lab::recording::Moment::Start,
        };
        app.playback.seek(check_at(moment, app.steps())?);
    }
    // Once what was asked for is known to open: the window draws with heapscope's own device where it can, and
    // live runs run on that very device.
    let shared = match SharedDevice::for_window() {
        Ok(device) => Some(device),
        Err(why) => {
            if live.is_some() {
                eprintln!("heapscope gui: the live run gets a device of its own: {why}");
            }
            None
        }
    };
    app.window_device = shared.as_ref().map(|device| Arc::clone(device.context()));
    if let Some(config) = live {
        // No device is said in the Live bar, over the stories: the window still opens.
        app.start_live(config);
    }
    run_window(app, window, shared.as_ref())
}
