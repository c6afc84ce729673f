//! Colours of the heap map: what each kind of byte looks like, the three ways to colour allocations, and their
//! [`legend`]. Red is reserved for free runs too small for a refused request and grey for free space: no
//! allocation colour comes near either (a unit test holds every class, group and age to it).

use std::collections::HashMap;

use egui::Color32;

/// How allocations are coloured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ColourBy {
    /// By power-of-two size class of the requested bytes.
    #[default]
    SizeClass,
    /// By age: bright when just allocated, dark when old.
    Age,
    /// By the stack frames that allocated it (PyTorch snapshots record them).
    StackGroup,
    /// By the category its entry was labelled with (`user_metadata`, `compile_context`, the profiler's `category`).
    Category,
}

impl ColourBy {
    /// Every mode, in menu order.
    pub const ALL: [ColourBy; 4] = [ColourBy::SizeClass, ColourBy::Age, ColourBy::StackGroup, ColourBy::Category];

    /// The name in menus.
    pub fn name(self) -> &'static str {
        match self {
            ColourBy::SizeClass => "size class",
            ColourBy::Age => "age",
            ColourBy::StackGroup => "stack frames",
            ColourBy::Category => "category",
        }
    }

    /// Whether it colours by a group per allocation (a stack or a category: [`GroupHues`]).
    pub fn by_group(self) -> bool {
        matches!(self, ColourBy::StackGroup | ColourBy::Category)
    }
}

/// Background of the map.
pub const BACKGROUND: Color32 = Color32::from_rgb(24, 26, 30);
/// Free bytes in reserved memory.
pub const FREE: Color32 = Color32::from_rgb(58, 64, 72);
/// Free runs too small for the request that failed.
pub const FREE_TOO_SMALL: Color32 = Color32::from_rgb(196, 48, 48);
/// Address space of a virtual region with no page mapped.
pub const UNMAPPED: Color32 = Color32::from_rgb(34, 36, 41);
/// Mapped (resident) pages, a strip along the top of a virtual region's rows.
pub const MAPPED: Color32 = Color32::from_rgb(90, 170, 120);
/// The outline of a region.
pub const REGION_EDGE: Color32 = Color32::from_rgb(120, 126, 136);
/// The outline of the hovered allocation.
pub const HOVER: Color32 = Color32::WHITE;

/// Twelve distinct hues, for classes and groups: no red (red means "too small" on the map) and no grey (grey is
/// free space), at least 100 apart (RGB) from both; neighbours alternate across the colour wheel, so that
/// adjacent size classes contrast.
const HUES: [Color32; 12] = [
    Color32::from_rgb(242, 167, 92),
    Color32::from_rgb(92, 242, 230),
    Color32::from_rgb(204, 183, 78),
    Color32::from_rgb(78, 162, 204),
    Color32::from_rgb(205, 242, 92),
    Color32::from_rgb(92, 130, 242),
    Color32::from_rgb(120, 204, 78),
    Color32::from_rgb(99, 78, 204),
    Color32::from_rgb(92, 242, 105),
    Color32::from_rgb(180, 92, 242),
    Color32::from_rgb(78, 204, 141),
    Color32::from_rgb(204, 78, 204),
];

/// The colour of size class `log2(requested_bytes)`.
pub fn size_class(requested_bytes: u64) -> Color32 {
    let class = 63 - requested_bytes.max(1).leading_zeros();
    HUES[class as usize % HUES.len()]
}

/// The colour of an allocation `age_steps` old, in a trace of `steps` steps: yellow when new, through green and
/// cyan, blue when as old as the trace (logarithmic, so that recent history keeps contrast). The ramp turns the hue at
/// full saturation instead of mixing yellow into blue, whose middle is a grey like free space.
pub fn age(age_steps: u64, steps: u64) -> Color32 {
    let fraction = ((age_steps as f32 + 1.0).ln() / (steps.max(1) as f32 + 1.0).ln()).clamp(0.0, 1.0);
    hsv(50.0 + 170.0 * fraction, 0.72, 0.98 - 0.23 * fraction)
}

