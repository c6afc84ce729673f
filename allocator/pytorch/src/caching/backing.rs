//! [`SegmentBacking`]: memory under the emulated caching allocator while a recording replays.
//!
//! The emulation ([`super::emulate_backed`], [`heapscope_lab::compare::emulate_pytorch`]) makes PyTorch's decisions;
//! a backing applies each segment operation as it is made — a `cudaMalloc` / `cudaFree` of a segment, pages of
//! an expandable segment mapped or unmapped — as core [`DeviceEvent`]s (`Reserved`, `Released`, `Mapped`,
//! `Unmapped`, at the allocator's addresses). A backend puts real memory there (the Vulkan crate: a dedicated
//! block per segment, a sparse buffer per expandable segment), so the device holds exactly what the emulated
//! allocator reserves, decision for decision, and every number of the emulation holds on the device.
//!
//! The emulation cannot take a decision back, so a refusal by the backing ends the replay with an error
//! (a backend that must survive refusals drives a [`super::CachingHeap`] instead, which undoes a request).
//!
//! A backing may follow the allocator's blocks as well: [`SegmentBacking::started`] once the state at the start
//! of the recording is applied, then [`SegmentBacking::replayed`] after every trace entry with what it did to the
//! blocks ([`EntryEffect`]). Both do nothing by default; the timeline recorder
//! ([`heapscope_lab::timeline::record`]) writes the replay down through them, so a timeline and `compare` come from one
//! and the same run.

use super::{CachingAllocator, DeviceEvent as SegmentEvent, OomReport};
use crate::snapshot::Action;
use heapscope_core::DeviceEvent;

/// What the memory under the allocator refused, in its words: the replay stops there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BackingRefused(pub String);

/// Memory that follows the emulated allocator's segment operations. See the module documentation.
pub trait SegmentBacking {
    /// Applies `events`, the segment operations `allocator` just made, in order (`allocator` is the state after
    /// them: an expandable segment it dropped is gone from it).
    ///
    /// # Errors
    /// What the memory refused, in words; the replay stops there.
    fn apply(&mut self, events: &[DeviceEvent], allocator: &CachingAllocator) -> Result<(), BackingRefused>;

    /// Called once before the first entry, after what the allocator holds at the start of the recording was
    /// applied (`allocator` is that state: its live blocks are the allocations made before the recording).
    /// `moved` lists the allocations live at the start that the emulation holds elsewhere than the recording
    /// did, as (recorded address, emulated address): a what-if of the other kind of memory allocates them afresh
    /// (empty otherwise), and the trace's later frees of them name the recorded address. Default: nothing.
    fn started(&mut self, allocator: &CachingAllocator, moved: &[(u64, u64)]) {
        let _ = (allocator, moved);
    }

    /// Called after trace entry `entry` replayed (for a plain trace: event `entry`), once per entry, with what it
    /// did to the allocator's blocks; the segment operations it made were applied before. Default: nothing.
    fn replayed(&mut self, entry: usize, effect: EntryEffect, allocator: &CachingAllocator) {
        let _ = (entry, effect, allocator);
    }
}

/// What one replayed trace entry did to the emulated allocator's blocks (see [`SegmentBacking::replayed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryEffect {
    /// Nothing: a `free_requested`, a segment entry (an `empty_cache()` call's segment operations were applied),
    /// a free of an address not live.
    Unchanged,
    /// The entry's request was served by the block at `address`.
    Placed {
        /// Address of the block.
        address: u64,
    },
    /// The block at `address` went back to the pool (`free_completed`).
    Freed {
        /// Address of the block.
        address: u64,
    },
    /// A recorded `oom` request served after all, by the block at `address`, given back at once.
    ServedAndReturned {
        /// Address of the block.
        address: u64,
        /// Bytes of the block while it served the request.
        size_bytes: u64,
    },
    /// The entry's request was refused.
    Refused(OomReport),
}

/// No memory under the allocator: the emulation alone.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unbacked;

impl SegmentBacking for Unbacked {
    fn apply(&mut self, _events: &[DeviceEvent], _allocator: &CachingAllocator) -> Result<(), BackingRefused> {
        Ok(())
    }
}

/// The allocator's own segment event as a core device event (`None` for an action that is not one).
pub(crate) fn device_event(event: &SegmentEvent) -> Option<DeviceEvent> {
    let (address, size_bytes) = (event.addr, event.size_bytes);
    Some(match event.action {
        Action::SegmentAlloc => DeviceEvent::Reserved { address, size_bytes },
        Action::SegmentFree => DeviceEvent::Released { address, size_bytes },
        Action::SegmentMap => DeviceEvent::Mapped { address, size_bytes },
        Action::SegmentUnmap => DeviceEvent::Unmapped { address, size_bytes },
        _ => return None,
    })
}

