//! Replays the real PyTorch trace `gpt2_train_fixed-default` (GPT-2 124M training on an H200, 12,355
//! alloc/free events; `assets/traces/`, converted from the PyTorch snapshot by `heapscope convert`) through every
//! heapscope policy and, in the same run, through offset-allocator 0.2 and range-alloc 0.1.5.
//!
//! Every contender manages one range of 32 GiB in 512-byte units (PyTorch's `kMinBlockSize`, and the unit
//! offset-allocator's `u32` sizes need to cover 32 GiB), so all round requests alike. One generic loop
//! replays the trace for every contender, each with its native handle type.
//!
//! `cargo bench -p heapscope-core --bench trace_replay` prints (and writes to
//! `target/heapscope-bench/trace_replay.md`) a table of:
//! - median ns per event of whole replays on a warm instance (what the trace left live is freed, untimed,
//!   after each replay), measured in blocks that alternate with offset-allocator's, and the median of the
//!   per-block ratios (robust to the machine's speed drifting during the run);
//! - per-operation latency: each operation's best time over repeated replays on a warm instance
//!   (filters preemption and timer noise), then the median, 99th percentile and maximum over operations,
//!   timer overhead (~20 ns) included;
//! - peak reserved / peak live: the highest byte ever used over the most bytes live at once.
//!
//! then runs criterion on the whole replay of each contender (warm instances as well).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use heapscope_core::trace::{Event, Trace};
use heapscope_core::{Allocation, BestFit, Buddy, FirstFit, Linear, LinearMode, Policy, PolicyConfig, Request, Slab, Tlsf};

const UNIT_BYTES: u64 = 512;
const CAPACITY_BYTES: u64 = 32 << 30;
/// Replays per block (the first one warms the caches and is not counted).
const BLOCK: usize = 6;
/// Blocks per contender.
const BLOCKS: usize = 21;
const LATENCY_REPLAYS: usize = 15;

/// What the replay loop needs from an allocator. The loop stores each contender's native handle as
/// returned, and keeps request sizes beside it, so no contender pays for a wrapper.
trait Contender {
    type Handle: Copy;
    /// Allocates `size_bytes`.
    fn alloc(&mut self, size_bytes: u64) -> Option<Self::Handle>;
    /// One past the last byte set aside for an allocation of `size_bytes`.
    fn footprint_end(handle: &Self::Handle, size_bytes: u64) -> u64;
    fn free(&mut self, handle: Self::Handle);
}

/// Any heapscope policy, aligned to the unit.
struct Ours<P: Policy>(P);

impl<P: Policy> Contender for Ours<P> {
    type Handle = Allocation;

    #[inline]
    fn alloc(&mut self, size_bytes: u64) -> Option<Allocation> {
        self.0.allocate(Request::new(size_bytes, UNIT_BYTES).ok()?)
    }

    #[inline]
    fn footprint_end(handle: &Allocation, _size_bytes: u64) -> u64 {
        handle.footprint_end()
    }

    #[inline]
    fn free(&mut self, handle: Allocation) {
        self.0.free(handle).expect("the trace frees only live allocations");
    }
}

struct OffsetAllocator(offset_allocator::Allocator);

impl Contender for OffsetAllocator {
    type Handle = offset_allocator::Allocation;

    #[inline]
    fn alloc(&mut self, size_bytes: u64) -> Option<Self::Handle> {
        self.0.allocate(u32::try_from(size_bytes.div_ceil(UNIT_BYTES)).ok()?)
    }

    #[inline]
    fn footprint_end(handle: &Self::Handle, size_bytes: u64) -> u64 {
        (u64::from(handle.offset) + size_bytes.div_ceil(UNIT_BYTES)) * UNIT_BYTES
    }

    #[inline]
    fn free(&mut self, handle: Self::Handle) {
        self.0.free(handle);
    }
}

struct RangeAlloc(range_alloc::RangeAllocator<u64>);

impl Contender for RangeAlloc {
    type Handle = (u64, u64);

