//! Why a request failed: the out-of-memory verdict.

use std::fmt;

use crate::units::Bytes;

/// Whether a failed request met scattered free memory or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum OomCause {
    /// Enough bytes were free in total (in the blocks the request could use, plus what the budget and device
    /// still allow) for what the policy needed, but no run was large enough: moving allocations (compaction)
    /// or mapping pages where they are needed would have served it.
    Fragmentation,
    /// Not enough bytes were free in total.
    Exhaustion,
}

/// The state of a heap when a request failed, in numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OomVerdict {
    /// The policy that failed.
    pub policy: &'static str,
    /// Bytes requested.
    pub requested_bytes: u64,
    /// Bytes the policy needs to serve the request alone (rounded to its unit, or to a power of two for the
    /// buddy policy).
    pub needed_bytes: u64,
    /// Alignment requested.
    pub align_bytes: u64,
    /// Bytes reserved in blocks.
    pub reserved_bytes: u64,
    /// Bytes held by live allocations (requested).
    pub live_bytes: u64,
    /// Padding inside live allocations (internal waste).
    pub padding_bytes: u64,
    /// Free bytes inside the reserved blocks the request could use ("reserved but unallocated"; a dedicated
    /// block holding its allocation serves nobody else).
    pub free_in_blocks_bytes: u64,
    /// The largest free run inside those blocks.
    pub largest_free_run_bytes: u64,
    /// Freed bytes the policy cannot reuse yet.
    pub retired_bytes: u64,
    /// Bytes that could still be reserved: the smaller of the budget left and what the device reports.
    pub unreserved_bytes: u64,
    /// The budget (cap on reserved bytes), if any.
    pub capacity_bytes: Option<u64>,
    /// The verdict.
    pub cause: OomCause,
}

impl OomCause {
    /// Fragmentation when the free bytes in usable blocks plus the reservable bytes cover what the policy
    /// needs for the request.
    pub fn judge(needed_bytes: u64, free_in_blocks_bytes: u64, unreserved_bytes: u64) -> Self {
        if free_in_blocks_bytes.saturating_add(unreserved_bytes) >= needed_bytes { Self::Fragmentation } else { Self::Exhaustion }
    }
}

impl OomVerdict {
    /// The verdict in words, without the policy's name (`Display` puts it in front).
    pub fn describe(&self) -> String {
        struct Words<'a>(&'a OomVerdict);
        impl fmt::Display for Words<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.write_words(f)
            }
        }
        Words(self).to_string()
    }

    fn write_words(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tried to allocate {}", Bytes(self.requested_bytes))?;
        if self.needed_bytes != self.requested_bytes {
            write!(f, " ({} once rounded by the policy)", Bytes(self.needed_bytes))?;
        }
        write!(
            f,
            "; {} reserved, {} live ({} padding), {} free inside usable blocks (largest free run {})",
            Bytes(self.reserved_bytes),
            Bytes(self.live_bytes),
            Bytes(self.padding_bytes),
            Bytes(self.free_in_blocks_bytes),
            Bytes(self.largest_free_run_bytes),
        )?;
        if self.retired_bytes > 0 {
            write!(f, ", {} retired", Bytes(self.retired_bytes))?;
        }
        match self.capacity_bytes {
            Some(capacity) => write!(f, ", {} reservable under the {} budget", Bytes(self.unreserved_bytes), Bytes(capacity))?,
            None => write!(f, ", {} reservable from the device", Bytes(self.unreserved_bytes))?,
        }
        match self.cause {
            OomCause::Fragmentation => write!(
                f,
                ". Fragmentation: {} are free in total but no run holds the request",
                Bytes(self.free_in_blocks_bytes.saturating_add(self.unreserved_bytes))
            ),
            OomCause::Exhaustion => f.write_str(". Exhaustion: not enough free memory in total"),
        }
    }
}

impl fmt::Display for OomVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.policy)?;
        self.write_words(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_table() {
        let cases = [
            (1024, 1000, 584, OomCause::Fragmentation),
            (1024, 1000, 24, OomCause::Fragmentation),
            (1024, 1000, 23, OomCause::Exhaustion),
            (1024, 0, 0, OomCause::Exhaustion),
            (1, u64::MAX, u64::MAX, OomCause::Fragmentation),
        ];
        for (requested, free, unreserved, cause) in cases {
            assert_eq!(OomCause::judge(requested, free, unreserved), cause, "{requested} {free} {unreserved}");
        }
    }
}
