//! Device selection: which candle device the process runs its model on.
//!
//! The binary sets a [`DeviceChoice`] once (`--device auto|cpu|cuda[:N]|metal[:N]`, or
//! `TANDEM_DEVICE`); every later [`default_device`] call returns the same [`Device`] (one CUDA
//! context and stream per process, so tensors made by the loader, the KV pool and the engine can
//! meet). `auto` takes a GPU this build can drive and that starts, and otherwise falls back to
//! the CPU with one warning; an explicit `cuda` or `metal` that cannot start is an error naming
//! the flag.

use std::sync::{Mutex, OnceLock};

use candle_core::Device;

use crate::error::{ModelError, Result};

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// A usable GPU if there is one, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
    Metal(usize),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        let ordinal = |rest: &str| -> std::result::Result<usize, String> {
            match rest {
                "" => Ok(0),
                r => r
                    .strip_prefix(':')
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| format!("bad device `{s}`: expected auto, cpu, cuda[:N] or metal[:N]")),
            }
        };
        match s.as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            _ if s.starts_with("cuda") => Ok(Self::Cuda(ordinal(&s[4..])?)),
            _ if s.starts_with("metal") => Ok(Self::Metal(ordinal(&s[5..])?)),
            _ => Err(format!("unknown device `{s}`: expected auto, cpu, cuda[:N] or metal[:N]")),
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => write!(f, "auto"),
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
            Self::Metal(n) => write!(f, "metal:{n}"),
        }
    }
}

static CHOICE: Mutex<Option<DeviceChoice>> = Mutex::new(None);
static DEVICE: OnceLock<Device> = OnceLock::new();

/// Sets the process's device choice. Only the first [`default_device`] call after it reads it.
pub fn set_device_choice(choice: DeviceChoice) {
    if let Ok(mut c) = CHOICE.lock() {
        *c = Some(choice);
    }
}

fn choice() -> DeviceChoice {
    if let Some(c) = CHOICE.lock().ok().and_then(|c| *c) {
        return c;
    }
    std::env::var("TANDEM_DEVICE").ok().and_then(|s| s.parse().ok()).unwrap_or_default()
}

/// How this process loaded tandem's CUDA kernel modules so far ("16 as SASS for sm_90, 0 as
/// PTX"), or `None` when none was loaded (or the build has no CUDA): reports say which form of
/// the kernels they checked.
pub fn kernel_forms() -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        let (sass, ptx) = crate::ops::cuda_module::loaded_forms();
        if sass + ptx > 0 {
            return Some(format!("{sass} as SASS for sm_{}, {ptx} as PTX (JIT-compiled)", tandem_kernels::CUBIN_CAP));
        }
    }
    None
}

/// The process's device: opened on the first call from the choice set with
/// [`set_device_choice`] (else `TANDEM_DEVICE`, else `auto`), the same one afterwards.
pub fn default_device() -> Result<Device> {
    if let Some(d) = DEVICE.get() {
        return Ok(d.clone());
    }
    let d = open(choice())?;
    Ok(DEVICE.get_or_init(|| d).clone())
}

/// Opens the device `choice` names (a new one every call; most code wants [`default_device`]).
pub fn open(choice: DeviceChoice) -> Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda(n) => open_cuda(n).map_err(|e| {
            ModelError::Input(format!(
                "cannot start CUDA device {n}: {e}; pass --device cpu (or auto) to run on the CPU"
            ))
        }),
        DeviceChoice::Metal(n) => open_metal(n).map_err(|e| {
            ModelError::Input(format!(
                "cannot start Metal device {n}: {e}; pass --device cpu (or auto) to run on the CPU"
            ))
        }),
        DeviceChoice::Auto => {
            let mut why = Vec::new();
            if cfg!(feature = "cuda") {
                match open_cuda(0) {
                    Ok(d) => return Ok(d),
                    Err(e) => why.push(format!("CUDA: {e}")),
                }
            }
            if cfg!(feature = "metal") {
                match open_metal(0) {
                    Ok(d) => return Ok(d),
                    Err(e) => why.push(format!("Metal: {e}")),
                }
            }
            if !why.is_empty() {
                tracing::warn!("no usable GPU ({}); running on the CPU", why.join("; "));
            }
            Ok(Device::Cpu)
        }
    }
}

fn open_cuda(n: usize) -> std::result::Result<Device, String> {
    if !cfg!(feature = "cuda") {
        return Err("this build has no CUDA support (build with --features cuda)".into());
    }
    // A driver that cannot start may make candle panic rather than return an error.
    match std::panic::catch_unwind(|| Device::new_cuda(n)) {
        Ok(Ok(d)) => {
            tune_cuda(&d);
            Ok(d)
        }
        Ok(Err(e)) => Err(first_line(&e.to_string())),
        Err(_) => Err("the CUDA driver failed to start".into()),
    }
}

/// Host-side settings for a decode step's thousands of small allocations on a fresh CUDA
/// device:
/// - candle records two CUDA events for every buffer it allocates (created at allocation,
///   destroyed when the buffer drops) so that buffers shared between streams are waited for.
///   tandem issues all work on one stream, where those events are never waited on: tracking is
///   off unless `TANDEM_CUDA_EVENT_TRACKING=1` (for comparisons);
/// - the default memory pool keeps what it has reserved ([`keep_pool_memory`]).
fn tune_cuda(d: &Device) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(c) = d {
        if std::env::var("TANDEM_CUDA_EVENT_TRACKING").as_deref() != Ok("1") {
            // Safety: every tensor of this process is used on the device's one stream, so no
            // cross-stream wait is ever needed (cudarc only waits on the events in its
            // multi-stream mode, which tandem never enters).
            unsafe { c.disable_event_tracking() };
        }
        keep_pool_memory(c);
    }
    let _ = d;
}