/// The sRGB colour of `hue` degrees at `saturation` and `value` (0 to 1).
fn hsv(hue: f32, saturation: f32, value: f32) -> Color32 {
    let chroma = value * saturation;
    let sector = hue.rem_euclid(360.0) / 60.0;
    let x = chroma * (1.0 - (sector % 2.0 - 1.0).abs());
    let (r, g, b) = match sector as u32 {
        0 => (chroma, x, 0.0),
        1 => (x, chroma, 0.0),
        2 => (0.0, chroma, x),
        3 => (0.0, x, chroma),
        4 => (x, 0.0, chroma),
        _ => (chroma, 0.0, x),
    };
    let channel = |c: f32| ((c + value - chroma) * 255.0).round().clamp(0.0, 255.0) as u8;
    Color32::from_rgb(channel(r), channel(g), channel(b))
}

/// `colour` a shade lighter: every other allocation of one colour (by slot) takes it, so that neighbours of one size
/// class or one stack stay countable (lighter, not darker: darker shades near the free grey and the too-small red).
pub fn alternate(colour: Color32) -> Color32 {
    let lighter = |channel: u8| (f32::from(channel) + (255.0 - f32::from(channel)) * 0.35).round() as u8;
    Color32::from_rgb(lighter(colour.r()), lighter(colour.g()), lighter(colour.b()))
}

/// The colour the groups without a hue of their own share (see [`GroupHues`]).
pub const OTHER_GROUPS: Color32 = HUES[HUES.len() - 1];

/// Which colour each group of a recording (a stack, a category) takes: the groups that allocate the most bytes over the
/// recording take a hue each, in that order, the rest share [`OTHER_GROUPS`]. Colours by a hash of the group met on two
/// of eight groups in a legend; ranked, the groups that hold most of the memory are told apart on the map and in its
/// legend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupHues(HashMap<u32, usize>);

impl GroupHues {
    /// The hues of groups that allocate `bytes` (a group may come several times: its bytes add up).
    pub fn ranked(bytes: impl IntoIterator<Item = (u32, u64)>) -> Self {
        let mut by_group: HashMap<u32, u64> = HashMap::new();
        for (group, bytes) in bytes {
            let total = by_group.entry(group).or_insert(0);
            *total = total.saturating_add(bytes);
        }
        let mut ranked: Vec<(u32, u64)> = by_group.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Self(ranked.into_iter().take(HUES.len() - 1).enumerate().map(|(hue, (group, _))| (group, hue)).collect())
    }

    /// The colour of `group`.
    pub fn colour(&self, group: u32) -> Color32 {
        self.0.get(&group).map_or(OTHER_GROUPS, |&hue| HUES[hue])
    }

    /// Whether `group` has a hue of its own (else it shares [`OTHER_GROUPS`]).
    pub fn has_own(&self, group: u32) -> bool {
        self.0.contains_key(&group)
    }
}

/// A recording's [`GroupHues`] for each way of grouping its allocations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordingHues {
    /// By the stack that allocated them.
    pub stack: GroupHues,
    /// By their entries' category.
    pub category: GroupHues,
}

impl RecordingHues {
    /// The hues of `colour_by`'s groups: categories for [`ColourBy::Category`], else stacks.
    pub fn of(&self, colour_by: ColourBy) -> &GroupHues {
        if colour_by == ColourBy::Category { &self.category } else { &self.stack }
    }
}

/// The smallest size class the legend names (1 KiB); it names two per hue, up to 16 GiB.
const LEGEND_FIRST_CLASS: u32 = 10;

/// `2^class` bytes, short: `512 B`, `4 KiB`, `2 GiB`.
fn power_of_two_name(class: u32) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let unit = (class / 10).min(6);
    format!("{} {}", 1u64 << (class - unit * 10), UNITS[unit as usize])
}

