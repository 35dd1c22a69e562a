//! Glue for launching tandem's own CUDA kernels (`tandem-kernels`' PTX) on candle tensors:
//! device slices of contiguous inputs, fresh outputs wrapped back into tensors, and errors
//! turned into [`ModelError`]s. CUDA builds only.

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, DevicePtr, DeviceRepr, LaunchArgs, LaunchConfig,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{Device, Shape, Storage, Tensor};

use crate::error::{ModelError, Result};

pub(crate) fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> ModelError + '_ {
    move |e| ModelError::Input(format!("{what}: CUDA error: {e}"))
}

/// The CUDA device of `t`, or `None` when it lives elsewhere.
pub(crate) fn cuda_device(t: &Tensor) -> Option<CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Some(d.clone()),
        _ => None,
    }
}

/// Read guards over the storage of contiguous tensors; [`Self::view`] hands out device views.
pub(crate) struct Inputs<'a> {
    guards: Vec<(candle_core::StorageRef<'a>, &'a candle_core::Layout)>,
}

impl<'a> Inputs<'a> {
    /// The tensors must be contiguous (call `.contiguous()` first).
    pub fn new(ts: &[&'a Tensor]) -> Result<Self> {
        Self::checked(ts, |l| l.is_contiguous())
    }

    /// The tensors must be contiguous or rows in place ([`row_stride`]): for kernels that take
    /// a row stride.
    pub fn new_rows(ts: &[&'a Tensor]) -> Result<Self> {
        Self::checked(ts, |l| row_stride(l).is_some())
    }

    fn checked(ts: &[&'a Tensor], ok: fn(&candle_core::Layout) -> bool) -> Result<Self> {
        let guards = ts
            .iter()
            .map(|t| {
                let (s, l) = t.storage_and_layout();
                if !ok(l) {
                    return Err(ModelError::Input("CUDA kernel input is not contiguous".into()));
                }
                Ok((s, l))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { guards })
    }

    /// Input `i` as a device view of `T`.
    pub fn view<T: CudaDType>(&self, i: usize) -> Result<CudaView<'_, T>> {
        let (s, l) = &self.guards[i];
        match &**s {
            Storage::Cuda(c) => Ok(c.as_cuda_slice::<T>()?.slice(l.start_offset()..)),
            other => Err(ModelError::Input(format!("CUDA kernel input on {:?}", other.device().location()))),
        }
    }
}

/// The distance between the rows of a layout that a kernel can read in place: a contiguous
/// one's row length (its last dim), or a 2-D one with unit column stride (a column view of a
/// wider matrix, e.g. one part of a fused projection's output) its row stride.
pub(crate) fn row_stride(l: &candle_core::Layout) -> Option<usize> {
    let dims = l.dims();
    if l.is_contiguous() {
        return Some(dims.last().copied().unwrap_or(1));
    }
    match (dims, l.stride()) {
        ([_, cols], [ld, 1]) if ld >= cols => Some(*ld),
        _ => None,
    }
}

/// `t` as f32 rows a kernel can read in place ([`row_stride`]), copied to contiguous f32 only
/// where it is not; with its row stride.
pub(crate) fn f32_rows(t: &Tensor) -> Result<(Tensor, usize)> {
    let t = t.to_dtype(candle_core::DType::F32)?;
    if let Some(ld) = row_stride(t.layout()) {
        return Ok((t, ld));
    }
    let t = t.contiguous()?;
    let ld = t.dims().last().copied().unwrap_or(1);
    Ok((t, ld))
}

/// A new uninitialised f32 buffer of `n` values (at least one, so a launch always has a pointer).
pub(crate) fn alloc_f32(dev: &CudaDevice, n: usize) -> Result<CudaSlice<f32>> {
    // SAFETY: every kernel that gets such a buffer writes each element it exposes.
    Ok(unsafe { dev.alloc::<f32>(n.max(1))? })
}

/// Copies of `ts` (contiguous f32 CUDA tensors) in one fresh buffer: one allocation and one
/// device-to-device copy per tensor, each copy a view of its own range, with its shape. Where
/// a commit or a snapshot copies a sequence's recurrent states (two per layer), this replaces
/// an allocation and a copy per tensor, host time a GPU step waits through.
pub(crate) fn copy_f32_together(dev: &CudaDevice, ts: &[&Tensor]) -> Result<Vec<Tensor>> {
    if let Some(t) = ts.iter().find(|t| t.dtype() != candle_core::DType::F32 || !t.is_contiguous()) {
        return Err(ModelError::Input(format!("copy_f32_together: a {:?} {:?} tensor", t.dtype(), t.layout())));
    }
    let total: usize = ts.iter().map(|t| t.elem_count()).sum();
    let whole = tensor(alloc_f32(dev, total)?, dev, total.max(1));
    let base = device_address(&whole)?;
    let stream = dev.cuda_stream();
    let mut out = Vec::with_capacity(ts.len());
    let mut off = 0;
    for t in ts {
        let n = t.elem_count();
        if n > 0 {
            let src = device_address(t)?;
            // SAFETY: both ranges are live device memory of n f32 (src a contiguous tensor,
            // dst inside the fresh buffer of `total`), on the device's one stream.
            unsafe {
                candle_core::cuda_backend::cudarc::driver::result::memcpy_dtod_async(
                    base + 4 * off as u64,
                    src,
                    4 * n,
                    stream.cu_stream(),
                )
            }
            .map_err(err("copy_f32_together"))?;
        }
        out.push(whole.narrow(0, off, n)?.reshape(t.dims())?);
        off += n;
    }
    Ok(out)
}

/// Wraps a device buffer into a tensor of `shape`.
pub(crate) fn tensor<T: CudaDType + DeviceRepr>(
    slice: CudaSlice<T>,
    dev: &CudaDevice,
    shape: impl Into<Shape>,
) -> Tensor {
    Tensor::from_storage(
        Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, dev.clone())),
        shape,
        BackpropOp::none(),
        false,
    )
}

/// Launches a kernel whose arguments are pushed on `b`.
///
/// # Safety
/// The arguments must match the kernel's parameters in order and type, with every buffer
/// large enough for the grid in `cfg`.
pub(crate) unsafe fn run(b: &mut LaunchArgs<'_>, cfg: LaunchConfig, name: &str) -> Result<()> {
    unsafe { b.launch(cfg) }.map_err(err(name))?;
    Ok(())
}

/// The device addresses and row strides (in values) of a gated MLP's `g` and `u` (f32 `[m, k]`
/// row views of the same shape, e.g. the halves of a fused `[gate | up]` output), for kernels
/// that form `silu(g) * u` as they read them; `None` where the views do not suit (then the
/// caller runs `silu_mul` first). `align` is the byte alignment the kernel's loads need of
/// every row start.
pub(crate) fn gated_rows(g: &Tensor, u: &Tensor, align: u64) -> Result<Option<[(u64, i64); 2]>> {
    use candle_core::DType;
    if g.rank() != 2 || g.dims() != u.dims() || g.dtype() != DType::F32 || u.dtype() != DType::F32 {
        return Ok(None);
    }
    if cuda_device(g).is_none() || cuda_device(u).is_none() {
        return Ok(None);
    }
    let (Some(ldg), Some(ldu)) = (row_stride(g.layout()), row_stride(u.layout())) else { return Ok(None) };
    let (ga, ua) = (device_address(g)?, device_address(u)?);
    let fits = |a: u64, ld: usize| a.is_multiple_of(align) && (ld as u64 * 4).is_multiple_of(align);
    if !(fits(ga, ldg) && fits(ua, ldu)) {
        return Ok(None);
    }
    Ok(Some([(ga, ldg as i64), (ua, ldu as i64)]))
}

/// A size as a kernel `int` argument.
pub(crate) fn i32_of(x: usize) -> Result<i32> {
    i32::try_from(x).map_err(|_| ModelError::Input(format!("{x} does not fit a CUDA kernel's int argument")))
}

/// The device address of a CUDA tensor's first element (f32, f16, bf16, u8, u32, i64), for kernels that
/// take raw pointers at byte offsets. Valid while the tensor lives and nothing writes it; every
/// launch goes on the device's one stream, after whatever wrote it.
pub(crate) fn device_address(t: &Tensor) -> Result<u64> {
    let (st, l) = t.storage_and_layout();
    let Storage::Cuda(c) = &*st else { return Err(ModelError::Input("not a CUDA tensor".into())) };
    let stream = c.device.cuda_stream();
    let p = match t.dtype() {
        candle_core::DType::F32 => c.as_cuda_slice::<f32>()?.device_ptr(&stream).0,
        candle_core::DType::F16 => c.as_cuda_slice::<half::f16>()?.device_ptr(&stream).0,
        candle_core::DType::BF16 => c.as_cuda_slice::<half::bf16>()?.device_ptr(&stream).0,
        candle_core::DType::U8 => c.as_cuda_slice::<u8>()?.device_ptr(&stream).0,
        candle_core::DType::U32 => c.as_cuda_slice::<u32>()?.device_ptr(&stream).0,
        candle_core::DType::I64 => c.as_cuda_slice::<i64>()?.device_ptr(&stream).0,
        other => return Err(ModelError::Input(format!("no raw address for {other:?} tensors"))),
    };
    Ok(p + (l.start_offset() * t.dtype().size_in_bytes()) as u64)
}

/// Writes `src` into the device memory of `dst` (contiguous, at least as long, the same element
/// size) in the stream's order: after the work queued before it, before the work queued after.
/// A CUDA graph's input buffers are rewritten this way before each launch.
pub(crate) fn write_host<T: DeviceRepr>(dst: &Tensor, src: &[T]) -> Result<()> {
    if !dst.is_contiguous() || dst.elem_count() < src.len() || dst.dtype().size_in_bytes() != std::mem::size_of::<T>() {
        return Err(ModelError::Input(format!(
            "write_host: {} values into {:?} {:?}",
            src.len(),
            dst.dtype(),
            dst.dims()
        )));
    }
    let Device::Cuda(dev) = dst.device() else { return Err(ModelError::Input("write_host: not a CUDA tensor".into())) };
    if src.is_empty() {
        return Ok(());
    }
    let addr = device_address(dst)?;
    let stream = dev.cuda_stream();
    // SAFETY: dst is a live device buffer of at least size_of_val(src) bytes from addr (checked
    // above); a copy from pageable host memory has read `src` when the call returns.
    unsafe { candle_core::cuda_backend::cudarc::driver::result::memcpy_htod_async(addr, src, stream.cu_stream()) }
        .map_err(err("write_host"))?;
    Ok(())
}

/// The device's streaming multiprocessors (for tile choices that depend on how a grid fills
/// the card; 132 on an H100 / H200 SXM), read once per device ordinal.
pub(crate) fn sm_count(dev: &candle_core::CudaDevice) -> usize {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute_enum as A;
    device_attribute(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132)
}

/// The most dynamic shared memory a kernel may opt in to on this device (227 KiB on an H100 /
/// H200, 99 KiB on an RTX 4090), read once per device ordinal: kernels of bigger tiles are
/// chosen only where they fit.
pub(crate) fn max_shared_optin(dev: &candle_core::CudaDevice) -> usize {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute_enum as A;
    device_attribute(dev, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 48 * 1024)
}

/// The device's compute capability (major, minor; (0, 0) where the driver does not say), read
/// once per device ordinal: kernels built for one architecture's own features (Hopper's wgmma)
/// are chosen only where it matches.
pub(crate) fn compute_capability(dev: &candle_core::CudaDevice) -> (usize, usize) {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute_enum as A;
    (
        device_attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0),
        device_attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0),
    )
}

