//! The op checks: each op on the device against its CPU reference over several shapes, plus
//! row invariance (a row computed inside a multi-row call has the bits of the row alone).

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Tensor};

use super::{bits_err, rel_err, rel_err_slices, timed, Check, Judge, Rng};
use crate::error::Result;
use crate::kv::{KvDtype, LayerCacheSpec, PagedKvStore};
use crate::ops::gdn::{self, GdnDims};
use crate::ops::quant::row_stable;

/// Every op check on `dev`.
pub fn run(dev: &Device) -> Vec<Check> {
    run_selected(dev, &|_| true)
}

/// One op family's checks, appended to the list.
type Family = fn(&Device, &mut Vec<Check>);

/// The op families whose group name (`ops/<family>`, [`super::GROUPS`]) `on` accepts.
pub fn run_selected(dev: &Device, on: &dyn Fn(&str) -> bool) -> Vec<Check> {
    let mut out = Vec::new();
    let families: [(&str, Family); 8] = [
        ("ops/paged_attention", paged_attention),
        ("ops/kv_encode", kv_encode),
        ("ops/gdn_conv", gdn_conv),
        ("ops/gdn_delta", gdn_delta),
        ("ops/norms", norms),
        ("ops/dense", dense),
        ("ops/quantised", super::quant::quantised),
        ("ops/embedding", super::quant::embedding),
    ];
    for (name, family) in families {
        if on(name) {
            family(dev, &mut out);
        }
    }
    out
}

pub(super) fn push(out: &mut Vec<Check>, op: &str, shape: String, format: &str, r: Result<Vec<Check>>) {
    match r {
        Ok(c) => out.extend(c),
        Err(e) => out.push(Check::error(op, shape, format, e)),
    }
}

pub(super) fn tensor(rng: &mut Rng, shape: &[usize], dev: &Device) -> Result<Tensor> {
    let n = shape.iter().product();
    Ok(Tensor::from_vec(rng.vec(n), shape, dev)?)
}

// ---- paged attention -------------------------------------------------------------------

/// `(heads, kv heads, head dim, past, new rows, sliding window)` (window 0: none; the
/// windowed rows are Gemma 3's local layers, 270M's shape among them).
const ATTN_SHAPES: [(usize, usize, usize, usize, usize, usize); 10] = [
    (4, 4, 64, 0, 7, 0),
    (8, 2, 128, 37, 1, 0),
    (8, 2, 128, 300, 5, 0),
    (16, 4, 256, 1000, 1, 0),
    (6, 2, 80, 50, 17, 0),
    (4, 1, 32, 90, 40, 0),
    (4, 1, 256, 1000, 1, 512),
    (4, 1, 256, 600, 9, 512),
    (8, 2, 128, 300, 5, 30),
    (4, 1, 32, 90, 40, 8),
];

fn paged_attention(dev: &Device, out: &mut Vec<Check>) {
    for kv in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
        for (nh, nkv, hd, past, t, w) in ATTN_SHAPES {
            if kv.is_quantized() && hd % 32 != 0 {
                continue;
            }
            let win = if w > 0 { format!(" window{w}") } else { String::new() };
            let shape = format!("h{nh}/{nkv} d{hd} past{past} t{t}{win}");
            let fmt = kv.to_string();
            let case = attn_case(dev, kv, (nh, nkv, hd, past, t, w), &shape);
            push(out, "paged_attention", shape.clone(), &fmt, case);
        }
    }
}

