//! The active memory timeline, drawn: memory_viz's view of a recording in the app (the lab's
//! [`heapscope_lab::timeline::active`] bands), under the panes in place of the totals plot.
//!
//! Every allocation is a band over the moments it is live, stacked on the older ones still live, coloured by its
//! stack (or its size class where the file recorded no stacks), or by its category when the app colours by category. Bands under half a pixel tall are not drawn one by
//! one: the live bytes are filled in grey first, so they show there as one mass (the level of detail that keeps
//! hundreds of thousands of pieces interactive). Each pane's reserved bytes are drawn over them as a line in the
//! pane's colour, the peak is marked and named, the moment shown is a white line; a hover names the allocation
//! under the pointer (size, lifetime, stack frames folded), a click or drag seeks, and a click picks the allocation
//! under the pointer, which every pane's heap map then outlines.

use egui::{Align2, Color32, FontId, Pos2, Rect, Sense, Shape, Stroke, Ui, pos2, vec2};
use heapscope_core::units::Bytes;
use heapscope_lab::recording::Moment;
use heapscope_lab::timeline::active::ActiveTimeline;
use heapscope_pytorch::StackId;

use crate::palette::{self, ColourBy, GroupHues, RecordingHues};
use crate::plot::{Series, byte_unit, nice_step, pane_colours};
use crate::session::Session;

/// What the timeline under the panes shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimelineView {
    /// The totals plot (live, reserved, fragmentation, OOMs).
    #[default]
    Totals,
    /// Every allocation over time, stacked (memory_viz's active memory timeline).
    Allocations,
    /// Every segment (block or mapped run) the focused pane's allocator held over time, stacked (memory_viz's cached
    /// memory view).
    Segments,
}

/// Bands thinner than this (in pixels) are left to the grey fill.
pub const MIN_BAND_PX: f32 = 0.5;

/// What a click or drag on the active memory timeline asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Clicked {
    /// Seek to this step.
    pub seek: Option<u64>,
    /// On a click, the allocation under the pointer (its slot), or `Some(None)` where there is none: what every pane
    /// outlines.
    pub picked: Option<Option<u32>>,
}

