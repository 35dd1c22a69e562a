//! The gated attention layer's glue around attention itself (Qwen3.5 / Qwen3-Next attention
//! layers): from the fused q / k / v projection's output, the per-head zero-centred RMSNorm of
//! q and k, the partial NeoX rotation, head-major q / k / v for the attention kernels ([`prep`]);
//! after attention, the sigmoid output gate back in token-major rows ([`gate`]). On CUDA each
//! side is one launch (`tandem-kernels/cuda/attn_glue.cu`) reading the projection's column
//! views in place, where candle's ops took about fourteen launches a layer in a decode step and
//! twenty in a verify step; elsewhere (and with `TANDEM_ATTN_GLUE=0`) candle's ops compose it.
//! [`reference_prep`] and [`reference_gate`] are the plain per-value definitions both are
//! checked against (`conformance::attn_glue`). The plain (Llama-family) layer's q / k norms
//! (where it has them), rotations and head-major copies take the same kernel on CUDA
//! (`cuda::prep_plain`).

use candle_core::Tensor;

use crate::config::RopeStyle;
use crate::error::Result;
use crate::ops::rope::{rope_reference, Rope};

/// Head-major `(q [nh, total, hd], k [nkv, total, hd], v [nkv, total, hd])` from the
/// projection's rows `qg [total, 2 nh hd]` (per head `[query | gate]`), `k`, `v` `[total, nkv
/// hd]`: q and k normed per head with `wq`, `wk` (`hd` values, already `1 + w`) and rotated by
/// `rope` with the tokens' `tables` (`cos`, `sin` rows `[total, rot / 2]`).
#[allow(clippy::too_many_arguments)]
pub fn prep(
    qg: &Tensor,
    k: &Tensor,
    v: &Tensor,
    wq: &Tensor,
    wk: &Tensor,
    eps: f32,
    rope: &Rope,
    tables: &(Tensor, Tensor),
    (nh, nkv, hd): (usize, usize, usize),
) -> Result<(Tensor, Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if qg.device().is_cuda() && enabled() && fits(hd, rope.rot_dim(), rope.style()) {
        return cuda::prep(qg, k, v, wq, wk, eps, &tables.0, &tables.1, (nh, nkv, hd));
    }
    let total = qg.dim(0)?;
    let qgc = qg.reshape((total, nh, 2 * hd))?;
    let q = crate::ops::norm::rms_norm(&qgc.narrow(2, 0, hd)?.contiguous()?, wq, eps)?;
    let kc = crate::ops::norm::rms_norm(&k.reshape((total, nkv, hd))?.contiguous()?, wk, eps)?;
    let (cos, sin) = tables;
    let q = rope.apply(&q.transpose(0, 1)?.contiguous()?.unsqueeze(0)?, cos, sin)?.squeeze(0)?;
    let kc = rope.apply(&kc.transpose(0, 1)?.contiguous()?.unsqueeze(0)?, cos, sin)?.squeeze(0)?;
    let vc = v.reshape((total, nkv, hd))?.transpose(0, 1)?.contiguous()?;
    Ok((q, kc, vc))
}

/// `att [nh, total, hd] * sigmoid(gate)` as token-major rows `[total, nh hd]`, the gates from
/// `qg [total, 2 nh hd]` (per head `[query | gate]`).
pub fn gate(att: &Tensor, qg: &Tensor, nh: usize, hd: usize) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if att.device().is_cuda() && enabled() {
        return cuda::gate(att, qg, nh, hd);
    }
    let total = qg.dim(0)?;
    let g = qg.reshape((total, nh, 2 * hd))?.narrow(2, hd, hd)?.contiguous()?.reshape((total, nh * hd))?;
    let att = att.transpose(0, 1)?.reshape((total, nh * hd))?;
    Ok((att * candle_nn::ops::sigmoid(&g)?)?)
}

/// Whether the CUDA glue runs (`TANDEM_ATTN_GLUE=0`: candle's ops, for comparisons).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_ATTN_GLUE").as_deref() != Ok("0"))
}

/// Whether the kernels take heads of `hd` values with the first `rot` rotated in `style`: a
/// block of `hd` threads (a multiple of 32, at most 256: the sum order of `rmsnorm_rows`),
/// NeoX pairs.
pub fn fits(hd: usize, rot: usize, style: RopeStyle) -> bool {
    style == RopeStyle::Half && hd.is_multiple_of(32) && (32..=256).contains(&hd) && rot <= hd && rot.is_multiple_of(2)
}

