//! When the replay driver asks a heap contender to compact, and what compacting did in a replay.
//!
//! [`CompactRule::OnOom`]: a request refused for fragmentation (enough bytes free, no run large enough) makes the
//! driver hand the contender every live allocation with its request; the contender moves what it can
//! ([`heapscope_core::Heap::compact`], full algorithm) and the request is tried once more. [`CompactRule::Every`]:
//! a balanced pass before every N-th event, as an application that defragments now and then. Observers hear each
//! move as a [`crate::driver::Step::Moved`] (the timeline slides the allocation, the exporter writes a free and an
//! allocation), and the statistics count moves, bytes and the refusals compaction turned into placements
//! ([`CompactionFigures`]). A contender that cannot move anything (a bare policy, PyTorch's emulation, a backend's
//! heap) replays as without a rule.

use heapscope_core::compaction::Algorithm;
use heapscope_core::units::Bytes;

/// When the driver asks the contender to compact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CompactRule {
    /// Never.
    #[default]
    Never,
    /// When a request is refused for fragmentation: compact, then try the request once more.
    OnOom,
    /// Before every N-th event (N ≥ 1).
    Every(u64),
}

impl CompactRule {
    /// The algorithm of a pass: everything for a refused request, the balanced pass for a routine one.
    pub fn algorithm(for_refused: bool) -> Algorithm {
        if for_refused { Algorithm::Full } else { Algorithm::Balanced }
    }
}

impl std::fmt::Display for CompactRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Never => f.write_str("never"),
            Self::OnOom => f.write_str("on-oom"),
            Self::Every(events) => write!(f, "every:{events}"),
        }
    }
}

impl std::str::FromStr for CompactRule {
    type Err = heapscope_core::UnknownName;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let unknown = || heapscope_core::UnknownName {
            what: "compaction rule",
            name: text.to_owned(),
            expected: "never, on-oom or every:N (N events, at least 1)".to_owned(),
        };
        match text {
            "never" => Ok(Self::Never),
            "on-oom" => Ok(Self::OnOom),
            _ => {
                let events: u64 = text.strip_prefix("every:").and_then(|n| n.parse().ok()).ok_or_else(unknown)?;
                if events == 0 { Err(unknown()) } else { Ok(Self::Every(events)) }
            }
        }
    }
}

/// What compacting did in one replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CompactionFigures {
    /// Allocations moved (one allocation moved twice counts twice).
    pub moves: u64,
    /// Their bytes, where the device copies them.
    pub bytes_moved: u64,
    /// Their bytes, where a paged heap remaps their pages instead (nothing copied).
    pub bytes_remapped: u64,
    /// Requests refused for fragmentation that compaction then served.
    pub ooms_avoided: u64,
    /// On a device: the copies' time, recorded to waited for on the host, ns (`None` where nothing holds bytes: a
    /// simulated device).
    pub device_copy_ns: Option<u64>,
}