/// The legend of `colour_by`: each colour allocations get and what it means (size classes with their ranges,
/// age from new to old, stack groups), then the map's other colours (free, too small, padding, unmapped,
/// resident pages).
pub fn legend(colour_by: ColourBy) -> Vec<(Color32, String)> {
    let mut entries: Vec<(Color32, String)> = match colour_by {
        ColourBy::SizeClass => (0..HUES.len() as u32)
            .map(|hue| {
                let ranges: Vec<String> = [LEGEND_FIRST_CLASS + hue, LEGEND_FIRST_CLASS + hue + 12]
                    .iter()
                    .map(|&class| format!("{} to {}", power_of_two_name(class), power_of_two_name(class + 1)))
                    .collect();
                (size_class(1 << (LEGEND_FIRST_CLASS + hue)), ranges.join(", "))
            })
            .collect(),
        ColourBy::Age => vec![
            (age(0, 1000), "just allocated".to_owned()),
            (age(30, 1000), "older".to_owned()),
            (age(1000, 1000), "as old as the trace".to_owned()),
        ],
        ColourBy::StackGroup => vec![
            (HUES[0], "one hue per stack, the stacks holding the most bytes first".to_owned()),
            (HUES[1], "(hover for the frames)".to_owned()),
            (OTHER_GROUPS, "the other stacks".to_owned()),
        ],
        ColourBy::Category => vec![
            (HUES[0], "one hue per category (user_metadata, compile_context, category), the most bytes first".to_owned()),
            (OTHER_GROUPS, "the other categories".to_owned()),
        ],
    };
    let sample = entries.first().map_or(HUES[0], |entry| entry.0);
    entries.extend([
        (waste(sample), "padding and rounding".to_owned()),
        (FREE, "free run".to_owned()),
        (FREE_TOO_SMALL, "free run too small for the request refused".to_owned()),
        (UNMAPPED, "unmapped address space".to_owned()),
        (MAPPED, "resident pages (strip)".to_owned()),
    ]);
    entries
}

/// Draws [`legend`] for `colour_by`: a swatch and its meaning per line.
pub fn legend_ui(ui: &mut egui::Ui, colour_by: ColourBy) {
    for (colour, meaning) in legend(colour_by) {
        ui.horizontal(|ui| {
            let (rect, _) = ui.allocate_exact_size(egui::vec2(14.0, 10.0), egui::Sense::hover());
            ui.painter().rect_filled(rect, 2.0, colour);
            ui.label(egui::RichText::new(meaning).small());
        });
    }
}

/// `colour` darkened, for padding and rounding waste next to the requested bytes.
pub fn waste(colour: Color32) -> Color32 {
    Color32::from_rgb(colour.r() / 3, colour.g() / 3, colour.b() / 3)
}

