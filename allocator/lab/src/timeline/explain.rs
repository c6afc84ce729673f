//! One sentence per step: which decision the contender took and why, by its rules ("teach me").
//!
//! The sentence is read off the step's changes and their effects on the layout before it (the free run an
//! allocation was carved from, the neighbours a free merged with, blocks reserved or released, pages mapped),
//! and the rules of the contender that took them: PyTorch's rounding, pools and split rule, a heap's block
//! and release rules, paging.

use super::{Change, Effect, Layout, RegionKind, Timeline};
use crate::compare::unusable_free_words;
use heapscope_core::units::Bytes;
use heapscope_core::{HeapConfig, OomCause, PagedConfig};
use heapscope_pytorch::AllocConf;
use heapscope_pytorch::caching::{MIN_BLOCK_BYTES, SMALL_SIZE_BYTES, get_allocation_size, round_size};

/// The rules a contender decides by.
#[derive(Clone, Debug, PartialEq)]
pub enum Rules {
    /// PyTorch's caching allocator with these settings.
    Pytorch(AllocConf),
    /// A heap of blocks.
    Heap(HeapConfig),
    /// A paged heap.
    Paged(PagedConfig),
}

/// What one step did, read off its changes.
#[derive(Debug, Default)]
struct StepFacts {
    /// The allocation placed, with the free run it came from.
    allocated: Option<(super::Span, (u64, u64))>,
    /// The allocation freed, with the free run it became part of and how many neighbours joined.
    freed: Option<(super::Span, (u64, u64), u8)>,
    /// Blocks reserved (bytes each).
    blocks_added: Vec<u64>,
    /// Regions released (bytes each).
    regions_removed: Vec<u64>,
    /// Bytes of pages mapped and unmapped.
    mapped_bytes: u64,
    unmapped_bytes: u64,
    /// Allocations moved (compaction: freed and placed again in the same step, by slot), and their bytes.
    moved: (usize, u64),
}

fn facts(before: &Layout, changes: &[Change]) -> StepFacts {
    let mut layout = before.clone();
    let mut facts = StepFacts::default();
    // Slots freed in this step: one placed again in the same step moved.
    let mut freed_slots: Vec<u32> = Vec::new();
    for change in changes {
        let Ok(effect) = layout.apply(change) else { break };
        let Effect { carved_from, merged_into, freed, removed_region } = effect;
        match *change {
            Change::RegionAdded { size_bytes, kind: RegionKind::Block, .. } => facts.blocks_added.push(size_bytes),
            Change::RegionAdded { .. } | Change::RegionResized { .. } => {}
            Change::RegionRemoved { .. } => facts.regions_removed.extend(removed_region.map(|(_, bytes)| bytes)),
            Change::PagesMapped { size_bytes, .. } => facts.mapped_bytes += size_bytes,
            Change::PagesUnmapped { size_bytes, .. } => facts.unmapped_bytes += size_bytes,
            Change::Allocated(span) => match freed_slots.iter().position(|&slot| slot == span.slot) {
                Some(index) => {
                    freed_slots.swap_remove(index);
                    facts.moved = (facts.moved.0 + 1, facts.moved.1 + span.footprint_bytes);
                    if facts.freed.is_some_and(|(freed, _, _)| freed.slot == span.slot) {
                        facts.freed = None;
                    }
                }
                None => facts.allocated = carved_from.map(|run| (span, run)),
            },
            Change::Freed { .. } => {
                freed_slots.extend(freed.map(|span| span.slot));
                facts.freed = freed.zip(merged_into).map(|(span, (run, merged))| (span, run, merged));
            }
        }
    }
    facts
}

fn plural(count: usize, one: &str, many: &str) -> String {
    if count == 1 { format!("1 {one}") } else { format!("{count} {many}") }
}

/// One sentence explaining step `step` of `timeline`, whose layout before the step is `before` (two when the heap
/// compacted first: what moved, then the step's own decision).
pub fn explain(timeline: &Timeline, before: &Layout, step: u64) -> String {
    let facts = facts(before, timeline.changes(step));
    let decision = decide(timeline, &facts, step);
    match facts.moved {
        (0, _) => decision,
        (count, bytes) => format!(
            "Compaction: {} ({}) moved together, gathering the free space between them into one run. {decision}",
            plural(count, "allocation", "allocations"),
            Bytes(bytes)
        ),
    }
}