    #[inline]
    fn alloc(&mut self, size_bytes: u64) -> Option<Self::Handle> {
        let range = self.0.allocate_range(size_bytes.div_ceil(UNIT_BYTES) * UNIT_BYTES).ok()?;
        Some((range.start, range.end))
    }

    #[inline]
    fn footprint_end(handle: &Self::Handle, _size_bytes: u64) -> u64 {
        handle.1
    }

    #[inline]
    fn free(&mut self, (start, end): Self::Handle) {
        self.0.free_range(start..end);
    }
}

#[derive(Clone, Copy, Default)]
struct Memory {
    peak_live_bytes: u64,
    peak_end_bytes: u64,
    failed: u64,
}

/// Replays `trace`; with `TIMED`, times every operation into `op_nanos` (by event index). A constant, so the
/// untimed loop carries no timing code at all.
#[inline]
fn replay<C: Contender, const TIMED: bool>(
    trace: &Trace,
    contender: &mut C,
    handles: &mut Handles<C>,
    op_nanos: &mut [u32],
) -> Memory {
    let mut memory = Memory::default();
    let mut live_bytes = 0;
    for (index, event) in trace.events().iter().enumerate() {
        let started = TIMED.then(Instant::now);
        match *event {
            Event::Alloc { slot, size_bytes } => {
                let slot = slot as usize;
                handles.handles[slot] = contender.alloc(size_bytes);
                match &handles.handles[slot] {
                    Some(handle) => {
                        handles.sizes[slot] = size_bytes;
                        live_bytes += size_bytes;
                        memory.peak_live_bytes = memory.peak_live_bytes.max(live_bytes);
                        memory.peak_end_bytes = memory.peak_end_bytes.max(C::footprint_end(handle, size_bytes));
                    }
                    None => memory.failed += 1,
                }
            }
            Event::Free { slot } => {
                if let Some(handle) = handles.handles[slot as usize].take() {
                    contender.free(handle);
                    live_bytes -= handles.sizes[slot as usize];
                }
            }
            // The benchmark's allocators hold no cache to give back.
            Event::EmptyCache => {}
        }
        if let Some(started) = started {
            op_nanos[index] = u32::try_from(started.elapsed().as_nanos()).unwrap_or(u32::MAX);
        }
    }
    memory
}

/// Live handles by trace slot, and the sizes they were requested with.
struct Handles<C: Contender> {
    handles: Vec<Option<C::Handle>>,
    sizes: Vec<u64>,
}

impl<C: Contender> Handles<C> {
    fn new(trace: &Trace) -> Self {
        Self { handles: vec![None; trace.slots() as usize], sizes: vec![0; trace.slots() as usize] }
    }
}

/// Frees what the trace left live, so a warm instance starts the next replay empty.
fn drain<C: Contender>(contender: &mut C, handles: &mut Handles<C>) {
    for handle in handles.handles.iter_mut().filter_map(Option::take) {
        contender.free(handle);
    }
}

struct Row {
    name: &'static str,
    ns_per_event: f64,
    ratio_to_peer: f64,
    op_p50_ns: u32,
    op_p99_ns: u32,
    op_max_ns: u32,
    memory: Memory,
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A contender ready to be measured: one warm instance (what the trace leaves live is freed, untimed,
/// after every replay, so metadata growth and first-touch page faults stay out of every contender's numbers
/// alike).
struct Prepared<'t> {
    name: &'static str,
    memory: Memory,
    /// One timed replay: nanoseconds per event.
    replay_once: Box<dyn FnMut() -> f64 + 't>,
    /// Per-operation best times over `LATENCY_REPLAYS` replays, sorted.
    latencies: Vec<u32>,
}

fn prepare<'t, C: Contender + 't>(name: &'static str, make: &dyn Fn() -> C, trace: &'t Trace) -> Prepared<'t> {
    let events = trace.events().len();
    let mut handles = Handles::new(trace);
    let mut contender = make();
    let memory = replay::<C, false>(trace, &mut contender, &mut handles, &mut []);
    drain(&mut contender, &mut handles);
    let mut best = vec![u32::MAX; events];
    let mut nanos = vec![0; events];
    for _ in 0..LATENCY_REPLAYS {
        replay::<C, true>(trace, &mut contender, &mut handles, &mut nanos);
        drain(&mut contender, &mut handles);
        for (best, &now) in best.iter_mut().zip(&nanos) {
            *best = (*best).min(now);
        }
    }
    best.sort_unstable();
    Prepared {
        name,
        memory,
        replay_once: Box::new(move || {
            let started = Instant::now();
            black_box(replay::<C, false>(trace, &mut contender, &mut handles, &mut []));
            let nanos = started.elapsed().as_nanos() as f64;
            drain(&mut contender, &mut handles);
            nanos / events as f64
        }),
        latencies: best,
    }
}

