//! The counters of `torch.cuda.memory_stats()` (`DeviceStats` in `c10/core/CachingDeviceAllocator.h`) and
//! the text of `torch.cuda.memory_summary()` (`torch/cuda/memory.py`), byte for byte.
//!
//! Every [`Stat`] keeps PyTorch's four numbers: `current`, `peak`, `allocated` (total increases) and
//! `freed` (total decreases); a [`StatArray`] holds one per pool selection (`all`, `small_pool`,
//! `large_pool`, PyTorch's `StatType` order).
//!
//! The counters are PyTorch's `int64_t`: a counter that would pass `i64::MAX` (8 EiB) saturates there instead
//! of wrapping (a replayed trace can ask for more than a real device ever held). The summary table shows a
//! saturated cell as at least its value (`≥8192 PiB`) and says below the table that the figure is larger,
//! rather than print a wrong one.

use std::fmt::Write as _;

/// One counter, as `c10::CachingDeviceAllocator::Stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Stat {
    /// Current value.
    pub current: i64,
    /// Highest `current` seen.
    pub peak: i64,
    /// Sum of all increases.
    pub allocated: i64,
    /// Sum of all decreases.
    pub freed: i64,
}

impl Stat {
    /// `increase_stat`.
    pub fn increase(&mut self, amount: u64) {
        let amount = i64::try_from(amount).unwrap_or(i64::MAX);
        self.current = self.current.saturating_add(amount);
        self.peak = self.peak.max(self.current);
        self.allocated = self.allocated.saturating_add(amount);
    }

    /// `decrease_stat`.
    pub fn decrease(&mut self, amount: u64) {
        let amount = i64::try_from(amount).unwrap_or(i64::MAX);
        self.current = self.current.saturating_sub(amount);
        self.freed = self.freed.saturating_add(amount);
    }

    /// The counter of a state that starts at its current value: all of it allocated, nothing freed, its peak now (how
    /// a start state rebuilt from a recording counts).
    pub fn as_started(&mut self) {
        *self = Self { current: self.current, peak: self.current, allocated: self.current, freed: 0 };
    }
}

/// Which pool a counter counts (`StatType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatType {
    /// `all`.
    Aggregate = 0,
    /// `small_pool`.
    SmallPool = 1,
    /// `large_pool`.
    LargePool = 2,
}

/// A counter per [`StatType`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// The counter for `ty`.
    pub fn get(&self, ty: StatType) -> &Stat {
        &self.0[ty as usize]
    }

    /// The aggregate counter.
    pub fn all(&self) -> &Stat {
        &self.0[0]
    }

    /// Increases `all` and the pool's counter (`for_each_selected_stat_type`).
    pub fn increase(&mut self, small_pool: bool, amount: u64) {
        self.0[0].increase(amount);
        self.0[pool_index(small_pool)].increase(amount);
    }

    /// Each counter as started ([`Stat::as_started`]).
    pub fn as_started(&mut self) {
        self.0.iter_mut().for_each(Stat::as_started);
    }

    /// Decreases `all` and the pool's counter.
    pub fn decrease(&mut self, small_pool: bool, amount: u64) {
        self.0[0].decrease(amount);
        self.0[pool_index(small_pool)].decrease(amount);
    }
}

fn pool_index(small_pool: bool) -> usize {
    if small_pool { StatType::SmallPool as usize } else { StatType::LargePool as usize }
}

/// `torch.cuda.memory_stats()` of one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MemoryStats {
    /// `allocation`: live allocations.
    pub allocation: StatArray,
    /// `segment`: `cudaMalloc`ed segments.
    pub segment: StatArray,
    /// `active`: allocated or waiting for stream events.
    pub active: StatArray,
    /// `inactive_split`: free blocks inside split segments (non-releasable).
    pub inactive_split: StatArray,
    /// `allocated_bytes`.
    pub allocated_bytes: StatArray,
    /// `reserved_bytes`.
    pub reserved_bytes: StatArray,
    /// `active_bytes`.
    pub active_bytes: StatArray,
    /// `inactive_split_bytes` ("Non-releasable memory").
    pub inactive_split_bytes: StatArray,
    /// `requested_bytes`: what callers asked for, before rounding.
    pub requested_bytes: StatArray,
    /// `num_alloc_retries`: `cudaMalloc` retried after releasing the cache.
    pub num_alloc_retries: i64,
    /// `num_ooms`: out-of-memory errors raised.
    pub num_ooms: i64,
    /// `oversize_allocations`: live allocations of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// `oversize_segments`: segments of at least `max_split_size`.
    pub oversize_segments: Stat,
    /// `num_sync_all_streams`.
    pub num_sync_all_streams: i64,
    /// `num_device_alloc`: `cudaMalloc` calls plus expandable-segment maps.
    pub num_device_alloc: i64,
    /// `num_device_free`: `cudaFree` calls plus expandable-segment unmaps.
    pub num_device_free: i64,
}