/// The sentence of the step's own decision.
fn decide(timeline: &Timeline, facts: &StepFacts, step: u64) -> String {
    if let Some(refusal) = timeline.refusal_at(step) {
        let mut text = format!("Out of memory on a {} request", Bytes(refusal.requested_bytes));
        if !facts.regions_removed.is_empty() {
            text.push_str(&format!(
                ": nothing fit, so {} ({}) went back to the device and the request was retried",
                plural(facts.regions_removed.len(), "cached block", "cached blocks"),
                Bytes(facts.regions_removed.iter().sum())
            ));
        }
        let free = refusal.free_memory();
        let why = match refusal.cause {
            OomCause::Fragmentation => match unusable_free_words(refusal.unusable_free_bytes, refusal.largest_free_bytes) {
                Some(apart) => format!("{free}, but {apart}: fragmentation"),
                None => format!("{free}, but the largest free run is {}: fragmentation", Bytes(refusal.largest_free_bytes)),
            },
            OomCause::InternalWaste => format!(
                "{free}, too little {}, while {} are wasted inside live allocations: internal waste",
                if refusal.needed_bytes > refusal.requested_bytes {
                    format!("once rounded to {}", Bytes(refusal.needed_bytes))
                } else {
                    "for it".to_owned()
                },
                Bytes(refusal.waste_bytes)
            ),
            OomCause::Exhaustion => format!("{free}: not enough memory, even without any waste"),
        };
        return format!("{text}; {why}.");
    }
    match (&timeline.rules, &facts.allocated, &facts.freed) {
        (Some(Rules::Pytorch(conf)), Some(allocated), _) => pytorch_alloc(conf, facts, allocated),
        (Some(Rules::Heap(config)), Some(allocated), _) => heap_alloc(config, facts, allocated),
        (Some(Rules::Paged(config)), Some(allocated), _) => paged_alloc(config, facts, allocated),
        (rules, None, Some(freed)) => free_sentence(rules.as_ref(), facts, freed),
        (None, Some((span, run)), _) => {
            format!(
                "{} placed in a {} free run{}.",
                Bytes(span.requested_bytes),
                Bytes(run.1),
                split_words(span.footprint_bytes, run.1)
            )
        }
        (_, None, None) if facts.blocks_added.is_empty() && facts.regions_removed.is_empty() => {
            "Nothing changes in this contender's layout at this entry (a segment event, a requested free, or the free \
             of a request it refused)."
                .to_owned()
        }
        // Only releases: memory held for reuse goes back (an `empty_cache()` call, or the release rule).
        (_, None, None) if facts.blocks_added.is_empty() => format!(
            "{} ({}) held for reuse, no allocation in them, go back to the device: an empty_cache() call, or the \
             allocator's rule for empty blocks.",
            plural(facts.regions_removed.len(), "cached block", "cached blocks"),
            Bytes(facts.regions_removed.iter().sum())
        ),
        _ => format!(
            "{} reserved, {} released.",
            plural(facts.blocks_added.len(), "block", "blocks"),
            plural(facts.regions_removed.len(), "region", "regions")
        ),
    }
}

fn split_words(footprint_bytes: u64, run_bytes: u64) -> String {
    if run_bytes > footprint_bytes {
        format!("; split: the remaining {} stays free", Bytes(run_bytes - footprint_bytes))
    } else {
        String::new()
    }
}

