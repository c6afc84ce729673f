//! Replays the real PyTorch trace `gpt2_train_fixed-default` (GPT-2 124M training, 12,355 alloc/free events,
//! ~13 GiB live at peak) through three allocators of real `VkDeviceMemory`, on the same device in the same run:
//!
//! - heapscope: `Heap<DeviceMemorySource>` with TLSF in 256 MiB blocks (requests from 128 MiB get a block of
//!   their own, sized to them, when no reserved block has room; one empty block kept:
//!   `HeapConfig::new(PolicyKind::Tlsf)`), device-local memory;
//! - gpu-allocator 0.28 through [`GpuAllocatorHeap`] (`MemoryLocation::GpuOnly`, 256 MiB blocks, linear);
//! - gpu-allocator called directly, to show what the `DeviceHeap` wrapper costs;
//! - heapscope again with gpu-allocator's rule for dedicated blocks (only requests above 256 MiB), a variant row;
//! - VMA (vk-mem 0.5): `vmaAllocateMemory` with requirements {size, alignment 512, every memory type},
//!   `MemoryUsage::Unknown` with DEVICE_LOCAL required (on lavapipe the one type has it), default block sizes.
//!
//! Every request is aligned to 512 bytes (PyTorch's `kMinBlockSize`). A timed replay runs the whole trace on a
//! warm instance; what the trace leaves live is then freed, untimed. Blocks of `BLOCK` replays (the first
//! discarded) alternate between the contenders, in a rotating order, so the machine's drift cancels; the ratio
//! against gpu-allocator is the median over rounds of the per-round ratios of block medians. Peak device
//! memory is the most bytes reserved in `VkDeviceMemory` at once, over one untimed replay on a fresh instance.
//!
//! `cargo bench -p heapscope-vulkan --bench vulkan_trace` prints the table and writes it to
//! `target/heapscope-bench/vulkan_trace.md`. Without a Vulkan device it says so and exits.
#![allow(unsafe_code, reason = "vk-mem's allocation calls are unsafe; each block says why it is sound")]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use heapscope_core::trace::{Event, Trace};
use heapscope_core::{DeviceHeap, Heap, HeapConfig, PolicyKind, Request};
use heapscope_vulkan::ash::vk;
use heapscope_vulkan::memory_types::MemoryUsage;
use heapscope_vulkan::{
    ContextOptions, DeviceMemorySource, DeviceSourceConfig, GpuAllocatorConfig, GpuAllocatorHeap, VulkanContext,
};
use vk_mem::Alloc;

const ALIGN_BYTES: u64 = 512;
/// Replays per block (the first one warms caches and is not counted).
const BLOCK: usize = 6;
/// Rounds: each runs one block of every contender.
const ROUNDS: usize = 21;

/// What the replay loop needs from an allocator.
trait Contender {
    type Handle;
    fn alloc(&mut self, size_bytes: u64) -> Option<Self::Handle>;
    fn free(&mut self, handle: Self::Handle);
    /// Bytes reserved from the device now.
    fn reserved_bytes(&self) -> u64;
}

/// A heapscope `DeviceHeap`: heapscope's own heap, or gpu-allocator wrapped as one.
struct AsDeviceHeap<H: DeviceHeap>(H);

impl<H: DeviceHeap> Contender for AsDeviceHeap<H> {
    type Handle = H::Handle;

    #[inline]
    fn alloc(&mut self, size_bytes: u64) -> Option<H::Handle> {
        self.0.allocate_request(Request::new(size_bytes, ALIGN_BYTES).ok()?).ok()
    }

    #[inline]
    fn free(&mut self, handle: H::Handle) {
        self.0.free_handle(handle).expect("the trace frees only live allocations");
    }

    fn reserved_bytes(&self) -> u64 {
        self.0.reserved_and_live_bytes().0
    }
}

/// gpu-allocator called directly, without the `DeviceHeap` wrapper: what the wrapper costs.
struct RawGpuAllocator(gpu_allocator::vulkan::Allocator);

impl Contender for RawGpuAllocator {
    type Handle = gpu_allocator::vulkan::Allocation;

