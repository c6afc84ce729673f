//! What a heap asks of the device, as timeline changes: [`RegionTracker`] turns [`DeviceEvent`]s (blocks
//! reserved and released, page runs mapped and unmapped) into region and page [`Change`]s. A heap with ranges
//! mapped on demand (a paged heap, PyTorch's expandable segments, a sparse buffer) names them, and the tracker
//! shows each as a virtual region: reserved whole, or added just before the first page run mapped in it.
//!
//! The recorder of PyTorch timelines ([`super::record`]) and the GUI's live mode on a device both use it.

use super::{Change, RegionKind};
use heapscope_core::DeviceEvent;

/// Turns device events into layout changes, remembering which virtual ranges the layout shows already.
#[derive(Clone, Debug, Default)]
pub struct RegionTracker {
    /// Virtual ranges already shown, `(base, size_bytes)`.
    known_virtual: Vec<(u64, u64)>,
}

impl RegionTracker {
    /// Appends the changes of `events` to `changes`; `virtual_ranges` are the heap's ranges mapped on demand now:
    /// a range reserved whole becomes a virtual region, and the first page run mapped in a range not shown yet
    /// adds its region first.
    ///
    /// A range shown already whose size changed (PyTorch cut an expandable segment's reservation where it reserved
    /// the next one, closer than the default 128 GiB: issue 14) is resized first, so a range reserved next to it is
    /// a region of its own; one that a page run is mapped past (PyTorch reserves 9/8 of the device, more than the
    /// 128 GiB taken on a device above 114 GiB) grows before the run shows. A range shown already that is gone from
    /// `virtual_ranges` (PyTorch released an expandable segment's reservation once all of it was unmapped) is removed
    /// after its last pages were unmapped and before anything else is reserved or mapped: the driver may put the next
    /// reservation there.
    pub fn changes(&mut self, events: &[DeviceEvent], virtual_ranges: &[(u64, u64)], changes: &mut Vec<Change>) {
        // Cut before the events (a range reserved next to it may map pages now), grown after them (the range next
        // to it released first).
        self.resize(virtual_ranges, |now, known| now < known, changes);
        for &event in events {
            if matches!(event, DeviceEvent::Reserved { .. } | DeviceEvent::Mapped { .. }) {
                self.remove_gone(virtual_ranges, changes);
            }
            match event {
                DeviceEvent::Reserved { address, size_bytes } => {
                    let kind = if virtual_ranges.contains(&(address, size_bytes)) {
                        self.known_virtual.push((address, size_bytes));
                        RegionKind::Virtual
                    } else {
                        RegionKind::Block
                    };
                    changes.push(Change::RegionAdded { address, size_bytes, kind });
                }
                DeviceEvent::Released { address, .. } => {
                    self.known_virtual.retain(|&(base, _)| base != address);
                    changes.push(Change::RegionRemoved { address });
                }
                DeviceEvent::Mapped { address, size_bytes } => {
                    let starts_in = |&(base, bytes): &(u64, u64)| base <= address && address < base + bytes;
                    let holds = |&(base, bytes): &(u64, u64)| {
                        base <= address && address.saturating_add(size_bytes) <= base.saturating_add(bytes)
                    };
                    if !self.known_virtual.iter().any(holds)
                        && let Some(&range) = virtual_ranges.iter().find(|range| starts_in(range))
                    {
                        match self.known_virtual.iter_mut().find(|known| known.0 == range.0) {
                            // A range shown already, grown to take this run: the reservation was larger than taken.
                            Some(known) if known.1 == range.1 => {}
                            Some(known) => {
                                known.1 = range.1;
                                changes.push(Change::RegionResized { address: range.0, size_bytes: range.1 });
                            }
                            None => {
                                self.known_virtual.push(range);
                                changes.push(Change::RegionAdded {
                                    address: range.0,
                                    size_bytes: range.1,
                                    kind: RegionKind::Virtual,
                                });
                            }
                        }
                    }
                    changes.push(Change::PagesMapped { address, size_bytes });
                }
                DeviceEvent::Unmapped { address, size_bytes } => changes.push(Change::PagesUnmapped { address, size_bytes }),
            }
        }
        self.remove_gone(virtual_ranges, changes);
        self.resize(virtual_ranges, |now, known| now > known, changes);
    }

    /// Removes the ranges shown that are gone from `virtual_ranges` (their base no longer there).
    fn remove_gone(&mut self, virtual_ranges: &[(u64, u64)], changes: &mut Vec<Change>) {
        self.known_virtual.retain(|&(base, _)| {
            let kept = virtual_ranges.iter().any(|range| range.0 == base);
            if !kept {
                changes.push(Change::RegionRemoved { address: base });
            }
            kept
        });
    }

