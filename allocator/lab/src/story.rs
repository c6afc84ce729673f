//! Built-in stories: small traces that show one allocator phenomenon each, with the device (and, where the story
//! needs them, the heap rules) they run on.

use crate::compaction::CompactRule;
use crate::compare::CompareConfig;
use heapscope_core::trace::{Trace, TraceBuilder};
use heapscope_core::units::{KIB, MIB};
use heapscope_core::{HeapConfig, ReleaseRule};

/// A trace with the device it runs on and what it shows.
#[derive(Clone, Debug)]
pub struct Story {
    /// Short name (`frag_oom`).
    pub name: &'static str,
    /// What happens, in one sentence.
    pub summary: &'static str,
    /// The memory the story's device leaves to the allocator.
    pub device_bytes: u64,
    /// The events.
    pub trace: Trace,
    /// The heap contenders' rules, where the story needs its own.
    pub rules: StoryRules,
}

/// Heap rules a story runs with, beside its device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoryRules {
    /// The heap contenders' memory is one block spanning the device (an arena), instead of blocks of 256 MiB.
    pub one_range: bool,
    /// When the heap contenders give empty blocks back (`None`: the heap's default, keep one).
    pub release: Option<ReleaseRule>,
    /// When the heap contenders compact.
    pub compact: CompactRule,
}

impl Story {
    /// How every replay of the story runs: on its device, by its rules.
    pub fn config(&self) -> CompareConfig {
        let defaults = CompareConfig::default();
        let heap = if self.rules.one_range {
            defaults.heap.clone().one_range(self.device_bytes)
        } else {
            HeapConfig { release: self.rules.release.unwrap_or(defaults.heap.release), ..defaults.heap.clone() }
        };
        CompareConfig { capacity_bytes: Some(self.device_bytes), heap, compact: self.rules.compact, ..defaults }
    }
}

/// The fragmentation out-of-memory story, as recorded on an H200 in
/// `shared/traces/pytorch-2.11-h200/frag_oom-*`: 20 x 150 MiB are allocated and freed, then 20 x 100 MiB
/// are allocated, then 1 GiB is requested, with 3584 MiB left to the allocator. PyTorch's default caching
/// allocator fails the last request with 1000 MiB "reserved but unallocated"; expandable segments succeed.
pub fn frag_oom() -> Story {
    const WELL_FORMED: &str = "the story frees only what it allocated";
    let mut builder = TraceBuilder::new("frag_oom");
    for id in 0..20 {
        builder.alloc(id, 150 * MIB).expect(WELL_FORMED);
    }
    for id in 0..20 {
        builder.free(id).expect(WELL_FORMED);
    }
    for id in 100..120 {
        builder.alloc(id, 100 * MIB).expect(WELL_FORMED);
    }
    builder.alloc(1000, 1024 * MIB).expect(WELL_FORMED);
    Story {
        name: "frag_oom",
        summary: "20 x 150 MiB allocated and freed, 20 x 100 MiB allocated, then 1 GiB requested within 3584 MiB",
        device_bytes: 3584 * MIB,
        trace: builder.finish(),
        // PyTorch's story: the heap contenders cache what empties until a request needs the room, as PyTorch does
        // (the heap's own default gives a dedicated block back at once, as VMA does, and then serves the 1 GiB).
        rules: StoryRules { release: Some(ReleaseRule::OnPressure), ..StoryRules::default() },
    }
}

/// One training step of a small transformer, twice: weights and optimizer state stay, activations pile up
/// layer by layer in the forward pass and go in reverse in the backward pass while gradients arrive, a
/// workspace comes and goes per layer. The second step reuses what the first one left cached.
pub fn training_step() -> Story {
    const WELL_FORMED: &str = "the story frees only what it allocated";
    const LAYERS: u64 = 12;
    let mut builder = TraceBuilder::new("training_step");
    let mut next = 0u64;
    let mut alloc = |builder: &mut TraceBuilder, size_bytes: u64| {
        next += 1;
        builder.alloc(next, size_bytes).expect(WELL_FORMED);
        next
    };
    let weights: Vec<u64> = (0..LAYERS).map(|_| alloc(&mut builder, 28 * MIB)).collect();
    let mut optimizer = Vec::new();
    for iteration in 0..2 {
        let mut activations = Vec::new();
        for _ in 0..LAYERS {
            activations.push(alloc(&mut builder, 48 * MIB));
            let temp = alloc(&mut builder, 6 * MIB + 300 * KIB);
            builder.free(temp).expect(WELL_FORMED);
        }
        let mut gradients = Vec::new();
        for activation in activations.into_iter().rev() {
            let workspace = alloc(&mut builder, 64 * MIB);
            gradients.push(alloc(&mut builder, 28 * MIB));
            builder.free(workspace).expect(WELL_FORMED);
            builder.free(activation).expect(WELL_FORMED);
        }
        if iteration == 0 {
            // Adam's two moments per weight, allocated on the first optimizer step.
            optimizer.extend((0..2 * LAYERS).map(|_| alloc(&mut builder, 28 * MIB)));
        }
        for gradient in gradients {
            builder.free(gradient).expect(WELL_FORMED);
        }
    }
    let _ = (weights, optimizer);
    Story {
        name: "training_step",
        summary: "two training steps of a 12-layer model: weights and Adam state stay, activations and gradients come and go",
        device_bytes: 4096 * MIB,
        trace: builder.finish(),
        rules: StoryRules::default(),
    }
}