    #[inline]
    fn alloc(&mut self, size_bytes: u64) -> Option<Self::Handle> {
        self.0
            .allocate(&gpu_allocator::vulkan::AllocationCreateDesc {
                name: "",
                requirements: vk::MemoryRequirements { size: size_bytes, alignment: ALIGN_BYTES, memory_type_bits: !0 },
                location: gpu_allocator::MemoryLocation::GpuOnly,
                linear: true,
                allocation_scheme: gpu_allocator::vulkan::AllocationScheme::GpuAllocatorManaged,
            })
            .ok()
    }

    #[inline]
    fn free(&mut self, handle: Self::Handle) {
        self.0.free(handle).expect("the trace frees only live allocations");
    }

    fn reserved_bytes(&self) -> u64 {
        self.0.capacity()
    }
}

/// VMA through vk-mem.
struct Vma {
    allocator: vk_mem::Allocator,
    create_info: vk_mem::AllocationCreateInfo,
}

impl Contender for Vma {
    type Handle = vk_mem::Allocation;

    #[inline]
    fn alloc(&mut self, size_bytes: u64) -> Option<vk_mem::Allocation> {
        let requirements = vk::MemoryRequirements { size: size_bytes, alignment: ALIGN_BYTES, memory_type_bits: !0 };
        // SAFETY: valid requirements and create info on a live allocator; the allocation is freed by `free` or `drain`.
        unsafe { self.allocator.allocate_memory(&requirements, &self.create_info) }.ok()
    }

    #[inline]
    fn free(&mut self, mut handle: vk_mem::Allocation) {
        // SAFETY: the allocation is live and made by this allocator; nothing is bound to it.
        unsafe { self.allocator.free_memory(&mut handle) };
    }

    fn reserved_bytes(&self) -> u64 {
        let budgets = self.allocator.get_heap_budgets().expect("VMA reports its heaps");
        budgets.iter().map(|budget| budget.statistics.blockBytes).sum()
    }
}

/// Handles by trace slot.
struct Handles<H>(Vec<Option<H>>);

#[derive(Clone, Copy, Default)]
struct Memory {
    peak_live_bytes: u64,
    peak_reserved_bytes: u64,
    failed: u64,
}

/// Replays the trace; with `SAMPLE`, reads the reserved bytes after every allocation (untimed replays only).
#[inline]
fn replay<C: Contender, const SAMPLE: bool>(trace: &Trace, contender: &mut C, handles: &mut Handles<C::Handle>) -> Memory {
    let mut memory = Memory::default();
    let mut live_bytes = 0;
    let mut sizes = if SAMPLE { vec![0; handles.0.len()] } else { Vec::new() };
    for event in trace.events() {
        match *event {
            Event::Alloc { slot, size_bytes } => {
                let handle = contender.alloc(size_bytes);
                if handle.is_none() {
                    memory.failed += 1;
                } else if SAMPLE {
                    sizes[slot as usize] = size_bytes;
                    live_bytes += size_bytes;
                    memory.peak_live_bytes = memory.peak_live_bytes.max(live_bytes);
                    memory.peak_reserved_bytes = memory.peak_reserved_bytes.max(contender.reserved_bytes());
                }
                handles.0[slot as usize] = handle;
            }
            Event::Free { slot } => {
                if let Some(handle) = handles.0[slot as usize].take() {
                    contender.free(handle);
                    if SAMPLE {
                        live_bytes -= sizes[slot as usize];
                    }
                }
            }
            // The benchmark's trace (GPT-2's) calls no `empty_cache()`.
            Event::EmptyCache => {}
        }
    }
    memory
}

fn drain<C: Contender>(contender: &mut C, handles: &mut Handles<C::Handle>) {
    for handle in handles.0.iter_mut().filter_map(Option::take) {
        contender.free(handle);
    }
}

struct Prepared<'t> {
    name: &'static str,
    memory: Memory,
    /// One timed replay on the warm instance: nanoseconds per event.
    replay_once: Box<dyn FnMut() -> f64 + 't>,
}

