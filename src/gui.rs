//! `heapscope gui` (the window), `heapscope render` (the heap map to a PNG, headless), and what the
//! command line does with no command: the window where a display exists, else the headless demo.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use heapscope_gui::active_plot::TimelineView;
use heapscope_gui::device_live::{LiveConfig, LiveWorkload};
use heapscope_gui::palette::ColourBy;
use heapscope_gui::render::GifOptions;
use heapscope_gui::session::MAX_PANES;
use heapscope_gui::{RenderOptions, Session, WindowOptions};
use heapscope_lab::capacity::Capacity;
use heapscope_lab::compare::CompareConfig;
use heapscope_lab::contender::Contender;
use heapscope_lab::recording::Moment;
use heapscope_lab::top::TopAt;

use crate::options::OpenArgs;

/// Arguments of `heapscope gui`.
#[derive(Debug, Args)]
pub struct GuiArgs {
    /// A recording to open: PyTorch snapshot, native or CSV trace (default: the frag_oom story).
    pub file: Option<PathBuf>,
    /// Start live mode: run this workload (serve, train or churn) on the Vulkan device and watch its heap as it
    /// runs (the window says so when there is no device).
    #[arg(long, value_name = "WORKLOAD", conflicts_with = "file")]
    pub live: Option<LiveWorkload>,
    /// Who replays, one pane each (repeat, up to 4; default: pytorch, pytorch-expandable, tlsf, paged): pytorch,
    /// pytorch-expandable, paged or a policy of `heapscope policies`. With `--live`, the one contender of the run
    /// (default: tlsf).
    #[arg(long = "policy", value_name = "NAME")]
    pub policies: Vec<Contender>,
    /// The device and memory of the file, and of every file opened from the window.
    #[command(flatten)]
    pub open: OpenArgs,
    /// The live run's budget (default: the workload's, as in `heapscope bench`).
    #[arg(long, value_name = "SIZE", value_parser = crate::options::parse_capacity, requires = "live")]
    pub budget: Option<u64>,
    /// Steps of the live workload (default: its own).
    #[arg(long, value_name = "N", requires = "live")]
    pub steps: Option<u32>,
    /// Open at this moment: `start` (before the first entry, the default), an entry number (from 0, the file's
    /// own numbering: `device_traces[device][N]`; past the last entry is refused), `peak` (the most bytes live) or
    /// `oom` (the first out-of-memory entry, its refused request shown).
    #[arg(long, value_name = "start|ENTRY|peak|oom", conflicts_with = "live", allow_negative_numbers = true)]
    pub at: Option<TopAt>,
    /// Open with the timeline showing every allocation over time, stacked (memory_viz's active memory timeline),
    /// instead of the totals.
    #[arg(long, conflicts_with = "segments")]
    pub allocations: bool,
    /// Open with the timeline showing every segment the first pane's allocator held over time, stacked (memory_viz's
    /// cached memory view), instead of the totals.
    #[arg(long)]
    pub segments: bool,
    /// A built-in story (a lesson with captions) instead of a file: frag_oom (the default), one_range, empty_cache,
    /// max_split_size, internal_waste, size_classes, page_size, training_step, llm_serving_contiguous,
    /// llm_serving_paged, compaction. Without --policy, the lesson's own panes.
    #[arg(long, conflicts_with_all = ["file", "live"])]
    pub story: Option<String>,
    /// Open with "Teach me" showing: one sentence per pane for each step (a lesson to step through with `Step`).
    #[arg(long)]
    pub teach: bool,
    /// Close the window by itself after this many frames (scripted runs, tests).
    #[arg(long, value_name = "N")]
    pub quit_after_frames: Option<u32>,
    /// Write a screenshot of the window (PNG) once those frames are drawn, then close it (frames default to 30).
    #[arg(long, value_name = "PNG")]
    pub screenshot: Option<PathBuf>,
}

