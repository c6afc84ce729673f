//! The heap map: every region (block, segment, virtual range) as a band of rows, allocations as coloured
//! spans, free runs, padding and rounding waste, and the resident pages of virtual ranges.
//!
//! All regions share one scale, `row_bytes` bytes per row of full width, and a region's bytes wrap from row
//! to row, so areas compare at a glance: a 1 GiB block is four rows of 256 MiB where a 20 MiB segment is
//! part of one. Regions smaller than a row share rows, side by side in address order (`Shelf`), so a heap of
//! a few big segments and a hundred small ones (PyTorch's 2 MiB small pool) is not mostly empty rows. Zooming
//! changes `row_bytes` (down to single allocations), panning scrolls the rows. A virtual range shows up to the
//! highest page it ever mapped.
//!
//! Building the shapes touches only the visible rows ([`Rows`] finds them by binary search), and within a
//! row every allocation once; allocations narrower than a pixel that touch merge into one shape, so the
//! number of shapes is bounded by the visible pixels, whatever the number of allocations.
//!
//! Positions down the map (the scroll, band tops, the map's height) are `f64` points: at 64 B per row a
//! 40 GiB heap is 10^10 points tall, where an `f32` steps by over a thousand points (wheel steps lost, rows
//! drawn over each other, hover on the wrong allocation). They become `f32` only relative to the top of the
//! view, where they are small.

use egui::{Color32, CornerRadius, Rect, Sense, Shape, Stroke, StrokeKind, Ui, Vec2, pos2};
use heapscope_lab::timeline::{Layout, Region, RegionKind, Span, Timeline};

use crate::palette::{self, ColourBy};
use crate::slot::SlotInfo;

/// Height of one row in points (fitting many regions in little height shrinks it, down to
/// [`MIN_ROW_HEIGHT`]).
pub const ROW_HEIGHT: f32 = 16.0;
/// The least height of a row when fitting.
pub const MIN_ROW_HEIGHT: f32 = 3.0;
/// Space between two regions' bands, in points (1 when rows are thin).
pub const REGION_GAP: f32 = 5.0;
/// Regions sharing a row are this fraction of a row apart (about 5 points on a 1,300-point map).
const SHELF_GAP_FRACTION: u64 = 256;

/// Packs regions smaller than a row side by side into one row, in address order, while they fit; a region of a
/// row or more takes rows of its own.
#[derive(Clone, Copy, Debug, Default)]
struct Shelf {
    /// Bytes used of the current shared row, while the current line is one.
    used_bytes: Option<u64>,
}

/// Where [`Shelf::place`] puts a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// On the current line, this many bytes from its left edge.
    Beside { left_bytes: u64 },
    /// At the start of a new line of this many rows.
    NewLine { rows: u64 },
}

impl Shelf {
    /// Where the next region, `shown_bytes` long, goes at `row_bytes` per row.
    fn place(&mut self, shown_bytes: u64, row_bytes: u64) -> Place {
        let new_line = Place::NewLine { rows: shown_bytes.div_ceil(row_bytes).max(1) };
        if shown_bytes >= row_bytes {
            self.used_bytes = None;
            return new_line;
        }
        // At least a byte, so regions sharing a row never touch.
        let gap = (row_bytes / SHELF_GAP_FRACTION).max(1);
        match self.used_bytes {
            Some(used) if used + gap + shown_bytes <= row_bytes => {
                self.used_bytes = Some(used + gap + shown_bytes);
                Place::Beside { left_bytes: used + gap }
            }
            _ => {
                self.used_bytes = Some(shown_bytes);
                new_line
            }
        }
    }

    /// Lines and rows regions of `shown` bytes take at `row_bytes` per row.
    fn measure(shown: &[u64], row_bytes: u64) -> (u64, u64) {
        let mut shelf = Self::default();
        let (mut lines, mut rows) = (0, 0);
        for &bytes in shown {
            if let Place::NewLine { rows: line_rows } = shelf.place(bytes, row_bytes) {
                lines += 1;
                rows += line_rows;
            }
        }
        (lines, rows)
    }
}
/// The most a view zooms in: bytes per row.
pub const MIN_ROW_BYTES: u64 = 64;
/// Height of the strip marking resident pages along the top of a virtual region's rows (at most a quarter of a row:
/// on rows a few pixels tall a whole strip and its edge covered every allocation in them).
const MAPPED_STRIP: f32 = 3.0;

/// The scale of a map: bytes per row and how tall rows and the gaps between regions are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    /// Bytes per row of full width.
    pub row_bytes: u64,
    /// Height of a row.
    pub row_height: f32,
    /// Space between regions.
    pub gap: f32,
}

impl Scale {
    /// `row_bytes` per row at the full row height.
    pub fn new(row_bytes: u64) -> Self {
        Self { row_bytes: row_bytes.max(1), row_height: ROW_HEIGHT, gap: REGION_GAP }
    }
}

/// Zoom and scroll of one map.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MapView {
    /// The scale; `None` fits the whole heap in the height available.
    pub scale: Option<Scale>,
    /// Points scrolled down from the first row (`f64`: see the module documentation).
    pub scroll: f64,
}

impl MapView {
    /// Zooms by `factor` (above 1 zooms in) from `row_bytes`, clamped to sensible scales.
    pub fn zoomed(row_bytes: u64, factor: f32, widest_region_bytes: u64) -> u64 {
        let zoomed = (row_bytes as f64 / f64::from(factor)).round() as u64;
        zoomed.clamp(MIN_ROW_BYTES, widest_region_bytes.max(MIN_ROW_BYTES))
    }
}

/// One region's band.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Band {
    /// Base address of the region.
    pub address: u64,
    /// Bytes shown (a virtual region: up to its highest page ever mapped).
    pub shown_bytes: u64,
    /// How it is backed.
    pub kind: RegionKind,
    /// Top of its first row, in points from the top of the map.
    pub top: f64,
    /// Where it starts in its first row, in bytes from the row's left edge: 0, but for a region sharing its row
    /// with smaller ones before it.
    pub left_bytes: u64,
    /// Rows it takes.
    pub rows: u64,
    /// Whether the step animating released it: it is no longer in the layout, and fades out in place.
    pub released: bool,
}

