//! Writing MLX-format checkpoints (`tandem convert --mlx`): a Hugging Face safetensors
//! directory written as mlx-lm loads it, its matrices affine-quantised (`weight` as packed
//! uint32 words, `scales` and `biases` in f16 per group: `w = scale * q + bias`), with the
//! `quantization` block in `config.json`, and the MTP head kept (mlx-lm's own converter drops
//! `mtp.*`; it goes to `mtp.safetensors`, which the index lists for tandem and mlx-lm's
//! `model*.safetensors` glob leaves out).
//!
//! The layout is mlx-lm's sanitised one where mlx-lm needs it: for the hybrids the GDN conv
//! as `[C, K, 1]` and the zero-centred norms stored as `1 + w` (mlx-lm's `norm_keys`), and MoE
//! experts stacked as `mlp.switch_mlp.{gate,up,down}_proj` (`[E, n, k]`, from HF's fused
//! `experts.gate_up_proj` or per-expert tensors), so that scales and biases sit beside the
//! stacks they belong to. Names otherwise stay the checkpoint's. Every 2-D (and stacked 3-D)
//! `.weight` whose rows are whole groups is quantised, the rest keeps its dtype; scales and
//! biases are f16, so tandem reads 2-4-bit weights back as Q4_1 exactly (`loader/mlx.rs`).
//! [`quantize_rows`] and [`pack`] are the plain maths, tested against `mlx::unpack` /
//! `mlx::dequantize`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use half::f16;

use crate::error::{ModelError, Result};

/// Width and group size of the affine quantisation to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlxWriteOptions {
    pub bits: usize,
    pub group: usize,
}

impl Default for MlxWriteOptions {
    /// mlx-lm's default: 4 bits in groups of 64.
    fn default() -> Self {
        Self { bits: 4, group: 64 }
    }
}

/// What [`write_mlx`] wrote.
#[derive(Debug, Clone, Default)]
pub struct MlxWriteSummary {
    pub quantised: usize,
    pub kept: usize,
    pub mtp_tensors: usize,
    pub bytes: u64,
}

/// Packs rows of `k` values of `bits` bits (`q` `[n, k]`, each `< 2^bits`) into MLX's words:
/// value j of a row at bit j * bits of the row, low bits first (the inverse of `mlx::unpack`).
pub fn pack(q: &[u8], n: usize, k: usize, bits: usize) -> Result<Vec<u32>> {
    if !(k * bits).is_multiple_of(32) || q.len() != n * k {
        return Err(ModelError::Config(format!("MLX pack: [{n}, {k}] at {bits} bits")));
    }
    let per_row = k * bits / 32;
    let mut out = vec![0u32; n * per_row];
    for (r, row) in q.chunks(k).enumerate() {
        let words = &mut out[r * per_row..(r + 1) * per_row];
        for (j, &v) in row.iter().enumerate() {
            let bit = j * bits;
            let (w, o) = (bit / 32, bit % 32);
            let v = v as u64 & ((1u64 << bits) - 1);
            words[w] |= (v << o) as u32;
            if o + bits > 32 {
                words[w + 1] |= (v >> (32 - o)) as u32;
            }
        }
    }
    Ok(out)
}

/// Affine quantisation of rows `w` `[n, k]` in groups of `group`: per group scale = (max -
/// min) / (2^bits - 1) and bias = min, both rounded to f16 first, then q = round((w - bias) /
/// scale) clamped to 0..2^bits - 1 (0 where the scale is 0). Returns q, scales and biases.
pub fn quantize_rows(
    w: &[f32],
    n: usize,
    k: usize,
    bits: usize,
    group: usize,
) -> Result<(Vec<u8>, Vec<f16>, Vec<f16>)> {
    if w.len() != n * k || group == 0 || !k.is_multiple_of(group) || !(1..=8).contains(&bits) {
        return Err(ModelError::Config(format!("MLX quantise: [{n}, {k}] in groups of {group} at {bits} bits")));
    }
    let top = ((1u32 << bits) - 1) as f32;
    let mut q = Vec::with_capacity(n * k);
    let (mut scales, mut biases) = (Vec::with_capacity(n * k / group), Vec::with_capacity(n * k / group));
    for g in w.chunks(group) {
        let (lo, hi) = g.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        if !lo.is_finite() || !hi.is_finite() {
            return Err(ModelError::Config("MLX quantise: a weight is not finite".into()));
        }
        let s = f16::from_f32((hi - lo) / top);
        let b = f16::from_f32(lo);
        let (sf, bf) = (s.to_f32(), b.to_f32());
        for &x in g {
            let v = if sf > 0.0 { ((x - bf) / sf).round().clamp(0.0, top) } else { 0.0 };
            q.push(v as u8);
        }
        scales.push(s);
        biases.push(b);
    }
    Ok((q, scales, biases))
}