/// Draws `timeline` at `position` steps with each pane's reserved bytes from `series` in `height` pixels, bands
/// coloured as `colour_by` says ([`band_shapes`]); returns the step to seek to when clicked or dragged, and the
/// allocation picked by a click.
pub fn show(
    ui: &mut Ui,
    timeline: &ActiveTimeline,
    series: &[(&str, &Series)],
    (session, colour_by): (&Session, ColourBy),
    position: f64,
    height: f32,
) -> Clicked {
    let weak = ui.visuals().weak_text_color();
    let mut legend = egui::text::LayoutJob::default();
    let font = egui::TextStyle::Small.resolve(ui.style());
    let colours = pane_colours(series.iter().map(|(name, _)| *name));
    for ((name, _), &colour) in series.iter().zip(&colours) {
        legend.append(&format!("{name}   "), 0.0, egui::TextFormat::simple(font.clone(), colour));
    }
    let what = if timeline.addresses.is_empty() {
        let coloured = if colour_by == ColourBy::Category { "category" } else { "stack" };
        format!(
            "(lines: reserved; bands: every allocation while live, stacked oldest first, coloured by {coloured}; on \
             top, paler: the allocations under half a pixel, one band per stack; grey: all that is live)"
        )
    } else {
        "(lines: reserved; bands: every segment of the focused pane's allocator while held — a block, or a run of pages \
         mapped — stacked oldest first, coloured by size; on top, grey: the segments under half a pixel)"
            .to_owned()
    };
    legend.append(&what, 0.0, egui::TextFormat::simple(font, weak));
    ui.label(legend);
    let (outer, response) = ui.allocate_exact_size(vec2(ui.available_width(), height), Sense::click_and_drag());
    let rect = Rect::from_min_max(outer.min + vec2(44.0, 4.0), outer.max - vec2(4.0, 18.0));
    let painter = ui.painter_at(outer);
    // No fill of its own behind the plot (the panel's is there): on lavapipe every layer over the whole strip costs
    // about 2 ms a frame.
    painter.rect_stroke(rect, 0.0, Stroke::new(1.0, Color32::from_gray(40)), egui::StrokeKind::Outside);
    let positions = timeline.positions.max(1);
    let reserved_max = series.iter().flat_map(|(_, series)| &series.reserved).map(|point| point[1]).fold(0.0, f64::max);
    let max_bytes = (timeline.peak_bytes as f64).max(reserved_max).max(1.0) * 1.05;
    let x_at = |position: f64| rect.left() + (position / positions as f64) as f32 * rect.width();
    let y_at = |bytes: f64| rect.bottom() - (bytes / max_bytes) as f32 * rect.height();
    // The byte axis: ticks at 1, 2 or 5 times a power of ten, in the unit the peak needs.
    let (unit_name, unit) = byte_unit(max_bytes);
    let step = nice_step(max_bytes / unit / 4.0) * unit;
    let mut tick = 0.0;
    while tick <= max_bytes {
        let y = y_at(tick);
        painter.hline(rect.x_range(), y, Stroke::new(1.0, Color32::from_gray(40)));
        painter.text(
            pos2(rect.left() - 4.0, y),
            Align2::RIGHT_CENTER,
            format!("{}", tick / unit),
            FontId::proportional(11.0),
            weak,
        );
        tick += step;
    }
    painter.text(pos2(outer.left() + 2.0, rect.top()), Align2::LEFT_TOP, unit_name, FontId::proportional(11.0), weak);
    // The entry axis: ticks at 1, 2 or 5 times a power of ten (entry N is drawn at position N + 1).
    let entry_step = nice_step((positions as f64 / 8.0).max(1.0)) as u64;
    for entry in (0..positions).step_by(entry_step.max(1) as usize) {
        let x = x_at(entry as f64 + 1.5);
        if x > rect.right() - 40.0 {
            break; // leaves room for the axis name
        }
        painter.vline(x, rect.bottom()..=rect.bottom() + 3.0, Stroke::new(1.0, weak));
        painter.text(pos2(x, rect.bottom() + 3.0), Align2::CENTER_TOP, entry.to_string(), FontId::proportional(11.0), weak);
    }
    painter.text(pos2(rect.right(), outer.bottom()), Align2::RIGHT_BOTTOM, "entry", FontId::proportional(11.0), weak);
    painter.extend(band_shapes(timeline, rect, max_bytes, (colour_by, &session.hues)));
    // Each pane's reserved bytes over the bands.
    for (index, ((_, series), &colour)) in series.iter().zip(&colours).enumerate() {
        let points = line_points(series.reserved.iter().map(|&[x, bytes]| pos2(x_at(x + 1.0), y_at(bytes))));
        painter.add(Shape::mesh(step_line(&points, colour, crate::plot::line_width(index))));
    }
    let peak_x = x_at(timeline.peak_position as f64 + 0.5);
    painter.vline(peak_x, rect.y_range(), Stroke::new(1.0, Color32::from_rgb(240, 120, 110)));
    let peak = format!("peak {} at {}", Bytes(timeline.peak_bytes), Moment::at_position(timeline.peak_position));
    let align = if peak_x > rect.center().x { Align2::RIGHT_TOP } else { Align2::LEFT_TOP };
    // Under the reserved lines at the top, on a dark plate: over the bands and the lines the words were hard to read.
    let anchor = pos2(peak_x + if peak_x > rect.center().x { -4.0 } else { 4.0 }, rect.top() + 14.0);
    let peak_colour = Color32::from_rgb(240, 120, 110);
    let galley = painter.layout_no_wrap(peak, FontId::proportional(12.0), peak_colour);
    let label = align.anchor_size(anchor, galley.size());
    painter.rect_filled(label.expand(2.0), 2.0, Color32::from_black_alpha(210));
    painter.galley(label.min, galley, peak_colour);
    painter.vline(x_at(position + 0.5), rect.y_range(), Stroke::new(1.0, Color32::WHITE));
    let position_of = |pointer: Pos2| {
        ((pointer.x - rect.left()) / rect.width() * positions as f32).floor().clamp(0.0, (positions - 1) as f32) as u64
    };
    if let Some(pointer) = response.hover_pos().filter(|pointer| rect.contains(*pointer)) {
        let at = position_of(pointer);
        let bytes = f64::from((rect.bottom() - pointer.y) / rect.height()) * max_bytes;
        let text = match timeline.at(at, bytes as u64) {
            Some((band, _)) if !timeline.addresses.is_empty() => {
                let (from, to) = (band.pieces.first().map_or(0, |p| p.from), band.pieces.last().map_or(0, |p| p.to));
                let released = if to >= positions {
                    "held to the end".to_owned()
                } else {
                    format!("released at {}", Moment::at_position(to))
                };
                let address = timeline.addresses.get(band.slot as usize).copied().unwrap_or(0);
                format!(
                    "segment #{} at {address:#x}: {}\nreserved at {}, {released}",
                    band.slot,
                    Bytes(band.size_bytes),
                    Moment::at_position(from)
                )
            }
            Some((band, _)) => {
                let (from, to) = (band.pieces.first().map_or(0, |p| p.from), band.pieces.last().map_or(0, |p| p.to));
                let freed =
                    if to >= positions { "never freed".to_owned() } else { format!("freed at {}", Moment::at_position(to)) };
                let category = session.category(band.slot).map(|category| format!("\ncategory: {category}")).unwrap_or_default();
                format!(
                    "allocation #{}: {}\nallocated at {}, {freed}{category}{}",
                    band.slot,
                    Bytes(band.size_bytes),
                    Moment::at_position(from),
                    session.frames(band.slot).lines("stack", 16)
                )
            }
            None => match timeline.summaries.at(at, bytes as u64) {
                Some((stack, group_bytes)) => {
                    let under = Bytes(timeline.peak_bytes / heapscope_lab::timeline::active::DETAIL_FRACTION);
                    let from = match stack {
                        Some(stack) if stack != StackId::NONE => session.stack(stack.0).lines("from the stack", 16),
                        Some(_) => "\nwith no stack recorded".to_owned(),
                        None => "\nfrom every other stack".to_owned(),
                    };
                    format!(
                        "{}: {} live in allocations under {under} each, merged{from}",
                        Moment::at_position(at),
                        Bytes(group_bytes)
                    )
                }
                None => format!(
                    "{}: {} live",
                    Moment::at_position(at),
                    Bytes(timeline.live_bytes.get(at as usize).copied().unwrap_or(0))
                ),
            },
        };
        response.clone().on_hover_text_at_pointer(text);
    }
    let mut clicked = Clicked::default();
    if let Some(pointer) = response.interact_pointer_pos().filter(|_| response.clicked() || response.dragged()) {
        clicked.seek = Some(position_of(pointer));
    }
    if let Some(pointer) = response.interact_pointer_pos().filter(|_| response.clicked()) {
        let bytes = f64::from((rect.bottom() - pointer.y) / rect.height()) * max_bytes;
        // Segments are no allocation to pick.
        let band = timeline.at(position_of(pointer), bytes as u64).filter(|_| timeline.addresses.is_empty());
        clicked.picked = Some(band.map(|(band, _)| band.slot));
    }
    clicked
}

