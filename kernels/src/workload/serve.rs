//! `serve`: LLM serving with continuous batching, the KV cache growing one token per decode step.
//!
//! Model weights live forever. Requests arrive at random (a Bernoulli trial per arrival slot and step), wait for
//! one of `max_running` batch slots, get a prefill (their prompt's KV cache, written from a transient activation
//! tensor), then generate one token per engine step until their output length is reached, and free their KV
//! cache. Each step's decode allocates the batch's hidden states, attention output and logits, computes
//! attention over each running request's newest KV block and frees them again.
//!
//! The KV cache is laid out one of two ways ([`KvLayout`]):
//! - **paged** (vLLM): fixed-size blocks of `block_tokens` (16) tokens, one new block whenever a request's tokens
//!   cross a block boundary, all freed when the request ends: every KV allocation has the same size;
//! - **contiguous**: one allocation per request, reallocated 16 tokens larger (and copied) whenever it is full:
//!   sizes grow with each request, and the old copy is freed after the new one exists.

use std::collections::VecDeque;
use std::str::FromStr;

use super::{Rng, StreamBuilder, Workload};

/// How the KV cache is laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvLayout {
    /// One allocation per request, grown (reallocated and copied) 16 tokens at a time.
    Contiguous,
    /// Fixed-size blocks of 16 tokens, as vLLM's PagedAttention.
    #[default]
    Paged,
}

impl KvLayout {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Contiguous => "contiguous",
            Self::Paged => "paged",
        }
    }
}

impl FromStr for KvLayout {
    type Err = heapscope_core::UnknownName;

    fn from_str(text: &str) -> Result<Self, heapscope_core::UnknownName> {
        match text {
            "contiguous" => Ok(Self::Contiguous),
            "paged" => Ok(Self::Paged),
            other => Err(heapscope_core::UnknownName {
                what: "KV layout",
                name: other.to_owned(),
                expected: "contiguous or paged".to_owned(),
            }),
        }
    }
}

/// The model and the traffic.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServeModel {
    /// Bytes of weights (eight tensors, living forever).
    pub weights_bytes: u64,
    /// Hidden size (f16 activations).
    pub hidden: u64,
    /// Vocabulary size (f32 logits).
    pub vocab: u64,
    /// KV cache bytes per token (all layers, keys and values).
    pub kv_bytes_per_token: u64,
    /// Tokens per KV block (paged) and per growth (contiguous).
    pub block_tokens: u64,
    /// Requests decoded together at most.
    pub max_running: usize,
    /// Arrival slots per step, and the chance that a slot brings a request.
    pub arrivals: (u32, f64),
    /// Prompt tokens, shortest and longest.
    pub prompt_range: (u64, u64),
    /// Output tokens, shortest and longest.
    pub output_range: (u64, u64),
}

impl Default for ServeModel {
    /// A 1B-class model: 24 MiB of weights (scaled down), hidden 2048, vocabulary 32000, 128 KiB of KV per token
    /// (2 MiB blocks); 4 requests at once, a request arriving every 10 steps on average, prompts of 16 to 256
    /// tokens, outputs of 16 to 192.
    fn default() -> Self {
        Self {
            weights_bytes: 24 << 20,
            hidden: 2048,
            vocab: 32000,
            kv_bytes_per_token: 128 << 10,
            block_tokens: 16,
            max_running: 4,
            arrivals: (1, 0.1),
            prompt_range: (16, 256),
            output_range: (16, 192),
        }
    }
}

/// The knobs of [`serve`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServeConfig {
    /// Engine steps (each decodes one token of every running request).
    pub steps: u32,
    /// The KV cache layout.
    pub kv: KvLayout,
    /// The seed of arrivals and lengths.
    pub seed: u64,
    /// The model and traffic.
    pub model: ServeModel,
}

impl ServeConfig {
    /// Steps by default.
    pub const DEFAULT_STEPS: u32 = 400;
    /// The default budget: with paged KV blocks, `pytorch` runs out of memory (a 2 MiB block needs a new 20 MiB
    /// segment where 18 MiB are left: internal waste, the rounding to segments) while `paged` completes.
    pub const DEFAULT_BUDGET_BYTES: u64 = 160 << 20;
    /// What the default budget shows.
    pub const STORY: &'static str = "with paged KV blocks, pytorch needs a 20 MiB segment for a 2 MiB block where 18 MiB are left and runs out of memory; paged completes";

