//! Headless rendering: the panes of a session at one step, drawn by egui into an image on the wgpu
//! renderer of egui_kittest (no window, no display; lavapipe or any adapter wgpu finds, a CPU one preferred
//! so that images are the same everywhere), and written as a PNG, or as an animated GIF of the story playing
//! (`heapscope render --out story.gif --frames N`: frames evenly spaced through the steps, drawn through one
//! harness, quantised to 256 colours each).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use egui::RichText;
use egui_kittest::Harness;
use image::codecs::gif::{GifEncoder, Repeat};
use image::{Delay, Frame, RgbaImage};

use crate::palette::ColourBy;
use crate::panes::{self, PaneStyle, ScaleRule};
use crate::session::Session;

/// What to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    /// Image width in pixels.
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// The moment drawn (`None`: the end; past the last entry is refused, see [`Session::check_at`]).
    pub at: Option<heapscope_lab::recording::Moment>,
    /// How allocations are coloured.
    pub colour_by: ColourBy,
    /// Each pane fits its own map instead of one scale in every pane (a PNG: fitting the moment drawn; a GIF: every
    /// pane's peak over the recording, kept for every frame).
    pub fit_each_pane: bool,
    /// Draw the timeline (live, reserved, fragmentation and waste of every pane, the moment marked) under the panes.
    pub timeline: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self { width: 1280, height: 480, at: None, colour_by: ColourBy::SizeClass, fit_each_pane: false, timeline: false }
    }
}

/// The widest and tallest image drawn, in pixels: the side of the largest texture the renderer's wgpu device
/// accepts (wgpu's default `max_texture_dimension_2d`, what egui_kittest asks for).
pub const MAX_IMAGE_SIDE_PIXELS: u32 = 8192;

impl RenderOptions {
    /// Checks the image size before anything is drawn.
    ///
    /// # Errors
    /// A width or height of 0, or above [`MAX_IMAGE_SIDE_PIXELS`]; the error names the flag (`--width`,
    /// `--height`). With the timeline, an image too short to leave the maps room beside it.
    pub fn check(&self) -> Result<()> {
        for (flag, pixels) in [("--width", self.width), ("--height", self.height)] {
            if !(1..=MAX_IMAGE_SIDE_PIXELS).contains(&pixels) {
                anyhow::bail!("{flag} {pixels}: an image is 1 to {MAX_IMAGE_SIDE_PIXELS} pixels on a side");
            }
        }
        let least_pixels = (MIN_TIMELINE_HEIGHT_POINTS * self.pixels_per_point()).ceil() as u32;
        if self.timeline && self.height < least_pixels {
            anyhow::bail!(
                "--height {} with --timeline: below {least_pixels} pixels (at --width {}) the timeline leaves the heap maps no \
                 room; make the image taller, or draw it without --timeline",
                self.height,
                self.width
            );
        }
        Ok(())
    }

    /// Pixels per point: text and lines keep their size against the image (see [`POINTS_WIDE`]).
    fn pixels_per_point(&self) -> f32 {
        (self.width as f32 / POINTS_WIDE).max(1.0)
    }
}

/// The least image height, in points, under which the timeline (its legend and two plots, at their least) would take
/// the room of the heap maps above it: the title, the legend and the panes' headers come first, and a map drew
/// nothing at 300 pixels.
const MIN_TIMELINE_HEIGHT_POINTS: f32 = 360.0;

/// Whether `pane`'s map draws free runs in red for a refused request of `requested_bytes`: it has runs too small for it.
fn draws_red(pane: &crate::session::Pane, requested_bytes: u64) -> bool {
    pane.layout.free_runs().any(|run| run.1 < requested_bytes)
}

