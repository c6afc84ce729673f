//! `train`: training steps of a small transformer, the way PyTorch allocates them.
//!
//! Weights (an embedding and four matrices per layer) live forever. Each step draws a sequence length (so batch x
//! sequence, the tokens, varies from step to step), then:
//! - **forward**, layer by layer: the layer's activations (qkv, attention scores, attention output, MLP up and
//!   activation) are allocated and computed from the layer's input; all are saved for backward, or with
//!   **checkpointing** freed at once and only the layer input kept;
//! - logits, their gradient, then **backward** in reverse layer order: with checkpointing the layer's activations
//!   are recomputed first; each saved activation is freed as soon as its gradient exists (reverse order of
//!   allocation), weight gradients appear on the way;
//! - the **optimizer**: Adam's two state tensors per weight, allocated at the first step and living forever,
//!   update the weights (a matvec into each weight); the gradients are then freed (`zero_grad(set_to_none=True)`).
//!
//! The two remedies users reach for under memory pressure are knobs: a smaller `batch` shrinks every
//! activation; `checkpointing` keeps one tensor per layer instead of six.

use super::{Rng, StreamBuilder, Workload};

/// The model's dimensions (f32 elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainModel {
    /// Transformer layers.
    pub layers: u32,
    /// Hidden size (elements).
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Shortest and longest sequence of a step (multiples of 16 in between are drawn).
    pub seq_range: (u64, u64),
    /// Bytes per element.
    pub element_bytes: u64,
}

impl Default for TrainModel {
    /// 4 layers, hidden 256, 4 heads, vocabulary 4096, sequences of 64 to 256 tokens, f32: 16 MiB of weights.
    fn default() -> Self {
        Self { layers: 4, hidden: 256, heads: 4, vocab: 4096, seq_range: (64, 256), element_bytes: 4 }
    }
}

/// The knobs of [`train`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainConfig {
    /// Training steps.
    pub steps: u32,
    /// Sequences per batch.
    pub batch: u32,
    /// Gradient checkpointing: keep only each layer's input, recompute the rest in backward.
    pub checkpointing: bool,
    /// The seed of the sequence lengths.
    pub seed: u64,
    /// The model.
    pub model: TrainModel,
}

impl TrainConfig {
    /// Steps by default.
    pub const DEFAULT_STEPS: u32 = 3;
    /// Batch by default.
    pub const DEFAULT_BATCH: u32 = 8;
    /// The default budget: the default batch does not fit without checkpointing (peak live about 167 MiB with the
    /// default seed); with `--checkpointing` (about 94 MiB) or `--batch 4` (about 107 MiB) it does.
    pub const DEFAULT_BUDGET_BYTES: u64 = 144 << 20;
    /// What the default budget shows.
    pub const STORY: &'static str = "batch 8 does not fit; --checkpointing or --batch 4 does";

    /// The defaults with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { steps: Self::DEFAULT_STEPS, batch: Self::DEFAULT_BATCH, checkpointing: false, seed, model: TrainModel::default() }
    }
}

/// One layer's weights.
#[derive(Clone, Copy, Debug)]
struct LayerWeights {
    qkv: u32,
    out: u32,
    up: u32,
    down: u32,
}

impl TrainModel {
    /// Bytes of a layer's qkv, output, MLP up and MLP down matrices.
    fn layer_weight_bytes(&self) -> [u64; 4] {
        let square = self.hidden * self.hidden * self.element_bytes;
        [3 * square, square, 4 * square, 4 * square]
    }

    /// Bytes of the embedding (tied with the output projection).
    fn embedding_bytes(&self) -> u64 {
        self.vocab * self.hidden * self.element_bytes
    }
}

/// One layer's activations: qkv, attention scores, attention output, MLP up, MLP activation.
#[derive(Clone, Copy, Debug)]
struct Activations {
    qkv: u32,
    scores: u32,
    attn: u32,
    up: u32,
    act: u32,
}

/// Sizes of a step's tensors.
#[derive(Clone, Copy, Debug)]
struct Shapes {
    hidden_bytes: u64,
    scores_bytes: u64,
    logits_bytes: u64,
}