    /// The defaults with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { steps: Self::DEFAULT_STEPS, kv: KvLayout::default(), seed, model: ServeModel::default() }
    }
}

/// A request being served.
#[derive(Debug)]
struct Running {
    /// Its KV allocations: blocks (paged) or the one buffer (contiguous).
    kv: Vec<u32>,
    /// Tokens in the cache.
    tokens: u64,
    /// Tokens the cache holds before it must grow.
    capacity: u64,
    /// Tokens still to generate.
    remaining: u64,
}

/// The serving stream. See the module documentation.
pub fn serve(config: &ServeConfig) -> Workload {
    let model = config.model;
    let block_tokens = model.block_tokens.max(1);
    let block_bytes = block_tokens * model.kv_bytes_per_token;
    let h = model.hidden;
    let mut rng = Rng::new(config.seed);
    let mut b = StreamBuilder::default();
    let weights: Vec<u32> = (0..8).map(|_| b.alloc_forever((model.weights_bytes / 8).max(4) / 4 * 4)).collect();
    let (embedding, qkv, up) = (weights[0], weights[1], weights[2]);
    let mut waiting: VecDeque<(u64, u64)> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    let mut served = 0u64;
    for _ in 0..config.steps {
        for _ in 0..model.arrivals.0 {
            if rng.chance(model.arrivals.1) {
                let prompt = rng.range(model.prompt_range.0, model.prompt_range.1).max(1);
                let output = rng.range(model.output_range.0, model.output_range.1).max(1);
                waiting.push_back((prompt, output));
            }
        }
        // Admission and prefill: the prompt's KV cache, written from the prompt's hidden states.
        while running.len() < model.max_running {
            let Some((prompt, output)) = waiting.pop_front() else { break };
            let capacity = prompt.div_ceil(block_tokens) * block_tokens;
            let kv: Vec<u32> = match config.kv {
                KvLayout::Paged => (0..capacity / block_tokens).map(|_| b.alloc(block_bytes)).collect(),
                KvLayout::Contiguous => vec![b.alloc(capacity * model.kv_bytes_per_token)],
            };
            // The prompt's activations (f16): hidden states, qkv, the MLP's intermediate.
            let hidden = b.alloc(prompt * h * 2);
            let projected = b.alloc(3 * prompt * h * 2);
            b.matvec(qkv, hidden, projected);
            let intermediate = b.alloc(4 * prompt * h * 2);
            b.matvec(up, hidden, intermediate);
            for &block in &kv {
                b.matvec(projected, hidden, block);
            }
            b.free(intermediate);
            b.free(projected);
            b.free(hidden);
            running.push(Running { kv, tokens: prompt, capacity, remaining: output });
        }
        if running.is_empty() {
            continue;
        }
        // Decode: one token for every running request.
        let batch = running.len() as u64;
        let hidden = b.alloc(batch * h * 2);
        let attention = b.alloc(batch * h * 2);
        for request in &running {
            if let Some(&newest) = request.kv.last() {
                b.matvec(newest, hidden, attention);
            }
        }
        let logits = b.alloc(batch * model.vocab * 4);
        b.matvec(embedding, attention, logits);
        b.free(logits);
        b.free(attention);
        for request in &mut running {
            request.tokens += 1;
            request.remaining -= 1;
            if request.tokens > request.capacity {
                grow(&mut b, request, config.kv, block_bytes, model.kv_bytes_per_token, block_tokens);
                if let Some(&newest) = request.kv.last() {
                    b.matvec(qkv, hidden, newest);
                }
            }
        }
        b.free(hidden);
        // Finished requests give their KV cache back.
        running.retain(|request| {
            if request.remaining > 0 {
                return true;
            }
            for &block in &request.kv {
                b.free(block);
            }
            served += 1;
            false
        });
    }
    // Requests still running when the steps run out are cut short.
    for request in running {
        for block in request.kv {
            b.free(block);
        }
    }
    let name = format!(
        "serve ({} KV, {} tokens a block, {} KiB a token, at most {} requests at once), {} steps, seed {}",
        config.kv.name(),
        block_tokens,
        model.kv_bytes_per_token >> 10,
        model.max_running,
        config.steps,
        config.seed
    );
    b.finish(name)
}

