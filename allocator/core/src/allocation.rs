//! Handles handed out by policies: where an allocation lives, how much it holds and who made it.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::ResourceKind;

/// Identifies one policy or heap instance, so a handle from another instance is refused on free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OwnerId(u32);

impl OwnerId {
    /// A new id, distinct from every other handed out in this process (until 2^32 instances).
    pub fn fresh() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Identifies a live allocation within its owner. Policies choose the encoding (a slot index and a
/// generation, a sequence number); the value is opaque to callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AllocationId(pub u64);

impl AllocationId {
    /// An id from a slot index and a generation counter.
    pub fn from_slot(slot: u32, generation: u32) -> Self {
        Self(u64::from(generation) << 32 | u64::from(slot))
    }

    /// The slot index of an id made by [`AllocationId::from_slot`].
    pub fn slot(self) -> u32 {
        self.0 as u32
    }

    /// The generation of an id made by [`AllocationId::from_slot`].
    pub fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// A live allocation: the caller's bytes `[offset, offset + size_bytes)` inside the footprint
/// `[footprint_offset, footprint_offset + footprint_bytes)` that the policy set aside for it (rounding,
/// alignment and size-class padding included).
///
/// It is `Copy` like a raw handle; freeing a copy twice is detected ([`Error::DoubleFree`](crate::Error)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Allocation {
    owner: OwnerId,
    id: AllocationId,
    offset: u64,
    size_bytes: u64,
    footprint_offset: u64,
    footprint_bytes: u64,
    kind: ResourceKind,
}

impl Allocation {
    /// Assembles a handle. For policy implementations (including ones outside this crate); a forged handle
    /// is refused on free, never undefined behaviour. Ends past `u64::MAX` saturate.
    pub fn from_parts(
        owner: OwnerId,
        id: AllocationId,
        offset: u64,
        size_bytes: u64,
        footprint: (u64, u64),
        kind: ResourceKind,
    ) -> Self {
        debug_assert!(
            footprint.0 <= offset
                && offset.checked_add(size_bytes).is_some_and(|end| end <= footprint.0.saturating_add(footprint.1)),
            "the footprint holds the allocation"
        );
        Self { owner, id, offset, size_bytes, footprint_offset: footprint.0, footprint_bytes: footprint.1, kind }
    }

    /// The instance that made it.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }

    /// Its id within the owner.
    pub fn id(&self) -> AllocationId {
        self.id
    }

    /// First byte of the caller's memory.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes requested.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// One past the caller's last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.size_bytes)
    }

    /// First byte the policy set aside.
    pub fn footprint_offset(&self) -> u64 {
        self.footprint_offset
    }

    /// Bytes the policy set aside (requested bytes plus padding).
    pub fn footprint_bytes(&self) -> u64 {
        self.footprint_bytes
    }

    /// One past the last byte set aside.
    pub fn footprint_end(&self) -> u64 {
        self.footprint_offset.saturating_add(self.footprint_bytes)
    }

    /// The resource kind it was requested for.
    pub fn kind(&self) -> ResourceKind {
        self.kind
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for (slot, generation) in [(0, 0), (1, 0), (u32::MAX, u32::MAX), (7, 3)] {
            let id = AllocationId::from_slot(slot, generation);
            assert_eq!((id.slot(), id.generation()), (slot, generation));
        }
        assert_ne!(OwnerId::fresh(), OwnerId::fresh());
    }
}