/// The training stream. See the module documentation.
pub fn train(config: &TrainConfig) -> Workload {
    let model = config.model;
    let e = model.element_bytes;
    let h = model.hidden;
    let mut rng = Rng::new(config.seed);
    let mut b = StreamBuilder::default();
    let embedding = b.alloc_forever(model.embedding_bytes());
    let [qkv_bytes, out_bytes, up_bytes, down_bytes] = model.layer_weight_bytes();
    let layers: Vec<LayerWeights> = (0..model.layers)
        .map(|_| LayerWeights {
            qkv: b.alloc_forever(qkv_bytes),
            out: b.alloc_forever(out_bytes),
            up: b.alloc_forever(up_bytes),
            down: b.alloc_forever(down_bytes),
        })
        .collect();
    // Every weight with its size, in parameter order.
    let weights: Vec<(u32, u64)> = std::iter::once((embedding, model.embedding_bytes()))
        .chain(layers.iter().flat_map(|w| [(w.qkv, qkv_bytes), (w.out, out_bytes), (w.up, up_bytes), (w.down, down_bytes)]))
        .collect();
    let mut adam: Option<Vec<u32>> = None;
    let batch = u64::from(config.batch.max(1));
    for _ in 0..config.steps {
        let (low, high) = model.seq_range;
        let seq = rng.range(low.div_ceil(16), (high / 16).max(low.div_ceil(16))) * 16;
        let tokens = batch * seq;
        let shapes = Shapes {
            hidden_bytes: tokens * h * e,
            scores_bytes: batch * model.heads * seq * seq * e,
            logits_bytes: tokens * model.vocab * e,
        };
        let token_ids = b.alloc(tokens * 4);
        let mut x = b.alloc(shapes.hidden_bytes);
        b.matvec(embedding, token_ids, x);
        // Forward: (layer input, saved activations).
        let mut saved: Vec<(u32, Option<Activations>)> = Vec::new();
        for w in &layers {
            let activations = forward_layer(&mut b, w, x, shapes);
            let out = b.alloc(shapes.hidden_bytes);
            b.matvec(w.down, activations.act, out);
            if config.checkpointing {
                free_activations(&mut b, activations);
                saved.push((x, None));
            } else {
                saved.push((x, Some(activations)));
            }
            x = out;
        }
        let logits = b.alloc(shapes.logits_bytes);
        b.matvec(embedding, x, logits);
        // Backward.
        let grad_logits = b.alloc(shapes.logits_bytes);
        b.matvec(logits, x, grad_logits);
        b.free(logits);
        let grad_embedding = b.alloc(model.embedding_bytes());
        b.matvec(grad_logits, x, grad_embedding);
        let mut grad = b.alloc(shapes.hidden_bytes);
        b.matvec(embedding, grad_logits, grad);
        b.free(grad_logits);
        b.free(x);
        // Weight -> its gradient.
        let mut grads = vec![(embedding, grad_embedding)];
        for (w, (input, kept)) in layers.iter().zip(saved).rev() {
            let activations = kept.unwrap_or_else(|| forward_layer(&mut b, w, input, shapes));
            grad = backward_layer(&mut b, (w, &model), input, activations, (grad, shapes), &mut grads);
        }
        b.free(grad);
        b.free(token_ids);
        // Optimizer: Adam's two state tensors per weight appear at the first step and live forever; the first
        // moment updates the weight from its gradient.
        let state = adam.get_or_insert_with(|| {
            weights
                .iter()
                .map(|&(_, size)| {
                    let first_moment = b.alloc_forever(size);
                    b.alloc_forever(size);
                    first_moment
                })
                .collect()
        });
        for (&(weight, _), &moment) in weights.iter().zip(state.iter()) {
            if let Some(&(_, gradient)) = grads.iter().find(|(of, _)| *of == weight) {
                b.matvec(moment, gradient, weight);
            }
        }
        // zero_grad(set_to_none=True), in parameter order.
        for &(weight, _) in &weights {
            if let Some(&(_, gradient)) = grads.iter().find(|(of, _)| *of == weight) {
                b.free(gradient);
            }
        }
    }
    let name = format!(
        "train (batch {}{}, {} layers, hidden {}, sequences {}..{}), {} steps, seed {}",
        config.batch,
        if config.checkpointing { ", checkpointing" } else { "" },
        model.layers,
        model.hidden,
        model.seq_range.0,
        model.seq_range.1,
        config.steps,
        config.seed
    );
    b.finish(name)
}

/// A layer's forward activations from its input `x` (allocated and computed in order).
fn forward_layer(b: &mut StreamBuilder, w: &LayerWeights, x: u32, shapes: Shapes) -> Activations {
    let qkv = b.alloc(3 * shapes.hidden_bytes);
    b.matvec(w.qkv, x, qkv);
    let scores = b.alloc(shapes.scores_bytes);
    b.matvec(qkv, x, scores);
    let attn = b.alloc(shapes.hidden_bytes);
    b.matvec(w.out, scores, attn);
    let up = b.alloc(4 * shapes.hidden_bytes);
    b.matvec(w.up, attn, up);
    let act = b.alloc(4 * shapes.hidden_bytes);
    b.matvec(up, attn, act);
    Activations { qkv, scores, attn, up, act }
}

