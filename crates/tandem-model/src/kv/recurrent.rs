//! A recurrent layer's per-sequence state ([`RecurrentState`]: the conv inputs and the SSM
//! state, on the host or the device) and the snapshot of a whole cache's states
//! ([`RecurrentSnapshot`], with the sliding-window rows a checkpoint carries).

use candle_core::{DType, Device, Tensor};

use super::WindowRows;
use crate::error::Result;

/// The state of one recurrent layer of one sequence at one position (f32), on the host (CPU
/// models: the slice kernels update it in place) or on the model's device (GPU models: the
/// device kernels return a new state and never write into one, so a clone, a snapshot or a
/// checkpoint shares the tensors safely and costs nothing).
#[derive(Debug, Clone)]
pub enum RecurrentState {
    Host {
        /// `[conv_kernel - 1, conv_channels]`, oldest input first.
        conv: Vec<f32>,
        /// `[state_heads, key_dim, value_dim]`.
        ssm: Vec<f32>,
    },
    Device {
        /// `[conv_kernel - 1, conv_channels]` f32.
        conv: Tensor,
        /// `[state_heads, key_dim, value_dim]` f32.
        ssm: Tensor,
    },
}

impl RecurrentState {
    /// A zero state on `device` (host vectors on the CPU).
    pub fn zeros_on(conv_channels: usize, conv_kernel: usize, state_len: usize, device: &Device) -> Result<Self> {
        if device.is_cpu() {
            return Ok(Self::zeros(conv_channels, conv_kernel, state_len));
        }
        Ok(Self::Device {
            conv: Tensor::zeros((conv_kernel.saturating_sub(1), conv_channels), DType::F32, device)?,
            ssm: Tensor::zeros(state_len, DType::F32, device)?,
        })
    }

    /// A zero host state.
    pub fn zeros(conv_channels: usize, conv_kernel: usize, state_len: usize) -> Self {
        Self::Host { conv: vec![0.0; conv_channels * conv_kernel.saturating_sub(1)], ssm: vec![0.0; state_len] }
    }

    pub fn bytes(&self) -> usize {
        match self {
            Self::Host { conv, ssm } => 4 * (conv.len() + ssm.len()),
            Self::Device { conv, ssm } => 4 * (conv.elem_count() + ssm.elem_count()),
        }
    }

    /// The conv state as host values (a device copy for device states).
    pub fn conv_values(&self) -> Result<Vec<f32>> {
        match self {
            Self::Host { conv, .. } => Ok(conv.clone()),
            Self::Device { conv, .. } => super::persist::host_vec::<f32>(conv),
        }
    }

    /// Copies of `states` that own their storage (host states are cloned): on a CUDA device
    /// every device state's conv and SSM tensors go into one fresh buffer (one allocation and
    /// a device copy per tensor), elsewhere each is copied on its own. Used where a sequence
    /// keeps states that are views of a larger buffer (a verify step's lanes, a batch's rows).
    pub fn detach_all(states: &[&RecurrentState]) -> Result<Vec<RecurrentState>> {
        #[cfg(feature = "cuda")]
        {
            let pieces: Vec<&Tensor> = states
                .iter()
                .flat_map(|s| match s {
                    Self::Device { conv, ssm } => vec![conv, ssm],
                    Self::Host { .. } => Vec::new(),
                })
                .collect();
            // One buffer on the first piece's device, for contiguous f32 pieces all on it.
            let one_buffer = pieces
                .iter()
                .all(|t| t.dtype() == DType::F32 && t.is_contiguous() && t.device().same_device(pieces[0].device()));
            if let Some(dev) = pieces.first().and_then(|t| crate::ops::cuda_util::cuda_device(t)).filter(|_| one_buffer)
            {
                let mut copies = crate::ops::cuda_util::copy_f32_together(&dev, &pieces)?.into_iter();
                return states
                    .iter()
                    .map(|s| match s {
                        Self::Host { .. } => Ok((*s).clone()),
                        Self::Device { .. } => match (copies.next(), copies.next()) {
                            (Some(conv), Some(ssm)) => Ok(Self::Device { conv, ssm }),
                            _ => Err(crate::error::ModelError::Input("detach_all: copies missing".into())),
                        },
                    })
                    .collect();
            }
        }
        states
            .iter()
            .map(|s| {
                Ok(match s {
                    Self::Host { .. } => (*s).clone(),
                    Self::Device { conv, ssm } => {
                        Self::Device { conv: conv.force_contiguous()?, ssm: ssm.force_contiguous()? }
                    }
                })
            })
            .collect()
    }

    /// The SSM state as host values (a device copy for device states).
    pub fn ssm_values(&self) -> Result<Vec<f32>> {
        match self {
            Self::Host { ssm, .. } => Ok(ssm.clone()),
            Self::Device { ssm, .. } => super::persist::host_vec::<f32>(ssm),
        }
    }
}

impl PartialEq for RecurrentState {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Host { conv: a, ssm: b }, Self::Host { conv: c, ssm: d }) => a == c && b == d,
            _ => match (self.conv_values(), self.ssm_values(), other.conv_values(), other.ssm_values()) {
                (Ok(a), Ok(b), Ok(c), Ok(d)) => a == c && b == d,
                _ => false,
            },
        }
    }
}

/// The recurrent part of a sequence's state at one position (one entry per layer, `None` for
/// attention layers). Restoring it also cuts the attention KV back to `position`.
///
/// A checkpoint ([`SequenceCache::checkpoint`]) of a cache whose sliding-window layers keep
/// rings also carries those layers' last `window - 1` positions (`windows`, one entry per
/// layer, `Some` for ring layers); a plain [`SequenceCache::snapshot`] leaves `windows` empty
/// (rolling back within the ring's slack needs no copy).
#[derive(Debug, Clone, PartialEq)]
pub struct RecurrentSnapshot {
    pub position: usize,
    pub layers: Vec<Option<RecurrentState>>,
    pub windows: Vec<Option<WindowRows>>,
}

impl RecurrentSnapshot {
    /// The same snapshot owning its device states (a copy of each): a batched GPU step leaves
    /// each sequence's state as one row of a buffer the whole batch shares, which a snapshot
    /// kept for long (a prefix-cache checkpoint) must not hold on to whole. Host states are
    /// their own already.
    pub fn detached(&self) -> Result<Self> {
        let present: Vec<&RecurrentState> = self.layers.iter().flatten().collect();
        let mut copies = RecurrentState::detach_all(&present)?.into_iter();
        let layers = self.layers.iter().map(|l| l.as_ref().and_then(|_| copies.next())).collect();
        Ok(Self { position: self.position, layers, windows: self.windows.clone() })
    }

    /// Bytes held: recurrent states and window rows.
    pub fn bytes(&self) -> usize {
        self.layers.iter().flatten().map(RecurrentState::bytes).sum::<usize>()
            + self.windows.iter().flatten().map(WindowRows::bytes).sum::<usize>()
    }
}