/// Where an output tensor comes from.
enum Source {
    One(String),
    /// Rows `start..start + len` of the second-last axis of a stacked tensor.
    Rows(String, usize, usize),
    Stack(Vec<String>),
}

/// The output tensors and their sources: the checkpoint's names, with the hybrids' experts
/// stacked as `switch_mlp`.
fn plan(names: &[String], hybrid: bool, cfg: &serde_json::Value) -> Result<BTreeMap<String, Source>> {
    let mut out = BTreeMap::new();
    let mut per_expert: BTreeMap<(String, String), BTreeMap<usize, String>> = BTreeMap::new();
    let text = cfg.get("text_config").unwrap_or(cfg);
    for n in names {
        if !hybrid {
            out.insert(n.clone(), Source::One(n.clone()));
            continue;
        }
        if let Some(base) = n.strip_suffix(".experts.gate_up_proj") {
            let i =
                text.get("moe_intermediate_size").and_then(|v| v.as_u64()).ok_or_else(|| {
                    ModelError::Config("config.json: fused experts without moe_intermediate_size".into())
                })? as usize;
            out.insert(format!("{base}.switch_mlp.gate_proj.weight"), Source::Rows(n.clone(), 0, i));
            out.insert(format!("{base}.switch_mlp.up_proj.weight"), Source::Rows(n.clone(), i, i));
        } else if let Some(base) = n.strip_suffix(".experts.down_proj") {
            out.insert(format!("{base}.switch_mlp.down_proj.weight"), Source::One(n.clone()));
        } else if let Some((base, rest)) = n.split_once(".experts.") {
            let (e, tail) = rest.split_once('.').ok_or_else(|| ModelError::Config(format!("{n}: expert name")))?;
            let e: usize = e.parse().map_err(|_| ModelError::Config(format!("{n}: expert index")))?;
            per_expert.entry((base.to_string(), tail.to_string())).or_default().insert(e, n.clone());
        } else {
            out.insert(n.clone(), Source::One(n.clone()));
        }
    }
    for ((base, tail), experts) in per_expert {
        if experts.keys().copied().ne(0..experts.len()) {
            return Err(ModelError::Config(format!("{base}.experts.*.{tail}: experts missing")));
        }
        out.insert(format!("{base}.switch_mlp.{tail}"), Source::Stack(experts.into_values().collect()));
    }
    Ok(out)
}

