//! [`FormatSize`]: byte counts as PyTorch's C++ allocator writes them in its out-of-memory message (`format_size` in
//! `c10/cuda/CUDACachingAllocator.cpp`), so that a message heapscope writes in PyTorch's words reads as PyTorch's
//! would and can be searched for: up to 1024 bytes in bytes, then KiB, MiB and GiB with two decimals, each unit
//! up to and including its next's first count (1 GiB is `1024.00 MiB`). heapscope's own tables use
//! `heapscope_core::units::Bytes` (1 GiB is `1.00 GiB`), as `memory_summary()` does in Python.

use std::fmt;

/// A byte count as PyTorch's out-of-memory message writes it (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatSize(pub u64);

impl fmt::Display for FormatSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KIB: u64 = 1 << 10;
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        let size = self.0;
        let (scale, unit) = match size {
            0..=KIB => return write!(f, "{size} bytes"),
            1025..=MIB => (KIB, "KiB"),
            1_048_577..=GIB => (MIB, "MiB"),
            _ => (GIB, "GiB"),
        };
        write!(f, "{:.2} {unit}", size as f64 / scale as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::FormatSize;

    #[test]
    fn sizes_read_as_pytorch_writes_them() {
        let cases = [
            (0, "0 bytes"),
            (1024, "1024 bytes"),
            (1025, "1.00 KiB"),
            (1 << 20, "1024.00 KiB"),
            ((1 << 20) + 1, "1.00 MiB"),
            (1000 << 20, "1000.00 MiB"),
            (1 << 30, "1024.00 MiB"),
            (3 << 29, "1.50 GiB"),
            (u64::MAX, "17179869184.00 GiB"),
        ];
        for (bytes, said) in cases {
            assert_eq!(FormatSize(bytes).to_string(), said, "{bytes}");
        }
    }
}