/// Where every region's rows are at one scale.
#[derive(Clone, Debug, PartialEq)]
pub struct Rows {
    /// Bytes per row.
    pub row_bytes: u64,
    /// Height of a row.
    pub row_height: f32,
    /// Space between regions.
    pub gap: f32,
    /// The bands, by address.
    pub bands: Vec<Band>,
    /// Height of all rows and gaps.
    pub height: f64,
}

impl Rows {
    /// The bands of `layout`'s regions at `scale`.
    pub fn new(layout: &Layout, timeline: &Timeline, scale: Scale) -> Self {
        Self::with_released(layout, timeline, scale, &[])
    }

    /// The bands of `layout`'s regions and of `released`, regions the step animating released (in their place
    /// by address, while they fade out), at `scale`.
    pub fn with_released(layout: &Layout, timeline: &Timeline, scale: Scale, released: &[Region]) -> Self {
        let Scale { row_bytes, row_height, gap } = scale;
        let row_bytes = row_bytes.max(1);
        let mut regions: Vec<(&Region, bool)> = layout.regions().map(|region| (region, false)).collect();
        if !released.is_empty() {
            // A region reserved again at the same address in the same step fades in instead.
            regions
                .extend(released.iter().filter(|region| layout.region_of(region.address).is_none()).map(|region| (region, true)));
            regions.sort_by_key(|(region, _)| region.address);
        }
        let mut bands: Vec<Band> = Vec::with_capacity(regions.len());
        let mut shelf = Shelf::default();
        // The current line: its top and rows.
        let (mut line_top, mut line_rows) = (0.0, 0);
        for (region, released) in regions {
            let shown_bytes = timeline.shown_bytes(region);
            let (left_bytes, rows) = match shelf.place(shown_bytes, row_bytes) {
                Place::Beside { left_bytes } => (left_bytes, 1),
                Place::NewLine { rows } => {
                    if !bands.is_empty() {
                        line_top += line_rows as f64 * f64::from(row_height) + f64::from(gap);
                    }
                    line_rows = rows;
                    (0, rows)
                }
            };
            bands.push(Band {
                address: region.address,
                shown_bytes,
                kind: region.kind,
                top: line_top,
                left_bytes,
                rows,
                released,
            });
        }
        let height = if bands.is_empty() { 0.0 } else { line_top + line_rows as f64 * f64::from(row_height) };
        Self { row_bytes, row_height, gap, bands, height }
    }

    /// The scale that makes every band fit in `height` points: full-height rows as narrow as fit, or, when
    /// even one row per region does not fit, thinner rows (down to [`MIN_ROW_HEIGHT`], past which the map
    /// scrolls).
    pub fn fit(layout: &Layout, timeline: &Timeline, height: f32) -> Scale {
        let shown: Vec<u64> = layout.regions().map(|region| timeline.shown_bytes(region)).collect();
        let widest = shown.iter().copied().max().unwrap_or(MIN_ROW_BYTES).max(MIN_ROW_BYTES);
        // At the widest region's size every line is one row: the fewest rows there can be.
        let lines = (Shelf::measure(&shown, widest).0.max(1)) as f32;
        let (mut row_height, mut gap) = (ROW_HEIGHT, REGION_GAP);
        if lines * row_height + (lines - 1.0) * gap > height {
            gap = if (height - (lines - 1.0) * gap) / lines >= 8.0 { gap } else { 1.0 };
            row_height = ((height - (lines - 1.0) * gap) / lines).floor().clamp(MIN_ROW_HEIGHT, ROW_HEIGHT);
        }
        let fits = |row_bytes: u64| {
            let (lines, rows) = Shelf::measure(&shown, row_bytes);
            rows as f32 * row_height + (lines.max(1) - 1) as f32 * gap <= height
        };
        // The smallest row size that fits: rows only get fewer as they get wider.
        let (mut low, mut high) = (MIN_ROW_BYTES, widest);
        if fits(low) {
            high = low;
        }
        while high - low > 1 {
            let middle = low + (high - low) / 2;
            if fits(middle) { high = middle } else { low = middle }
        }
        Scale { row_bytes: high, row_height, gap }
    }

    /// The scale these rows were laid out at.
    pub fn scale(&self) -> Scale {
        Scale { row_bytes: self.row_bytes, row_height: self.row_height, gap: self.gap }
    }

    /// The widest band's bytes (the zoom-out limit).
    pub fn widest_bytes(&self) -> u64 {
        self.bands.iter().map(|band| band.shown_bytes).max().unwrap_or(MIN_ROW_BYTES)
    }

    /// The top of row `row` of `band`, in points from the top of the map.
    pub fn row_top(&self, band: &Band, row: u64) -> f64 {
        band.top + row as f64 * f64::from(self.row_height)
    }

    /// Index of the first band whose rows end below `y`.
    fn first_band_below(&self, y: f64) -> usize {
        self.bands.partition_point(|band| self.row_top(band, band.rows) <= y)
    }

    /// The band and row at `y` points from the top of the map (`None` in a gap or past the end).
    pub fn row_at(&self, y: f64) -> Option<(usize, u64)> {
        let index = self.first_band_below(y);
        let band = self.bands.get(index)?;
        if y < band.top {
            return None;
        }
        Some((index, ((y - band.top) / f64::from(self.row_height)) as u64))
    }

    /// The address at `offset` from the top-left of a map `width` points wide scrolled down by `scroll` points.
    pub fn address_at(&self, offset: Vec2, scroll: f64, width: f32) -> Option<u64> {
        let (index, row) = self.row_at(scroll + f64::from(offset.y))?;
        let x_bytes = (f64::from((offset.x / width).clamp(0.0, 1.0)) * self.row_bytes as f64) as u64;
        // The regions sharing the line, left to right: the one under the pointer.
        let line_top = self.bands[index].top;
        let band = self.bands[index..]
            .iter()
            .take_while(|band| band.top == line_top)
            .take_while(|band| band.left_bytes <= x_bytes)
            .last()?;
        let within = row * self.row_bytes + (x_bytes - band.left_bytes);
        (within < band.shown_bytes).then_some(band.address + within)
    }

