//! [`GuardedHeap`]: debug margins with canary checks around every allocation of a `Heap<DeviceMemorySource>`,
//! like VMA's `VMA_DEBUG_MARGIN` + `VMA_DEBUG_DETECT_CORRUPTION`.
//!
//! # Design
//!
//! - A [`GuardedHeap`] wraps a [`Heap`] over a [`DeviceMemorySource`] whose blocks are host-visible and
//!   persistently mapped; with a margin above 0 it refuses any other source ([`MarginError::NotMapped`]).
//!   `margin_bytes` must be a multiple of 4 ([`MarginError::InvalidMargin`] otherwise).
//! - Layout ([`MarginLayout`]): a request of `size` bytes aligned to `align` becomes a request of
//!   `front + size + margin` bytes with the same alignment (and resource kind), where
//!   `front = margin` rounded up to `align`, so the caller's bytes start `front` bytes into the inner allocation
//!   and keep their alignment. The margin *before* is `front` bytes (at least `margin`), the margin *after* is
//!   exactly `margin` bytes, starting right at the caller's last byte + 1 (whatever its alignment).
//! - Both margins are filled through the mapping ([`DeviceMemorySource::write_bytes`], no `unsafe` here) with
//!   [`MAGIC`] as little-endian `u32`s: byte `i` of a margin is `MAGIC.to_le_bytes()[i % 4]`.
//! - [`GuardedHeap::free`] reads both margins first ([`DeviceMemorySource::read_bytes`]), then frees the
//!   allocation *whatever it found* (the heap stays consistent), then reports what was overwritten:
//!   [`MarginError::Corrupted`] with one [`Corruption`] per damaged side (the first bad byte, what was found
//!   there and what was expected). A stale or foreign handle is refused before anything is read.
//! - [`GuardedHeap::check_all`] scans the margins of every live allocation and returns every corruption.
//! - Handles ([`GuardedAllocation`]) show the caller's offset, address and size, margins excluded;
//!   [`GuardedAllocation::inner`] is the heap's allocation, margins included.
//! - `margin_bytes == 0` turns it all off: requests reach the heap unchanged, nothing is written or checked
//!   (any memory type is accepted then).
//!
//! Only what the host writes through the mapping between checks can be seen: like VMA, corruption is detected
//! late (on free or on `check_all`), never prevented.

use std::collections::BTreeMap;
use std::fmt;

use heapscope_core::{Heap, HeapAllocation, Request, SourceError};

use crate::DeviceMemorySource;

/// The canary pattern written into the margins, as little-endian `u32`s.
pub const MAGIC: u32 = 0xDEAD_C0DE;

/// Which margin of an allocation was overwritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The margin before the caller's first byte (an underrun).
    Before,
    /// The margin after the caller's last byte (an overrun).
    After,
}

/// One overwritten margin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Corruption {
    /// Index of the heap block holding the allocation.
    pub block: u32,
    /// The caller's offset of the allocation in its block (margins excluded).
    pub allocation_offset: u64,
    /// The caller's address of the allocation.
    pub address: u64,
    /// The caller's size of the allocation.
    pub size_bytes: u64,
    /// The damaged margin.
    pub side: Side,
    /// Offset in the block of the first byte that differs from the pattern.
    pub bad_byte_offset: u64,
    /// What that byte holds.
    pub found: u8,
    /// What it should hold.
    pub expected: u8,
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = match self.side {
            Side::Before => "before",
            Side::After => "after",
        };
        write!(
            f,
            "margin {side} the allocation of {} B at {:#x} (block {}, offset {}) overwritten: byte at block offset {} is {:#04x}, expected {:#04x}",
            self.size_bytes, self.address, self.block, self.allocation_offset, self.bad_byte_offset, self.found, self.expected
        )
    }
}

