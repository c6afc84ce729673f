//! Pickled ints of any width (`LONG1` / `LONG4` hold a little-endian two's complement int of any number
//! of bytes), and how an int is named in an error message.
//!
//! Ints that fit `i64` are the pickle reader's `Value::Int`; wider ones are kept whole as a [`LongInt`] so
//! that every int the pickle holds is read, and a value that does not fit where the schema puts it is
//! refused with the value itself in the message (`2^80 does not fit a u64`), never as a type error.

use std::fmt;

/// An int wider than `i64`: little-endian two's complement bytes, without redundant sign bytes (so at
/// least 9 of them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LongInt {
    bytes: Box<[u8]>,
}

/// Ints wider than this are named by their width in messages, not spelled out in decimal.
const DECIMAL_BITS: u64 = 1024;

impl LongInt {
    /// Decodes a little-endian two's complement int: an `i64` when it fits, else a [`LongInt`].
    pub(crate) fn decode(bytes: &[u8]) -> Result<i64, LongInt> {
        let mut len = bytes.len();
        // Drop sign bytes that repeat the sign of the byte below them.
        while len > 1 {
            let (top, below) = (bytes[len - 1], bytes[len - 2]);
            if (top == 0 && below & 0x80 == 0) || (top == 0xff && below & 0x80 != 0) {
                len -= 1;
            } else {
                break;
            }
        }
        let bytes = &bytes[..len];
        if len <= 8 {
            let negative = bytes.last().is_some_and(|&top| top & 0x80 != 0);
            let mut word = if negative { [0xff; 8] } else { [0; 8] };
            word[..len].copy_from_slice(bytes);
            return Ok(i64::from_le_bytes(word));
        }
        Err(LongInt { bytes: bytes.into() })
    }

    /// Whether the int is below zero.
    pub(crate) fn is_negative(&self) -> bool {
        self.bytes.last().is_some_and(|&top| top & 0x80 != 0)
    }

    /// The int, if it fits `i128`.
    pub(crate) fn to_i128(&self) -> Option<i128> {
        if self.bytes.len() > 16 {
            return None;
        }
        let mut word = if self.is_negative() { [0xff; 16] } else { [0; 16] };
        word[..self.bytes.len()].copy_from_slice(&self.bytes);
        Some(i128::from_le_bytes(word))
    }

    /// The nearest float (infinite beyond `f64`'s range).
    pub(crate) fn to_f64(&self) -> f64 {
        let magnitude = self.magnitude();
        let value = magnitude.iter().rev().fold(0.0, |value, &byte| value * 256.0 + f64::from(byte));
        if self.is_negative() { -value } else { value }
    }

    /// The absolute value, little-endian, without leading zero bytes.
    fn magnitude(&self) -> Vec<u8> {
        let mut bytes = self.bytes.to_vec();
        if self.is_negative() {
            // Two's complement negation: invert and add one.
            let mut carry = true;
            for byte in &mut bytes {
                let (sum, overflow) = (!*byte).overflowing_add(u8::from(carry));
                *byte = sum;
                carry = overflow;
            }
        }
        while bytes.last() == Some(&0) {
            bytes.pop();
        }
        bytes
    }
}

/// Bits in a magnitude (little-endian bytes, no leading zero byte).
fn bit_length(magnitude: &[u8]) -> u64 {
    magnitude.last().map_or(0, |&top| (magnitude.len() as u64 - 1) * 8 + u64::from(8 - top.leading_zeros()))
}

/// `2^k` when the magnitude is a power of two of at least 2^64 (easier to read than 20 digits), else
/// `None`.
fn power_of_two(magnitude: &[u8]) -> Option<u64> {
    let bits = bit_length(magnitude);
    let ones: u32 = magnitude.iter().map(|byte| byte.count_ones()).sum();
    (ones == 1 && bits > 64).then(|| bits - 1)
}