/// What `allocator` holds now as device events that would have made it: a `Reserved` per segment, a `Mapped`
/// per mapped range of an expandable segment (for the state at the start of a recording).
pub(crate) fn held_now(allocator: &CachingAllocator) -> Vec<DeviceEvent> {
    allocator
        .report()
        .iter()
        .map(|segment| {
            let (address, size_bytes) = (segment.address, segment.total_size);
            if segment.is_expandable {
                DeviceEvent::Mapped { address, size_bytes }
            } else {
                DeviceEvent::Reserved { address, size_bytes }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::caching::{emulate, emulate_backed};
    use crate::snapshot::Snapshot;
    use crate::{AllocConf, EmulationError};

    const MIB: u64 = 1 << 20;

    fn load(name: &str) -> Snapshot {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        crate::read_snapshot(&dir.join(format!("{name}.pickle.gz"))).unwrap()
    }

    /// Memory as a ledger: reserved segments and mapped ranges by address, checked on every event (a release of
    /// something reserved, an unmap of something mapped, no overlap), and held bytes compared with the
    /// allocator's reserved bytes after every operation.
    #[derive(Default)]
    struct Ledger {
        segments: BTreeMap<u64, u64>,
        mapped: BTreeMap<u64, u64>,
        held_bytes: u64,
        peak_bytes: u64,
        allocs: i64,
        frees: i64,
        calls: u64,
    }

    impl SegmentBacking for Ledger {
        fn apply(&mut self, events: &[DeviceEvent], allocator: &CachingAllocator) -> Result<(), BackingRefused> {
            self.calls += 1;
            for &event in events {
                match event {
                    DeviceEvent::Reserved { address, size_bytes } => {
                        assert!(self.segments.insert(address, size_bytes).is_none(), "{event:?} twice");
                        self.held_bytes += size_bytes;
                        self.allocs += 1;
                    }
                    DeviceEvent::Released { address, size_bytes } => {
                        assert_eq!(self.segments.remove(&address), Some(size_bytes), "{event:?} of nothing reserved");
                        self.held_bytes -= size_bytes;
                        self.frees += 1;
                    }
                    DeviceEvent::Mapped { address, size_bytes } => {
                        let overlaps =
                            self.mapped.range(..address + size_bytes).next_back().is_some_and(|(&a, &s)| a + s > address);
                        assert!(!overlaps, "{event:?} over a mapped range");
                        self.mapped.insert(address, size_bytes);
                        self.held_bytes += size_bytes;
                        self.allocs += 1;
                    }
                    DeviceEvent::Unmapped { address, size_bytes } => {
                        // An unmap may cover several mapped ranges or part of one: cut exactly that.
                        let end = address + size_bytes;
                        let touched: Vec<(u64, u64)> =
                            self.mapped.range(..end).map(|(&a, &s)| (a, s)).filter(|&(a, s)| a + s > address).collect();
                        let covered: u64 = touched.iter().map(|&(a, s)| (a + s).min(end) - a.max(address)).sum();
                        assert_eq!(covered, size_bytes, "{event:?}: not all mapped");
                        for (a, s) in touched {
                            self.mapped.remove(&a);
                            if a < address {
                                self.mapped.insert(a, address - a);
                            }
                            if a + s > end {
                                self.mapped.insert(end, a + s - end);
                            }
                        }
                        self.held_bytes -= size_bytes;
                        self.frees += 1;
                    }
                }
            }
            self.peak_bytes = self.peak_bytes.max(self.held_bytes);
            assert_eq!(self.held_bytes, allocator.reserved_bytes(), "the ledger holds what the allocator reserved");
            Ok(())
        }
    }

    #[test]
    fn a_backing_follows_every_segment_operation() {
        for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
            let snapshot = load(name);
            let conf = AllocConf::from_recorded(snapshot.settings.as_ref().unwrap());
            let trace = snapshot.device_traces[0].clone();
            // The whole recording, and the same cut mid-run (the allocator then holds memory at the start).
            for cut in [0, trace.len() / 2] {
                let mut cut_snapshot = snapshot.clone();
                cut_snapshot.device_traces[0] = trace[cut..].to_vec();
                for capacity in [None, Some(3584 * MIB)] {
                    let plain = emulate(&cut_snapshot, 0, &conf, capacity).unwrap();
                    let mut ledger = Ledger::default();
                    let backed = emulate_backed(&cut_snapshot, 0, &conf, capacity, &mut ledger).unwrap();
                    let context = format!("{name}, cut at {cut}, capacity {capacity:?}");
                    assert_eq!(backed.stats, plain.stats, "{context}: the backing changes nothing");
                    assert_eq!(backed.segment_events, plain.segment_events, "{context}");
                    assert!(ledger.calls > 0, "{context}");
                    // Every operation of the replay reached the ledger (the start state is no device call).
                    let start = held_now(&emulate_start(&cut_snapshot, &conf, capacity)).len() as i64;
                    assert_eq!(start > 0, cut > 0, "{context}: memory held at the start of a cut recording");
                    assert_eq!(ledger.allocs - start, plain.stats.num_device_alloc, "{context}");
                    assert_eq!(ledger.frees, plain.stats.num_device_free, "{context}");
                    assert_eq!(ledger.peak_bytes as i64, plain.stats.reserved_bytes.all().peak, "{context}");
                }
            }
        }
    }

    fn emulate_start(snapshot: &Snapshot, conf: &AllocConf, capacity: Option<u64>) -> CachingAllocator {
        CachingAllocator::at_recording_start(snapshot, 0, conf, capacity).unwrap()
    }

    /// A backing that refuses the third segment: the replay stops with the entry that asked for it.
    #[test]
    fn a_refusal_stops_the_replay_at_its_entry() {
        struct Refuses(u32);
        impl SegmentBacking for Refuses {
            fn apply(&mut self, events: &[DeviceEvent], _allocator: &CachingAllocator) -> Result<(), BackingRefused> {
                self.0 += events.len() as u32;
                if self.0 >= 3 { Err(BackingRefused("no room for a third segment".into())) } else { Ok(()) }
            }
        }
        let snapshot = load("frag_oom-default");
        let conf = AllocConf::from_recorded(snapshot.settings.as_ref().unwrap());
        let plain = emulate(&snapshot, 0, &conf, None).unwrap();
        let third = plain.segment_events[2].cause;
        let error = emulate_backed(&snapshot, 0, &conf, None, &mut Refuses(0)).unwrap_err();
        assert!(matches!(error, EmulationError::Backing { entry, .. } if entry == third), "{error}");
        assert!(
            error.to_string().contains(&format!("device_traces[0][{third}]: the memory under the allocator refused: no room")),
            "{error}"
        );
    }
}