/// Writes the HF checkpoint in `input` as an MLX-format directory `output` (created; files of
/// the same names replaced): `model.safetensors`, the MTP head's tensors in `mtp.safetensors`
/// with `model.safetensors.index.json` listing both, `config.json` with the `quantization`
/// block, and the tokenizer and other JSON files copied.
pub fn write_mlx(input: &Path, output: &Path, opts: &MlxWriteOptions) -> Result<MlxWriteSummary> {
    let MlxWriteOptions { bits, group } = *opts;
    if !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) || !matches!(group, 32 | 64 | 128) {
        return Err(ModelError::Config(format!(
            "MLX affine quantisation takes 2, 3, 4, 5, 6 or 8 bits in groups of 32, 64 or 128 (not {bits} / {group})"
        )));
    }
    let cfg_path = input.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
    let mut cfg: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::Config(format!("{}: {e}", cfg_path.display())))?;
    if cfg.get("quantization").is_some() {
        return Err(ModelError::Config(format!("{} is already MLX-quantised", input.display())));
    }
    let hybrid = crate::arch::qwen_hybrid::config::is_hybrid(&cfg)
        || cfg.get("text_config").is_some_and(crate::arch::qwen_hybrid::config::is_hybrid);
    let files = super::safetensors::shard_files(input)?;
    // SAFETY: read-only mapping of files tandem does not modify.
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }
        .map_err(|e| ModelError::Config(format!("cannot read safetensors in {}: {e}", input.display())))?;
    let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
    let cpu = Device::Cpu;
    let mut out: HashMap<String, Tensor> = HashMap::new();
    let mut summary = MlxWriteSummary::default();
    for (name, src) in plan(&names, hybrid, &cfg)? {
        let mut t = match &src {
            Source::One(n) => st.load(n, &cpu)?,
            Source::Rows(n, start, len) => {
                let t = st.load(n, &cpu)?;
                let axis = t.rank().checked_sub(2).ok_or_else(|| ModelError::Config(format!("{n}: not stacked")))?;
                t.narrow(axis, *start, *len)?.contiguous()?
            }
            Source::Stack(ns) => {
                let ts = ns.iter().map(|n| st.load(n, &cpu)).collect::<candle_core::Result<Vec<_>>>()?;
                Tensor::stack(&ts, 0)?
            }
        };
        if hybrid && name.ends_with("conv1d.weight") && t.rank() == 3 && t.dim(1)? == 1 {
            t = t.transpose(1, 2)?.contiguous()?; // [C, 1, K] -> [C, K, 1]
        }
        if hybrid && t.rank() == 1 && super::mlx::is_baked_norm(&name) {
            t = (t.to_dtype(DType::F32)? + 1.0)?.to_dtype(t.dtype())?;
        }
        if name.starts_with("mtp.") {
            summary.mtp_tensors += 1;
        }
        let k = *t.dims().last().unwrap_or(&0);
        let quantise = name.ends_with(".weight")
            && matches!(t.rank(), 2 | 3)
            && !name.ends_with("conv1d.weight")
            && k > 0
            && k.is_multiple_of(group)
            && (k * bits).is_multiple_of(32);
        if !quantise {
            summary.kept += 1;
            out.insert(name, t);
            continue;
        }
        let dims = t.dims().to_vec();
        let rows = t.elem_count() / k;
        let w = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let (q, scales, biases) = quantize_rows(&w, rows, k, bits, group)?;
        let words = pack(&q, rows, k, bits)?;
        let lead = &dims[..dims.len() - 1];
        let shape = |last: usize| -> Vec<usize> { lead.iter().copied().chain([last]).collect() };
        let stem = name.strip_suffix(".weight").unwrap_or(&name).to_string();
        out.insert(name.clone(), Tensor::from_vec(words, shape(k * bits / 32), &cpu)?);
        out.insert(format!("{stem}.scales"), Tensor::from_vec(scales, shape(k / group), &cpu)?);
        out.insert(format!("{stem}.biases"), Tensor::from_vec(biases, shape(k / group), &cpu)?);
        summary.quantised += 1;
    }
    std::fs::create_dir_all(output).map_err(|e| ModelError::io(output, e))?;
    // The MTP head in a file of its own, listed by the index (which tandem reads) but not named
    // `model*.safetensors` (which mlx-lm loads, strictly: its Qwen3-Next loader keeps unknown
    // `mtp.*` names when the experts come stacked).
    let (mtp, main): (HashMap<String, Tensor>, HashMap<String, Tensor>) =
        out.into_iter().partition(|(n, _)| n.starts_with("mtp."));
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [("model.safetensors", &main), ("mtp.safetensors", &mtp)] {
        let path = output.join(file);
        if part.is_empty() {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        candle_core::safetensors::save(part, &path)?;
        summary.bytes += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let mut names: Vec<&String> = part.keys().collect();
        names.sort(); // a stable index, whatever the map's order
        for n in names {
            weight_map.insert(n.clone(), serde_json::Value::String(file.into()));
        }
    }
    let index = output.join("model.safetensors.index.json");
    if mtp.is_empty() {
        let _ = std::fs::remove_file(&index);
    } else {
        let v = serde_json::json!({ "metadata": { "format": "mlx" }, "weight_map": weight_map });
        let text = serde_json::to_string_pretty(&v).map_err(|e| ModelError::Config(e.to_string()))?;
        std::fs::write(&index, text).map_err(|e| ModelError::io(&index, e))?;
    }
    let q = serde_json::json!({ "group_size": group, "bits": bits, "mode": "affine" });
    if let Some(o) = cfg.as_object_mut() {
        o.insert("quantization".into(), q.clone());
        o.insert("quantization_config".into(), q);
    }
    let cfg_out = output.join("config.json");
    let pretty = serde_json::to_string_pretty(&cfg).map_err(|e| ModelError::Config(e.to_string()))?;
    std::fs::write(&cfg_out, pretty).map_err(|e| ModelError::io(&cfg_out, e))?;
    // The tokenizer, chat template and generation settings, as they are.
    let entries = std::fs::read_dir(input).map_err(|e| ModelError::io(input, e))?;
    for e in entries.flatten() {
        let p = e.path();
        let file = p.file_name().and_then(|f| f.to_str()).unwrap_or("").to_string();
        let copy = p.is_file()
            && file != "config.json"
            && !file.ends_with(".safetensors")
            && file != "model.safetensors.index.json"
            && (file.ends_with(".json")
                || file.ends_with(".jinja")
                || file.ends_with(".txt")
                || file.ends_with(".model"));
        if copy {
            let to = output.join(&file);
            std::fs::copy(&p, &to).map_err(|e| ModelError::io(&to, e))?;
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::mlx;

    #[test]
    fn pack_is_unpacks_inverse() {
        for bits in [2, 3, 4, 5, 6, 8] {
            let (n, k) = (3, 64);
            let q: Vec<u8> = (0..n * k).map(|i| ((i * 7 + i / 5) % (1 << bits)) as u8).collect();
            let words = pack(&q, n, k, bits).unwrap();
            assert_eq!(words.len(), n * k * bits / 32);
            assert_eq!(mlx::unpack(&words, n, k, bits).unwrap(), q, "{bits} bits");
        }
        assert!(pack(&[0; 10], 1, 10, 4).is_err());
    }

    #[test]
    fn quantised_rows_dequantise_within_half_a_step() {
        let (n, k, group) = (4, 128, 32);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        for bits in [2, 3, 4, 5, 6, 8] {
            let (q, s, b) = quantize_rows(&w, n, k, bits, group).unwrap();
            let (s, b): (Vec<f32>, Vec<f32>) =
                (s.iter().map(|x| x.to_f32()).collect(), b.iter().map(|x| x.to_f32()).collect());
            let back = mlx::dequantize(&q, &s, &b, n, k, group);
            for (i, (x, y)) in w.iter().zip(&back).enumerate() {
                let step = s[i / group];
                // Half a step, plus the f16 rounding of the bias and of the scale over the range.
                let tol = step * 0.5 + x.abs().max(1.0) * 2e-3 * (1 << bits) as f32 / 16.0 + 1e-3;
                assert!((x - y).abs() <= tol, "{bits} bits, value {i}: {x} vs {y} (step {step})");
            }
            // The values the 2-5-bit writes give are exactly what tandem repacks.
            if bits <= 5 {
                assert!(mlx::repack(&q, &s, &b, (n, k, group, bits)).is_some());
            }
        }
        // A constant group: scale 0, every q 0, the bias is the value.
        let (q, s, b) = quantize_rows(&[0.5; 32], 1, 32, 4, 32).unwrap();
        assert!(q.iter().all(|&v| v == 0) && s[0].to_f32() == 0.0 && b[0].to_f32() == 0.5);
        assert!(quantize_rows(&[f32::NAN; 32], 1, 32, 4, 32).is_err());
    }
}