/// The decimal digits of a magnitude (little-endian bytes).
fn decimal(magnitude: &[u8]) -> String {
    // Base 10^9 limbs, built up from the most significant byte (limbs * 256 + byte).
    let mut limbs: Vec<u32> = Vec::new(); // little-endian, base 10^9
    for &byte in magnitude.iter().rev() {
        let mut carry = u64::from(byte);
        for limb in &mut limbs {
            let value = u64::from(*limb) * 256 + carry;
            *limb = (value % 1_000_000_000) as u32;
            carry = value / 1_000_000_000;
        }
        while carry > 0 {
            limbs.push((carry % 1_000_000_000) as u32);
            carry /= 1_000_000_000;
        }
    }
    let mut text = limbs.last().map_or_else(|| "0".to_owned(), u32::to_string);
    for limb in limbs.iter().rev().skip(1) {
        text.push_str(&format!("{limb:09}"));
    }
    text
}

impl fmt::Display for LongInt {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.is_negative() { "-" } else { "" };
        let magnitude = self.magnitude();
        match power_of_two(&magnitude) {
            Some(exponent) => write!(formatter, "{sign}2^{exponent}"),
            None if bit_length(&magnitude) <= DECIMAL_BITS => write!(formatter, "{sign}{}", decimal(&magnitude)),
            None => write!(formatter, "{}an int of {} bits", if sign.is_empty() { "" } else { "minus " }, bit_length(&magnitude)),
        }
    }
}

/// An int the pickle holds, of any width (bools count as 0 and 1).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Int<'a> {
    /// One that fits `i128`.
    Fits(i128),
    /// A wider one.
    Long(&'a LongInt),
}

impl Int<'_> {
    /// The int as a `T`, if it fits.
    pub(crate) fn to<T: TryFrom<i128>>(self) -> Option<T> {
        match self {
            Int::Fits(value) => T::try_from(value).ok(),
            Int::Long(_) => None,
        }
    }

    /// Whether the int is below zero.
    pub(crate) fn is_negative(self) -> bool {
        match self {
            Int::Fits(value) => value < 0,
            Int::Long(value) => value.is_negative(),
        }
    }

    /// The nearest float.
    pub(crate) fn to_f64(self) -> f64 {
        match self {
            Int::Fits(value) => value as f64,
            Int::Long(value) => value.to_f64(),
        }
    }
}

