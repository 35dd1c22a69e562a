//! CPU tensors' values as plain slices for the host kernels, borrowed from the storage when the
//! layout is contiguous (matmul outputs, gathered KV) and copied only otherwise.

use candle_core::Tensor;

use crate::error::Result;

/// `f` on a CPU f32 tensor's values in row-major order: its storage itself when contiguous,
/// else a copy.
pub(crate) fn with_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (candle_core::Storage::Cpu(cpu), Some((start, end))) = (&*storage, layout.contiguous_offsets()) {
            return f(&cpu.as_slice::<f32>()?[start..end]);
        }
    }
    f(&t.flatten_all()?.to_vec1::<f32>()?)
}