/// What a [`GuardedHeap`] refuses or detects.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum MarginError {
    /// A margin that is not a multiple of 4 bytes.
    #[error("invalid debug margin: {margin_bytes} bytes is not a multiple of 4")]
    InvalidMargin {
        /// The margin asked for.
        margin_bytes: u64,
    },
    /// Margins need host-visible, persistently mapped blocks.
    #[error("debug margins need host-visible, persistently mapped memory; {0}")]
    NotMapped(String),
    /// The heap refused (out of memory, double free, foreign handle, bad request).
    #[error(transparent)]
    Heap(#[from] heapscope_core::Error),
    /// Writing or reading a margin through the mapping failed.
    #[error("margin access failed: {0}")]
    Source(#[from] SourceError),
    /// Margins were overwritten (on [`GuardedHeap::free`], the allocation is freed all the same).
    #[error("memory corruption detected: {}", join(.0))]
    Corrupted(Vec<Corruption>),
}

fn join(corruptions: &[Corruption]) -> String {
    corruptions.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// Where the caller's bytes and the margins lie inside the enlarged allocation (pure arithmetic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MarginLayout {
    /// Bytes of the margin before the caller's bytes: the margin rounded up to the alignment (0 for no margin).
    pub front_bytes: u64,
    /// The caller's size.
    pub size_bytes: u64,
    /// Bytes of the margin after the caller's bytes.
    pub back_bytes: u64,
}

impl MarginLayout {
    /// The layout of a `size_bytes` request aligned to `align_bytes` (a power of two) with `margin_bytes` margins;
    /// `None` when the enlarged size overflows `u64`.
    pub fn new(margin_bytes: u64, size_bytes: u64, align_bytes: u64) -> Option<Self> {
        let front_bytes = margin_bytes.checked_next_multiple_of(align_bytes.max(1))?;
        let layout = Self { front_bytes, size_bytes, back_bytes: margin_bytes };
        layout.enlarged_size_bytes().map(|_| layout)
    }

    /// The size asked of the heap: `front + size + back`.
    pub fn enlarged_size_bytes(&self) -> Option<u64> {
        self.front_bytes.checked_add(self.size_bytes)?.checked_add(self.back_bytes)
    }

    /// The caller's offset, for an inner allocation at `inner_offset`.
    pub fn user_offset(&self, inner_offset: u64) -> u64 {
        inner_offset + self.front_bytes
    }

    /// Offset of the margin after, for an inner allocation at `inner_offset`.
    pub fn back_offset(&self, inner_offset: u64) -> u64 {
        self.user_offset(inner_offset) + self.size_bytes
    }
}

/// `len` bytes of the canary pattern.
pub fn pattern(len: u64) -> Vec<u8> {
    let magic = MAGIC.to_le_bytes();
    (0..len).map(|i| magic[(i % 4) as usize]).collect()
}

/// A live allocation of a [`GuardedHeap`]: the caller's bytes, margins excluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GuardedAllocation {
    inner: HeapAllocation,
    layout: MarginLayout,
}

impl GuardedAllocation {
    /// Index of the block holding it.
    pub fn block(&self) -> u32 {
        self.inner.block()
    }

    /// The caller's offset in the block.
    pub fn offset(&self) -> u64 {
        self.layout.user_offset(self.inner.offset())
    }

    /// The caller's address.
    pub fn address(&self) -> u64 {
        self.layout.user_offset(self.inner.address())
    }

    /// The caller's size.
    pub fn size_bytes(&self) -> u64 {
        self.layout.size_bytes
    }

    /// The heap's allocation, margins included.
    pub fn inner(&self) -> &HeapAllocation {
        &self.inner
    }

    /// Its layout.
    pub fn layout(&self) -> MarginLayout {
        self.layout
    }
}

/// A heap whose allocations are surrounded by canary margins. See the module documentation.
#[derive(Debug)]
pub struct GuardedHeap {
    heap: Heap<DeviceMemorySource>,
    margin_bytes: u64,
    /// Live allocations by inner address.
    live: BTreeMap<u64, GuardedAllocation>,
}

