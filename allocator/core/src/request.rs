//! What a caller asks for: a validated size, alignment and resource kind.

use crate::{Error, Result};

/// The kind of resource an allocation backs, for Vulkan's `bufferImageGranularity`: a *linear* resource
/// (buffer, linear image) and an *optimal* one (tiled image) must not share a granularity page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ResourceKind {
    /// Buffers and linearly tiled images.
    #[default]
    Linear,
    /// Optimally tiled images.
    Optimal,
}

/// A request for memory, valid by construction: size > 0, alignment a power of two, and the size rounded up
/// to the alignment fits in `u64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    size_bytes: u64,
    align_bytes: u64,
    kind: ResourceKind,
}

impl Request {
    /// A request for `size_bytes` aligned to `align_bytes`, of [`ResourceKind::Linear`].
    ///
    /// # Errors
    /// [`Error::ZeroSize`], [`Error::AlignmentNotPowerOfTwo`] or [`Error::SizeOverflow`].
    #[inline]
    pub fn new(size_bytes: u64, align_bytes: u64) -> Result<Self> {
        if size_bytes == 0 {
            return Err(Error::ZeroSize);
        }
        if !align_bytes.is_power_of_two() {
            return Err(Error::AlignmentNotPowerOfTwo { align_bytes });
        }
        if size_bytes.checked_add(align_bytes - 1).is_none() {
            return Err(Error::SizeOverflow { size_bytes, align_bytes });
        }
        Ok(Self { size_bytes, align_bytes, kind: ResourceKind::Linear })
    }

    /// The same request for a resource of `kind`.
    #[must_use]
    pub fn with_kind(self, kind: ResourceKind) -> Self {
        Self { kind, ..self }
    }

    /// Bytes asked for.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Required alignment of the offset (a power of two).
    pub fn align_bytes(&self) -> u64 {
        self.align_bytes
    }

    /// The kind of resource, for the granularity rule.
    pub fn kind(&self) -> ResourceKind {
        self.kind
    }
}

/// `value` rounded up to a multiple of the power of two `align`, or `None` on overflow.
#[inline]
pub(crate) fn align_up(value: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(value.checked_add(align - 1)? & !(align - 1))
}

/// `value` rounded down to a multiple of the power of two `align`.
pub(crate) fn align_down(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    value & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_table() {
        let cases: [(u64, u64, Option<Error>); 7] = [
            (1, 1, None),
            (256, 256, None),
            (u64::MAX, 1, None),
            (0, 1, Some(Error::ZeroSize)),
            (16, 0, Some(Error::AlignmentNotPowerOfTwo { align_bytes: 0 })),
            (16, 24, Some(Error::AlignmentNotPowerOfTwo { align_bytes: 24 })),
            (u64::MAX, 2, Some(Error::SizeOverflow { size_bytes: u64::MAX, align_bytes: 2 })),
        ];
        for (size, align, expected) in cases {
            assert_eq!(Request::new(size, align).err(), expected, "size {size} align {align}");
        }
    }

    #[test]
    fn align_helpers() {
        let cases = [(0, 256, Some(0), 0), (1, 256, Some(256), 0), (256, 256, Some(256), 256), (513, 512, Some(1024), 512)];
        for (value, align, up, down) in cases {
            assert_eq!(align_up(value, align), up);
            assert_eq!(align_down(value, align), down);
        }
        assert_eq!(align_up(u64::MAX, 2), None);
    }
}