impl Default for GuiArgs {
    /// The window on the frag_oom story.
    fn default() -> Self {
        Self {
            file: None,
            live: None,
            policies: Vec::new(),
            open: OpenArgs::default(),
            budget: None,
            steps: None,
            at: None,
            allocations: false,
            segments: false,
            story: None,
            teach: false,
            quit_after_frames: None,
            screenshot: None,
        }
    }
}

/// Arguments of `heapscope render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The recording: PyTorch snapshot, native or CSV trace.
    #[arg(required_unless_present = "story")]
    pub file: Option<PathBuf>,
    /// A built-in story instead of a file (see `heapscope gui --help`); without --policy, the lesson's own panes.
    #[arg(long, conflicts_with = "file")]
    pub story: Option<String>,
    /// Who replays, one pane each, side by side (repeat, up to 4; default: pytorch): pytorch,
    /// pytorch-expandable, paged or any policy of `heapscope policies`.
    #[arg(long = "policy", value_name = "NAME")]
    pub policies: Vec<Contender>,
    /// Show the heap at this moment: `start`, an entry number from 0 (past the last entry is refused), `peak` (the
    /// most bytes live) or `oom` (the first out-of-memory entry, its refused request shown); default: the end; a PNG
    /// only.
    #[arg(long, value_name = "start|ENTRY|peak|oom", allow_negative_numbers = true)]
    pub at: Option<TopAt>,
    /// The PNG to write; a name ending in `.gif` writes an animated GIF of the story playing instead.
    #[arg(long, value_name = "PNG|GIF")]
    pub out: PathBuf,
    /// Frames of a GIF, evenly spaced through the events.
    #[arg(long, value_name = "N")]
    pub frames: Option<u32>,
    /// How long each frame of a GIF shows, in milliseconds: 10 to 655,350, in steps of 10 (a GIF counts hundredths of
    /// a second); the last one stays 10 times longer, at most 655,350.
    #[arg(long, value_name = "MS")]
    pub frame_ms: Option<u32>,
    /// Image width in pixels.
    #[arg(long, default_value_t = 1280)]
    pub width: u32,
    /// Image height in pixels.
    #[arg(long, default_value_t = 480)]
    pub height: u32,
    /// Colour allocations by `size-class`, `age`, `stack` (frames) or `category` (the entries' labels).
    #[arg(long, value_name = "MODE", default_value = "size-class", value_parser = parse_colour)]
    pub colour: ColourBy,
    /// Draw the timeline under the panes: live and reserved bytes, fragmentation and waste of every pane, the moment
    /// marked.
    #[arg(long)]
    pub timeline: bool,
    /// Let each pane's map fill its pane (areas no longer compare) instead of one scale in every pane (and, in a
    /// GIF, in every frame).
    #[arg(long)]
    pub fit_each_pane: bool,
    /// The device and memory of the file's replay.
    #[command(flatten)]
    pub open: OpenArgs,
}

fn parse_colour(text: &str) -> Result<ColourBy, String> {
    match text {
        "size-class" => Ok(ColourBy::SizeClass),
        "age" => Ok(ColourBy::Age),
        "stack" => Ok(ColourBy::StackGroup),
        "category" => Ok(ColourBy::Category),
        other => Err(format!("unknown colour mode {other:?}: expected size-class, age, stack or category")),
    }
}

/// Whether a window can open here: an X11 or Wayland display is named.
pub fn display_available() -> bool {
    ["DISPLAY", "WAYLAND_DISPLAY"].iter().any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()))
}