    /// Resizes the ranges shown whose size in `virtual_ranges` (same base) differs from theirs as `which` picks.
    fn resize(&mut self, virtual_ranges: &[(u64, u64)], which: fn(u64, u64) -> bool, changes: &mut Vec<Change>) {
        for known in &mut self.known_virtual {
            let now = virtual_ranges.iter().find(|range| range.0 == known.0 && which(range.1, known.1));
            if let Some(&(address, size_bytes)) = now {
                known.1 = size_bytes;
                changes.push(Change::RegionResized { address, size_bytes });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device events as a timeline receives them: (events, virtual ranges, the changes expected).
    #[test]
    fn device_events_become_layout_changes() {
        let mapped = DeviceEvent::Mapped { address: 4096, size_bytes: 8192 };
        type Case = (Vec<DeviceEvent>, Vec<(u64, u64)>, Vec<Change>);
        let cases: Vec<Case> = vec![
            // A block reserved and released.
            (
                vec![
                    DeviceEvent::Reserved { address: 1 << 20, size_bytes: 2 << 20 },
                    DeviceEvent::Released { address: 1 << 20, size_bytes: 2 << 20 },
                ],
                vec![],
                vec![
                    Change::RegionAdded { address: 1 << 20, size_bytes: 2 << 20, kind: RegionKind::Block },
                    Change::RegionRemoved { address: 1 << 20 },
                ],
            ),
            // The first run mapped in a virtual range shows the range first; the second does not again.
            (
                vec![mapped, DeviceEvent::Unmapped { address: 4096, size_bytes: 4096 }, mapped],
                vec![(0, 1 << 30)],
                vec![
                    Change::RegionAdded { address: 0, size_bytes: 1 << 30, kind: RegionKind::Virtual },
                    Change::PagesMapped { address: 4096, size_bytes: 8192 },
                    Change::PagesUnmapped { address: 4096, size_bytes: 4096 },
                    Change::PagesMapped { address: 4096, size_bytes: 8192 },
                ],
            ),
            // A virtual range reserved whole is a virtual region.
            (
                vec![DeviceEvent::Reserved { address: 0, size_bytes: 1 << 30 }, mapped],
                vec![(0, 1 << 30)],
                vec![
                    Change::RegionAdded { address: 0, size_bytes: 1 << 30, kind: RegionKind::Virtual },
                    Change::PagesMapped { address: 4096, size_bytes: 8192 },
                ],
            ),
            // A run mapped outside every virtual range adds no region.
            (
                vec![DeviceEvent::Mapped { address: 2 << 30, size_bytes: 4096 }],
                vec![(0, 1 << 30)],
                vec![Change::PagesMapped { address: 2 << 30, size_bytes: 4096 }],
            ),
        ];
        for (events, ranges, expected) in cases {
            let mut changes = Vec::new();
            RegionTracker::default().changes(&events, &ranges, &mut changes);
            assert_eq!(changes, expected, "{events:?}");
        }
    }

    /// A range cut where the next one is reserved (issue 14: PyTorch's expandable reservations 90 GiB apart, bases
    /// from the trace) is resized before the next one shows, so each is a region; grown back after the next one is
    /// released.
    #[test]
    fn a_range_cut_by_the_next_reservation_is_resized() {
        const GIB: u64 = 1 << 30;
        let first = DeviceEvent::Mapped { address: 0, size_bytes: 2 << 20 };
        let next = DeviceEvent::Mapped { address: 90 * GIB, size_bytes: 2 << 20 };
        // (events, the virtual ranges after them, the changes expected)
        type Step = (Vec<DeviceEvent>, Vec<(u64, u64)>, Vec<Change>);
        let steps: Vec<Step> = vec![
            (
                vec![first],
                vec![(0, 128 * GIB)],
                vec![
                    Change::RegionAdded { address: 0, size_bytes: 128 * GIB, kind: RegionKind::Virtual },
                    Change::PagesMapped { address: 0, size_bytes: 2 << 20 },
                ],
            ),
            (
                vec![next],
                vec![(0, 90 * GIB), (90 * GIB, 128 * GIB)],
                vec![
                    Change::RegionResized { address: 0, size_bytes: 90 * GIB },
                    Change::RegionAdded { address: 90 * GIB, size_bytes: 128 * GIB, kind: RegionKind::Virtual },
                    Change::PagesMapped { address: 90 * GIB, size_bytes: 2 << 20 },
                ],
            ),
            (
                vec![DeviceEvent::Released { address: 90 * GIB, size_bytes: 128 * GIB }],
                vec![(0, 128 * GIB)],
                vec![Change::RegionRemoved { address: 90 * GIB }, Change::RegionResized { address: 0, size_bytes: 128 * GIB }],
            ),
        ];
        // Its pages unmapped first, as the allocator does.
        play(steps, |change, layout| {
            if let Change::RegionRemoved { address } = *change {
                layout.apply(&Change::PagesUnmapped { address, size_bytes: 2 << 20 }).unwrap();
            }
        });
    }

    /// A range shown already that a run is mapped past, beginning at its end or inside it (PyTorch's reservation of 9/8
    /// of a 180 GiB device, larger than the 128 GiB taken: the allocator grows it), grows before the run shows, rather
    /// than showing a second region over it or pages outside every region.
    #[test]
    fn a_range_mapped_past_its_end_grows_first() {
        const GIB: u64 = 1 << 30;
        let steps: Vec<PlayStep> = vec![
            (
                vec![DeviceEvent::Mapped { address: 0, size_bytes: 128 * GIB }],
                vec![(0, 128 * GIB)],
                vec![
                    Change::RegionAdded { address: 0, size_bytes: 128 * GIB, kind: RegionKind::Virtual },
                    Change::PagesMapped { address: 0, size_bytes: 128 * GIB },
                ],
            ),
            (
                vec![DeviceEvent::Mapped { address: 128 * GIB, size_bytes: 30 * GIB }],
                vec![(0, 180 * GIB)],
                vec![
                    Change::RegionResized { address: 0, size_bytes: 180 * GIB },
                    Change::PagesMapped { address: 128 * GIB, size_bytes: 30 * GIB },
                ],
            ),
            // A run that begins inside the range shown and ends past it.
            (
                vec![DeviceEvent::Mapped { address: 170 * GIB, size_bytes: 20 * GIB }],
                vec![(0, 200 * GIB)],
                vec![
                    Change::RegionResized { address: 0, size_bytes: 200 * GIB },
                    Change::PagesMapped { address: 170 * GIB, size_bytes: 20 * GIB },
                ],
            ),
        ];
        play(steps, |_, _| {});
    }

    /// A range that leaves the heap's ranges without a `Released` event (PyTorch drops an expandable segment's
    /// reservation once all of it is unmapped) is removed after its pages were unmapped and before a block is
    /// reserved where it was: the layout holds every step.
    #[test]
    fn a_range_gone_from_the_heap_is_removed_before_its_space_is_reused() {
        const GIB: u64 = 1 << 30;
        type Step = (Vec<DeviceEvent>, Vec<(u64, u64)>, Vec<Change>);
        let steps: Vec<Step> = vec![
            (
                vec![DeviceEvent::Mapped { address: 0, size_bytes: 20 << 20 }],
                vec![(0, 128 * GIB)],
                vec![
                    Change::RegionAdded { address: 0, size_bytes: 128 * GIB, kind: RegionKind::Virtual },
                    Change::PagesMapped { address: 0, size_bytes: 20 << 20 },
                ],
            ),
            (
                vec![
                    DeviceEvent::Unmapped { address: 0, size_bytes: 20 << 20 },
                    DeviceEvent::Reserved { address: 4 * GIB, size_bytes: 20 << 20 },
                ],
                vec![],
                vec![
                    Change::PagesUnmapped { address: 0, size_bytes: 20 << 20 },
                    Change::RegionRemoved { address: 0 },
                    Change::RegionAdded { address: 4 * GIB, size_bytes: 20 << 20, kind: RegionKind::Block },
                ],
            ),
            // Nothing more to remove.
            (vec![], vec![], vec![]),
        ];
        play(steps, |_, _| {});
    }

    /// One step of [`play`]: events, the virtual ranges after them, the changes expected.
    type PlayStep = (Vec<DeviceEvent>, Vec<(u64, u64)>, Vec<Change>);

    /// Plays `steps` — (events, the virtual ranges after them, the changes expected) — through one tracker, each
    /// step's changes applied to a layout (after `before` for each change), which must take them all.
    fn play(steps: Vec<PlayStep>, before: impl Fn(&Change, &mut super::super::Layout)) {
        let (mut tracker, mut layout) = (RegionTracker::default(), super::super::Layout::default());
        for (events, ranges, expected) in steps {
            let mut changes = Vec::new();
            tracker.changes(&events, &ranges, &mut changes);
            assert_eq!(changes, expected, "{events:?}");
            for change in &changes {
                before(change, &mut layout);
                layout.apply(change).unwrap_or_else(|error| panic!("{change:?}: {error}"));
            }
        }
    }

    /// A virtual range released and reserved again is shown again.
    #[test]
    fn a_released_virtual_range_is_forgotten() {
        let range = DeviceEvent::Reserved { address: 0, size_bytes: 1 << 30 };
        let mut tracker = RegionTracker::default();
        let mut changes = Vec::new();
        let events = [range, DeviceEvent::Released { address: 0, size_bytes: 1 << 30 }];
        tracker.changes(&events, &[(0, 1 << 30)], &mut changes);
        changes.clear();
        tracker.changes(&[DeviceEvent::Mapped { address: 0, size_bytes: 4096 }], &[(0, 1 << 30)], &mut changes);
        assert_eq!(changes[0], Change::RegionAdded { address: 0, size_bytes: 1 << 30, kind: RegionKind::Virtual });
    }
}
