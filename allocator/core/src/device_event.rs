//! What a heap asks of the device, as plain data: blocks reserved and released (a heap of blocks) or
//! page runs mapped and unmapped (a paged heap). Recording them is off by default; exporters and the GUI
//! switch it on to replay the device's side of a run (PyTorch's `segment_alloc` / `segment_free` /
//! `segment_map` / `segment_unmap`).

/// One device operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum DeviceEvent {
    /// A block was reserved (PyTorch's `segment_alloc`).
    Reserved {
        /// Base address.
        address: u64,
        /// Bytes.
        size_bytes: u64,
    },
    /// A block was released (`segment_free`).
    Released {
        /// Base address.
        address: u64,
        /// Bytes.
        size_bytes: u64,
    },
    /// A run of pages was mapped (`segment_map`).
    Mapped {
        /// Address of the first page in the virtual range.
        address: u64,
        /// Bytes.
        size_bytes: u64,
    },
    /// A run of pages was unmapped (`segment_unmap`).
    Unmapped {
        /// Address of the first page in the virtual range.
        address: u64,
        /// Bytes.
        size_bytes: u64,
    },
}

/// A switchable log of device events.
#[derive(Clone, Debug, Default)]
pub struct DeviceLog {
    /// `None` while recording is off.
    events: Option<Vec<DeviceEvent>>,
}

impl DeviceLog {
    /// Starts (with an empty log) or stops recording.
    pub fn set_recording(&mut self, on: bool) {
        self.events = on.then(Vec::new);
    }

    /// Logs `event` while recording (it is not built otherwise).
    #[inline]
    pub fn push(&mut self, event: impl FnOnce() -> DeviceEvent) {
        if let Some(events) = &mut self.events {
            events.push(event());
        }
    }

    /// The events logged since the last take.
    pub fn take(&mut self) -> Vec<DeviceEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Whether no event waits to be taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Events logged and not yet taken (0 while recording is off).
    pub fn len(&self) -> usize {
        self.events.as_ref().map_or(0, Vec::len)
    }

    /// Forgets the events logged after the first `len`.
    pub fn truncate(&mut self, len: usize) {
        if let Some(events) = &mut self.events {
            events.truncate(len);
        }
    }
}
