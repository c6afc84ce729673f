//! [`KernelBuffer`]: a `wgpu::Buffer` handed to compute work (heapscope's kernels bind ranges of it), compared by
//! identity.

/// A buffer the kernels may use: any `wgpu::Buffer` with `STORAGE` usage, of the runner's device.
#[derive(Clone, Copy, Debug)]
pub struct KernelBuffer<'a> {
    buffer: &'a wgpu::Buffer,
}

impl<'a> KernelBuffer<'a> {
    /// `buffer`, for the kernels.
    pub fn new(buffer: &'a wgpu::Buffer) -> Self {
        Self { buffer }
    }

    /// The buffer.
    pub fn buffer(&self) -> &'a wgpu::Buffer {
        self.buffer
    }
}

impl PartialEq for KernelBuffer<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.buffer == other.buffer
    }
}