/// Runs `heapscope gui`.
pub fn run_gui(args: &GuiArgs) -> Result<()> {
    if let Some(device_only) = args.policies.iter().find(|contender| contender.needs_device()) {
        anyhow::bail!(
            "{device_only} runs on a Vulkan device only: the app replays the simulated contenders (see `heapscope compare --vulkan`)"
        );
    }
    if args.live.is_some() && args.policies.len() > 1 {
        anyhow::bail!("{} --policy flags: a --live run has one contender", args.policies.len());
    }
    if args.policies.len() > MAX_PANES {
        anyhow::bail!("{} --policy flags: the window shows 1 to {MAX_PANES} panes", args.policies.len());
    }
    if args.live.is_some() && args.open.any() {
        anyhow::bail!("--device and --capacity apply to a recording FILE; a --live run has its --budget");
    }
    if args.budget == Some(0) {
        anyhow::bail!("--budget 0: nothing could be allocated");
    }
    if args.steps == Some(0) {
        anyhow::bail!("--steps 0: a workload needs at least one step");
    }
    if args.quit_after_frames == Some(0) {
        anyhow::bail!("--quit-after-frames 0: the window needs at least one frame");
    }
    if !display_available() {
        anyhow::bail!("no display (DISPLAY and WAYLAND_DISPLAY are unset): use `heapscope render` for a PNG of the heap");
    }
    let live = args.live.map(|workload| {
        let policy = args.policies.first().copied().unwrap_or(Contender::Heap(heapscope_core::PolicyKind::Tlsf));
        LiveConfig { budget_bytes: args.budget, steps: args.steps, ..LiveConfig::new(workload, policy) }
    });
    // A live run has its own pane.
    let contenders = if args.live.is_some() { &[][..] } else { &args.policies[..] };
    let quit_after_frames = args.quit_after_frames.or(args.screenshot.as_ref().map(|_| DEFAULT_SCREENSHOT_FRAMES));
    let window = WindowOptions {
        quit_after_frames,
        screenshot: args.screenshot.clone(),
        start_at_event: args.at,
        timeline: match (args.allocations, args.segments) {
            (true, _) => TimelineView::Allocations,
            (_, true) => TimelineView::Segments,
            _ => TimelineView::Totals,
        },
        story: args.story.clone(),
        teach: args.teach,
    };
    let scripted = quit_after_frames.is_some();
    if scripted {
        // A scripted run is a check: what the Vulkan validation layer says about the window's wgpu (on when wgpu
        // is built with debug assertions, or with WGPU_VALIDATION=1) fails it.
        heapscope_wgpu::hal_log::install();
    }
    heapscope_gui::run(args.file.as_deref(), contenders, args.open.open_options()?, live, window)?;
    if scripted {
        let messages = heapscope_wgpu::hal_log::messages(heapscope_wgpu::wgpu::Backend::Vulkan);
        for message in &messages {
            errln!("heapscope gui: wgpu: {message}");
        }
        let validation = messages.iter().filter(|message| message.contains("VALIDATION [")).count();
        if validation > 0 {
            anyhow::bail!("the window's run drew {validation} Vulkan validation message(s) (above)");
        }
    }
    Ok(())
}

/// Frames drawn before `--screenshot` takes its picture when `--quit-after-frames` is not given.
const DEFAULT_SCREENSHOT_FRAMES: u32 = 30;

/// Whether `--out` names a GIF.
fn is_gif(path: &std::path::Path) -> bool {
    path.extension().is_some_and(|extension| extension.eq_ignore_ascii_case("gif"))
}

/// Refuses, before any work, an image path heapscope cannot write (`what`: the flag naming it): a folder, a name in a
/// folder that does not exist, or a name not ending in `.png` (or `.gif` where `gif_too`). Found only once drawn, it
/// failed after the command had printed its report ("the image format could not be determined").
pub fn check_image_path(path: &std::path::Path, what: &str, gif_too: bool) -> Result<()> {
    let name = heapscope_core::path_name(path);
    if path.is_dir() {
        anyhow::bail!("{what} {name}: a folder, not a file");
    }
    let png = path.extension().is_some_and(|extension| extension.eq_ignore_ascii_case("png"));
    let writable = png || (gif_too && is_gif(path));
    if !writable {
        let kinds =
            if gif_too { "a PNG or a GIF: give a name ending in .png or .gif" } else { "a PNG: give a name ending in .png" };
        anyhow::bail!("{what} {name}: heapscope writes {kinds}");
    }
    // Said before the replay and the drawing, not after them.
    if let Some(folder) = path.parent().filter(|folder| !folder.as_os_str().is_empty())
        && !folder.is_dir()
    {
        let folder_name = heapscope_core::path_name(folder);
        let what_it_is = if folder.exists() { "is no folder" } else { "does not exist" };
        anyhow::bail!("{what} {name}: {folder_name} {what_it_is}");
    }
    Ok(())
}

