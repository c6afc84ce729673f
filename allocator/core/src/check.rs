//! An invariant checker: drives a policy and a simple reference model (the list of live allocations) side
//! by side and verifies the [`Policy`] contract after every operation. The property tests and the fuzzer
//! both run it, so a counterexample from either replays the same way.
//!
//! Checked after every step:
//! - allocations lie inside the range, are aligned, and no two live footprints overlap;
//! - with a granularity, resources of different kinds share no page;
//! - a refused request fits no free run of the policy's own report (with a granularity rule, for the
//!   policies that place at any offset), nor any run of the checker's own model of free space (below);
//! - the report covers the range exactly, its live runs are the model's allocations and its totals match
//!   the model: its free bytes are the model's, and only a linear policy retires bytes;
//! - no free run of the report is larger than [`Policy::largest_free_bound_bytes`] (a heap skips a block whose
//!   bound is below a request without asking it);
//! - [`Policy::free_space`] is what the report's totals say (a refusal's verdict reads it instead of a report);
//! - double frees and foreign handles are refused and change nothing;
//! - freeing everything restores the initial layout.
//!
//! The model of free space is built from what the checker saw served and freed, not from the policy's report, so
//! a policy that hides free space (reports it retired, or not at all, and refuses requests it holds) is caught:
//! for TLSF, best fit, first fit and buddy, free space is every byte outside the live footprints (they coalesce
//! at once; buddy's blocks are aligned to their size); for slab, the same less the slab pages at each end of a
//! free run (a page holds live slots, or it went back to the range); for the linear bump mode, the range above
//! the highest footprint since the range was last empty, for the stack mode, the range above the highest live
//! footprint. The ring mode's reusable space follows the order of its frees and is not modelled: only its
//! report's free runs and totals are checked.

use crate::granularity::GranularityGuard;
use crate::request::{align_down, align_up};
use crate::{
    Allocation, Error, FreeSpace, LinearMode, Policy, PolicyConfig, PolicyKind, PolicyReport, RangeState, Request, ResourceKind,
};

/// One operation on the policy under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Request `size_bytes` aligned to `2^align_log2`, of the optimal kind when `optimal`.
    Alloc {
        /// Bytes (0 and overflowing sizes test the request validation).
        size_bytes: u64,
        /// log2 of the alignment.
        align_log2: u8,
        /// The resource kind.
        optimal: bool,
    },
    /// Request `size_bytes` aligned to `2^align_log2` at an offset `pick` chooses in a free run of the report
    /// ([`Policy::allocate_at`]): a policy that places by address (TLSF, best fit, first fit) must serve it exactly
    /// there whenever the bytes are free and the offset is allowed, the others refuse every such request.
    AllocAt {
        /// Bytes.
        size_bytes: u64,
        /// log2 of the alignment.
        align_log2: u8,
        /// The resource kind.
        optimal: bool,
        /// Which free run, and where in it.
        pick: usize,
    },
    /// Free the live allocation `pick % live`.
    Free {
        /// Which one.
        pick: usize,
    },
    /// Free an already freed handle again (must be refused).
    FreeAgain {
        /// Which one.
        pick: usize,
    },
    /// Free a handle of another instance (must be refused).
    FreeForeign,
}

/// A policy under test with its reference model.
#[derive(Debug)]
pub struct Checker {
    kind: PolicyKind,
    config: PolicyConfig,
    policy: Box<dyn Policy>,
    foreign: Box<dyn Policy>,
    live: Vec<Allocation>,
    freed: Vec<Allocation>,
    initial: PolicyReport,
    /// The bump mode's top: the highest footprint end since the range was last empty.
    bump_top: u64,
}

/// What a check found wrong, in words.
pub type Violation = String;

impl Checker {
    /// A fresh policy of `kind` over `capacity_bytes`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for invalid settings.
    pub fn new(kind: PolicyKind, capacity_bytes: u64, config: PolicyConfig) -> crate::Result<Self> {
        let policy = kind.build(capacity_bytes, &config)?;
        let foreign = kind.build(capacity_bytes.max(1 << 20), &config)?;
        let initial = policy.report();
        let checker = Self { kind, config, policy, foreign, live: Vec::new(), freed: Vec::new(), initial, bump_top: 0 };
        Ok(checker)
    }

