//! heapscope's kernels (fill, verify, copy) on the device, validated; and the integrity test: a TLSF heap over
//! real device memory, 10,000 random allocations and frees, every live allocation verified after each batch.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use crate::common::Rng;
use heapscope_core::units::{KIB, MIB};
use heapscope_core::{Heap, HeapAllocation, HeapConfig, MemorySource, PolicyKind, ReleaseRule, Request};
use heapscope_kernels::{KernelRunner, MatVecIds, Op, VerifyResult, matvec_words, pattern_word};
use heapscope_kernels::{VulkanKernelError, VulkanKernels};
use heapscope_vulkan::compute::BlockBuffer;
use heapscope_vulkan::memory_types::MemoryUsage;
use heapscope_vulkan::{DeviceMemorySource, DeviceSourceConfig, VulkanContext};

fn setup() -> Option<(Arc<VulkanContext>, DeviceMemorySource, VulkanKernels)> {
    let context = Arc::new(crate::common::context()?);
    let source = DeviceMemorySource::new(Arc::clone(&context), DeviceSourceConfig::new(MemoryUsage::Upload)).unwrap();
    let kernels = VulkanKernels::new(Arc::clone(&context)).unwrap();
    Some((context, source, kernels))
}

fn read_words(source: &DeviceMemorySource, address: u64, words: usize) -> Vec<u32> {
    let mut bytes = vec![0; words * 4];
    source.read_bytes(address, &mut bytes).unwrap();
    bytes.chunks_exact(4).map(|chunk| u32::from_le_bytes(chunk.try_into().unwrap())).collect()
}

#[test]
fn fill_verify_and_a_corrupted_word() {
    let Some((context, mut source, mut kernels)) = setup() else { return };
    let block = source.allocate_block(MIB).unwrap();
    {
        let buffer = BlockBuffer::new(&source, block.handle).unwrap();
        let (offset, len) = (4096, 512 * KIB);
        kernels.fill(buffer.as_compute(), offset, len, 7).unwrap();
        assert_eq!(kernels.verify(buffer.as_compute(), offset, len, 7).unwrap(), VerifyResult::default());
        // The GPU wrote what the CPU twin computes, and nothing outside the range.
        let words = read_words(&source, block.base_address + offset - 4, 1026);
        assert_eq!(words[0], 0, "the word before the range");
        assert_eq!(&words[1..1025], &(0..1024).map(|index| pattern_word(7, index)).collect::<Vec<_>>()[..]);
        let after = read_words(&source, block.base_address + offset + len, 1);
        assert_eq!(after, [0], "the word after the range");
        // Another id's pattern differs everywhere.
        let wrong = kernels.verify(buffer.as_compute(), offset, len, 8).unwrap();
        assert_eq!(wrong, VerifyResult { mismatches: (len / 4) as u32, first_mismatch: Some(0) });
        // One word corrupted through the mapping: reported exactly.
        let corrupt_index = 54_321_u32;
        let address = block.base_address + offset + u64::from(corrupt_index) * 4;
        source.write_bytes(address, &(pattern_word(7, corrupt_index) ^ 0x100).to_le_bytes()).unwrap();
        let found = kernels.verify(buffer.as_compute(), offset, len, 7).unwrap();
        assert_eq!(found, VerifyResult { mismatches: 1, first_mismatch: Some(corrupt_index) });
        // A verify of the part before the corrupted word is clean.
        assert!(kernels.verify(buffer.as_compute(), offset, u64::from(corrupt_index) * 4, 7).unwrap().is_clean());
    }
    source.free_block(block);
    drop((kernels, source));
    crate::common::finish(context);
}