/// The title line of a render: the recording, the moment and what happened at it.
pub fn title(session: &Session, shown_steps: u64) -> String {
    let moment = heapscope_lab::recording::Moment::at_position(shown_steps);
    let entries = heapscope_lab::recording::counted(session.steps(), "entry", "entries");
    let mut title = format!("{} · {moment} of {entries}", session.name);
    // Each pane that refused the request of this step: the request's size and the cause; red is named only where
    // the map has free runs too small for it.
    let refused: Vec<String> = session
        .panes
        .iter()
        .filter_map(|pane| {
            let refusal = shown_steps.checked_sub(1).and_then(|step| pane.timeline.refusal_at(step))?;
            let red = if draws_red(pane, refusal.requested_bytes) { ", free runs too small for it in red" } else { "" };
            Some(format!(
                "{} refused {} ({}{red})",
                pane.name(),
                heapscope_core::units::Bytes(refusal.requested_bytes),
                refusal.cause.name()
            ))
        })
        .collect();
    if !refused.is_empty() {
        title.push_str(&format!(" · out of memory: {}", refused.join("; ")));
    }
    title
}

/// What one frame of a render shows; the state of the harness, changed between frames of a GIF.
#[derive(Debug)]
struct Shown<'s> {
    session: &'s mut Session,
    style: PaneStyle,
    heading: String,
    too_small: Vec<Option<u64>>,
}

impl Shown<'_> {
    /// Moves every pane to `steps` played (clamped to the session's).
    fn seek(&mut self, steps: u64) {
        let shown = steps.min(self.session.steps());
        self.session.seek(shown);
        self.too_small = self
            .session
            .panes
            .iter()
            .map(|pane| {
                shown.checked_sub(1).and_then(|step| pane.timeline.refusal_at(step)).map(|refusal| refusal.requested_bytes)
            })
            .collect();
        self.style.shown_steps = shown;
        self.heading = title(self.session, shown);
    }

    /// Whether a map draws free runs in red: a pane refused the request of this step and has free runs too small
    /// for it (what the title names red for).
    fn red_drawn(&self) -> bool {
        self.session
            .panes
            .iter()
            .zip(&self.too_small)
            .any(|(pane, refused)| refused.is_some_and(|requested_bytes| draws_red(pane, requested_bytes)))
    }
}

/// Text and lines keep their size against the image: an image wider than this many pixels draws at more pixels per
/// point, so that a 2,400-pixel render reads as a 1,280-pixel one does.
const POINTS_WIDE: f32 = 1280.0;

/// The legend line of a render coloured by size class or age: the classes live in the panes (at most eight) or the
/// age ramp, then the map's own colours present in the picture (padding, free, too small, unmapped, resident pages).
fn colour_legend(ui: &mut egui::Ui, session: &Session, colour_by: ColourBy, too_small: bool) {
    use crate::palette::{self, FREE, FREE_TOO_SMALL, MAPPED, UNMAPPED};
    let mut entries: Vec<(egui::Color32, String)> = Vec::new();
    match colour_by {
        ColourBy::Age => {
            for (age, words) in [(0, "just allocated"), (30, "older"), (1000, "as old as the trace")] {
                entries.push((palette::age(age, 1000), words.to_owned()));
            }
        }
        _ => {
            let mut classes: Vec<u32> = session
                .panes
                .iter()
                .flat_map(|pane| pane.layout.spans())
                .map(|span| 63 - span.requested_bytes.max(1).leading_zeros())
                .collect();
            classes.sort_unstable();
            classes.dedup();
            // The largest classes first, eight colours at most; classes that share a colour (twelve hues apart, such
            // as 512 B and 2 MiB) share its entry, which names each range.
            for class in classes.into_iter().rev() {
                let (low, high) = (1u64 << class, 1u64 << (class + 1).min(63));
                let words = format!("{} to {}", heapscope_core::units::Bytes(low), heapscope_core::units::Bytes(high));
                let colour = palette::size_class(low);
                if let Some((_, named)) = entries.iter_mut().find(|(shared, _)| *shared == colour) {
                    named.push_str(&format!(", {words}"));
                } else if entries.len() < 8 {
                    entries.push((colour, words));
                }
            }
        }
    }
    // Padding is a darker shade of its allocation's colour: shown on the first one, else on a size class's (on the
    // free grey it vanished).
    let sample = entries.first().map_or_else(|| palette::size_class(1 << 20), |entry| entry.0);
    entries.push((palette::waste(sample), "padding and rounding".to_owned()));
    entries.push((FREE, "free".to_owned()));
    if too_small {
        entries.push((FREE_TOO_SMALL, "free run too small for the request refused".to_owned()));
    }
    let virtual_region = session
        .panes
        .iter()
        .any(|pane| pane.layout.regions().any(|region| region.kind == heapscope_lab::timeline::RegionKind::Virtual));
    if virtual_region {
        entries.push((UNMAPPED, "unmapped address space".to_owned()));
        entries.push((MAPPED, "resident pages (strip)".to_owned()));
    }
    ui.horizontal_wrapped(|ui| {
        let what = if colour_by == ColourBy::Age { "colour = age:" } else { "colour = size requested:" };
        ui.label(RichText::new(what).small());
        for (colour, words) in entries {
            legend_entry(ui, colour, &words);
        }
    });
}