    /// The y (from the top of the map) of the row holding `address`.
    pub fn y_of(&self, address: u64) -> Option<f64> {
        let index = self.bands.partition_point(|band| band.address <= address).checked_sub(1)?;
        let band = &self.bands[index];
        let within = address.checked_sub(band.address).filter(|within| *within < band.shown_bytes)?;
        Some(self.row_top(band, within / self.row_bytes))
    }
}

/// The step being animated: what it added fades and grows in, what it removed fades out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepAnimation {
    /// How far the step has played, 0 to 1.
    pub progress: f32,
    /// Footprint addresses of the allocations it made.
    pub born: Vec<u64>,
    /// The allocations it freed.
    pub dying: Vec<Span>,
    /// Base addresses of the regions it reserved.
    pub new_regions: Vec<u64>,
    /// The regions it released, as they were before it (faded out in place).
    pub released: Vec<Region>,
    /// Pages it mapped, `(address, bytes)` by address (faded in).
    pub mapped: Vec<(u64, u64)>,
    /// Pages it unmapped, `(address, bytes)` by address (faded out).
    pub unmapped: Vec<(u64, u64)>,
    /// Allocations it moved within their region (compaction): each as it was, and the footprint address it moves to;
    /// drawn sliding from one to the other.
    pub sliding: Vec<(Span, u64)>,
}

/// Where an allocation moving from `from` to `to` is drawn, `progress` of the way (an address: it slides along the
/// rows between the two places).
pub fn sliding_at(from: u64, to: u64, progress: f32) -> u64 {
    let progress = f64::from(progress.clamp(0.0, 1.0));
    if to >= from { from + ((to - from) as f64 * progress) as u64 } else { from - ((from - to) as f64 * progress) as u64 }
}

/// `[address, address + bytes)` cut where `ranges` (`(address, bytes)`, by address, disjoint) begin and end:
/// each piece, and whether it lies in one of them.
fn cut(address: u64, bytes: u64, ranges: &[(u64, u64)]) -> impl Iterator<Item = (u64, u64, bool)> {
    let end = address + bytes;
    let mut pieces = Vec::new();
    let mut at = address;
    for &(start, length) in ranges {
        let (inner_start, inner_end) = (start.max(at), (start + length).min(end));
        if inner_start >= inner_end {
            continue;
        }
        if inner_start > at {
            pieces.push((at, inner_start - at, false));
        }
        pieces.push((inner_start, inner_end - inner_start, true));
        at = inner_end;
    }
    if at < end {
        pieces.push((at, end - at, false));
    }
    pieces.into_iter()
}

/// What the map shows.
#[derive(Clone, Copy, Debug)]
pub struct Scene<'a> {
    /// The layout now.
    pub layout: &'a Layout,
    /// Its timeline (how much of virtual regions to show, the trace length for ages).
    pub timeline: &'a Timeline,
    /// Steps played (for ages).
    pub position: u64,
    /// How allocations are coloured.
    pub colour_by: ColourBy,
    /// Per trace slot, what it is coloured by in [`ColourBy::by_group`] modes (empty: one group).
    pub slots: &'a [SlotInfo],
    /// The colours of the groups of `colour_by` (a stack, a category), where it colours by group.
    pub hues: &'a palette::GroupHues,
    /// The scale shared with other maps (`None`: this map fits its own); a zoom by hand overrides it.
    pub scale: Option<Scale>,
    /// The step playing, if any.
    pub animation: Option<&'a StepAnimation>,
    /// Free runs smaller than this many bytes are highlighted (the request that failed).
    pub too_small_below: Option<u64>,
    /// Footprint address of the allocation to outline.
    pub hovered: Option<u64>,
}

impl Scene<'_> {
    fn colour(&self, span: &Span) -> Color32 {
        let colour = match self.colour_by {
            ColourBy::SizeClass => palette::size_class(span.requested_bytes),
            ColourBy::Age => return palette::age(self.position.saturating_sub(span.born), self.timeline.steps()),
            ColourBy::StackGroup | ColourBy::Category => {
                self.hues.colour(self.slots.get(span.slot as usize).map_or(0, |slot| slot.group(self.colour_by)))
            }
        };
        // Every other allocation a shade darker: neighbours of one colour stay countable.
        if span.slot % 2 == 1 { palette::alternate(colour) } else { colour }
    }
}

/// Collects rectangles for one row, merging neighbours narrower than a pixel.
struct RowPainter<'a> {
    out: &'a mut Vec<Shape>,
    /// The rectangle being grown: x range and colour.
    pending: Option<(f32, f32, Color32)>,
    top: f32,
    bottom: f32,
}

impl RowPainter<'_> {
    fn push(&mut self, x0: f32, x1: f32, colour: Color32) {
        if let Some((start, end, pending_colour)) = &mut self.pending {
            // Sub-pixel pieces that touch the pending one join it, whatever their colour.
            if x0 <= *end + 0.5 && (x1 - x0 < 1.0 || *end - *start < 1.0) && x1 - *start < 2.0 {
                *end = end.max(x1);
                return;
            }
            if x0 <= *end && x1 <= *end && colour == *pending_colour {
                return;
            }
        }
        self.flush();
        self.pending = Some((x0, x1, colour));
    }

    fn flush(&mut self) {
        if let Some((x0, x1, colour)) = self.pending.take() {
            let rect = Rect::from_min_max(pos2(x0, self.top), pos2(x1.max(x0 + 0.5), self.bottom));
            self.out.push(Shape::rect_filled(rect, CornerRadius::ZERO, colour));
        }
    }
}

