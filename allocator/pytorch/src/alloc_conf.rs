//! The caching allocator's settings (`PYTORCH_CUDA_ALLOC_CONF`), as PyTorch's `CUDAAllocatorConfig` holds
//! them (`c10/cuda/CUDAAllocatorConfig.cpp`, `c10/core/AllocatorConfig.cpp`).
//!
//! [`AllocConf::from_recorded`] takes the settings a snapshot recorded (`allocator_settings`);
//! [`AllocConf::parse_overrides`] applies a `PYTORCH_CUDA_ALLOC_CONF` string on top, with PyTorch's syntax
//! and range checks as in `AllocatorConfig::parseArgs` (`c10/core/AllocatorConfig.cpp`):
//! `max_split_size_mb` / `max_non_split_rounding_mb` at least 20, `garbage_collection_threshold` in
//! (0, 1), `roundup_power2_divisions` a power of two, or a list `[interval_mb:divisions,...,>:divisions]`
//! (divisions a power of two or 0). As PyTorch since 2.9 (`AcceleratorAllocatorConfig::parseRoundUpPower2Divisions`),
//! a list starts from no rounding, the first interval named also sets the ones below it, and `>` sets the intervals
//! *after* the last one named: `[256:1,512:2,1024:4,>:8]` (PyTorch's documented example) rounds 1 GiB .. 2 GiB to 4
//! divisions and 8 from 2 GiB on. PyTorch 2.8 and earlier let `>` overwrite the last named interval too.

use super::snapshot::RecordedSettings;

/// One MiB.
const MIB: u64 = 1 << 20;

/// Number of `roundup_power2_divisions` intervals (`kRoundUpPowerOfTwoIntervals`): 1 MiB .. 64 GiB.
pub const ROUNDUP_INTERVALS: usize = 16;

/// `kLargeBuffer`, the default `max_non_split_rounding` and the floor of `max_split_size`; also the page an expandable
/// segment of the large pool maps at a time.
pub const LARGE_BUFFER_BYTES: u64 = 20 * MIB;

/// Settings of the caching allocator that change its decisions.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AllocConf {
    /// `max_split_size`: blocks at least this large are never split (`None` = unlimited, the default).
    pub max_split_size: Option<u64>,
    /// `roundup_power2_divisions` per interval: index 0 for sizes below 2 MiB, index `i` for
    /// `[2^i MiB, 2^(i+1) MiB)`, the last for everything above. 0 = off; a 1 is read as 0 (PyTorch rounds only with
    /// more than one division), so that settings the same in effect compare equal.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// `garbage_collection_threshold` (0 = off); acts only with a memory fraction (here: a capacity).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `max_non_split_rounding`: an oversize block serves a request only when it exceeds it by less than
    /// this (20 MiB by default, `max_non_split_rounding_mb`).
    pub max_non_split_rounding: u64,
    /// `per_process_memory_fraction` (PyTorch 2.10 and later; `torch.cuda.set_per_process_memory_fraction` sets the
    /// same): the allocator refuses to reserve beyond this share of the device ([`AllocConf::allowed_bytes`]), and
    /// garbage collection measures its threshold against that share. `None`: not set (the whole device).
    pub per_process_memory_fraction: Option<f64>,
}

impl Default for AllocConf {
    fn default() -> Self {
        AllocConf {
            max_split_size: None,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            max_non_split_rounding: LARGE_BUFFER_BYTES,
            per_process_memory_fraction: None,
        }
    }
}

/// A `PYTORCH_CUDA_ALLOC_CONF` string that PyTorch would refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocConfError {
    /// The key is not one of PyTorch's.
    #[error("unknown PYTORCH_CUDA_ALLOC_CONF key `{key}`")]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A setting that is not `key:value` (an empty one between commas, one without a colon).
    #[error("PYTORCH_CUDA_ALLOC_CONF `{text}`: {why}")]
    Malformed {
        /// The whole string, or the setting, as written.
        text: String,
        /// What PyTorch requires.
        why: &'static str,
    },
    /// The value does not fit the key.
    #[error("bad value `{value}` for PYTORCH_CUDA_ALLOC_CONF key `{key}`: {why}")]
    BadValue {
        /// The key.
        key: String,
        /// The value as written.
        value: String,
        /// What PyTorch requires.
        why: &'static str,
    },
}