/// The points of a line as drawn: one per pixel column (the highest there) and none in the middle of a flat run. A
/// step curve of thousands of points drawn as a feathered line costs lavapipe several milliseconds a frame.
fn line_points(points: impl Iterator<Item = Pos2>) -> Vec<Pos2> {
    let mut kept: Vec<Pos2> = Vec::new();
    for point in points {
        match kept.last_mut() {
            // The same pixel column: keep the highest (the smallest y).
            Some(last) if last.x.floor() == point.x.floor() => last.y = last.y.min(point.y),
            _ => {
                // A flat run goes on: its middle point is not needed.
                if let [.., before, last] = kept.as_slice()
                    && before.y == last.y
                    && last.y == point.y
                {
                    kept.pop();
                }
                kept.push(point);
            }
        }
    }
    kept
}

/// A step line through `points` (a level to the next point's x, then up or down to its level), `width` points thick,
/// as quads of one mesh: a feathered polyline cost lavapipe about 6 ms a frame over the bands.
fn step_line(points: &[Pos2], colour: Color32, width: f32) -> egui::Mesh {
    let half = width / 2.0;
    let mut mesh = egui::Mesh::default();
    for pair in points.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        mesh.add_colored_rect(Rect::from_min_max(pos2(from.x, from.y - half), pos2(to.x + half, from.y + half)), colour);
        let (top, bottom) = (from.y.min(to.y), from.y.max(to.y));
        mesh.add_colored_rect(Rect::from_min_max(pos2(to.x - half, top - half), pos2(to.x + half, bottom + half)), colour);
    }
    mesh
}