impl MemoryStats {
    /// A value of `torch.cuda.memory_stats()` by its key (`"reserved_bytes.all.peak"`, `"num_ooms"`, ...).
    pub fn get(&self, key: &str) -> Option<i64> {
        let scalar = match key {
            "num_alloc_retries" => Some(self.num_alloc_retries),
            "num_ooms" => Some(self.num_ooms),
            "num_sync_all_streams" => Some(self.num_sync_all_streams),
            "num_device_alloc" => Some(self.num_device_alloc),
            "num_device_free" => Some(self.num_device_free),
            _ => None,
        };
        if scalar.is_some() {
            return scalar;
        }
        let mut parts = key.split('.');
        let name = parts.next()?;
        let (stat, field) = match name {
            "oversize_allocations" => (&self.oversize_allocations, parts.next()?),
            "oversize_segments" => (&self.oversize_segments, parts.next()?),
            _ => {
                let array = match name {
                    "allocation" => &self.allocation,
                    "segment" => &self.segment,
                    "active" => &self.active,
                    "inactive_split" => &self.inactive_split,
                    "allocated_bytes" => &self.allocated_bytes,
                    "reserved_bytes" => &self.reserved_bytes,
                    "active_bytes" => &self.active_bytes,
                    "inactive_split_bytes" => &self.inactive_split_bytes,
                    "requested_bytes" => &self.requested_bytes,
                    _ => return None,
                };
                let ty = match parts.next()? {
                    "all" => StatType::Aggregate,
                    "small_pool" => StatType::SmallPool,
                    "large_pool" => StatType::LargePool,
                    _ => return None,
                };
                (array.get(ty), parts.next()?)
            }
        };
        match field {
            "current" => Some(stat.current),
            "peak" => Some(stat.peak),
            "allocated" => Some(stat.allocated),
            "freed" => Some(stat.freed),
            _ => None,
        }
    }

    /// `torch.cuda.memory_summary(device)`: the same text, line for line.
    pub fn summary_table(&self, device: usize) -> String {
        let rule = |c: char| c.to_string().repeat(75);
        let mut lines: Vec<String> = vec![
            rule('='),
            format!(" {:16} PyTorch CUDA memory summary, device ID {device:<17} ", ""),
            rule('-'),
            format!("  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ", "", self.num_ooms, "", self.num_alloc_retries),
            rule('='),
            "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
        ];
        type Formatter = fn(i64, f64) -> String;
        let arrays: [(&StatArray, &str, Formatter); 9] = [
            (&self.allocated_bytes, "Allocated memory", format_size),
            (&self.active_bytes, "Active memory", format_size),
            (&self.requested_bytes, "Requested memory", format_size),
            (&self.reserved_bytes, "GPU reserved memory", format_size),
            (&self.inactive_split_bytes, "Non-releasable memory", format_size),
            (&self.allocation, "Allocations", format_count),
            (&self.active, "Active allocs", format_count),
            (&self.segment, "GPU reserved segments", format_count),
            (&self.inactive_split, "Non-releasable allocs", format_count),
        ];
        for (array, name, formatter) in arrays {
            lines.push(rule('-'));
            let pref = *array.all();
            for (ty, label) in [
                (StatType::Aggregate, name),
                (StatType::LargePool, "      from large pool"),
                (StatType::SmallPool, "      from small pool"),
            ] {
                let s = array.get(ty);
                lines.push(row(label, s, &pref, formatter));
            }
        }
        for (stat, name) in
            [(&self.oversize_allocations, "Oversize allocations"), (&self.oversize_segments, "Oversize GPU segments")]
        {
            lines.push(rule('-'));
            lines.push(row(name, stat, stat, format_count));
        }
        lines.push(rule('='));
        let mut out = String::from("|");
        out.push_str(&lines.join("|\n|"));
        out.push_str("|\n");
        if self.saturated() {
            out.push_str(SATURATED_NOTE);
            out.push('\n');
        }
        out
    }

    /// Whether a counter saturated at `i64::MAX` (PyTorch's `int64_t` cannot hold its true value).
    pub fn saturated(&self) -> bool {
        let arrays = [
            &self.allocation,
            &self.segment,
            &self.active,
            &self.inactive_split,
            &self.allocated_bytes,
            &self.reserved_bytes,
            &self.active_bytes,
            &self.inactive_split_bytes,
            &self.requested_bytes,
        ];
        let stats =
            arrays.into_iter().flat_map(|array| array.0.iter()).chain([&self.oversize_allocations, &self.oversize_segments]);
        let counts =
            [self.num_alloc_retries, self.num_ooms, self.num_sync_all_streams, self.num_device_alloc, self.num_device_free];
        stats.flat_map(|stat| [stat.current, stat.peak, stat.allocated, stat.freed]).chain(counts).any(|value| value == i64::MAX)
    }
}

