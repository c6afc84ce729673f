//! [`CudaCost`]: what the CUDA driver calls of a replay would cost, from the costs measured on an H200 (driver 580,
//! CUDA 13; `notes/pytorch-caching-allocator.md` of the shared material), so settings that reserve alike can be told
//! apart by the time they spend in the driver.
//!
//! The measurements are medians of a `cudaMalloc` + `cudaFree` pair — 61 µs from 4 KiB to 1 MiB, 96 µs for 64 MiB,
//! 704 µs for 1 GiB — and, per 2 MiB page of virtual memory, `cuMemCreate` 27 µs, `cuMemMap` 2.1 µs,
//! `cuMemSetAccess` 30 µs and `cuMemUnmap` 20 µs. Between the measured sizes a pair's cost is interpolated linearly,
//! above 1 GiB it grows with the size; each of the two calls is counted as half a pair (only pairs were measured).
//! A page mapped costs create + map + set access; a page unmapped costs the unmap (the release of its physical
//! memory was not measured and is left out). Estimates for an H200, not measurements of the run.

use crate::driver::{Observer, Step, Target};
use crate::recording::Moment;
use heapscope_core::{DeviceEvent, Result};
use heapscope_pytorch::caching::{BackingRefused, CachingAllocator, SegmentBacking};

const MIB: f64 = (1u64 << 20) as f64;

/// `(bytes, µs)` of a `cudaMalloc` + `cudaFree` pair, as measured.
const PAIR_COSTS_US: [(f64, f64); 3] = [(MIB, 61.0), (64.0 * MIB, 96.0), (1024.0 * MIB, 704.0)];

/// µs to create, map and give access to one 2 MiB page (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`).
pub const MAP_US_PER_PAGE: f64 = 27.0 + 2.1 + 30.0;
/// µs to unmap one 2 MiB page (`cuMemUnmap`).
pub const UNMAP_US_PER_PAGE: f64 = 20.0;
/// The granularity of CUDA's virtual memory: the page the costs above are for.
pub const CUDA_PAGE_BYTES: u64 = 2 << 20;

/// µs of a `cudaMalloc` + `cudaFree` pair of `size_bytes`.
pub fn pair_cost_us(size_bytes: u64) -> f64 {
    let size = size_bytes as f64;
    let [first, .., last] = PAIR_COSTS_US;
    if size <= first.0 {
        return first.1;
    }
    for pair in PAIR_COSTS_US.windows(2) {
        let ((low, low_us), (high, high_us)) = (pair[0], pair[1]);
        if size <= high {
            return low_us + (high_us - low_us) * (size - low) / (high - low);
        }
    }
    last.1 * size / last.0
}

/// µs the driver would spend on `event`: half a pair for a block reserved or released, the page costs for a range
/// mapped or unmapped (whole 2 MiB pages).
pub fn event_cost_us(event: &DeviceEvent) -> f64 {
    let pages = |size_bytes: u64| size_bytes.div_ceil(CUDA_PAGE_BYTES) as f64;
    match *event {
        DeviceEvent::Reserved { size_bytes, .. } | DeviceEvent::Released { size_bytes, .. } => pair_cost_us(size_bytes) / 2.0,
        DeviceEvent::Mapped { size_bytes, .. } => pages(size_bytes) * MAP_US_PER_PAGE,
        DeviceEvent::Unmapped { size_bytes, .. } => pages(size_bytes) * UNMAP_US_PER_PAGE,
    }
}

/// The estimated driver time of the device events it hears: a [`SegmentBacking`] under PyTorch's emulation (every
/// `cudaMalloc`, `cudaFree`, map and unmap as it is made), or summed from any heap's device events ([`CudaCost::add`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CudaCost {
    /// The estimate so far, µs.
    pub micros: f64,
}

impl CudaCost {
    /// Adds the cost of `events`.
    pub fn add(&mut self, events: &[DeviceEvent]) {
        self.micros += events.iter().map(event_cost_us).sum::<f64>();
    }
}

impl SegmentBacking for CudaCost {
    fn apply(&mut self, events: &[DeviceEvent], _allocator: &CachingAllocator) -> std::result::Result<(), BackingRefused> {
        self.add(events);
        Ok(())
    }
}

/// As an observer of the driver: the device events of every step and moment.
impl<T: Target> Observer<T> for CudaCost {
    fn step(
        &mut self,
        _event: u64,
        _moment: Moment,
        _step: Step<'_, T::Handle>,
        device_events: &[DeviceEvent],
        _: &T,
    ) -> Result<()> {
        self.add(device_events);
        Ok(())
    }

    fn moment_done(&mut self, _moment: Moment, device_events: &[DeviceEvent], _: &T) -> Result<()> {
        self.add(device_events);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_costs_follow_the_measurements() {
        const GIB: u64 = 1 << 30;
        let cases = [
            (4 << 10, 61.0),
            (1 << 20, 61.0),
            (64 << 20, 96.0),
            (GIB, 704.0),
            (2 * GIB, 1408.0),
            // Half-way between 1 MiB and 64 MiB, and between 64 MiB and 1 GiB.
            ((65 << 20) / 2, 78.5),
            ((544u64 << 20), 400.0),
        ];
        for (size, us) in cases {
            assert!((pair_cost_us(size) - us).abs() < 1e-9, "{size}: {} != {us}", pair_cost_us(size));
        }
    }

    #[test]
    fn events_cost_half_a_pair_or_their_pages() {
        let mut cost = CudaCost::default();
        cost.add(&[
            DeviceEvent::Reserved { address: 0, size_bytes: 64 << 20 },
            DeviceEvent::Released { address: 0, size_bytes: 64 << 20 },
            DeviceEvent::Mapped { address: 0, size_bytes: 20 << 20 },
            DeviceEvent::Unmapped { address: 0, size_bytes: 3 << 20 },
        ]);
        let expected = 96.0 + 10.0 * MAP_US_PER_PAGE + 2.0 * UNMAP_US_PER_PAGE;
        assert!((cost.micros - expected).abs() < 1e-9, "{} != {expected}", cost.micros);
    }
}