/// `compaction: 4 moves, 240.00 MiB copied on the device in 1.20 ms, 1 of its refusals served after compacting`
/// (the device's time only where one copied; `, 96.00 MiB remapped` after the copied bytes where pages moved).
impl std::fmt::Display for CompactionFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "compaction: {} moves, {} copied", self.moves, Bytes(self.bytes_moved))?;
        if self.bytes_remapped > 0 {
            write!(f, ", {} remapped", Bytes(self.bytes_remapped))?;
        }
        if let Some(nanos) = self.device_copy_ns {
            write!(f, " on the device in {:.2} ms", nanos as f64 / 1e6)?;
        }
        write!(f, ", {} of its refusals served after compacting", self.ooms_avoided)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::{CompareConfig, replay};
    use crate::contender::Contender;
    use crate::recording::Recording;
    use heapscope_core::PolicyKind;
    use heapscope_core::trace::Trace;
    use heapscope_core::units::MIB;

    /// Eight 60 MiB allocations fill two 256 MiB blocks of a 512 MiB device; every other one is freed, so each block
    /// holds two with 136 MiB free between and after them; then 200 MiB are asked for: fragmentation. Compacting on
    /// the refusal empties one block into the other's holes, and the request is served there.
    fn scattered() -> Recording {
        let mut csv = String::new();
        for id in 0..8 {
            csv.push_str(&format!("a,{id},{}\n", 60 * MIB));
        }
        for id in [1, 3, 5, 7] {
            csv.push_str(&format!("f,{id}\n"));
        }
        csv.push_str(&format!("a,8,{}\n", 200 * MIB));
        Recording::from_trace(Trace::parse_csv("scattered.csv", &csv).unwrap())
    }

    fn config(compact: CompactRule) -> CompareConfig {
        // Whole 256 MiB blocks from the first (no growth from an eighth), as the story above says.
        let heap = heapscope_core::HeapConfig { grow_blocks: false, ..CompareConfig::default().heap };
        CompareConfig { capacity_bytes: Some(512 * MIB), compact, heap, ..CompareConfig::default() }
    }

    #[test]
    fn compacting_on_a_refusal_serves_the_request() {
        let recording = scattered();
        for kind in [PolicyKind::Tlsf, PolicyKind::BestFit, PolicyKind::FirstFit] {
            let figures = |rule| replay(&recording, Contender::Heap(kind), &config(rule)).unwrap().figures().cloned().unwrap();
            let without = figures(CompactRule::Never);
            assert_eq!((without.ooms, without.compaction), (1, None), "{kind:?}");
            let with = figures(CompactRule::OnOom);
            let compaction = with.compaction.unwrap();
            assert_eq!(with.ooms, 0, "{kind:?}: {with:?}");
            // Two allocations leave the emptied block; a full pass may first slide some within their blocks.
            assert!(compaction.moves >= 2 && compaction.bytes_moved == compaction.moves * 60 * MIB, "{kind:?}: {compaction:?}");
            assert_eq!(compaction.ooms_avoided, 1, "{kind:?}");
            assert_eq!((with.allocs, with.events), (without.allocs + 1, without.events), "moves are no events");
            assert!(with.peak_reserved_bytes <= 512 * MIB);
        }
    }

    /// The timeline and the export hear each move: the layout after the last entry holds the 200 MiB allocation and
    /// the four 60 MiB ones, nothing overlapping; the exported trace frees each moved allocation where it was and
    /// allocates it where it went once the pass is done (moved twice in one pass: freed and placed once).
    #[test]
    fn the_timeline_and_the_export_follow_the_moves() {
        let recording = scattered();
        let config = config(CompactRule::OnOom);
        let timeline = crate::timeline::record::record(&recording, Contender::Heap(PolicyKind::Tlsf), &config).unwrap();
        let end = timeline.layout_at(timeline.steps());
        assert_eq!((end.totals().live_allocations, end.totals().live_bytes), (5, 440 * MIB));
        assert!(timeline.refusals().is_empty());
        let replayed =
            crate::export::replayed::replayed_snapshot(&recording, Contender::Heap(PolicyKind::Tlsf), &config).unwrap();
        let trace = &replayed.snapshot.device_traces[0];
        let allocs = trace.iter().filter(|e| e.action == heapscope_pytorch::Action::Alloc).count();
        // The full pass slides each block's upper allocation into its hole, then empties one block into the other:
        // four moves of three allocations, one of them slid and then moved to the other block.
        let figures = replay(&recording, Contender::Heap(PolicyKind::Tlsf), &config).unwrap().figures().cloned().unwrap();
        assert_eq!(figures.compaction.map(|compaction| compaction.moves), Some(4));
        assert_eq!(allocs, 9 + 3, "nine requests and three allocations moved");
        assert_eq!(replayed.stats.num_ooms, 0);
    }

    /// A routine pass every few events keeps the replay consistent: what the contender holds at the end is what the
    /// trace left live.
    #[test]
    fn compacting_every_n_events_keeps_the_replay_whole() {
        let recording = scattered();
        for every in [1, 3, 5] {
            let figures = replay(&recording, Contender::Heap(PolicyKind::Tlsf), &config(CompactRule::Every(every))).unwrap();
            let figures = figures.figures().cloned().unwrap();
            assert_eq!(figures.events, 13, "every:{every}");
            assert!(figures.compaction.is_some());
        }
    }

    /// A pass that moves nothing still lets the export and the statistics hear what the refused request asked of the
    /// device: four 100 MiB allocations fill the 512 MiB device in two 256 MiB blocks, the second block's two are
    /// freed (the block kept empty), and 300 MiB are asked for: the heap gives the empty block back to make room for a
    /// block of the request's own, still has too little (256 MiB), and compacting cannot help (the other block's 56
    /// MiB). That block's release was lost: the export never freed it, and a summary of the export held it to the end.
    #[test]
    fn a_pass_that_moves_nothing_loses_no_device_event() {
        let csv = format!("a,0,{0}\na,1,{0}\na,2,{0}\na,3,{0}\nf,2\nf,3\na,4,{1}\n", 100 * MIB, 300 * MIB);
        let recording = Recording::from_trace(Trace::parse_csv("blocked.csv", &csv).unwrap());
        for rule in [CompactRule::Never, CompactRule::OnOom, CompactRule::Every(1), CompactRule::Every(3)] {
            let config = config(rule);
            let tlsf = Contender::Heap(PolicyKind::Tlsf);
            let figures = replay(&recording, tlsf, &config).unwrap().figures().cloned().unwrap();
            assert_eq!((figures.ooms, figures.device_allocs, figures.device_frees), (1, 2, 1), "{rule}: {figures:?}");
            let replayed = crate::export::replayed::replayed_snapshot(&recording, tlsf, &config).unwrap();
            let count = |action| replayed.snapshot.device_traces[0].iter().filter(|entry| entry.action == action).count();
            let segments = (count(heapscope_pytorch::Action::SegmentAlloc), count(heapscope_pytorch::Action::SegmentFree));
            assert_eq!(segments, (2, 1), "{rule}");
            assert_eq!(replayed.snapshot.segments.len(), 1, "{rule}");
        }
    }

    #[test]
    fn rules_by_name() {
        for (text, rule) in
            [("never", CompactRule::Never), ("on-oom", CompactRule::OnOom), ("every:250", CompactRule::Every(250))]
        {
            assert_eq!(text.parse::<CompactRule>(), Ok(rule));
            assert_eq!(rule.to_string(), text);
        }
        for bad in ["every:0", "every:", "every:x", "oom", ""] {
            let error = bad.parse::<CompactRule>().unwrap_err().to_string();
            assert!(error.contains("on-oom or every:N"), "{bad}: {error}");
        }
    }
}
