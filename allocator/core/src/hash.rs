//! A fast hasher for maps keyed by addresses, page numbers and ids (`u64`), where the standard library's
//! DoS-resistant SipHash costs more than the work around it (a 400,000-event trace does a million map
//! operations while it is read). Keys are program data, not attacker-chosen in a way that matters here: the
//! worst a crafted trace can do is slow its own replay down.
//!
//! The hash is the folded 128-bit product with an odd constant: every input bit reaches the low bits the
//! table indexes by and the high bits it tags with, even for addresses whose low bits are all zero.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes one `u64` (other inputs are folded in eight bytes at a time).
#[derive(Clone, Copy, Debug, Default)]
pub struct U64Hasher(u64);

const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        let product = u128::from(self.0) * u128::from(MULTIPLIER);
        (product >> 64) as u64 ^ product as u64
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(29) ^ value).wrapping_mul(MULTIPLIER);
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

/// A `HashMap` with [`U64Hasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<U64Hasher>>;
/// A `HashSet` with [`U64Hasher`].
pub type FastSet<K> = HashSet<K, BuildHasherDefault<U64Hasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn aligned_addresses_spread_over_low_and_high_bits() {
        let build = BuildHasherDefault::<U64Hasher>::default();
        let hashes: Vec<u64> = (0..4096u64).map(|index| build.hash_one(0x7f00_0000_0000 + index * 512)).collect();
        let low: HashSet<u64> = hashes.iter().map(|hash| hash & 0xfff).collect();
        let high: HashSet<u64> = hashes.iter().map(|hash| hash >> 57).collect();
        assert!(low.len() > 2500, "{} distinct low-12-bit values of 4096", low.len());
        assert_eq!(high.len(), 128, "every 7-bit tag is used");
    }
}
