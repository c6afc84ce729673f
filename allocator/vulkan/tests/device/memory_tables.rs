//! The choice of a memory type, tested against the memory-property tables of real devices.
//!
//! The tables follow the layouts that vulkan.gpuinfo.org reports publish for these devices (flag sets, their order,
//! and the heaps they sit on); heap sizes are rounded to what such reports show. They are written from those reports'
//! well-known shapes, not dumped from a device, so a driver version may differ in detail (e.g. NVIDIA on Windows lists
//! more flag-less types).

use ash::vk;
use heapscope_vulkan::memory_types::{
    AVOIDED_FLAGS, MemoryProperties, MemoryRequest, MemoryTypeInfo, MemoryUsage, candidates, select_memory_type,
};

const NONE: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::empty();
const DL: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::DEVICE_LOCAL;
const HV: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_VISIBLE;
const HC: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_COHERENT;
const CACHED: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_CACHED;
const LAZY: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::LAZILY_ALLOCATED;
const PROT: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::PROTECTED;
const DCA: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::DEVICE_COHERENT_AMD;
const DUA: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::DEVICE_UNCACHED_AMD;

const HEAP_DL: vk::MemoryHeapFlags = vk::MemoryHeapFlags::DEVICE_LOCAL;
const HEAP_HOST: vk::MemoryHeapFlags = vk::MemoryHeapFlags::empty();

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Builds the Vulkan struct (so that `from_vk` is exercised too) from heaps `(size, flags)` and types `(flags, heap)`.
fn table(heaps: &[(u64, vk::MemoryHeapFlags)], types: &[(vk::MemoryPropertyFlags, u32)]) -> MemoryProperties {
    let heaps: Vec<vk::MemoryHeap> = heaps.iter().map(|&(size, flags)| vk::MemoryHeap { size, flags }).collect();
    let types: Vec<vk::MemoryType> =
        types.iter().map(|&(property_flags, heap_index)| vk::MemoryType { property_flags, heap_index }).collect();
    let raw = vk::PhysicalDeviceMemoryProperties::default().memory_heaps(&heaps).memory_types(&types);
    let props = MemoryProperties::from_vk(&raw);
    assert_eq!((props.types.len(), props.heaps.len()), (types.len(), heaps.len()));
    for (i, t) in props.types.iter().enumerate() {
        assert_eq!(t.index as usize, i);
    }
    props
}

/// NVIDIA GeForce RTX 4090 (Linux driver, resizable BAR off): a 246 MiB BAR on its own heap.
fn nvidia_rtx_4090() -> MemoryProperties {
    table(
        &[(24_564 * MIB, HEAP_DL), (31 * GIB, HEAP_HOST), (246 * MIB, HEAP_DL)],
        &[(NONE, 1), (DL, 0), (HV | HC, 1), (HV | HC | CACHED, 1), (DL | HV | HC, 2)],
    )
}

/// NVIDIA H100 PCIe 80 GB (Linux driver): the whole of video memory is mappable, the BAR type sits on heap 0.
/// The same layout as an RTX 4090 with resizable BAR on.
fn nvidia_h100() -> MemoryProperties {
    table(
        &[(81_559 * MIB, HEAP_DL), (251 * GIB, HEAP_HOST)],
        &[(NONE, 1), (DL, 0), (HV | HC, 1), (HV | HC | CACHED, 1), (DL | HV | HC, 0)],
    )
}

/// AMD Radeon RX 7900 XTX (RDNA3, resizable BAR off): 256 MiB BAR heap, and every type again with
/// DEVICE_COHERENT_AMD | DEVICE_UNCACHED_AMD (VK_AMD_device_coherent_memory).
fn amd_rx_7900_xtx() -> MemoryProperties {
    table(
        &[(24_304 * MIB, HEAP_DL), (31 * GIB, HEAP_HOST), (256 * MIB, HEAP_DL)],
        &[
            (DL, 0),
            (HV | HC, 1),
            (DL | HV | HC, 2),
            (HV | HC | CACHED, 1),
            (DL | DCA | DUA, 0),
            (HV | HC | DCA | DUA, 1),
            (DL | HV | HC | DCA | DUA, 2),
            (HV | HC | CACHED | DCA | DUA, 1),
        ],
    )
}