/// Frees a layer's activations, last allocated first.
fn free_activations(b: &mut StreamBuilder, a: Activations) {
    for id in [a.act, a.up, a.attn, a.scores, a.qkv] {
        b.free(id);
    }
}

/// A layer's backward from the gradient of its output: each activation freed once its gradient exists (last
/// allocated first), weight gradients pushed to `grads` as `(weight, gradient)`; returns the gradient of the
/// layer's input (the input itself is freed).
fn backward_layer(
    b: &mut StreamBuilder,
    (w, model): (&LayerWeights, &TrainModel),
    input: u32,
    a: Activations,
    (grad_out, shapes): (u32, Shapes),
    grads: &mut Vec<(u32, u32)>,
) -> u32 {
    let [qkv_bytes, out_bytes, up_bytes, down_bytes] = model.layer_weight_bytes();
    let steps = [
        (a.act, Some((w.down, down_bytes)), 4 * shapes.hidden_bytes),
        (a.up, None, 4 * shapes.hidden_bytes),
        (a.attn, Some((w.up, up_bytes)), shapes.hidden_bytes),
        (a.scores, Some((w.out, out_bytes)), shapes.scores_bytes),
        (a.qkv, None, 3 * shapes.hidden_bytes),
    ];
    let mut grad = grad_out;
    for (activation, weight, bytes) in steps {
        if let Some((weight, weight_bytes)) = weight {
            let weight_grad = b.alloc(weight_bytes);
            b.matvec(activation, grad, weight_grad);
            grads.push((weight, weight_grad));
        }
        let next = b.alloc(bytes);
        b.matvec(activation, grad, next);
        b.free(grad);
        b.free(activation);
        grad = next;
    }
    let qkv_grad = b.alloc(qkv_bytes);
    b.matvec(input, grad, qkv_grad);
    grads.push((w.qkv, qkv_grad));
    let grad_input = b.alloc(shapes.hidden_bytes);
    b.matvec(w.qkv, grad, grad_input);
    b.free(grad);
    b.free(input);
    grad_input
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Step;

    #[test]
    fn deterministic_and_well_formed() {
        let config = TrainConfig::new(3);
        let (a, b) = (train(&config), train(&config));
        assert_eq!(a, b);
        assert_ne!(a.steps, train(&TrainConfig { seed: 4, ..config }).steps, "another seed, other sequence lengths");
        let stats = a.check().unwrap();
        assert!(stats.matvecs > 100 && stats.copies == 0, "{stats:?}");
        // Weights (16 MiB) and Adam's state (32 MiB) live forever.
        assert_eq!(stats.forever_bytes, 48 << 20);
    }

    /// Frees in backward come in reverse order of the forward allocations: the first activation freed in a step
    /// is the last layer's MLP activation.
    #[test]
    fn backward_frees_in_reverse() {
        let workload = train(&TrainConfig { steps: 1, ..TrainConfig::new(1) });
        let allocs: Vec<u32> = workload
            .steps
            .iter()
            .filter_map(|step| if let Step::Alloc { id, forever: false, .. } = *step { Some(id) } else { None })
            .collect();
        // token ids, x, then per layer: qkv, scores, attn, up, act, out.
        let last_act = allocs[2 + 6 * 3 + 4];
        let first_activation_freed = workload.steps.iter().find_map(|step| match *step {
            Step::Free { id } if (allocs[2]..=last_act).contains(&id) => Some(id),
            _ => None,
        });
        assert_eq!(first_activation_freed, Some(last_act));
    }

    /// The two remedies lower peak live memory; more steps never lower it.
    #[test]
    fn checkpointing_and_a_smaller_batch_lower_the_peak() {
        let base = TrainConfig::new(1);
        let peak = |config: TrainConfig| train(&config).check().unwrap().peak_live_bytes;
        let default = peak(base);
        let checkpointed = peak(TrainConfig { checkpointing: true, ..base });
        let half = peak(TrainConfig { batch: 4, ..base });
        assert!(checkpointed * 3 < default * 2, "checkpointing: {checkpointed} vs {default}");
        assert!(half * 3 < default * 2, "batch 4: {half} vs {default}");
        assert!(default > TrainConfig::DEFAULT_BUDGET_BYTES && checkpointed < TrainConfig::DEFAULT_BUDGET_BYTES);
        assert!(half < TrainConfig::DEFAULT_BUDGET_BYTES);
        assert!(peak(TrainConfig { steps: 6, ..base }) >= default);
    }
}