/// A device attribute, read once per (device ordinal, attribute); `fallback` where the driver
/// does not say.
fn device_attribute(
    dev: &candle_core::CudaDevice,
    attr: candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute_enum,
    fallback: usize,
) -> usize {
    type Seen = Vec<(usize, u32, usize)>;
    static SEEN: std::sync::Mutex<Seen> = std::sync::Mutex::new(Vec::new());
    let ord = dev.cuda_stream().context().ordinal();
    let key = attr as u32;
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, _, v)) = seen.iter().find(|(o, a, _)| *o == ord && *a == key) {
        return v;
    }
    let v = dev
        .cuda_stream()
        .context()
        .attribute(attr)
        .ok()
        .and_then(|v| usize::try_from(v).ok())
        .filter(|&v| v > 0)
        .unwrap_or(fallback);
    seen.push((ord, key, v));
    v
}

/// Lets kernel `name` (loaded for `key`'s device) take `bytes` of dynamic shared memory (above
/// the 48 KB default): set when a call first asks for more than the kernel was last allowed,
/// so calls of different sizes (a GDN layer's key dim) each get what they need.
pub(crate) fn allow_dynamic_shared(
    f: &impl std::ops::Deref<Target = CudaFunction>,
    key: String,
    name: &str,
    bytes: u32,
) -> Result<()> {
    static DONE: std::sync::Mutex<Vec<(String, u32)>> = std::sync::Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    let slot = done.iter().position(|(k, _)| *k == key);
    if slot.is_some_and(|i| done[i].1 >= bytes) {
        return Ok(());
    }
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum as A;
    f.set_attribute(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
        .map_err(|e| ModelError::Input(format!("{name}: cannot allow {bytes} bytes of shared memory: {e}")))?;
    match slot {
        Some(i) => done[i].1 = bytes,
        None => done.push((key, bytes)),
    }
    Ok(())
}