/// The device's KV row encoders against the CPU's, byte for byte (the store uses the device
/// encoder only for formats that pass here on the project's GPU; see kv/paged.rs).
fn kv_encode(dev: &Device, out: &mut Vec<Check>) {
    #[cfg(feature = "cuda")]
    if dev.is_cuda() {
        for kv in [KvDtype::Q8_0, KvDtype::Q4_0] {
            let r = (|| -> Result<Check> {
                let (rows, hd) = (257, 128);
                let mut rng = Rng(kv as u64 + 77);
                // Values of every scale, exact zeros and ties of magnitude included.
                let mut x = rng.vec(rows * hd);
                for (i, v) in x.iter_mut().enumerate() {
                    match i % 97 {
                        0 => *v = 0.0,
                        1 => *v = -*v,
                        _ => *v *= 10f32.powi((i / hd % 7) as i32 - 3),
                    }
                }
                x[..hd].fill(0.0);
                let want = kv.quantize_rows(&x, hd)?;
                let xt = Tensor::from_vec(x.clone(), (rows, hd), dev)?;
                let got = crate::ops::paged_attention::cuda::encode_rows(&xt, kv)?.flatten_all()?.to_vec1::<u8>()?;
                let bb = kv.block_bytes();
                let diff = got.chunks(bb).zip(want.chunks(bb)).position(|(a, b)| a != b);
                let mut c = Check::new(
                    "kv_encode",
                    format!("{rows} rows d{hd}"),
                    &kv.to_string(),
                    diff.map_or(0.0, |_| 1.0),
                    Judge::Exact,
                    0.0,
                );
                if let Some(b) = diff {
                    let n_bad = got.chunks(bb).zip(want.chunks(bb)).filter(|(a, b)| a != b).count();
                    c = c.with_note(format!(
                        "{n_bad} blocks differ; first {b}: device {:?} cpu {:?} input {:?}",
                        &got[b * bb..(b + 1) * bb],
                        &want[b * bb..(b + 1) * bb],
                        &x[b * 32..b * 32 + 32]
                    ));
                }
                Ok(c)
            })();
            match r {
                Ok(c) => out.push(c),
                Err(e) => out.push(Check::error("kv_encode", String::new(), &kv.to_string(), e)),
            }
        }
    }
    let _ = (dev, &out);
}

fn attn_case(
    dev: &Device,
    kv: KvDtype,
    (nh, nkv, hd, past, t, window): (usize, usize, usize, usize, usize, usize),
    shape: &str,
) -> Result<Vec<Check>> {
    const BS: usize = 16;
    let len = past + t;
    let spec = [match window {
        0 => LayerCacheSpec::Attention { kv_heads: nkv, head_dim: hd },
        w => LayerCacheSpec::SlidingWindow { kv_heads: nkv, head_dim: hd, window: w },
    }];
    let nb = len.div_ceil(BS);
    // Scattered, out-of-order blocks.
    let blocks: Vec<u32> = (0..nb as u32).map(|i| (i * 7 + 3) % (2 * nb as u32 + 1)).collect();
    let pool_blocks = 2 * nb + 1;
    let mut rng = Rng(0x5eed ^ (nh * 131 + hd * 7 + past) as u64);
    let kd = rng.vec(nkv * len * hd);
    let vd = rng.vec(nkv * len * hd);
    let qd = rng.vec(nh * t * hd);
    let scale = 1.0 / (hd as f64).sqrt();
    let run = |d: &Device| -> Result<(Tensor, Tensor, f64, PagedKvStore)> {
        let store = PagedKvStore::new(&spec, pool_blocks, BS, kv, d)?;
        let k = Tensor::from_slice(&kd, (nkv, len, hd), d)?;
        let v = Tensor::from_slice(&vd, (nkv, len, hd), d)?;
        store.write(0, &blocks, 0, &k, &v)?;
        let q = Tensor::from_slice(&qd, (nh, t, hd), d)?;
        let (o, ms) = timed(d, || store.attend(0, &blocks, past, &q, scale))?;
        Ok((o, q, ms, store))
    };
    // Reference: the plain materialised attention over the decoded cache (CPU).
    let want = {
        let (_, q, _, store) = run(&Device::Cpu)?;
        let (k, v) = store.read(0, &blocks, len)?;
        crate::ops::causal_attention(&q, &k, &v, scale, window)?
    };
    let (got, q, ms, store) = run(dev)?;
    let tol = if kv.is_quantized() { 1e-4 } else { 2e-5 };
    let mut checks = vec![Check::new(
        "paged_attention",
        shape.into(),
        &kv.to_string(),
        rel_err(&got, &want)?,
        Judge::Tolerance(tol),
        ms,
    )];
    if !dev.is_cpu() {
        // The device wrote the cache rows the CPU would have written, bit for bit.
        let (_, _, _, cpu_store) = run(&Device::Cpu)?;
        let (kc, vc) = cpu_store.read(0, &blocks, len)?;
        let (kg, vg) = store.read(0, &blocks, len)?;
        let e = bits_err(&kg, &kc)?.max(bits_err(&vg, &vc)?);
        let mut c = Check::new("kv_write", shape.into(), &kv.to_string(), e, Judge::Exact, 0.0);
        if e != 0.0 {
            let (a, b) = (super::host_f32(&kg)?, super::host_f32(&kc)?);
            if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
                let src = kd[(i / hd) * hd..(i / hd) * hd + hd.min(8)].to_vec();
                c = c.with_note(format!("first difference at {i}: device {} cpu {} (row starts {src:?})", a[i], b[i]));
            }
        }
        checks.push(c);
    }
    // Row invariance: every row of the chunk equals the same row attended alone (decode).
    if t > 1 && t <= crate::kv::paged::SMALL_CHUNK {
        let mut worst = 0f32;
        for i in 0..t {
            let qi = q.narrow(1, i, 1)?.contiguous()?;
            let alone = store.attend(0, &blocks, past + i, &qi, scale)?;
            worst = worst.max(bits_err(&got.narrow(1, i, 1)?, &alone)?);
        }
        checks.push(Check::new("paged_attention rows", shape.into(), &kv.to_string(), worst, Judge::Exact, 0.0));
    }
    Ok(checks)
}

