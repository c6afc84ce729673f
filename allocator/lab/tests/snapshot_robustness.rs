//! Bad snapshots never panic: a snapshot ([`BASES`]), mutated at random (entries with other actions, addresses
//! and sizes; segments and blocks that overlap, shrink or vanish; entries duplicated or moved to another
//! entry's address, blocks in another state, segments turned expandable or not, entries and segments moved to
//! another memory pool, one the file may not name), goes through the importer's output
//! model, the recording, the caching-allocator emulation and every core contender without a panic.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::path::Path;

use heapscope_lab::compare::{CompareConfig, replay, replay_pytorch};
use heapscope_lab::contender::Contender;
use heapscope_lab::export::replayed::{emulated_snapshot, replayed_snapshot};
use heapscope_lab::recording::Recording;
use heapscope_pytorch::{Action, AllocConf, BlockState, PoolId, Snapshot, read_snapshot};
use proptest::prelude::*;

/// The snapshots mutated: two real runs (one with expandable segments) and PyTorch 2.12's layout with a private
/// memory pool (the fuzz seed: entries naming their pool, a graph's final segment).
const BASES: [&str; 3] = [
    "../../assets/traces/pytorch/frag_oom-default.pickle.gz",
    "../../assets/traces/pytorch/frag_oom-expandable.pickle.gz",
    "../core/fuzz/seeds/snapshot/pytorch-2.12-pool-ids.pickle",
];

fn real(name: &str) -> Snapshot {
    read_snapshot(&Path::new(env!("CARGO_MANIFEST_DIR")).join(name)).unwrap()
}

const ACTIONS: [Action; Action::ALL.len()] = Action::ALL;

/// One change to a snapshot.
#[derive(Clone, Debug)]
enum Mutation {
    EntryAction { pick: usize, action: usize },
    EntryAddr { pick: usize, addr: u64 },
    EntrySize { pick: usize, size: u64 },
    EntryStream { pick: usize, stream: u64 },
    DropPrefix { len: usize },
    SegmentAddress { pick: usize, address: u64 },
    SegmentSize { pick: usize, size: u64 },
    BlockSize { pick: usize, size: u64 },
    DropSegment { pick: usize },
    // Odd but valid: what the emulation must replay rather than refuse.
    EntryAddrOf { pick: usize, from: usize },
    DuplicateEntry { pick: usize, to: usize },
    BlockState { pick: usize, state: usize },
    SegmentExpandable { pick: usize },
    // Memory pools: entries and segments of private pools (CUDA graphs), named or not, that may contradict each other.
    EntryPool { pick: usize, pool: u8 },
    SegmentPool { pick: usize, pool: usize },
}

/// The memory pools the pool mutations name: the default, two graphs' and a `torch.cuda.MemPool`'s.
const POOLS: [(i64, i64); 4] = [(0, 0), (1, 0), (2, 0), (0, 1)];

fn value() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 1u64..4096, any::<u64>(), (u64::MAX - 4096)..=u64::MAX, (1u64 << 20)..(1 << 34)]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0..ACTIONS.len()).prop_map(|(pick, action)| Mutation::EntryAction { pick, action }),
        (any::<usize>(), value()).prop_map(|(pick, addr)| Mutation::EntryAddr { pick, addr }),
        (any::<usize>(), value()).prop_map(|(pick, size)| Mutation::EntrySize { pick, size }),
        (any::<usize>(), 0u64..3).prop_map(|(pick, stream)| Mutation::EntryStream { pick, stream }),
        (0usize..200).prop_map(|len| Mutation::DropPrefix { len }),
        (any::<usize>(), value()).prop_map(|(pick, address)| Mutation::SegmentAddress { pick, address }),
        (any::<usize>(), value()).prop_map(|(pick, size)| Mutation::SegmentSize { pick, size }),
        (any::<usize>(), value()).prop_map(|(pick, size)| Mutation::BlockSize { pick, size }),
        any::<usize>().prop_map(|pick| Mutation::DropSegment { pick }),
        (any::<usize>(), any::<usize>()).prop_map(|(pick, from)| Mutation::EntryAddrOf { pick, from }),
        (any::<usize>(), any::<usize>()).prop_map(|(pick, to)| Mutation::DuplicateEntry { pick, to }),
        (any::<usize>(), 0usize..3).prop_map(|(pick, state)| Mutation::BlockState { pick, state }),
        any::<usize>().prop_map(|pick| Mutation::SegmentExpandable { pick }),
        // Past the pools the file names too: an id the file does not list reads as the default pool.
        (any::<usize>(), 0u8..6).prop_map(|(pick, pool)| Mutation::EntryPool { pick, pool }),
        (any::<usize>(), 0..POOLS.len()).prop_map(|(pick, pool)| Mutation::SegmentPool { pick, pool }),
    ]
}