/// One more block (paged), or a buffer one block larger with the old contents copied in (contiguous).
fn grow(b: &mut StreamBuilder, request: &mut Running, kv: KvLayout, block_bytes: u64, per_token: u64, block_tokens: u64) {
    match kv {
        KvLayout::Paged => request.kv.push(b.alloc(block_bytes)),
        KvLayout::Contiguous => {
            let old = request.kv.pop();
            let grown = b.alloc((request.capacity + block_tokens) * per_token);
            if let Some(old) = old {
                b.copy(old, grown, request.capacity * per_token);
                b.free(old);
            }
            request.kv.push(grown);
        }
    }
    request.capacity += block_tokens;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Step;

    #[test]
    fn deterministic_and_well_formed() {
        for kv in [KvLayout::Paged, KvLayout::Contiguous] {
            let config = ServeConfig { kv, ..ServeConfig::new(5) };
            let workload = serve(&config);
            assert_eq!(workload, serve(&config));
            assert_ne!(workload.steps, serve(&ServeConfig { seed: 6, ..config }).steps);
            let stats = workload.check().unwrap_or_else(|error| panic!("{kv:?}: {error}"));
            assert!(stats.allocs > 1000 && stats.matvecs > 1000, "{kv:?}: {stats:?}");
            assert_eq!(stats.forever_bytes, config.model.weights_bytes);
            assert_eq!(stats.copies > 0, kv == KvLayout::Contiguous, "{stats:?}");
        }
    }

    /// Paged: every KV allocation is one 16-token block. Contiguous: KV sizes are whole blocks, grow by one block,
    /// and each growth copies the old cache.
    #[test]
    fn kv_layouts_allocate_as_described() {
        let model = ServeModel::default();
        let block = model.block_tokens * model.kv_bytes_per_token;
        let sizes = |kv| -> Vec<u64> {
            serve(&ServeConfig { kv, ..ServeConfig::new(2) })
                .steps
                .iter()
                .filter_map(|step| match *step {
                    Step::Alloc { size_bytes, forever: false, .. } if size_bytes % block == 0 && size_bytes >= block => {
                        Some(size_bytes)
                    }
                    _ => None,
                })
                .collect()
        };
        let paged = sizes(KvLayout::Paged);
        assert!(paged.len() > 150 && paged.iter().all(|&size| size == block), "{}", paged.len());
        let contiguous = sizes(KvLayout::Contiguous);
        let distinct: std::collections::BTreeSet<_> = contiguous.iter().collect();
        assert!(distinct.len() > 10, "contiguous caches of many sizes: {distinct:?}");
        let workload = serve(&ServeConfig { kv: KvLayout::Contiguous, ..ServeConfig::new(2) });
        for window in workload.steps.windows(3) {
            if let [Step::Alloc { id, size_bytes, .. }, Step::Copy { dst, len_bytes, .. }, Step::Free { .. }] = *window {
                assert_eq!((dst, len_bytes + block), (id, size_bytes));
            }
        }
    }

    /// Paged blocks waste at most one partial block per request; contiguous growth holds the old and the new cache
    /// at once: its peak is higher on the same traffic.
    #[test]
    fn contiguous_growth_peaks_higher() {
        let peak = |kv| serve(&ServeConfig { kv, ..ServeConfig::new(1) }).check().unwrap().peak_live_bytes;
        assert!(peak(KvLayout::Contiguous) > peak(KvLayout::Paged));
        assert!(peak(KvLayout::Paged) < ServeConfig::DEFAULT_BUDGET_BYTES);
        assert_eq!("contiguous".parse::<KvLayout>(), Ok(KvLayout::Contiguous));
        assert!("pages".parse::<KvLayout>().unwrap_err().to_string().contains("contiguous or paged"));
    }
}
