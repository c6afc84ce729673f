//! The timeline plot (egui_plot): reserved (solid) and live (dashed) bytes of every pane in the pane's colour,
//! in the unit the data needs (B to EiB, labelled ticks at 1, 2 or 5 times a power of ten whatever the
//! magnitude), fragmentation below (defined in the legend row), markers where a request was refused,
//! and the current position; clicking or dragging on it seeks. The legend (pane names in their colours) is a
//! row above the plot, so that it covers no data and a click on it does not seek. Every series starts at
//! step 0 with nothing, so a one-event trace still draws a line.

use egui::{Color32, Ui};
use egui_plot::{Line, LineStyle, MarkerShape, Plot, PlotPoints, PlotUi, Points, VLine};
use heapscope_lab::timeline::Timeline;

/// Points per series at most: long timelines are reduced to the highest value per bucket of steps.
pub const MAX_POINTS: usize = 2000;

/// A timeline's series, reduced for drawing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// Steps the series was built from.
    pub steps: u64,
    /// `[step, bytes]` live.
    pub live: Vec<[f64; 2]>,
    /// `[step, bytes]` reserved.
    pub reserved: Vec<[f64; 2]>,
    /// `[step, 0..1]` of fragmentation.
    pub fragmentation: Vec<[f64; 2]>,
    /// `[step, 0..1]` of internal waste (padding inside live allocations, as a share of reserved).
    pub waste: Vec<[f64; 2]>,
    /// `[step, bytes reserved]` where a request was refused.
    pub refusals: Vec<[f64; 2]>,
}

/// The unit to draw `max_bytes` in: its name and its size in bytes (the largest of B, KiB, MiB, GiB, TiB, PiB and EiB that
/// `max_bytes` reaches, so that the axis has more than a "0" tick).
pub fn byte_unit(max_bytes: f64) -> (&'static str, f64) {
    const UNITS: [(&str, f64); 7] = [
        ("EiB", 1_152_921_504_606_846_976.0),
        ("PiB", 1_125_899_906_842_624.0),
        ("TiB", 1_099_511_627_776.0),
        ("GiB", 1_073_741_824.0),
        ("MiB", 1_048_576.0),
        ("KiB", 1024.0),
        ("B", 1.0),
    ];
    UNITS.into_iter().find(|&(_, size)| max_bytes >= size).unwrap_or(UNITS[6])
}

/// egui_plot's smallest grid spacing (`Plot::grid_spacing`'s default minimum), in points.
const GRID_SPACING_POINTS: f32 = 8.0;

/// How far apart labelled ticks of the bytes axis are at least, in points: where egui_plot draws a y-axis label at
/// full strength (its `label_spacing`, 20 to 30 points).
const LABEL_SPACING_POINTS: f32 = 30.0;

/// The width of both plots' y axes, so that their x axes line up whatever their labels (points).
const Y_AXIS_WIDTH_POINTS: f32 = 44.0;

/// The smallest of 1, 2 and 5 times a power of ten that is at least `value` (positive).
pub(crate) fn nice_step(value: f64) -> f64 {
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|factor| factor * power)
        .find(|&step| step >= value * (1.0 - 1e-9))
        .unwrap_or(10.0 * power)
}

/// Grid steps for the bytes axis: fine lines at the plot's smallest step, and labelled ones (1, 2 or 5 times a power
/// of ten) dividing the visible range into at most four, so that a few ticks carry numbers whatever the magnitude
/// (with powers of ten alone, 58 GiB on a short plot left only the "0" tick labelled), and at least
/// [`LABEL_SPACING_POINTS`] apart: egui_plot fades a label out below that and drops it below two thirds of it (a
/// plot 80 points high over 18 GiB showed none).
fn labelled_steps(input: &egui_plot::GridInput) -> [f64; 3] {
    let span = (input.bounds.1 - input.bounds.0).abs();
    let fine = nice_step(input.base_step_size.max(f64::MIN_POSITIVE));
    // `base_step_size` is the value of egui_plot's smallest grid spacing, `GRID_SPACING_POINTS`.
    let readable = input.base_step_size * f64::from(LABEL_SPACING_POINTS / GRID_SPACING_POINTS);
    let labelled = nice_step((span / 4.0).max(fine).max(readable));
    let middle = nice_step((labelled / 2.0).max(fine));
    [fine, middle.max(fine), labelled]
}