/// Runs `heapscope render`.
pub fn run_render(args: &RenderArgs) -> Result<()> {
    let gif = is_gif(&args.out);
    if gif && args.at.is_some() {
        anyhow::bail!("--at applies to a PNG: a GIF (--out {}) plays every event; use --frames", args.out.display());
    }
    if !gif && (args.frames.is_some() || args.frame_ms.is_some()) {
        anyhow::bail!("--frames and --frame-ms apply to a GIF: --out {} is no .gif", args.out.display());
    }
    if args.story.is_some() && args.open.any() {
        anyhow::bail!("--device and --capacity apply to a recording FILE: a --story brings its own device");
    }
    let mut options = RenderOptions {
        width: args.width,
        height: args.height,
        at: None,
        colour_by: args.colour,
        fit_each_pane: args.fit_each_pane,
        timeline: args.timeline,
    };
    options.check()?;
    let defaults = GifOptions::default();
    let gif_options = GifOptions::playing(args.frames.unwrap_or(defaults.frames), args.frame_ms.unwrap_or(defaults.frame_ms));
    if gif {
        gif_options.check()?;
    }
    if let Some(file) = &args.file {
        crate::input::refuse_overwriting(file, &args.out)?;
    }
    check_image_path(&args.out, "--out", true)?;
    let contenders =
        if args.policies.is_empty() { vec![Contender::Pytorch { expandable: false }] } else { args.policies.clone() };
    let mut session = match (&args.file, &args.story) {
        (Some(file), _) => {
            let recording = crate::input::open_device(file, args.open.device)?;
            let rules = args.open.open_options()?.rules;
            // The capacity asked for, else the device the recording tells (its oom entry), as `gui` and `compare`.
            let capacity_bytes = Capacity::of(args.open.capacity, &recording).bytes;
            let config = rules.apply_to(&recording, CompareConfig { capacity_bytes, ..CompareConfig::default() });
            // The other devices are emulated on the capacity given only (one device's oom entry tells its own).
            let asked = CompareConfig { capacity_bytes: args.open.capacity, ..config.clone() };
            for line in crate::replay::devices_overview(&recording, args.open.device, &asked) {
                outln!("{line}");
            }
            Session::new(recording, config, &contenders)?
        }
        // No --policy: the story's own panes.
        (None, Some(story)) => Session::story_named(story, &args.policies)?.with_rules(&args.open.open_options()?.rules)?,
        (None, None) => anyhow::bail!("name a recording FILE or a --story"),
    };
    // Its panes are fixed (the window's can be added to later): a rule none of them follows would change nothing.
    let panes: Vec<Contender> = session.panes.iter().filter_map(|pane| pane.contender).collect();
    crate::flag_reach::refuse_flags_reaching_none(&args.open.flags(), &panes, "this image draws")?;
    // Errors from here on (a moment past the end, the renderer's) name what was drawn: the recording and its device.
    let drawn = session.name.clone();
    if gif {
        let steps = heapscope_gui::render_gif(&mut session, options, gif_options, &args.out).with_context(|| drawn.clone())?;
        outln!(
            "wrote {} ({}, {} from {} to {})",
            args.out.display(),
            session.name,
            heapscope_lab::recording::counted(steps.len() as u64, "frame", "frames"),
            Moment::at_position(steps.first().copied().unwrap_or_default()),
            Moment::at_position(steps.last().copied().unwrap_or_default())
        );
        return Ok(());
    }
    if let Some(at) = args.at {
        // Its errors name the recording already.
        let (moment, said) = session.moment_at(at)?;
        if let Some(said) = said {
            outln!("{said}");
        }
        options.at = Some(moment);
    }
    heapscope_gui::render_png(&mut session, options, &args.out).with_context(|| drawn.clone())?;
    // The picture's title: the moment and each pane's refusal at it.
    let shown = options.at.map_or(session.steps(), Moment::position);
    outln!("wrote {} ({})", args.out.display(), heapscope_gui::render::title(&session, shown));
    Ok(())
}

