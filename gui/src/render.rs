//! Headless rendering: the panes of a session at one step, drawn by egui into an image on the wgpu
//! renderer of egui_kittest (no window, no display; lavapipe or any adapter wgpu finds, a CPU one preferred
//! so that images are the same everywhere), and written as a PNG.

use std::path::Path;

use anyhow::{Context, Result};
use egui::RichText;
use egui_kittest::Harness;
use image::RgbaImage;

use crate::palette::ColourBy;
use crate::panes::{self, PaneStyle};
use crate::session::Session;

/// What to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    /// Image width in pixels.
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// Steps played (clamped to the session's; `None`: all of them).
    pub at: Option<u64>,
    /// How allocations are coloured.
    pub colour_by: ColourBy,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self { width: 1280, height: 480, at: None, colour_by: ColourBy::SizeClass }
    }
}

/// The title line of a render: the recording, the step and what happened at it.
pub fn title(session: &Session, shown_steps: u64) -> String {
    let mut title = format!("{} · step {shown_steps} of {}", session.name, session.steps());
    let refused: Vec<&str> = session
        .panes
        .iter()
        .filter(|pane| shown_steps.checked_sub(1).and_then(|step| pane.timeline.refusal_at(step)).is_some())
        .map(crate::session::Pane::name)
        .collect();
    if !refused.is_empty() {
        title.push_str(&format!(" · out of memory: {} (free runs too small in red)", refused.join(", ")));
    }
    title
}

/// Renders `session`'s panes at `options.at` steps.
///
/// # Errors
/// No graphics adapter, or rendering failed.
pub fn render(session: &mut Session, options: RenderOptions) -> Result<RgbaImage> {
    let shown = options.at.unwrap_or(u64::MAX).min(session.steps());
    session.seek(shown);
    let too_small: Vec<Option<u64>> = session
        .panes
        .iter()
        .map(|pane| shown.checked_sub(1).and_then(|step| pane.timeline.refusal_at(step)).map(|refusal| refusal.requested_bytes))
        .collect();
    let style = PaneStyle { shown_steps: shown, progress: 1.0, colour_by: options.colour_by, interactive: false };
    let heading = title(session, shown);
    let size = egui::vec2(options.width as f32, options.height as f32);
    let mut harness = Harness::builder().with_size(size).with_pixels_per_point(1.0).wgpu().build_ui(|ui| {
        egui::CentralPanel::default_margins().show(ui, |ui| {
            ui.label(RichText::new(&heading).strong());
            panes::show(ui, session, style, &[], &too_small);
        });
    });
    // The first frame lays out and loads the fonts; the second draws with them.
    harness.step();
    harness.step();
    harness.render().map_err(|error| anyhow::anyhow!("cannot render the heap map: {error}"))
}

/// Renders `session` (see [`render`]) into the PNG at `path`.
///
/// # Errors
/// Rendering failed, or the file cannot be written.
pub fn render_png(session: &mut Session, options: RenderOptions, path: &Path) -> Result<()> {
    let image = render(session, options)?;
    image.save(path).with_context(|| format!("cannot write {}", path.display()))
}