/// The line under a summary table with a saturated counter.
const SATURATED_NOTE: &str =
    "≥: the counter saturated at PyTorch's int64 limit (2^63 - 1, 8 EiB for bytes); the true figure is larger";

/// A cell's value scaled by `divisor`; a counter saturated at `i64::MAX` shows as at least 2^63 so scaled.
fn scaled(value: i64, divisor: i64) -> String {
    if value == i64::MAX {
        format!("≥{}", (i128::from(value) + 1) / i128::from(divisor))
    } else {
        value.div_euclid(divisor).to_string()
    }
}

fn row(label: &str, s: &Stat, pref: &Stat, formatter: fn(i64, f64) -> String) -> String {
    let mut line = String::new();
    let _ = write!(
        line,
        " {label:<21} | {} | {} | {} | {} ",
        formatter(s.current, pref.current as f64),
        formatter(s.peak, pref.peak as f64),
        formatter(s.allocated, pref.allocated as f64),
        formatter(s.freed, pref.freed as f64),
    );
    line
}

/// `_format_size`: scales by 1024 while the reference value is at least 768 KiB of the current unit.
/// A saturated size shows as at least its value (`≥8192 PiB`).
fn format_size(size: i64, mut pref: f64) -> String {
    let prefixes = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut prefix = prefixes[0];
    let mut divisor = 1_i64;
    for next in &prefixes[1..] {
        if pref < 768.0 * 1024.0 {
            break;
        }
        prefix = next;
        divisor *= 1024;
        pref /= 1024.0;
    }
    format!("{:>6} {prefix}", scaled(size, divisor))
}

/// `_format_count`: scales by 1000 while the reference value is at least 750 000.
/// A saturated count shows as at least its value.
fn format_count(count: i64, mut pref: f64) -> String {
    let prefixes = [" ", "K", "M"];
    let mut prefix = prefixes[0];
    let mut divisor = 1_i64;
    for next in &prefixes[1..] {
        if pref < 750.0 * 1000.0 {
            break;
        }
        prefix = next;
        divisor *= 1000;
        pref /= 1000.0;
    }
    format!("{:>7} {prefix} ", scaled(count, divisor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_python() {
        assert_eq!(format_size(0, 0.0), "     0 B  ");
        assert_eq!(format_size(66560 * 1024, 66560.0 * 1024.0), " 66560 KiB");
        assert_eq!(format_size(3000 << 20, (3000u64 << 20) as f64), "  3000 MiB");
        assert_eq!(format_size(0, (3000u64 << 20) as f64), "     0 MiB");
        assert_eq!(format_count(824, 824.0), "    824   ");
        assert_eq!(format_count(1_500_000, 1_500_000.0), "   1500 K ");
    }

    #[test]
    fn summary_of_exabytes_saturates_and_says_so() {
        // 12 EiB asked of a stat: PyTorch's int64 saturates; the cell says "at least 8 EiB", never 8191 PiB.
        let mut stats = MemoryStats::default();
        for _ in 0..3 {
            stats.allocated_bytes.increase(false, 4 << 60);
        }
        assert_eq!(stats.allocated_bytes.all().current, i64::MAX);
        assert_eq!(format_size(i64::MAX, i64::MAX as f64), " ≥8192 PiB");
        assert_eq!(format_size(4 << 60, (4_u64 << 60) as f64), "  4096 PiB");
        assert_eq!(format_count(i64::MAX, 1.0), "≥9223372036854775808   ");
        let table = stats.summary_table(0);
        let row = table.lines().find(|line| line.starts_with("| Allocated memory")).unwrap();
        assert_eq!(row, "| Allocated memory      |  ≥8192 PiB |  ≥8192 PiB |  ≥8192 PiB |      0 B   |");
        assert!(!table.contains("8191 PiB"), "{table}");
        assert!(table.ends_with(&format!("|\n{SATURATED_NOTE}\n")), "{table}");
        assert!(!MemoryStats::default().summary_table(0).contains(SATURATED_NOTE));
    }

    #[test]
    fn stat_counts_peak_and_totals() {
        let mut s = StatArray::default();
        s.increase(true, 10);
        s.increase(false, 5);
        s.decrease(true, 10);
        assert_eq!(*s.all(), Stat { current: 5, peak: 15, allocated: 15, freed: 10 });
        assert_eq!(s.get(StatType::SmallPool).peak, 10);
    }
}