/// The demo's picture: the frag_oom story at its end through PyTorch (both modes), TLSF and paging, to `path`.
pub fn demo_png(path: &std::path::Path) -> Result<()> {
    let mut session = Session::story_named("frag_oom", &Contender::SIDE_BY_SIDE)?;
    let options = RenderOptions { width: 1600, height: 520, ..RenderOptions::default() };
    heapscope_gui::render_png(&mut session, options, path)
        .with_context(|| format!("cannot draw the heap into {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use heapscope_core::PolicyKind;
    use heapscope_gui::session::OpenOptions;

    /// `heapscope gui`'s flags on their own.
    #[derive(Debug, Parser)]
    struct Gui {
        #[command(flatten)]
        args: GuiArgs,
    }

    #[test]
    fn gui_takes_a_files_device_capacity_and_policies() {
        let words = ["gui", "t.pickle", "--device", "1", "--capacity", "3GiB", "--policy", "paged", "--policy", "buddy"];
        let args = Gui::try_parse_from(words).unwrap().args;
        assert_eq!(args.file, Some(PathBuf::from("t.pickle")));
        assert_eq!(
            args.open.open_options().unwrap(),
            OpenOptions { device: Some(1), capacity_bytes: Some(3 << 30), ..OpenOptions::default() }
        );
        assert_eq!(args.policies, [Contender::Paged, Contender::Heap(PolicyKind::Buddy)]);
        let defaults = Gui::try_parse_from(["gui", "t.csv"]).unwrap().args;
        assert_eq!(defaults.open.open_options().unwrap(), OpenOptions::default(), "the busiest device, unlimited");
        assert!(defaults.policies.is_empty());
        // (flags, words of the error)
        let bad: [(&[&str], &str); 4] = [
            (&["gui", "--capacity", "lots"], "--capacity"),
            (&["gui", "--device", "one"], "--device"),
            (&["gui", "--policy", "tlfs"], "pytorch-expandable"),
            (&["gui", "--steps", "3"], "--live"),
        ];
        for (flags, words) in bad {
            let error = Gui::try_parse_from(flags).unwrap_err().to_string();
            assert!(error.contains(words), "{flags:?}: {error}");
        }
    }

    /// Issue 19: the heap rules of a lesson on the command line of `gui` (and `render`, the same flags).
    #[test]
    fn gui_takes_the_heap_rules() {
        let words = [
            "gui",
            "--story",
            "frag_oom",
            "--block-size",
            "64MiB",
            "--release",
            "immediately",
            "--alloc-conf",
            "max_split_size_mb:128",
            "--page-size",
            "64KiB",
        ];
        let rules = Gui::try_parse_from(words).unwrap().args.open.open_options().unwrap().rules;
        let expected = heapscope_gui::session::RuleOverrides {
            block_size_bytes: Some(64 << 20),
            dedicated_threshold_bytes: None,
            release: Some(heapscope_core::ReleaseRule::Immediately),
            alloc_conf: Some("max_split_size_mb:128".to_owned()),
            page_bytes: Some(64 << 10),
        };
        assert_eq!(rules, expected);
        let config = rules.apply(CompareConfig::default());
        assert_eq!((config.heap.block_size_bytes, config.page_bytes), (64 << 20, 64 << 10));
        let odd = Gui::try_parse_from(["gui", "--page-size", "3MiB"]).unwrap().args.open.open_options().unwrap_err();
        assert!(odd.to_string().contains("--page-size 3.00 MiB: not a power of two"), "{odd}");
    }
}