#[test]
fn copy_then_verify_at_the_destination_with_split_bindings() {
    let Some((context, mut source, mut kernels)) = setup() else { return };
    let (a, b) = (source.allocate_block(2 * MIB).unwrap(), source.allocate_block(2 * MIB).unwrap());
    {
        let (src, dst) = (BlockBuffer::new(&source, a.handle).unwrap(), BlockBuffer::new(&source, b.handle).unwrap());
        // 64 KiB bindings: a 1 MiB range takes 17 dispatches or so, at offsets that are not binding-aligned.
        kernels.set_max_binding_bytes(64 * KIB);
        let len = MIB + 12;
        kernels.fill(src.as_compute(), 20, len, 3).unwrap();
        let (_, dispatches_before) = kernels.counts();
        kernels.copy(src.as_compute(), 20, dst.as_compute(), 100_004, len).unwrap();
        let (_, dispatches_after) = kernels.counts();
        assert!(dispatches_after - dispatches_before >= 17, "{} dispatches", dispatches_after - dispatches_before);
        assert!(kernels.verify(dst.as_compute(), 100_004, len, 3).unwrap().is_clean());
        assert_eq!(
            read_words(&source, b.base_address + 100_004, 3),
            [pattern_word(3, 0), pattern_word(3, 1), pattern_word(3, 2)]
        );
        let last = (len / 4 - 1) as u32;
        assert_eq!(read_words(&source, b.base_address + 100_004 + u64::from(last) * 4, 1), [pattern_word(3, last)]);
        // A corrupted word in the last split piece is found at its index in the whole range.
        source.write_bytes(b.base_address + 100_004 + u64::from(last - 5) * 4, &[0; 4]).unwrap();
        let found = kernels.verify(dst.as_compute(), 100_004, len, 3).unwrap();
        assert_eq!(found, VerifyResult { mismatches: 1, first_mismatch: Some(last - 5) });
        // Copy within one buffer (not overlapping), and an overlapping one refused before anything runs.
        kernels.copy(src.as_compute(), 20, src.as_compute(), MIB + 64, 4096).unwrap();
        assert!(kernels.verify(src.as_compute(), MIB + 64, 4096, 3).unwrap().is_clean());
        let overlap = kernels.copy(src.as_compute(), 0, src.as_compute(), 64, 4096);
        assert!(matches!(overlap, Err(VulkanKernelError::Kernel(_))), "{overlap:?}");
        let misaligned = kernels.fill(src.as_compute(), 2, 8, 0);
        assert!(matches!(misaligned, Err(VulkanKernelError::Kernel(_))), "{misaligned:?}");
        let past_end = kernels.fill(src.as_compute(), 2 * MIB - 4, 8, 0);
        assert!(matches!(past_end, Err(VulkanKernelError::Kernel(_))), "{past_end:?}");
    }
    source.free_block(a);
    source.free_block(b);
    drop((kernels, source));
    crate::common::finish(context);
}

/// More dispatches than fit one submit: several submits, verify results gathered across them.
#[test]
fn batches_span_several_submits() {
    let Some((context, mut source, mut kernels)) = setup() else { return };
    let block = source.allocate_block(MIB).unwrap();
    {
        let buffer = BlockBuffer::new(&source, block.handle).unwrap();
        let target = buffer.as_compute();
        let pieces = 400_u32;
        let piece_bytes = 1024;
        let mut ops: Vec<Op<_>> = (0..pieces)
            .map(|i| Op::Fill { target, offset_bytes: u64::from(i) * piece_bytes, len_bytes: piece_bytes, id: i })
            .collect();
        ops.extend((0..pieces).map(|i| Op::Verify {
            target,
            offset_bytes: u64::from(i) * piece_bytes,
            len_bytes: piece_bytes,
            id: i,
        }));
        // Piece 399 verified against the wrong id.
        ops.push(Op::Verify { target, offset_bytes: 399 * piece_bytes, len_bytes: piece_bytes, id: 0 });
        let (submits_before, _) = kernels.counts();
        let results = kernels.run(&ops).unwrap();
        let (submits_after, _) = kernels.counts();
        assert!(submits_after - submits_before >= 4, "{} submits", submits_after - submits_before);
        assert_eq!(results.len(), 401);
        assert!(results[..400].iter().all(VerifyResult::is_clean), "{:?}", results.iter().position(|r| !r.is_clean()));
        assert_eq!(results[400], VerifyResult { mismatches: 256, first_mismatch: Some(0) });
    }
    source.free_block(block);
    drop((kernels, source));
    crate::common::finish(context);
}