/// The shapes of `timeline`'s bands in `rect`, `max_bytes` at its top: the grey mass of the live bytes (the most live
/// in each pixel column), then every piece of a band at least [`MIN_BAND_PX`] tall, in its category's colour for
/// [`ColourBy::Category`], else its stack's (its size class's where none was recorded). What a frame costs, measured
/// by `cargo bench -p heapscope-gui --bench active_timeline`. Every fill is a quad of one mesh (the first shape):
/// thousands of one-pixel columns drawn as separate anti-aliased rectangles cost lavapipe most of a frame.
pub fn band_shapes(
    timeline: &ActiveTimeline,
    rect: Rect,
    max_bytes: f64,
    (colour_by, hues): (ColourBy, &RecordingHues),
) -> Vec<Shape> {
    let positions = timeline.positions.max(1);
    let x_at = |position: f64| rect.left() + (position / positions as f64) as f32 * rect.width();
    let y_at = |bytes: f64| rect.bottom() - (bytes / max_bytes) as f32 * rect.height();
    let mut fills = egui::Mesh::default();
    let mut shapes = Vec::new();
    // The grey mass of the live bytes, one column per pixel (the most live in it).
    let columns = rect.width().max(1.0) as usize;
    for column in 0..columns {
        let first = (column as u64 * positions / columns as u64) as usize;
        let last = (((column + 1) as u64 * positions).div_ceil(columns as u64) as usize).min(timeline.live_bytes.len());
        let live = timeline.live_bytes.get(first..last).and_then(|live| live.iter().max()).copied().unwrap_or(0);
        // Below the top of the stack the bands and the summaries cover it: the grey shows only above (no overdraw).
        let stacked = timeline
            .summaries
            .stretch_at(first as u64)
            .map_or(0, |stretch| stretch.bytes.iter().fold(stretch.base_bytes, |sum, &bytes| sum.saturating_add(bytes)));
        if live > stacked {
            let x = rect.left() + column as f32;
            let (top, bottom) = (y_at(live as f64), y_at(stacked as f64));
            fills
                .add_colored_rect(Rect::from_min_max(pos2(x, top), pos2(x + 1.0, bottom.max(top + 1.0))), Color32::from_gray(70));
        }
    }
    // The bands tall enough to see, each piece a rectangle.
    let min_bytes = f64::from(MIN_BAND_PX) / f64::from(rect.height().max(1.0)) * max_bytes;
    for band in timeline.bands.iter().filter(|band| band.size_bytes as f64 >= min_bytes) {
        let colour = match colour_by {
            _ if !timeline.addresses.is_empty() => palette::size_class(band.size_bytes),
            ColourBy::Category => hues.category.colour(u32::from(band.category.0)),
            _ if band.stack == StackId::NONE => palette::size_class(band.size_bytes),
            _ => hues.stack.colour(band.stack.0),
        };
        for piece in &band.pieces {
            let top = y_at(piece.offset_bytes.saturating_add(band.size_bytes) as f64);
            let bottom = y_at(piece.offset_bytes as f64);
            let (left, right) = (x_at(piece.from as f64), x_at(piece.to as f64).max(x_at(piece.from as f64) + 1.0));
            let piece = Rect::from_min_max(pos2(left, top), pos2(right, bottom));
            fills.add_colored_rect(piece, colour);
            if piece.height() >= 4.0 {
                // Neighbours of one colour stay countable.
                shapes.push(Shape::rect_stroke(
                    piece,
                    0.0,
                    Stroke::new(0.5, Color32::from_black_alpha(140)),
                    egui::StrokeKind::Inside,
                ));
            }
        }
    }
    summary_fills(timeline, rect, max_bytes, &hues.stack, &mut fills);
    shapes.insert(0, Shape::mesh(fills));
    shapes
}

/// The summary bands (the allocations too small for a band, one band per stack group) on top of the bands: per run of
/// pixel columns in one stretch, a rectangle per group, paler than the bands.
fn summary_fills(timeline: &ActiveTimeline, rect: Rect, max_bytes: f64, stack_hues: &GroupHues, fills: &mut egui::Mesh) {
    let summaries = &timeline.summaries;
    let positions = timeline.positions.max(1);
    let y_at = |bytes: u64| rect.bottom() - (bytes as f64 / max_bytes) as f32 * rect.height();
    let colours: Vec<Color32> = summaries
        .groups
        .iter()
        .map(|group| match group {
            // Allocations with no stack recorded are a group as any stack is.
            Some(stack) => stack_hues.colour(stack.0).gamma_multiply(0.6),
            None => Color32::from_gray(110),
        })
        .collect();
    let columns = rect.width().max(1.0) as usize;
    let mut column = 0;
    while column < columns {
        let position = column as u64 * positions / columns as u64;
        let Some(stretch) = summaries.stretch_at(position) else {
            column += 1;
            continue;
        };
        // The run of columns in this stretch.
        let mut end = column + 1;
        while end < columns
            && summaries.stretch_at(end as u64 * positions / columns as u64).is_some_and(|s| s.from == stretch.from)
        {
            end += 1;
        }
        let (left, right) = (rect.left() + column as f32, rect.left() + end as f32);
        let mut offset = stretch.base_bytes;
        for (bytes, colour) in stretch.bytes.iter().zip(&colours) {
            let (top, bottom) = (y_at(offset.saturating_add(*bytes)), y_at(offset));
            if bottom - top >= 0.25 {
                fills.add_colored_rect(Rect::from_min_max(pos2(left, top), pos2(right, bottom)), *colour);
            }
            offset = offset.saturating_add(*bytes);
        }
        column = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One point per pixel column (the highest), flat runs kept by their ends only.
    #[test]
    fn line_points_keep_the_shape_in_fewer_points() {
        let points = [(0.2, 10.0), (0.7, 8.0), (1.5, 8.0), (2.5, 8.0), (3.5, 8.0), (4.5, 5.0), (5.5, 5.0)];
        let kept: Vec<(f32, f32)> = line_points(points.iter().map(|&(x, y)| pos2(x, y))).iter().map(|p| (p.x, p.y)).collect();
        assert_eq!(kept, [(0.2, 8.0), (3.5, 8.0), (4.5, 5.0), (5.5, 5.0)]);
    }
}