impl AllocConf {
    /// The settings `snapshot` was recorded with: the ones it records; else (a file written before PyTorch recorded
    /// its settings) PyTorch's defaults, with expandable segments where the file shows them
    /// ([`crate::Snapshot::shows_expandable_segments`]). Recorded settings are kept as they are, even against what
    /// the file shows: they are the value at the end of the recording, which a program may have changed while it ran
    /// (`torch.cuda.memory._set_allocator_settings`).
    pub fn of_snapshot(snapshot: &crate::Snapshot) -> AllocConf {
        match &snapshot.settings {
            Some(settings) => AllocConf::from_recorded(settings),
            None => AllocConf { expandable_segments: AllocConf::expandable_from_file(snapshot), ..AllocConf::default() },
        }
    }

    /// Whether [`AllocConf::of_snapshot`] turns expandable segments on from what `snapshot` shows rather than from a
    /// recorded setting: a file that records no settings and shows expandable segments.
    pub fn expandable_from_file(snapshot: &crate::Snapshot) -> bool {
        snapshot.settings.is_none() && snapshot.shows_expandable_segments()
    }

    /// The settings a snapshot recorded: its dictionary, and from the `PYTORCH_CUDA_ALLOC_CONF` string it recorded
    /// beside it the settings the dictionary leaves out (`max_non_split_rounding_mb`, `per_process_memory_fraction`;
    /// a part of the string this reader refuses, a later PyTorch's key perhaps, is passed over).
    pub fn from_recorded(settings: &RecordedSettings) -> AllocConf {
        let mut told = AllocConf::default();
        for item in split_top_level(&settings.alloc_conf) {
            // Best effort: each item alone, as the dictionary already holds what PyTorch accepted.
            let _ = told.parse_overrides(item);
        }
        let mut conf = AllocConf {
            max_split_size: settings.max_split_size,
            garbage_collection_threshold: settings.garbage_collection_threshold,
            expandable_segments: settings.expandable_segments,
            max_non_split_rounding: told.max_non_split_rounding,
            per_process_memory_fraction: told.per_process_memory_fraction,
            ..AllocConf::default()
        };
        for &(interval_mb, divisions) in &settings.roundup_power2_divisions {
            if let Some(index) = interval_index(interval_mb) {
                conf.roundup_power2_divisions[index] = rounding(divisions);
            }
        }
        conf
    }

    /// Whether the `PYTORCH_CUDA_ALLOC_CONF` string a snapshot recorded, read alone, is the settings in effect (its
    /// dictionary's, [`AllocConf::from_recorded`]). Not always: PyTorch records the last string it parsed, and each
    /// parse resets some keys but not `expandable_segments`, so a program run with `expandable_segments:True` that
    /// later sets `max_split_size_mb:1024` records that string beside expandable segments in effect.
    pub fn recorded_string_in_effect(settings: &RecordedSettings) -> bool {
        let mut told = AllocConf::default();
        for item in split_top_level(&settings.alloc_conf) {
            let _ = told.parse_overrides(item);
        }
        let recorded = AllocConf::from_recorded(settings);
        // A list with `>` meant otherwise before PyTorch 2.9 (see the module's documentation): the keys say which.
        if settings.alloc_conf.contains('>') {
            told.roundup_power2_divisions = recorded.roundup_power2_divisions;
        }
        told == recorded
    }

    /// What the allocator may reserve on a device of `capacity_bytes` (`None`: unlimited): PyTorch's
    /// `allowed_memory_maximum`, the device times [`AllocConf::per_process_memory_fraction`] where one below 1 is set.
    pub fn allowed_bytes(&self, capacity_bytes: Option<u64>) -> Option<u64> {
        match self.per_process_memory_fraction {
            Some(fraction) if fraction < 1.0 => capacity_bytes.map(|bytes| (bytes as f64 * fraction) as u64),
            _ => capacity_bytes,
        }
    }