/// candle allocates every tensor with `cuMemAllocAsync` from the device's default memory pool,
/// whose release threshold is 0: at every synchronisation (each decode step reads its logits)
/// the pool hands its memory back to the driver, and the next step's thousands of small
/// allocations map it again. Keeping what the pool has reserved (at most the peak of the
/// temporaries, which the process needed anyway; the KV pool is allocated apart) makes them
/// reuse. `TANDEM_CUDA_POOL_KEEP=BYTES` sets the threshold (0: candle's default behaviour).
#[cfg(feature = "cuda")]
fn keep_pool_memory(c: &candle_core::cuda_backend::CudaDevice) {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    let keep: u64 = std::env::var("TANDEM_CUDA_POOL_KEEP").ok().and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
    let ctx = c.cuda_stream().context().clone();
    let set = || -> std::result::Result<(), result::DriverError> {
        ctx.bind_to_thread()?;
        // Safety: the device handle comes from the live context; the value is a u64 as the
        // attribute requires.
        unsafe {
            let pool = result::device::get_default_mem_pool(ctx.cu_device())?;
            let mut v = keep;
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut v as *mut u64).cast(),
            )
        }
    };
    if let Err(e) = set() {
        tracing::warn!("cannot set the CUDA memory pool's release threshold: {e}");
    }
}

/// Starts (`true`) or stops the CUDA profiler's capture (`cuProfilerStart` / `Stop`), so that
/// `ncu --profile-from-start off` sees only the work in between (`tandem bench` brackets decode
/// steps with it under `TANDEM_PROFILE_DECODE=N`). A no-op without CUDA.
pub fn profiler_capture(d: &Device, on: bool) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(c) = d {
        use candle_core::cuda_backend::cudarc::driver::sys;
        let _ = c.cuda_stream().context().bind_to_thread();
        // Safety: plain driver calls on the current context, no arguments.
        let r = unsafe {
            if on {
                sys::cuProfilerStart()
            } else {
                sys::cuProfilerStop()
            }
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!("cuProfiler{}: {r:?}", if on { "Start" } else { "Stop" });
        }
    }
    let _ = (d, on);
}

fn open_metal(n: usize) -> std::result::Result<Device, String> {
    if !cfg!(feature = "metal") {
        return Err("this build has no Metal support (build with --features metal)".into());
    }
    match std::panic::catch_unwind(|| Device::new_metal(n)) {
        Ok(Ok(d)) => Ok(d),
        Ok(Err(e)) => Err(first_line(&e.to_string())),
        Err(_) => Err("the Metal device failed to start".into()),
    }
}

/// candle appends a backtrace to its errors when RUST_BACKTRACE is set: keep the message.
fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).trim().to_string()
}

/// A short name for logs and tables: `cpu`, `cuda:0`, `metal:0`.
pub fn name(d: &Device) -> String {
    match d {
        Device::Cpu => "cpu".into(),
        Device::Cuda(_) => "cuda".into(),
        Device::Metal(_) => "metal".into(),
    }
}

/// Makes `d`'s context current on the calling thread (CUDA), so that tensors the thread frees
/// release their memory in the right context: a thread that frees device memory without it
/// leaves an error in the context that fails every later call. No-op elsewhere.
pub fn bind_thread(d: &Device) {
    match d {
        #[cfg(feature = "cuda")]
        Device::Cuda(c) => {
            if let Err(e) = c.cuda_stream().context().bind_to_thread() {
                tracing::warn!("cannot bind the CUDA context to this thread: {e}");
            }
        }
        _ => {}
    }
}

static STREAM_SHARE: Mutex<()> = Mutex::new(());

/// Held while a CUDA graph is recorded on a device's stream ([`crate::ops`]' graph capture) and
/// by any other thread while it queues work on, reads from or frees memory of that stream (the
/// disk tier's writer reading KV block copies back): what another thread queued during a
/// recording would be recorded into the graph, or fail it. Cheap and uncontended otherwise.
pub fn stream_share() -> std::sync::MutexGuard<'static, ()> {
    STREAM_SHARE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Free and total bytes of device memory, where the backend can tell.
pub fn memory_info(d: &Device) -> Option<(usize, usize)> {
    match d {
        #[cfg(feature = "cuda")]
        Device::Cuda(c) => {
            use candle_core::cuda_backend::cudarc::driver::result;
            let _ = c.cuda_stream().context().bind_to_thread();
            result::mem_get_info().ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_spelling() {
        assert_eq!("auto".parse::<DeviceChoice>(), Ok(DeviceChoice::Auto));
        assert_eq!("CPU".parse::<DeviceChoice>(), Ok(DeviceChoice::Cpu));
        assert_eq!("cuda".parse::<DeviceChoice>(), Ok(DeviceChoice::Cuda(0)));
        assert_eq!("cuda:3".parse::<DeviceChoice>(), Ok(DeviceChoice::Cuda(3)));
        assert_eq!("metal:1".parse::<DeviceChoice>(), Ok(DeviceChoice::Metal(1)));
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
        assert!("cudax".parse::<DeviceChoice>().is_err());
        assert!("tpu".parse::<DeviceChoice>().is_err());
        assert_eq!(DeviceChoice::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn auto_without_a_gpu_build_is_the_cpu_and_an_explicit_gpu_is_an_error() {
        assert!(open(DeviceChoice::Cpu).unwrap().is_cpu());
        if !cfg!(feature = "cuda") && !cfg!(feature = "metal") {
            assert!(open(DeviceChoice::Auto).unwrap().is_cpu());
            let e = open(DeviceChoice::Cuda(0)).unwrap_err().to_string();
            assert!(e.contains("--device cpu") && e.contains("--features cuda"), "{e}");
        }
    }
}
