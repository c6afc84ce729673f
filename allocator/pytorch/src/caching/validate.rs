//! What the emulation relies on, checked before it starts: a snapshot that breaks it gets an
//! [`EmulationError`] naming the segment, block or trace entry (as a JSON-like path) and what is wrong.
//!
//! - Every final segment of the device: `total_size` neither 0 nor above [`MAX_REQUEST_BYTES`], its range
//!   ending by [`ADDRESS_LIMIT`], and its blocks tiling it exactly (each block starts where the previous
//!   one ends, none is empty, together they cover `total_size`); no two of them overlapping.
//! - Every `alloc`, `free_requested`, `free_completed` and segment entry of the device: `size` at most
//!   [`MAX_REQUEST_BYTES`] (0 is refused for segment entries), and `addr + size` ending by
//!   [`ADDRESS_LIMIT`]. `oom` and `snapshot` entries carry no range: any size is a request the emulation
//!   refuses or serves.
//!
//! The state rebuilt at the start of the recording is checked as it is built (`initial`): reserved ranges
//! that overlap, or a live block that runs into the next one, are errors there.
//!
//! What is odd but replayable (frees of unknown addresses, an address allocated twice, streams that appear
//! mid-run, `segment_free` of unknown segments, an `oom` without `device_free`) is not an error: the
//! emulation copes.

use super::{ADDRESS_LIMIT, MAX_REQUEST_BYTES};
use crate::snapshot::{Action, Snapshot};

/// Why a snapshot cannot be emulated: where (a JSON-like path into the snapshot) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EmulationError {
    /// A final segment.
    #[error("segments[{segment}]: {what}")]
    Segment {
        /// Index in `segments`.
        segment: usize,
        /// What is wrong.
        what: String,
    },
    /// A block of a final segment.
    #[error("segments[{segment}].blocks[{block}]: {what}")]
    Block {
        /// Index of the segment in `segments`.
        segment: usize,
        /// Index of the block in the segment's `blocks`.
        block: usize,
        /// What is wrong.
        what: String,
    },
    /// A trace entry.
    #[error("device_traces[{device}][{entry}]: {what}")]
    Entry {
        /// Device.
        device: usize,
        /// Index in the device's trace.
        entry: usize,
        /// What is wrong.
        what: String,
    },
    /// The memory under the allocator ([`super::SegmentBacking`]) refused a segment operation of this entry.
    #[error("device_traces[{device}][{entry}]: the memory under the allocator refused: {what}")]
    Backing {
        /// Device.
        device: usize,
        /// Index in the device's trace (0 for what the allocator held at the start of the recording).
        entry: usize,
        /// What the memory said.
        what: String,
    },
}

/// Where a range or block of the rebuilt start state comes from, for errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// `segments[i]`.
    Segment(usize),
    /// `segments[i].blocks[j]`.
    Block(usize, usize),
    /// `device_traces[device][i]`.
    Entry(usize),
}

impl Origin {
    /// An error at this origin.
    pub(super) fn error(self, device: usize, what: String) -> EmulationError {
        match self {
            Origin::Segment(segment) => EmulationError::Segment { segment, what },
            Origin::Block(segment, block) => EmulationError::Block { segment, block, what },
            Origin::Entry(entry) => EmulationError::Entry { device, entry, what },
        }
    }

    /// The path, in words.
    pub(super) fn path(self, device: usize) -> String {
        match self {
            Origin::Segment(segment) => format!("segments[{segment}]"),
            Origin::Block(segment, block) => format!("segments[{segment}].blocks[{block}]"),
            Origin::Entry(entry) => format!("device_traces[{device}][{entry}]"),
        }
    }
}

/// `address + size` when it ends by [`ADDRESS_LIMIT`].
fn range_end(address: u64, size: u64) -> Option<u64> {
    address.checked_add(size).filter(|&end| end <= ADDRESS_LIMIT)
}