    /// `roundup_power2_divisions(size)` of `CUDAAllocatorConfig`: the divisions for the interval holding
    /// `size_bytes`.
    pub fn divisions_for(&self, size_bytes: u64) -> u64 {
        let log_size = u64::from(63 - size_bytes.max(1).leading_zeros());
        let index = log_size.saturating_sub(20).min(ROUNDUP_INTERVALS as u64 - 1);
        self.roundup_power2_divisions[index as usize]
    }

    /// Applies a `PYTORCH_CUDA_ALLOC_CONF` string (`key:value,key:value`) on top of these settings.
    /// Keys PyTorch knows but that do not change placement decisions (`backend:native`, `pinned_*`,
    /// `release_lock_on_cudamalloc`, ...) are accepted and ignored; another backend (`cudaMallocAsync`) is refused: its
    /// placements are not the caching allocator's.
    pub fn parse_overrides(&mut self, s: &str) -> Result<(), AllocConfError> {
        // PyTorch's tokenizer drops every space; a comma may end the string but not stand alone.
        let s: String = s.chars().filter(|&c| c != ' ').collect();
        let items = split_top_level(&s);
        for (index, item) in items.iter().enumerate() {
            let item = item.trim();
            if item.is_empty() {
                if index + 1 == items.len() {
                    continue;
                }
                return Err(AllocConfError::Malformed {
                    text: s.clone(),
                    why: "a setting is empty: expected `key:value` between commas",
                });
            }
            let (key, value) = match item.split_once(':') {
                Some((k, v)) => (k.trim(), v.trim()),
                None => return Err(AllocConfError::Malformed { text: item.to_owned(), why: "expected `key:value`" }),
            };
            match key {
                "max_split_size_mb" => {
                    let mb = parse_u64(key, value)?;
                    if mb < LARGE_BUFFER_BYTES / MIB {
                        return Err(bad(key, value, "must be >= 20 (MiB)"));
                    }
                    self.max_split_size = Some(mb.saturating_mul(MIB));
                }
                "max_non_split_rounding_mb" => {
                    let mb = parse_u64(key, value)?;
                    if mb < LARGE_BUFFER_BYTES / MIB {
                        return Err(bad(key, value, "must be >= 20 (MiB)"));
                    }
                    self.max_non_split_rounding = mb.saturating_mul(MIB);
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value.parse().map_err(|_| bad(key, value, "expected a number"))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad(key, value, "must lie in (0.0, 1.0)"));
                    }
                    self.garbage_collection_threshold = t;
                }
                "expandable_segments" => {
                    self.expandable_segments = match value {
                        "True" => true,
                        "False" => false,
                        _ => return Err(bad(key, value, "expected True or False")),
                    };
                }
                "roundup_power2_divisions" => self.parse_roundup(key, value)?,
                // `cudaMallocAsync` is CUDA's stream-ordered pool, not the caching allocator emulated here.
                "backend" if value != "native" => {
                    return Err(bad(
                        key,
                        value,
                        "heapscope emulates PyTorch's native caching allocator only (backend:native); cudaMallocAsync \
                         leaves placement to CUDA's stream-ordered pool, which is not emulated",
                    ));
                }
                "per_process_memory_fraction" => {
                    let fraction: f64 = value.parse().map_err(|_| bad(key, value, "expected a number"))?;
                    if !(0.0..=1.0).contains(&fraction) {
                        return Err(bad(key, value, "must lie in [0.0, 1.0]"));
                    }
                    self.per_process_memory_fraction = (fraction < 1.0).then_some(fraction);
                }
                // Keys that change no placement, checked as PyTorch checks them.
                "backend" => {}
                "release_lock_on_cudamalloc"
                | "release_lock_on_hipmalloc"
                | "pinned_use_hip_host_register"
                | "pinned_use_cuda_host_register"
                | "pinned_use_background_threads"
                | "graph_capture_record_stream_reuse" => {
                    if !matches!(value, "True" | "False") {
                        return Err(bad(key, value, "expected True or False"));
                    }
                }
                "pinned_num_register_threads" => {
                    let threads = parse_u64(key, value)?;
                    if !threads.is_power_of_two() || threads > 128 {
                        return Err(bad(key, value, "must be a power of two, at most 128"));
                    }
                }
                "pinned_reserve_segment_size_mb" => {
                    if parse_u64(key, value)? == 0 {
                        return Err(bad(key, value, "must be above 0"));
                    }
                }
                _ => return Err(AllocConfError::UnknownKey { key: key.to_string() }),
            }
        }
        Ok(())
    }

    /// These settings as a `PYTORCH_CUDA_ALLOC_CONF` string: the keys whose values differ from PyTorch's defaults, in
    /// a fixed order (`""` for the defaults). [`AllocConf::parse_overrides`] over the defaults gives them back.
    pub fn overrides(&self) -> String {
        let mut keys = Vec::new();
        if self.expandable_segments {
            keys.push("expandable_segments:True".to_owned());
        }
        if let Some(bytes) = self.max_split_size {
            keys.push(format!("max_split_size_mb:{}", bytes / MIB));
        }
        let divisions = &self.roundup_power2_divisions;
        if divisions.iter().any(|&n| n > 1) {
            if divisions.iter().all(|&n| n == divisions[0]) {
                keys.push(format!("roundup_power2_divisions:{}", divisions[0]));
            } else {
                let intervals: Vec<String> = (0..ROUNDUP_INTERVALS).map(|i| format!("{}:{}", 1u64 << i, divisions[i])).collect();
                keys.push(format!("roundup_power2_divisions:[{}]", intervals.join(",")));
            }
        }
        if self.garbage_collection_threshold > 0.0 {
            keys.push(format!("garbage_collection_threshold:{}", self.garbage_collection_threshold));
        }
        if self.max_non_split_rounding != LARGE_BUFFER_BYTES {
            keys.push(format!("max_non_split_rounding_mb:{}", self.max_non_split_rounding / MIB));
        }
        if let Some(fraction) = self.per_process_memory_fraction {
            keys.push(format!("per_process_memory_fraction:{fraction}"));
        }
        keys.join(",")
    }

    /// `roundup_power2_divisions:N` or `[interval_mb:N,...,>:N]` (`parseRoundUpPower2Divisions`).
    fn parse_roundup(&mut self, key: &str, value: &str) -> Result<(), AllocConfError> {
        let Some(list) = value.strip_prefix('[') else {
            let n = parse_pow2(key, value)?;
            self.roundup_power2_divisions = [rounding(n); ROUNDUP_INTERVALS];
            return Ok(());
        };
        let Some(list) = list.strip_suffix(']') else {
            return Err(bad(key, value, "missing `]`"));
        };
        // PyTorch starts a list from no rounding in every interval.
        self.roundup_power2_divisions = [0; ROUNDUP_INTERVALS];
        let mut last_index: Option<usize> = None;
        for entry in list.split(',') {
            let Some((interval, divisions)) = entry.split_once(':') else {
                return Err(bad(key, value, "expected `interval_mb:divisions` entries"));
            };
            let n = parse_u64(key, divisions.trim())?;
            if n != 0 && !n.is_power_of_two() {
                return Err(bad(key, value, "divisions must be a power of two or 0"));
            }
            let n = rounding(n);
            if interval.trim() == ">" {
                // PyTorch fills the intervals after the last one named (after the first interval when none was).
                let from = last_index.unwrap_or(0) + 1;
                for d in &mut self.roundup_power2_divisions[from.min(ROUNDUP_INTERVALS)..] {
                    *d = n;
                }
            } else {
                let mb = parse_u64(key, interval.trim())?;
                if !mb.is_power_of_two() {
                    return Err(bad(key, value, "intervals must be powers of two (MiB)"));
                }
                let index = (mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                if last_index.is_none() {
                    for d in &mut self.roundup_power2_divisions[..index] {
                        *d = n;
                    }
                }
                self.roundup_power2_divisions[index] = n;
                last_index = Some(index);
            }
        }
        Ok(())
    }
}

