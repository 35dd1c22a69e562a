//! Loading tandem's kernel modules (`tandem_kernels::Module`) on a CUDA device: the SASS the
//! build made for its GPU where the device runs it, so the first use of a module costs a load
//! rather than the driver's JIT compilation of its PTX (all modules together are ~23 s of
//! ptxas: a fresh machine's first request used to wait for it); the PTX elsewhere, when the
//! SASS is refused, for `TANDEM_PTX_DIR` variants, or with `TANDEM_CUBIN=0`. Modules are loaded
//! once per device and kept for the process, and with them the device's CUDA context (candle
//! kept them as long as the `CudaDevice`; tandem opens each device once). CUDA builds only.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchArgs};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaDevice, DeviceId, WrapErr};

/// A kernel of a loaded module, ready to launch on its device's stream.
pub(crate) struct Kernel {
    func: CudaFunction,
    stream: Arc<CudaStream>,
}

impl Kernel {
    /// A launch of this kernel on the device's stream.
    pub fn builder(&self) -> LaunchArgs<'_> {
        self.stream.launch_builder(&self.func)
    }
}

impl std::ops::Deref for Kernel {
    type Target = CudaFunction;
    fn deref(&self) -> &CudaFunction {
        &self.func
    }
}

/// Kernel lookup by name on a CUDA device.
pub(crate) trait LoadKernel {
    /// Kernel `name` of `code`, its module loaded on this device at its first use.
    fn kernel(&self, name: &str, code: tandem_kernels::Module) -> candle_core::Result<Kernel>;
}

type Modules = HashMap<(DeviceId, &'static str), Arc<CudaModule>>;

impl LoadKernel for CudaDevice {
    fn kernel(&self, name: &str, code: tandem_kernels::Module) -> candle_core::Result<Kernel> {
        static MODULES: RwLock<Option<Modules>> = RwLock::new(None);
        let key = (self.id(), code.stem);
        let known = MODULES.read().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|m| m.get(&key).cloned());
        let loaded = match known {
            Some(m) => m,
            None => {
                // Loaded outside the lock (a PTX may take seconds to compile): other modules and
                // devices go on meanwhile; if two threads load the same one, the first kept wins.
                let m = load(self, code)?;
                let mut modules = MODULES.write().unwrap_or_else(|e| e.into_inner());
                modules.get_or_insert_with(HashMap::new).entry(key).or_insert(m).clone()
            }
        };
        let func = loaded.load_function(name).w()?;
        Ok(Kernel { func, stream: self.cuda_stream() })
    }
}

/// Whether SASS may be loaded at all (`TANDEM_CUBIN=0`: always the PTX, for comparisons).
fn cubins_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_CUBIN").map_or(true, |v| v != "0"))
}

/// Modules loaded so far as SASS ([0]) and as PTX ([1]).
static FORMS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// How many modules this process loaded as SASS and as PTX so far (for reports:
/// `tandem check-device` names the form it checked).
pub(crate) fn loaded_forms() -> (usize, usize) {
    (FORMS[0].load(Ordering::Relaxed), FORMS[1].load(Ordering::Relaxed))
}

fn load(dev: &CudaDevice, code: tandem_kernels::Module) -> candle_core::Result<Arc<CudaModule>> {
    let stream = dev.cuda_stream();
    let ctx = stream.context();
    let runs = ctx
        .compute_capability()
        .map(|(major, minor)| {
            tandem_kernels::cubin_runs_on(tandem_kernels::CUBIN_CAP, major.max(0) as u32, minor.max(0) as u32)
        })
        .unwrap_or(false);
    if runs && !code.cubin.is_empty() && cubins_enabled() {
        match ctx.load_module(Ptx::from_binary(code.cubin.to_vec())) {
            Ok(m) => {
                FORMS[0].fetch_add(1, Ordering::Relaxed);
                return Ok(m);
            }
            // A driver older than the toolkit that assembled it may refuse the SASS: its PTX
            // may still load (the driver compiles it).
            Err(e) => tracing::warn!(module = code.stem, "the built SASS did not load ({e}); compiling its PTX"),
        }
    }
    let m = ctx.load_module(Ptx::from_src(code.ptx)).w()?;
    FORMS[1].fetch_add(1, Ordering::Relaxed);
    Ok(m)
}