/// LLM serving with a contiguous KV cache: each request reserves room for the longest sequence (2048
/// tokens at 64 KiB a token: 128 MiB) when it arrives and frees it when it ends, whatever its real length.
pub fn llm_serving_contiguous() -> Story {
    llm_serving(false)
}

/// The same requests as [`llm_serving_contiguous`] with a paged KV cache (vLLM's PagedAttention): 1 MiB
/// blocks of 16 tokens, allocated as each sequence grows and freed when it ends.
pub fn llm_serving_paged() -> Story {
    llm_serving(true)
}

fn llm_serving(paged: bool) -> Story {
    const WELL_FORMED: &str = "the story frees only what it allocated";
    const TOKEN_BYTES: u64 = 64 * KIB;
    const MAX_TOKENS: u64 = 2048;
    const BLOCK_TOKENS: u64 = 16;
    const REQUESTS: u64 = 48;
    const CONCURRENT: usize = 12;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut random = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let name = if paged { "llm_serving_paged" } else { "llm_serving_contiguous" };
    let mut builder = TraceBuilder::new(name);
    // (request, tokens so far, tokens it will reach, its allocations)
    let mut active: Vec<(u64, u64, u64, Vec<u64>)> = Vec::new();
    let mut next_request = 0;
    let mut next_id = 0u64;
    while next_request < REQUESTS || !active.is_empty() {
        while active.len() < CONCURRENT && next_request < REQUESTS {
            let length = 64 + random(MAX_TOKENS - 64);
            let prompt = 16 + random(length.min(512));
            let mut ids = Vec::new();
            if !paged {
                next_id += 1;
                builder.alloc(next_id, MAX_TOKENS * TOKEN_BYTES).expect(WELL_FORMED);
                ids.push(next_id);
            }
            active.push((next_request, prompt, length, ids));
            next_request += 1;
        }
        // One decode step for every active request: 32 tokens each, new KV blocks where needed.
        for (_, tokens, _, ids) in &mut active {
            *tokens += 32;
            while paged && (ids.len() as u64) * BLOCK_TOKENS < *tokens {
                next_id += 1;
                builder.alloc(next_id, BLOCK_TOKENS * TOKEN_BYTES).expect(WELL_FORMED);
                ids.push(next_id);
            }
        }
        next_id += 1;
        builder.alloc(next_id, 24 * MIB).expect(WELL_FORMED);
        builder.free(next_id).expect(WELL_FORMED);
        let (done, running): (Vec<_>, Vec<_>) = active.drain(..).partition(|(_, tokens, length, _)| tokens >= length);
        active = running;
        for (_, _, _, ids) in done {
            for id in ids {
                builder.free(id).expect(WELL_FORMED);
            }
        }
    }
    Story {
        name,
        summary: if paged {
            "48 LLM requests, 12 at a time, KV cache in 1 MiB blocks of 16 tokens allocated as sequences grow"
        } else {
            "48 LLM requests, 12 at a time, each reserving a 128 MiB KV cache for 2048 tokens up front"
        },
        device_bytes: 2048 * MIB,
        trace: builder.finish(),
        rules: StoryRules::default(),
    }
}