// ---- GDN -------------------------------------------------------------------------------

fn gdn_conv(dev: &Device, out: &mut Vec<Check>) {
    for (ch, k, t, lanes) in [
        (96, 4, 1, false),
        (96, 4, 7, true),
        (6144, 4, 64, false),
        (6144, 4, 5, true),
        (40, 2, 3, true),
        (8192, 4, 100, true),
    ] {
        let shape = format!("ch{ch} k{k} t{t}{}", if lanes { " lanes" } else { "" });
        push(out, "gdn_conv", shape.clone(), "f32", conv_case(dev, ch, k, t, lanes, &shape));
    }
}

fn conv_case(dev: &Device, ch: usize, k: usize, t: usize, lanes: bool, shape: &str) -> Result<Vec<Check>> {
    let mut rng = Rng((ch * 31 + t) as u64 | 1);
    let (x, st, w) = (rng.vec(t * ch), rng.vec((k - 1) * ch), rng.vec(ch * k));
    // Reference: the slice kernel one token at a time (its state after each token = lanes).
    let mut state = st.clone();
    let (mut want_y, mut want_lanes) = (Vec::new(), Vec::new());
    for i in 0..t {
        want_y.extend(gdn::causal_conv_silu(&x[i * ch..(i + 1) * ch], &mut state, &w, ch, k));
        want_lanes.extend_from_slice(&state);
    }
    let xt = Tensor::from_slice(&x, (t, ch), dev)?;
    let stt = Tensor::from_slice(&st, (k - 1, ch), dev)?;
    let wt = Tensor::from_slice(&w, (ch, k), dev)?;
    let mut checks = Vec::new();
    let mut one = |name: &str, f: &dyn Fn() -> Result<(Tensor, Tensor, Option<Tensor>)>| -> Result<()> {
        let ((y, next, l), ms) = timed(dev, f)?;
        let mut e =
            rel_err_slices(&super::host_f32(&y)?, &want_y).max(rel_err_slices(&super::host_f32(&next)?, &state));
        if let Some(l) = l {
            e = e.max(rel_err_slices(&super::host_f32(&l)?, &want_lanes));
        }
        checks.push(Check::new(name, shape.into(), "f32", e, Judge::Tolerance(1e-5), ms));
        Ok(())
    };
    one("gdn_conv", &|| gdn::device::conv_silu(&xt, &stt, &wt, lanes))?;
    if !dev.is_cpu() {
        one("gdn_conv portable", &|| gdn::portable::conv_silu(&xt, &stt, &wt, lanes))?;
    }
    if t > 1 {
        // The call cut in two (the state carried between them) gives the same bits: on CUDA the
        // long call runs in token tiles, each starting from the inputs before it.
        let cut = t.min(17) - 1;
        let e = (|| -> Result<f32> {
            let (y, s, l) = gdn::device::conv_silu(&xt, &stt, &wt, lanes)?;
            let (y1, s1, l1) = gdn::device::conv_silu(&xt.narrow(0, 0, cut)?, &stt, &wt, lanes)?;
            let (y2, s2, l2) = gdn::device::conv_silu(&xt.narrow(0, cut, t - cut)?, &s1, &wt, lanes)?;
            let mut same = Tensor::cat(&[&y1, &y2], 0)?.flatten_all()?.to_vec1::<f32>()?
                == y.flatten_all()?.to_vec1::<f32>()?
                && s.flatten_all()?.to_vec1::<f32>()? == s2.flatten_all()?.to_vec1::<f32>()?;
            if let (Some(l), Some(l1), Some(l2)) = (l, l1, l2) {
                same &= Tensor::cat(&[&l1, &l2], 0)?.flatten_all()?.to_vec1::<f32>()?
                    == l.flatten_all()?.to_vec1::<f32>()?;
            }
            Ok(if same { 0.0 } else { 1.0 })
        })();
        let e = e?;
        checks.push(Check::new("gdn_conv cut", shape.into(), "f32", e, Judge::Exact, 0.0));
    }
    Ok(checks)
}