fn prepare<'t, C: Contender + 't>(name: &'static str, mut contender: C, trace: &'t Trace) -> Prepared<'t> {
    let mut handles = Handles((0..trace.slots()).map(|_| None).collect());
    let memory = replay::<C, true>(trace, &mut contender, &mut handles);
    drain(&mut contender, &mut handles);
    let events = trace.events().len() as f64;
    Prepared {
        name,
        memory,
        replay_once: Box::new(move || {
            let started = Instant::now();
            black_box(replay::<C, false>(trace, &mut contender, &mut handles));
            let nanos = started.elapsed().as_nanos() as f64;
            drain(&mut contender, &mut handles);
            nanos / events
        }),
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

struct Row {
    name: &'static str,
    ns_per_event: f64,
    ratio: f64,
    /// Against gpu-allocator called directly.
    ratio_direct: f64,
    memory: Memory,
}

/// Rounds of one block per contender, the order rotating each round; ratios against `peer` and `direct` per round.
fn measure(mut prepared: Vec<Prepared<'_>>, peer: usize, direct: usize) -> Vec<Row> {
    let count = prepared.len();
    let mut samples = vec![Vec::new(); count];
    let mut ratios = vec![Vec::new(); count];
    let mut ratios_direct = vec![Vec::new(); count];
    for round in 0..ROUNDS {
        let mut block_medians = vec![0.0; count];
        for step in 0..count {
            let index = (round + step) % count;
            let contender = &mut prepared[index];
            (contender.replay_once)();
            let mut block: Vec<f64> = (1..BLOCK).map(|_| (contender.replay_once)()).collect();
            samples[index].extend_from_slice(&block);
            block_medians[index] = median(&mut block);
        }
        for index in 0..count {
            ratios[index].push(block_medians[index] / block_medians[peer]);
            ratios_direct[index].push(block_medians[index] / block_medians[direct]);
        }
    }
    prepared
        .into_iter()
        .enumerate()
        .map(|(index, contender)| Row {
            name: contender.name,
            ns_per_event: median(&mut samples[index]),
            ratio: median(&mut ratios[index]),
            ratio_direct: median(&mut ratios_direct[index]),
            memory: contender.memory,
        })
        .collect()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

fn table(trace: &Trace, device: &str, rows: &[Row], peer: usize, notes: &[String]) -> String {
    let peer_reserved = rows[peer].memory.peak_reserved_bytes as f64;
    let mut text = format!(
        "Trace `{}`: {} events, requests aligned to {ALIGN_BYTES} bytes, on {device}; {ROUNDS} rounds of {} timed \
         replays per contender, order rotating.\n\n\
         | contender | ns/event (median) | time vs gpu-allocator (median of per-round ratios) | vs gpu-allocator direct | peak reserved MiB | \
         peak reserved vs gpu-allocator | peak live MiB | failed allocs |\n|---|---|---|---|---|---|---|---|\n",
        trace.name,
        trace.events().len(),
        BLOCK - 1
    );
    for row in rows {
        text.push_str(&format!(
            "| {} | {:.1} | {:.3} | {:.3} | {:.1} | {:.4} | {:.1} | {} |\n",
            row.name,
            row.ns_per_event,
            row.ratio,
            row.ratio_direct,
            mib(row.memory.peak_reserved_bytes),
            row.memory.peak_reserved_bytes as f64 / peer_reserved,
            mib(row.memory.peak_live_bytes),
            row.memory.failed
        ));
    }
    let ours = &rows[0];
    let time_met = ours.ratio <= 0.5;
    let memory_met = ours.memory.peak_reserved_bytes <= rows[peer].memory.peak_reserved_bytes;
    text.push_str(&format!(
        "\nTargets (issue): heapscope time <= 0.5x gpu-allocator: {} ({:.3}x; {:.3}x against gpu-allocator called directly); \
         peak device memory <= gpu-allocator's: {} ({:.4}x).\n",
        if time_met { "met" } else { "NOT met" },
        ours.ratio,
        ours.ratio_direct,
        if memory_met { "met" } else { "NOT met" },
        ours.memory.peak_reserved_bytes as f64 / peer_reserved
    ));
    for note in notes {
        text.push_str(&format!("\n{note}\n"));
    }
    text
}

fn main() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/traces/gpt2_train_fixed-default.hst");
    let mut trace = Trace::read(std::path::Path::new(path)).expect("the committed trace reads");
    trace.name = "gpt2_train_fixed-default".into();
    let context = match VulkanContext::new(&ContextOptions::from_env()) {
        Ok(context) => Arc::new(context),
        Err(error) => {
            eprintln!("vulkan_trace: no Vulkan device to measure on ({error}); skipped");
            return;
        }
    };
    let device = context.properties().name.clone();
    let mut notes = Vec::new();

    // The heap keeps one empty block cached (`ReleaseRule::KeepOne`, like gpu-allocator); the source frees it on
    // drop, which is not a leak worth a line.
    let source_config = DeviceSourceConfig { report_leaks_on_drop: false, ..DeviceSourceConfig::new(MemoryUsage::DeviceLocal) };
    let source = || DeviceMemorySource::new(Arc::clone(&context), source_config).expect("a device-local memory type");
    let heapscope = Heap::new(HeapConfig::new(PolicyKind::Tlsf), source()).expect("a valid heap");
    // The same heap with gpu-allocator's rule for blocks of their own: only requests larger than a block.
    let dedicated_256 = HeapConfig { dedicated_threshold_bytes: (256 << 20) + 1, ..HeapConfig::new(PolicyKind::Tlsf) };
    let heapscope_dedicated_256 = Heap::new(dedicated_256, source()).expect("a valid heap");
    let gpu_allocator =
        GpuAllocatorHeap::new(Arc::clone(&context), GpuAllocatorConfig::default()).expect("gpu-allocator brings up");

    let mut debug_settings = gpu_allocator::AllocatorDebugSettings::default();
    debug_settings.log_leaks_on_shutdown = false;
    let raw_gpu_allocator = gpu_allocator::vulkan::Allocator::new(&gpu_allocator::vulkan::AllocatorCreateDesc {
        instance: context.instance().clone(),
        device: context.device().clone(),
        physical_device: context.physical_device(),
        debug_settings,
        buffer_device_address: false,
        allocation_sizes: gpu_allocator::AllocationSizes::new(256 << 20, 256 << 20),
    })
    .expect("gpu-allocator brings up");

    let mut create_info = vk_mem::AllocatorCreateInfo::new(context.instance(), context.device(), context.physical_device());
    create_info.preferred_large_heap_block_size = 256 << 20;
    // SAFETY: the instance, device and physical device are live for as long as the context, which outlives the
    // allocator (dropped at the end of `main`, before `context`).
    let vma = match unsafe { vk_mem::Allocator::new(create_info) } {
        Ok(allocator) => {
            let required_flags = if context
                .properties()
                .memory_types
                .iter()
                .any(|info| info.property_flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL))
            {
                vk::MemoryPropertyFlags::DEVICE_LOCAL
            } else {
                vk::MemoryPropertyFlags::empty()
            };
            let create_info =
                vk_mem::AllocationCreateInfo { usage: vk_mem::MemoryUsage::Unknown, required_flags, ..Default::default() };
            Some(Vma { allocator, create_info })
        }
        Err(error) => {
            notes.push(format!("VMA skipped: vmaCreateAllocator failed ({error})."));
            None
        }
    };

    let mut prepared = vec![
        prepare("heapscope Heap<DeviceMemorySource> TLSF", AsDeviceHeap(heapscope), &trace),
        prepare("gpu-allocator 0.28", AsDeviceHeap(gpu_allocator), &trace),
        prepare("gpu-allocator 0.28, called directly (no DeviceHeap wrapper)", RawGpuAllocator(raw_gpu_allocator), &trace),
        prepare("heapscope TLSF, dedicated above 256 MiB (not default)", AsDeviceHeap(heapscope_dedicated_256), &trace),
    ];
    if let Some(vma) = vma {
        prepared.push(prepare("VMA (vk-mem 0.5)", vma, &trace));
    }
    let peer = 1;
    let rows = measure(prepared, peer, 2);
    let text = table(&trace, &device, &rows, peer, &notes);
    println!("\n{text}");
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/heapscope-bench");
    if std::fs::create_dir_all(out).is_ok() {
        std::fs::write(format!("{out}/vulkan_trace.md"), &text).ok();
    }
}
