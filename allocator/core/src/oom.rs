//! Why a request failed: the out-of-memory verdict.

use std::fmt;

use crate::source::LARGEST_DEVICE_BYTES;
use crate::units::Bytes;

/// What the memory a failed request lacked went to: free bytes between allocations, bytes wasted inside them, or
/// nowhere (there was not enough).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum OomCause {
    /// Enough bytes were free in total (in the blocks the request could use, plus what the budget and device
    /// still allow) for what the policy needed, but no run was large enough: moving allocations (compaction)
    /// or mapping pages where they are needed would have served it (external fragmentation: waste *between*
    /// allocations).
    Fragmentation,
    /// Not enough bytes were free in total, but the bytes wasted *inside* allocations would have covered it: padding
    /// of live allocations (rounding to a unit, a size class, a power of two, a page's tail), or the request's own
    /// rounding (it would have fitted as asked). A policy that rounds less would have served it.
    InternalWaste,
    /// Not enough memory: even without any waste, inside or between allocations, the request does not fit.
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
    /// The cap on reserved bytes (a budget, or the device's capacity), if any.
    pub capacity_bytes: Option<u64>,
    /// A paged heap's virtual range, where it bounds what could still be reserved (more than the budget or device
    /// left): the unreserved bytes are what the range has unmapped, and the words name the range.
    pub virtual_range_bytes: Option<u64>,
    /// The new block the allocator would have had to reserve for the request, where that is what did not fit (an
    /// allocator whose blocks all have one size, gpu-allocator's 256 MiB): `needed_bytes` is then that block, which
    /// the words name as such, not as the request rounded.
    pub new_block_bytes: Option<u64>,
    /// The verdict.
    pub cause: OomCause,
}

/// What a judgement of a refusal weighs (see [`OomCause::judge`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shortfall {
    /// Bytes asked for.
    pub requested_bytes: u64,
    /// Bytes the policy needs for them (rounded).
    pub needed_bytes: u64,
    /// Free bytes in the blocks the request could use.
    pub free_in_blocks_bytes: u64,
    /// Bytes that could still be reserved.
    pub unreserved_bytes: u64,
    /// Padding inside live allocations.
    pub padding_bytes: u64,
}

impl OomCause {
    /// Fragmentation when the free bytes in usable blocks plus the reservable bytes cover what the policy needs for
    /// the request; else internal waste when they cover the request as asked, or would with the padding inside live
    /// allocations; else exhaustion.
    pub fn judge(shortfall: Shortfall) -> Self {
        let Shortfall { requested_bytes, needed_bytes, free_in_blocks_bytes, unreserved_bytes, padding_bytes } = shortfall;
        let free = free_in_blocks_bytes.saturating_add(unreserved_bytes);
        if free >= needed_bytes {
            Self::Fragmentation
        } else if free >= requested_bytes || free.saturating_add(padding_bytes) >= needed_bytes {
            Self::InternalWaste
        } else {
            Self::Exhaustion
        }
    }

    /// Its name in sentences and JSON: `fragmentation`, `internal waste`, `exhaustion`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fragmentation => "fragmentation",
            Self::InternalWaste => "internal waste",
            Self::Exhaustion => "exhaustion",
        }
    }
}

impl OomVerdict {
    /// What its cause is judged from.
    pub fn shortfall(&self) -> Shortfall {
        Shortfall {
            requested_bytes: self.requested_bytes,
            needed_bytes: self.needed_bytes,
            free_in_blocks_bytes: self.free_in_blocks_bytes,
            unreserved_bytes: self.unreserved_bytes,
            padding_bytes: self.padding_bytes,
        }
    }

