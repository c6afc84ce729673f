//! Arguments shared by the commands: policy selection and heap rules.

use clap::Args;
use heapscope_core::units::{Bytes, exact_size, parse_size};
use heapscope_core::{HeapConfig, PolicyConfig, PolicyKind, ReleaseRule};
use heapscope_gui::session::{OpenOptions, RuleOverrides};

use crate::flag_reach::{Flag, Reach};

/// `--capacity` and `--budget`: a size ([`parse_size`]) no larger than the largest device heapscope models (1 EiB,
/// `LARGEST_DEVICE_BYTES`): a larger one would be simulated as that device, and answers would name a device it is not
/// (a budget past it let `paged` map 1.5 EiB that no device holds).
pub fn parse_capacity(text: &str) -> Result<u64, String> {
    let bytes = parse_size(text).map_err(|error| error.to_string())?;
    if bytes > heapscope_core::LARGEST_DEVICE_BYTES {
        // Both exact: rounded for reading, a size just past the largest read as equal to it.
        return Err(format!(
            "{} is more than the largest device heapscope models, {}",
            exact_size(bytes),
            exact_size(heapscope_core::LARGEST_DEVICE_BYTES)
        ));
    }
    Ok(bytes)
}

/// `--capacity`: a device's memory, as [`parse_capacity`] reads it, and more than nothing (a device of 0 B refused every
/// request, its map a row of 64 B).
///
/// # Errors
/// What [`parse_capacity`] refuses, and 0.
pub fn parse_device_capacity(text: &str) -> Result<u64, String> {
    match parse_capacity(text)? {
        0 => Err("0 B: a device of no memory holds nothing (give its size, e.g. `80GB`)".to_owned()),
        bytes => Ok(bytes),
    }
}

/// Which policies to run and how the heap reserves blocks.
#[derive(Debug, Clone, Default, Args)]
pub struct HeapArgs {
    /// Policies to run (repeat the flag; default: all). See `heapscope policies`.
    #[arg(long = "policy", value_name = "NAME")]
    pub policies: Vec<PolicyKind>,
    #[command(flatten)]
    pub rules: HeapRules,
}

/// Which device of a recording replays, on how much memory, by which heap rules: `heapscope gui` and
/// `heapscope render`.
#[derive(Debug, Clone, Default, Args)]
pub struct OpenArgs {
    /// Device memory for a file's replay (e.g. `3584MiB`, `14GiB`); by default what the recording's `oom` entry tells
    /// (the bytes PyTorch held then plus the driver's free bytes), else unlimited (a story brings its own).
    #[arg(long, value_name = "SIZE", value_parser = crate::options::parse_device_capacity)]
    pub capacity: Option<u64>,
    /// Which device of a PyTorch snapshot (default: the one that ran out of memory, else the one with the most trace
    /// entries).
    #[arg(long, value_name = "N")]
    pub device: Option<usize>,
    /// The heap contenders' preferred block size (default 256 MiB, or the story's).
    #[arg(long, value_name = "SIZE", value_parser = parse_nonzero_size)]
    pub block_size: Option<u64>,
    /// Requests of at least this size that no block has room for get a block of their own (default 128 MiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub dedicated_threshold: Option<u64>,
    /// When empty blocks go back to the device: immediately, keep-one, on-pressure or never.
    #[arg(long, value_name = "RULE")]
    pub release: Option<ReleaseRule>,
    /// PyTorch's settings in PYTORCH_CUDA_ALLOC_CONF syntax (e.g. `max_split_size_mb:128`).
    #[arg(long, value_name = "STR")]
    pub alloc_conf: Option<String>,
    /// Page size of the `paged` contender (default 2 MiB; a power of two).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub page_size: Option<u64>,
}

impl OpenArgs {
    /// How the app opens files with these flags.
    ///
    /// # Errors
    /// A page size that is not a power of two.
    pub fn open_options(&self) -> anyhow::Result<OpenOptions> {
        if let Some(bytes) = self.page_size.filter(|bytes| !bytes.is_power_of_two()) {
            anyhow::bail!("--page-size {}: not a power of two", Bytes(bytes));
        }
        let rules = RuleOverrides {
            block_size_bytes: self.block_size,
            dedicated_threshold_bytes: self.dedicated_threshold,
            release: self.release,
            alloc_conf: self.alloc_conf.clone(),
            page_bytes: self.page_size,
        };
        Ok(OpenOptions { device: self.device, capacity_bytes: self.capacity, rules })
    }

    /// The rule flags as given, each with what it changes (see [`crate::flag_reach`]).
    pub fn flags(&self) -> [Flag; 5] {
        [
            (self.block_size.is_some(), "--block-size", Reach::Heaps),
            (self.dedicated_threshold.is_some(), "--dedicated-threshold", Reach::Heaps),
            (self.release.is_some(), "--release", Reach::Heaps),
            (self.alloc_conf.is_some(), "--alloc-conf", Reach::Pytorch),
            (self.page_size.is_some(), "--page-size", Reach::Paged),
        ]
    }

    /// Whether the device or the memory was given.
    pub fn any(&self) -> bool {
        self.capacity.is_some() || self.device.is_some()
    }
}

