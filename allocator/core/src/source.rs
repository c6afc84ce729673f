//! Where a heap gets its blocks (segments): the `MemorySource` trait, and a simulated source that hands out
//! address ranges the way `cudaMalloc` or `vkAllocateMemory` would. Device memory sources implement the same
//! trait in the backend crates.

use crate::hash::FastMap;
use std::fmt;

/// A block of memory from a source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SourceBlock {
    /// The source's own handle for it.
    pub handle: u64,
    /// Address of the first byte (device address, or simulated).
    pub base_address: u64,
    /// Its size.
    pub size_bytes: u64,
}

/// Why a source could not hand out a block.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The device (or simulated device) has no memory left for a block of this size.
    #[error("out of device memory for a block of {requested_bytes} bytes")]
    OutOfMemory {
        /// The block size asked for.
        requested_bytes: u64,
    },
    /// Anything else (device lost, a driver error).
    #[error("{0}")]
    Failed(String),
}

/// One copy between blocks of a source: `size_bytes` from block `from_block` at `from_offset_bytes` to block
/// `to_block` at `to_offset_bytes` (blocks by their [`SourceBlock::handle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    /// The block copied from.
    pub from_block: u64,
    /// Where in it.
    pub from_offset_bytes: u64,
    /// The block copied to.
    pub to_block: u64,
    /// Where in it.
    pub to_offset_bytes: u64,
    /// How many bytes.
    pub size_bytes: u64,
}

/// Hands out and takes back blocks of memory.
pub trait MemorySource: fmt::Debug {
    /// What the source is, for reports (`simulated`, a device name).
    fn name(&self) -> &str;

    /// Block sizes are multiples of this, and block addresses aligned to it.
    fn block_alignment_bytes(&self) -> u64;

    /// A new block of `size_bytes` (a multiple of `block_alignment_bytes`), ending at or below `u64::MAX`.
    ///
    /// # Errors
    /// [`SourceError::OutOfMemory`] when the device has no room, [`SourceError::Failed`] otherwise.
    fn allocate_block(&mut self, size_bytes: u64) -> Result<SourceBlock, SourceError>;

    /// Returns a block. A block the source did not hand out, or already took back, is ignored.
    fn free_block(&mut self, block: SourceBlock);

    /// Bytes the source could still hand out, when it knows.
    fn available_bytes(&self) -> Option<u64>;

    /// Copies bytes between its live blocks, in order: each copy complete before the next begins (a later copy may
    /// read what an earlier one wrote, or overwrite what it read), none overlapping itself. What a heap's compaction
    /// asks before it gives emptied blocks back. Default: nothing to copy (a simulated device holds no bytes).
    ///
    /// # Errors
    /// [`SourceError::Failed`] when the device cannot copy; the destinations then hold no defined bytes.
    fn copy_between_blocks(&mut self, copies: &[BlockCopy]) -> Result<(), SourceError> {
        let _ = copies;
        Ok(())
    }
}

/// The largest device heapscope models (1 EiB): a run on a device of no stated capacity runs on one this large, and
/// a request above it fits no device (every verdict says so, rather than what such a device has left).
pub const LARGEST_DEVICE_BYTES: u64 = 1 << 60;

/// A device of `capacity_bytes`, simulated: blocks get increasing addresses (never reused, like virtual
/// addresses) and fail once the capacity is used up.
#[derive(Clone, Debug)]
pub struct SimulatedSource {
    capacity_bytes: u64,
    alignment_bytes: u64,
    used_bytes: u64,
    /// Live blocks by handle, with their sizes.
    live: FastMap<u64, u64>,
    next_address: u64,
    next_handle: u64,
    /// Blocks handed out so far.
    pub blocks_allocated: u64,
    /// Blocks returned so far.
    pub blocks_freed: u64,
}

impl SimulatedSource {
    /// The base of the first block: an address in the range CUDA and Vulkan drivers use on Linux.
    pub const BASE_ADDRESS: u64 = 0x7f00_0000_0000;

    /// The block unit of `cudaMalloc` segments (2 MiB), a sensible default for simulated devices.
    pub const DEFAULT_ALIGNMENT_BYTES: u64 = 2 << 20;

