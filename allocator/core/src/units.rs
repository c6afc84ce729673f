//! Byte sizes for people: `3584MiB` in, `1000.00 MiB` out; and the tables' ratio of reserved to live bytes.

use std::fmt;

/// 1 KiB.
pub const KIB: u64 = 1 << 10;
/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// 1 GiB.
pub const GIB: u64 = 1 << 30;

/// The binary units a byte count is shown in, largest first; below 1 KiB it is shown in bytes.
const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)];

/// The largest of [`UNITS`] that `bytes` reaches: its name and size.
fn unit_of(bytes: u64) -> Option<(&'static str, u64)> {
    UNITS.into_iter().find(|&(_, scale)| bytes >= scale)
}

/// Formats a byte count in binary units with two decimals (`1000.00 MiB`, `1.00 GiB`), as heapscope's tables write it;
/// PyTorch's out-of-memory message has its own rule (`heapscope_pytorch::FormatSize`: 1 GiB is `1024.00 MiB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        match unit_of(bytes) {
            Some((name, scale)) => write!(f, "{:.2} {name}", bytes as f64 / scale as f64),
            None => write!(f, "{bytes} B"),
        }
    }
}

/// Peak reserved bytes over peak live bytes, the `ratio` of every table (1.0 is no waste; 1.25, a quarter more
/// reserved than ever live): `None` when nothing was live (a state with no trace, a recording that allocates
/// nothing), where a ratio would divide by nothing. Displayed with the formatter's width and precision, `-` for `None`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReservedOverLive(pub Option<f64>);

impl ReservedOverLive {
    /// `reserved_bytes / live_bytes`, or `None` when `live_bytes` is 0.
    pub fn new(reserved_bytes: u64, live_bytes: u64) -> Self {
        Self((live_bytes > 0).then(|| reserved_bytes as f64 / live_bytes as f64))
    }
}

impl fmt::Display for ReservedOverLive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, f.width(), f.precision()) {
            // A ratio too wide for its column with the decimals asked (a few bytes live under a 2 MiB page) keeps only
            // as many decimals as fit, so the columns after it stay in place.
            (Some(ratio), Some(width), Some(precision)) => {
                let whole_digits = format!("{ratio:.0}").len();
                let fitting = precision.min(width.saturating_sub(whole_digits + 1));
                write!(f, "{ratio:>width$.fitting$}")
            }
            (Some(ratio), _, _) => fmt::Display::fmt(&ratio, f),
            (None, _, _) => f.pad("-"),
        }
    }
}

/// A capacity to set, formatted as [`Bytes`] but rounded up at the second decimal instead of to the nearest: what
/// `--capacity` then reads is never less than the bytes needed (2.953 GiB shows `2.96 GiB`, not `2.95 GiB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BytesAtLeast(pub u64);

impl fmt::Display for BytesAtLeast {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        match unit_of(bytes) {
            Some((name, scale)) => {
                let hundredths = (u128::from(bytes) * 100).div_ceil(u128::from(scale));
                write!(f, "{}.{:02} {name}", hundredths / 100, hundredths % 100)
            }
            None => write!(f, "{bytes} B"),
        }
    }
}

/// `bytes` exactly, in the largest binary unit that divides it: `160 MiB`, `4 KiB`, `1000 B` — what
/// [`parse_size`] reads back to the same count (where [`Bytes`] rounds to two decimals).
pub fn exact_size(bytes: u64) -> String {
    UNITS
        .into_iter()
        .find(|&(_, scale)| bytes >= scale && bytes.is_multiple_of(scale))
        .map_or_else(|| format!("{bytes} B"), |(name, scale)| format!("{} {name}", bytes / scale))
}

/// Parses a size such as `3584MiB`, `3.5 GiB`, `64k`, `1G` or `4096`.
///
/// Binary suffixes (`KiB`, `MiB`, `GiB`, `TiB`, and the short `k`, `m`, `g`, `t`) scale by 1024; decimal
/// ones (`KB`, `MB`, `GB`, `TB`) by 1000; `B` or none means bytes. Fractions are allowed and rounded to the
/// nearest byte.
///
/// # Errors
/// [`BadSize`], naming the text and what is wrong with it.
pub fn parse_size(text: &str) -> Result<u64, BadSize> {
    parse_size_words(text).map_err(|what| BadSize { text: text.to_owned(), what })
}