/// Appends the shapes of the rows of `scene` visible in `rect`, scrolled down by `scroll` points, to `out`.
pub fn build_shapes(scene: &Scene<'_>, rows: &Rows, rect: Rect, scroll: f64, out: &mut Vec<Shape>) {
    let width = rect.width().max(1.0);
    let row_bytes = rows.row_bytes;
    let progress = scene.animation.map_or(1.0, |animation| animation.progress);
    let born = |address: u64| scene.animation.is_some_and(|animation| animation.born.binary_search(&address).is_ok());
    let sliding_to =
        |address: u64| scene.animation.is_some_and(|animation| animation.sliding.iter().any(|&(_, to)| to == address));
    // Points from the top of the map to `rect`'s coordinates: small within the view, whatever the heap's height.
    let y_of = |y: f64| rect.top() + (y - scroll) as f32;
    for band in &rows.bands[rows.first_band_below(scroll)..] {
        let band_top = y_of(band.top);
        if band_top > rect.bottom() {
            break;
        }
        // x of `address` in the row starting at `row_start` (the band starts `left_bytes` into a shared row).
        let left_bytes = band.left_bytes;
        let x_of = |row_start: u64, address: u64| {
            rect.left() + ((left_bytes + address - row_start) as f64 / row_bytes as f64) as f32 * width
        };
        let first_row = ((scroll - band.top) / f64::from(rows.row_height)).floor().max(0.0) as u64;
        let (region, alpha) = match scene.animation {
            Some(animation) if band.released => {
                (animation.released.iter().find(|region| region.address == band.address), 1.0 - progress)
            }
            Some(animation) if animation.new_regions.contains(&band.address) => (scene.layout.region_of(band.address), progress),
            _ => (scene.layout.region_of(band.address), 1.0),
        };
        // Pages the step mapped fade in, pages it unmapped fade out.
        let (mapped_now, unmapped_now) =
            scene.animation.map_or((&[][..], &[][..]), |animation| (&animation.mapped[..], &animation.unmapped[..]));
        let page_alpha = |fresh: bool| if fresh { alpha * progress } else { alpha };
        for row in first_row..band.rows {
            let top = y_of(rows.row_top(band, row));
            if top > rect.bottom() {
                break;
            }
            let bottom = top + (rows.row_height - 1.0).max(1.0);
            let start = band.address + row * row_bytes;
            let end = (start + row_bytes).min(band.address + band.shown_bytes);
            let row_rect = Rect::from_min_max(pos2(x_of(start, start), top), pos2(x_of(start, end), bottom));
            // Reserved memory is free unless an allocation holds it; a virtual range only where mapped.
            let mut painter = RowPainter { out, pending: None, top, bottom };
            match band.kind {
                RegionKind::Block => {
                    painter.out.push(Shape::rect_filled(row_rect, CornerRadius::ZERO, palette::faded(palette::FREE, alpha)));
                }
                RegionKind::Virtual => {
                    painter.out.push(Shape::rect_filled(row_rect, CornerRadius::ZERO, palette::faded(palette::UNMAPPED, alpha)));
                    for (address, bytes) in mapped_in(region, start, end) {
                        for (address, bytes, fresh) in cut(address, bytes, mapped_now) {
                            let (x0, x1) = (x_of(start, address), x_of(start, address + bytes));
                            painter.out.push(Shape::rect_filled(
                                Rect::from_min_max(pos2(x0, top), pos2(x1.max(x0 + 0.5), bottom)),
                                CornerRadius::ZERO,
                                palette::faded(palette::FREE, page_alpha(fresh)),
                            ));
                        }
                    }
                    for &(address, bytes) in
                        unmapped_now.iter().filter(|(address, bytes)| *address < end && address + bytes > start)
                    {
                        let (x0, x1) = (x_of(start, address.max(start)), x_of(start, (address + bytes).min(end)));
                        painter.out.push(Shape::rect_filled(
                            Rect::from_min_max(pos2(x0, top), pos2(x1.max(x0 + 0.5), bottom)),
                            CornerRadius::ZERO,
                            palette::faded(palette::FREE, 1.0 - progress),
                        ));
                    }
                }
            }
            if let Some(needed) = scene.too_small_below {
                for (address, bytes) in scene.layout.free_runs_in(start, end) {
                    if bytes < needed {
                        let (x0, x1) = (x_of(start, address.max(start)), x_of(start, (address + bytes).min(end)));
                        painter.push(x0, x1, palette::FREE_TOO_SMALL);
                    }
                }
                painter.flush();
            }
            for span in scene.layout.spans_in(start, end) {
                if sliding_to(span.address) {
                    // Drawn on its way there, below.
                    continue;
                }
                let colour = palette::faded(scene.colour(span), alpha);
                let grow = if born(span.address) { progress } else { 1.0 };
                let x0 = x_of(start, span.address.max(start));
                let x1 = x_of(start, span.end().min(end));
                let x1 = x0 + (x1 - x0) * grow;
                if x1 - x0 < 2.0 || span.waste_bytes() == 0 {
                    painter.push(x0, x1, colour);
                    continue;
                }
                // Waste shaded darker around the requested bytes.
                let live_start = span.address + span.lead_bytes;
                let live_end = live_start + span.requested_bytes;
                painter.push(x0, x1, palette::waste(colour));
                let (l0, l1) = (x_of(start, live_start.clamp(start, end)), x_of(start, live_end.clamp(start, end)));
                if l1 > l0 {
                    painter.flush();
                    painter.push(l0.min(x1), l1.min(x1), colour);
                }
            }
            painter.flush();
            if let Some(animation) = scene.animation {
                for span in animation.dying.iter().filter(|span| span.address < end && span.end() > start) {
                    let (x0, x1) = (x_of(start, span.address.max(start)), x_of(start, span.end().min(end)));
                    let colour = palette::faded(scene.colour(span), 1.0 - progress);
                    out.push(Shape::rect_filled(Rect::from_min_max(pos2(x0, top), pos2(x1.max(x0 + 0.5), bottom)), 0.0, colour));
                }
                // A moved allocation slides from its old place to its new one as the step plays.
                for (old, to) in &animation.sliding {
                    let span = Span { address: sliding_at(old.address, *to, progress), ..*old };
                    if span.address < end && span.end() > start {
                        let (x0, x1) = (x_of(start, span.address.max(start)), x_of(start, span.end().min(end)));
                        let colour = palette::faded(scene.colour(&span), alpha);
                        out.push(Shape::rect_filled(
                            Rect::from_min_max(pos2(x0, top), pos2(x1.max(x0 + 0.5), bottom)),
                            0.0,
                            colour,
                        ));
                    }
                }
            }
            if band.kind == RegionKind::Virtual {
                // The strip, with a dark edge under it: it stays visible over allocations of any colour (green ones too).
                let strip_height = MAPPED_STRIP.min((bottom - top) / 4.0);
                let edge_height = if strip_height >= MAPPED_STRIP { 1.0 } else { 0.0 };
                let strip = |address: u64, bytes: u64, alpha: f32| {
                    let (x0, x1) = (x_of(start, address), x_of(start, address + bytes));
                    let rect = Rect::from_min_max(pos2(x0, top), pos2(x1.max(x0 + 0.5), top + strip_height));
                    let edge = Rect::from_min_max(rect.left_bottom(), rect.right_bottom() + egui::vec2(0.0, edge_height));
                    [
                        Shape::rect_filled(rect, 0.0, palette::faded(palette::MAPPED, alpha)),
                        Shape::rect_filled(edge, 0.0, palette::faded(palette::BACKGROUND, alpha)),
                    ]
                };
                for (address, bytes) in mapped_in(region, start, end) {
                    out.extend(
                        cut(address, bytes, mapped_now)
                            .flat_map(|(address, bytes, fresh)| strip(address, bytes, page_alpha(fresh))),
                    );
                }
                for &(address, bytes) in unmapped_now.iter().filter(|(address, bytes)| *address < end && address + bytes > start)
                {
                    let clipped = address.max(start);
                    out.extend(strip(clipped, (address + bytes).min(end) - clipped, 1.0 - progress));
                }
            }
            if let Some(hovered) = scene.hovered.and_then(|address| scene.layout.span_at(address))
                && hovered.address < end
                && hovered.end() > start
            {
                let (x0, x1) = (x_of(start, hovered.address.max(start)), x_of(start, hovered.end().min(end)));
                let outline = Rect::from_min_max(pos2(x0, top), pos2(x1.max(x0 + 1.0), bottom));
                out.push(Shape::rect_stroke(outline, 0.0, Stroke::new(1.5, palette::HOVER), StrokeKind::Inside));
            }
        }
        // The band's outline, around its rows (its edges out of view kept just out of view).
        if rows.row_height >= 6.0 {
            let band_top = band_top.max(rect.top() - 8.0);
            let bottom = (y_of(rows.row_top(band, band.rows)) - 1.0).min(rect.bottom() + 8.0);
            // A region of less than a row is outlined around itself, one of more across the map.
            let right =
                if band.shown_bytes < row_bytes { x_of(band.address, band.address + band.shown_bytes) } else { rect.right() };
            let outline = Rect::from_min_max(pos2(x_of(band.address, band.address), band_top), pos2(right, bottom));
            out.push(Shape::rect_stroke(outline, 2.0, Stroke::new(1.0, palette::REGION_EDGE), StrokeKind::Outside));
        }
    }
}

