//! `churn`: random sizes and lifetimes, the classic allocator stress. Each step allocates a size drawn
//! log-uniformly between `size_range` bounds (as many small as large), to live an exponentially distributed number
//! of steps; allocations whose time is up are freed first. Every few steps a matvec reads two live allocations
//! and writes a third.

use std::collections::BTreeMap;

use super::{Rng, StreamBuilder, Workload};

/// The knobs of [`churn`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChurnConfig {
    /// Steps (one allocation each).
    pub steps: u32,
    /// The seed.
    pub seed: u64,
    /// Smallest and largest allocation (bytes).
    pub size_range: (u64, u64),
    /// Mean lifetime, in steps.
    pub mean_lifetime: f64,
    /// A matvec every this many steps.
    pub compute_every: u32,
}

impl ChurnConfig {
    /// Steps by default.
    pub const DEFAULT_STEPS: u32 = 2000;
    /// The default budget: about 1.1x the stream's peak live bytes (about 102 MiB with the default seed).
    pub const DEFAULT_BUDGET_BYTES: u64 = 112 << 20;
    /// What the default budget shows.
    pub const STORY: &'static str = "random sizes and lifetimes with 10 % headroom: segments and blocks fragment, pages do not";

    /// The defaults with `seed`: 4 KiB to 4 MiB, mean lifetime 100 steps, a matvec every 4 steps.
    pub fn new(seed: u64) -> Self {
        Self { steps: Self::DEFAULT_STEPS, seed, size_range: (4 << 10, 4 << 20), mean_lifetime: 100.0, compute_every: 4 }
    }
}

/// The churn stream. See the module documentation.
pub fn churn(config: &ChurnConfig) -> Workload {
    let mut rng = Rng::new(config.seed);
    let mut b = StreamBuilder::default();
    // Step at which each live allocation dies -> ids (in allocation order).
    let mut deaths: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut live: Vec<u32> = Vec::new();
    for step in 0..u64::from(config.steps) {
        while let Some(entry) = deaths.first_entry() {
            if *entry.key() > step {
                break;
            }
            for id in entry.remove() {
                live.retain(|&other| other != id);
                b.free(id);
            }
        }
        let size = rng.log_uniform(config.size_range.0, config.size_range.1).next_multiple_of(256);
        let id = b.alloc(size);
        live.push(id);
        deaths.entry(step + rng.exponential(config.mean_lifetime)).or_default().push(id);
        if config.compute_every > 0 && step % u64::from(config.compute_every) == 0 && live.len() >= 3 {
            let pick = |rng: &mut Rng| live[rng.range(0, live.len() as u64 - 1) as usize];
            let (matrix, input, output) = (pick(&mut rng), pick(&mut rng), pick(&mut rng));
            if output != matrix && output != input {
                b.matvec(matrix, input, output);
            }
        }
    }
    for (_, ids) in deaths {
        for id in ids {
            b.free(id);
        }
    }
    let name = format!(
        "churn ({} KiB to {} MiB, mean lifetime {} steps), {} steps, seed {}",
        config.size_range.0 >> 10,
        config.size_range.1 >> 20,
        config.mean_lifetime,
        config.steps,
        config.seed
    );
    b.finish(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Step;

    #[test]
    fn deterministic_and_well_formed() {
        let config = ChurnConfig::new(9);
        let workload = churn(&config);
        assert_eq!(workload, churn(&config));
        assert_ne!(workload.steps, churn(&ChurnConfig { seed: 10, ..config }).steps);
        let stats = workload.check().unwrap();
        assert_eq!((stats.allocs, stats.frees, stats.forever_bytes), (2000, 2000, 0));
        assert!(stats.matvecs > 300, "{stats:?}");
        let sizes: Vec<u64> = workload
            .steps
            .iter()
            .filter_map(|step| if let Step::Alloc { size_bytes, .. } = *step { Some(size_bytes) } else { None })
            .collect();
        assert!(sizes.iter().all(|&size| (4 << 10..=4 << 20).contains(&size)));
        // Log-uniform: about as many below 128 KiB as above.
        let small = sizes.iter().filter(|&&size| size < 128 << 10).count();
        assert!((800..1200).contains(&small), "{small} of 2000 below 128 KiB");
    }

    #[test]
    fn longer_lifetimes_raise_the_peak() {
        let peak = |mean_lifetime| churn(&ChurnConfig { mean_lifetime, ..ChurnConfig::new(1) }).check().unwrap().peak_live_bytes;
        assert!(peak(200.0) > peak(100.0));
        assert!(peak(100.0) < ChurnConfig::DEFAULT_BUDGET_BYTES);
    }
}