fn overflow(what: &str, address: u64, size: u64) -> String {
    format!("address {address:#x} + {what} {size} overflows (ranges must end by {ADDRESS_LIMIT:#x})")
}

fn too_large(what: &str, size: u64) -> String {
    format!("{what} {size} exceeds the largest size the emulation models ({MAX_REQUEST_BYTES} bytes)")
}

/// Refuses two final segments of `device` that share an address: no device maps one byte twice. Every replay of a
/// snapshot relies on it (the start state is walked back from the final segments), the heaps' as much as PyTorch's
/// emulation, which checks more ([`EmulationError`]); ranges that would pass 2^64 B are taken to end there.
///
/// # Errors
/// [`EmulationError::Segment`] naming the segment listed later and the one it overlaps.
pub fn no_overlapping_segments(snapshot: &Snapshot, device: usize) -> Result<(), EmulationError> {
    let mut ranges: Vec<(u64, u64, usize)> = (snapshot.segments.iter().enumerate())
        .filter(|(_, s)| s.device as usize == device)
        .map(|(i, s)| (s.address, s.address.saturating_add(s.total_size), i))
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        let (low, high) = (pair[0], pair[1]);
        if high.0 < low.1 {
            // Named from the one listed later, as the start state's check names them.
            let ((start, end, segment), (other_start, other_end, other)) = if high.2 > low.2 { (high, low) } else { (low, high) };
            return Err(EmulationError::Segment {
                segment,
                what: format!(
                    "the range at {start:#x} overlaps segments[{other}] ({other_start:#x}..{other_end:#x}; this one ends at \
                     {end:#x}): no device maps an address twice"
                ),
            });
        }
    }
    Ok(())
}

/// What every replay of device `device`'s recording needs of its final segments, whoever replays it: each segment and
/// block ends by [`ADDRESS_LIMIT`] (no device has addresses past it) and no two segments overlap
/// ([`no_overlapping_segments`]). The emulation checks more (blocks that tile their segment, sizes PyTorch could ask).
pub fn segments_describe_a_device(snapshot: &Snapshot, device: usize) -> Result<(), EmulationError> {
    for (i, s) in snapshot.segments.iter().enumerate().filter(|(_, s)| s.device as usize == device) {
        if range_end(s.address, s.total_size).is_none() {
            return Err(EmulationError::Segment { segment: i, what: overflow("total_size", s.address, s.total_size) });
        }
        if let Some((j, b)) = s.blocks.iter().enumerate().find(|(_, b)| range_end(b.address, b.size).is_none()) {
            return Err(EmulationError::Block { segment: i, block: j, what: overflow("size", b.address, b.size) });
        }
    }
    no_overlapping_segments(snapshot, device)
}

/// Checks device `device`'s final segments: each one's size and range, its blocks tiling it, and no two of them
/// overlapping.
fn check_final_segments(snapshot: &Snapshot, device: usize) -> Result<(), EmulationError> {
    for (i, s) in snapshot.segments.iter().enumerate().filter(|(_, s)| s.device as usize == device) {
        let fail = |what: String| EmulationError::Segment { segment: i, what };
        if s.total_size == 0 {
            return Err(fail("total_size is 0".into()));
        }
        if s.total_size > MAX_REQUEST_BYTES {
            return Err(fail(too_large("total_size", s.total_size)));
        }
        let end = range_end(s.address, s.total_size).ok_or_else(|| fail(overflow("total_size", s.address, s.total_size)))?;
        let covered = s.blocks.iter().fold(0u64, |sum, b| sum.saturating_add(b.size));
        if covered != s.total_size {
            return Err(fail(format!("blocks cover {covered} of {} bytes", s.total_size)));
        }
        let mut cursor = s.address;
        for (j, b) in s.blocks.iter().enumerate() {
            let fail = |what: String| EmulationError::Block { segment: i, block: j, what };
            if b.size == 0 {
                return Err(fail("size is 0".into()));
            }
            if b.address != cursor {
                return Err(fail(format!("starts at {:#x}, not at {cursor:#x} where the blocks before it end", b.address)));
            }
            cursor = range_end(b.address, b.size).filter(|&e| e <= end).ok_or_else(|| {
                fail(format!("address {:#x} + size {} runs past the segment's end {end:#x}", b.address, b.size))
            })?;
        }
    }
    no_overlapping_segments(snapshot, device)
}

