//! [`ExternalHeap`]: an external allocator on the device as a heapscope [`DeviceHeap`], written once for all of
//! them; [`ExternalAllocator`] is what differs between them: talking to the allocator. Its two implementations
//! are [`crate::VmaBackend`] ([`crate::VmaHeap`]) and [`crate::GpuAllocatorBackend`] ([`crate::GpuAllocatorHeap`]),
//! both set up by one [`ExternalConfig`] (block size, budget cap) and brought up by [`ExternalHeap::new`].
//!
//! The heap owns the allocator and its books (`ExternalBook`: slots, blocks, reserved / live bytes, device events,
//! refusals). An allocation is the allocator's ([`ExternalAllocator::allocate`], which keeps the blocks in the
//! books up to date) put in a slot of the books; a free takes it out of its slot (a foreign handle or a double
//! free is refused there, before the allocator sees it) and hands it to [`ExternalAllocator::free`]. The
//! allocator is declared before the books, which hold the device context: it is dropped (its blocks freed) while
//! the device is alive, after [`ExternalAllocator::free_all`] freed what was still live.

use std::fmt;
use std::sync::Arc;

use heapscope_core::compaction::{Algorithm, Budget};
use heapscope_core::{Allocation, DeviceEvent, DeviceHeap, Request, Result, moved_indices};

use crate::VulkanContext;
use crate::external::{ExternalBook, ExternalHandle};

/// How an external allocator's heap is set up ([`crate::VmaConfig`], [`crate::GpuAllocatorConfig`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExternalConfig {
    /// The allocator's block size. VMA: `preferredLargeHeapBlockSize`, its block size on heaps above 1 GiB
    /// (smaller heaps get an eighth of their size; VMA starts with smaller blocks and grows to this).
    /// gpu-allocator: clamped to 4..=256 MiB, a multiple of 4 MiB; larger requests get a block of their own.
    pub block_size_bytes: u64,
    /// At most this many bytes reserved at once (VMA: its heap size limit; gpu-allocator: checked before it
    /// allocates); a request that would need more fails with [`heapscope_core::Error::OutOfMemory`].
    pub budget_cap_bytes: Option<u64>,
}

impl Default for ExternalConfig {
    /// 256 MiB blocks (both allocators' default), no cap.
    fn default() -> Self {
        Self { block_size_bytes: 256 << 20, budget_cap_bytes: None }
    }
}

/// Where the allocator put an allocation: what the heap keeps of it, its offset in its block, and the block's
/// synthetic base address.
#[derive(Debug)]
pub struct Placed<L> {
    /// The allocator's own allocation.
    pub live: L,
    /// Its offset in its block.
    pub offset_bytes: u64,
    /// The synthetic base address of its block (from the books).
    pub block_base: u64,
}

/// What an external allocator does for an [`ExternalHeap`]: its name, and its allocation and free calls, keeping
/// the books' blocks up to date. Implemented by this crate's wrappers ([`crate::VmaBackend`],
/// [`crate::GpuAllocatorBackend`]); the books' writers are the crate's own.
pub trait ExternalAllocator: Sized {
    /// What the heap keeps of a live allocation (the allocator's own allocation, and whatever its free needs).
    type Live;

    /// The heap's policy name, in verdicts and errors.
    const POLICY: &'static str;

    /// The synthetic address of the heap's first block (each allocator its own space, apart from the other
    /// contenders').
    const BASE_ADDRESS: u64;

    /// The allocator on `context`'s device (it keeps the context alive for as long as it lives).
    ///
    /// # Errors
    /// [`heapscope_core::Error::Source`] when the allocator refuses the device.
    fn new(context: &Arc<VulkanContext>, config: ExternalConfig) -> Result<Self>;

    /// The settings.
    fn config(&self) -> &ExternalConfig;

    /// Serves `request`: the allocator's allocation, every block it reserved recorded in `book` (and every block it
    /// released).
    ///
    /// # Errors
    /// [`heapscope_core::Error::OutOfMemory`] with the verdict (the refusal counted in `book`); other errors are
    /// failures.
    fn allocate(&mut self, book: &mut ExternalBook<Self::Live>, request: Request) -> Result<Placed<Self::Live>>;

    /// Frees `live` (already out of its slot), recording in `book` the blocks the allocator released.
    ///
    /// # Errors
    /// The allocator's failure.
    fn free(&mut self, book: &mut ExternalBook<Self::Live>, live: Self::Live) -> Result<()>;

    /// Frees every allocation still live (`live`, out of their slots): the heap is being dropped, the allocator
    /// next.
    fn free_all(&mut self, book: &mut ExternalBook<Self::Live>, live: Vec<Self::Live>);

    /// Whether it defragments ([`ExternalAllocator::compact`] moves something).
    const DEFRAGMENTS: bool = false;

    /// Moves allocations of `movable` (the others stay) with the allocator's own defragmentation, by `algorithm`
    /// within `budget`, copying their bytes on the device; returns each move as the handle before and after, in
    /// order, the books updated (a moved allocation keeps its slot under a new handle). Default: moves nothing.
    ///
    /// # Errors
    /// The allocator's or the device's failure.
    fn compact(
        &mut self,
        book: &mut ExternalBook<Self::Live>,
        movable: &[ExternalHandle],
        algorithm: Algorithm,
        budget: Budget,
    ) -> Result<Vec<(ExternalHandle, ExternalHandle)>> {
        let _ = (book, movable, algorithm, budget);
        Ok(Vec::new())
    }