    /// Live allocations in the model.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Applies `op` to the policy and the model, then checks every invariant.
    ///
    /// # Errors
    /// The first violation found.
    pub fn apply(&mut self, op: Op) -> Result<(), Violation> {
        match op {
            Op::Alloc { size_bytes, align_log2, optimal } => self.alloc(size_bytes, align_log2, optimal)?,
            Op::AllocAt { size_bytes, align_log2, optimal, pick } => self.alloc_at(size_bytes, align_log2, optimal, pick)?,
            Op::Free { pick } => {
                if !self.live.is_empty() {
                    let allocation = self.live.swap_remove(pick % self.live.len());
                    self.policy.free(allocation).map_err(|error| format!("free of live {allocation:?} failed: {error}"))?;
                    self.freed.push(allocation);
                    if self.live.is_empty() {
                        self.bump_top = 0;
                    }
                }
            }
            Op::FreeAgain { pick } => {
                if !self.freed.is_empty() {
                    let allocation = self.freed[pick % self.freed.len()];
                    self.refused(allocation, "double free")?;
                }
            }
            Op::FreeForeign => {
                if let Some(allocation) = self.foreign.allocate(Request::new(1, 1).expect("valid")) {
                    self.refused(allocation, "foreign free")?;
                }
            }
        }
        self.check_report()
    }

    /// Frees everything left and checks that the initial layout is back.
    ///
    /// # Errors
    /// The first violation found.
    pub fn finish(mut self) -> Result<(), Violation> {
        while !self.live.is_empty() {
            self.apply(Op::Free { pick: 0 })?;
        }
        let report = self.policy.report();
        if report != self.initial {
            return Err(format!("after freeing everything the layout is {report:?}, not the initial {:?}", self.initial));
        }
        Ok(())
    }

    /// The request an operation makes; `None` for the invalid ones [`Request::new`] refuses (nothing to check).
    fn request(size_bytes: u64, align_log2: u8, optimal: bool) -> Result<Option<Request>, Violation> {
        let align = 1u64.checked_shl(u32::from(align_log2)).unwrap_or(0);
        let kind = if optimal { ResourceKind::Optimal } else { ResourceKind::Linear };
        match Request::new(size_bytes, align) {
            Ok(request) => Ok(Some(request.with_kind(kind))),
            Err(Error::ZeroSize | Error::AlignmentNotPowerOfTwo { .. } | Error::SizeOverflow { .. }) => Ok(None),
            Err(other) => Err(format!("unexpected request error {other}")),
        }
    }

    fn alloc_at(&mut self, size_bytes: u64, align_log2: u8, optimal: bool, pick: usize) -> Result<(), Violation> {
        let Some(request) = Self::request(size_bytes, align_log2, optimal)? else { return Ok(()) };
        let align = request.align_bytes().max(self.config.min_align_bytes);
        let report = self.policy.report();
        let free: Vec<_> = report.ranges.iter().filter(|run| run.state == RangeState::Free).collect();
        // An aligned offset somewhere in a free run (it may still leave too little room), or anywhere when none is free.
        let offset = match free.get(pick % free.len().max(1)) {
            Some(run) => align_up(run.offset + (pick as u64 / 7) % run.size_bytes.max(1), align).unwrap_or(run.offset),
            None => pick as u64,
        };
        let by_address = self.kind.places_by_address();
        let must_fit = by_address && self.fits_at(offset, request, &report);
        match self.policy.allocate_at(request, offset) {
            Some(allocation) if !by_address => Err(format!("{} placed {allocation:?} at an offset it was told", self.kind)),
            Some(allocation) if allocation.offset() != offset => {
                Err(format!("{request:?} asked at {offset} was placed at {}", allocation.offset()))
            }
            Some(_) if !must_fit => Err(format!("{request:?} was placed at {offset}, where it does not fit")),
            Some(allocation) => {
                self.check_allocation(&allocation, request)?;
                self.live.push(allocation);
                Ok(())
            }
            None if must_fit => Err(format!("{request:?} was refused at {offset}, where the bytes are free")),
            None => Ok(()),
        }
    }