/// The plain definition of [`cuda::prep`] for one token: `q` holds `nh` heads of `[query |
/// gate]` (2 hd values each) when `gated`, else of the queries alone (`cuda::prep_plain`),
/// `k` and `v` `nkv` heads of hd; `norms` the per-head RMSNorm weights of q and k, if any;
/// `pos` the token's position. Returns (q heads, k heads, v heads), each `heads x hd` values.
#[allow(clippy::too_many_arguments)]
pub fn reference_prep(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    norms: Option<(&[f32], &[f32])>,
    gated: bool,
    eps: f32,
    pos: usize,
    inv_freq: &[f32],
    (nh, nkv, hd): (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rot = 2 * inv_freq.len();
    let head = |x: &[f32], w: Option<&[f32]>| -> Vec<f32> {
        let y: Vec<f32> = match w {
            Some(w) => {
                let ss: f64 = x.iter().map(|&a| (a as f64) * (a as f64)).sum();
                let inv = 1.0 / (ss / hd as f64 + eps as f64).sqrt();
                x.iter().zip(w).map(|(&a, &b)| (a as f64 * inv * b as f64) as f32).collect()
            }
            None => x.to_vec(),
        };
        let mut r = rope_reference(&y[..rot], pos, inv_freq, RopeStyle::Half);
        r.extend_from_slice(&y[rot..]);
        r
    };
    let qhead = if gated { 2 * hd } else { hd };
    let (wq, wk) = (norms.map(|n| n.0), norms.map(|n| n.1));
    let qo = (0..nh).flat_map(|h| head(&q[h * qhead..h * qhead + hd], wq)).collect();
    let ko = (0..nkv).flat_map(|h| head(&k[h * hd..(h + 1) * hd], wk)).collect();
    (qo, ko, v[..nkv * hd].to_vec())
}

/// The plain definition of [`cuda::gate`] for one token: `att` its `nh x hd` attention
/// outputs, `q` its projection row (the gates at `h * 2 hd + hd ..`).
pub fn reference_gate(att: &[f32], q: &[f32], nh: usize, hd: usize) -> Vec<f32> {
    (0..nh * hd)
        .map(|i| {
            let (h, d) = (i / hd, i % hd);
            let g = q[h * 2 * hd + hd + d] as f64;
            (att[i] as f64 / (1.0 + (-g).exp())) as f32
        })
        .collect()
}

#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::{DType, Tensor};

    use crate::error::{ModelError, Result};
    use crate::ops::cuda_module::LoadKernel as _;
    use crate::ops::cuda_util::{alloc_f32, cuda_device, f32_rows, i32_of, run, tensor, Inputs};

    fn ptx() -> tandem_kernels::Module {
        tandem_kernels::ptx(tandem_kernels::ATTN_GLUE)
    }

    /// Head-major `(q [nh, total, hd], k [nkv, total, hd], v [nkv, total, hd])` from the
    /// projection's rows `qg [total, 2 nh hd]` (per head `[query | gate]`), `k`, `v` `[total,
    /// nkv hd]` (column views read in place), with the norms' weights `wq`, `wk` (`hd`, already
    /// `1 + w`) and the tokens' `cos`, `sin` rows `[total, rot / 2]`. Needs
    /// [`super::fits`]`(hd, rot, Half)`.
    #[allow(clippy::too_many_arguments)]
    pub fn prep(
        qg: &Tensor,
        k: &Tensor,
        v: &Tensor,
        wq: &Tensor,
        wk: &Tensor,
        eps: f32,
        cos: &Tensor,
        sin: &Tensor,
        dims: (usize, usize, usize),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        prep_heads(qg, k, v, Some((wq, wk)), true, eps, cos, sin, dims)
    }

    /// [`prep`] for a plain (Llama-family) attention layer: `q [total, nh hd]` holds only the
    /// queries, and q and k are normed per head with `norms` (`wq`, `wk`: `hd` values) only
    /// where the model has such norms (Qwen3), with `rmsnorm_rows`' bits: one launch for the
    /// norms, both rotations and the head-major copies of q, k and v.
    #[allow(clippy::too_many_arguments)]
    pub fn prep_plain(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        norms: Option<(&Tensor, &Tensor)>,
        eps: f32,
        cos: &Tensor,
        sin: &Tensor,
        dims: (usize, usize, usize),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        prep_heads(q, k, v, norms, false, eps, cos, sin, dims)
    }

    #[allow(clippy::too_many_arguments)]
    fn prep_heads(
        qg: &Tensor,
        k: &Tensor,
        v: &Tensor,
        norms: Option<(&Tensor, &Tensor)>,
        gated: bool,
        eps: f32,
        cos: &Tensor,
        sin: &Tensor,
        (nh, nkv, hd): (usize, usize, usize),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let dev = cuda_device(qg).ok_or_else(|| ModelError::Input("attention glue: not a CUDA tensor".into()))?;
        let total = qg.dim(0)?;
        let rot = 2 * cos.dim(1)?;
        let qhead = if gated { 2 * hd } else { hd };
        let shapes_ok = qg.dims() == [total, nh * qhead]
            && k.dims() == [total, nkv * hd]
            && v.dims() == [total, nkv * hd]
            && norms.is_none_or(|(wq, wk)| wq.elem_count() == hd && wk.elem_count() == hd)
            && cos.dims() == [total, rot / 2]
            && sin.dims() == cos.dims()
            && super::fits(hd, rot, crate::config::RopeStyle::Half);
        if !shapes_ok {
            return Err(ModelError::Input(format!(
                "attention glue: q {:?}, k {:?}, v {:?}, cos {:?} for {nh} / {nkv} heads of {hd}",
                qg.dims(),
                k.dims(),
                v.dims(),
                cos.dims()
            )));
        }
        let qo = alloc_f32(&dev, nh * total * hd)?;
        let ko = alloc_f32(&dev, nkv * total * hd)?;
        let vo = alloc_f32(&dev, nkv * total * hd)?;
        if total > 0 {
            let (rows, lds): (Vec<Tensor>, Vec<usize>) =
                [qg, k, v].into_iter().map(f32_rows).collect::<Result<Vec<_>>>()?.into_iter().unzip();
            let f32c = |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(DType::F32)?.contiguous()?) };
            // cos, sin, then the norms' weights where the layer has them.
            let rest = [cos, sin].into_iter().chain(norms.into_iter().flat_map(|(wq, wk)| [wq, wk])).map(f32c);
            let ts: Vec<Tensor> = rows.into_iter().map(Ok).chain(rest).collect::<Result<_>>()?;
            let inputs = Inputs::new_rows(&ts.iter().collect::<Vec<_>>())?;
            let view = |i: usize| inputs.view::<f32>(i);
            let (qv, kv, vv, cv, sv) = (view(0)?, view(1)?, view(2)?, view(3)?, view(4)?);
            let weights = if norms.is_some() { Some((view(5)?, view(6)?)) } else { None };
            let [ldq, ldk, ldv] = [lds[0], lds[1], lds[2]].map(|l| l as i64);
            let (ti, nhi, hdi, roti, qhi) = (i32_of(total)?, i32_of(nh)?, i32_of(hd)?, i32_of(rot)?, i32_of(qhead)?);
            let grid_x = u32::try_from(total).map_err(|_| ModelError::Input("attention glue: too many rows".into()))?;
            let null = 0u64;
            let f = dev.kernel("attn_prep", ptx())?;
            let mut b = f.builder();
            b.arg(&qo).arg(&ko).arg(&vo).arg(&qv).arg(&ldq).arg(&kv).arg(&ldk).arg(&vv).arg(&ldv);
            match &weights {
                Some((wqv, wkv)) => b.arg(wqv).arg(wkv),
                None => b.arg(&null).arg(&null),
            };
            b.arg(&cv).arg(&sv).arg(&eps).arg(&ti).arg(&nhi).arg(&hdi).arg(&roti).arg(&qhi);
            let cfg = LaunchConfig {
                grid_dim: (grid_x, (nh + nkv) as u32, 1),
                block_dim: (hd as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: arguments in attn_prep's order; qg, k, v hold `total` rows ldq / ldk / ldv
            // apart of at least nh qhead / nkv hd values (checked shapes, f32_rows); wq, wk hd
            // values or null (no norms), cos / sin total x rot / 2; the outputs nh (nkv) x total
            // x hd; a block of hd threads (<= 256, a multiple of 32: fits) per (token, head).
            unsafe { run(&mut b, cfg, "attn_prep")? };
        }
        Ok((tensor(qo, &dev, (nh, total, hd)), tensor(ko, &dev, (nkv, total, hd)), tensor(vo, &dev, (nkv, total, hd))))
    }

    /// `att [nh, total, hd] * sigmoid(gate)` as token-major rows `[total, nh hd]`, the gates read
    /// in place from `qg [total, 2 nh hd]` (per head `[query | gate]`).
    pub fn gate(att: &Tensor, qg: &Tensor, nh: usize, hd: usize) -> Result<Tensor> {
        let dev = cuda_device(att).ok_or_else(|| ModelError::Input("attention gate: not a CUDA tensor".into()))?;
        let total = qg.dim(0)?;
        if att.dims() != [nh, total, hd] || qg.dims() != [total, 2 * nh * hd] {
            return Err(ModelError::Input(format!("attention gate: att {:?}, q {:?}", att.dims(), qg.dims())));
        }
        let out = alloc_f32(&dev, total * nh * hd)?;
        if total > 0 {
            let (qr, ldq) = f32_rows(qg)?;
            let att = att.to_dtype(DType::F32)?.contiguous()?;
            let inputs = Inputs::new_rows(&[&att, &qr])?;
            let (av, qv) = (inputs.view::<f32>(0)?, inputs.view::<f32>(1)?);
            let (ti, nhi, hdi, ldq) = (i32_of(total)?, i32_of(nh)?, i32_of(hd)?, ldq as i64);
            let blocks = (total * nh * hd).div_ceil(256).min(4096) as u32;
            let f = dev.kernel("attn_gate", ptx())?;
            let mut b = f.builder();
            b.arg(&out).arg(&av).arg(&qv).arg(&ldq).arg(&ti).arg(&nhi).arg(&hdi);
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: arguments in attn_gate's order; att holds nh x total x hd, qg total rows ldq
            // apart of 2 nh hd values (checked shapes), out total x nh hd.
            unsafe { run(&mut b, cfg, "attn_gate")? };
        }
        Ok(tensor(out, &dev, (total, nh * hd)))
    }
}

