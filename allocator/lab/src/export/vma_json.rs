//! A heap's state in the JSON statistics format of the Vulkan Memory Allocator (VMA): the text that
//! `vmaBuildStatsString(allocator, &text, VK_TRUE)` writes, which VMA's `GpuMemDumpVis.py` draws and other
//! tools of VMA users read.
//!
//! ## Mapping
//!
//! The device is described by a [`VmaDeviceInfo`] (plain data: name, API version, memory heaps and types,
//! and the memory type the heap's blocks come from); [`VmaDeviceInfo::simulated`] is one `DEVICE_LOCAL`
//! heap with one `DEVICE_LOCAL` type, for heaps over a [`SimulatedSource`](heapscope_core::SimulatedSource).
//!
//! - `"General"`: `API` = `"Vulkan"`, `apiVersion`, `GPU`, `deviceType`, the limits and the heap and type
//!   counts, from the device info.
//! - Every shared block of the [`HeapReport`] is one VMA block of the default pool of the blocks' type
//!   (`"DefaultPools"` → `"Type N"` → `"Blocks"` → `"ID"`, the ID being the heap's block index). Its
//!   `"Suballocations"` tile the block in offset order: the `Live` and `Padding` runs of one allocation make
//!   one suballocation of `Type` `"BUFFER"` (heapscope does not know buffers from images), `Usage` 0, its
//!   size the allocation's footprint and its label, if any, as `Name`; `Free` and `Retired` runs are
//!   unused (`"FREE"`), adjacent ones merged into one range as VMA never writes two in a row.
//! - A dedicated block holding an allocation is one entry of `"DedicatedAllocations"` (a `"BUFFER"` the size
//!   of the block); a dedicated block left empty is written as an ordinary block.
//! - `"Stats"` (per type, per heap in `"MemoryInfo"`, and `"Total"`) count VMA's way: a dedicated allocation is
//!   one block and one allocation of the block's size; `UnusedRangeCount` counts the `"FREE"` ranges;
//!   `AllocationSizeMin/Max` and `UnusedRangeSizeMin/Max` appear only when there are at least two.
//! - `"Budget"`: `BudgetBytes` from the device info, `UsageBytes` = the bytes of the heap's blocks.
//! - `"CustomPools"` is empty: heapscope has none. Types other than the blocks' one have empty pools.

use heapscope_core::{AllocationId, BlockReport, HeapReport, RangeState};
use serde_json::Value as Json;

/// `VK_MEMORY_HEAP_DEVICE_LOCAL_BIT`.
pub const HEAP_DEVICE_LOCAL: u32 = 0x1;
/// `VK_MEMORY_HEAP_MULTI_INSTANCE_BIT`.
pub const HEAP_MULTI_INSTANCE: u32 = 0x2;
/// `VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT`.
pub const TYPE_DEVICE_LOCAL: u32 = 0x1;
/// `VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT`.
pub const TYPE_HOST_VISIBLE: u32 = 0x2;
/// `VK_MEMORY_PROPERTY_HOST_COHERENT_BIT`.
pub const TYPE_HOST_COHERENT: u32 = 0x4;
/// `VK_MEMORY_PROPERTY_HOST_CACHED_BIT`.
pub const TYPE_HOST_CACHED: u32 = 0x8;
/// `VK_MEMORY_PROPERTY_LAZILY_ALLOCATED_BIT`.
pub const TYPE_LAZILY_ALLOCATED: u32 = 0x10;
/// `VK_MEMORY_PROPERTY_PROTECTED_BIT`.
pub const TYPE_PROTECTED: u32 = 0x20;

