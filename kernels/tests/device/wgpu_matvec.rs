//! The matvec payload on wgpu (three storage bindings, its own uniform parameters): y computed from arbitrary A and
//! x is what the CPU twin (`heapscope_kernels::matvec_words`) computes, and from A and x holding their patterns y
//! is exactly its own pattern — with A, x and y in arenas of their own and all three in one arena (one buffer bound
//! three times in a dispatch), rows split over several bindings. On plain wgpu and on wgpu over heapscope's Vulkan
//! device, validation on (skipped without a device unless `HEAPSCOPE_REQUIRE_GPU=1`).
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::sync::{Arc, Mutex};

use crate::common::Rng;
use crate::common::wgpu::{devices, finish};
use heapscope_core::PolicyKind;
use heapscope_core::units::KIB;
use heapscope_kernels::WgpuKernels;
use heapscope_kernels::{KernelRunner, MatVecIds, Op, VerifyResult, matvec_words, pattern_word};
use heapscope_wgpu::{ArenaAllocation, ArenaConfig, ArenaHeap, KernelBuffer, WgpuDevice};

/// `words` words of `buffer` from `offset_bytes`, copied to a mappable buffer and read back.
fn read_words(device: &WgpuDevice, buffer: &wgpu::Buffer, offset_bytes: u64, words: usize) -> Vec<u32> {
    let size = words as u64 * 4;
    let readback = device.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("test readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.device().create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
    encoder.copy_buffer_to_buffer(buffer, offset_bytes, &readback, 0, size);
    device.queue().submit([encoder.finish()]);
    let mapped = Arc::new(Mutex::new(None));
    let sender = Arc::clone(&mapped);
    readback.slice(..).map_async(wgpu::MapMode::Read, move |result| *sender.lock().unwrap() = Some(result));
    device.wait(None).unwrap();
    mapped.lock().unwrap().take().unwrap().unwrap();
    let words = readback
        .slice(..)
        .get_mapped_range()
        .unwrap()
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    readback.unmap();
    words
}

fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|word| word.to_le_bytes()).collect()
}

/// Where A, x and y are: a buffer and an offset each (A and x a few words past their allocation's start, so the
/// bindings begin before them).
struct Layout<'a> {
    a: (&'a ArenaAllocation, u64),
    x: (&'a ArenaAllocation, u64),
    y: (&'a ArenaAllocation, u64),
}

impl Layout<'_> {
    fn at(part: (&ArenaAllocation, u64)) -> (KernelBuffer<'_>, u64) {
        (part.0.kernel_buffer(), part.0.offset_bytes() + part.1)
    }

    fn matvec(&self, rows: u32, cols: u32, ids: MatVecIds) -> Op<KernelBuffer<'_>> {
        let ((matrix, matrix_offset_bytes), (input, input_offset_bytes), (output, output_offset_bytes)) =
            (Self::at(self.a), Self::at(self.x), Self::at(self.y));
        Op::MatVec { matrix, matrix_offset_bytes, input, input_offset_bytes, output, output_offset_bytes, rows, cols, ids }
    }
}