/// The mapped runs of `region` within `[start, end)`, clipped.
fn mapped_in(region: Option<&Region>, start: u64, end: u64) -> Vec<(u64, u64)> {
    let Some(region) = region else { return Vec::new() };
    let first = region.mapped.range(..start).next_back().filter(|(a, b)| *a + *b > start).map(|(a, _)| *a).unwrap_or(start);
    region
        .mapped
        .range(first..end)
        .map(|(&address, &bytes)| {
            let clipped_start = address.max(start);
            (clipped_start, (address + bytes).min(end) - clipped_start)
        })
        .collect()
}

/// What is under the pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hit {
    /// A live allocation.
    Allocation(Span),
    /// A free run `(address, bytes)`.
    Free(u64, u64),
    /// Address space of a virtual region with no page mapped.
    Unmapped(u64),
}

/// The region base and what lies at `address` of `layout`.
pub fn hit_at(layout: &Layout, address: u64) -> Option<(u64, Hit)> {
    let region = layout.region_of(address)?;
    let hit = if let Some(span) = layout.span_at(address) {
        Hit::Allocation(*span)
    } else if let Some(run) = layout.free_runs_in(address, address + 1).next() {
        Hit::Free(run.0, run.1)
    } else {
        Hit::Unmapped(address)
    };
    Some((region.address, hit))
}

/// What the map widget reports.
#[derive(Debug)]
pub struct MapResponse {
    /// The widget's response (tooltips attach here).
    pub response: egui::Response,
    /// The region base and what is under the pointer.
    pub hovered: Option<(u64, Hit)>,
    /// The rows as drawn.
    pub rows: Rows,
}