/// One entry of a legend laid out in wrapped rows: a swatch and its words, on a new row when the words would not fit
/// beside the swatch on this one (a row never ends between the two).
fn legend_entry(ui: &mut egui::Ui, colour: egui::Color32, words: &str) {
    const SWATCH: egui::Vec2 = egui::vec2(12.0, 10.0);
    let text = egui::WidgetText::from(RichText::new(words).small());
    let galley = text.clone().into_galley(ui, Some(egui::TextWrapMode::Extend), f32::INFINITY, egui::TextStyle::Small);
    let needed = SWATCH.x + ui.spacing().item_spacing.x + galley.size().x;
    // What is left of this row (a wrapping layout's available width is the whole row's).
    let left = ui.max_rect().right() - ui.cursor().min.x;
    if left < needed && left < ui.max_rect().width() {
        ui.end_row();
    }
    let (rect, _) = ui.allocate_exact_size(SWATCH, egui::Sense::hover());
    ui.painter().rect_filled(rect, 2.0, colour);
    ui.label(text);
}

/// The legend of a render coloured by stack or category: the groups holding the most bytes in the first pane,
/// each a swatch of its colour, its name (innermost user frame, or category) and its bytes.
fn group_legend(ui: &mut egui::Ui, session: &Session, colour_by: ColourBy) {
    let what = match colour_by {
        ColourBy::Category => "colour = the category of its entry:",
        _ => "colour = the stack that allocated it:",
    };
    ui.horizontal_wrapped(|ui| {
        ui.label(RichText::new(what).small());
        for (colour, words) in group_legend_entries(session, colour_by) {
            legend_entry(ui, colour, &words);
        }
    });
}

/// The entries of [`group_legend`]: every group of the first pane with a hue of its own (at most eleven), holding the
/// most first, by name, so that each colour drawn has its entry; then all those sharing the others' colour as one.
fn group_legend_entries(session: &Session, colour_by: ColourBy) -> Vec<(egui::Color32, String)> {
    let (none, others) = match colour_by {
        ColourBy::Category => ("no category recorded", "other categories"),
        _ => ("no stack recorded", "other stacks"),
    };
    let hues = session.hues.of(colour_by);
    let mut entries = Vec::new();
    let mut other_bytes = None;
    for (group, name, bytes) in session.group_legend(colour_by, usize::MAX) {
        if hues.has_own(group) {
            let name = name.unwrap_or_else(|| none.to_owned());
            entries.push((hues.colour(group), format!("{name} ({})", heapscope_core::units::Bytes(bytes))));
        } else {
            other_bytes = Some(other_bytes.unwrap_or(0u64).saturating_add(bytes));
        }
    }
    if let Some(bytes) = other_bytes {
        entries.push((crate::palette::OTHER_GROUPS, format!("{others} ({})", heapscope_core::units::Bytes(bytes))));
    }
    entries
}