/// Flag bits and the names VMA writes for them.
type FlagNames = [(u32, &'static str)];

const HEAP_FLAG_NAMES: [(u32, &str); 2] = [(HEAP_DEVICE_LOCAL, "DEVICE_LOCAL"), (HEAP_MULTI_INSTANCE, "MULTI_INSTANCE")];
const TYPE_FLAG_NAMES: [(u32, &str); 6] = [
    (TYPE_DEVICE_LOCAL, "DEVICE_LOCAL"),
    (TYPE_HOST_VISIBLE, "HOST_VISIBLE"),
    (TYPE_HOST_COHERENT, "HOST_COHERENT"),
    (TYPE_HOST_CACHED, "HOST_CACHED"),
    (TYPE_LAZILY_ALLOCATED, "LAZILY_ALLOCATED"),
    (TYPE_PROTECTED, "PROTECTED"),
];

/// One Vulkan memory heap (`VkMemoryHeap` plus its budget).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmaHeapInfo {
    /// `size` in bytes.
    pub size_bytes: u64,
    /// `VkMemoryHeapFlags` (see [`HEAP_DEVICE_LOCAL`]).
    pub flags: u32,
    /// The budget in bytes (`VmaBudget::budget`).
    pub budget_bytes: u64,
}

/// One Vulkan memory type (`VkMemoryType`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmaTypeInfo {
    /// `VkMemoryPropertyFlags` (see [`TYPE_DEVICE_LOCAL`]).
    pub flags: u32,
    /// The heap it belongs to.
    pub heap_index: u32,
}

/// The device a heap report is written for: what VMA takes from `VkPhysicalDeviceProperties` and
/// `VkPhysicalDeviceMemoryProperties`, and the memory type the heap's blocks were allocated from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmaDeviceInfo {
    /// `deviceName`.
    pub device_name: String,
    /// `apiVersion` as (major, minor, patch).
    pub api_version: (u32, u32, u32),
    /// `deviceType` (`VkPhysicalDeviceType`: 0 other, 1 integrated, 2 discrete, 3 virtual, 4 CPU).
    pub device_type: u32,
    /// `limits.maxMemoryAllocationCount`.
    pub max_memory_allocation_count: u32,
    /// `limits.bufferImageGranularity`.
    pub buffer_image_granularity: u64,
    /// `limits.nonCoherentAtomSize`.
    pub non_coherent_atom_size: u64,
    /// The memory heaps.
    pub heaps: Vec<VmaHeapInfo>,
    /// The memory types.
    pub types: Vec<VmaTypeInfo>,
    /// Index of the memory type every block of the report belongs to.
    pub block_type: u32,
    /// The preferred block size written for the blocks' default pool.
    pub preferred_block_size: u64,
}

impl VmaDeviceInfo {
    /// A simulated device of `capacity_bytes`: one `DEVICE_LOCAL` heap of that size and budget, one
    /// `DEVICE_LOCAL` type in it holding the blocks, 256 MiB preferred blocks (heapscope's default).
    pub fn simulated(capacity_bytes: u64) -> Self {
        Self {
            device_name: "heapscope simulated device".to_owned(),
            api_version: (1, 3, 0),
            device_type: 0,
            max_memory_allocation_count: 4096,
            buffer_image_granularity: 1,
            non_coherent_atom_size: 1,
            heaps: vec![VmaHeapInfo { size_bytes: capacity_bytes, flags: HEAP_DEVICE_LOCAL, budget_bytes: capacity_bytes }],
            types: vec![VmaTypeInfo { flags: TYPE_DEVICE_LOCAL, heap_index: 0 }],
            block_type: 0,
            preferred_block_size: 256 << 20,
        }
    }
}

