//! Built-in stories: small traces that show one allocator phenomenon each, with the device (and, where the story
//! needs them, the heap rules and the panes) they run on. Each is a lesson: its trace carries captions (what happens
//! next, in words) that "Teach me" and renders show step by step.

use crate::compaction::CompactRule;
use crate::compare::CompareConfig;
use crate::contender::{Contender, PYTORCH, PYTORCH_EXPANDABLE};
use heapscope_core::rng::Rng;
use heapscope_core::trace::{Trace, TraceBuilder};
use heapscope_core::units::{KIB, MIB};
use heapscope_core::{HeapConfig, PolicyKind, ReleaseRule};

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
    /// The contenders the lesson compares, one pane each (empty: the side-by-side four, or the panes open).
    pub panes: &'static [Contender],
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
    /// `paged`'s page size (`None`: the default, 2 MiB).
    pub page_bytes: Option<u64>,
    /// PyTorch's settings (`PYTORCH_CUDA_ALLOC_CONF` syntax) for the `pytorch` contender (`None`: the defaults).
    pub alloc_conf: Option<&'static str>,
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
        let page_bytes = self.rules.page_bytes.unwrap_or(defaults.page_bytes);
        let alloc_conf = self.rules.alloc_conf.map(str::to_owned);
        CompareConfig {
            capacity_bytes: Some(self.device_bytes),
            heap,
            compact: self.rules.compact,
            page_bytes,
            alloc_conf,
            ..defaults
        }
    }
}