/// Grid steps for an axis of whole things (entries, bytes counted in B): as [`labelled_steps`], never finer than one.
fn whole_steps(input: &egui_plot::GridInput) -> [f64; 3] {
    labelled_steps(&egui_plot::GridInput { bounds: input.bounds, base_step_size: input.base_step_size.max(1.0) })
}

/// An entries-axis tick: the entry, or `start` where the axis begins, before entry 0 ([`x_of`]).
fn entry_label(value: f64) -> String {
    if value < -0.5 { "start".to_owned() } else { format!("{value:.0}") }
}

/// A tick's number with as many decimals as its step needs (`0.5`, `1.5`; `20` for whole steps), so that ticks
/// half a unit apart do not both read `1`.
fn tick_label(value: f64, step: f64) -> String {
    let decimals = if step >= 1.0 { 0 } else { (-step.log10()).ceil().clamp(0.0, 6.0) as usize };
    format!("{value:.decimals$}")
}

/// `points` with y divided by `unit`.
fn scaled(points: &[[f64; 2]], unit: f64) -> PlotPoints<'static> {
    PlotPoints::from(points.iter().map(|&[x, y]| [x, y / unit]).collect::<Vec<_>>())
}

impl Series {
    /// The series of `timeline`, at most [`MAX_POINTS`] points each (the maximum of each bucket, so peaks
    /// survive the reduction). The x axis counts entries, the recording's one numbering: the totals once entry
    /// `N` is done are drawn at x = N, the start (what was live before entry 0) at x = -1 ([`x_of`]). A step that held
    /// more inside it than at its start and end (a request served and returned within its entry) is drawn at its
    /// most, as `replay`'s peaks count it.
    pub fn of(timeline: &Timeline) -> Self {
        let samples = timeline.samples();
        let bucket = samples.len().div_ceil(MAX_POINTS).max(1);
        let start = timeline.start_sample();
        let mut series = Series {
            steps: timeline.steps(),
            live: vec![[x_of(0), start.live_bytes as f64]],
            reserved: vec![[x_of(0), start.reserved_bytes as f64]],
            fragmentation: vec![[x_of(0), f64::from(start.fragmentation)]],
            waste: vec![[x_of(0), f64::from(start.waste)]],
            refusals: Vec::new(),
        };
        let mut transients = timeline.transients().iter().peekable();
        for (index, chunk) in samples.chunks(bucket).enumerate() {
            let last = (index * bucket + chunk.len()) as u64;
            let x = x_of(last.min(samples.len() as u64));
            let max = |value: &dyn Fn(&heapscope_lab::timeline::Sample) -> f64| chunk.iter().map(value).fold(0.0, f64::max);
            // The transients of this bucket's steps (positions `index * bucket + 1` to `last`).
            let (mut live, mut reserved) = (0.0, 0.0);
            while let Some((_, transient)) = transients.next_if(|&&(position, _)| position <= last) {
                (live, reserved) =
                    (f64::max(live, transient.live_bytes as f64), f64::max(reserved, transient.reserved_bytes as f64));
            }
            series.live.push([x, max(&|sample| sample.live_bytes as f64).max(live)]);
            series.reserved.push([x, max(&|sample| sample.reserved_bytes as f64).max(reserved)]);
            series.fragmentation.push([x, max(&|sample| f64::from(sample.fragmentation))]);
            series.waste.push([x, max(&|sample| f64::from(sample.waste))]);
        }
        series.refusals =
            timeline.refusals().iter().map(|(step, refusal)| [*step as f64, refusal.reserved_bytes as f64]).collect();
        series
    }
}

/// Where position `position` (steps played: 0 is the start, `N + 1` is once entry `N` is done) is drawn along x,
/// which counts entries.
pub fn x_of(position: u64) -> f64 {
    position as f64 - 1.0
}

/// The position nearest to `x`, within `steps`.
fn position_at(x: f64, steps: u64) -> u64 {
    (x + 1.0).round().clamp(0.0, steps as f64) as u64
}

