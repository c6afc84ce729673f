//! What the wgpu backend costs on this machine's device, on plain wgpu and on wgpu over heapscope's Vulkan device:
//! heap-of-arenas allocate + free (TLSF, 256 MiB arenas), and the fill and verify kernels over 64 MiB (best of 5).
//!
//! `cargo run --release -p heapscope-kernels --example wgpu_throughput`

use std::sync::Arc;
use std::time::Instant;

use heapscope_core::PolicyKind;
use heapscope_kernels::{ArenaOps, KernelRunner, WgpuKernelError, WgpuKernels};
use heapscope_wgpu::{ArenaConfig, ArenaHeap, DeviceOptions, WgpuDevice};

fn measure(route: &str, device: &Arc<WgpuDevice>) -> Result<(), WgpuKernelError> {
    let mut heap = ArenaHeap::new(Arc::clone(device), ArenaConfig::new(PolicyKind::Tlsf))?;
    let mut kernels = WgpuKernels::new(Arc::clone(device))?;
    // Warm: the first arena is created outside the timed loop.
    let first = heap.allocate(256, 256, None)?;
    let rounds = 100_000_u32;
    let started = Instant::now();
    for round in 0..rounds {
        let allocation = heap.allocate(256 + u64::from(round % 4096) * 64, 256, None)?;
        heap.free(allocation)?;
    }
    let ns_per_pair = started.elapsed().as_nanos() as f64 / f64::from(rounds);
    heap.free(first)?;
    let size = 64 << 20;
    let allocation = heap.allocate(size, 256, None)?;
    let (mut fill_s, mut verify_s) = (f64::MAX, f64::MAX);
    for id in 0..5 {
        let started = Instant::now();
        kernels.run(&[allocation.fill(id)])?;
        fill_s = fill_s.min(started.elapsed().as_secs_f64());
        let started = Instant::now();
        let result = kernels.run(&[allocation.verify(id)])?;
        verify_s = verify_s.min(started.elapsed().as_secs_f64());
        assert!(result[0].is_clean(), "{result:?}");
    }
    heap.free(allocation)?;
    let gib = size as f64 / f64::from(1 << 30);
    println!(
        "{route}: allocate+free {ns_per_pair:.0} ns; fill 64 MiB {:.1} ms ({:.2} GiB/s), verify {:.1} ms ({:.2} GiB/s)",
        fill_s * 1e3,
        gib / fill_s,
        verify_s * 1e3,
        gib / verify_s
    );
    Ok(())
}

fn main() -> Result<(), WgpuKernelError> {
    let plain = Arc::new(WgpuDevice::new(&DeviceOptions::from_env())?);
    println!("{} ({:?})", plain.info().name, plain.info().backend);
    measure("wgpu", &plain)?;
    drop(plain);
    let interop = Arc::new(WgpuDevice::from_vulkan(&heapscope_vulkan::ContextOptions::from_env())?);
    measure("wgpu on heapscope's Vulkan device", &interop)?;
    Ok(())
}