    /// The device's time for the copies of every compaction so far, ns.
    fn copy_nanos(&self) -> u64 {
        0
    }
}

/// An external allocator as a heapscope [`DeviceHeap`]. See the module documentation.
pub struct ExternalHeap<A: ExternalAllocator> {
    // Declared first: dropped (its blocks freed) while the device, held by the books, is alive.
    allocator: A,
    book: ExternalBook<A::Live>,
}

impl<A: ExternalAllocator + fmt::Debug> fmt::Debug for ExternalHeap<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExternalHeap")
            .field("allocator", &self.allocator)
            .field("blocks", &self.book.live_blocks())
            .field("reserved_bytes", &self.book.reserved_bytes())
            .field("live_bytes", &self.book.live_bytes())
            .finish_non_exhaustive()
    }
}

impl<A: ExternalAllocator> ExternalHeap<A> {
    /// The synthetic address of the first block (apart from the other contenders' spaces).
    pub const BASE_ADDRESS: u64 = A::BASE_ADDRESS;

    /// Block addresses are multiples of this.
    pub const ADDRESS_ALIGNMENT_BYTES: u64 = 64 << 10;

    /// The allocator on `context`'s device, with empty books.
    ///
    /// # Errors
    /// [`heapscope_core::Error::Source`] when the allocator refuses the device.
    pub fn new(context: Arc<VulkanContext>, config: ExternalConfig) -> Result<Self> {
        let allocator = A::new(&context, config)?;
        let book = ExternalBook::new(context, A::POLICY, Self::BASE_ADDRESS, Self::ADDRESS_ALIGNMENT_BYTES);
        Ok(Self { allocator, book })
    }

    /// The settings.
    pub fn config(&self) -> &ExternalConfig {
        self.allocator.config()
    }

    /// The allocator.
    pub(crate) fn allocator(&self) -> &A {
        &self.allocator
    }

    /// The allocator and the books, both mutable.
    pub(crate) fn parts(&mut self) -> (&mut A, &mut ExternalBook<A::Live>) {
        (&mut self.allocator, &mut self.book)
    }

    /// The context.
    pub fn context(&self) -> &Arc<VulkanContext> {
        self.book.context()
    }

    /// Bytes reserved in the allocator's blocks now.
    pub fn reserved_bytes(&self) -> u64 {
        self.book.reserved_bytes()
    }

    /// The most bytes reserved at once.
    pub fn peak_reserved_bytes(&self) -> u64 {
        self.book.peak_reserved_bytes()
    }

    /// Live blocks.
    pub fn live_blocks(&self) -> usize {
        self.book.live_blocks()
    }

    /// Live allocations.
    pub fn live_allocations(&self) -> usize {
        self.book.live_allocations()
    }

    /// Refused requests.
    pub fn ooms(&self) -> u64 {
        self.book.ooms()
    }

    /// The device's time for the copies of every compaction so far, ns (0 for an allocator that does not defragment).
    pub fn copy_nanos(&self) -> u64 {
        self.allocator.copy_nanos()
    }
}

impl<A: ExternalAllocator> DeviceHeap for ExternalHeap<A> {
    type Handle = ExternalHandle;

    fn allocate_request(&mut self, request: Request) -> Result<ExternalHandle> {
        let placed = self.allocator.allocate(&mut self.book, request)?;
        let allocation = self.book.insert(placed.live, placed.offset_bytes, request.size_bytes())?;
        Ok(ExternalHandle::new(allocation, placed.block_base))
    }

    fn free_handle(&mut self, handle: ExternalHandle) -> Result<()> {
        let live = self.book.remove(handle.allocation())?;
        self.allocator.free(&mut self.book, live)
    }

    fn allocation(handle: &ExternalHandle) -> &Allocation {
        handle.allocation()
    }

    fn address(handle: &ExternalHandle) -> u64 {
        handle.address()
    }

    fn block_base(handle: &ExternalHandle) -> u64 {
        handle.block_base()
    }

    fn record_device_events(&mut self, on: bool) {
        self.book.record_device_events(on);
    }

    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        self.book.take_device_events()
    }

    fn policy_name(&self) -> &'static str {
        A::POLICY
    }

    fn reserved_and_live_bytes(&self) -> (u64, u64) {
        self.book.reserved_and_live_bytes()
    }

    fn count_oom(&mut self) {
        self.book.count_oom();
    }

    fn compact(
        &mut self,
        movable: &[(ExternalHandle, Request)],
        algorithm: Algorithm,
        budget: Budget,
    ) -> Result<Vec<(usize, ExternalHandle)>> {
        let handles: Vec<ExternalHandle> = movable.iter().map(|&(handle, _)| handle).collect();
        let moves = self.allocator.compact(&mut self.book, &handles, algorithm, budget)?;
        Ok(moved_indices(movable, moves))
    }
}

impl<A: ExternalAllocator> Drop for ExternalHeap<A> {
    /// Frees what is still live so the allocator destroys its blocks cleanly; the allocator itself frees the rest
    /// when dropped, before the books (field order), which then take the blocks left off the device's count.
    fn drop(&mut self) {
        let live = self.book.take_all_live();
        self.allocator.free_all(&mut self.book, live);
    }
}