/// `colour` at `alpha` (0 to 1) opacity, for spans fading in and out.
pub fn faded(colour: Color32, alpha: f32) -> Color32 {
    colour.gamma_multiply(alpha.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_by_power_of_two() {
        // Same class within a power of two, a different one across.
        assert_eq!(size_class(1 << 20), size_class((2 << 20) - 1));
        assert_ne!(size_class(1 << 20), size_class(2 << 20));
        assert_eq!(size_class(0), size_class(1));
    }

    /// Distance in RGB.
    fn distance(a: Color32, b: Color32) -> f32 {
        let d = |x: u8, y: u8| (f32::from(x) - f32::from(y)).powi(2);
        (d(a.r(), b.r()) + d(a.g(), b.g()) + d(a.b(), b.b())).sqrt()
    }

    #[test]
    fn allocations_are_never_red_or_grey() {
        // Every colour an allocation can get: each size class, every group, ages from new to old.
        let sizes = (0..64).map(|class| size_class(1 << class));
        let hues = GroupHues::ranked((0..256).map(|group| (group, u64::from(group))));
        let groups = (0..256).map(|group| hues.colour(group));
        let ages = (0..=1000).step_by(10).map(|age_steps| age(age_steps, 1000));
        for colour in sizes.chain(groups).chain(ages) {
            for (reserved, name) in [(FREE_TOO_SMALL, "the too-small red"), (FREE, "the free grey")] {
                assert!(distance(colour, reserved) >= 100.0, "{colour:?} is {} from {name}", distance(colour, reserved));
            }
        }
    }

    #[test]
    fn hues_are_distinct() {
        for (index, a) in HUES.iter().enumerate() {
            for b in &HUES[index + 1..] {
                assert!(distance(*a, *b) >= 40.0, "{a:?} and {b:?}");
            }
        }
    }

    #[test]
    fn the_legend_names_size_ranges_and_the_map_colours() {
        let sizes = legend(ColourBy::SizeClass);
        let meaning = |colour: Color32| sizes.iter().find(|entry| entry.0 == colour).map(|entry| entry.1.as_str());
        // Twelve hues: a class shares its hue with the one 2^12 times larger.
        assert_eq!(meaning(size_class(1 << 10)), Some("1 KiB to 2 KiB, 4 MiB to 8 MiB"));
        assert_eq!(meaning(size_class(1 << 20)), Some("1 MiB to 2 MiB, 4 GiB to 8 GiB"));
        assert_eq!(meaning(size_class(3 << 20)), Some("2 MiB to 4 MiB, 8 GiB to 16 GiB"));
        assert_eq!(size_class(5 << 30), size_class(1 << 20));
        assert_eq!(meaning(FREE_TOO_SMALL), Some("free run too small for the request refused"));
        assert_eq!(sizes.len(), 12 + 5);
        for mode in ColourBy::ALL {
            assert!(legend(mode).iter().any(|entry| entry.0 == FREE), "{mode:?}");
        }
        assert_eq!(power_of_two_name(9), "512 B");
        assert_eq!(power_of_two_name(31), "2 GiB");
    }

    #[test]
    fn age_runs_from_new_to_old() {
        let (new, old) = (age(0, 1000), age(1000, 1000));
        assert!(new.r() > 200 && new.g() > 200 && new.b() < 120, "yellow when new: {new:?}");
        assert!(old.b() > 150 && old.r() < 100, "blue when old: {old:?}");
        // Every age stays saturated: far from the free grey and from any grey at all.
        for age_steps in (0..=1000).step_by(10) {
            let colour = age(age_steps, 1000);
            let spread = colour.r().max(colour.g()).max(colour.b()) - colour.r().min(colour.g()).min(colour.b());
            assert!(spread >= 100, "{age_steps}: {colour:?} is greyish");
        }
    }

    #[test]
    fn alternate_shades_stay_away_from_red_and_grey() {
        let colours = (0..64).map(|class| alternate(size_class(1 << class))).chain(HUES.map(alternate));
        for colour in colours {
            assert!(distance(colour, FREE) >= 60.0 && distance(colour, FREE_TOO_SMALL) >= 100.0, "{colour:?}");
        }
    }

    #[test]
    fn the_groups_holding_the_most_bytes_take_a_hue_each() {
        // Group 7 allocates most (in two allocations), then 3, then the rest in id order; past eleven, one shared hue.
        let bytes = [(3, 500), (7, 400), (7, 400)].into_iter().chain((100..120).map(|group| (group, 10)));
        let hues = GroupHues::ranked(bytes);
        assert_eq!((hues.colour(7), hues.colour(3), hues.colour(100)), (HUES[0], HUES[1], HUES[2]));
        let own: std::collections::HashSet<Color32> =
            [7, 3].into_iter().chain(100..109).map(|group| hues.colour(group)).collect();
        assert_eq!(own.len(), 11, "eleven groups, eleven hues");
        assert!(!own.contains(&OTHER_GROUPS));
        assert!(hues.has_own(108) && !hues.has_own(109));
        assert_eq!((hues.colour(109), hues.colour(4)), (OTHER_GROUPS, OTHER_GROUPS), "the rest, and a group never seen");
        let recording = RecordingHues { stack: hues.clone(), category: GroupHues::default() };
        assert_eq!(recording.of(ColourBy::StackGroup), &hues);
        assert_eq!(recording.of(ColourBy::Category).colour(7), OTHER_GROUPS);
    }

    #[test]
    fn waste_is_a_darker_shade() {
        assert_eq!(waste(Color32::from_rgb(90, 60, 30)), Color32::from_rgb(30, 20, 10));
    }
}
