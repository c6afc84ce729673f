//! [`ExternalBook`]: the bookkeeping every external allocator wrapped as a heapscope [`DeviceHeap`] shares
//! ([`crate::GpuAllocatorHeap`], [`crate::VmaHeap`]: both a [`crate::ExternalHeap`], which keeps the books), so
//! each wrapper keeps only what talks to its allocator.
//!
//! - [`ExternalHandle`], the handle both heaps give out (an allocation and its block's synthetic address);
//! - a generation-checked slot table of the allocator's live allocations (`L`), which hands out heapscope
//!   [`Allocation`]s and refuses foreign handles and double frees with the heap's policy name;
//! - the allocator's blocks (`VkDeviceMemory`) keyed by handle, with synthetic base addresses (increasing from the
//!   heap's base, aligned, never reused), counted in [`VulkanContext::live_allocation_count`];
//! - reserved (and peak reserved) and live bytes, refused requests and their verdicts from what the allocator says
//!   of its blocks ([`BlockUsage`]), and the optional device-event log;
//! - the parts of [`DeviceHeap`] that only read those ([`ExternalBook::record_device_events`] and the rest).
//!
//! [`DeviceHeap`]: heapscope_core::DeviceHeap

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ash::vk;
use heapscope_core::{
    Allocation, AllocationId, DeviceEvent, Error, OomCause, OomVerdict, OwnerId, Request, ResourceKind, Result,
};

use crate::VulkanContext;

/// A live allocation of an external allocator's heap ([`crate::VmaHandle`], [`crate::GpuAllocatorHandle`]): `Copy`,
/// like heapscope's own handles; the allocator's own allocation stays inside the heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExternalHandle {
    allocation: Allocation,
    block_base: u64,
}

impl ExternalHandle {
    /// `allocation` in the block at synthetic address `block_base`.
    pub(crate) fn new(allocation: Allocation, block_base: u64) -> Self {
        Self { allocation, block_base }
    }

    /// The allocation: offset and size in its block.
    pub fn allocation(&self) -> &Allocation {
        &self.allocation
    }

    /// The synthetic base address of its block.
    pub fn block_base(&self) -> u64 {
        self.block_base
    }

    /// Its synthetic address: block base plus offset.
    pub fn address(&self) -> u64 {
        self.block_base + self.allocation.offset()
    }
}

/// A live block of the external allocator, keyed by its memory handle.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub(crate) base_address: u64,
    pub(crate) size_bytes: u64,
    /// Live allocations in it, for wrappers that tell an empty block apart themselves (gpu-allocator).
    pub(crate) live_allocations: u64,
}

/// What an external allocator says of its blocks when it refuses a request, for the verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockUsage {
    /// Bytes in its blocks.
    pub(crate) reserved_bytes: u64,
    /// Bytes of its blocks allocated (alignment padding included).
    pub(crate) allocated_bytes: u64,
    /// The largest free range in a block.
    pub(crate) largest_free_run_bytes: u64,
}

/// A live allocation in the slot table.
#[derive(Debug)]
struct Live<L> {
    inner: L,
    generation: u32,
}

/// The shared bookkeeping of an external allocator as a heapscope heap. See the module documentation. Public
/// only as a parameter of [`crate::ExternalAllocator`]'s methods: its writers are the crate's own.
#[derive(Debug)]
pub struct ExternalBook<L> {
    context: Arc<VulkanContext>,
    policy: &'static str,
    owner: OwnerId,
    slots: Vec<Option<Live<L>>>,
    generations: Vec<u32>,
    free_slots: Vec<u32>,
    blocks: HashMap<vk::DeviceMemory, Block>,
    next_address: u64,
    address_alignment_bytes: u64,
    reserved_bytes: u64,
    peak_reserved_bytes: u64,
    live_bytes: u64,
    ooms: u64,
    events: Option<Vec<DeviceEvent>>,
}

impl<L> ExternalBook<L> {
    /// Empty books for the heap named `policy`, its first block at `base_address`, block addresses multiples of
    /// `address_alignment_bytes`.
    pub(crate) fn new(
        context: Arc<VulkanContext>,
        policy: &'static str,
        base_address: u64,
        address_alignment_bytes: u64,
    ) -> Self {
        Self {
            context,
            policy,
            owner: OwnerId::fresh(),
            slots: Vec::new(),
            generations: Vec::new(),
            free_slots: Vec::new(),
            blocks: HashMap::new(),
            next_address: base_address,
            address_alignment_bytes,
            reserved_bytes: 0,
            peak_reserved_bytes: 0,
            live_bytes: 0,
            ooms: 0,
            events: None,
        }
    }

    /// The device context.
    pub(crate) fn context(&self) -> &Arc<VulkanContext> {
        &self.context
    }

    /// Bytes reserved in the allocator's blocks now.
    pub(crate) fn reserved_bytes(&self) -> u64 {
        self.reserved_bytes
    }