/// AMD Radeon RX 6800 XT (RDNA2) on RADV with resizable BAR: the visible-VRAM heap is merged into VRAM.
fn amd_rx_6800_xt_rebar() -> MemoryProperties {
    table(
        &[(16 * GIB, HEAP_DL), (31 * GIB, HEAP_HOST)],
        &[
            (DL, 0),
            (HV | HC, 1),
            (DL | HV | HC, 0),
            (HV | HC | CACHED, 1),
            (DL | DCA | DUA, 0),
            (HV | HC | DCA | DUA, 1),
            (DL | HV | HC | DCA | DUA, 0),
            (HV | HC | CACHED | DCA | DUA, 1),
        ],
    )
}

/// Intel Iris Xe (integrated, Windows driver): one device-local heap, shared with the system.
fn intel_iris_xe() -> MemoryProperties {
    table(&[(8 * GIB, HEAP_DL)], &[(DL, 0), (DL | HV | HC, 0), (DL | HV | HC | CACHED, 0)])
}

/// Apple M1 through MoltenVK: private, shared and memoryless storage on one unified heap.
fn apple_m1_moltenvk() -> MemoryProperties {
    table(&[(16 * GIB, HEAP_DL)], &[(DL, 0), (DL | HV | HC | CACHED, 0), (DL | LAZY, 0)])
}

/// Mesa lavapipe (llvmpipe): one heap, one type that is everything.
fn lavapipe() -> MemoryProperties {
    table(&[(16 * GIB, HEAP_DL)], &[(DL | HV | HC | CACHED, 0)])
}

/// Arm Mali-G78 (Pixel 6): unified, with a non-coherent cached type and lazily allocated memory for tiles.
fn mali_g78() -> MemoryProperties {
    table(&[(7_680 * MIB, HEAP_DL)], &[(DL | HV | HC, 0), (DL | HV | HC | CACHED, 0), (DL | HV | CACHED, 0), (DL | LAZY, 0)])
}

/// Qualcomm Adreno 660 (Snapdragon 888): unified, with lazily allocated and protected memory.
fn adreno_660() -> MemoryProperties {
    table(
        &[(7_424 * MIB, HEAP_DL)],
        &[(DL, 0), (DL | HV | HC, 0), (DL | HV | HC | CACHED, 0), (DL | HV | CACHED, 0), (DL | LAZY, 0), (DL | PROT, 0)],
    )
}

/// The expected fallback orders of one device for an unrestricted `type_bits`.
struct Expected {
    name: &'static str,
    props: MemoryProperties,
    unified: bool,
    device_local: &'static [u32],
    /// Upload without heap sizes (every BAR is small), then with them.
    upload: (&'static [u32], &'static [u32]),
    /// Readback without heap sizes, then with them.
    readback: (&'static [u32], &'static [u32]),
}