/// The fragmentation out-of-memory story, as recorded on an H200 in
/// `shared/traces/pytorch-2.11-h200/frag_oom-*`: 20 x 150 MiB are allocated and freed, then 20 x 100 MiB
/// are allocated, then 1 GiB is requested, with 3584 MiB left to the allocator. PyTorch's default caching
/// allocator fails the last request with 1000 MiB "reserved but unallocated"; expandable segments succeed.
pub fn frag_oom() -> Story {
    const WELL_FORMED: &str = "the story frees only what it allocated";
    let mut builder = TraceBuilder::new("frag_oom");
    builder.caption("Twenty 150 MiB tensors: each allocator reserves memory for them.");
    for id in 0..20 {
        builder.alloc(id, 150 * MIB).expect(WELL_FORMED);
    }
    builder.caption("All twenty freed: nothing is live, but caching allocators keep the memory reserved for reuse.");
    for id in 0..20 {
        builder.free(id).expect(WELL_FORMED);
    }
    builder.caption("Twenty 100 MiB tensors reuse the cached blocks, each leaving a 50 MiB tail free.");
    for id in 100..120 {
        builder.alloc(id, 100 * MIB).expect(WELL_FORMED);
    }
    builder.caption(
        "1 GiB: 1000 MiB are free in 50 MiB tails and 584 MiB more on the device, but no run of 1 GiB: who can serve it?",
    );
    builder.alloc(1000, 1024 * MIB).expect(WELL_FORMED);
    Story {
        name: "frag_oom",
        summary: "20 x 150 MiB allocated and freed, 20 x 100 MiB allocated, then 1 GiB requested within 3584 MiB",
        device_bytes: 3584 * MIB,
        trace: builder.finish(),
        // PyTorch's story: the heap contenders cache what empties until a request needs the room, as PyTorch does
        // (the heap's own default gives a dedicated block back at once, as VMA does, and then serves the 1 GiB).
        rules: StoryRules { release: Some(ReleaseRule::OnPressure), ..StoryRules::default() },
        panes: &[],
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
    builder.caption("The model's weights: twelve layers of 28 MiB, live for the whole run.");
    let weights: Vec<u64> = (0..LAYERS).map(|_| alloc(&mut builder, 28 * MIB)).collect();
    let mut optimizer = Vec::new();
    for iteration in 0..2 {
        builder.caption(format!(
            "Step {}, forward: an activation per layer piles up, with a short-lived temporary beside each.",
            iteration + 1
        ));
        let mut activations = Vec::new();
        for _ in 0..LAYERS {
            activations.push(alloc(&mut builder, 48 * MIB));
            let temp = alloc(&mut builder, 6 * MIB + 300 * KIB);
            builder.free(temp).expect(WELL_FORMED);
        }
        builder.caption("Backward, last layer first: each activation goes as its gradient arrives; a workspace comes and goes.");
        let mut gradients = Vec::new();
        for activation in activations.into_iter().rev() {
            let workspace = alloc(&mut builder, 64 * MIB);
            gradients.push(alloc(&mut builder, 28 * MIB));
            builder.free(workspace).expect(WELL_FORMED);
            builder.free(activation).expect(WELL_FORMED);
        }
        if iteration == 0 {
            builder.caption("The optimizer's first step allocates Adam's two moments per weight: they stay.");
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
        panes: &[],
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
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let mut random = move |below: u64| rng.below(below);
    let name = if paged { "llm_serving_paged" } else { "llm_serving_contiguous" };
    let mut builder = TraceBuilder::new(name);
    // The tokens the requests reach, for the contiguous lesson's caption (what its reservations waste).
    let mut reached_tokens = 0u64;
    // (request, tokens so far, tokens it will reach, its allocations)
    let mut active: Vec<(u64, u64, u64, Vec<u64>)> = Vec::new();
    let mut next_request = 0;
    let mut next_id = 0u64;
    while next_request < REQUESTS || !active.is_empty() {
        while active.len() < CONCURRENT && next_request < REQUESTS {
            let length = 64 + random(MAX_TOKENS - 64);
            reached_tokens += length;
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
    let average = reached_tokens / REQUESTS;
    let caption = if paged {
        "Twelve requests at a time; each sequence's KV cache grows a 1 MiB block (16 tokens) at a time, as it is needed. \
         `paged` maps 2 MiB pages: two KV blocks share a page, which stays mapped while either lives, so it holds more \
         than the live bytes (try --page-size 1MiB)."
            .to_owned()
    } else {
        format!(
            "Twelve requests at a time, each reserving a 128 MiB KV cache for {MAX_TOKENS} tokens when it arrives; they \
             reach {average} tokens on average, so {}% of every reservation is never written. A pane shows a \
             reservation as used: it is one allocation (compare llm_serving_paged).",
            100 - average * 100 / MAX_TOKENS
        )
    };
    builder.caption_at(0, caption);
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
        panes: &[],
    }
}

/// Compaction curing fragmentation, in one range of 3584 MiB (an arena, as a sparse or virtual range is): 12 pairs of
/// 150 MiB and 100 MiB allocations, the 150 MiB ones freed, then 1 GiB requested. 2384 MiB are free, but in holes of
/// 150 MiB and 584 MiB at the end: fragmentation. The heap compacts on the refusal (`CompactRule::OnOom`): the 100 MiB
/// allocations move down into the holes, the free space gathers at the end, and the request is served there.
pub fn compaction() -> Story {
    const WELL_FORMED: &str = "the story frees only what it allocated";
    let mut builder = TraceBuilder::new("compaction");
    builder.caption("Twelve pairs of 150 MiB and 100 MiB, side by side in one 3584 MiB range.");
    for pair in 0..12 {
        builder.alloc(2 * pair, 150 * MIB).expect(WELL_FORMED);
        builder.alloc(2 * pair + 1, 100 * MIB).expect(WELL_FORMED);
    }
    builder.caption("The 150 MiB ones freed: 2384 MiB free, in holes of 150 MiB and 584 MiB at the end.");
    for pair in 0..12 {
        builder.free(2 * pair).expect(WELL_FORMED);
    }
    builder.caption("1 GiB: refused for fragmentation, then the heap moves the 100 MiB ones down and serves it.");
    builder.alloc(1000, 1024 * MIB).expect(WELL_FORMED);
    Story {
        name: "compaction",
        summary: "12 x (150 MiB + 100 MiB) in one 3584 MiB range, the 150 MiB ones freed, then 1 GiB: refused for \
                  fragmentation, the heap compacts (the 100 MiB ones move down into the holes) and serves it",
        device_bytes: 3584 * MIB,
        trace: builder.finish(),
        rules: StoryRules { one_range: true, compact: CompactRule::OnOom, ..StoryRules::default() },
        panes: &[],
    }
}

/// frag_oom's stream with the heap contenders' memory as one range of the device instead of blocks: the free space
/// that blocks kept apart (a 50 MiB tail in each of twenty 150 MiB blocks) is one run once the 100 MiB tensors are
/// packed together, and the 1 GiB is served; PyTorch's segments still refuse it.
pub fn one_range() -> Story {
    let mut story = frag_oom();
    story.name = "one_range";
    story.summary = "frag_oom with the heaps' memory as one range instead of blocks: what blocks cost";
    story.rules = StoryRules { one_range: true, ..story.rules };
    story.panes = &[PYTORCH, Contender::Heap(PolicyKind::Tlsf), Contender::Heap(PolicyKind::BestFit)];
    let events = story.trace.events().to_vec();
    let captions = [
        (0, "Twenty 150 MiB tensors: PyTorch reserves a segment each; the heaps place them in one range of the device."),
        (20, "All freed: PyTorch keeps twenty 150 MiB segments cached; in one range the free bytes are one run."),
        (40, "Twenty 100 MiB tensors: PyTorch puts each in a cached segment (50 MiB tails); the heaps pack them together."),
        (60, "1 GiB: PyTorch's 1000 MiB free are in 50 MiB tails; the range has 1.55 GiB in one run and serves it."),
    ];
    story.trace = captioned(story.name, &events, &captions);
    story
}

/// `torch.cuda.empty_cache()`: frag_oom's stream with the call after the 150 MiB tensors are freed. PyTorch gives its
/// twenty cached 150 MiB segments back, the 100 MiB tensors get segments of their own size, and the 1 GiB fits in what
/// is left; the heaps give their empty blocks back the same way (what `--release` decides without the call).
pub fn empty_cache() -> Story {
    let mut story = frag_oom();
    story.name = "empty_cache";
    story.summary = "frag_oom with torch.cuda.empty_cache() after the frees: the cached segments go back and 1 GiB fits";
    story.panes = &[PYTORCH, Contender::Heap(PolicyKind::Tlsf), Contender::Paged];
    let events = story.trace.events().to_vec();
    let captions = [
        (0, "Twenty 150 MiB tensors, as in frag_oom."),
        (20, "All twenty freed: the memory stays reserved, cached for reuse."),
        (40, "torch.cuda.empty_cache(): every wholly free segment (every empty block) goes back to the device."),
        (41, "Twenty 100 MiB tensors: new segments of their own size, no 50 MiB tails."),
        (61, "1 GiB: 1.55 GiB are free on the device in one piece; it fits."),
    ];
    let mut with_call: Vec<heapscope_core::trace::Event> = events[..40].to_vec();
    with_call.push(heapscope_core::trace::Event::EmptyCache);
    with_call.extend_from_slice(&events[40..]);
    story.trace = captioned(story.name, &with_call, &captions);
    story
}

/// `max_split_size_mb`: frag_oom's stream with PyTorch told not to split cached blocks of 128 MiB or more
/// (`PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128`), the setting PyTorch's out-of-memory message suggests when memory
/// is fragmented. A pane with the setting against one without.
pub fn max_split_size() -> Story {
    let mut story = frag_oom();
    story.name = "max_split_size";
    story.summary = "frag_oom with max_split_size_mb:128: PyTorch no longer splits the cached 150 MiB blocks";
    story.rules = StoryRules { alloc_conf: Some("max_split_size_mb:128"), ..story.rules };
    story.panes = &[PYTORCH, PYTORCH_EXPANDABLE];
    let events = story.trace.events().to_vec();
    let captions = [
        (0, "Twenty 150 MiB tensors; PyTorch runs with max_split_size_mb:128: cached blocks of 128 MiB or more are never split."),
        (20, "All freed: twenty 150 MiB segments stay cached, as in frag_oom."),
        (
            40,
            "100 MiB tensors: the cached 150 MiB blocks may not be split for them, so each gets a segment of its own size, \
             and once the device is full cached 150 MiB segments go back: no 50 MiB tails this time.",
        ),
        (60, "1 GiB: more cached segments go back to make room, and it fits, where frag_oom's default settings refused it."),
    ];
    story.trace = captioned(story.name, &events, &captions);
    story
}

/// Waste *inside* allocations: the buddy policy rounds every request up to a power of two. Five 130 MiB tensors take
/// 256 MiB each (630 MiB of padding); then 300 MiB (512 MiB to buddy) is refused on a 1400 MiB device where TLSF,
/// rounding to 512 B, serves it with room to spare. Not fragmentation, not exhaustion: internal waste.
pub fn internal_waste() -> Story {
    const WELL_FORMED: &str = "the story frees only what it allocated";
    let mut builder = TraceBuilder::new("internal_waste");
    builder.caption("Five 130 MiB tensors: buddy rounds each up to 256 MiB; TLSF and paging take what is asked.");
    for id in 0..5 {
        builder.alloc(id, 130 * MIB).expect(WELL_FORMED);
    }
    builder.caption("300 MiB (512 MiB to buddy): 630 MiB of buddy's memory is padding inside allocations; the others serve it.");
    builder.alloc(5, 300 * MIB).expect(WELL_FORMED);
    Story {
        name: "internal_waste",
        summary: "5 x 130 MiB, then 300 MiB on a 1400 MiB device: buddy's powers of two waste 630 MiB inside allocations",
        device_bytes: 1400 * MIB,
        trace: builder.finish(),
        rules: StoryRules::default(),
        panes: &[Contender::Heap(PolicyKind::Buddy), Contender::Heap(PolicyKind::Tlsf), Contender::Paged],
    }
}

/// Size classes: the slab policy serves requests up to 64 KiB from slabs of one power-of-two class, so 33 KiB takes
/// 64 KiB; 1,500 of them need 94 MiB of slabs where TLSF places them in 49 MiB; on a 64 MiB device slab refuses them
/// from about the 1,000th on, for the waste inside its slots.
pub fn size_classes() -> Story {
    const WELL_FORMED: &str = "the story frees only what it allocated";
    let mut builder = TraceBuilder::new("size_classes");
    builder.caption("33 KiB requests, one after another: slab serves them from 64 KiB slots, TLSF at their size.");
    for id in 0..1500 {
        builder.alloc(id, 33 * KIB).expect(WELL_FORMED);
    }
    Story {
        name: "size_classes",
        summary: "1,500 x 33 KiB on a 64 MiB device: slab's 64 KiB size class wastes almost half of every slot",
        device_bytes: 64 * MIB,
        trace: builder.finish(),
        rules: StoryRules { one_range: true, ..StoryRules::default() },
        panes: &[Contender::Heap(PolicyKind::Slab), Contender::Heap(PolicyKind::Tlsf)],
    }
}

/// Page size: `paged` maps whole pages. Eighty 1 MiB tensors are allocated and every other one freed: with 2 MiB pages
/// every page still holds a live tensor, so nothing unmaps and 80 MiB stay resident for 40 MiB live; with 64 KiB
/// pages (`--page-size 64KiB`) the freed ones' pages go back. TLSF in blocks keeps its blocks either way.
pub fn page_size() -> Story {
    const WELL_FORMED: &str = "the story frees only what it allocated";
    let mut builder = TraceBuilder::new("page_size");
    builder.caption("Eighty 1 MiB tensors: paging maps 2 MiB pages, two tensors to a page.");
    for id in 0..80 {
        builder.alloc(id, MIB).expect(WELL_FORMED);
    }
    builder.caption(
        "Every other one freed: each 2 MiB page still holds one live tensor, so no page can go back (try --page-size 64KiB).",
    );
    for id in (0..80).step_by(2) {
        builder.free(id).expect(WELL_FORMED);
    }
    Story {
        name: "page_size",
        summary: "80 x 1 MiB, every other one freed: 2 MiB pages stay mapped half empty; smaller pages go back",
        device_bytes: 256 * MIB,
        trace: builder.finish(),
        rules: StoryRules::default(),
        panes: &[Contender::Paged, PYTORCH_EXPANDABLE],
    }
}

/// The trace `name` of `events` (a story's, slots as ids) with `captions` before the events of their indices.
fn captioned(name: &str, events: &[heapscope_core::trace::Event], captions: &[(usize, &str)]) -> Trace {
    const WELL_FORMED: &str = "the story's own events";
    let mut builder = TraceBuilder::new(name);
    for (index, event) in events.iter().enumerate() {
        for (_, text) in captions.iter().filter(|(at, _)| *at == index) {
            builder.caption(*text);
        }
        let added = match *event {
            heapscope_core::trace::Event::Alloc { slot, size_bytes } => builder.alloc(u64::from(slot), size_bytes),
            heapscope_core::trace::Event::Free { slot } => builder.free(u64::from(slot)),
            heapscope_core::trace::Event::EmptyCache => {
                builder.empty_cache();
                Ok(())
            }
        };
        added.expect(WELL_FORMED);
    }
    builder.finish()
}

/// The built-in stories' names, in [`all`]'s order (without building their traces).
pub const NAMES: [&str; 11] = [
    "frag_oom",
    "one_range",
    "empty_cache",
    "max_split_size",
    "internal_waste",
    "size_classes",
    "page_size",
    "training_step",
    "llm_serving_contiguous",
    "llm_serving_paged",
    "compaction",
];

/// Every built-in story, by name.
pub fn all() -> Vec<Story> {
    vec![
        frag_oom(),
        one_range(),
        empty_cache(),
        max_split_size(),
        internal_waste(),
        size_classes(),
        page_size(),
        training_step(),
        llm_serving_contiguous(),
        llm_serving_paged(),
        compaction(),
    ]
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

    /// Each lesson ends as its captions say, and "Teach me" names the cause at the decisive step: `one_range`'s heaps
    /// serve the 1 GiB PyTorch's segments refuse; `internal_waste`'s buddy refuses 300 MiB for the padding inside its
    /// allocations where TLSF and paging serve it; `size_classes`' slab runs out where TLSF does not; `page_size`'s
    /// 2 MiB pages stay mapped twice the live bytes, 64 KiB ones go back.
    #[test]
    fn the_lessons_teach_what_they_say() {
        use crate::recording::Recording;
        use crate::timeline::explain::explain;
        use crate::timeline::record::record;
        use heapscope_core::OomCause;
        let run = |story: &Story, contender: Contender| {
            let recording = Recording::from_trace(story.trace.clone());
            record(&recording, contender, &story.config()).unwrap()
        };
        let sentence = |timeline: &crate::timeline::Timeline, step: u64| explain(timeline, &timeline.layout_at(step), step);
        // one_range
        let story = one_range();
        let pytorch = run(&story, PYTORCH);
        assert_eq!(pytorch.refusal_at(60).map(|refusal| refusal.cause), Some(OomCause::Fragmentation));
        for policy in [PolicyKind::Tlsf, PolicyKind::BestFit] {
            let heap = run(&story, Contender::Heap(policy));
            assert!(heap.refusals().is_empty(), "{policy:?} in one range serves the 1 GiB");
        }
        assert!(sentence(&pytorch, 60).contains("fragmentation"), "{}", sentence(&pytorch, 60));
        // empty_cache: everything is served; after the call (entry 40) nothing is reserved in PyTorch's pane.
        let story = empty_cache();
        for contender in [PYTORCH, Contender::Heap(PolicyKind::Tlsf), Contender::Paged] {
            let timeline = run(&story, contender);
            assert!(timeline.refusals().is_empty(), "{contender:?} serves the 1 GiB after empty_cache()");
        }
        let pytorch = run(&story, PYTORCH);
        assert_eq!((pytorch.sample_at(40).reserved_bytes, pytorch.sample_at(41).reserved_bytes), (3000 * MIB, 0));
        let words = sentence(&pytorch, 40);
        assert!(words.starts_with("20 cached blocks (2.93 GiB) held for reuse"), "Teach me says what went back: {words}");
        // max_split_size: PyTorch with the setting serves the 1 GiB frag_oom refuses; the 100 MiB tensors get segments of
        // their own as cached 150 MiB ones go back.
        let story = max_split_size();
        let pytorch = run(&story, PYTORCH);
        assert!(pytorch.refusals().is_empty(), "max_split_size_mb:128 serves the 1 GiB");
        assert_eq!(pytorch.contender, "pytorch (max_split_size_mb:128)", "the pane says what it runs with");
        let words = sentence(&pytorch, 45);
        assert!(words.contains("reserves a new 100.00 MiB segment") && words.contains("cached segment went back"), "{words}");
        assert!(!run(&frag_oom(), PYTORCH).refusals().is_empty(), "without it, frag_oom's 1 GiB is refused");
        // internal_waste
        let story = internal_waste();
        let buddy = run(&story, Contender::Heap(PolicyKind::Buddy));
        let refusal = buddy.refusal_at(5).expect("buddy refuses the 300 MiB");
        assert_eq!((refusal.cause, refusal.waste_bytes, refusal.needed_bytes), (OomCause::InternalWaste, 630 * MIB, 512 * MIB));
        let words = sentence(&buddy, 5);
        assert!(words.contains("630.00 MiB are wasted inside live allocations: internal waste"), "{words}");
        for contender in [Contender::Heap(PolicyKind::Tlsf), Contender::Paged] {
            assert!(run(&story, contender).refusals().is_empty(), "{contender:?} serves it");
        }
        // size_classes
        let story = size_classes();
        let slab = run(&story, Contender::Heap(PolicyKind::Slab));
        let (first, refusal) = slab.refusals().first().expect("slab runs out");
        assert!((900..1500).contains(first), "slab refuses from about the 1,000th request: {first}");
        assert_eq!(refusal.cause, OomCause::InternalWaste, "{}", refusal.message);
        // Slab places a request its slots cannot take at its own size: nothing is said rounded (it said "too little
        // once rounded to 33.00 KiB", the request's own size); buddy's 512 MiB above is.
        let words = sentence(&slab, *first);
        assert!(words.contains("none left on the device, too little for it, while 31.00 MiB are wasted"), "{words}");
        assert!(run(&story, Contender::Heap(PolicyKind::Tlsf)).refusals().is_empty());
        // page_size
        let story = page_size();
        let end = story.trace.events().len() as u64;
        let resident = |page_bytes: u64| {
            let story = Story { rules: StoryRules { page_bytes: Some(page_bytes), ..story.rules }, ..story.clone() };
            let sample = run(&story, Contender::Paged).sample_at(end);
            (sample.reserved_bytes, sample.live_bytes)
        };
        assert_eq!(resident(2 * MIB), (80 * MIB, 40 * MIB), "every 2 MiB page still holds a live tensor");
        assert_eq!(resident(64 * KIB), (40 * MIB, 40 * MIB), "64 KiB pages of the freed ones go back");
        // The paged KV lesson's caption: 2 MiB pages hold more than the live 1 MiB blocks; 1 MiB pages do not.
        let story = llm_serving_paged();
        let most = |page_bytes: u64| {
            let story = Story { rules: StoryRules { page_bytes: Some(page_bytes), ..story.rules }, ..story.clone() };
            let timeline = run(&story, Contender::Paged);
            (0..=timeline.steps()).map(|position| timeline.sample_at(position)).fold((0, 0), |(reserved, over), sample| {
                (reserved.max(sample.reserved_bytes), over.max(sample.reserved_bytes - sample.live_bytes))
            })
        };
        let ((_, over_2mib), (_, over_1mib)) = (most(2 * MIB), most(MIB));
        assert!(over_2mib > 0 && over_1mib < over_2mib, "2 MiB pages: {over_2mib} B over live; 1 MiB pages: {over_1mib} B");
        // The contiguous KV lesson says how much of its reservations is never written.
        let caption = llm_serving_contiguous().trace.captions()[0].text.clone();
        let percent: u64 = caption.split("so ").nth(1).and_then(|rest| rest.split('%').next()).unwrap().parse().unwrap();
        assert!((1..100).contains(&percent) && caption.contains("of every reservation is never written"), "{caption}");
        // Every story has captions, from its first event on.
        for story in all() {
            assert_eq!(story.trace.captions().first().map(|caption| caption.event), Some(0), "{}", story.name);
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
