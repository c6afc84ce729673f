//! Built-in stories: small traces that show one allocator phenomenon each.

use crate::trace::{Trace, TraceBuilder};
use crate::units::MIB;

/// A trace with the device it runs on and what it shows.
#[derive(Clone, Debug)]
pub struct Story {
    /// Short name (`frag_oom`).
    pub name: &'static str,
    /// What happens, in one sentence.
    pub summary: &'static str,
    /// The memory the story's device leaves to the allocator.
    pub device_bytes: u64,
    /// The events.
    pub trace: Trace,
}

/// The fragmentation out-of-memory story, as recorded on an H200 in
/// `shared/traces/pytorch-2.11-h200/frag_oom-*`: 20 x 150 MiB are allocated and freed, then 20 x 100 MiB
/// are allocated, then 1 GiB is requested, with 3584 MiB left to the allocator. PyTorch's default caching
/// allocator fails the last request with 1000 MiB "reserved but unallocated"; expandable segments succeed.
pub fn frag_oom() -> Story {
    const WELL_FORMED: &str = "the story frees only what it allocated";
    let mut builder = TraceBuilder::new("frag_oom");
    for id in 0..20 {
        builder.alloc(id, 150 * MIB).expect(WELL_FORMED);
    }
    for id in 0..20 {
        builder.free(id).expect(WELL_FORMED);
    }
    for id in 100..120 {
        builder.alloc(id, 100 * MIB).expect(WELL_FORMED);
    }
    builder.alloc(1000, 1024 * MIB).expect(WELL_FORMED);
    Story {
        name: "frag_oom",
        summary: "20 x 150 MiB allocated and freed, 20 x 100 MiB allocated, then 1 GiB requested within 3584 MiB",
        device_bytes: 3584 * MIB,
        trace: builder.finish(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Event;

    #[test]
    fn frag_oom_shape() {
        let story = frag_oom();
        let events = story.trace.events();
        assert_eq!(events.len(), 61);
        assert_eq!(events[0], Event::Alloc { slot: 0, size_bytes: 150 * MIB });
        assert_eq!(events[20], Event::Free { slot: 0 });
        assert_eq!(events[60], Event::Alloc { slot: 40, size_bytes: 1024 * MIB });
    }
}