/// Renders `session`'s panes after each of `steps` (each clamped to the session's), one image each, through
/// one harness, handing each to `each` as it is drawn (an animation's frames are encoded one by one: holding them
/// all took 486 MB for 141 frames).
fn render_steps(
    session: &mut Session,
    options: RenderOptions,
    steps: &[u64],
    each: &mut dyn FnMut(RgbaImage) -> Result<()>,
) -> Result<()> {
    options.check()?;
    let scale = match (options.fit_each_pane, steps.len()) {
        (true, 1) => ScaleRule::FitEach,
        (true, _) => ScaleRule::FitEachOverTheRecording,
        (false, 1) => ScaleRule::OneAtTheMoment,
        (false, _) => ScaleRule::OneOverTheRecording,
    };
    let style =
        PaneStyle { shown_steps: 0, progress: 1.0, colour_by: options.colour_by, interactive: false, selected: None, scale };
    let series = if options.timeline {
        session.panes.iter().map(|pane| (pane.name().to_owned(), crate::plot::Series::of(&pane.timeline))).collect()
    } else {
        Vec::new()
    };
    let shown = Shown { session, style, heading: String::new(), too_small: Vec::new() };
    // Text scales with the image: wide images draw at more pixels per point.
    let pixels_per_point = options.pixels_per_point();
    let size = egui::vec2(options.width as f32, options.height as f32) / pixels_per_point;
    // A character no font has, bundled or the system's (`add_system_fonts`), draws as a box, as in the app:
    // egui_kittest's default, for tests, is to panic.
    let builder = Harness::builder().with_size(size).with_pixels_per_point(pixels_per_point).allow_missing_glyphs();
    let mut harness = builder.wgpu().build_ui_state(
        move |ui, shown: &mut Shown<'_>| {
            if !series.is_empty() {
                let height = (ui.available_height() * 0.3).clamp(80.0, 220.0);
                egui::Panel::bottom("timeline").resizable(false).show(ui, |ui| {
                    let named: Vec<(&str, &crate::plot::Series)> = series.iter().map(|(name, s)| (name.as_str(), s)).collect();
                    crate::plot::show(ui, &named, shown.style.shown_steps as f64, height);
                });
            }
            egui::CentralPanel::default_margins().show(ui, |ui| {
                ui.label(RichText::new(&shown.heading).strong());
                if let Some(caption) = shown.session.caption(shown.style.shown_steps) {
                    ui.label(RichText::new(caption).color(egui::Color32::from_rgb(250, 220, 120)));
                }
                if shown.style.colour_by.by_group() {
                    group_legend(ui, shown.session, shown.style.colour_by);
                } else {
                    colour_legend(ui, shown.session, shown.style.colour_by, shown.red_drawn());
                }
                panes::show(ui, shown.session, shown.style, &[], &shown.too_small);
            });
        },
        shown,
    );
    add_system_fonts(&harness.ctx);
    for (index, &steps) in steps.iter().enumerate() {
        harness.state_mut().seek(steps);
        // The first frame lays out and loads the fonts; the second draws with them.
        if index == 0 {
            harness.step();
        }
        harness.step();
        each(harness.render().map_err(|error| anyhow::anyhow!("cannot render the heap map: {error}"))?)?;
    }
    Ok(())
}

/// Lets `ctx` draw what egui's bundled fonts lack (CJK in a frame name or a file's path, other scripts) with a font
/// the system has for it, found through the system's own fallback (fontconfig, CoreText, DirectWrite) when first
/// needed: as the window does (eframe's `system_fonts`). A character no font on the machine has still draws as a box.
fn add_system_fonts(ctx: &egui::Context) {
    ctx.add_font_provider(Arc::new(egui_system_font_provider::SystemFontProvider::new()));
}