fn devices() -> Vec<Expected> {
    vec![
        Expected {
            name: "NVIDIA RTX 4090, small BAR",
            props: nvidia_rtx_4090(),
            unified: false,
            device_local: &[1, 4],
            upload: (&[2, 3], &[2, 3]),
            readback: (&[3, 2], &[3, 2]),
        },
        Expected {
            name: "NVIDIA H100, full BAR",
            props: nvidia_h100(),
            unified: false,
            device_local: &[1, 4],
            upload: (&[2, 3], &[4, 2, 3]),
            readback: (&[3, 2], &[3, 2, 4]),
        },
        Expected {
            name: "AMD RX 7900 XTX, 256 MiB BAR",
            props: amd_rx_7900_xtx(),
            unified: false,
            device_local: &[0, 2],
            upload: (&[1, 3], &[1, 3]),
            readback: (&[3, 1], &[3, 1]),
        },
        Expected {
            name: "AMD RX 6800 XT, RADV resizable BAR",
            props: amd_rx_6800_xt_rebar(),
            unified: false,
            device_local: &[0, 2],
            upload: (&[1, 3], &[2, 1, 3]),
            readback: (&[3, 1], &[3, 1, 2]),
        },
        Expected {
            name: "Intel Iris Xe",
            props: intel_iris_xe(),
            unified: true,
            device_local: &[0, 1, 2],
            upload: (&[1, 2], &[1, 2]),
            readback: (&[2, 1], &[2, 1]),
        },
        Expected {
            name: "Apple M1 (MoltenVK)",
            props: apple_m1_moltenvk(),
            unified: true,
            device_local: &[0, 1],
            upload: (&[1], &[1]),
            readback: (&[1], &[1]),
        },
        Expected {
            name: "lavapipe",
            props: lavapipe(),
            unified: true,
            device_local: &[0],
            upload: (&[0], &[0]),
            readback: (&[0], &[0]),
        },
        Expected {
            name: "Mali-G78",
            props: mali_g78(),
            unified: true,
            device_local: &[0, 2, 1],
            upload: (&[0, 1, 2], &[0, 1, 2]),
            readback: (&[1, 2, 0], &[1, 2, 0]),
        },
        Expected {
            name: "Adreno 660",
            props: adreno_660(),
            unified: true,
            device_local: &[0, 1, 3, 2],
            upload: (&[1, 2, 3], &[1, 2, 3]),
            readback: (&[2, 3, 1], &[2, 3, 1]),
        },
    ]
}

fn all_bits(props: &MemoryProperties) -> u32 {
    (1u32 << props.types.len()) - 1
}

fn is_avoided(props: &MemoryProperties, index: u32) -> bool {
    props.types[index as usize].property_flags.intersects(AVOIDED_FLAGS)
}

#[test]
fn every_device_every_usage_without_and_with_heap_sizes() {
    for d in devices() {
        let p = &d.props;
        assert_eq!(p.is_unified_memory(), d.unified, "{}", d.name);
        // DeviceLocal does not depend on heap sizes.
        for (usage, heapless, with_heaps) in [
            (MemoryUsage::DeviceLocal, d.device_local, d.device_local),
            (MemoryUsage::Upload, d.upload.0, d.upload.1),
            (MemoryUsage::Readback, d.readback.0, d.readback.1),
        ] {
            for bits in [u32::MAX, all_bits(p)] {
                assert_eq!(candidates(&p.types, bits, usage), heapless, "{} {usage:?} without heaps", d.name);
                assert_eq!(p.candidates(bits, usage), with_heaps, "{} {usage:?} with heaps", d.name);
                assert_eq!(select_memory_type(&p.types, bits, usage), heapless.first().copied(), "{} {usage:?}", d.name);
                assert_eq!(p.select_memory_type(bits, usage), with_heaps.first().copied(), "{} {usage:?}", d.name);
            }
        }
    }
}

#[test]
fn nothing_allowed_is_none() {
    for d in devices() {
        for usage in MemoryUsage::ALL {
            assert_eq!(select_memory_type(&d.props.types, 0, usage), None, "{} {usage:?}", d.name);
            assert_eq!(d.props.select_memory_type(0, usage), None, "{} {usage:?}", d.name);
            assert!(d.props.candidates(0, usage).is_empty());
            // Bits of types the device does not have allow nothing either.
            assert_eq!(select_memory_type(&d.props.types, !all_bits(&d.props), usage), None, "{} {usage:?}", d.name);
        }
    }
}

/// Masking out the best type yields the rest of the same fallback order, as long as something of its tier remains.
#[test]
fn masking_out_the_best_type_moves_to_the_next_candidate() {
    for d in devices() {
        let p = &d.props;
        for usage in MemoryUsage::ALL {
            for order in [candidates(&p.types, u32::MAX, usage), p.candidates(u32::MAX, usage)] {
                if order.len() < 2 {
                    continue;
                }
                let bits = !(1 << order[0]);
                let heapless = candidates(&p.types, u32::MAX, usage) == order;
                let next = if heapless { candidates(&p.types, bits, usage) } else { p.candidates(bits, usage) };
                assert_eq!(next, order[1..], "{} {usage:?}", d.name);
            }
        }
    }
}