fn pytorch_alloc(conf: &AllocConf, facts: &StepFacts, (span, run): &(super::Span, (u64, u64))) -> String {
    let requested = span.requested_bytes;
    let rounded = round_size(requested, conf);
    let small = rounded <= SMALL_SIZE_BYTES;
    let mut text = if rounded == requested {
        format!("malloc {}", Bytes(requested))
    } else {
        format!("malloc {} (rounded to {})", Bytes(requested), Bytes(rounded))
    };
    if let Some(&segment) = facts.blocks_added.last() {
        let why = if small {
            "requests up to 1 MiB share 2 MiB small-pool segments".to_owned()
        } else if rounded < 10 << 20 {
            "requests under 10 MiB get a 20 MiB segment".to_owned()
        } else if get_allocation_size(rounded) == segment {
            "a large request gets a segment of its size, rounded up to 2 MiB".to_owned()
        } else {
            format!("a {} segment", Bytes(segment))
        };
        text.push_str(&format!(": no cached block fits, so cudaMalloc reserves a new {} segment ({why})", Bytes(segment)));
        if !facts.regions_removed.is_empty() {
            text.push_str(&format!(
                " after {} went back to the device",
                plural(facts.regions_removed.len(), "cached segment", "cached segments")
            ));
        }
    } else if facts.mapped_bytes > 0 {
        // The free run it grows from, where there was one (a segment full to its end grows from nothing).
        let grown = match run.1 - facts.mapped_bytes.min(run.1) {
            0 => String::new(),
            free => format!(" at the end of a {} free run", Bytes(free)),
        };
        text.push_str(&format!(
            ": the expandable segment maps {} more{grown} instead of reserving a new segment",
            Bytes(facts.mapped_bytes)
        ));
    } else {
        text.push_str(&format!(": best fit finds a cached {} free block", Bytes(run.1)));
    }
    let remainder = run.1 - span.footprint_bytes;
    if remainder > 0 {
        let rule =
            if small || conf.expandable_segments { format!("is at least {MIN_BLOCK_BYTES} B") } else { "is > 1 MiB".to_owned() };
        text.push_str(&format!(
            "; split: the remainder {rule}, so the {} block keeps a {} free tail.",
            Bytes(run.1),
            Bytes(remainder)
        ));
    } else if span.footprint_bytes > rounded {
        text.push_str(&format!(
            "; not split: the remainder {} is too small to cache (1 MiB or less, or the block is oversize), so the allocation \
             takes the whole {} block.",
            Bytes(span.footprint_bytes - rounded),
            Bytes(span.footprint_bytes)
        ));
    } else {
        text.push_str("; it fills the block exactly.");
    }
    text
}

fn heap_alloc(config: &HeapConfig, facts: &StepFacts, (span, run): &(super::Span, (u64, u64))) -> String {
    let policy = config.policy.name();
    let requested = span.requested_bytes;
    let mut text = match facts.blocks_added.last() {
        Some(&block) if requested >= config.dedicated_threshold_bytes => format!(
            "{policy}: requests of {} or more get a block of their own, so a dedicated {} block is reserved for {}",
            Bytes(config.dedicated_threshold_bytes),
            Bytes(block),
            Bytes(requested)
        ),
        Some(&block) => {
            format!("{policy}: no block has a free run for {}, so a new {} block is reserved", Bytes(requested), Bytes(block))
        }
        None => format!("{policy} places {} in a {} free run of an existing block", Bytes(requested), Bytes(run.1)),
    };
    if span.footprint_bytes > requested {
        text.push_str(&format!(
            "; it sets aside {} ({} of rounding and alignment)",
            Bytes(span.footprint_bytes),
            Bytes(span.footprint_bytes - requested)
        ));
    }
    text.push_str(&split_words(span.footprint_bytes, run.1));
    text.push('.');
    text
}

fn paged_alloc(config: &PagedConfig, facts: &StepFacts, (span, _): &(super::Span, (u64, u64))) -> String {
    let pages = facts.mapped_bytes / config.page_bytes;
    if pages == 0 {
        format!(
            "paged places {} at offset {:#x} of its virtual range; the pages under it are already mapped (a neighbour touches them).",
            Bytes(span.requested_bytes),
            span.address
        )
    } else {
        format!(
            "paged places {} at offset {:#x} of its virtual range and maps {} ({}) under it: virtual space is never \
             fragmented for long, only pages are reserved.",
            Bytes(span.requested_bytes),
            span.address,
            plural(pages as usize, "page", "pages"),
            Bytes(facts.mapped_bytes)
        )
    }
}