/// Whole replays in alternating blocks: `BLOCK` replays of a contender, then `BLOCK` of the peer
/// (offset-allocator), each block's first replay discarded so both run on warm caches; the ratio is the median
/// over blocks of (contender's block median / peer's block median), robust to the machine's speed drifting.
fn measure(mut prepared: Vec<Prepared<'_>>) -> Vec<Row> {
    let peer =
        prepared.iter().position(|contender| contender.name.starts_with("offset-allocator")).expect("the peer is measured");
    let block = |contender: &mut Prepared<'_>| {
        (contender.replay_once)();
        let mut samples: Vec<f64> = (1..BLOCK).map(|_| (contender.replay_once)()).collect();
        median(&mut samples)
    };
    let mut peer_samples = Vec::new();
    let mut results = Vec::new();
    for index in 0..prepared.len() {
        let mut samples = Vec::with_capacity(BLOCKS);
        let mut ratios = Vec::with_capacity(BLOCKS);
        for _ in 0..BLOCKS {
            let ns = block(&mut prepared[index]);
            let peer_ns = block(&mut prepared[peer]);
            samples.push(ns);
            ratios.push(ns / peer_ns);
            peer_samples.push(peer_ns);
        }
        results.push((median(&mut samples), median(&mut ratios)));
    }
    let peer_ns = median(&mut peer_samples);
    prepared
        .into_iter()
        .zip(results)
        .enumerate()
        .map(|(index, (contender, (ns_per_event, ratio)))| {
            let best = &contender.latencies;
            Row {
                name: contender.name,
                ns_per_event: if index == peer { peer_ns } else { ns_per_event },
                ratio_to_peer: if index == peer { 1.0 } else { ratio },
                op_p50_ns: best[best.len() / 2],
                op_p99_ns: best[best.len() * 99 / 100],
                op_max_ns: best[best.len() - 1],
                memory: contender.memory,
            }
        })
        .collect()
}

fn config() -> PolicyConfig {
    PolicyConfig { min_align_bytes: UNIT_BYTES, slab_min_class_bytes: UNIT_BYTES, ..PolicyConfig::default() }
}

fn offset_allocator() -> OffsetAllocator {
    OffsetAllocator(offset_allocator::Allocator::new(u32::try_from(CAPACITY_BYTES / UNIT_BYTES).expect("fits u32")))
}

fn range_alloc() -> RangeAlloc {
    RangeAlloc(range_alloc::RangeAllocator::new(0..CAPACITY_BYTES))
}