fn gdn_delta(dev: &Device, out: &mut Vec<Check>) {
    let cases = [
        (GdnDims { nk: 2, nv: 4, dk: 16, dv: 24 }, 1, false),
        (GdnDims { nk: 2, nv: 4, dk: 16, dv: 24 }, 9, true),
        (GdnDims { nk: 16, nv: 32, dk: 128, dv: 128 }, 1, false),
        (GdnDims { nk: 16, nv: 32, dk: 128, dv: 128 }, 5, true),
        (GdnDims { nk: 16, nv: 16, dk: 128, dv: 128 }, 64, false),
        (GdnDims { nk: 4, nv: 8, dk: 64, dv: 64 }, 3, true),
        (GdnDims { nk: 2, nv: 2, dk: 256, dv: 128 }, 4, false),
    ];
    for (d, t, lanes) in cases {
        let shape = format!("k{}x{} v{}x{} t{t}{}", d.nk, d.dk, d.nv, d.dv, if lanes { " lanes" } else { "" });
        push(out, "gdn_delta", shape.clone(), "f32", delta_case(dev, d, t, lanes, &shape));
    }
}

fn delta_case(dev: &Device, d: GdnDims, t: usize, lanes: bool, shape: &str) -> Result<Vec<Check>> {
    let mut rng = Rng((d.dk * 17 + d.nv * 5 + t) as u64 | 1);
    let mut q = rng.vec(t * d.nk * d.dk);
    let mut k = rng.vec(t * d.nk * d.dk);
    gdn::l2_normalize(&mut q, d.dk, 1e-6);
    gdn::l2_normalize(&mut k, d.dk, 1e-6);
    let qs = (d.dk as f32).powf(-0.5);
    q.iter_mut().for_each(|x| *x *= qs);
    let v = rng.vec(t * d.nv * d.dv);
    let beta: Vec<f32> = rng.vec(t * d.nv).iter().map(|x| 0.5 + 0.45 * x).collect();
    let g: Vec<f32> = rng.vec(t * d.nv).iter().map(|x| -0.3 * (x + 1.0)).collect();
    let s0: Vec<f32> = rng.vec(d.state_len()).iter().map(|x| 0.1 * x).collect();
    let mut s = s0.clone();
    let (want_o, want_states) = gdn::gated_delta_recurrent_states(&q, &k, &v, &beta, &g, &mut s, d);
    let tq = Tensor::from_slice(&q, (t, d.nk, d.dk), dev)?;
    let tk = Tensor::from_slice(&k, (t, d.nk, d.dk), dev)?;
    let tv = Tensor::from_slice(&v, (t, d.nv, d.dv), dev)?;
    let tb = Tensor::from_slice(&beta, (t, d.nv), dev)?;
    let tg = Tensor::from_slice(&g, (t, d.nv), dev)?;
    let ts = Tensor::from_slice(&s0, (d.nv, d.dk, d.dv), dev)?;
    let want_lanes = want_states.concat();
    let mut checks = Vec::new();
    let mut one = |name: &str, f: &dyn Fn() -> Result<(Tensor, Tensor, Option<Tensor>)>| -> Result<()> {
        let ((o, next, l), ms) = timed(dev, f)?;
        let mut e = rel_err_slices(&super::host_f32(&o)?, &want_o).max(rel_err_slices(&super::host_f32(&next)?, &s));
        if let Some(l) = l {
            e = e.max(rel_err_slices(&super::host_f32(&l)?, &want_lanes));
        }
        checks.push(Check::new(name, shape.into(), "f32", e, Judge::Tolerance(1e-4), ms));
        Ok(())
    };
    one("gdn_delta", &|| gdn::device::delta_rule(&tq, &tk, &tv, &tb, &tg, &ts, d, lanes))?;
    if !dev.is_cpu() && t <= 16 {
        one("gdn_delta portable", &|| gdn::portable::delta_rule(&tq, &tk, &tv, &tb, &tg, &ts, d, lanes))?;
    }
    Ok(checks)
}