/// Renders `session`'s panes at `options.at` steps (default: the end).
///
/// # Errors
/// `options.at` past the end of the session ([`Session::check_at`], the rule of `heapscope gui --at` too), an
/// image size [`RenderOptions::check`] refuses, no graphics adapter, or rendering failed.
pub fn render(session: &mut Session, options: RenderOptions) -> Result<RgbaImage> {
    let at = match options.at {
        Some(at) => session.check_at(at)?,
        None => session.steps(),
    };
    let mut image = None;
    render_steps(session, options, &[at], &mut |drawn| {
        image = Some(drawn);
        Ok(())
    })?;
    image.ok_or_else(|| anyhow::anyhow!("cannot render the heap map: no image"))
}

/// Renders `session` (see [`render`]) into the PNG at `path`.
///
/// # Errors
/// Rendering failed, or the file cannot be written.
pub fn render_png(session: &mut Session, options: RenderOptions, path: &Path) -> Result<()> {
    let image = render(session, options)?;
    crate::window::write_image(&image, path)
}

/// How an animated GIF plays the story.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GifOptions {
    /// Frames, evenly spaced through the steps (at most one per step).
    pub frames: u32,
    /// How long each frame shows, in milliseconds.
    pub frame_ms: u32,
    /// How long the last frame stays before the loop starts again, in milliseconds.
    pub last_frame_ms: u32,
}

impl Default for GifOptions {
    fn default() -> Self {
        Self::playing(24, 250)
    }
}

/// The longest a GIF frame can show: its delay is in hundredths of a second, in 16 bits.
pub const MAX_GIF_FRAME_MS: u32 = 655_350;

impl GifOptions {
    /// `frames` frames of `frame_ms` each, the last one staying ten times longer (at most [`MAX_GIF_FRAME_MS`]).
    pub fn playing(frames: u32, frame_ms: u32) -> Self {
        Self { frames, frame_ms, last_frame_ms: frame_ms.saturating_mul(10).min(MAX_GIF_FRAME_MS) }
    }

    /// Refuses what a GIF cannot play as asked: no frames, a delay outside 10 ms to [`MAX_GIF_FRAME_MS`], or one that
    /// is no multiple of 10 ms (a GIF counts hundredths of a second: 15 ms would show for 10, its last frame for 150).
    pub fn check(&self) -> Result<()> {
        if self.frames == 0 {
            anyhow::bail!("--frames 0: an animation needs at least one frame");
        }
        for (what, ms) in [("--frame-ms", self.frame_ms), ("the last frame's delay", self.last_frame_ms)] {
            if !(10..=MAX_GIF_FRAME_MS).contains(&ms) {
                anyhow::bail!(
                    "{what} {ms}: a GIF frame shows for 10 to {MAX_GIF_FRAME_MS} ms (its delay is in hundredths of a second, in 16 bits)"
                );
            }
        }
        if !self.frame_ms.is_multiple_of(10) {
            anyhow::bail!(
                "--frame-ms {}: a GIF frame's delay is in hundredths of a second: give a multiple of 10 ms",
                self.frame_ms
            );
        }
        Ok(())
    }
}

/// The steps shown by `frames` frames evenly spaced through `steps` steps: the `i`-th frame after
/// `steps * (i + 1) / frames` steps, so the last is the end; never the same step twice, never step 0 (an empty
/// heap), so fewer frames than asked when the story is shorter (more frames than steps show every step once:
/// nothing is built for the frames that would repeat one).
pub fn gif_steps(steps: u64, frames: u32) -> Vec<u64> {
    let frames = u64::from(frames).min(steps.max(1));
    let mut out: Vec<u64> =
        (1..=frames).map(|frame| (u128::from(steps) * u128::from(frame) / u128::from(frames)) as u64).collect();
    out.retain(|&step| step > 0);
    out.dedup();
    out
}

/// GIF frames are quantised to 256 colours per frame; 10 is the `gif` crate's balance of speed and quality.
const GIF_QUANTISER_SPEED: i32 = 10;