impl GuardedHeap {
    /// Wraps `heap` with `margin_bytes` margins (0: none).
    ///
    /// # Errors
    /// [`MarginError::InvalidMargin`] when the margin is not a multiple of 4; [`MarginError::NotMapped`] when it is
    /// positive and the source's blocks are not host-visible and persistently mapped.
    pub fn new(heap: Heap<DeviceMemorySource>, margin_bytes: u64) -> Result<Self, MarginError> {
        if !margin_bytes.is_multiple_of(4) {
            return Err(MarginError::InvalidMargin { margin_bytes });
        }
        if margin_bytes > 0 && !heap.source().config().persistent_mapping {
            let memory_type = heap.source().memory_type();
            return Err(MarginError::NotMapped(format!(
                "memory type {} ({:?}) is not mapped by its source",
                memory_type.index, memory_type.property_flags
            )));
        }
        Ok(Self { heap, margin_bytes, live: BTreeMap::new() })
    }

    /// The margin on each side (the one before may be larger, to keep the alignment).
    pub fn margin_bytes(&self) -> u64 {
        self.margin_bytes
    }

    /// The heap underneath.
    pub fn heap(&self) -> &Heap<DeviceMemorySource> {
        &self.heap
    }

    /// The memory source (for `write_bytes` / `read_bytes` at the caller's addresses).
    pub fn source(&self) -> &DeviceMemorySource {
        self.heap.source()
    }

    /// Live allocations.
    pub fn live_allocations(&self) -> usize {
        self.live.len()
    }

    /// Gives the heap back (live allocations stay live in it).
    pub fn into_inner(self) -> Heap<DeviceMemorySource> {
        self.heap
    }

    /// Serves `request` with margins around it, filled with the pattern.
    ///
    /// # Errors
    /// [`MarginError::Heap`] when the heap refuses (out of memory, or the enlarged size overflows);
    /// [`MarginError::Source`] when the margins cannot be written (the allocation is freed again).
    pub fn allocate(&mut self, request: Request, label: Option<&str>) -> Result<GuardedAllocation, MarginError> {
        let (size_bytes, align_bytes) = (request.size_bytes(), request.align_bytes());
        let layout = MarginLayout::new(self.margin_bytes, size_bytes, align_bytes)
            .ok_or(heapscope_core::Error::SizeOverflow { size_bytes, align_bytes })?;
        let enlarged = if self.margin_bytes == 0 {
            request
        } else {
            let enlarged_size =
                layout.enlarged_size_bytes().ok_or(heapscope_core::Error::SizeOverflow { size_bytes, align_bytes })?;
            Request::new(enlarged_size, align_bytes)?.with_kind(request.kind())
        };
        let inner = self.heap.allocate(enlarged, label)?;
        let allocation = GuardedAllocation { inner, layout };
        if self.margin_bytes > 0 {
            let written =
                self.heap.source().write_bytes(inner.address(), &pattern(layout.front_bytes)).and_then(|()| {
                    self.heap.source().write_bytes(allocation.address() + size_bytes, &pattern(layout.back_bytes))
                });
            if let Err(error) = written {
                self.heap.free(inner)?;
                return Err(error.into());
            }
        }
        self.live.insert(inner.address(), allocation);
        Ok(allocation)
    }

    /// Checks both margins of `allocation`, then frees it, whatever the check found.
    ///
    /// # Errors
    /// [`MarginError::Heap`] for a stale or foreign handle (nothing is read or changed then);
    /// [`MarginError::Corrupted`] when a margin was overwritten, [`MarginError::Source`] when it could not be
    /// read: the allocation is freed in both cases.
    pub fn free(&mut self, allocation: GuardedAllocation) -> Result<(), MarginError> {
        let inner = allocation.inner;
        if self.live.get(&inner.address()) != Some(&allocation) {
            // Not ours or not live: the heap says which, and changes nothing.
            self.heap.free(inner)?;
            return Err(MarginError::Source(SourceError::Failed(format!(
                "{allocation:?} was freed by the heap but not tracked by its guard"
            ))));
        }
        let checked = self.check(&allocation);
        self.live.remove(&inner.address());
        self.heap.free(inner)?;
        let corruptions = checked?;
        if corruptions.is_empty() { Ok(()) } else { Err(MarginError::Corrupted(corruptions)) }
    }

