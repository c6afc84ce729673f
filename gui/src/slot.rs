//! What the app knows about each allocation of a recording (each trace slot): when it lives, and the groups it is
//! coloured by.

use crate::palette::ColourBy;

/// What the trace knows about one allocation (one slot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotInfo {
    /// The step that allocates it.
    pub alloc_step: u64,
    /// The step that frees it, if the trace does.
    pub free_step: Option<u64>,
    /// Its stack frames (an index into the snapshot's frame lists; 0 when none were recorded).
    pub stack: u32,
    /// Its entry's category (an index into the snapshot's categories; 0 when it names none).
    pub category: u32,
}

impl SlotInfo {
    /// Its colour group in [`ColourBy::by_group`] modes: its category for [`ColourBy::Category`], else its stack.
    pub fn group(&self, colour_by: ColourBy) -> u32 {
        if colour_by == ColourBy::Category { self.category } else { self.stack }
    }
}