    /// A device of `capacity_bytes` handing out blocks in multiples of `alignment_bytes`.
    ///
    /// # Panics
    /// When `alignment_bytes` is not a power of two (a programming error: it is a constant of the caller).
    pub fn new(capacity_bytes: u64, alignment_bytes: u64) -> Self {
        assert!(alignment_bytes.is_power_of_two(), "block alignment must be a power of two");
        Self {
            capacity_bytes,
            alignment_bytes,
            used_bytes: 0,
            live: FastMap::default(),
            next_address: Self::BASE_ADDRESS,
            next_handle: 1,
            blocks_allocated: 0,
            blocks_freed: 0,
        }
    }

    /// Bytes handed out and not returned.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }
}

/// What every source checks first: a block size must be a positive multiple of the source's block alignment.
///
/// # Errors
/// [`SourceError::Failed`] saying so.
pub fn check_block_size(size_bytes: u64, alignment_bytes: u64) -> Result<(), SourceError> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(alignment_bytes) {
        return Err(SourceError::Failed(format!("block size {size_bytes} is not a positive multiple of {alignment_bytes}")));
    }
    Ok(())
}

impl MemorySource for SimulatedSource {
    fn name(&self) -> &str {
        "simulated"
    }

    fn block_alignment_bytes(&self) -> u64 {
        self.alignment_bytes
    }

    fn allocate_block(&mut self, size_bytes: u64) -> Result<SourceBlock, SourceError> {
        check_block_size(size_bytes, self.alignment_bytes)?;
        let fits_address_space = self.next_address.checked_add(size_bytes).is_some();
        if size_bytes > self.capacity_bytes - self.used_bytes || !fits_address_space {
            return Err(SourceError::OutOfMemory { requested_bytes: size_bytes });
        }
        let block = SourceBlock { handle: self.next_handle, base_address: self.next_address, size_bytes };
        self.next_handle += 1;
        self.next_address += size_bytes;
        self.used_bytes += size_bytes;
        self.live.insert(block.handle, size_bytes);
        self.blocks_allocated += 1;
        Ok(block)
    }

    fn free_block(&mut self, block: SourceBlock) {
        if let Some(size_bytes) = self.live.remove(&block.handle) {
            self.used_bytes -= size_bytes;
            self.blocks_freed += 1;
        }
    }

    fn available_bytes(&self) -> Option<u64> {
        // Bytes left on the device, and in the simulated address space after the last block.
        let address_space_left = (u64::MAX - self.next_address).saturating_add(1) & !(self.alignment_bytes - 1);
        Some((self.capacity_bytes - self.used_bytes).min(address_space_left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_and_alignment_table() {
        let mut source = SimulatedSource::new(10 << 20, 2 << 20);
        let cases = [
            (4 << 20, Ok(SimulatedSource::BASE_ADDRESS)),
            (1 << 20, Err(())),
            (8 << 20, Err(())),
            (6 << 20, Ok(SimulatedSource::BASE_ADDRESS + (4 << 20))),
            (2 << 20, Err(())),
        ];
        for (size, expected) in cases {
            let got = source.allocate_block(size).map(|block| block.base_address).map_err(|_| ());
            assert_eq!(got, expected, "size {size}");
        }
        assert_eq!(source.available_bytes(), Some(0));
        assert!(matches!(source.allocate_block(2 << 20), Err(SourceError::OutOfMemory { .. })));
        let mut near_the_end = SimulatedSource::new(u64::MAX, 2 << 20);
        let largest_aligned = u64::MAX - (2 << 20) + 1;
        let overflowing = near_the_end.allocate_block(largest_aligned);
        assert!(matches!(overflowing, Err(SourceError::OutOfMemory { .. })), "a block must end inside the address space");
        let stranger = SourceBlock { handle: 99, base_address: 0, size_bytes: 4 << 20 };
        source.free_block(stranger);
        assert_eq!((source.used_bytes(), source.blocks_freed), (10 << 20, 0), "unknown blocks are ignored");
    }
}