/// Index of the interval that starts at `interval_mb` MiB (the recorded dictionary's keys).
fn interval_index(interval_mb: u64) -> Option<usize> {
    interval_mb.is_power_of_two().then(|| (interval_mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1))
}

/// The `key:value` items of a `PYTORCH_CUDA_ALLOC_CONF` string, as [`AllocConf::parse_overrides`] splits it (at commas
/// outside brackets: a `roundup_power2_divisions` list is one item), empty ones left out.
pub fn items_of(setting: &str) -> Vec<&str> {
    split_top_level(setting).into_iter().filter(|item| !item.trim().is_empty()).collect()
}

/// Splits at commas outside brackets.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn bad(key: &str, value: &str, why: &'static str) -> AllocConfError {
    AllocConfError::BadValue { key: key.to_string(), value: value.to_string(), why }
}

fn parse_u64(key: &str, value: &str) -> Result<u64, AllocConfError> {
    value.parse().map_err(|_| bad(key, value, "expected a non-negative integer"))
}

/// Divisions as held: 1 as 0, both no rounding (`round_size` rounds only with `divisions > 1`).
fn rounding(divisions: u64) -> u64 {
    if divisions <= 1 { 0 } else { divisions }
}

fn parse_pow2(key: &str, value: &str) -> Result<u64, AllocConfError> {
    let n = parse_u64(key, value)?;
    if n.is_power_of_two() { Ok(n) } else { Err(bad(key, value, "divisions must be a power of two")) }
}