    /// The verdict with its cause judged from its numbers ([`OomCause::judge`]).
    #[must_use]
    pub fn judged(mut self) -> Self {
        self.cause = OomCause::judge(self.shortfall());
        self
    }

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
        if self.needed_bytes > LARGEST_DEVICE_BYTES {
            // What a device has left is beside the point (and an unlimited simulated one's figures would read as a
            // limit).
            let rounded = match self.needed_bytes {
                u64::MAX => " (past 2^64 B once rounded by the policy)".to_owned(),
                needed if needed != self.requested_bytes => format!(" ({} once rounded by the policy)", Bytes(needed)),
                _ => String::new(),
            };
            return write!(f, "{rounded}: more than any device holds (heapscope models devices of up to 1 EiB). Exhaustion");
        }
        match self.new_block_bytes {
            Some(block) => write!(f, " (which needs a new block of {})", Bytes(block))?,
            None if self.needed_bytes != self.requested_bytes => {
                write!(f, " ({} once rounded by the policy)", Bytes(self.needed_bytes))?;
            }
            None => {}
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
        match (self.virtual_range_bytes, self.capacity_bytes) {
            (Some(range), _) => {
                write!(f, ", {} more mappable beside them in its {} virtual range", Bytes(self.unreserved_bytes), Bytes(range))?;
            }
            (None, Some(capacity)) => {
                // The cap may be a budget or the device (`--capacity`): named by what it does.
                write!(f, ", {} reservable of the {} it may reserve", Bytes(self.unreserved_bytes), Bytes(capacity))?;
            }
            (None, None) => write!(f, ", {} reservable from the device", Bytes(self.unreserved_bytes))?,
        }
        let free = self.free_in_blocks_bytes.saturating_add(self.unreserved_bytes);
        match self.cause {
            OomCause::Fragmentation => {
                write!(f, ". Fragmentation: {} are free in total but no run holds the request", Bytes(free))
            }
            // Enough even once rounded, but in pieces inside the pages (or blocks) live allocations hold.
            OomCause::InternalWaste if free >= self.needed_bytes => write!(
                f,
                ". Internal waste: {} are free in total, but in the tails of what live allocations hold, none taking the \
                 request",
                Bytes(free)
            ),
            OomCause::InternalWaste if free >= self.requested_bytes => write!(
                f,
                ". Internal waste: {} are free in total, enough for the request as asked, but not {}",
                Bytes(free),
                if self.new_block_bytes.is_some() { "for the new block" } else { "once rounded" }
            ),
            OomCause::InternalWaste => write!(
                f,
                ". Internal waste: {} are free in total; the {} of padding inside live allocations would have covered it",
                Bytes(free),
                Bytes(self.padding_bytes)
            ),
            OomCause::Exhaustion => f.write_str(". Exhaustion: not enough free memory in total, even without any waste"),
        }
    }
}

/// What was free when a request failed, in the one phrase every sentence about a refusal uses (the command line's
/// tables, the app's "Why it failed" and "Teach me", the demo): the bytes free in reserved memory and, where known,
/// what the device still had beside them, with the sum. The two go in one line because either alone misleads: 1000
/// MiB free reads as less than the 1 GiB asked, with the device's 584 MiB it is 1.55 GiB.
///
/// `1000.00 MiB free in reserved memory and 584.00 MiB more on the device, 1.55 GiB in all`; `... and none left on the
/// device`; `... free in reserved memory` where the device is not known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeMemory {
    /// Bytes free inside reserved memory.
    pub reserved_free_bytes: u64,
    /// What the device (or the budget) still had beside the reserved memory, where known.
    pub unreserved_bytes: Option<u64>,
}

impl FreeMemory {
    /// Bytes free in reserved memory and on the device beside it (where known).
    pub fn total_bytes(&self) -> u64 {
        self.reserved_free_bytes.saturating_add(self.unreserved_bytes.unwrap_or(0))
    }
}