/// Shows the heap map of `scene` filling the space available, with zoom (ctrl + wheel, pinch), scroll
/// (wheel, drag) and double-click to fit; `view` keeps the zoom and scroll between frames.
pub fn show(ui: &mut Ui, scene: &Scene<'_>, view: &mut MapView) -> MapResponse {
    let size = ui.available_size().max(Vec2::new(64.0, ROW_HEIGHT * 2.0));
    let (rect, response) = ui.allocate_exact_size(size, Sense::click_and_drag());
    let fit = scene.scale.unwrap_or_else(|| Rows::fit(scene.layout, scene.timeline, rect.height()));
    let released = scene.animation.map_or(&[][..], |animation| &animation.released[..]);
    let mut rows = Rows::with_released(scene.layout, scene.timeline, view.scale.unwrap_or(fit), released);
    let pointer = response.hover_pos();
    if let Some(pos) = pointer {
        let (zoom, scroll_delta) = ui.input(|input| (input.zoom_delta(), input.smooth_scroll_delta.y));
        if zoom != 1.0 {
            let anchor = rows.address_at(pos - rect.min, view.scroll, rect.width());
            let scale = Scale { row_bytes: MapView::zoomed(rows.row_bytes, zoom, rows.widest_bytes()), ..rows.scale() };
            view.scale = Some(scale);
            rows = Rows::with_released(scene.layout, scene.timeline, scale, released);
            // Keep the address under the pointer where it was.
            if let Some(y) = anchor.and_then(|address| rows.y_of(address)) {
                view.scroll = y + f64::from(rows.row_height / 2.0 - (pos.y - rect.top()));
            }
        } else if scroll_delta != 0.0 {
            view.scroll -= f64::from(scroll_delta);
        }
    }
    if response.dragged() {
        view.scroll -= f64::from(response.drag_delta().y);
    }
    if response.double_clicked() {
        *view = MapView::default();
        rows = Rows::with_released(scene.layout, scene.timeline, fit, released);
    }
    view.scroll = view.scroll.clamp(0.0, (rows.height - f64::from(rect.height())).max(0.0));
    let hovered = pointer
        .and_then(|pos| rows.address_at(pos - rect.min, view.scroll, rect.width()))
        .and_then(|address| hit_at(scene.layout, address));
    let hovered_address = match hovered {
        Some((_, Hit::Allocation(span))) => Some(span.address),
        _ => scene.hovered,
    };
    let painter = ui.painter_at(rect);
    painter.rect_filled(rect, 0.0, palette::BACKGROUND);
    let mut shapes = Vec::new();
    build_shapes(&Scene { hovered: hovered_address, ..*scene }, &rows, rect, view.scroll, &mut shapes);
    painter.extend(shapes);
    MapResponse { response, hovered, rows }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egui::Pos2;
    use heapscope_lab::timeline::Change;

    fn timeline_of(changes: &[Change]) -> Timeline {
        timeline(changes)
    }

    fn timeline(changes: &[Change]) -> Timeline {
        let mut timeline = Timeline::new("test");
        for change in changes {
            timeline.push(std::slice::from_ref(change), None).unwrap();
        }
        timeline
    }

    fn block(address: u64, size_bytes: u64) -> Change {
        Change::RegionAdded { address, size_bytes, kind: RegionKind::Block }
    }

    fn span(address: u64, footprint_bytes: u64, requested_bytes: u64) -> Change {
        Change::Allocated(Span {
            address,
            footprint_bytes,
            lead_bytes: 0,
            requested_bytes,
            slot: 0,
            before_recording: false,
            born: 0,
        })
    }

    /// Regions of less than a row share rows in address order while they fit (a gap of 1/256 row between
    /// them); a region of a row or more, or one that does not fit, starts a line. Hovering finds each, and fitting
    /// counts shared rows once.
    #[test]
    fn small_regions_share_rows() {
        let timeline = timeline(&[block(0, 1024), block(2048, 256), block(4096, 256), block(8192, 600), block(16384, 2048)]);
        let rows = Rows::new(timeline.head(), &timeline, Scale::new(1024));
        // (address, top in rows and gaps, left bytes, rows)
        let line = |lines: f64, rows: f64| rows * f64::from(ROW_HEIGHT) + lines * f64::from(REGION_GAP);
        let shape: Vec<(u64, f64, u64, u64)> =
            rows.bands.iter().map(|band| (band.address, band.top, band.left_bytes, band.rows)).collect();
        assert_eq!(
            shape,
            [
                (0, 0.0, 0, 1),
                (2048, line(1.0, 1.0), 0, 1),
                (4096, line(1.0, 1.0), 256 + 4, 1),
                (8192, line(2.0, 2.0), 0, 1),
                (16384, line(3.0, 3.0), 0, 2),
            ]
        );
        assert_eq!(rows.height, line(3.0, 5.0));
        // (offset in a 1024-point-wide map, address): a point per byte.
        let second_line = line(1.0, 1.0) + 1.0;
        let cases = [
            (Vec2::new(10.0, second_line as f32), Some(2048 + 10)),
            (Vec2::new(258.0, second_line as f32), None), // between the two regions sharing the row
            (Vec2::new(270.0, second_line as f32), Some(4096 + 10)),
            (Vec2::new(600.0, second_line as f32), None), // past the second one
        ];
        for (offset, expected) in cases {
            assert_eq!(rows.address_at(offset, 0.0, 1024.0), expected, "{offset:?}");
        }
        assert_eq!(rows.y_of(4096 + 100), Some(line(1.0, 1.0)));
        // A hundred 2 KiB segments beside one of 64 KiB: fitted, they take a few shared rows, not a hundred.
        let mut changes = vec![block(0, 64 << 10)];
        changes.extend((0..100).map(|index| block((1 << 20) + index * 4096, 2048)));
        let many = timeline_of(&changes);
        let scale = Rows::fit(many.head(), &many, 400.0);
        let fitted = Rows::new(many.head(), &many, scale);
        assert!(fitted.height <= 400.0, "{} points", fitted.height);
        assert_eq!(scale.row_height, ROW_HEIGHT, "full-height rows: the small segments share them");
        let lines = fitted.bands.windows(2).filter(|pair| pair[1].top != pair[0].top).count() + 1;
        assert!(lines < 30, "{lines} lines for 101 regions");
    }

    #[test]
    fn rows_wrap_each_region_and_find_addresses() {
        let timeline = timeline(&[block(0, 1000), block(4096, 250)]);
        let rows = Rows::new(timeline.head(), &timeline, Scale::new(300));
        let shape: Vec<(u64, u64, f64)> = rows.bands.iter().map(|band| (band.address, band.rows, band.top)).collect();
        assert_eq!(shape, [(0, 4, 0.0), (4096, 1, f64::from(4.0 * ROW_HEIGHT + REGION_GAP))]);
        assert_eq!(rows.height, f64::from(5.0 * ROW_HEIGHT + REGION_GAP));
        // (offset in the map, address)
        let cases = [
            (Vec2::new(0.0, 0.0), Some(0)),
            (Vec2::new(50.0, 1.5 * ROW_HEIGHT), Some(450)),
            (Vec2::new(99.0, 3.5 * ROW_HEIGHT), None), // past the end of the 1000-byte block
            (Vec2::new(0.0, 4.0 * ROW_HEIGHT + 1.0), None), // in the gap
            (Vec2::new(10.0, 4.0 * ROW_HEIGHT + REGION_GAP + 1.0), Some(4096 + 30)),
        ];
        for (offset, address) in cases {
            assert_eq!(rows.address_at(offset, 0.0, 100.0), address, "{offset:?}");
            let scrolled = Vec2::new(offset.x, offset.y - ROW_HEIGHT);
            assert_eq!(rows.address_at(scrolled, f64::from(ROW_HEIGHT), 100.0), address, "{offset:?}, scrolled a row");
        }
        assert_eq!(rows.y_of(950), Some(f64::from(3.0 * ROW_HEIGHT)));
        assert_eq!(rows.y_of(2000), None);
    }

    #[test]
    fn fit_makes_everything_visible() {
        let timeline = timeline(&[block(0, 1 << 30), block(1 << 31, 20 << 20)]);
        for height in [40.0, 100.0, 1000.0] {
            let scale = Rows::fit(timeline.head(), &timeline, height);
            let rows = Rows::new(timeline.head(), &timeline, scale);
            assert!(rows.height <= f64::from(height), "height {height}: {rows:?}");
            // One byte less per row would not fit.
            let tighter = Rows::new(timeline.head(), &timeline, Scale { row_bytes: scale.row_bytes - 1, ..scale });
            assert!(scale.row_bytes == MIN_ROW_BYTES || tighter.height > f64::from(height), "height {height}");
        }
        // Forty regions in 100 points: thinner rows, one per region.
        let many: Vec<Change> = (0..40).map(|index| block(index << 30, 20 << 20)).collect();
        let timeline = timeline_of(&many);
        let scale = Rows::fit(timeline.head(), &timeline, 100.0);
        assert_eq!((scale.row_height, scale.gap, scale.row_bytes), (MIN_ROW_HEIGHT, 1.0, 20 << 20));
        assert!(Rows::new(timeline.head(), &timeline, scale).height > 100.0, "past the least height the map scrolls");
    }

    #[test]
    fn shapes_show_spans_waste_and_too_small_runs() {
        let timeline = timeline(&[block(0, 1000), span(0, 500, 250), span(600, 100, 100)]);
        let scene = Scene {
            layout: timeline.head(),
            timeline: &timeline,
            position: timeline.steps(),
            colour_by: ColourBy::SizeClass,
            slots: &[],
            hues: &palette::GroupHues::default(),
            scale: None,
            animation: None,
            too_small_below: Some(200),
            hovered: None,
        };
        let rows = Rows::new(timeline.head(), &timeline, Scale::new(1000));
        let rect = Rect::from_min_size(Pos2::ZERO, Vec2::new(1000.0, 100.0));
        let mut shapes = Vec::new();
        build_shapes(&scene, &rows, rect, 0.0, &mut shapes);
        let fills: Vec<(f32, f32, Color32)> = shapes
            .iter()
            .filter_map(|shape| match shape {
                Shape::Rect(rect) if rect.fill != Color32::TRANSPARENT => Some((rect.rect.left(), rect.rect.right(), rect.fill)),
                _ => None,
            })
            .collect();
        let red = palette::FREE_TOO_SMALL;
        let colour = palette::size_class(250);
        assert!(fills.contains(&(0.0, 1000.0, palette::FREE)), "the block's free background: {fills:?}");
        assert!(fills.contains(&(500.0, 600.0, red)), "the 100-byte run is too small: {fills:?}");
        assert!(fills.contains(&(700.0, 1000.0, palette::FREE)) || !fills.contains(&(700.0, 1000.0, red)), "300 bytes fit");
        assert!(fills.contains(&(0.0, 500.0, palette::waste(colour))), "the footprint, shaded: {fills:?}");
        assert!(fills.contains(&(0.0, 250.0, colour)), "the requested bytes: {fills:?}");
    }

    #[test]
    fn sub_pixel_spans_merge() {
        let mut changes = vec![block(0, 1 << 20)];
        changes.extend((0..1000).map(|index| span(index * 1024, 1024, 1024)));
        let timeline = timeline(&changes);
        let scene = Scene {
            layout: timeline.head(),
            timeline: &timeline,
            position: 0,
            colour_by: ColourBy::Age,
            slots: &[],
            hues: &palette::GroupHues::default(),
            scale: None,
            animation: None,
            too_small_below: None,
            hovered: None,
        };
        let rows = Rows::new(timeline.head(), &timeline, Scale::new(1 << 20));
        let mut shapes = Vec::new();
        build_shapes(&scene, &rows, Rect::from_min_size(Pos2::ZERO, Vec2::new(100.0, 40.0)), 0.0, &mut shapes);
        assert!(shapes.len() < 120, "1000 allocations over 100 pixels: {} shapes", shapes.len());
    }

    /// 40 GiB at 64 B per row is 10^10 points tall: scrolled to its end, each of the last rows is where it
    /// belongs, the pointer finds the allocation drawn under it, and a 2-point wheel step moves the rows by 2.
    #[test]
    fn deep_zoom_into_a_big_heap_keeps_rows_apart() {
        const HEAP: u64 = 40 << 30;
        let timeline = timeline(&[block(0, HEAP), span(HEAP - 128, 64, 64), span(HEAP - 64, 64, 48)]);
        let layout = timeline.head();
        let scene = Scene {
            layout,
            timeline: &timeline,
            position: timeline.steps(),
            colour_by: ColourBy::SizeClass,
            slots: &[],
            hues: &palette::GroupHues::default(),
            scale: None,
            animation: None,
            too_small_below: None,
            hovered: None,
        };
        let rows = Rows::new(layout, &timeline, Scale::new(MIN_ROW_BYTES));
        let rect = Rect::from_min_size(Pos2::ZERO, Vec2::new(100.0, 100.0));
        let end = rows.height - f64::from(rect.height());
        assert!(end > 1e10, "{end}");
        // (pointer y in the view, the allocation under it): the last row, the one above, two above.
        let cases = [(92.0, Some(HEAP - 64)), (76.0, Some(HEAP - 128)), (60.0, None)];
        for (y, expected) in cases {
            let address = rows.address_at(Vec2::new(50.0, y), end, rect.width()).unwrap();
            let under = match hit_at(layout, address) {
                Some((0, Hit::Allocation(span))) => Some(span.address),
                Some((0, Hit::Free(..))) => None,
                other => panic!("y {y}: {other:?}"),
            };
            assert_eq!(under, expected, "y {y}: address {address:#x}");
        }
        // The tops of the last allocation's requested bytes (its own colour), at the end and 2 points up.
        let top_of_last = |scroll: f64| {
            let mut shapes = Vec::new();
            build_shapes(&scene, &rows, rect, scroll, &mut shapes);
            let colour = palette::size_class(48);
            let tops: Vec<f32> = shapes
                .iter()
                .filter_map(|shape| match shape {
                    Shape::Rect(rect) if rect.fill == colour => Some(rect.rect.top()),
                    _ => None,
                })
                .collect();
            assert_eq!(tops.len(), 1, "scroll {scroll}: {tops:?}");
            tops[0]
        };
        assert_eq!(top_of_last(end), 100.0 - ROW_HEIGHT, "the last row ends at the bottom");
        assert_eq!(top_of_last(end - 2.0), 102.0 - ROW_HEIGHT, "a 2-point wheel step moves the rows");
    }

    /// Halfway through a step, pages it mapped are half faded in; a region it released and pages it unmapped
    /// are half faded out, in place.
    #[test]
    fn released_regions_and_pages_fade_during_their_step() {
        let mut timeline = timeline(&[
            block(0, 1000),
            Change::RegionAdded { address: 4096, size_bytes: 4 * 4096, kind: RegionKind::Virtual },
            Change::PagesMapped { address: 4096, size_bytes: 2 * 4096 },
        ]);
        timeline
            .push(&[Change::RegionRemoved { address: 0 }, Change::PagesUnmapped { address: 8192, size_bytes: 4096 }], None)
            .unwrap();
        let half = |alpha: Color32| palette::faded(alpha, 0.5);
        let (free, mapped) = (palette::FREE, palette::MAPPED);
        // 8 bytes a point: the block's row is 125 points long, the virtual range's 8 KiB shown 1024, 21 points down.
        let band_top = ROW_HEIGHT + REGION_GAP;
        // (step, fills expected as (left, right, top, colour), fills not expected)
        type Fill = (f32, f32, f32, Color32);
        let cases: [(u64, &[Fill], &[Fill]); 2] = [
            (
                2,
                &[(0.0, 125.0, 0.0, free), (0.0, 1024.0, band_top, half(free)), (0.0, 1024.0, band_top, half(mapped))],
                &[(0.0, 1024.0, band_top, free)],
            ),
            (
                3,
                &[
                    (0.0, 125.0, 0.0, half(free)),
                    (0.0, 512.0, band_top, free),
                    (0.0, 512.0, band_top, mapped),
                    (512.0, 1024.0, band_top, half(free)),
                    (512.0, 1024.0, band_top, half(mapped)),
                ],
                &[(0.0, 125.0, 0.0, free), (512.0, 1024.0, band_top, free)],
            ),
        ];
        for (step, expected, unexpected) in cases {
            let before = timeline.layout_at(step);
            let layout = timeline.layout_at(step + 1);
            let animation = crate::panes::step_animation(&timeline, &before, step, 0.5);
            let scene = Scene {
                layout: &layout,
                timeline: &timeline,
                position: step + 1,
                colour_by: ColourBy::SizeClass,
                slots: &[],
                hues: &palette::GroupHues::default(),
                scale: None,
                animation: Some(&animation),
                too_small_below: None,
                hovered: None,
            };
            let rows = Rows::with_released(&layout, &timeline, Scale::new(8192), &animation.released);
            assert_eq!(
                rows.bands.iter().map(|band| (band.address, band.released)).collect::<Vec<_>>(),
                [(0, step == 3), (4096, false)]
            );
            let mut shapes = Vec::new();
            build_shapes(&scene, &rows, Rect::from_min_size(Pos2::ZERO, Vec2::new(1024.0, 100.0)), 0.0, &mut shapes);
            let fills: Vec<Fill> = shapes
                .iter()
                .filter_map(|shape| match shape {
                    Shape::Rect(rect) if rect.fill != Color32::TRANSPARENT => {
                        Some((rect.rect.left(), rect.rect.right(), rect.rect.top(), rect.fill))
                    }
                    _ => None,
                })
                .collect();
            for fill in expected {
                assert!(fills.contains(fill), "step {step}: {fill:?} in {fills:?}");
            }
            for fill in unexpected {
                assert!(!fills.contains(fill), "step {step}: no {fill:?} in {fills:?}");
            }
        }
    }

    #[test]
    fn hits_name_what_is_under_the_pointer() {
        let mut timeline = timeline(&[block(0, 1000), span(100, 50, 50)]);
        timeline.push(&[Change::RegionAdded { address: 4096, size_bytes: 4096, kind: RegionKind::Virtual }], None).unwrap();
        let layout = timeline.head();
        assert!(matches!(hit_at(layout, 120), Some((0, Hit::Allocation(span))) if span.address == 100));
        assert_eq!(hit_at(layout, 10), Some((0, Hit::Free(0, 100))));
        assert_eq!(hit_at(layout, 5000), Some((4096, Hit::Unmapped(5000))));
        assert_eq!(hit_at(layout, 2000), None);
    }
}