/// Checks device `device`'s final segments and trace (see the module documentation).
pub(super) fn validate(snapshot: &Snapshot, device: usize) -> Result<(), EmulationError> {
    check_final_segments(snapshot, device)?;
    let trace = snapshot.device_traces.get(device).map_or(&[][..], Vec::as_slice);
    for (k, e) in trace.iter().enumerate() {
        let fail = |what: String| EmulationError::Entry { device, entry: k, what };
        let action = e.action.as_str();
        match e.action {
            Action::Alloc | Action::FreeRequested | Action::FreeCompleted | Action::Oom if e.size == 0 => {
                return Err(fail(format!("{action} of 0 bytes (PyTorch records no request of 0 bytes)")));
            }
            Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap if e.size == 0 => {
                return Err(fail(format!("{action} of 0 bytes")));
            }
            Action::Snapshot | Action::UserDefined | Action::Unknown | Action::Oom => continue,
            _ => {}
        }
        if e.size > MAX_REQUEST_BYTES {
            return Err(fail(too_large(&format!("{action} of size"), e.size)));
        }
        if range_end(e.addr, e.size).is_none() {
            return Err(fail(overflow("size", e.addr, e.size)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{AllocConf, emulate};
    use super::*;
    use crate::snapshot::{Block, BlockState, Pool, Segment, TraceEntry};

    const MIB: u64 = 1 << 20;
    const BASE: u64 = 0x7f00_0000_0000;

    fn block(address: u64, size: u64, state: BlockState) -> Block {
        Block::new(address, size, size, state)
    }

    /// A 2 MiB small-pool segment at `address` tiled by `blocks` (address, size, state).
    fn segment(address: u64, total_size: u64, blocks: &[(u64, u64, BlockState)]) -> Segment {
        Segment::from_blocks(
            0,
            address,
            total_size,
            Pool::Small,
            blocks.iter().map(|&(a, s, state)| block(a, s, state)).collect(),
        )
    }

    fn whole(address: u64) -> Segment {
        segment(address, 2 * MIB, &[(address, 2 * MIB, BlockState::Inactive)])
    }

    fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry::new(action, addr, size)
    }

    fn snapshot(segments: Vec<Segment>, trace: Vec<TraceEntry>) -> Snapshot {
        Snapshot {
            categories: Vec::new(),
            pool_ids: Vec::new(),
            unknown_actions: Vec::new(),
            contender_export: None,
            segments,
            device_traces: vec![trace],
            settings: None,
            frame_stacks: vec![Vec::new()],
        }
    }

    fn emulated(snap: &Snapshot) -> Result<(), String> {
        emulate(snap, 0, &AllocConf::default(), None).map(|_| ()).map_err(|e| e.to_string())
    }

    #[test]
    fn invalid_snapshots_are_errors_that_name_what_is_wrong() {
        use Action::{Alloc, FreeCompleted, SegmentAlloc, SegmentFree};
        use BlockState::{ActiveAllocated, Inactive};
        let near_end = u64::MAX - 4095;
        let table: Vec<(&str, Snapshot, String)> = vec![
            ("empty segment", snapshot(vec![segment(BASE, 0, &[])], vec![]), "segments[0]: total_size is 0".into()),
            (
                "huge segment",
                snapshot(vec![segment(BASE, MAX_REQUEST_BYTES + 1, &[(BASE, MAX_REQUEST_BYTES + 1, Inactive)])], vec![]),
                format!("segments[0]: total_size {} exceeds the largest size the emulation models", MAX_REQUEST_BYTES + 1),
            ),
            (
                "segment past the address space",
                snapshot(vec![whole(near_end)], vec![]),
                format!("segments[0]: address {near_end:#x} + total_size 2097152 overflows"),
            ),
            (
                "blocks that do not cover the segment",
                snapshot(vec![segment(BASE, 2 * MIB, &[(BASE, MIB, Inactive)])], vec![]),
                "segments[0]: blocks cover 1048576 of 2097152 bytes".into(),
            ),
            (
                "a block that does not start where the previous one ends",
                snapshot(vec![segment(BASE, 2 * MIB, &[(BASE, MIB, Inactive), (BASE + 2 * MIB, MIB, Inactive)])], vec![]),
                format!("segments[0].blocks[1]: starts at {:#x}, not at {:#x}", BASE + 2 * MIB, BASE + MIB),
            ),
            (
                "an empty block",
                snapshot(vec![segment(BASE, 2 * MIB, &[(BASE, 0, Inactive), (BASE, 2 * MIB, Inactive)])], vec![]),
                "segments[0].blocks[0]: size is 0".into(),
            ),
            (
                "two segments that share addresses",
                snapshot(vec![whole(BASE + MIB), whole(BASE + 8 * MIB), whole(BASE)], vec![]),
                format!(
                    "segments[2]: the range at {BASE:#x} overlaps segments[0] ({:#x}..{:#x}; this one ends at {:#x})",
                    BASE + MIB,
                    BASE + 3 * MIB,
                    BASE + 2 * MIB
                ),
            ),
            (
                "segments that overlap",
                snapshot(vec![whole(BASE), whole(BASE + MIB)], vec![]),
                format!("segments[1]: the range at {:#x} overlaps segments[0]", BASE + MIB),
            ),
            (
                "two segments at one address",
                snapshot(vec![whole(BASE), whole(BASE)], vec![]),
                format!("segments[1]: the range at {BASE:#x} overlaps segments[0]"),
            ),
            (
                "an alloc past the address space",
                snapshot(vec![], vec![entry(Alloc, near_end, 8192)]),
                format!("device_traces[0][0]: address {near_end:#x} + size 8192 overflows"),
            ),
            (
                "an alloc no device holds",
                snapshot(vec![], vec![entry(Alloc, BASE, MAX_REQUEST_BYTES + 1)]),
                format!("device_traces[0][0]: alloc of size {} exceeds", MAX_REQUEST_BYTES + 1),
            ),
            (
                "a free past the address space",
                snapshot(vec![], vec![entry(FreeCompleted, u64::MAX, 512)]),
                format!("device_traces[0][0]: address {:#x} + size 512 overflows", u64::MAX),
            ),
            (
                "an empty segment entry",
                snapshot(vec![], vec![entry(SegmentFree, BASE, 0)]),
                "device_traces[0][0]: segment_free of 0 bytes".into(),
            ),
            (
                "a segment freed during the recording that overlaps a final one",
                snapshot(vec![whole(BASE)], vec![entry(SegmentFree, BASE + MIB, 2 * MIB)]),
                format!("device_traces[0][0]: the range at {:#x} overlaps segments[0]", BASE + MIB),
            ),
            (
                "a live block larger than its segment at the start",
                snapshot(
                    vec![segment(BASE, 2 * MIB, &[(BASE, 2 * MIB, ActiveAllocated)])],
                    vec![entry(SegmentFree, BASE, MIB), entry(SegmentAlloc, BASE, 2 * MIB)],
                ),
                format!("segments[0].blocks[0]: the live block at {BASE:#x} of 2097152 bytes runs past {:#x}", BASE + MIB),
            ),
        ];
        for (case, snap, expected) in table {
            let message = emulated(&snap).expect_err(case);
            assert!(message.starts_with(&expected), "{case}: {message:?} does not start with {expected:?}");
        }
    }

    #[test]
    fn odd_but_valid_snapshots_replay() {
        use Action::{Alloc, FreeCompleted, FreeRequested, Oom, SegmentAlloc, SegmentFree, SegmentUnmap};
        use BlockState::{ActiveAllocated, Inactive};
        let tiled = segment(BASE, 2 * MIB, &[(BASE, MIB, ActiveAllocated), (BASE + MIB, MIB, Inactive)]);
        let oom = entry(Oom, 0, 1 << 40).with_device_free(None);
        let table: Vec<(&str, Snapshot)> = vec![
            ("no segments, no trace", snapshot(vec![], vec![])),
            (
                "a free of an unknown address",
                snapshot(vec![], vec![entry(FreeRequested, BASE, 512), entry(FreeCompleted, BASE, 512)]),
            ),
            ("an address allocated twice", snapshot(vec![], vec![entry(Alloc, BASE, 512), entry(Alloc, BASE, 512)])),
            (
                "a stream that appears mid-run",
                snapshot(
                    vec![tiled.clone()],
                    vec![entry(Alloc, BASE + MIB, 512), entry(Alloc, BASE + 4 * MIB, 512).with_stream(7)],
                ),
            ),
            ("a segment_free of an unknown segment", snapshot(vec![tiled], vec![entry(SegmentFree, BASE + 64 * MIB, 2 * MIB)])),
            ("a recorded oom without device_free", snapshot(vec![], vec![oom])),
            ("an oom of any size", snapshot(vec![], vec![entry(Oom, 0, u64::MAX)])),
            ("an unmap of no expandable segment", snapshot(vec![], vec![entry(SegmentUnmap, BASE, 20 * MIB)])),
            (
                "streams and requests at the edge of u64",
                snapshot(
                    vec![],
                    vec![
                        entry(Alloc, BASE, MAX_REQUEST_BYTES).with_stream(u64::MAX),
                        entry(Alloc, BASE + 4 * MIB, MAX_REQUEST_BYTES).with_stream(u64::MAX),
                        entry(Oom, 0, MAX_REQUEST_BYTES).with_device_free(Some(u64::MAX)),
                        entry(FreeCompleted, BASE, MAX_REQUEST_BYTES),
                    ],
                ),
            ),
            (
                "a live block that asked for more than it holds",
                snapshot(
                    vec![Segment {
                        blocks: vec![Block { requested_size: u64::MAX, ..block(BASE, 2 * MIB, ActiveAllocated) }],
                        ..whole(BASE)
                    }],
                    vec![entry(Alloc, BASE + 8 * MIB, 512)],
                ),
            ),
            (
                "a segment on another device and trace entries of no segment",
                snapshot(
                    vec![Segment { device: 1, ..whole(u64::MAX - 1) }],
                    vec![entry(FreeCompleted, BASE, 512), entry(FreeRequested, BASE, 512), entry(SegmentAlloc, BASE, 2 * MIB)],
                ),
            ),
        ];
        let mut confs = vec![AllocConf::default()];
        for overrides in [
            "expandable_segments:True",
            "max_split_size_mb:20",
            "garbage_collection_threshold:0.5",
            "roundup_power2_divisions:16",
        ] {
            let mut conf = AllocConf::default();
            conf.parse_overrides(overrides).unwrap();
            confs.push(conf);
        }
        confs.push(AllocConf { roundup_power2_divisions: [u64::MAX; _], ..AllocConf::default() });
        for (case, snap) in table {
            for conf in &confs {
                for capacity in [None, Some(0), Some(8 * MIB), Some(u64::MAX)] {
                    if let Err(error) = emulate(&snap, 0, conf, capacity) {
                        panic!("{case} ({conf:?}, {capacity:?}): {error}");
                    }
                }
            }
        }
    }
}