/// Arbitrary A and x: y as the CPU twin says; patterned A and x: y is its own pattern (verify kernel and read
/// back). Returns the dispatches the matvecs took.
fn check(device: &WgpuDevice, kernels: &mut WgpuKernels, layout: &Layout<'_>, rows: u32, cols: u32, rng: &mut Rng) -> u64 {
    let ids = MatVecIds { matrix: 21, input: 22, output: 23 };
    let (a_words, x_words) = ((rows * cols) as usize, cols as usize);
    let a: Vec<u32> = (0..a_words).map(|_| rng.next_u64() as u32).collect();
    let x: Vec<u32> = (0..x_words).map(|_| rng.next_u64() as u32).collect();
    let queue = device.queue();
    queue.write_buffer(layout.a.0.buffer(), layout.a.0.offset_bytes() + layout.a.1, &bytes(&a));
    queue.write_buffer(layout.x.0.buffer(), layout.x.0.offset_bytes() + layout.x.1, &bytes(&x));
    let (_, before) = kernels.counts();
    kernels.run(&[layout.matvec(rows, cols, ids)]).unwrap();
    let (_, after) = kernels.counts();
    let y_at = layout.y.0.offset_bytes() + layout.y.1;
    let y = read_words(device, layout.y.0.buffer(), y_at, rows as usize);
    assert_eq!(y, matvec_words(&a, &x, cols, 0, ids), "{rows} x {cols}: y = A x");
    // What A and x were written with is still there (the kernel only writes y).
    assert_eq!(read_words(device, layout.x.0.buffer(), layout.x.0.offset_bytes() + layout.x.1, x_words), x);

    let (a_at, x_at) = (Layout::at(layout.a), Layout::at(layout.x));
    let fills = [
        Op::Fill { target: a_at.0, offset_bytes: a_at.1, len_bytes: a_words as u64 * 4, id: ids.matrix },
        Op::Fill { target: x_at.0, offset_bytes: x_at.1, len_bytes: x_words as u64 * 4, id: ids.input },
        layout.matvec(rows, cols, ids),
        Op::Verify { target: layout.y.0.kernel_buffer(), offset_bytes: y_at, len_bytes: u64::from(rows) * 4, id: ids.output },
    ];
    let results = kernels.run(&fills).unwrap();
    assert!(results.iter().all(VerifyResult::is_clean), "{rows} x {cols}: {results:?}");
    let y = read_words(device, layout.y.0.buffer(), y_at, rows as usize);
    assert_eq!(y, (0..rows).map(|row| pattern_word(ids.output, row)).collect::<Vec<_>>());
    after - before
}

const SHAPES: [(u32, u32); 4] = [(1, 1), (7, 13), (128, 128), (300, 200)];

#[test]
fn matvec_matches_the_cpu_twin_in_separate_arenas_and_in_one() {
    for (route, device) in devices() {
        {
            let mut kernels = WgpuKernels::new(Arc::clone(&device)).unwrap();
            // 240,000 bytes of A over 64 KiB bindings: the rows are split over several dispatches.
            kernels.set_max_binding_bytes(64 * KIB);
            let mut rng = Rng::new(5);
            let align = kernels.binding_limits().offset_alignment_bytes;
            let matrix_bytes = 300 * 200 * 4 + 64;
            let new_heap = || ArenaHeap::new(Arc::clone(&device), ArenaConfig::new(PolicyKind::Tlsf)).unwrap();
            let (mut a_heap, mut xy_heap, mut one_heap) = (new_heap(), new_heap(), new_heap());
            // Apart: A in one arena, x and y in another.
            let a = a_heap.allocate(matrix_bytes, align, Some("A")).unwrap();
            let x = xy_heap.allocate(4 * KIB, align, Some("x")).unwrap();
            let y = xy_heap.allocate(4 * KIB, align, Some("y")).unwrap();
            assert_ne!(a.buffer(), x.buffer());
            let apart = Layout { a: (&a, 12), x: (&x, 8), y: (&y, 0) };
            // Together: the three in one arena, one buffer bound three times.
            let one = [
                one_heap.allocate(4 * KIB, align, Some("x")).unwrap(),
                one_heap.allocate(matrix_bytes, align, Some("A")).unwrap(),
            ];
            let y_one = one_heap.allocate(2 * KIB, align, Some("y")).unwrap();
            assert!(one.iter().all(|part| part.buffer() == y_one.buffer()), "one arena");
            let together = Layout { a: (&one[1], 4), x: (&one[0], 0), y: (&y_one, 0) };
            for (name, layout) in [("apart", &apart), ("in one arena", &together)] {
                for (rows, cols) in SHAPES {
                    let dispatches = check(&device, &mut kernels, layout, rows, cols, &mut rng);
                    if rows * cols * 4 > 64 * KIB as u32 {
                        assert!(dispatches >= 4, "{route}, {name}, {rows} x {cols}: {dispatches} dispatches");
                    }
                    eprintln!("{route}, {name}: {rows} x {cols} in {dispatches} dispatch(es)");
                }
            }
            a_heap.free(a).unwrap();
            xy_heap.free(x).unwrap();
            xy_heap.free(y).unwrap();
            let [x_one, a_one] = one;
            for allocation in [x_one, a_one, y_one] {
                one_heap.free(allocation).unwrap();
            }
        }
        finish(device);
    }
}