impl fmt::Display for Int<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Int::Fits(value) => {
                let magnitude = value.unsigned_abs().to_le_bytes();
                let length = magnitude.iter().rposition(|&byte| byte != 0).map_or(0, |top| top + 1);
                match power_of_two(&magnitude[..length]) {
                    Some(exponent) => write!(formatter, "{}2^{exponent}", if value < 0 { "-" } else { "" }),
                    None => write!(formatter, "{value}"),
                }
            }
            Int::Long(value) => write!(formatter, "{value}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two's complement bytes of `value`, as Python's pickler writes them for LONG1 (`encode_long`).
    fn encode(value: i128) -> Vec<u8> {
        let bytes = value.to_le_bytes();
        let mut length = 16;
        while length > 1 {
            let (top, below) = (bytes[length - 1], bytes[length - 2]);
            if (top == 0 && below & 0x80 == 0) || (top == 0xff && below & 0x80 != 0) {
                length -= 1;
            } else {
                break;
            }
        }
        bytes[..length].to_vec()
    }

    #[test]
    fn decodes_every_width() {
        // (bytes, the value as i64 when it fits, its text in messages)
        let cases: &[(&[u8], Option<i64>, &str)] = &[
            (b"", Some(0), "0"),
            (b"\x00", Some(0), "0"),
            (b"\xff", Some(-1), "-1"),
            (b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", Some(0), "0"),
            (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", Some(-1), "-1"),
            (b"\xff\xff\xff\xff\xff\xff\xff\x7f", Some(i64::MAX), "9223372036854775807"),
            (b"\x00\x00\x00\x00\x00\x00\x00\x80", Some(i64::MIN), "-9223372036854775808"),
            (b"\x00\x00\x00\x00\x00\x00\x00\x80\x00", None, "9223372036854775808"),
            (b"\xff\xff\xff\xff\xff\xff\xff\xff\x00", None, "18446744073709551615"),
            (b"\x00\x00\x00\x00\x00\x00\x00\x00\x01", None, "2^64"),
            (b"\x01\x00\x00\x00\x00\x00\x00\x00\x01", None, "18446744073709551617"),
            (b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01", None, "2^80"),
            (b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff", None, "-2^80"),
            (b"\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01", None, "1208925819614629174706177"),
            (b"\xff\xff\xff\xff\xff\xff\xff\x7f\xff", None, "-9223372036854775809"),
        ];
        for &(bytes, fits, text) in cases {
            match LongInt::decode(bytes) {
                Ok(value) => {
                    assert_eq!(Some(value), fits, "{bytes:?}");
                    assert_eq!(Int::Fits(i128::from(value)).to_string(), text, "{bytes:?}");
                }
                Err(long) => {
                    assert_eq!(fits, None, "{bytes:?}");
                    assert_eq!(long.to_string(), text, "{bytes:?}");
                    if let Some(value) = long.to_i128() {
                        assert_eq!(Int::Fits(value).to_string(), text, "{bytes:?}: the same text below 128 bits");
                    }
                }
            }
        }
    }

    #[test]
    fn wider_than_128_bits() {
        // 2^200, -(2^200), 2^200 + 1 and a 10 000-bit int.
        let mut power = vec![0; 25];
        power.push(1);
        let long = LongInt::decode(&power).unwrap_err();
        assert_eq!((long.to_string(), long.to_i128(), long.is_negative()), ("2^200".to_owned(), None, false));
        assert_eq!(long.to_f64(), 2f64.powi(200));
        let mut negative = vec![0; 25];
        negative.push(0xff);
        let long = LongInt::decode(&negative).unwrap_err();
        assert_eq!((long.to_string(), long.is_negative()), ("-2^200".to_owned(), true));
        assert_eq!(long.to_f64(), -(2f64.powi(200)));
        power[0] = 1;
        assert_eq!(
            LongInt::decode(&power).unwrap_err().to_string(),
            "1606938044258990275541962092341162602522202993782792835301377"
        );
        let mut huge = vec![0x55; 1250];
        huge.push(0);
        assert_eq!(LongInt::decode(&huge).unwrap_err().to_string(), "an int of 9999 bits");
        huge.push(0x80);
        assert_eq!(LongInt::decode(&huge).unwrap_err().to_string(), "minus an int of 10015 bits");
    }

    #[test]
    fn round_trips_what_python_writes() {
        for value in
            [0, 1, -1, 127, 128, -128, -129, 255, 256, i128::from(i64::MAX) + 1, i128::from(u64::MAX), i128::MAX, i128::MIN]
        {
            let decoded = match LongInt::decode(&encode(value)) {
                Ok(small) => i128::from(small),
                Err(long) => long.to_i128().unwrap(),
            };
            assert_eq!(decoded, value);
        }
    }

    #[test]
    fn converts_only_what_fits() {
        let long = LongInt::decode(b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01").unwrap_err();
        // (int, as u64, as i64, negative)
        let cases = [
            (Int::Fits(-1), None, Some(-1i64), true),
            (Int::Fits(i128::from(u64::MAX)), Some(u64::MAX), None, false),
            (Int::Fits(1 << 80), None, None, false),
            (Int::Long(&long), None, None, false),
        ];
        for (int, unsigned, signed, negative) in cases {
            assert_eq!(int.to::<u64>(), unsigned, "{int}");
            assert_eq!(int.to::<i64>(), signed, "{int}");
            assert_eq!(int.is_negative(), negative, "{int}");
        }
        assert_eq!(Int::Long(&long).to_string(), "2^136");
    }
}