/// The matvec payload on the device: A (in 1 KiB-aligned pieces of a 64 KiB binding limit, so the rows are split)
/// and x filled with their patterns, y computed, then y is exactly its own pattern (checked by the verify kernel
/// and, through the host mapping, against the CPU twin); a word of x overwritten through the mapping changes y as
/// the CPU twin says.
#[test]
fn matvec_on_the_device_matches_the_cpu_twin() {
    let Some((context, mut source, mut kernels)) = setup() else { return };
    let (a, b) = (source.allocate_block(MIB).unwrap(), source.allocate_block(64 * KIB).unwrap());
    {
        let (matrix, vectors) = (BlockBuffer::new(&source, a.handle).unwrap(), BlockBuffer::new(&source, b.handle).unwrap());
        kernels.set_max_binding_bytes(64 * KIB);
        let (rows, cols) = (300_u32, 200_u32);
        let ids = MatVecIds { matrix: 21, input: 22, output: 23 };
        let (a_offset, x_offset, y_offset) = (4100, 12, 8192);
        let fills = [
            Op::Fill {
                target: matrix.as_compute(),
                offset_bytes: a_offset,
                len_bytes: u64::from(rows * cols) * 4,
                id: ids.matrix,
            },
            Op::Fill { target: vectors.as_compute(), offset_bytes: x_offset, len_bytes: u64::from(cols) * 4, id: ids.input },
            Op::Fill { target: vectors.as_compute(), offset_bytes: y_offset, len_bytes: u64::from(rows) * 4, id: 99 },
        ];
        kernels.run(&fills).unwrap();
        let matvec = Op::MatVec {
            matrix: matrix.as_compute(),
            matrix_offset_bytes: a_offset,
            input: vectors.as_compute(),
            input_offset_bytes: x_offset,
            output: vectors.as_compute(),
            output_offset_bytes: y_offset,
            rows,
            cols,
            ids,
        };
        let (_, before) = kernels.counts();
        kernels.run(&[matvec]).unwrap();
        let (_, after) = kernels.counts();
        assert!(after - before >= 4, "240,000 bytes of A in 64 KiB bindings: {} dispatches", after - before);
        assert!(kernels.verify(vectors.as_compute(), y_offset, u64::from(rows) * 4, ids.output).unwrap().is_clean());
        let y = read_words(&source, b.base_address + y_offset, rows as usize);
        assert_eq!(y, (0..rows).map(|row| pattern_word(ids.output, row)).collect::<Vec<_>>());
        // x damaged through the mapping: y is what the CPU twin computes from the memory as it is.
        source.write_bytes(b.base_address + x_offset + 40, &[0xff; 4]).unwrap();
        let a_words = read_words(&source, a.base_address + a_offset, (rows * cols) as usize);
        let x_words = read_words(&source, b.base_address + x_offset, cols as usize);
        kernels.run(&[matvec]).unwrap();
        let expected = matvec_words(&a_words, &x_words, cols, 0, ids);
        assert_eq!(read_words(&source, b.base_address + y_offset, rows as usize), expected);
        let damaged = kernels.verify(vectors.as_compute(), y_offset, u64::from(rows) * 4, ids.output).unwrap();
        assert!(damaged.mismatches > rows / 2, "{damaged:?}");
    }
    source.free_block(a);
    source.free_block(b);
    drop((kernels, source));
    crate::common::finish(context);
}

/// A live allocation of the integrity test, with the id its pattern is derived from.
#[derive(Debug)]
struct Live {
    allocation: HeapAllocation,
    id: u32,
}

/// The integrity test: a TLSF heap over device memory; 10,000 random allocations and frees in batches of 100; after
/// each batch the new allocations are filled with their pattern and every live allocation is verified on the GPU.
/// Zero mismatches: no two live allocations share a byte, and nothing written was lost.
#[test]
fn tlsf_heap_integrity_under_random_allocs_and_frees() {
    let Some((context, source, mut kernels)) = setup() else { return };
    let config = HeapConfig {
        block_size_bytes: 4 * MIB,
        dedicated_threshold_bytes: 192 * KIB,
        release: ReleaseRule::KeepOne,
        ..HeapConfig::new(PolicyKind::Tlsf)
    };
    let mut heap = Heap::new(config, source).unwrap();
    let mut rng = Rng::new(0x5eed);
    let mut live: BTreeMap<u64, Live> = BTreeMap::new();
    let mut order: Vec<u64> = Vec::new();
    let mut next_id = 1_u32;
    let (mut ops_done, mut verified_bytes, mut max_live) = (0, 0_u64, 0);
    let started = Instant::now();
    for batch in 0..100 {
        let mut fresh = Vec::new();
        for _ in 0..100 {
            let free = !order.is_empty() && (order.len() >= 400 || rng.range(0, 99) < 45);
            if free {
                let address = order.swap_remove(rng.range(0, order.len() as u64 - 1) as usize);
                let gone = live.remove(&address).unwrap();
                fresh.retain(|&fresh_address| fresh_address != address);
                heap.free(gone.allocation).unwrap();
            } else {
                // 256 B .. 256 KiB, log-uniform, multiples of 4; alignments 4 B .. 4 KiB.
                let exponent = rng.range(8, 17);
                let size_bytes = rng.range(1 << exponent, 2 << exponent).min(256 * KIB) / 4 * 4;
                let align_bytes = 1 << rng.range(2, 12);
                let allocation = heap.allocate(Request::new(size_bytes, align_bytes).unwrap(), None).unwrap();
                let address = allocation.address();
                assert!(!live.contains_key(&address), "batch {batch}: {address:#x} handed out twice");
                live.insert(address, Live { allocation, id: next_id });
                next_id += 1;
                order.push(address);
                fresh.push(address);
            }
            ops_done += 1;
        }
        max_live = max_live.max(live.len());
        // Buffers over every block that holds a live allocation; they borrow the heap's source, and go before the
        // next batch frees anything.
        let source = heap.source();
        let mut buffers: HashMap<u64, BlockBuffer<'_>> = HashMap::new();
        let mut placed = Vec::with_capacity(live.len());
        for (&address, entry) in &live {
            let (block, offset) = source.locate(address).unwrap();
            assert!(offset + entry.allocation.size_bytes() <= block.size_bytes, "{entry:?} runs past its block");
            buffers.entry(block.handle).or_insert_with(|| BlockBuffer::new(source, block.handle).unwrap());
            placed.push((address, block.handle, offset));
        }
        let mut ops = Vec::with_capacity(fresh.len() + live.len());
        for &address in &fresh {
            let entry = &live[&address];
            let (_, handle, offset) = placed.iter().find(|(at, _, _)| *at == address).copied().unwrap();
            let target = buffers[&handle].as_compute();
            ops.push(Op::Fill { target, offset_bytes: offset, len_bytes: entry.allocation.size_bytes(), id: entry.id });
        }
        for &(address, handle, offset) in &placed {
            let entry = &live[&address];
            let target = buffers[&handle].as_compute();
            ops.push(Op::Verify { target, offset_bytes: offset, len_bytes: entry.allocation.size_bytes(), id: entry.id });
            verified_bytes += entry.allocation.size_bytes();
        }
        let results = kernels.run(&ops).unwrap();
        for ((address, _, _), result) in placed.iter().zip(&results) {
            assert!(result.is_clean(), "batch {batch}: {:?} has {result:?}", live[address]);
        }
        drop(buffers);
    }
    let elapsed = started.elapsed();
    let (submits, dispatches) = kernels.counts();
    eprintln!(
        "integrity: {ops_done} ops, {} live at the end (at most {max_live}), {} MiB verified, {submits} submits, \
         {dispatches} dispatches, {elapsed:.2?}",
        live.len(),
        verified_bytes / MIB
    );
    assert_eq!(ops_done, 10_000);
    for (_, entry) in std::mem::take(&mut live) {
        heap.free(entry.allocation).unwrap();
    }
    heap.release_empty_blocks();
    drop((kernels, heap));
    crate::common::finish(context);
}