/// Writes `report` as VMA's detailed JSON statistics for `device` (see the module documentation).
pub fn heap_report_to_vma_json(report: &HeapReport, device: &VmaDeviceInfo) -> String {
    let blocks: Vec<VmaBlock> = report.blocks.iter().map(VmaBlock::from_report).collect();
    let mut block_stats = Stats::default();
    for block in &blocks {
        block_stats.add_block(block);
    }
    let type_stats = |index: u32| if index == device.block_type { block_stats.clone() } else { Stats::default() };
    let heap_stats = |heap: u32| {
        let mut stats = Stats::default();
        for (index, memory_type) in (0..).zip(&device.types) {
            if memory_type.heap_index == heap {
                stats.merge(&type_stats(index));
            }
        }
        stats
    };

    let (major, minor, patch) = device.api_version;
    let general = object([
        ("API", Json::from("Vulkan")),
        ("apiVersion", Json::from(format!("{major}.{minor}.{patch}"))),
        ("GPU", Json::from(device.device_name.as_str())),
        ("deviceType", Json::from(device.device_type)),
        ("maxMemoryAllocationCount", Json::from(device.max_memory_allocation_count)),
        ("bufferImageGranularity", Json::from(device.buffer_image_granularity)),
        ("nonCoherentAtomSize", Json::from(device.non_coherent_atom_size)),
        ("memoryHeapCount", Json::from(device.heaps.len() as u64)),
        ("memoryTypeCount", Json::from(device.types.len() as u64)),
    ]);
    let mut total = Stats::default();
    let mut memory_info = Vec::new();
    for (heap_index, heap) in (0..).zip(&device.heaps) {
        let stats = heap_stats(heap_index);
        total.merge(&stats);
        let pools = (0..)
            .zip(&device.types)
            .filter(|(_, memory_type)| memory_type.heap_index == heap_index)
            .map(|(index, memory_type)| {
                let fields = [("Flags", flags_json(memory_type.flags, &TYPE_FLAG_NAMES)), ("Stats", type_stats(index).json())];
                (format!("Type {index}"), object(fields))
            })
            .collect();
        let budget = object([("BudgetBytes", Json::from(heap.budget_bytes)), ("UsageBytes", Json::from(stats.block_bytes))]);
        let fields = [
            ("Flags", flags_json(heap.flags, &HEAP_FLAG_NAMES)),
            ("Size", Json::from(heap.size_bytes)),
            ("Budget", budget),
            ("Stats", stats.json()),
            ("MemoryPools", object_of(pools)),
        ];
        memory_info.push((format!("Heap {heap_index}"), object(fields)));
    }
    let block_heap = device.types.get(device.block_type as usize).map(|memory_type| memory_type.heap_index as usize);
    if block_heap.is_none_or(|heap| heap >= device.heaps.len()) {
        // The blocks' type is in no heap: count them in the total all the same.
        total.merge(&block_stats);
    }

    let mut type_indices: Vec<u32> = (0..).zip(&device.types).map(|(index, _)| index).collect();
    if !type_indices.contains(&device.block_type) {
        type_indices.push(device.block_type);
    }
    let default_pools = type_indices
        .into_iter()
        .map(|index| {
            let mine = index == device.block_type;
            let shared = if mine {
                blocks.iter().filter(|b| !b.is_dedicated()).map(|b| (b.id.to_string(), b.json())).collect()
            } else {
                vec![]
            };
            let dedicated = if mine { blocks.iter().filter_map(VmaBlock::dedicated_json).collect() } else { vec![] };
            let fields = [
                ("PreferredBlockSize", Json::from(device.preferred_block_size)),
                ("Blocks", object_of(shared)),
                ("DedicatedAllocations", Json::Array(dedicated)),
            ];
            (format!("Type {index}"), object(fields))
        })
        .collect();

    let root = object([
        ("General", general),
        ("Total", total.json()),
        ("MemoryInfo", object_of(memory_info)),
        ("DefaultPools", object_of(default_pools)),
        ("CustomPools", object_of(vec![])),
    ]);
    let mut out = serde_json::to_string_pretty(&root).unwrap_or_default();
    out.push('\n');
    out
}

/// One suballocation of a VMA block: an allocation's footprint or an unused range.
#[derive(Clone, Debug)]
struct Suballocation {
    offset: u64,
    size_bytes: u64,
    /// Whether it is an allocation's footprint (`false`: unused).
    used: bool,
    allocation: Option<AllocationId>,
    name: Option<String>,
}

/// A heapscope block as VMA sees it.
#[derive(Clone, Debug)]
struct VmaBlock {
    id: u32,
    size_bytes: u64,
    /// A dedicated block holding an allocation.
    dedicated: bool,
    suballocations: Vec<Suballocation>,
}

impl VmaBlock {
    fn from_report(block: &BlockReport) -> Self {
        let mut suballocations: Vec<Suballocation> = Vec::new();
        for range in &block.layout.ranges {
            let used = matches!(range.state, RangeState::Live | RangeState::Padding);
            if let Some(last) = suballocations.last_mut() {
                let same = last.used == used && (!used || (range.allocation.is_some() && last.allocation == range.allocation));
                if same && last.offset + last.size_bytes == range.offset {
                    last.size_bytes += range.size_bytes;
                    if last.name.is_none() {
                        last.name.clone_from(&range.label);
                    }
                    continue;
                }
            }
            suballocations.push(Suballocation {
                offset: range.offset,
                size_bytes: range.size_bytes,
                used,
                allocation: range.allocation,
                name: range.label.clone(),
            });
        }
        let dedicated = block.dedicated && suballocations.iter().any(|s| s.used);
        Self { id: block.index, size_bytes: block.size_bytes, dedicated, suballocations }
    }