fn norms(dev: &Device, out: &mut Vec<Check>) {
    let shape = "rows 64 x 128".to_string();
    let r = (|| -> Result<Vec<Check>> {
        let mut rng = Rng(99);
        let (o, z, w) = (rng.vec(64 * 128), rng.vec(64 * 128), rng.vec(128));
        let mut want = o.clone();
        gdn::gated_rms_norm(&mut want, &z, &w, 1e-6);
        let (got, ms) = timed(dev, || {
            gdn::portable::gated_rms_norm(
                &Tensor::from_slice(&o, (64, 128), dev)?,
                &Tensor::from_slice(&z, (64, 128), dev)?,
                &Tensor::from_slice(&w, 128, dev)?,
                1e-6,
            )
        })?;
        let mut checks = vec![Check::new(
            "gated_rms_norm",
            shape.clone(),
            "f32",
            rel_err_slices(&super::host_f32(&got)?, &want),
            Judge::Tolerance(1e-5),
            ms,
        )];
        let mut want = o.clone();
        gdn::l2_normalize(&mut want, 128, 1e-6);
        let (got, ms) = timed(dev, || gdn::portable::l2_normalize(&Tensor::from_slice(&o, (64, 128), dev)?, 1e-6))?;
        checks.push(Check::new(
            "l2_norm",
            shape.clone(),
            "f32",
            rel_err_slices(&super::host_f32(&got)?, &want),
            Judge::Tolerance(1e-5),
            ms,
        ));
        let xs: Vec<f32> = o.iter().map(|x| x * 30.0).collect();
        let want: Vec<f32> = xs.iter().map(|&x| if x > 20.0 { x } else { x.exp().ln_1p() }).collect();
        let (got, ms) = timed(dev, || gdn::portable::softplus(&Tensor::from_slice(&xs, xs.len(), dev)?))?;
        checks.push(Check::new(
            "softplus",
            shape.clone(),
            "f32",
            rel_err_slices(&super::host_f32(&got)?, &want),
            Judge::Tolerance(1e-5),
            ms,
        ));
        Ok(checks)
    })();
    push(out, "norms", shape, "f32", r);
}

// ---- matmuls ---------------------------------------------------------------------------