/// Each contender's own colour, in every picture whatever pane it is in (`pytorch` orange, `paged` pink, ...); a
/// name made of a contender's and more (an advice row's setting) takes the contender's. None is red (refusals) or
/// grey (free space).
const CONTENDER_COLOURS: [(&str, Color32); 11] = [
    ("pytorch-expandable", Color32::from_rgb(78, 161, 207)),
    ("pytorch", Color32::from_rgb(242, 142, 43)),
    ("tlsf", Color32::from_rgb(118, 203, 98)),
    ("paged", Color32::from_rgb(206, 122, 191)),
    ("best-fit", Color32::from_rgb(237, 201, 72)),
    ("first-fit", Color32::from_rgb(64, 196, 186)),
    ("buddy", Color32::from_rgb(160, 110, 230)),
    ("slab", Color32::from_rgb(196, 140, 98)),
    ("linear", Color32::from_rgb(160, 203, 242)),
    ("vma", Color32::from_rgb(255, 170, 200)),
    ("gpu-allocator", Color32::from_rgb(150, 150, 255)),
];

/// The width of pane `index`'s reserved line: the first pane's widest (3 points), each next one three quarters of a
/// point thinner, drawn in order, so lines that coincide nest instead of hiding each other.
pub fn line_width(index: usize) -> f32 {
    (3.0 - 0.75 * index as f32).max(0.75)
}

/// The colour of each of the panes named `names`, in order: its contender's own (a fixed table), the contender named
/// first in the pane's name (`pytorch (max_split_size_mb:128)`, a live run's `live serve · tlsf · 112 MiB`); where two
/// panes would share one (the same contender twice, a name heapscope does not know), the later takes the first colour
/// no pane has.
pub fn pane_colours<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<Color32> {
    let mut colours: Vec<Color32> = Vec::new();
    for name in names {
        let words = name.split(|c: char| c.is_whitespace() || matches!(c, '·' | '(' | ')' | ','));
        let own = words
            .filter_map(|word| CONTENDER_COLOURS.iter().find(|(contender, _)| word == *contender))
            .map(|&(_, colour)| colour)
            .next();
        let free = CONTENDER_COLOURS.iter().map(|&(_, colour)| colour).find(|colour| !colours.contains(colour));
        let colour = match own {
            Some(colour) if !colours.contains(&colour) => colour,
            _ => free.unwrap_or(CONTENDER_COLOURS[colours.len() % CONTENDER_COLOURS.len()].1),
        };
        colours.push(colour);
    }
    colours
}

/// Where the pointer is along a plot's step axis. Not egui_plot's `pointer_coordinate`: that subtracts the
/// frame's drag delta, for a plot that pans with the drag, so on these plots (which never pan) a drag seeked to
/// where the pointer was a frame before, and a drag ended one move short.
fn pointer_step(plot: &PlotUi<'_>) -> Option<f64> {
    let pos = plot.ctx().input(|input| input.pointer.latest_pos())?;
    Some(plot.plot_from_screen(pos).x)
}

