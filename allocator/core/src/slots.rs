//! A table of live entries addressed by [`AllocationId`]s (slot index + generation), so that a stale or
//! repeated handle is recognised instead of freeing someone else's memory.

use crate::AllocationId;

#[derive(Clone, Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// Live entries by id; slots are reused, each reuse under a new generation.
#[derive(Clone, Debug)]
pub(crate) struct SlotTable<T> {
    slots: Vec<Slot<T>>,
    vacant: Vec<u32>,
    live: usize,
}

impl<T> Default for SlotTable<T> {
    fn default() -> Self {
        Self { slots: Vec::new(), vacant: Vec::new(), live: 0 }
    }
}

impl<T> SlotTable<T> {
    /// Stores `value` and returns its id.
    pub(crate) fn insert(&mut self, value: T) -> AllocationId {
        self.live += 1;
        if let Some(slot) = self.vacant.pop() {
            let entry = &mut self.slots[slot as usize];
            entry.value = Some(value);
            return AllocationId::from_slot(slot, entry.generation);
        }
        let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 live allocations");
        self.slots.push(Slot { generation: 0, value: Some(value) });
        AllocationId::from_slot(slot, 0)
    }

    /// The entry of a live id.
    pub(crate) fn get(&self, id: AllocationId) -> Option<&T> {
        let slot = self.slots.get(id.slot() as usize)?;
        if slot.generation == id.generation() { slot.value.as_ref() } else { None }
    }

    /// Removes and returns the entry of a live id; `None` when the id is not live (freed already, or stale).
    pub(crate) fn remove(&mut self, id: AllocationId) -> Option<T> {
        let slot = self.slots.get_mut(id.slot() as usize)?;
        if slot.generation != id.generation() {
            return None;
        }
        let value = slot.value.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.vacant.push(id.slot());
        self.live -= 1;
        Some(value)
    }

    /// Removes the entry of `allocation`, checking that this instance (`owner`, named `name`) made it and that
    /// it is still live at the offset the entry records.
    ///
    /// # Errors
    /// [`Error::ForeignAllocation`](crate::Error::ForeignAllocation) or [`Error::DoubleFree`](crate::Error::DoubleFree);
    /// nothing changes then.
    pub(crate) fn take_live(
        &mut self,
        owner: crate::OwnerId,
        allocation: &crate::Allocation,
        name: &'static str,
        offset_of: impl Fn(&T) -> u64,
    ) -> crate::Result<T> {
        crate::policy::check_owner(owner, allocation, name)?;
        if self.get(allocation.id()).is_none_or(|entry| offset_of(entry) != allocation.offset()) {
            return Err(crate::policy::not_live(owner, allocation, name));
        }
        Ok(self.remove(allocation.id()).expect("checked live above"))
    }

    /// Live entries.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Live entries with their ids, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (AllocationId, &T)> {
        self.slots.iter().enumerate().filter_map(|(index, slot)| {
            let value = slot.value.as_ref()?;
            Some((AllocationId::from_slot(index as u32, slot.generation), value))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_changes_generation() {
        let mut table = SlotTable::default();
        let a = table.insert("a");
        let b = table.insert("b");
        assert_eq!(table.remove(a), Some("a"));
        assert_eq!(table.remove(a), None, "double free is refused");
        let c = table.insert("c");
        assert_eq!(c.slot(), a.slot());
        assert_ne!(c, a);
        assert_eq!(table.get(a), None, "stale id does not reach the new entry");
        assert_eq!(table.get(c), Some(&"c"));
        assert_eq!(table.len(), 2);
        let ids: Vec<_> = table.iter().map(|(id, value)| (id, *value)).collect();
        assert_eq!(ids, [(c, "c"), (b, "b")]);
        assert_eq!(table.remove(AllocationId::from_slot(99, 0)), None);
    }
}