fn dense(dev: &Device, out: &mut Vec<Check>) {
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (m, n, k) in [
            (1, 2048, 1024),
            (5, 1000, 768),
            (40, 512, 2048),
            (9, 301, 100),
            (33, 301, 100),
            (3, 64, 16),
            (20, 72, 4096),
            (100, 96, 512),
            // 7 steps of 32 (one-step segments, partitions of one step each: a pipelined bf16
            // GEMM stage of two steps spans partitions) and 37 steps (segments of 4, the last short).
            (70, 40, 224),
            (24, 33, 1184),
            // The split bf16 GEMM's edges (tmmk_bf16: 17-128 rows, 64 x 64 tiles) and past it.
            (128, 136, 2080),
            (129, 72, 512),
            // Past it (tmmg_bf16, or on Hopper tmmw_bf16's 128-row / tmmw_bf16_h's 256-row
            // tiles): three row tiles with odd column counts; three steps (five empty
            // partitions) and a column count that is not a multiple of 4.
            (300, 1000, 2080),
            (257, 130, 96),
        ] {
            if dev.is_cpu() && dt != DType::F32 {
                continue; // the CPU path keeps dense weights in f32
            }
            let shape = format!("m{m} n{n} k{k}");
            let fmt = format!("{dt:?}").to_lowercase();
            push(out, "dense_matmul", shape.clone(), &fmt, dense_case(dev, dt, m, n, k, &shape, &fmt));
        }
    }
}

fn dense_case(dev: &Device, dt: DType, m: usize, n: usize, k: usize, shape: &str, fmt: &str) -> Result<Vec<Check>> {
    let mut rng = Rng((m * 7 + n + k) as u64);
    let w_cpu = tensor(&mut rng, &[n, k], &Device::Cpu)?.to_dtype(dt)?;
    let x_cpu = tensor(&mut rng, &[m, k], &Device::Cpu)?;
    // Reference: f64 products of the weights as stored (and of the activations rounded to bf16
    // where the tensor-core kernels carry them so: `--bf16-activations bf16`).
    let x_ref =
        if bf16_mma(dev, dt, k) && bf16_rounded_activations() { x_cpu.to_dtype(DType::BF16)? } else { x_cpu.clone() };
    let want = x_ref.to_dtype(DType::F64)?.matmul(&w_cpu.to_dtype(DType::F64)?.t()?)?;
    let w = QMatMul::Tensor(w_cpu.to_device(dev)?);
    let x = x_cpu.to_device(dev)?;
    let (got, ms) = timed(dev, || Ok(row_stable::forward(&w, &x)?))?;
    // bf16 weights on the tensor cores carry the activations as two bf16 halves (~16 bits).
    let tol = if bf16_mma(dev, dt, k) { 1e-4 } else { 1e-5 };
    let mut checks =
        vec![Check::new("dense_matmul", shape.into(), fmt, rel_err(&got, &want)?, Judge::Tolerance(tol), ms)];
    if m > 1 {
        let alone = row_stable::forward(&w, &x.narrow(0, m - 1, 1)?)?;
        checks.push(Check::new(
            "dense_matmul rows",
            shape.into(),
            fmt,
            bits_err(&got.narrow(0, m - 1, 1)?, &alone)?,
            Judge::Exact,
            0.0,
        ));
    }
    if m > 3 {
        // A middle row inside a 3-row call (another place in the tile) against the whole call.
        let mid = m / 2;
        let three = row_stable::forward(&w, &x.narrow(0, mid - 1, 3)?)?;
        checks.push(Check::new(
            "dense_matmul rows 3 vs m",
            shape.into(),
            fmt,
            bits_err(&got.narrow(0, mid, 1)?, &three.narrow(0, 1, 1)?)?,
            Judge::Exact,
            0.0,
        ));
    }
    Ok(checks)
}

/// Whether the bf16 tensor-core kernels round activations to bf16 (`--bf16-activations bf16`).
fn bf16_rounded_activations() -> bool {
    use crate::ops::quant::bf16_act::{activations, Bf16Activations};
    activations() == Bf16Activations::Bf16
}

/// Whether a `dt` matrix of rows of `k` runs on the bf16 tensor-core kernels on `dev`.
fn bf16_mma(dev: &Device, dt: DType, k: usize) -> bool {
    #[cfg(feature = "cuda")]
    if dev.is_cuda() {
        return dt == DType::BF16 && crate::ops::quant::cuda_tmma::enabled() && k.is_multiple_of(32);
    }
    let _ = (dev, dt, k);
    false
}