    fn is_dedicated(&self) -> bool {
        self.dedicated
    }

    fn allocations(&self) -> impl Iterator<Item = &Suballocation> {
        self.suballocations.iter().filter(|s| s.used)
    }

    fn unused(&self) -> impl Iterator<Item = &Suballocation> {
        self.suballocations.iter().filter(|s| !s.used)
    }

    fn json(&self) -> Json {
        let allocated: u64 = self.allocations().map(|s| s.size_bytes).sum();
        let suballocations = self
            .suballocations
            .iter()
            .map(|s| {
                let mut fields = vec![
                    ("Offset".to_owned(), Json::from(s.offset)),
                    ("Type".to_owned(), Json::from(if s.used { "BUFFER" } else { "FREE" })),
                    ("Size".to_owned(), Json::from(s.size_bytes)),
                ];
                if s.used {
                    fields.push(("Usage".to_owned(), Json::from(0)));
                }
                if let Some(name) = &s.name {
                    fields.push(("Name".to_owned(), Json::from(name.as_str())));
                }
                object_of(fields)
            })
            .collect();
        object([
            ("MapRefCount", Json::from(0)),
            ("TotalBytes", Json::from(self.size_bytes)),
            ("UnusedBytes", Json::from(self.size_bytes - allocated)),
            ("Allocations", Json::from(self.allocations().count() as u64)),
            ("UnusedRanges", Json::from(self.unused().count() as u64)),
            ("Suballocations", Json::Array(suballocations)),
        ])
    }

    fn dedicated_json(&self) -> Option<Json> {
        if !self.dedicated {
            return None;
        }
        let mut fields = vec![
            ("Type".to_owned(), Json::from("BUFFER")),
            ("Size".to_owned(), Json::from(self.size_bytes)),
            ("Usage".to_owned(), Json::from(0)),
        ];
        if let Some(name) = self.allocations().find_map(|s| s.name.clone()) {
            fields.push(("Name".to_owned(), Json::from(name)));
        }
        Some(object_of(fields))
    }
}

/// `VmaDetailedStatistics`.
#[derive(Clone, Debug, Default)]
struct Stats {
    block_count: u64,
    block_bytes: u64,
    allocation_count: u64,
    allocation_bytes: u64,
    unused_range_count: u64,
    allocation_min: u64,
    allocation_max: u64,
    unused_min: u64,
    unused_max: u64,
}

impl Stats {
    fn add_allocation(&mut self, size_bytes: u64) {
        self.allocation_min = if self.allocation_count == 0 { size_bytes } else { self.allocation_min.min(size_bytes) };
        self.allocation_max = self.allocation_max.max(size_bytes);
        self.allocation_count += 1;
        self.allocation_bytes += size_bytes;
    }

    fn add_unused(&mut self, size_bytes: u64) {
        self.unused_min = if self.unused_range_count == 0 { size_bytes } else { self.unused_min.min(size_bytes) };
        self.unused_max = self.unused_max.max(size_bytes);
        self.unused_range_count += 1;
    }

    fn add_block(&mut self, block: &VmaBlock) {
        self.block_count += 1;
        self.block_bytes += block.size_bytes;
        if block.dedicated {
            self.add_allocation(block.size_bytes);
            return;
        }
        for allocation in block.allocations() {
            self.add_allocation(allocation.size_bytes);
        }
        for unused in block.unused() {
            self.add_unused(unused.size_bytes);
        }
    }

    fn merge(&mut self, other: &Self) {
        if other.allocation_count > 0 {
            self.allocation_min =
                if self.allocation_count == 0 { other.allocation_min } else { self.allocation_min.min(other.allocation_min) };
        }
        if other.unused_range_count > 0 {
            self.unused_min = if self.unused_range_count == 0 { other.unused_min } else { self.unused_min.min(other.unused_min) };
        }
        self.allocation_max = self.allocation_max.max(other.allocation_max);
        self.unused_max = self.unused_max.max(other.unused_max);
        self.block_count += other.block_count;
        self.block_bytes += other.block_bytes;
        self.allocation_count += other.allocation_count;
        self.allocation_bytes += other.allocation_bytes;
        self.unused_range_count += other.unused_range_count;
    }