/// Shows the plots of `series` (one per pane, with its name) at `position` steps; returns the step to
/// seek to when the user clicked or dragged on them.
pub fn show(ui: &mut Ui, series: &[(&str, &Series)], position: f64, height: f32) -> Option<u64> {
    let steps = series.iter().map(|(_, series)| series.steps).max().unwrap_or(0);
    let max_bytes = series
        .iter()
        .flat_map(|(_, series)| series.reserved.iter().chain(&series.live))
        .map(|point| point[1])
        .fold(0.0, f64::max);
    let (unit_name, unit) = byte_unit(max_bytes);
    // One label (names in their colours), so that the pane names stay unique widgets of the headers.
    let mut legend = egui::text::LayoutJob::default();
    let font = egui::TextStyle::Small.resolve(ui.style());
    let colours = pane_colours(series.iter().map(|(name, _)| *name));
    for ((name, _), &colour) in series.iter().zip(&colours) {
        legend.append(&format!("{name}   "), 0.0, egui::TextFormat::simple(font.clone(), colour));
    }
    let weak = ui.visuals().weak_text_color();
    legend.append(
        "(solid: reserved, dashed: live, red cross: refused; below, solid: frag., the share of free bytes outside the \
         largest free run — waste between allocations; dotted: waste, the share of reserved bytes that is padding inside \
         allocations; 0 none to 1 all)",
        0.0,
        egui::TextFormat::simple(font, weak),
    );
    ui.label(legend);
    let link = ui.scope_id().with("timeline");
    let mut seek = None;
    let mut seek_from = |response: &egui::Response, x: Option<f64>| {
        if (response.clicked() || response.dragged())
            && let Some(x) = x
        {
            seek = Some(position_at(x, steps));
        }
    };
    let bytes = Plot::new("bytes")
        .height(height * 0.65)
        .allow_drag(false)
        .allow_zoom(false)
        .allow_scroll(false)
        .allow_boxed_zoom(false)
        .include_y(0.0)
        // Nothing reserved at all (an empty recording): bytes from 0 up, not a range centred on 0.
        .include_y(if max_bytes > 0.0 { 0.0 } else { 1.0 })
        .include_x(x_of(0))
        .include_x(x_of(steps.max(1)))
        .x_grid_spacer(egui_plot::uniform_grid_spacer(|input| whole_steps(&input)))
        .x_axis_formatter(|mark, _| entry_label(mark.value))
        .link_axis(link, [true, false])
        .y_grid_spacer(egui_plot::uniform_grid_spacer(
            move |input| {
                if unit > 1.0 { labelled_steps(&input) } else { whole_steps(&input) }
            },
        ))
        .y_axis_min_width(Y_AXIS_WIDTH_POINTS)
        .y_axis_formatter(|mark, _| tick_label(mark.value, mark.step_size))
        .y_axis_label(unit_name)
        .show(ui, |plot| {
            for (index, ((name, series), &colour)) in series.iter().zip(&colours).enumerate() {
                // Each pane's line thinner than the one before, drawn over it: where two panes reserve the same, both
                // colours show.
                let width = line_width(index);
                plot.line(Line::new(format!("{name} reserved"), scaled(&series.reserved, unit)).color(colour).width(width));
                plot.line(
                    Line::new(format!("{name} live"), scaled(&series.live, unit))
                        .color(colour)
                        .width(1.0)
                        .style(LineStyle::dashed_dense()),
                );
                if !series.refusals.is_empty() {
                    plot.points(
                        Points::new(format!("{name} OOM"), scaled(&series.refusals, unit))
                            .shape(MarkerShape::Cross)
                            .radius(6.0)
                            .color(Color32::from_rgb(230, 60, 60)),
                    );
                }
            }
            plot.vline(VLine::new("", position - 1.0).color(Color32::WHITE).width(1.0));
            pointer_step(plot)
        });
    seek_from(&bytes.response, bytes.inner);
    let fragmentation = Plot::new("fragmentation")
        .height(height * 0.35)
        .allow_drag(false)
        .allow_zoom(false)
        .allow_scroll(false)
        .allow_boxed_zoom(false)
        .include_y(0.0)
        .include_y(1.0)
        .include_x(x_of(0))
        .include_x(x_of(steps.max(1)))
        .x_grid_spacer(egui_plot::uniform_grid_spacer(|input| whole_steps(&input)))
        .x_axis_formatter(|mark, _| entry_label(mark.value))
        .link_axis(link, [true, false])
        .x_axis_label("entry")
        .y_axis_min_width(Y_AXIS_WIDTH_POINTS)
        .y_axis_label("frag. / waste")
        .show(ui, |plot| {
            for ((name, series), &colour) in series.iter().zip(&colours) {
                plot.line(
                    Line::new(format!("{name} fragmentation"), PlotPoints::from(series.fragmentation.clone())).color(colour),
                );
                plot.line(
                    Line::new(format!("{name} waste"), PlotPoints::from(series.waste.clone()))
                        .color(colour)
                        .style(LineStyle::dotted_dense()),
                );
            }
            plot.vline(VLine::new("", position - 1.0).color(Color32::WHITE).width(1.0));
            pointer_step(plot)
        });
    seek_from(&fragmentation.response, fragmentation.inner);
    seek
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_lab::timeline::{Change, Refusal, RegionKind, Span};

    #[test]
    fn labelled_steps_divide_any_magnitude_into_a_few_ticks() {
        for (value, step) in [(1.0, 1.0), (1.1, 2.0), (3.0, 5.0), (7.0, 10.0), (15.0, 20.0), (0.03, 0.05), (250.0, 500.0)] {
            assert!((nice_step(value) - step).abs() < 1e-12, "{value}: {}", nice_step(value));
        }
        // (range shown in GiB, the labelled step): 58 and 78 GiB get ticks every 20, 13 GiB every 5.
        // (range shown in GiB, the plot's height in points, the labelled step)
        let cases = [(60.9, 1600.0, 20.0), (81.9, 1600.0, 50.0), (13.7, 1600.0, 5.0), (0.9, 1600.0, 0.5), (3.5, 1600.0, 1.0)];
        // A short plot: labels at least 30 points apart, where egui_plot draws them (80 points over 18.6 GiB: 5 GiB
        // is 21 points, faded to nothing; 10 GiB is 43).
        let short = [(18.6, 80.0, 10.0), (3.5, 80.0, 2.0), (3.5, 200.0, 1.0)];
        for (top, height, labelled) in cases.into_iter().chain(short) {
            let base_step_size = top / height * f64::from(GRID_SPACING_POINTS);
            let steps = labelled_steps(&egui_plot::GridInput { bounds: (0.0, top), base_step_size });
            assert!((steps[2] - labelled).abs() < 1e-12, "{top} over {height}: {steps:?}");
            assert!(steps[0] <= steps[1] && steps[1] <= steps[2], "{steps:?}");
            assert!(top / steps[2] >= 1.0 && top / steps[2] <= 4.0 + 1e-9, "{top}: between 1 and 4 labelled ticks");
            let points_apart = steps[2] / top * height;
            assert!(points_apart >= f64::from(LABEL_SPACING_POINTS) - 1e-9, "{top} over {height}: {points_apart} points apart");
        }
    }

    /// A contender keeps its colour whatever pane it is in; the same contender twice, or an unknown name, gets a colour
    /// no other pane has.
    #[test]
    fn each_contender_has_its_own_colour() {
        let one = pane_colours(["pytorch", "best-fit", "buddy", "paged"]);
        let other = pane_colours(["buddy", "paged", "pytorch"]);
        assert_eq!((one[0], one[2], one[3]), (other[2], other[0], other[1]));
        assert_ne!(pane_colours(["pytorch-expandable"])[0], pane_colours(["pytorch"])[0]);
        assert_eq!(pane_colours(["pytorch (max_split_size_mb:256)"])[0], pane_colours(["pytorch"])[0], "a setting's pane");
        // A live run's pane is named by its workload first: its contender's colour all the same.
        assert_eq!(pane_colours(["live serve · tlsf · 112 MiB"])[0], pane_colours(["tlsf"])[0]);
        assert_eq!(pane_colours(["live train · pytorch-expandable · 1 GiB"])[0], pane_colours(["pytorch-expandable"])[0]);
        let twice = pane_colours(["tlsf", "tlsf", "mystery"]);
        assert!(twice[0] != twice[1] && twice[1] != twice[2] && twice[0] != twice[2], "{twice:?}");
    }

    /// Four panes' lines all differ in width, the first widest: drawn in order, each shows inside the one before.
    #[test]
    fn reserved_lines_nest() {
        let widths: Vec<f32> = (0..4).map(line_width).collect();
        assert_eq!(widths, [3.0, 2.25, 1.5, 0.75]);
    }

    #[test]
    fn tick_labels_have_the_decimals_their_step_needs() {
        for (value, step, label) in
            [(1.5, 0.5, "1.5"), (20.0, 20.0, "20"), (0.25, 0.05, "0.25"), (2.0, 0.5, "2.0"), (0.0, 1.0, "0")]
        {
            assert_eq!(tick_label(value, step), label, "{value} by {step}");
        }
    }

    #[test]
    fn long_timelines_are_reduced_keeping_peaks() {
        let mut timeline = Timeline::new("t");
        timeline.push(&[Change::RegionAdded { address: 0, size_bytes: 1 << 40, kind: RegionKind::Block }], None).unwrap();
        for step in 1..10_000u64 {
            let change = if step % 2 == 1 {
                let size = if step == 5001 { 1 << 30 } else { 1 << 20 };
                Change::Allocated(Span {
                    address: 0,
                    footprint_bytes: size,
                    lead_bytes: 0,
                    requested_bytes: size,
                    slot: 0,
                    before_recording: false,
                    born: step,
                })
            } else {
                Change::Freed { address: 0 }
            };
            timeline.push(&[change], None).unwrap();
        }
        let refusal = Refusal {
            requested_bytes: 1,
            needed_bytes: 1,
            cause: heapscope_core::OomCause::Exhaustion,
            reserved_bytes: 1 << 30,
            free_bytes: 0,
            largest_free_bytes: 0,
            unusable_free_bytes: 0,
            waste_bytes: 0,
            unreserved_bytes: None,
            message: String::new(),
        };
        timeline.push(&[], Some(refusal)).unwrap();
        let series = Series::of(&timeline);
        assert!(series.live.len() <= MAX_POINTS + 1, "{}", series.live.len());
        assert_eq!(series.live.first(), Some(&[-1.0, 0.0]), "the start, before entry 0");
        let gib = f64::from(1u32 << 30);
        assert_eq!(series.live.iter().map(|point| point[1]).fold(0.0, f64::max), gib, "the 1 GiB peak survives");
        assert_eq!(series.live.last().map(|point| point[0]), Some(10_000.0), "the last entry");
        assert_eq!(series.refusals, [[10_000.0, gib]], "the refusal at its entry");
        assert_eq!(series.steps, 10_001);
    }

    #[test]
    fn one_entry_draws_a_line_from_the_start() {
        let mut timeline = Timeline::new("t");
        timeline.push(&[Change::RegionAdded { address: 0, size_bytes: 64 << 20, kind: RegionKind::Block }], None).unwrap();
        let series = Series::of(&timeline);
        assert_eq!(series.reserved, [[-1.0, 0.0], [0.0, f64::from(64u32 << 20)]]);
        assert_eq!(series.live, [[-1.0, 0.0], [0.0, 0.0]]);
    }

    #[test]
    fn a_start_state_is_drawn_before_entry_0() {
        let mut timeline = Timeline::new("t");
        let region = Change::RegionAdded { address: 0, size_bytes: 64 << 20, kind: RegionKind::Block };
        let span = Span::before_recording(0, 1 << 20, 1000, 0);
        timeline.start(&[region, Change::Allocated(span)]).unwrap();
        timeline.push(&[], None).unwrap();
        let series = Series::of(&timeline);
        assert_eq!(series.live, [[-1.0, 1000.0], [0.0, 1000.0]]);
        // (x, position): the start, entry 0, and beyond the end.
        for (x, position) in [(-1.0, 0), (0.0, 1), (5.0, 1), (-3.0, 0)] {
            assert_eq!(position_at(x, timeline.steps()), position, "x {x}");
        }
    }

    #[test]
    fn the_entries_axis_is_whole_entries_from_the_start() {
        // (shown range, egui_plot's finest step): never a step below one entry, even over one entry.
        for (bounds, base_step_size) in [((-1.0, 0.0), 0.01), ((-1.0, 140.0), 0.9), ((-1.0, 20_000.0), 37.0)] {
            let steps = whole_steps(&egui_plot::GridInput { bounds, base_step_size });
            assert!(steps.iter().all(|&step| step >= 1.0 && step.fract() == 0.0), "{bounds:?}: {steps:?}");
        }
        let labels: Vec<String> = [-1.0, 0.0, 1.0, 140.0].into_iter().map(entry_label).collect();
        assert_eq!(labels, ["start", "0", "1", "140"]);
    }

    #[test]
    fn the_unit_follows_the_data() {
        for (max_bytes, unit) in [
            (0.0, "B"),
            (1000.0, "B"),
            (4096.0, "KiB"),
            (f64::from(64u32 << 20), "MiB"),
            (f64::from(3u32 << 30), "GiB"),
            (2e12, "TiB"),
            (2e15, "PiB"),
            (2e18, "EiB"),
            (u64::MAX as f64, "EiB"),
        ] {
            assert_eq!(byte_unit(max_bytes).0, unit, "{max_bytes}");
        }
        assert_eq!(byte_unit(f64::from(64u32 << 20)).1, 1_048_576.0);
    }
}