impl fmt::Display for FreeMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let free = Bytes(self.reserved_free_bytes);
        match self.unreserved_bytes {
            Some(more) if more > 0 => {
                write!(
                    f,
                    "{free} free in reserved memory and {} more on the device, {} in all",
                    Bytes(more),
                    Bytes(self.total_bytes())
                )
            }
            Some(_) => write!(f, "{free} free in reserved memory and none left on the device"),
            None => write!(f, "{free} free in reserved memory"),
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
    fn free_memory_words_table() {
        let mib = 1 << 20;
        let cases = [
            (
                1000 * mib,
                Some(584 * mib),
                "1000.00 MiB free in reserved memory and 584.00 MiB more on the device, 1.55 GiB in all",
            ),
            (50 * mib, Some(0), "50.00 MiB free in reserved memory and none left on the device"),
            (50 * mib, None, "50.00 MiB free in reserved memory"),
            (0, Some(3 << 30), "0 B free in reserved memory and 3.00 GiB more on the device, 3.00 GiB in all"),
            (
                u64::MAX,
                Some(u64::MAX),
                "16777216.00 TiB free in reserved memory and 16777216.00 TiB more on the device, 16777216.00 TiB in all",
            ),
        ];
        for (reserved_free_bytes, unreserved_bytes, words) in cases {
            assert_eq!(FreeMemory { reserved_free_bytes, unreserved_bytes }.to_string(), words);
        }
    }

    #[test]
    fn judge_table() {
        // (requested, needed, free in blocks, unreserved, padding, cause)
        let cases = [
            (1024, 1024, 1000, 584, 0, OomCause::Fragmentation),
            (1024, 1024, 1000, 24, 0, OomCause::Fragmentation),
            (1024, 1024, 1000, 23, 0, OomCause::Exhaustion),
            (1024, 1024, 0, 0, 0, OomCause::Exhaustion),
            (1, 1, u64::MAX, u64::MAX, 0, OomCause::Fragmentation),
            // The request's own rounding: 15 fit, 16 do not.
            (15, 16, 10, 5, 0, OomCause::InternalWaste),
            // Padding inside live allocations (buddy's powers of two) would have covered it.
            (1024, 1024, 500, 0, 600, OomCause::InternalWaste),
            (1024, 1024, 500, 0, 523, OomCause::Exhaustion),
            (1024, 1024, 500, 0, 524, OomCause::InternalWaste),
        ];
        for (requested_bytes, needed_bytes, free_in_blocks_bytes, unreserved_bytes, padding_bytes, cause) in cases {
            let shortfall = Shortfall { requested_bytes, needed_bytes, free_in_blocks_bytes, unreserved_bytes, padding_bytes };
            assert_eq!(OomCause::judge(shortfall), cause, "{shortfall:?}");
        }
        assert_eq!(OomCause::InternalWaste.name(), "internal waste");
    }

    /// A request larger than any device is said to be so, whatever the heap had left: an unlimited device is simulated
    /// as 1 EiB, whose figures read as a limit (and a request that overflows once aligned has none to compare).
    #[test]
    fn words_for_a_request_no_device_holds() {
        let verdict = |requested_bytes: u64, needed_bytes: u64, unreserved_bytes: u64| {
            OomVerdict {
                policy: "tlsf",
                requested_bytes,
                needed_bytes,
                align_bytes: 512,
                reserved_bytes: 0,
                live_bytes: 0,
                padding_bytes: 0,
                free_in_blocks_bytes: 0,
                largest_free_run_bytes: 0,
                retired_bytes: 0,
                unreserved_bytes,
                capacity_bytes: None,
                virtual_range_bytes: None,
                new_block_bytes: None,
                cause: OomCause::Exhaustion,
            }
            .judged()
            .describe()
        };
        let gib = 1 << 30;
        // (requested, needed, unreserved, words)
        let cases = [
            (
                8 * gib,
                8 * gib,
                4 * gib,
                "tried to allocate 8.00 GiB; 0 B reserved, 0 B live (0 B padding), 0 B free inside usable blocks (largest free run 0 B), 4.00 GiB reservable from the device. Exhaustion",
            ),
            (LARGEST_DEVICE_BYTES, LARGEST_DEVICE_BYTES, 0, "1048576.00 TiB; 0 B reserved"),
            (
                1 << 63,
                1 << 63,
                LARGEST_DEVICE_BYTES,
                "tried to allocate 8388608.00 TiB: more than any device holds (heapscope models devices of up to 1 EiB)",
            ),
            (
                LARGEST_DEVICE_BYTES,
                LARGEST_DEVICE_BYTES + 512,
                0,
                "(1048576.00 TiB once rounded by the policy): more than any device holds",
            ),
            (
                u64::MAX,
                u64::MAX,
                0,
                "tried to allocate 16777216.00 TiB (past 2^64 B once rounded by the policy): more than any device holds",
            ),
        ];
        for (requested, needed, unreserved, words) in cases {
            let said = verdict(requested, needed, unreserved);
            assert!(said.contains(words), "{requested} B: {said}");
            assert_eq!(said.contains("reservable"), needed <= LARGEST_DEVICE_BYTES, "{said}");
        }
    }

    /// An allocator of one block size (gpu-allocator) refused for the new block it needs: the block is named as such,
    /// never as the request rounded (a 1 MiB request read "256.00 MiB once rounded by the policy").
    #[test]
    fn words_for_a_new_block_that_does_not_fit() {
        const MIB: u64 = 1 << 20;
        // (free in blocks, reservable, words)
        let cases = [
            (
                0,
                100 * MIB,
                "Internal waste: 100.00 MiB are free in total, enough for the request as asked, but not for the new block",
            ),
            (0, 0, "Exhaustion"),
            (200 * MIB, 100 * MIB, "Fragmentation: 300.00 MiB are free in total"),
        ];
        for (free_in_blocks_bytes, unreserved_bytes, words) in cases {
            let said = OomVerdict {
                policy: "gpu-allocator",
                requested_bytes: MIB,
                needed_bytes: 256 * MIB,
                align_bytes: 256,
                reserved_bytes: free_in_blocks_bytes,
                live_bytes: 0,
                padding_bytes: 0,
                free_in_blocks_bytes,
                largest_free_run_bytes: free_in_blocks_bytes.min(MIB / 2),
                retired_bytes: 0,
                unreserved_bytes,
                capacity_bytes: Some(free_in_blocks_bytes + unreserved_bytes),
                virtual_range_bytes: None,
                new_block_bytes: Some(256 * MIB),
                cause: OomCause::Exhaustion,
            }
            .judged()
            .describe();
            assert!(said.starts_with("tried to allocate 1.00 MiB (which needs a new block of 256.00 MiB); "), "{said}");
            assert!(said.contains(words) && !said.contains("rounded"), "{said}");
        }
    }
}