    /// The most bytes reserved at once.
    pub(crate) fn peak_reserved_bytes(&self) -> u64 {
        self.peak_reserved_bytes
    }

    /// Bytes of live allocations (as requested).
    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Live blocks.
    pub(crate) fn live_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Live allocations.
    pub(crate) fn live_allocations(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    /// Refused requests.
    pub(crate) fn ooms(&self) -> u64 {
        self.ooms
    }

    /// Counts a refused request.
    pub(crate) fn count_oom(&mut self) {
        self.ooms += 1;
    }

    /// `(reserved, live)` bytes, as [`heapscope_core::DeviceHeap::reserved_and_live_bytes`].
    pub(crate) fn reserved_and_live_bytes(&self) -> (u64, u64) {
        (self.reserved_bytes, self.live_bytes)
    }

    /// Counts a refused request of `request` and judges it from `usage`, the device's heap budgets and the
    /// heap's cap (`budget_cap_bytes`, on the reserved bytes). `new_block_bytes`: the block the library would have
    /// reserved for it, where that is what did not fit (the request needs that much of the unreserved memory: a 3 MiB
    /// request under a 3 MiB cap is refused for gpu-allocator's 4 MiB block, which read as fragmentation of nothing).
    pub(crate) fn verdict(
        &mut self,
        request: Request,
        usage: BlockUsage,
        budget_cap_bytes: Option<u64>,
        new_block_bytes: Option<u64>,
    ) -> OomVerdict {
        self.count_oom();
        let BlockUsage { reserved_bytes, allocated_bytes, largest_free_run_bytes } = usage;
        let free_in_blocks_bytes = reserved_bytes.saturating_sub(allocated_bytes);
        // What a heap has left, at most its budget less what the library holds: a driver's usage may leave those
        // blocks out (lavapipe's does), and 22 GiB read as reservable after 23 GiB of a 23.5 GiB heap were taken.
        let device_left: u64 = self
            .context
            .heap_budgets()
            .iter()
            .map(|heap| heap.available_bytes().min(heap.budget_bytes.saturating_sub(reserved_bytes)))
            .max()
            .unwrap_or(0);
        let cap_left = budget_cap_bytes.map_or(u64::MAX, |cap| cap.saturating_sub(reserved_bytes));
        let unreserved_bytes = device_left.min(cap_left);
        let aligned_bytes = request.size_bytes().next_multiple_of(request.align_bytes());
        // A block no larger than the request (a dedicated one) is the request's own size, no new block of the library's.
        let new_block_bytes = new_block_bytes.filter(|&block| block > aligned_bytes);
        let needed_bytes = new_block_bytes.unwrap_or(aligned_bytes);
        OomVerdict {
            policy: self.policy,
            requested_bytes: request.size_bytes(),
            needed_bytes,
            align_bytes: request.align_bytes(),
            reserved_bytes,
            live_bytes: self.live_bytes,
            padding_bytes: allocated_bytes.saturating_sub(self.live_bytes),
            free_in_blocks_bytes,
            largest_free_run_bytes,
            retired_bytes: 0,
            unreserved_bytes,
            capacity_bytes: budget_cap_bytes,
            virtual_range_bytes: None,
            new_block_bytes,
            cause: OomCause::Exhaustion,
        }
        .judged()
    }

    /// Starts (a fresh log) or stops recording device events.
    pub(crate) fn record_device_events(&mut self, on: bool) {
        self.events = on.then(Vec::new);
    }

    /// The device events recorded since the last call.
    pub(crate) fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn push_event(&mut self, event: DeviceEvent) {
        if let Some(events) = &mut self.events {
            events.push(event);
        }
    }

    /// The live block of `memory`, if the books know it.
    pub(crate) fn block_mut(&mut self, memory: vk::DeviceMemory) -> Option<&mut Block> {
        self.blocks.get_mut(&memory)
    }

    /// Records a new block of `size_bytes` in `memory`: its synthetic base address, the reserved bytes, the
    /// device's allocation count and a [`DeviceEvent::Reserved`].
    pub(crate) fn reserve_block(&mut self, memory: vk::DeviceMemory, size_bytes: u64) -> &mut Block {
        let base_address = self.next_address;
        self.next_address += size_bytes.max(1).next_multiple_of(self.address_alignment_bytes);
        self.reserved_bytes += size_bytes;
        self.peak_reserved_bytes = self.peak_reserved_bytes.max(self.reserved_bytes);
        self.context.live_allocations.fetch_add(1, Ordering::AcqRel);
        self.push_event(DeviceEvent::Reserved { address: base_address, size_bytes });
        self.blocks.entry(memory).or_insert(Block { base_address, size_bytes, live_allocations: 0 })
    }

    /// Forgets the block of `memory` (released by the allocator): the reserved bytes, the device's allocation
    /// count and a [`DeviceEvent::Released`]; `None` when the books did not know it.
    pub(crate) fn release_block(&mut self, memory: vk::DeviceMemory) -> Option<Block> {
        let block = self.blocks.remove(&memory)?;
        self.reserved_bytes -= block.size_bytes;
        self.context.give_back_allocation_slot();
        self.push_event(DeviceEvent::Released { address: block.base_address, size_bytes: block.size_bytes });
        Some(block)
    }

    /// Sets the reserved bytes to what the allocator itself says it holds.
    pub(crate) fn set_reserved_bytes(&mut self, reserved_bytes: u64) {
        self.reserved_bytes = reserved_bytes;
    }

    /// Puts `inner`, `size_bytes` at `offset` of its block, in a slot: the heapscope allocation for it.
    ///
    /// # Errors
    /// [`Error::Source`] past 2^32 live allocations.
    pub(crate) fn insert(&mut self, inner: L, offset: u64, size_bytes: u64) -> Result<Allocation> {
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                let slot =
                    u32::try_from(self.slots.len()).map_err(|_| Error::Source("more than 2^32 live allocations".into()))?;
                self.slots.push(None);
                self.generations.push(0);
                slot
            }
        };
        let generation = self.generations[slot as usize];
        self.slots[slot as usize] = Some(Live { inner, generation });
        self.live_bytes += size_bytes;
        Ok(Allocation::from_parts(
            self.owner,
            AllocationId::from_slot(slot, generation),
            offset,
            size_bytes,
            (offset, size_bytes),
            ResourceKind::Linear,
        ))
    }

    /// Takes the live allocation behind `allocation` out of its slot, to be freed by the allocator.
    ///
    /// # Errors
    /// [`Error::ForeignAllocation`] for another heap's allocation, [`Error::DoubleFree`] for one not live.
    pub(crate) fn remove(&mut self, allocation: &Allocation) -> Result<L> {
        if allocation.owner() != self.owner {
            return Err(Error::ForeignAllocation { offset: allocation.offset(), owner: self.policy });
        }
        let (slot, generation) = (allocation.id().slot() as usize, allocation.id().generation());
        let double_free = Error::DoubleFree { offset: allocation.offset(), id: allocation.id().0, owner: self.policy };
        let Some(entry) = self.slots.get_mut(slot) else { return Err(double_free) };
        if entry.as_ref().is_none_or(|live| live.generation != generation) {
            return Err(double_free);
        }
        let Some(live) = entry.take() else { return Err(double_free) };
        self.generations[slot] = generation.wrapping_add(1);
        self.free_slots.push(slot as u32);
        self.live_bytes -= allocation.size_bytes();
        Ok(live.inner)
    }

    /// The live allocation behind `allocation`, if it is live here.
    pub(crate) fn live(&self, allocation: &Allocation) -> Option<&L> {
        if allocation.owner() != self.owner {
            return None;
        }
        let live = self.slots.get(allocation.id().slot() as usize)?.as_ref()?;
        (live.generation == allocation.id().generation()).then_some(&live.inner)
    }

    /// The allocator moved the live allocation behind `allocation` to `offset` (of the same or another block): its
    /// slot keeps it under a new generation, so the old handle is refused from now on; the new allocation.
    ///
    /// # Errors
    /// [`Error::ForeignAllocation`] or [`Error::DoubleFree`] when `allocation` is not live here.
    pub(crate) fn relocate(&mut self, allocation: &Allocation, offset: u64) -> Result<Allocation> {
        let inner = self.remove(allocation)?;
        let (slot, generation) = (allocation.id().slot(), allocation.id().generation().wrapping_add(1));
        // `remove` freed the slot (the last one pushed): take it back at once, under its new generation.
        self.free_slots.pop();
        self.slots[slot as usize] = Some(Live { inner, generation });
        self.live_bytes += allocation.size_bytes();
        Ok(Allocation::from_parts(
            self.owner,
            AllocationId::from_slot(slot, generation),
            offset,
            allocation.size_bytes(),
            (offset, allocation.size_bytes()),
            ResourceKind::Linear,
        ))
    }

    /// The live block of `memory`, if the books know it.
    pub(crate) fn block(&self, memory: vk::DeviceMemory) -> Option<&Block> {
        self.blocks.get(&memory)
    }

    /// Takes every live allocation out (the heap is being dropped).
    pub(crate) fn take_all_live(&mut self) -> Vec<L> {
        self.slots.iter_mut().filter_map(Option::take).map(|live| live.inner).collect()
    }
}

impl<L> Drop for ExternalBook<L> {
    /// Every block left goes with the allocator (dropped before the books): the device's count forgets them.
    fn drop(&mut self) {
        let blocks = u32::try_from(self.blocks.len()).unwrap_or(u32::MAX);
        self.context.live_allocations.fetch_sub(blocks, Ordering::AcqRel);
    }
}