    fn json(&self) -> Json {
        let mut fields = vec![
            ("BlockCount".to_owned(), Json::from(self.block_count)),
            ("BlockBytes".to_owned(), Json::from(self.block_bytes)),
            ("AllocationCount".to_owned(), Json::from(self.allocation_count)),
            ("AllocationBytes".to_owned(), Json::from(self.allocation_bytes)),
            ("UnusedRangeCount".to_owned(), Json::from(self.unused_range_count)),
        ];
        if self.allocation_count > 1 {
            fields.push(("AllocationSizeMin".to_owned(), Json::from(self.allocation_min)));
            fields.push(("AllocationSizeMax".to_owned(), Json::from(self.allocation_max)));
        }
        if self.unused_range_count > 1 {
            fields.push(("UnusedRangeSizeMin".to_owned(), Json::from(self.unused_min)));
            fields.push(("UnusedRangeSizeMax".to_owned(), Json::from(self.unused_max)));
        }
        object_of(fields)
    }
}

/// The flags as VMA writes them: the names it knows, then the remaining bits as a number.
fn flags_json(flags: u32, names: &FlagNames) -> Json {
    let mut items: Vec<Json> = names.iter().filter(|(bit, _)| flags & bit != 0).map(|(_, name)| Json::from(*name)).collect();
    let rest = names.iter().fold(flags, |rest, (bit, _)| rest & !bit);
    if rest != 0 {
        items.push(Json::from(rest));
    }
    Json::Array(items)
}

/// A JSON object with `fields` (serde_json sorts the keys; GpuMemDumpVis reads them by name).
fn object<const N: usize>(fields: [(&str, Json); N]) -> Json {
    Json::Object(fields.into_iter().map(|(key, value)| (key.to_owned(), value)).collect())
}

