//! A minimal pickle writer (protocol 4) for plain builtin data, as [`export`](super::export) needs it.
//!
//! It writes what Python's own pickler writes for the same data (EMPTY_DICT / MARK / SETITEMS, batches of
//! at most 1000 items, the smallest int and str opcodes), minus framing, which protocol 4 makes optional.
//! Memoization is explicit: the caller memoizes what it wants shared ([`PickleWriter::memoize`]) and refers
//! to it later with [`PickleWriter::get`].

use std::io::{self, Write};

/// Items per `SETITEMS` / `APPENDS`, as Python's pickler batches them (our reader keeps a batch on its
/// stack, so batching bounds its memory too).
pub(crate) const BATCH: usize = 1000;

/// Writes pickle opcodes to `W`.
#[derive(Debug)]
pub(crate) struct PickleWriter<W> {
    out: W,
    memo_len: u32,
}

impl<W: Write> PickleWriter<W> {
    /// Starts a protocol 4 pickle.
    pub(crate) fn new(mut out: W) -> io::Result<Self> {
        out.write_all(&[0x80, 4])?;
        Ok(Self { out, memo_len: 0 })
    }

    /// `STOP`, and the writer back.
    pub(crate) fn finish(mut self) -> io::Result<W> {
        self.out.write_all(b".")?;
        Ok(self.out)
    }

    pub(crate) fn bool(&mut self, value: bool) -> io::Result<()> {
        self.out.write_all(if value { &[0x88] } else { &[0x89] })
    }

    pub(crate) fn int(&mut self, value: i128) -> io::Result<()> {
        if let Ok(small) = u8::try_from(value) {
            self.out.write_all(&[b'K', small])
        } else if let Ok(small) = u16::try_from(value) {
            let bytes = small.to_le_bytes();
            self.out.write_all(&[b'M', bytes[0], bytes[1]])
        } else if let Ok(small) = i32::try_from(value) {
            self.out.write_all(b"J")?;
            self.out.write_all(&small.to_le_bytes())
        } else {
            // LONG1: the shortest little-endian two's complement form.
            let bytes = value.to_le_bytes();
            let mut length = 16;
            while length > 1 {
                let top = bytes[length - 1];
                let below_sign = bytes[length - 2] & 0x80;
                if (top == 0 && below_sign == 0) || (top == 0xff && below_sign != 0) {
                    length -= 1;
                } else {
                    break;
                }
            }
            self.out.write_all(&[0x8a, length as u8])?;
            self.out.write_all(&bytes[..length])
        }
    }

    pub(crate) fn float(&mut self, value: f64) -> io::Result<()> {
        self.out.write_all(b"G")?;
        self.out.write_all(&value.to_be_bytes())
    }

    pub(crate) fn str(&mut self, value: &str) -> io::Result<()> {
        let length = value.len();
        if let Ok(short) = u8::try_from(length) {
            self.out.write_all(&[0x8c, short])?;
        } else if let Ok(medium) = u32::try_from(length) {
            self.out.write_all(b"X")?;
            self.out.write_all(&medium.to_le_bytes())?;
        } else {
            self.out.write_all(&[0x8d])?;
            self.out.write_all(&(length as u64).to_le_bytes())?;
        }
        self.out.write_all(value.as_bytes())
    }

    pub(crate) fn empty_dict(&mut self) -> io::Result<()> {
        self.out.write_all(b"}")
    }

    pub(crate) fn empty_list(&mut self) -> io::Result<()> {
        self.out.write_all(b"]")
    }

    pub(crate) fn mark(&mut self) -> io::Result<()> {
        self.out.write_all(b"(")
    }

    /// `SETITEMS`: the pairs since the last mark go into the dict below it.
    pub(crate) fn set_items(&mut self) -> io::Result<()> {
        self.out.write_all(b"u")
    }

    /// `APPENDS`: the items since the last mark go into the list below it.
    pub(crate) fn appends(&mut self) -> io::Result<()> {
        self.out.write_all(b"e")
    }

    /// `TUPLE2` of the two objects on top.
    pub(crate) fn tuple2(&mut self) -> io::Result<()> {
        self.out.write_all(&[0x86])
    }

    /// `MEMOIZE` the object on top; its memo slot.
    pub(crate) fn memoize(&mut self) -> io::Result<u32> {
        self.out.write_all(&[0x94])?;
        let slot = self.memo_len;
        self.memo_len += 1;
        Ok(slot)
    }

    /// Pushes memo slot `slot` (`BINGET` / `LONG_BINGET`).
    pub(crate) fn get(&mut self, slot: u32) -> io::Result<()> {
        if let Ok(short) = u8::try_from(slot) {
            self.out.write_all(&[b'h', short])
        } else {
            self.out.write_all(b"j")?;
            self.out.write_all(&slot.to_le_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::pickle_read::{KeepAll, Value, read_pickle};
    use super::*;

    #[test]
    fn ints_round_trip_through_the_reader() {
        let values: &[i128] = &[
            0,
            1,
            255,
            256,
            65535,
            65536,
            -1,
            -128,
            -129,
            i128::from(i32::MAX),
            i128::from(i32::MAX) + 1,
            i128::from(i32::MIN) - 1,
            i128::from(i64::MAX),
            i128::from(i64::MIN),
            i128::from(u64::MAX),
            i128::from(u64::MAX) + 1,
            i128::MAX,
            i128::MIN,
            0x7f,
            0x80,
            0x7fff_ffff_ffff,
            140_333_560_102_912,
        ];
        for &value in values {
            let mut writer = PickleWriter::new(Vec::new()).unwrap();
            writer.int(value).unwrap();
            let bytes = writer.finish().unwrap();
            let (decoded, _) = read_pickle(bytes.as_slice(), KeepAll).unwrap();
            assert_eq!(decoded.as_i128(), Some(value), "{value}");
        }
    }

    #[test]
    fn strings_round_trip_through_the_reader() {
        let long = "x".repeat(300);
        for text in ["", "alloc", "ünïcödé", long.as_str()] {
            let mut writer = PickleWriter::new(Vec::new()).unwrap();
            writer.str(text).unwrap();
            let bytes = writer.finish().unwrap();
            let (decoded, _) = read_pickle(bytes.as_slice(), KeepAll).unwrap();
            assert!(matches!(decoded, Value::Str(ref s) if **s == text), "{text:?}");
        }
    }
}