/// Calls `$body` with (name, constructor) for every contender; a macro because each has its own type.
macro_rules! for_each_contender {
    ($body:ident, $($arg:expr),*) => {{
        let cfg = config();
        let exact = PolicyConfig { best_fit_exact: true, ..config() };
        vec![
            $body("tlsf", &|| Ours(Tlsf::with_config(CAPACITY_BYTES, &cfg).expect("valid")), $($arg),*),
            $body("best-fit", &|| Ours(BestFit::with_config(CAPACITY_BYTES, &cfg).expect("valid")), $($arg),*),
            $body("best-fit (exact)", &|| Ours(BestFit::with_config(CAPACITY_BYTES, &exact).expect("valid")), $($arg),*),
            $body("first-fit", &|| Ours(FirstFit::with_config(CAPACITY_BYTES, &cfg).expect("valid")), $($arg),*),
            $body("buddy", &|| Ours(Buddy::with_config(CAPACITY_BYTES, &cfg).expect("valid")), $($arg),*),
            $body("linear-bump", &|| Ours(Linear::with_config(CAPACITY_BYTES, LinearMode::Bump, &cfg).expect("valid")), $($arg),*),
            $body("linear-stack", &|| Ours(Linear::with_config(CAPACITY_BYTES, LinearMode::Stack, &cfg).expect("valid")), $($arg),*),
            $body("linear-ring", &|| Ours(Linear::with_config(CAPACITY_BYTES, LinearMode::Ring, &cfg).expect("valid")), $($arg),*),
            $body("slab", &|| Ours(Slab::with_config(CAPACITY_BYTES, &cfg).expect("valid")), $($arg),*),
            $body("offset-allocator 0.2", &offset_allocator, $($arg),*),
            $body("range-alloc 0.1.5", &range_alloc, $($arg),*),
        ]
    }};
}

fn table(trace: &Trace, rows: &[Row]) -> String {
    let peer = rows.iter().find(|row| row.name.starts_with("offset-allocator")).expect("offset-allocator measured");
    let peer_memory = peer.memory.peak_end_bytes as f64 / peer.memory.peak_live_bytes as f64;
    let mut text = format!(
        "Trace `{}`: {} events, {} on one {} GiB range in {}-byte units.\n\n\
         | contender | ns/event (median) | vs offset-allocator | op p50 ns | op p99 ns | op max ns | peak reserved / peak live | vs offset-allocator | failed allocs |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        trace.name,
        trace.events().len(),
        std::env::consts::ARCH,
        CAPACITY_BYTES >> 30,
        UNIT_BYTES
    );
    for row in rows {
        let ratio = row.memory.peak_end_bytes as f64 / row.memory.peak_live_bytes.max(1) as f64;
        text.push_str(&format!(
            "| {} | {:.1} | {:.2} | {} | {} | {} | {:.4} | {:.4} | {} |\n",
            row.name,
            row.ns_per_event,
            row.ratio_to_peer,
            row.op_p50_ns,
            row.op_p99_ns,
            row.op_max_ns,
            ratio,
            ratio / peer_memory,
            row.memory.failed
        ));
    }
    text
}

fn criterion_bench<C: Contender>(
    name: &'static str,
    make: &dyn Fn() -> C,
    trace: &Trace,
    criterion: &mut Criterion,
) -> &'static str {
    let mut handles = Handles::new(trace);
    let mut contender = make();
    criterion.bench_function(&format!("{}/{name}", trace.name), |bencher| {
        bencher.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                let started = Instant::now();
                black_box(replay::<C, false>(trace, &mut contender, &mut handles, &mut []));
                total += started.elapsed();
                drain(&mut contender, &mut handles);
            }
            total
        });
    });
    name
}

fn main() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/traces/gpt2_train_fixed-default.hst");
    let mut trace = Trace::read(std::path::Path::new(path)).expect("the committed trace reads");
    trace.name = "gpt2_train_fixed-default".into();

    let rows = measure(for_each_contender!(prepare, &trace));
    let text = table(&trace, &rows);
    println!("\n{text}");
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/heapscope-bench");
    if std::fs::create_dir_all(out).is_ok() {
        std::fs::write(format!("{out}/trace_replay.md"), &text).ok();
    }

    let mut criterion = Criterion::default().measurement_time(Duration::from_secs(3)).configure_from_args();
    let benched = for_each_contender!(criterion_bench, &trace, &mut criterion);
    assert_eq!(benched.len(), rows.len());
    criterion.final_summary();
}