#[test]
fn invariants_on_every_mask_of_small_tables() {
    for d in devices() {
        let p = &d.props;
        for bits in 0..=all_bits(p) {
            for usage in MemoryUsage::ALL {
                for order in [candidates(&p.types, bits, usage), p.candidates(bits, usage)] {
                    let mut sorted = order.clone();
                    sorted.sort_unstable();
                    sorted.dedup();
                    assert_eq!(sorted.len(), order.len(), "duplicates: {} {usage:?} {bits:#b}", d.name);
                    assert!(order.iter().all(|&i| bits & (1 << i) != 0), "not allowed: {} {usage:?} {bits:#b}", d.name);
                    let allowed = || p.types.iter().filter(|t| bits & (1 << t.index) != 0);
                    // Avoided types only when nothing else is allowed.
                    if allowed().any(|t| {
                        !t.property_flags.intersects(AVOIDED_FLAGS)
                            && (usage == MemoryUsage::DeviceLocal || t.property_flags.contains(HV))
                    }) {
                        assert!(order.iter().all(|&i| !is_avoided(p, i)), "avoided: {} {usage:?} {bits:#b}", d.name);
                    }
                    match usage {
                        MemoryUsage::DeviceLocal => {
                            // Something is always chosen when something is allowed.
                            assert_eq!(order.is_empty(), bits == 0, "{} {bits:#b}", d.name);
                            if allowed().any(|t| t.property_flags.contains(DL) && !t.property_flags.intersects(AVOIDED_FLAGS)) {
                                assert!(order.iter().all(|&i| p.types[i as usize].property_flags.contains(DL)));
                            }
                        }
                        MemoryUsage::Upload | MemoryUsage::Readback => {
                            assert!(order.iter().all(|&i| p.types[i as usize].property_flags.contains(HV)));
                            assert_eq!(order.is_empty(), !allowed().any(|t| t.property_flags.contains(HV)));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn masks_that_exclude_the_best_type() {
    let nv = nvidia_rtx_4090();
    // No pure device-local type: the small BAR is still video memory.
    assert_eq!(candidates(&nv.types, !(1 << 1), MemoryUsage::DeviceLocal), [4]);
    // No device-local type at all: anything allowed, the flag-less host type first.
    assert_eq!(candidates(&nv.types, 0b0_1101, MemoryUsage::DeviceLocal), [0, 2, 3]);
    // Only the small BAR is host-visible: uploads and readbacks use it.
    assert_eq!(candidates(&nv.types, 0b1_0011, MemoryUsage::Upload), [4]);
    assert_eq!(nv.candidates(0b1_0011, MemoryUsage::Readback), [4]);
    // Only the flag-less type: nothing for the host.
    assert_eq!(select_memory_type(&nv.types, 0b1, MemoryUsage::Upload), None);
    assert_eq!(select_memory_type(&nv.types, 0b1, MemoryUsage::DeviceLocal), Some(0));

    let h100 = nvidia_h100();
    assert_eq!(h100.candidates(!(1 << 4), MemoryUsage::Upload), [2, 3]);
    assert_eq!(h100.candidates(!(1 << 3), MemoryUsage::Readback), [2, 4]);

    let amd = amd_rx_7900_xtx();
    // Only the device-coherent types are allowed: they are used, the small BAR last for uploads.
    assert_eq!(candidates(&amd.types, 0xF0, MemoryUsage::DeviceLocal), [4, 6]);
    assert_eq!(candidates(&amd.types, 0xF0, MemoryUsage::Upload), [5, 7]);
    assert_eq!(candidates(&amd.types, 0xF0, MemoryUsage::Readback), [7, 5]);
    assert_eq!(candidates(&amd.types, 0x40, MemoryUsage::Upload), [6]);
    // A plain type beats any device-coherent one, even when the plain one is not device-local.
    assert_eq!(candidates(&amd.types, 0x12, MemoryUsage::DeviceLocal), [1]);
    // The small BAR beats a device-coherent host type for uploads (avoided flags outrank the BAR rule).
    assert_eq!(amd.candidates(0x24, MemoryUsage::Upload), [2]);

    let apple = apple_m1_moltenvk();
    assert_eq!(select_memory_type(&apple.types, 0b100, MemoryUsage::DeviceLocal), Some(2));
    assert_eq!(select_memory_type(&apple.types, 0b100, MemoryUsage::Upload), None);
    assert_eq!(select_memory_type(&apple.types, 0b101, MemoryUsage::DeviceLocal), Some(0));

    let adreno = adreno_660();
    assert_eq!(candidates(&adreno.types, 0b11_0000, MemoryUsage::DeviceLocal), [4, 5]);
    assert_eq!(candidates(&adreno.types, 0b11_0000, MemoryUsage::Readback), Vec::<u32>::new());
    assert_eq!(candidates(&adreno.types, 0b11_0100, MemoryUsage::DeviceLocal), [2]);

    let mali = mali_g78();
    assert_eq!(candidates(&mali.types, !0b1, MemoryUsage::Upload), [1, 2]);
    assert_eq!(candidates(&mali.types, 0b1000, MemoryUsage::DeviceLocal), [3]);
}

#[test]
fn large_bar_needs_more_than_256_mib() {
    let nv = nvidia_rtx_4090();
    assert!(!nv.is_large_bar(4));
    assert!(!nv.is_large_bar(1), "not host-visible");
    assert!(nvidia_h100().is_large_bar(4));
    assert!(!amd_rx_7900_xtx().is_large_bar(2), "exactly 256 MiB is the classic window");
    assert!(amd_rx_6800_xt_rebar().is_large_bar(2));
    assert!(intel_iris_xe().is_large_bar(1));
    assert_eq!(nv.heap_of(4).map(|h| h.size_bytes), Some(246 * MIB));
    assert_eq!(nv.heap_of(9), None);
}

#[test]
fn explicit_requests_reach_the_small_bar_and_special_memory() {
    let bar = MemoryRequest { required: DL | HV, preferred: HC, not_preferred: CACHED };
    assert_eq!(bar.candidates(&nvidia_rtx_4090().types, u32::MAX), [4]);
    assert_eq!(bar.candidates(&amd_rx_7900_xtx().types, u32::MAX), [2, 6]);
    assert_eq!(bar.select(&amd_rx_7900_xtx().types, !(1 << 2)), Some(6));
    assert_eq!(bar.select(&intel_iris_xe().types, u32::MAX), Some(1));

    let lazy = MemoryRequest { required: LAZY, ..MemoryRequest::default() };
    assert_eq!(lazy.select(&apple_m1_moltenvk().types, u32::MAX), Some(2));
    assert_eq!(lazy.select(&nvidia_h100().types, u32::MAX), None);

    let coherent = MemoryRequest { required: HV | DCA, preferred: CACHED, not_preferred: DL };
    assert_eq!(coherent.candidates(&amd_rx_7900_xtx().types, u32::MAX), [7, 5, 6]);

    // Nothing required: every type, avoided ones last.
    let any = MemoryRequest { preferred: DL, ..MemoryRequest::default() };
    assert_eq!(any.candidates(&adreno_660().types, u32::MAX), [0, 1, 2, 3, 4, 5]);
    assert_eq!(any.candidates(&nvidia_rtx_4090().types, u32::MAX), [1, 4, 0, 2, 3]);
}

#[test]
fn types_given_out_of_order_or_partially_still_use_their_index() {
    let amd = amd_rx_7900_xtx();
    let mut shuffled: Vec<MemoryTypeInfo> = amd.types.iter().rev().copied().collect();
    assert_eq!(candidates(&shuffled, u32::MAX, MemoryUsage::Upload), [1, 3]);
    shuffled.retain(|t| t.index != 1);
    assert_eq!(candidates(&shuffled, u32::MAX, MemoryUsage::Upload), [3]);
}