    /// Whether `request` fits at exactly `offset`: aligned, its rounded size inside one free run of `report`, and
    /// with a granularity rule, no page shared with a resource of the other kind.
    fn fits_at(&self, offset: u64, request: Request, report: &PolicyReport) -> bool {
        let align = request.align_bytes().max(self.config.min_align_bytes);
        let Some(size) = align_up(request.size_bytes(), self.config.min_align_bytes) else { return false };
        let Some(run) =
            report.ranges.iter().find(|run| run.state == RangeState::Free && run.offset <= offset && offset < run.end())
        else {
            return false;
        };
        if self.config.granularity_bytes > 1 {
            let guard = self.live_guard();
            return guard.place(offset, run.end(), size, align, request.kind()) == Some(offset);
        }
        offset.is_multiple_of(align) && offset.checked_add(size).is_some_and(|end| end <= run.end())
    }

    fn alloc(&mut self, size_bytes: u64, align_log2: u8, optimal: bool) -> Result<(), Violation> {
        let Some(request) = Self::request(size_bytes, align_log2, optimal)? else { return Ok(()) };
        match self.policy.allocate(request) {
            Some(allocation) => {
                self.check_allocation(&allocation, request)?;
                self.bump_top = self.bump_top.max(allocation.footprint_end());
                self.live.push(allocation);
            }
            None => {
                let report = self.policy.report();
                if let Some(run) =
                    report.ranges.iter().find(|run| run.state == RangeState::Free && self.fits(run.offset, run.end(), request))
                {
                    return Err(format!("{request:?} was refused but fits the free run {run:?}"));
                }
                let usable = self.model_free_runs().unwrap_or_default();
                if let Some((start, end)) = usable.into_iter().find(|&(start, end)| self.fits_model(start, end, request)) {
                    return Err(format!(
                        "{request:?} was refused but fits [{start}, {end}), free by the checker's own model (the allocations \
                         it saw served and freed); the policy reports {:?}",
                        report.ranges.iter().filter(|run| run.offset < end && start < run.end()).collect::<Vec<_>>()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The granularity rule's pages as the live allocations of the model hold them.
    fn live_guard(&self) -> GranularityGuard {
        let mut guard = GranularityGuard::new(self.config.granularity_bytes);
        for live in &self.live {
            guard.insert(live.offset(), live.footprint_end() - live.offset(), live.kind());
        }
        guard
    }

    /// Whether the policy must be able to serve `request` from the free run `[start, end)`. Without a
    /// granularity rule: the policy's own rounding decides. With it, the policies that place at any offset
    /// (TLSF, best fit, first fit, linear) must find the lowest placement the rule allows; buddy and slab keep
    /// kinds apart by construction (whole pages, one kind per slab page) and are exempt.
    fn fits(&self, start: u64, end: u64, request: Request) -> bool {
        let align = request.align_bytes().max(self.config.min_align_bytes);
        if self.config.granularity_bytes > 1 {
            if matches!(self.kind, PolicyKind::Buddy | PolicyKind::Slab) {
                return false;
            }
            let Some(size) = align_up(request.size_bytes(), self.config.min_align_bytes) else {
                return false;
            };
            let guard = self.live_guard();
            return guard.place(start, end, size, align, request.kind()).is_some();
        }
        let Some(needed) = self.kind.dedicated_bytes(request, &self.config) else {
            return false;
        };
        align_up(start, align).is_some_and(|offset| end.checked_sub(offset).is_some_and(|room| room >= needed))
    }

    /// The free runs of the checker's own model (see the module documentation), sorted; `None` where it keeps no
    /// model (the ring mode).
    fn model_free_runs(&self) -> Option<Vec<(u64, u64)>> {
        let capacity = self.policy.capacity_bytes();
        let above = |top: u64| if top < capacity { vec![(top, capacity)] } else { Vec::new() };
        match self.kind {
            PolicyKind::Linear(LinearMode::Ring) => None,
            PolicyKind::Linear(LinearMode::Bump) => Some(above(self.bump_top)),
            PolicyKind::Linear(LinearMode::Stack) => {
                Some(above(self.live.iter().map(Allocation::footprint_end).max().unwrap_or(0)))
            }
            PolicyKind::Tlsf | PolicyKind::BestFit | PolicyKind::FirstFit | PolicyKind::Buddy | PolicyKind::Slab => {
                let mut footprints: Vec<(u64, u64)> =
                    self.live.iter().map(|live| (live.footprint_offset(), live.footprint_end())).collect();
                footprints.sort_unstable();
                let mut runs = Vec::new();
                let mut cursor = 0;
                for (start, end) in footprints.into_iter().chain([(capacity, capacity)]) {
                    if cursor < start {
                        runs.push((cursor, start));
                    }
                    cursor = cursor.max(end);
                }
                Some(runs)
            }
        }
    }

    /// Whether the policy must serve `request` from `[start, end)`, free by the checker's model: as
    /// [`Checker::fits`], with a buddy block aligned to its own size, and a slab run less the slab pages that may
    /// reach into it at either end.
    fn fits_model(&self, start: u64, end: u64, request: Request) -> bool {
        match self.kind {
            PolicyKind::Buddy if self.config.granularity_bytes <= 1 => {
                let Some(block) = self.kind.dedicated_bytes(request, &self.config) else { return false };
                align_up(start, block).is_some_and(|offset| end.checked_sub(offset).is_some_and(|room| room >= block))
            }
            PolicyKind::Slab => {
                let page = self.config.slab_page_bytes;
                match align_up(start, page) {
                    Some(start) if start < align_down(end, page) => self.fits(start, align_down(end, page), request),
                    _ => false,
                }
            }
            _ => self.fits(start, end, request),
        }
    }

    fn refused(&mut self, allocation: Allocation, what: &str) -> Result<(), Violation> {
        let before = self.policy.report();
        match self.policy.free(allocation) {
            Err(Error::DoubleFree { .. } | Error::ForeignAllocation { .. }) => {}
            other => return Err(format!("{what} of {allocation:?} returned {other:?}")),
        }
        if self.policy.report() != before {
            return Err(format!("{what} of {allocation:?} changed the layout"));
        }
        Ok(())
    }

    fn check_allocation(&self, allocation: &Allocation, request: Request) -> Result<(), Violation> {
        let capacity = self.policy.capacity_bytes();
        let sane = allocation.size_bytes() == request.size_bytes()
            && allocation.kind() == request.kind()
            && allocation.offset().is_multiple_of(request.align_bytes())
            && allocation.footprint_offset() <= allocation.offset()
            && allocation.end() <= allocation.footprint_end()
            && allocation.footprint_end() <= capacity;
        if !sane {
            return Err(format!("{allocation:?} does not honour {request:?} within capacity {capacity}"));
        }
        let page = self.config.granularity_bytes;
        for other in &self.live {
            if allocation.footprint_offset() < other.footprint_end() && other.footprint_offset() < allocation.footprint_end() {
                return Err(format!("{allocation:?} overlaps live {other:?}"));
            }
            let shares_page =
                allocation.offset() / page <= (other.end() - 1) / page && other.offset() / page <= (allocation.end() - 1) / page;
            if page > 1 && other.kind() != allocation.kind() && shares_page {
                return Err(format!("{allocation:?} shares a {page}-byte page with {other:?} of another kind"));
            }
        }
        Ok(())
    }

    fn check_report(&self) -> Result<(), Violation> {
        let report = self.policy.report();
        let capacity = self.policy.capacity_bytes();
        if report.capacity_bytes != capacity {
            return Err(format!("report capacity {} != policy capacity {capacity}", report.capacity_bytes));
        }
        let mut cursor = 0;
        for range in &report.ranges {
            if range.offset != cursor || range.size_bytes == 0 {
                return Err(format!("report run {range:?} does not continue at {cursor} (or is empty)"));
            }
            cursor = range.end();
        }
        if cursor != capacity {
            return Err(format!("report ends at {cursor}, capacity is {capacity}"));
        }
        let mut reported: Vec<(u64, u64, u64)> = report
            .ranges
            .iter()
            .filter(|range| range.state == RangeState::Live)
            .map(|range| (range.allocation.map_or(u64::MAX, |id| id.0), range.offset, range.size_bytes))
            .collect();
        let mut model: Vec<(u64, u64, u64)> = self.live.iter().map(|a| (a.id().0, a.offset(), a.size_bytes())).collect();
        reported.sort_unstable();
        model.sort_unstable();
        if reported != model {
            return Err(format!("live runs {reported:?} != model {model:?}"));
        }
        for range in report.ranges.iter().filter(|range| range.state == RangeState::Padding) {
            let owner = self.live.iter().find(|a| Some(a.id()) == range.allocation);
            if !owner.is_some_and(|a| a.footprint_offset() <= range.offset && range.end() <= a.footprint_end()) {
                return Err(format!("padding {range:?} lies outside its allocation's footprint"));
            }
        }
        let largest_free =
            report.ranges.iter().filter(|range| range.state == RangeState::Free).map(|range| range.size_bytes).max();
        let bound = self.policy.largest_free_bound_bytes();
        if let Some(largest) = largest_free.filter(|&largest| largest > bound) {
            return Err(format!("a free run of {largest} bytes is above the policy's largest-free bound {bound}"));
        }
        let totals = report.totals();
        let space = self.policy.free_space();
        if space != FreeSpace::of(&totals) {
            return Err(format!("free_space() says {space:?}, the report's totals {:?}", FreeSpace::of(&totals)));
        }
        if let Some(runs) = self.model_free_runs() {
            let free_bytes: u64 = runs.iter().map(|(start, end)| end - start).sum();
            if totals.free_bytes != free_bytes {
                return Err(format!(
                    "the report has {} free bytes, the checker's model of free space {free_bytes} ({runs:?})",
                    totals.free_bytes
                ));
            }
        }
        if totals.retired_bytes > 0 && !matches!(self.kind, PolicyKind::Linear(_)) {
            return Err(format!(
                "{} reports {} retired bytes: only a linear policy retires bytes",
                self.kind, totals.retired_bytes
            ));
        }
        let live_bytes: u64 = self.live.iter().map(Allocation::size_bytes).sum();
        let rounded_bytes: u64 = self.live.iter().map(Allocation::footprint_bytes).sum();
        let expected = (live_bytes, rounded_bytes, capacity - rounded_bytes, self.live.len() as u64, self.live.len());
        let actual = (
            totals.live_bytes,
            totals.rounded_bytes,
            totals.free_bytes + totals.retired_bytes,
            totals.live_allocations,
            self.policy.live_allocations(),
        );
        if actual != expected {
            return Err(format!(
                "totals (live, rounded, free + retired, allocations, policy count) {actual:?} != model {expected:?}"
            ));
        }
        Ok(())
    }
}

/// A policy, its range and settings, and operations, decoded from arbitrary bytes (the fuzzer's input).
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The policy.
    pub kind: PolicyKind,
    /// Its range.
    pub capacity_bytes: u64,
    /// Its settings.
    pub config: PolicyConfig,
    /// What to do.
    pub ops: Vec<Op>,
}

impl Scenario {
    /// Decodes `data`; every input decodes to some scenario.
    pub fn from_bytes(data: &[u8]) -> Self {
        let mut bytes = data.iter().copied();
        let mut next = move || bytes.next();
        let byte = |next: &mut dyn FnMut() -> Option<u8>| next().unwrap_or(0);
        let kind = PolicyKind::ALL[usize::from(byte(&mut next)) % PolicyKind::ALL.len()];
        let capacity_bytes = (u64::from(byte(&mut next)) << 8 | u64::from(byte(&mut next))) << (byte(&mut next) % 16);
        let shape = byte(&mut next);
        let config = PolicyConfig {
            min_align_bytes: 1 << (shape % 9),
            granularity_bytes: if shape & 0x80 != 0 { 1 << (8 + (shape >> 4) % 4) } else { 1 },
            best_fit_exact: shape & 0x40 != 0,
            ..PolicyConfig::default()
        };
        let mut ops = Vec::new();
        while let Some(tag) = next() {
            let op = match tag % 8 {
                0..=3 => {
                    let mantissa = u64::from(byte(&mut next)) << 8 | u64::from(byte(&mut next));
                    let shift = u32::from(tag >> 3) * 2;
                    Op::Alloc {
                        size_bytes: mantissa.checked_shl(shift).unwrap_or(u64::MAX),
                        align_log2: byte(&mut next) % 20,
                        optimal: tag & 0x80 != 0,
                    }
                }
                4 | 5 => Op::Free { pick: usize::from(byte(&mut next)) },
                6 => Op::FreeAgain { pick: usize::from(byte(&mut next)) },
                _ if tag & 0x80 != 0 => Op::AllocAt {
                    size_bytes: (u64::from(byte(&mut next)) << 8 | u64::from(byte(&mut next))) << (u32::from(tag >> 3 & 0x7) * 2),
                    align_log2: byte(&mut next) % 20,
                    optimal: tag & 0x40 != 0,
                    pick: usize::from(byte(&mut next)) << 8 | usize::from(byte(&mut next)),
                },
                _ => Op::FreeForeign,
            };
            ops.push(op);
        }
        Self { kind, capacity_bytes, config, ops }
    }

    /// Runs the scenario through a [`Checker`].
    ///
    /// # Errors
    /// The first violation, with the step that caused it.
    pub fn run(&self) -> Result<(), Violation> {
        let mut checker = Checker::new(self.kind, self.capacity_bytes, self.config.clone()).map_err(|error| error.to_string())?;
        for (step, op) in self.ops.iter().enumerate() {
            checker.apply(*op).map_err(|violation| format!("{} step {step} ({op:?}): {violation}", self.kind))?;
        }
        checker.finish().map_err(|violation| format!("{} finish: {violation}", self.kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_string_decodes_and_runs() {
        let inputs: [&[u8]; 5] = [&[], &[0], &[3, 0, 255, 4, 0x85, 0, 1, 0, 3, 4, 0, 6, 0, 7], &[7; 64], &[255; 64]];
        for input in inputs {
            let scenario = Scenario::from_bytes(input);
            scenario.run().unwrap();
        }
    }

    /// A policy that breaks the contract: the checker must notice.
    #[derive(Debug)]
    struct Overlapping(Box<dyn Policy>);

    impl Policy for Overlapping {
        fn name(&self) -> &'static str {
            "overlapping"
        }
        fn capacity_bytes(&self) -> u64 {
            self.0.capacity_bytes()
        }
        fn allocate(&mut self, request: Request) -> Option<Allocation> {
            let real = self.0.allocate(request)?;
            Some(Allocation::from_parts(real.owner(), real.id(), 0, real.size_bytes(), (0, real.footprint_bytes()), real.kind()))
        }
        fn free(&mut self, allocation: Allocation) -> crate::Result<()> {
            self.0.free(allocation)
        }
        fn live_allocations(&self) -> usize {
            self.0.live_allocations()
        }
        fn report(&self) -> PolicyReport {
            self.0.report()
        }
    }

    #[test]
    fn a_broken_policy_is_caught() {
        let mut checker = Checker::new(PolicyKind::Tlsf, 1 << 20, PolicyConfig::default()).unwrap();
        checker.policy = Box::new(Overlapping(PolicyKind::Tlsf.build(1 << 20, &PolicyConfig::default()).unwrap()));
        let alloc = Op::Alloc { size_bytes: 1000, align_log2: 0, optimal: false };
        checker.apply(alloc).unwrap();
        let violation = checker.apply(alloc).unwrap_err();
        assert!(violation.contains("overlaps"), "{violation}");
    }

    /// A policy that hides free space: it refuses requests above 4 KiB and reports its free runs as retired.
    #[derive(Debug)]
    struct HidesFreeSpace(Box<dyn Policy>);

    impl Policy for HidesFreeSpace {
        fn name(&self) -> &'static str {
            "hides-free-space"
        }
        fn capacity_bytes(&self) -> u64 {
            self.0.capacity_bytes()
        }
        fn allocate(&mut self, request: Request) -> Option<Allocation> {
            if request.size_bytes() > 4096 { None } else { self.0.allocate(request) }
        }
        fn free(&mut self, allocation: Allocation) -> crate::Result<()> {
            self.0.free(allocation)
        }
        fn live_allocations(&self) -> usize {
            self.0.live_allocations()
        }
        fn report(&self) -> PolicyReport {
            let mut report = self.0.report();
            for run in report.ranges.iter_mut().filter(|run| run.state == RangeState::Free) {
                run.state = RangeState::Retired;
            }
            report
        }
    }

    #[test]
    fn a_policy_hiding_free_space_is_caught() {
        let mut checker = Checker::new(PolicyKind::Tlsf, 1 << 20, PolicyConfig::default()).unwrap();
        checker.policy = Box::new(HidesFreeSpace(PolicyKind::Tlsf.build(1 << 20, &PolicyConfig::default()).unwrap()));
        // Its report alone passes the old checks: no free run to fit, free + retired bytes add up.
        let violation = checker.apply(Op::Alloc { size_bytes: 1000, align_log2: 0, optimal: false }).unwrap_err();
        assert!(violation.contains("the checker's model of free space"), "{violation}");
        // The refusal is caught by the model, not by the report (which shows no free run).
        let violation = checker.alloc(64 << 10, 0, false).unwrap_err();
        assert!(violation.contains("free by the checker's own model"), "{violation}");
        assert!(violation.contains("Retired"), "{violation}");
    }
}