fn apply(snapshot: &mut Snapshot, mutation: &Mutation) {
    let trace = &mut snapshot.device_traces[0];
    let entries = trace.len().max(1);
    let segments = snapshot.segments.len().max(1);
    match *mutation {
        Mutation::EntryAction { pick, action } => {
            if let Some(entry) = trace.get_mut(pick % entries) {
                entry.action = ACTIONS[action];
            }
        }
        Mutation::EntryAddr { pick, addr } => {
            if let Some(entry) = trace.get_mut(pick % entries) {
                entry.addr = addr;
            }
        }
        Mutation::EntrySize { pick, size } => {
            if let Some(entry) = trace.get_mut(pick % entries) {
                entry.size = size;
            }
        }
        Mutation::EntryStream { pick, stream } => {
            if let Some(entry) = trace.get_mut(pick % entries) {
                entry.stream = stream;
            }
        }
        Mutation::DropPrefix { len } => {
            trace.drain(..len.min(trace.len()));
        }
        Mutation::SegmentAddress { pick, address } => {
            if let Some(segment) = snapshot.segments.get_mut(pick % segments) {
                segment.address = address;
            }
        }
        Mutation::SegmentSize { pick, size } => {
            if let Some(segment) = snapshot.segments.get_mut(pick % segments) {
                segment.total_size = size;
            }
        }
        Mutation::BlockSize { pick, size } => {
            if let Some(segment) = snapshot.segments.get_mut(pick % segments) {
                let blocks = segment.blocks.len().max(1);
                if let Some(block) = segment.blocks.get_mut(pick / segments % blocks) {
                    block.size = size;
                }
            }
        }
        Mutation::DropSegment { pick } => {
            if !snapshot.segments.is_empty() {
                snapshot.segments.remove(pick % segments);
            }
        }
        Mutation::EntryAddrOf { pick, from } => {
            if let Some(addr) = trace.get(from % entries).map(|entry| entry.addr)
                && let Some(entry) = trace.get_mut(pick % entries)
            {
                entry.addr = addr;
            }
        }
        Mutation::DuplicateEntry { pick, to } => {
            if let Some(entry) = trace.get(pick % entries).cloned() {
                trace.insert(to % entries, entry);
            }
        }
        Mutation::BlockState { pick, state } => {
            if let Some(segment) = snapshot.segments.get_mut(pick % segments) {
                let blocks = segment.blocks.len().max(1);
                if let Some(block) = segment.blocks.get_mut(pick / segments % blocks) {
                    block.state = [BlockState::ActiveAllocated, BlockState::ActivePendingFree, BlockState::Inactive][state];
                }
            }
        }
        Mutation::SegmentExpandable { pick } => {
            if let Some(segment) = snapshot.segments.get_mut(pick % segments) {
                segment.is_expandable = !segment.is_expandable;
            }
        }
        Mutation::EntryPool { pick, pool } => {
            snapshot.pool_ids = POOLS.to_vec();
            if let Some(entry) = snapshot.device_traces[0].get_mut(pick % entries) {
                entry.pool_id = PoolId(pool);
            }
        }
        Mutation::SegmentPool { pick, pool } => {
            if let Some(segment) = snapshot.segments.get_mut(pick % segments) {
                segment.segment_pool_id = POOLS[pool];
            }
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn mutated_snapshots_never_panic(
        name in proptest::sample::select(BASES.to_vec()),
        mutations in proptest::collection::vec(mutation(), 1..12),
        capacity in prop_oneof![Just(None), (1u64 << 20..8 << 30).prop_map(Some)],
        overrides in prop_oneof![Just(""), Just("expandable_segments:True"), Just("max_split_size_mb:128"), Just("roundup_power2_divisions:4")],
    ) {
        let mut snapshot = real(name);
        for mutation in &mutations {
            apply(&mut snapshot, mutation);
        }
        let mut conf = AllocConf::default();
        if !overrides.is_empty() {
            conf.parse_overrides(overrides).unwrap();
        }
        // The emulation on the snapshot itself (addresses and segments as mutated). A snapshot it cannot replay
        // (overlapping segments, blocks that do not tile their segment, ranges that overflow) is an error
        // naming the segment, block or entry.
        let emulation = heapscope_pytorch::emulate(&snapshot, 0, &conf, capacity);
        match &emulation {
            Ok(emulation) => prop_assert!(emulation.fidelity.matched <= emulation.fidelity.recorded),
            Err(error) => {
                let message = error.to_string();
                prop_assert!(message.starts_with("segments[") || message.starts_with("device_traces[0]["), "{message}");
            }
        }
        // A mutation may make the trace contradict itself (an address allocated twice): that is an error.
        if let Ok(recording) = Recording::from_snapshot(name, snapshot, 0) {
            let outcome = replay_pytorch(&recording, &conf, capacity);
            prop_assert_eq!(outcome.is_ok(), emulation.is_ok(), "{:?}", outcome.as_ref().err());
            if let Ok(outcome) = outcome {
                // Blocks lie inside segments: PyTorch never holds more in blocks than it reserved (the requested
                // bytes of a contradictory file's start state may exceed them; its blocks may not).
                let stats = outcome.memory_stats.as_ref().expect("the emulation's counters");
                prop_assert!(stats.reserved_bytes.all().peak >= stats.allocated_bytes.all().peak, "{outcome:?}");
            }
            let config = CompareConfig { capacity_bytes: capacity, ..CompareConfig::default() };
            for contender in [Contender::Heap(heapscope_core::PolicyKind::Tlsf), Contender::Paged] {
                let outcome = replay(&recording, contender, &config).unwrap();
                let figures = outcome.figures().expect("a simulated heap contender runs");
                prop_assert!(figures.peak_reserved_bytes >= figures.peak_live_bytes.min(1));
                replayed_snapshot(&recording, contender, &config).unwrap();
            }
            prop_assert_eq!(emulated_snapshot(&recording, &conf, overrides, capacity).is_ok(), emulation.is_ok());
        }
    }
}