/// A range longer than the device's `maxStorageBufferRange` (128 MiB on lavapipe) is split at the real limit.
/// Skipped on devices whose limit is above 256 MiB (the block would be too large for a quick test).
#[test]
fn a_range_past_the_device_binding_limit_is_split() {
    let Some((context, mut source, mut kernels)) = setup() else { return };
    let max_range = kernels.binding_limits().max_range_bytes;
    if max_range > 256 * MIB {
        // A device limit, not a missing device: lavapipe's (128 MiB) runs it, so CI always does.
        eprintln!("skipped: maxStorageBufferRange is {max_range} bytes");
        drop((kernels, source));
        crate::common::finish(context);
        return;
    }
    let size = (max_range + 8 * MIB).next_multiple_of(MIB);
    let block = source.allocate_block(size).unwrap();
    {
        let buffer = BlockBuffer::new(&source, block.handle).unwrap();
        let started = Instant::now();
        let (_, before) = kernels.counts();
        kernels.fill(buffer.as_compute(), 4, size - 8, 11).unwrap();
        let filled = started.elapsed();
        assert!(kernels.verify(buffer.as_compute(), 4, size - 8, 11).unwrap().is_clean());
        let (_, after) = kernels.counts();
        assert_eq!(after - before, 4, "two dispatches each for fill and verify");
        let last = ((size - 8) / 4 - 1) as u32;
        assert_eq!(read_words(&source, block.base_address + 4 + u64::from(last) * 4, 1), [pattern_word(11, last)]);
        eprintln!("{} MiB: fill {filled:.2?}, fill + verify {:.2?}", size / MIB, started.elapsed());
    }
    source.free_block(block);
    drop((kernels, source));
    crate::common::finish(context);
}

/// A block buffer of another context's device is refused before anything is recorded.
#[test]
fn a_buffer_of_another_device_is_refused() {
    let Some((context, source, mut kernels)) = setup() else { return };
    let Some((other, mut other_source, other_kernels)) = setup() else { return };
    let block = other_source.allocate_block(64 * KIB).unwrap();
    {
        let buffer = BlockBuffer::new(&other_source, block.handle).unwrap();
        let refused = kernels.fill(buffer.as_compute(), 0, 64 * KIB, 1);
        assert!(matches!(refused, Err(VulkanKernelError::Kernel(_))), "{refused:?}");
        assert_eq!(kernels.counts(), (0, 0));
    }
    other_source.free_block(block);
    drop((kernels, source, other_kernels, other_source));
    crate::common::finish(context);
    crate::common::finish(other);
}