/// Compaction curing fragmentation, in one range of 3584 MiB (an arena, as a sparse or virtual range is): 12 pairs of
/// 150 MiB and 100 MiB allocations, the 150 MiB ones freed, then 1 GiB requested. 2384 MiB are free, but in holes of
/// 150 MiB and 584 MiB at the end: fragmentation. The heap compacts on the refusal (`CompactRule::OnOom`): the 100 MiB
/// allocations move down into the holes, the free space gathers at the end, and the request is served there.
pub fn compaction() -> Story {
    const WELL_FORMED: &str = "the story frees only what it allocated";
    let mut builder = TraceBuilder::new("compaction");
    for pair in 0..12 {
        builder.alloc(2 * pair, 150 * MIB).expect(WELL_FORMED);
        builder.alloc(2 * pair + 1, 100 * MIB).expect(WELL_FORMED);
    }
    for pair in 0..12 {
        builder.free(2 * pair).expect(WELL_FORMED);
    }
    builder.alloc(1000, 1024 * MIB).expect(WELL_FORMED);
    Story {
        name: "compaction",
        summary: "12 x (150 MiB + 100 MiB) in one 3584 MiB range, the 150 MiB ones freed, then 1 GiB: refused for \
                  fragmentation, the heap compacts (the 100 MiB ones move down into the holes) and serves it",
        device_bytes: 3584 * MIB,
        trace: builder.finish(),
        rules: StoryRules { one_range: true, compact: CompactRule::OnOom, ..StoryRules::default() },
    }
}

/// The built-in stories' names, in [`all`]'s order (without building their traces).
pub const NAMES: [&str; 5] = ["frag_oom", "training_step", "llm_serving_contiguous", "llm_serving_paged", "compaction"];

/// Every built-in story, by name.
pub fn all() -> Vec<Story> {
    vec![frag_oom(), training_step(), llm_serving_contiguous(), llm_serving_paged(), compaction()]
}

/// The built-in story called `name`.
pub fn named(name: &str) -> Option<Story> {
    all().into_iter().find(|story| story.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_core::trace::Event;

    /// The compaction story: refused without compacting (584 MiB is the largest run), served with it, in every heap
    /// policy that moves; the moves are the allocations sliding down.
    #[test]
    fn compaction_cures_the_story_it_tells() {
        use crate::compare::replay;
        use crate::contender::Contender;
        use crate::recording::Recording;
        use heapscope_core::PolicyKind;
        let story = compaction();
        let recording = Recording::from_trace(story.trace.clone());
        for policy in [PolicyKind::Tlsf, PolicyKind::BestFit, PolicyKind::FirstFit] {
            let contender = Contender::Heap(policy);
            let outcome = replay(&recording, contender, &story.config()).unwrap();
            let with = outcome.figures().unwrap();
            assert_eq!(with.ooms, 0, "{policy:?}: {with:?}");
            let moved = with.compaction.unwrap();
            assert_eq!(moved.ooms_avoided, 1, "{policy:?}");
            assert!(moved.moves > 0 && moved.bytes_moved > 0, "{policy:?}: {moved:?}");
            let without = CompareConfig { compact: CompactRule::Never, ..story.config() };
            let refused = replay(&recording, contender, &without).unwrap();
            let oom = refused.figures().unwrap().first_oom.clone().unwrap();
            assert_eq!(
                (oom.request_bytes, oom.largest_free_bytes, oom.free_bytes),
                (1 << 30, 584 * MIB, 2384 * MIB),
                "{policy:?}"
            );
        }
    }

    #[test]
    fn the_names_are_the_stories() {
        let names: Vec<&str> = all().iter().map(|story| story.name).collect();
        assert_eq!(names, NAMES);
    }

    #[test]
    fn frag_oom_shape() {
        let story = frag_oom();
        let events = story.trace.events();
        assert_eq!(events.len(), 61);
        assert_eq!(events[0], Event::Alloc { slot: 0, size_bytes: 150 * MIB });
        assert_eq!(events[20], Event::Free { slot: 0 });
        assert_eq!(events[60], Event::Alloc { slot: 40, size_bytes: 1024 * MIB });
    }

    #[test]
    fn every_story_is_well_formed_and_named() {
        for story in all() {
            assert!(!story.trace.events().is_empty(), "{}", story.name);
            assert_eq!(named(story.name).map(|named| named.trace), Some(story.trace.clone()));
        }
        assert!(named("nope").is_none());
    }

    #[test]
    fn paged_kv_serves_the_same_requests_in_less_memory() {
        use crate::driver::replay_policy;
        let peak = |story: Story| {
            let mut policy = heapscope_core::Tlsf::new(1 << 40);
            replay_policy(&story.trace, &mut policy, 512).unwrap().peak_live_bytes
        };
        let (contiguous, paged) = (peak(llm_serving_contiguous()), peak(llm_serving_paged()));
        assert!(paged * 3 < contiguous * 2, "paged {paged} vs contiguous {contiguous}");
        assert!(contiguous <= llm_serving_contiguous().device_bytes, "the contiguous story fits its device at peak");
    }
}