/// `frames` (steps in order, as [`gif_steps`] spreads them) with each of `moments` shown: a moment no frame shows
/// takes the place of the frame nearest to it, so the count of frames stays. What an animation must not skip: the
/// first request each pane refused.
pub fn keep_moments(mut frames: Vec<u64>, moments: &[u64]) -> Vec<u64> {
    for &moment in moments {
        if frames.contains(&moment) {
            continue;
        }
        // The nearest frame that shows no other moment kept.
        let nearest = (0..frames.len())
            .filter(|&index| !moments.contains(&frames[index]))
            .min_by_key(|&index| frames[index].abs_diff(moment));
        if let Some(index) = nearest {
            frames[index] = moment;
            frames.sort_unstable();
        }
    }
    frames
}

/// Renders `session` as the story plays (see [`gif_steps`], the first refusal of each pane kept: [`keep_moments`])
/// into an animated GIF at `path`, looping; what it wrote: the steps each frame shows.
///
/// # Errors
/// `gif.frames` is 0, an image size [`RenderOptions::check`] refuses, the session has no steps,
/// rendering failed, or the file cannot be written.
pub fn render_gif(session: &mut Session, options: RenderOptions, gif: GifOptions, path: &Path) -> Result<Vec<u64>> {
    gif.check()?;
    // Well within a GIF's 65,535 pixels a side.
    options.check()?;
    // A refusal at step s shows once s + 1 steps are done.
    let refused: Vec<u64> =
        session.panes.iter().filter_map(|pane| pane.timeline.refusals().first().map(|&(step, _)| step + 1)).collect();
    let steps = keep_moments(gif_steps(session.steps(), gif.frames), &refused);
    if steps.is_empty() {
        // The caller names the recording.
        anyhow::bail!("no entries to animate (a GIF plays the recording's entries)");
    }
    // Encoded in memory, then written whole (no adapter, or a frame that fails: no file, an older one kept).
    let mut bytes: Vec<u8> = Vec::new();
    {
        let mut encoder = GifEncoder::new_with_speed(&mut bytes, GIF_QUANTISER_SPEED);
        encoder.set_repeat(Repeat::Infinite).context("cannot encode the GIF")?;
        let mut index = 0;
        let last = steps.len() - 1;
        let mut encode = |image: RgbaImage| -> Result<()> {
            let ms = if index == last { gif.last_frame_ms } else { gif.frame_ms };
            index += 1;
            let delay = Delay::from_numer_denom_ms(ms, 1);
            encoder.encode_frame(Frame::from_parts(image, 0, 0, delay)).context("cannot encode the GIF")
        };
        render_steps(session, options, &steps, &mut encode)?;
        // The encoder writes the GIF's trailer as it goes out of scope.
    }
    heapscope_core::whole_file::write_whole(path, |file| std::io::Write::write_all(file, &bytes))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_sizes_outside_what_the_renderer_draws_are_refused() {
        // (width, height, the flag the error names; None: accepted)
        let cases = [
            (1280, 480, None),
            (1, 1, None),
            (MAX_IMAGE_SIDE_PIXELS, MAX_IMAGE_SIDE_PIXELS, None),
            (0, 480, Some("--width 0")),
            (1280, 0, Some("--height 0")),
            (MAX_IMAGE_SIDE_PIXELS + 1, 480, Some("--width 8193")),
            (1280, u32::MAX, Some("--height 4294967295")),
        ];
        for (width, height, refused) in cases {
            let options = RenderOptions { width, height, ..RenderOptions::default() };
            match (options.check(), refused) {
                (Ok(()), None) => {}
                (Err(error), Some(words)) => assert!(error.to_string().contains(words), "{width}x{height}: {error}"),
                (result, _) => panic!("{width}x{height}: {result:?}, expected {refused:?}"),
            }
        }
    }

    #[test]
    fn gif_delays_a_gif_cannot_hold_are_refused() {
        // (frames, --frame-ms, the last frame's delay, what the error names; None: accepted)
        let cases = [
            (24, 250, 2_500, None),
            (1, 10, 100, None),
            (3, 65_530, 655_300, None),
            (3, 15, 150, Some("--frame-ms 15: a GIF frame's delay is in hundredths of a second")),
            (3, MAX_GIF_FRAME_MS, MAX_GIF_FRAME_MS, None),
            (0, 250, 2_500, Some("--frames 0")),
            (3, 0, 0, Some("--frame-ms 0")),
            (3, 9, 90, Some("--frame-ms 9")),
            (3, MAX_GIF_FRAME_MS + 1, MAX_GIF_FRAME_MS, Some("--frame-ms 655351")),
            (3, u32::MAX, MAX_GIF_FRAME_MS, Some("--frame-ms 4294967295")),
        ];
        for (frames, frame_ms, last_frame_ms, refused) in cases {
            let gif = GifOptions::playing(frames, frame_ms);
            assert_eq!(gif.last_frame_ms, last_frame_ms, "--frame-ms {frame_ms}");
            match (gif.check(), refused) {
                (Ok(()), None) => {}
                (Err(error), Some(words)) => assert!(error.to_string().contains(words), "{gif:?}: {error}"),
                (result, _) => panic!("{gif:?}: {result:?}, expected {refused:?}"),
            }
        }
    }

    /// Whether fontconfig knows a font for Chinese here (`fc-list :lang=zh`); scripts/test.sh installs one.
    fn system_has_a_cjk_font() -> bool {
        std::process::Command::new("fc-list")
            .args([":lang=zh", "file"])
            .output()
            .is_ok_and(|output| output.status.success() && !output.stdout.trim_ascii().is_empty())
    }

    #[test]
    fn cjk_in_a_frame_name_draws_with_a_font_the_system_has() {
        // CI fails before the tests without one (scripts/test.sh).
        if !system_has_a_cjk_font() {
            eprintln!("skipped: fontconfig knows no font for Chinese here");
            return;
        }
        // What a heap map's tooltip shows of a frame written by a Chinese or Japanese user.
        let text = "训练循环 (train_loop.py:42) 日本語";
        // The label shows from the second pass on: the first one, building the harness, has no provider yet.
        let mut harness = Harness::builder().build_ui_state(
            |ui, shown: &mut bool| {
                if *shown {
                    ui.label(text);
                }
            },
            false,
        );
        let id = egui::FontId::proportional(14.0);
        let bundled = harness.ctx.fonts_mut(|fonts| fonts.has_glyphs(&id, "训练日本語"));
        assert!(!bundled, "egui's bundled fonts lack these glyphs: nothing to test");
        add_system_fonts(&harness.ctx);
        // The provider is asked from the next pass; kittest's default panics on a glyph nothing has.
        *harness.state_mut() = true;
        harness.run();
        let discovered: Vec<String> =
            harness.ctx.fonts(|fonts| fonts.discovered_fonts().iter().map(|font| font.name.clone()).collect());
        assert!(!discovered.is_empty(), "no system font was taken for {text:?}");
        assert!(harness.ctx.fonts_mut(|fonts| fonts.has_glyphs(&id, "训练日本語")), "found: {discovered:?}");
    }

    #[test]
    fn an_animation_keeps_the_moments_it_must_show() {
        // (frames, moments, frames kept)
        let cases: [(&[u64], &[u64], &[u64]); 5] = [
            (&[25, 50, 75, 100], &[], &[25, 50, 75, 100]),
            (&[25, 50, 75, 100], &[50], &[25, 50, 75, 100]),
            (&[6, 12, 18, 24], &[17], &[6, 12, 17, 24]),
            (&[6, 12, 18, 24], &[10, 11], &[10, 11, 18, 24]),
            (&[5], &[3, 4], &[3]),
        ];
        for (frames, moments, kept) in cases {
            assert_eq!(keep_moments(frames.to_vec(), moments), kept, "{frames:?} keeping {moments:?}");
        }
    }

    /// However narrow the legend, no row ends between a swatch and its words: every entry's words start a swatch's
    /// width right of the legend's left edge (words at the edge would have left their swatch on the row above).
    #[test]
    fn a_legend_row_never_ends_between_a_swatch_and_its_words() {
        use egui_kittest::kittest::Queryable as _;
        let words = ["1.00 GiB to 2.00 GiB", "padding and rounding", "free", "unmapped address space"];
        for width in [160.0, 240.0, 330.0, 480.0] {
            let mut harness = Harness::builder().with_size([width, 300.0]).build_ui_state(
                |ui, left: &mut f32| {
                    *left = ui.max_rect().left();
                    ui.horizontal_wrapped(|ui| {
                        for words in words {
                            legend_entry(ui, egui::Color32::RED, words);
                        }
                    });
                },
                0.0,
            );
            harness.run();
            let left = *harness.state();
            let tops: Vec<f32> = words.iter().map(|words| harness.get_by_label(words).rect().top()).collect();
            for words in words {
                let rect = harness.get_by_label(words).rect();
                assert!(rect.left() >= left + 12.0, "{width}: {words:?} at {rect:?}, the legend from {left}");
            }
            assert!(tops.windows(2).all(|pair| pair[0] <= pair[1]), "{width}: rows in order {tops:?}");
        }
    }

    /// Every colour a render by stack draws has its legend entry: fourteen stacks live, the eleven allocating the most
    /// each by name (the ninth to eleventh had a hue of their own and no entry), the three others as one.
    #[test]
    fn every_stack_with_a_hue_of_its_own_has_a_legend_entry() {
        use heapscope_lab::compare::CompareConfig;
        use heapscope_lab::contender::Contender;
        use heapscope_lab::recording::Recording;
        use heapscope_pytorch::{Action, Frame, Snapshot, StackId, TraceEntry};
        let stacks = 14u32;
        // Stack s allocates (s + 1) MiB: stack 13 the most.
        let snapshot =
            Snapshot {
                device_traces: vec![
                    (0..stacks)
                        .map(|stack| {
                            let size_bytes = u64::from(stack + 1) << 20;
                            TraceEntry::new(Action::Alloc, u64::from(stack) << 30, size_bytes).with_frames(StackId(stack + 1))
                        })
                        .collect(),
                ],
                frame_stacks: std::iter::once(Vec::new())
                    .chain((0..stacks).map(|stack| {
                        vec![Frame { filename: "m.py".into(), line: stack.into(), name: format!("f{stack}").into() }]
                    }))
                    .collect(),
                ..Snapshot::default()
            };
        let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
        let mut session = Session::new(recording, CompareConfig::default(), &[Contender::Pytorch { expandable: false }]).unwrap();
        session.seek(u64::from(stacks));
        let entries = group_legend_entries(&session, ColourBy::StackGroup);
        let words: Vec<&str> = entries.iter().map(|(_, words)| words.as_str()).collect();
        let mut expected: Vec<String> =
            (3..stacks).rev().map(|stack| format!("f{stack} (m.py:{stack}) ({}.00 MiB)", stack + 1)).collect();
        expected.push("other stacks (6.00 MiB)".to_owned());
        assert_eq!(words, expected);
        let colours: std::collections::HashSet<egui::Color32> = entries.iter().map(|(colour, _)| *colour).collect();
        assert_eq!(colours.len(), entries.len(), "one entry a colour: {entries:?}");
    }

    #[test]
    fn gif_frames_spread_evenly_to_the_end() {
        let cases: [(u64, u32, &[u64]); 6] = [
            (100, 4, &[25, 50, 75, 100]),
            (61, 3, &[20, 40, 61]),
            (3, 6, &[1, 2, 3]),
            (5, 1, &[5]),
            (0, 4, &[]),
            // Issue 17: 2^32 - 1 frames of a short story build one frame per step, not 4 billion.
            (4, u32::MAX, &[1, 2, 3, 4]),
        ];
        for (steps, frames, expected) in cases {
            assert_eq!(gif_steps(steps, frames), expected, "{steps} steps in {frames} frames");
        }
    }
}