/// The plain reference over many tokens: `rows` token rows of the projection (`qs` of 2 nh hd
/// values, nh hd when not `gated`, `ks` / `vs` of nkv hd each), returned head-major like the kernel's outputs.
#[allow(clippy::too_many_arguments)]
pub fn reference_prep_rows(
    qs: &[f32],
    ks: &[f32],
    vs: &[f32],
    norms: Option<(&[f32], &[f32])>,
    gated: bool,
    eps: f32,
    positions: &[usize],
    inv_freq: &[f32],
    (nh, nkv, hd): (usize, usize, usize),
) -> [Vec<f32>; 3] {
    let total = positions.len();
    let (qw, kw) = (if gated { 2 } else { 1 } * nh * hd, nkv * hd);
    let mut out = [vec![0f32; nh * total * hd], vec![0f32; nkv * total * hd], vec![0f32; nkv * total * hd]];
    for (t, &pos) in positions.iter().enumerate() {
        let (q, k, v) = (&qs[t * qw..(t + 1) * qw], &ks[t * kw..(t + 1) * kw], &vs[t * kw..(t + 1) * kw]);
        let (qo, ko, vo) = reference_prep(q, k, v, norms, gated, eps, pos, inv_freq, (nh, nkv, hd));
        for (heads, o, src) in [(nh, 0, &qo), (nkv, 1, &ko), (nkv, 2, &vo)] {
            for h in 0..heads {
                out[o][(h * total + t) * hd..(h * total + t + 1) * hd].copy_from_slice(&src[h * hd..(h + 1) * hd]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::reference_prep_rows;
    use crate::config::{RopeScaling, RopeStyle};
    use crate::ops::rope::Rope;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001)
            .map(|v| v as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// The plain (Llama-family) reference, which check-device holds `cuda::prep_plain` to,
    /// against the CPU path of the Llama layer: per-head RMSNorm where the model has it, then
    /// candle's rope on head-major rows; v passed through head-major.
    #[test]
    fn plain_reference_is_the_llama_layers_cpu_path() -> crate::error::Result<()> {
        let (nh, nkv, hd, t) = (4, 2, 64, 3);
        let positions = [5usize, 6, 700];
        let rope = Rope::new(hd, 5e5, &RopeScaling::None, RopeStyle::Half, None);
        let (qs, ks, vs) = (values(t * nh * hd, 1), values(t * nkv * hd, 2), values(t * nkv * hd, 3));
        let wq: Vec<f32> = values(hd, 4).iter().map(|w| 1.0 + 0.5 * w).collect();
        let wk: Vec<f32> = values(hd, 5).iter().map(|w| 1.0 + 0.5 * w).collect();
        let dev = Device::Cpu;
        let (cos, sin) = rope.tables(&positions, &dev)?;
        for norms in [false, true] {
            let host_norms = norms.then_some((wq.as_slice(), wk.as_slice()));
            let want =
                reference_prep_rows(&qs, &ks, &vs, host_norms, false, 1e-6, &positions, rope.inv_freq(), (nh, nkv, hd));
            let heads = |x: &[f32], n: usize, w: &[f32]| -> crate::error::Result<Vec<f32>> {
                let mut x = Tensor::from_vec(x.to_vec(), (t, n, hd), &dev)?;
                if norms {
                    x = crate::ops::norm::rms_norm(&x, &Tensor::from_slice(w, hd, &dev)?, 1e-6)?;
                }
                let x = rope.apply(&x.transpose(0, 1)?.contiguous()?.unsqueeze(0)?, &cos, &sin)?;
                Ok(x.flatten_all()?.to_vec1::<f32>()?)
            };
            let v = Tensor::from_vec(vs.clone(), (t, nkv, hd), &dev)?.transpose(0, 1)?.contiguous()?;
            let got = [heads(&qs, nh, &wq)?, heads(&ks, nkv, &wk)?, v.flatten_all()?.to_vec1::<f32>()?];
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.len(), w.len());
                let err = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(err < 1e-5, "norms {norms}: max |diff| {err}");
            }
        }
        Ok(())
    }
}
