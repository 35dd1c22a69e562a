//! Device selection: CUDA or Metal when compiled in and present, else the CPU.

use candle_core::Device;

use crate::error::Result;

/// The best device this build can use.
pub fn default_device() -> Result<Device> {
    #[cfg(feature = "cuda")]
    {
        if candle_core::utils::cuda_is_available() {
            return Ok(Device::new_cuda(0)?);
        }
    }
    #[cfg(feature = "metal")]
    {
        if candle_core::utils::metal_is_available() {
            return Ok(Device::new_metal(0)?);
        }
    }
    Ok(Device::Cpu)
}