/// A size that does not parse: the text, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("size {text:?}: {what}")]
pub struct BadSize {
    /// What was given.
    pub text: String,
    /// What is wrong with it, in words.
    pub what: String,
}

fn parse_size_words(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_')).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    let number = number.replace('_', "");
    // What is wrong with the number comes before the unit: `-5` is no unit `-5`.
    if number.is_empty() {
        return Err(match trimmed.chars().next() {
            None => "no number".to_owned(),
            Some('-') => "a negative size".to_owned(),
            Some('+') => "a sign before the number: sizes are plain numbers".to_owned(),
            Some(first) => format!("no number: it starts with {first:?} (sizes are plain decimal numbers, `4096` or `4 KiB`)"),
        });
    }
    if number == "0" && suffix.starts_with(['x', 'X']) {
        return Err("a hexadecimal number: give the size in decimal".to_owned());
    }
    if suffix
        .strip_prefix(['e', 'E'])
        .is_some_and(|rest| rest.trim_start_matches(['+', '-']).starts_with(|c: char| c.is_ascii_digit()))
    {
        return Err("an exponent: write the number out, or give it a unit (`1e3` is `1000`, `1 KB`)".to_owned());
    }
    let scale: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => return Err(format!("unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")),
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(scale).ok_or_else(|| "larger than 2^64 bytes".to_owned());
    }
    // Bytes written with a point (`4096.0`): whole only when every digit after it is 0, read exactly (not through a
    // float, which would round `1.9999999999999999999` to 2).
    if scale == 1
        && let Some((whole, fraction)) = number.split_once('.')
        && fraction.bytes().all(|digit| digit == b'0')
        && let Ok(whole) = whole.parse::<u64>()
    {
        return Ok(whole);
    }
    let value: f64 = number.parse().map_err(|_| format!("{number:?} is not a number"))?;
    if scale == 1 && number.split_once('.').is_some_and(|(_, fraction)| fraction.bytes().any(|digit| digit != b'0')) {
        // `3.5` meant as gigabytes would be 4 bytes: a fraction of a byte is no size anyone means.
        return Err(if suffix.trim().is_empty() {
            "a fraction of a byte: give it a unit (GiB, MiB, ...)".to_owned()
        } else {
            format!("{number} B is a fraction of a byte: sizes are whole bytes (a fraction needs a larger unit, KiB, MiB, ...)")
        });
    }
    let bytes = (value * scale as f64).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err("larger than 2^64 bytes".to_owned());
    }
    if bytes == 0.0 && value > 0.0 {
        let given = format!("{number} {}", suffix.trim());
        return Err(format!("{} is less than half a byte: it would round to 0 bytes", given.trim_end()));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_sizes_read_back_to_the_same_bytes() {
        let cases: [(u64, &str); 7] = [
            (0, "0 B"),
            (1, "1 B"),
            (1000, "1000 B"),
            (4096, "4 KiB"),
            (160 * MIB, "160 MiB"),
            (3 * GIB + MIB, "3073 MiB"),
            ((1 << 40) + 512, "1099511628288 B"),
        ];
        for (bytes, text) in cases {
            assert_eq!(exact_size(bytes), text);
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn a_capacity_to_set_is_shown_rounded_up_and_reads_back_to_enough() {
        // (bytes, shown)
        let cases: [(u64, &str); 7] = [
            (0, "0 B"),
            (1023, "1023 B"),
            (3 * GIB, "3.00 GiB"),
            (3_170_893_824, "2.96 GiB"),
            (3 * GIB + 1, "3.01 GiB"),
            (MIB + MIB / 200, "1.01 MiB"),
            (5 * (1 << 40) + 1, "5.01 TiB"),
        ];
        for (bytes, shown) in cases {
            let text = BytesAtLeast(bytes).to_string();
            assert_eq!(text, shown, "{bytes}");
            assert!(parse_size(&text).unwrap() >= bytes, "{text} reads back to at least {bytes}");
        }
    }

    #[test]
    fn parse_table() {
        let cases: [(&str, Result<u64, ()>); 16] = [
            ("4096", Ok(4096)),
            ("3584MiB", Ok(3584 * MIB)),
            ("3584 MiB", Ok(3584 * MIB)),
            ("3.5GiB", Ok(3584 * MIB)),
            ("64k", Ok(64 * KIB)),
            ("1G", Ok(GIB)),
            ("2GB", Ok(2_000_000_000)),
            ("1_024", Ok(1024)),
            ("", Err(())),
            ("MiB", Err(())),
            ("12 parsecs", Err(())),
            ("99999999999TiB", Err(())),
            // Fractions round to the nearest byte, but a size above 0 never rounds to nothing (issue 17).
            ("0.5KiB", Ok(512)),
            ("0.4", Err(())),
            ("0.0001 KiB", Err(())),
            // A fraction without a unit is a slip (`--capacity 3.5` was 4 bytes).
            ("3.5", Err(())),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_size(text).map_err(|_| ()), expected, "{text:?}");
        }
        assert_eq!(
            parse_size("12 parsecs").unwrap_err().to_string(),
            "size \"12 parsecs\": unknown unit \"parsecs\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
        );
        assert_eq!(
            parse_size("0.0001KiB").unwrap_err().to_string(),
            "size \"0.0001KiB\": 0.0001 KiB is less than half a byte: it would round to 0 bytes"
        );
        assert_eq!(
            parse_size("3.5").unwrap_err().to_string(),
            "size \"3.5\": a fraction of a byte: give it a unit (GiB, MiB, ...)"
        );
        assert_eq!(
            parse_size("1.6B").unwrap_err().to_string(),
            "size \"1.6B\": 1.6 B is a fraction of a byte: sizes are whole bytes (a fraction needs a larger unit, KiB, MiB, ...)"
        );
        // What is wrong with the number is said before any unit (these read as unknown units).
        let said = [
            ("-5", "a negative size"),
            ("+5", "a sign before the number: sizes are plain numbers"),
            ("0x1000", "a hexadecimal number: give the size in decimal"),
            ("1e3", "an exponent: write the number out, or give it a unit (`1e3` is `1000`, `1 KB`)"),
            ("2.5E-1", "an exponent: write the number out, or give it a unit (`1e3` is `1000`, `1 KB`)"),
            ("\u{ff15}", "no number: it starts with '\u{ff15}' (sizes are plain decimal numbers, `4096` or `4 KiB`)"),
            ("", "no number"),
        ];
        for (text, what) in said {
            assert_eq!(parse_size(text).unwrap_err().what, what, "{text:?}");
        }
        assert_eq!(parse_size("1.0"), Ok(1), "a whole number of bytes written with a point");
        assert_eq!(parse_size("9007199254740993.000"), Ok(9_007_199_254_740_993), "read exactly, not through a float");
        assert!(parse_size("1.9999999999999999999").is_err(), "a fraction of a byte, however close to 2");
    }

    #[test]
    fn display_table() {
        let cases = [(0, "0 B"), (512, "512 B"), (1536, "1.50 KiB"), (1000 * MIB, "1000.00 MiB"), (GIB, "1.00 GiB")];
        for (bytes, text) in cases {
            assert_eq!(Bytes(bytes).to_string(), text);
        }
    }

    #[test]
    fn reserved_over_live_table() {
        // (reserved, live, shown 8 wide with 4 decimals, or as many as fit)
        let cases = [
            (1250, 1000, "  1.2500"),
            (3 * GIB, 0, "       -"),
            (0, 0, "       -"),
            (1000, 1000, "  1.0000"),
            (2 * MIB, 100, "20971.52"),
            (32 * MIB, 100, "335544.3"),
            (GIB, 1, "1073741824"),
        ];
        for (reserved, live, text) in cases {
            assert_eq!(format!("{:>8.4}", ReservedOverLive::new(reserved, live)), text, "{reserved} over {live}");
        }
        assert_eq!(ReservedOverLive::new(5, 0).0, None);
    }
}
