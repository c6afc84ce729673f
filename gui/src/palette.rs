//! Colours of the heap map: what each kind of byte looks like, and the three ways to colour allocations.

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
}

impl ColourBy {
    /// Every mode, in menu order.
    pub const ALL: [ColourBy; 3] = [ColourBy::SizeClass, ColourBy::Age, ColourBy::StackGroup];

    /// The name in menus.
    pub fn name(self) -> &'static str {
        match self {
            ColourBy::SizeClass => "size class",
            ColourBy::Age => "age",
            ColourBy::StackGroup => "stack frames",
        }
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

/// Twelve distinct hues, for classes and groups.
const HUES: [Color32; 12] = [
    Color32::from_rgb(78, 121, 167),
    Color32::from_rgb(242, 142, 43),
    Color32::from_rgb(89, 161, 79),
    Color32::from_rgb(237, 201, 72),
    Color32::from_rgb(176, 122, 161),
    Color32::from_rgb(118, 183, 178),
    Color32::from_rgb(255, 157, 167),
    Color32::from_rgb(156, 117, 95),
    Color32::from_rgb(186, 176, 172),
    Color32::from_rgb(225, 87, 89),
    Color32::from_rgb(134, 188, 234),
    Color32::from_rgb(166, 216, 84),
];

/// The colour of size class `log2(requested_bytes)`.
pub fn size_class(requested_bytes: u64) -> Color32 {
    let class = 63 - requested_bytes.max(1).leading_zeros();
    HUES[class as usize % HUES.len()]
}

/// The colour of an allocation `age_steps` old, in a trace of `steps` steps: yellow when new, blue when as
/// old as the trace (logarithmic, so that recent history keeps contrast).
pub fn age(age_steps: u64, steps: u64) -> Color32 {
    let fraction = ((age_steps as f32 + 1.0).ln() / (steps.max(1) as f32 + 1.0).ln()).clamp(0.0, 1.0);
    let mix = |young: u8, old: u8| (f32::from(young) + (f32::from(old) - f32::from(young)) * fraction).round() as u8;
    Color32::from_rgb(mix(250, 50), mix(220, 90), mix(80, 190))
}

/// The colour of stack group `group`.
pub fn group(group: u32) -> Color32 {
    // A multiplicative hash spreads neighbouring ids over the hues.
    let hashed = group.wrapping_mul(0x9e37_79b9) >> 28;
    HUES[hashed as usize % HUES.len()]
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

    #[test]
    fn age_runs_from_new_to_old() {
        assert_eq!(age(0, 1000), Color32::from_rgb(250, 220, 80));
        assert_eq!(age(1000, 1000), Color32::from_rgb(50, 90, 190));
        let middle = age(30, 1000);
        assert!(middle.r() < 250 && middle.r() > 50, "{middle:?}");
    }

    #[test]
    fn groups_and_waste() {
        let distinct: std::collections::HashSet<_> = (0..12).map(group).collect();
        assert!(distinct.len() >= 6, "neighbouring groups get different hues: {}", distinct.len());
        assert_eq!(waste(Color32::from_rgb(90, 60, 30)), Color32::from_rgb(30, 20, 10));
    }
}