#[cfg(test)]
mod tests {

    /// A setting written back is the canonical string, and parses to the same settings.
    #[test]
    fn overrides_write_back_what_parses() {
        let canonical = [
            "",
            "expandable_segments:True",
            "max_split_size_mb:128",
            "expandable_segments:True,max_split_size_mb:256,garbage_collection_threshold:0.6",
            "roundup_power2_divisions:4",
            "max_non_split_rounding_mb:64",
        ];
        for text in canonical {
            let mut conf = AllocConf::default();
            conf.parse_overrides(text).unwrap();
            assert_eq!(conf.overrides(), text);
        }
        for text in ["roundup_power2_divisions:[256:1,512:2,>:4]", "garbage_collection_threshold:0.8,expandable_segments:False"] {
            let mut conf = AllocConf::default();
            conf.parse_overrides(text).unwrap();
            let mut again = AllocConf::default();
            again.parse_overrides(&conf.overrides()).unwrap();
            assert_eq!(again, conf, "{text} -> {}", conf.overrides());
        }
    }
    use super::*;

    #[test]
    fn parses_pytorch_syntax() {
        let mut conf = AllocConf::default();
        conf.parse_overrides("expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:4,backend:native").unwrap();
        assert!(conf.expandable_segments);
        assert_eq!(conf.max_split_size, Some(128 << 20));
        assert_eq!(conf.roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
        // PyTorch drops spaces anywhere, and takes a comma at the end.
        let mut conf = AllocConf::default();
        conf.parse_overrides(" max_split_size_mb : 1 28 , expandable_segments:True,").unwrap();
        assert_eq!((conf.max_split_size, conf.expandable_segments), (Some(128 << 20), true));

        let mut conf = AllocConf::default();
        conf.parse_overrides("roundup_power2_divisions:[256:1,512:2,>:4],garbage_collection_threshold:0.6").unwrap();
        assert_eq!(conf.garbage_collection_threshold, 0.6);
        assert_eq!(conf.divisions_for(300 << 20), 0, "one division is no rounding, held as 0");
        assert_eq!(conf.divisions_for(600 << 20), 2, "`>` sets the intervals after the last one named");
        assert_eq!(conf.divisions_for(1100 << 20), 4);
        // A list starts from no rounding, whatever was set before.
        conf.parse_overrides("roundup_power2_divisions:[64:8,128:0]").unwrap();
        assert_eq!(conf.divisions_for(2000 << 20), 0);
    }

    /// `roundup_power2_divisions` lists as PyTorch 2.9 and later read them (`AllocatorConfig_test.cpp` and the
    /// example of PyTorch's CUDA notes): (list, [(size in MiB, divisions)]).
    #[test]
    fn roundup_lists_as_pytorch_reads_them() {
        let cases: [(&str, &[(u64, u64)]); 3] = [
            (
                "[64:8,128:2,256:4,512:2,1024:4,>:1]",
                &[(32, 8), (64, 8), (128, 2), (256, 4), (512, 2), (1024, 4), (2048, 0), (4096, 0), (8192, 0)],
            ),
            ("[256:1,512:2,1024:4,>:8]", &[(1, 0), (300, 0), (600, 2), (1100, 4), (2048, 8), (65536, 8)]),
            ("[>:4]", &[(1, 0), (2, 4), (1100, 4)]),
        ];
        for (list, sizes) in cases {
            let mut conf = AllocConf::default();
            conf.parse_overrides(&format!("roundup_power2_divisions:{list}")).unwrap();
            for &(mib, divisions) in sizes {
                assert_eq!(conf.divisions_for(mib << 20), divisions, "{list}: {mib} MiB");
            }
        }
    }

    /// One division rounds nothing in PyTorch (`round_size` rounds with more than one): settings that differ only
    /// there are PyTorch's defaults, not a what-if.
    #[test]
    fn one_division_is_no_rounding() {
        for text in ["roundup_power2_divisions:1", "roundup_power2_divisions:[>:1]", "roundup_power2_divisions:[1:1,>:1]"] {
            let mut conf = AllocConf::default();
            conf.parse_overrides(text).unwrap();
            assert_eq!(conf, AllocConf::default(), "{text}");
            assert_eq!(conf.overrides(), "", "{text}");
        }
        let recorded = RecordedSettings { roundup_power2_divisions: vec![(1, 1), (2048, 1)], ..RecordedSettings::default() };
        assert_eq!(AllocConf::from_recorded(&recorded), AllocConf::default());
    }

    /// `per_process_memory_fraction` (PyTorch 2.10): what the allocator may reserve, and its place in the string.
    #[test]
    fn a_memory_fraction_limits_the_allocator() {
        let mut conf = AllocConf::default();
        conf.parse_overrides("per_process_memory_fraction:0.5").unwrap();
        assert_eq!(conf.per_process_memory_fraction, Some(0.5));
        assert_eq!(conf.allowed_bytes(Some(80 << 30)), Some(40 << 30));
        assert_eq!(conf.allowed_bytes(None), None);
        assert_eq!(conf.overrides(), "per_process_memory_fraction:0.5");
        conf.parse_overrides("per_process_memory_fraction:1").unwrap();
        assert_eq!((conf.per_process_memory_fraction, conf.allowed_bytes(Some(80))), (None, Some(80)));
    }

    #[test]
    fn refuses_bad_input_naming_key_and_value() {
        let cases = [
            ("colour:blue", "colour"),
            ("max_split_size_mb:19", "`19`"),
            ("max_split_size_mb:lots", "`lots`"),
            ("garbage_collection_threshold:1.5", "`1.5`"),
            ("expandable_segments:yes", "`yes`"),
            ("roundup_power2_divisions:3", "`3`"),
            ("backend:cudaMallocAsync", "`cudaMallocAsync` for PYTORCH_CUDA_ALLOC_CONF key `backend`: heapscope emulates"),
            ("per_process_memory_fraction:7", "`7` for PYTORCH_CUDA_ALLOC_CONF key `per_process_memory_fraction`: must lie"),
            ("per_process_memory_fraction:abc", "`abc`"),
            ("release_lock_on_cudamalloc:maybe", "`maybe`"),
            ("pinned_use_cuda_host_register:yes", "`yes`"),
            ("pinned_num_register_threads:3", "`3`"),
            ("pinned_reserve_segment_size_mb:0", "`0`"),
            ("max_split_size_mb:128,,expandable_segments:True", "a setting is empty"),
            (",max_split_size_mb:128", "PYTORCH_CUDA_ALLOC_CONF `,max_split_size_mb:128`: a setting is empty"),
            ("expandable_segments", "PYTORCH_CUDA_ALLOC_CONF `expandable_segments`: expected `key:value`"),
        ];
        for (input, needle) in cases {
            let err = AllocConf::default().parse_overrides(input).unwrap_err().to_string();
            assert!(err.contains(needle), "{input}: {err}");
        }
    }

    #[test]
    fn from_recorded_reads_the_dictionary() {
        let settings = RecordedSettings {
            alloc_conf: String::new(),
            max_split_size: Some(256 << 20),
            garbage_collection_threshold: 0.0,
            expandable_segments: true,
            roundup_power2_divisions: vec![(1, 0), (2, 4), (32768, 8)],
        };
        let conf = AllocConf::from_recorded(&settings);
        assert_eq!(conf.max_split_size, Some(256 << 20));
        assert!(conf.expandable_segments);
        assert_eq!(conf.roundup_power2_divisions[1], 4);
        assert_eq!(conf.roundup_power2_divisions[15], 8);
    }

    /// What the dictionary leaves out comes from the recorded string; a part of it this reader refuses (a later
    /// PyTorch's key) is passed over, and the dictionary wins where both tell.
    #[test]
    fn from_recorded_takes_what_only_the_string_tells() {
        let settings = RecordedSettings {
            alloc_conf: "max_split_size_mb:100,max_non_split_rounding_mb:64,throw_on_cudamalloc_oom:True,\
                         per_process_memory_fraction:0.5"
                .to_owned(),
            max_split_size: Some(200 << 20),
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            roundup_power2_divisions: Vec::new(),
        };
        let conf = AllocConf::from_recorded(&settings);
        assert_eq!(conf.max_split_size, Some(200 << 20));
        assert_eq!(conf.max_non_split_rounding, 64 << 20);
        assert_eq!(conf.per_process_memory_fraction, Some(0.5));
    }

    /// The recorded string is the settings in effect where it reads as the keys do; a string the keys contradict (a run
    /// with expandable segments that later parsed another string) is not; a list with `>`, which PyTorch 2.8 and earlier
    /// read otherwise, is judged by its other settings.
    #[test]
    fn the_recorded_string_is_in_effect_where_the_keys_agree() {
        let mib = 1u64 << 20;
        let recorded = |alloc_conf: &str, expandable_segments, max_split_size, garbage_collection_threshold, divisions: &[_]| {
            RecordedSettings {
                alloc_conf: alloc_conf.to_owned(),
                max_split_size,
                garbage_collection_threshold,
                expandable_segments,
                roundup_power2_divisions: divisions.to_vec(),
            }
        };
        // (what the file records: string, expandable segments, max split size, threshold, roundup divisions; in effect)
        let cases: [(RecordedSettings, bool); 7] = [
            (recorded("", false, None, 0.0, &[]), true),
            (recorded("expandable_segments:True , max_split_size_mb:1024", true, Some(1024 * mib), 0.0, &[]), true),
            (recorded("max_split_size_mb:1024", true, Some(1024 * mib), 0.0, &[]), false),
            (recorded("", true, None, 0.0, &[]), false),
            (recorded("garbage_collection_threshold:0.6", false, None, 0.8, &[]), false),
            // PyTorch 2.8's keys for its documented example: `>` set 1024 MiB's interval too.
            (
                recorded("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", false, None, 0.0, &[(256, 1), (512, 2), (1024, 8)]),
                true,
            ),
            (
                recorded("roundup_power2_divisions:[256:1,512:2,1024:4,>:8],expandable_segments:True", false, None, 0.0, &[]),
                false,
            ),
        ];
        for (settings, in_effect) in cases {
            assert_eq!(AllocConf::recorded_string_in_effect(&settings), in_effect, "{settings:?}");
        }
    }
}