/// A size that must be a power of two (an alignment): refused where clap reads it, naming the flag.
///
/// # Errors
/// What [`parse_size`] refuses, or a size that is no power of two.
pub fn parse_power_of_two(text: &str) -> Result<u64, String> {
    let bytes = parse_size(text).map_err(|error| error.to_string())?;
    if bytes.is_power_of_two() { Ok(bytes) } else { Err(format!("{} is not a power of two", exact_size(bytes))) }
}

/// A size that must not be 0 (a block's).
///
/// # Errors
/// What [`parse_size`] refuses, or 0.
pub fn parse_nonzero_size(text: &str) -> Result<u64, String> {
    match parse_size(text).map_err(|error| error.to_string())? {
        0 => Err("0 bytes: nothing fits".to_owned()),
        bytes => Ok(bytes),
    }
}

/// How a heap reserves blocks.
#[derive(Debug, Clone, Args)]
pub struct HeapRules {
    /// Preferred size of a shared block.
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_nonzero_size)]
    pub block_size: u64,
    /// Requests of at least this size that no reserved block has room for get a block of their own.
    #[arg(long, value_name = "SIZE", default_value = "128MiB", value_parser = parse_size)]
    pub dedicated_threshold: u64,
    /// When empty blocks go back to the device: immediately, keep-one, on-pressure or never [default: keep-one; the
    /// demo's blocks: on-pressure, PyTorch's caching]. An `empty_cache` entry gives every empty block back whatever the
    /// rule.
    #[arg(long, value_name = "RULE")]
    pub release: Option<ReleaseRule>,
    /// Every shared block has --block-size: no growth from an eighth of it while the heap is small (VMA's rule).
    #[arg(long)]
    pub fixed_blocks: bool,
    /// A budget: the most bytes a contender reserves at once (replaying a recording, every contender but PyTorch's
    /// emulation, which runs on the device capacity and its own settings; in `bench`, every contender, PyTorch's too).
    #[arg(long, value_name = "SIZE", value_parser = parse_capacity)]
    pub budget: Option<u64>,
    /// Every offset and size in the heap contenders' blocks is a multiple of this (a power of two; `paged` places
    /// by the requests' alignment: --align where a command has it, 512 B in `bench`).
    #[arg(long, value_name = "SIZE", default_value = "256", value_parser = parse_power_of_two)]
    pub min_align: u64,
}

impl Default for HeapRules {
    fn default() -> Self {
        let config = HeapConfig::new(PolicyKind::Tlsf);
        Self {
            block_size: config.block_size_bytes,
            dedicated_threshold: config.dedicated_threshold_bytes,
            release: None,
            fixed_blocks: false,
            budget: None,
            min_align: PolicyConfig::default().min_align_bytes,
        }
    }
}

impl HeapArgs {
    /// The selected policies, all when none was named.
    pub fn policies(&self) -> Vec<PolicyKind> {
        if self.policies.is_empty() { PolicyKind::ALL.to_vec() } else { self.policies.clone() }
    }
}

impl HeapRules {
    /// The heap settings for `policy`.
    pub fn heap_config(&self, policy: PolicyKind) -> HeapConfig {
        HeapConfig {
            policy_config: PolicyConfig { min_align_bytes: self.min_align, ..PolicyConfig::default() },
            block_size_bytes: self.block_size,
            dedicated_threshold_bytes: self.dedicated_threshold,
            release: self.release(ReleaseRule::default()),
            capacity_bytes: self.budget,
            grow_blocks: !self.fixed_blocks,
            ..HeapConfig::new(policy)
        }
    }

    /// The release rule given, else `default`.
    pub fn release(&self, default: ReleaseRule) -> ReleaseRule {
        self.release.unwrap_or(default)
    }

    /// The heap rules in one line, with `release` as the rule in force.
    pub fn describe(&self, release: ReleaseRule) -> String {
        let budget = self.budget.map_or_else(|| "no budget".to_owned(), |budget| format!("budget {}", Bytes(budget)));
        let growth = if self.fixed_blocks { "" } else { " (new ones from an eighth while the heap is small)" };
        format!(
            "blocks of {}{growth}, dedicated blocks from {}, release {release}, {budget}",
            Bytes(self.block_size),
            Bytes(self.dedicated_threshold),
        )
    }
}

/// Prints the policies with a line each.
pub fn print_policies() {
    for kind in PolicyKind::ALL {
        let what = match kind {
            PolicyKind::Tlsf => "two-level segregated fit: O(1) allocate and free, immediate coalescing",
            PolicyKind::BestFit => "the tightest size class holding a free run that fits, its lowest-addressed run",
            PolicyKind::FirstFit => "lowest-addressed free run that fits",
            PolicyKind::Buddy => "power-of-two blocks split in halves, merged with their buddies",
            PolicyKind::Linear(heapscope_core::LinearMode::Bump) => "bump pointer, reset when everything is freed",
            PolicyKind::Linear(heapscope_core::LinearMode::Stack) => "bump pointer, frees pop the top (LIFO)",
            PolicyKind::Linear(heapscope_core::LinearMode::Ring) => "bump pointer wrapping around, frees oldest first (FIFO)",
            PolicyKind::Slab => "power-of-two size classes in 1 MiB slab pages for requests up to 64 KiB, TLSF beyond",
        };
        outln!("{:<13} {what}", kind.name());
    }
}