fn free_sentence(rules: Option<&Rules>, facts: &StepFacts, (span, run, merged): &(super::Span, (u64, u64), u8)) -> String {
    let mut text = format!("free {}", Bytes(span.requested_bytes));
    if *merged > 0 {
        text.push_str(&format!(
            ": merge: its {} join {} into a {} free run",
            Bytes(span.footprint_bytes),
            plural(usize::from(*merged), "free neighbour", "free neighbours"),
            Bytes(run.1)
        ));
    } else {
        text.push_str(&format!(": its {} become a free run of their own", Bytes(span.footprint_bytes)));
    }
    match rules {
        Some(Rules::Pytorch(_)) => text.push_str("; PyTorch keeps the segment reserved in its cache."),
        Some(Rules::Heap(config)) => match facts.regions_removed.last() {
            Some(&block) => {
                text.push_str(&format!(
                    "; the {} block is empty and goes back to the device (release rule {}).",
                    Bytes(block),
                    config.release
                ));
            }
            None => text.push('.'),
        },
        Some(Rules::Paged(config)) if facts.unmapped_bytes > 0 => text.push_str(&format!(
            "; {} that no live allocation touches any more are unmapped.",
            plural((facts.unmapped_bytes / config.page_bytes) as usize, "page", "pages")
        )),
        Some(Rules::Paged(_)) => text.push_str("; its pages stay mapped: a neighbour still touches them."),
        None => text.push('.'),
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::CompareConfig;
    use crate::contender::Contender;
    use crate::recording::Recording;
    use crate::story::frag_oom;
    use crate::timeline::record::record;
    use heapscope_core::{PolicyKind, ReleaseRule};

    fn sentences(contender: Contender) -> Vec<String> {
        let story = frag_oom();
        let config = CompareConfig {
            capacity_bytes: Some(story.device_bytes),
            heap: HeapConfig { release: ReleaseRule::OnPressure, ..HeapConfig::new(PolicyKind::BestFit) },
            ..CompareConfig::default()
        };
        let timeline = record(&Recording::from_trace(story.trace), contender, &config).unwrap();
        let mut layout = timeline.layout_at(0);
        let mut out = Vec::new();
        for step in 0..timeline.steps() {
            out.push(explain(&timeline, &layout, step));
            timeline.advance(&mut layout, step, step + 1);
        }
        out
    }

    /// The compaction story's last step: the moves said first, then the request served in the run they gathered.
    #[test]
    fn a_step_that_compacted_says_what_moved() {
        let story = crate::story::compaction();
        let config = story.config();
        let timeline = record(&Recording::from_trace(story.trace), Contender::Heap(PolicyKind::Tlsf), &config).unwrap();
        let last = timeline.steps() - 1;
        let layout = timeline.layout_at(last);
        let sentence = explain(&timeline, &layout, last);
        assert!(sentence.starts_with("Compaction: "), "{sentence}");
        assert!(sentence.contains("moved together, gathering the free space between them into one run. "), "{sentence}");
        assert!(sentence.contains("1.00 GiB"), "the request's own decision follows: {sentence}");
        // No other step moved anything.
        let mut layout = timeline.layout_at(0);
        for step in 0..last {
            assert!(!explain(&timeline, &layout, step).starts_with("Compaction"), "step {step}");
            timeline.advance(&mut layout, step, step + 1);
        }
    }

    /// The frag_oom story step by step: (step, words the sentence must hold), per contender.
    #[test]
    fn frag_oom_sentences_table() {
        type Case = (Contender, &'static [(usize, &'static str)]);
        let cases: [Case; 4] = [
            (
                Contender::Pytorch { expandable: false },
                &[
                    (0, "cudaMalloc reserves a new 150.00 MiB segment"),
                    (20, "PyTorch keeps the segment reserved"),
                    (40, "split: the remainder is > 1 MiB, so the 150.00 MiB block keeps a 50.00 MiB free tail"),
                    (
                        60,
                        "1000.00 MiB free in reserved memory and 584.00 MiB more on the device, 1.55 GiB in all, but the \
                         largest free run is 50.00 MiB: fragmentation",
                    ),
                ],
            ),
            (Contender::Pytorch { expandable: true }, &[(0, "maps"), (40, "best fit finds a cached"), (60, "malloc 1.00 GiB")]),
            (
                Contender::Heap(PolicyKind::BestFit),
                &[
                    (0, "dedicated 150.00 MiB block"),
                    (40, "best-fit places 100.00 MiB in a 150.00 MiB free run"),
                    (40, "split: the remaining 50.00 MiB stays free"),
                    (60, "Out of memory on a 1.00 GiB request"),
                ],
            ),
            (Contender::Paged, &[(0, "maps 75 pages (150.00 MiB)"), (20, "75 pages that no live allocation touches")]),
        ];
        for (contender, expected) in cases {
            let sentences = sentences(contender);
            for &(step, words) in expected {
                assert!(sentences[step].contains(words), "{contender} step {step}: {:?}", sentences[step]);
            }
            // A segment that grows from its end with nothing free there says no free run (it said "a 0 B free run").
            for (step, sentence) in sentences.iter().enumerate() {
                assert!(!sentence.contains(" 0 B free run"), "{contender} step {step}: {sentence:?}");
            }
        }
        let grown = sentences(Contender::Pytorch { expandable: true });
        assert!(grown.iter().any(|sentence| sentence.contains("more instead of reserving a new segment")), "{grown:?}");
    }
}