    /// The corruptions of every live allocation's margins, by address (empty: all intact).
    ///
    /// # Errors
    /// [`MarginError::Source`] when a margin cannot be read.
    pub fn check_all(&self) -> Result<Vec<Corruption>, MarginError> {
        let mut corruptions = Vec::new();
        for allocation in self.live.values() {
            corruptions.extend(self.check(allocation)?);
        }
        Ok(corruptions)
    }

    /// The damaged margins of one live allocation.
    fn check(&self, allocation: &GuardedAllocation) -> Result<Vec<Corruption>, MarginError> {
        if self.margin_bytes == 0 {
            return Ok(Vec::new());
        }
        let layout = allocation.layout;
        let inner = allocation.inner;
        let mut corruptions = Vec::new();
        let sides = [
            (Side::Before, inner.address(), inner.offset(), layout.front_bytes),
            (Side::After, allocation.address() + layout.size_bytes, layout.back_offset(inner.offset()), layout.back_bytes),
        ];
        for (side, address, offset, len) in sides {
            let len_usize = usize::try_from(len).map_err(|_| SourceError::Failed("margin exceeds usize".into()))?;
            let mut found = vec![0; len_usize];
            self.heap.source().read_bytes(address, &mut found)?;
            let expected = pattern(len);
            if let Some((index, (&found, &expected))) = (0_u64..).zip(found.iter().zip(&expected)).find(|(_, (a, b))| a != b) {
                corruptions.push(Corruption {
                    block: inner.block(),
                    allocation_offset: allocation.offset(),
                    address: allocation.address(),
                    size_bytes: layout.size_bytes,
                    side,
                    bad_byte_offset: offset + index,
                    found,
                    expected,
                });
            }
        }
        Ok(corruptions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_enlarges_by_two_margins_and_shifts_the_offset() {
        let layout = MarginLayout::new(16, 100, 4).unwrap();
        assert_eq!(layout, MarginLayout { front_bytes: 16, size_bytes: 100, back_bytes: 16 });
        assert_eq!(layout.enlarged_size_bytes(), Some(132));
        assert_eq!(layout.user_offset(256), 272);
        assert_eq!(layout.back_offset(256), 372);
    }

    #[test]
    fn layout_keeps_the_alignment() {
        // The margin before grows to the alignment, so the caller's offset stays aligned.
        let layout = MarginLayout::new(16, 10, 256).unwrap();
        assert_eq!((layout.front_bytes, layout.back_bytes), (256, 16));
        assert_eq!(layout.enlarged_size_bytes(), Some(282));
        assert_eq!(layout.user_offset(512) % 256, 0);
        // Alignments below the margin leave it as it is.
        assert_eq!(MarginLayout::new(64, 1, 1).unwrap().front_bytes, 64);
        assert_eq!(MarginLayout::new(64, 1, 64).unwrap().front_bytes, 64);
    }

    #[test]
    fn no_margin_is_no_overhead() {
        let layout = MarginLayout::new(0, 1000, 4096).unwrap();
        assert_eq!(layout.enlarged_size_bytes(), Some(1000));
        assert_eq!(layout.user_offset(8192), 8192);
    }

    #[test]
    fn overflow_is_none() {
        assert_eq!(MarginLayout::new(16, u64::MAX - 20, 1), None);
        assert_eq!(MarginLayout::new(u64::MAX - 3, 1, 1 << 63), None);
    }

    #[test]
    fn pattern_is_the_magic_little_endian() {
        assert_eq!(pattern(6), vec![0xDE, 0xC0, 0xAD, 0xDE, 0xDE, 0xC0]);
        assert!(pattern(0).is_empty());
    }
}