/// A JSON object from owned keys.
fn object_of(fields: Vec<(String, Json)>) -> Json {
    Json::Object(fields.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::process::{Command, Stdio};

    use serde_json::Value;

    use super::*;
    use heapscope_core::units::{KIB, MIB};
    use heapscope_core::{Heap, HeapConfig, PolicyKind, ReleaseRule, Request, SimulatedSource};

    const CAPACITY: u64 = 64 * MIB;

    /// One case: allocations in KiB (with a label), then the indices of those to free.
    struct Case {
        name: &'static str,
        sizes_kib: &'static [u64],
        frees: &'static [usize],
        blocks: usize,
        dedicated: usize,
    }

    const CASES: &[Case] = &[
        Case { name: "empty", sizes_kib: &[], frees: &[], blocks: 0, dedicated: 0 },
        Case { name: "one shared", sizes_kib: &[100], frees: &[], blocks: 1, dedicated: 0 },
        Case {
            name: "shared with a hole and a dedicated",
            sizes_kib: &[100, 200, 300, 600],
            frees: &[1],
            blocks: 1,
            dedicated: 1,
        },
        Case { name: "two shared blocks", sizes_kib: &[400, 400, 400, 3], frees: &[], blocks: 2, dedicated: 0 },
        Case { name: "freed dedicated stays an empty block", sizes_kib: &[400, 700], frees: &[1], blocks: 2, dedicated: 0 },
    ];

    fn heap_report(case: &Case) -> HeapReport {
        let config = HeapConfig {
            block_size_bytes: MIB,
            dedicated_threshold_bytes: 512 * KIB,
            release: ReleaseRule::Never,
            grow_blocks: false,
            ..HeapConfig::new(PolicyKind::Tlsf)
        };
        let mut heap = Heap::new(config, SimulatedSource::new(CAPACITY, 64 * KIB)).unwrap();
        let allocations: Vec<_> = (0..)
            .zip(case.sizes_kib)
            .map(|(index, &size)| heap.allocate(Request::new(size * KIB, 256).unwrap(), Some(&format!("t\"{index}"))).unwrap())
            .collect();
        for &index in case.frees {
            heap.free(allocations[index]).unwrap();
        }
        heap.report()
    }

    fn u(value: &Value) -> u64 {
        value.as_u64().unwrap_or_else(|| panic!("not a number: {value}"))
    }

    #[test]
    fn exports_what_gpumemdumpvis_reads() {
        for case in CASES {
            let report = heap_report(case);
            let text = heap_report_to_vma_json(&report, &VmaDeviceInfo::simulated(CAPACITY));
            let json: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", case.name));
            assert_eq!(json["General"]["API"], "Vulkan", "{}", case.name);
            assert_eq!(json["CustomPools"], serde_json::json!({}), "{}", case.name);
            let pool = &json["DefaultPools"]["Type 0"];
            let blocks = pool["Blocks"].as_object().unwrap();
            let dedicated = pool["DedicatedAllocations"].as_array().unwrap();
            assert_eq!((blocks.len(), dedicated.len()), (case.blocks, case.dedicated), "{}", case.name);

            let (mut allocation_count, mut allocation_bytes, mut unused_ranges) = (0, 0, 0);
            for (id, block) in blocks {
                let source = report.blocks.iter().find(|b| b.index.to_string() == *id).unwrap();
                assert_eq!(u(&block["TotalBytes"]), source.size_bytes, "{}", case.name);
                let mut next = 0;
                let mut used = 0;
                for sub in block["Suballocations"].as_array().unwrap() {
                    assert_eq!(u(&sub["Offset"]), next, "{}: suballocations tile block {id} in offset order", case.name);
                    next += u(&sub["Size"]);
                    match sub["Type"].as_str().unwrap() {
                        "FREE" => unused_ranges += 1,
                        "BUFFER" => {
                            used += u(&sub["Size"]);
                            assert_eq!(u(&sub["Usage"]), 0);
                        }
                        other => panic!("type {other}"),
                    }
                }
                assert_eq!(next, source.size_bytes, "{}: the suballocations cover block {id}", case.name);
                assert_eq!(u(&block["UnusedBytes"]), source.size_bytes - used, "{}", case.name);
                allocation_count += u(&block["Allocations"]);
                allocation_bytes += used;
                assert_eq!(
                    u(&block["UnusedRanges"]) as usize,
                    block["Suballocations"].as_array().unwrap().iter().filter(|s| s["Type"] == "FREE").count()
                );
            }
            for allocation in dedicated {
                assert_eq!(allocation["Type"], "BUFFER");
                allocation_count += 1;
                allocation_bytes += u(&allocation["Size"]);
            }

            let live = (case.sizes_kib.len() - case.frees.len()) as u64;
            assert_eq!(allocation_count, live, "{}", case.name);
            let footprint: u64 = report
                .blocks
                .iter()
                .flat_map(|b| &b.layout.ranges)
                .filter(|r| matches!(r.state, RangeState::Live | RangeState::Padding))
                .map(|r| r.size_bytes)
                .sum();
            assert!(allocation_bytes >= footprint, "{}", case.name);

            let total = &json["Total"];
            assert_eq!(u(&total["BlockCount"]) as usize, report.blocks.len(), "{}", case.name);
            assert_eq!(u(&total["BlockBytes"]), report.totals.reserved_bytes, "{}", case.name);
            assert_eq!(u(&total["AllocationCount"]), live, "{}", case.name);
            assert_eq!(u(&total["AllocationBytes"]), allocation_bytes, "{}", case.name);
            assert_eq!(u(&total["UnusedRangeCount"]), unused_ranges, "{}", case.name);
            assert_eq!(total.get("AllocationSizeMin").is_some(), live > 1, "{}: min/max only for two or more", case.name);

            let heap = &json["MemoryInfo"]["Heap 0"];
            assert_eq!(heap["Flags"], serde_json::json!(["DEVICE_LOCAL"]));
            assert_eq!(u(&heap["Size"]), CAPACITY);
            assert_eq!(u(&heap["Budget"]["UsageBytes"]), report.totals.reserved_bytes);
            assert_eq!(heap["Stats"], *total, "{}: one heap holds everything", case.name);
            assert_eq!(heap["MemoryPools"]["Type 0"]["Stats"], *total, "{}", case.name);
        }
    }

    #[test]
    fn names_carry_labels_and_flags_keep_unknown_bits() {
        let report = heap_report(&CASES[2]);
        let json: Value = serde_json::from_str(&heap_report_to_vma_json(&report, &VmaDeviceInfo::simulated(CAPACITY))).unwrap();
        let dedicated = &json["DefaultPools"]["Type 0"]["DedicatedAllocations"][0];
        assert_eq!(dedicated["Name"], "t\"3");
        assert_eq!(u(&dedicated["Size"]), 640 * KIB, "the block's size, rounded to the source's 64 KiB");
        let names: Vec<&str> = json["DefaultPools"]["Type 0"]["Blocks"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|b| b["Suballocations"].as_array().unwrap())
            .filter_map(|s| s["Name"].as_str())
            .collect();
        assert_eq!(names, ["t\"0", "t\"2"]);

        let cases: [(u32, &FlagNames, Value); 3] = [
            (HEAP_DEVICE_LOCAL, &HEAP_FLAG_NAMES, serde_json::json!(["DEVICE_LOCAL"])),
            (
                TYPE_HOST_VISIBLE | TYPE_HOST_COHERENT | 0x100,
                &TYPE_FLAG_NAMES,
                serde_json::json!(["HOST_VISIBLE", "HOST_COHERENT", 256]),
            ),
            (0, &TYPE_FLAG_NAMES, serde_json::json!([])),
        ];
        for (flags, names, expected) in cases {
            assert_eq!(flags_json(flags, names), expected);
        }
    }

    #[test]
    fn blocks_of_a_type_in_a_second_heap() {
        let report = heap_report(&CASES[2]);
        let mut device = VmaDeviceInfo::simulated(CAPACITY);
        device.heaps.push(VmaHeapInfo { size_bytes: 8 * MIB, flags: 0, budget_bytes: 4 * MIB });
        device.types.push(VmaTypeInfo { flags: TYPE_HOST_VISIBLE, heap_index: 1 });
        device.block_type = 1;
        let json: Value = serde_json::from_str(&heap_report_to_vma_json(&report, &device)).unwrap();
        assert_eq!(u(&json["MemoryInfo"]["Heap 0"]["Stats"]["BlockCount"]), 0);
        assert_eq!(u(&json["MemoryInfo"]["Heap 1"]["Stats"]["BlockCount"]), 2);
        assert_eq!(json["MemoryInfo"]["Heap 1"]["Stats"], json["Total"]);
        assert_eq!(json["DefaultPools"]["Type 0"]["Blocks"], serde_json::json!({}));
        assert_eq!(json["DefaultPools"]["Type 1"]["Blocks"].as_object().unwrap().len(), 1);
        assert_eq!(json["General"]["memoryTypeCount"], 2);
    }

    /// Walks the export the way GpuMemDumpVis.py does (its keys, its `int()` conversions), with asserts.
    const PY_CHECK: &str = r#"
import json, sys
src = json.load(sys.stdin)
assert src["General"]["API"] == "Vulkan"
drawn = 0
for type_name, pool in src["DefaultPools"].items():
    assert type_name.startswith("Type ")
    for alloc in pool["DedicatedAllocations"]:
        assert alloc["Type"] == "BUFFER" and int(alloc["Size"]) > 0 and int(alloc["Usage"]) == 0
        drawn += 1
    for block_id, block in pool["Blocks"].items():
        int(block_id)
        size = int(block["TotalBytes"])
        end = 0
        for sub in block["Suballocations"]:
            assert sub["Type"] in ("FREE", "BUFFER")
            usage = int(sub["Usage"]) if "Usage" in sub else 0
            assert usage == 0
            assert int(sub["Offset"]) == end
            end += int(sub["Size"])
        assert end == size, (end, size)
        drawn += 1
for type_name, pools in src["CustomPools"].items():
    for pool in pools:
        pool["Name"], pool["Blocks"].items(), pool["DedicatedAllocations"]
heap = src["MemoryInfo"]["Heap 0"]
assert heap["Stats"]["BlockCount"] == src["Total"]["BlockCount"]
assert "Type 0" in heap["MemoryPools"]
print(drawn)
"#;

    #[test]
    fn python_walks_it_like_gpumemdumpvis() {
        let Ok(mut child) = Command::new("python3")
            .args(["-c", PY_CHECK])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        else {
            eprintln!("python3 not found: skipped");
            return;
        };
        let report = heap_report(&CASES[2]);
        let text = heap_report_to_vma_json(&report, &VmaDeviceInfo::simulated(CAPACITY));
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{}\n{text}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "2", "one shared block and one dedicated allocation drawn");
    }
}
