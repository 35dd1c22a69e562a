//! An MLX-format checkpoint read back into the Hugging Face layout, every tensor f32: what
//! `tandem convert` needs to write a GGUF from an MLX checkpoint (mlx-lm's, or one tandem wrote
//! with its MTP head). Quantised weights are dequantised (`mlx::dequantize`, `mlx_fp`), and
//! mlx-lm's sanitised layout is undone: the `language_model.model.` prefix back to
//! `model.language_model.`, the GDN conv `[C, K, 1]` back to `[C, 1, K]`, the zero-centred norms
//! stored as 1 + w back to w (both only where the conv says the layout is sanitised), and
//! stacked `switch_mlp` experts back to per-expert tensors.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};

/// Whether `dir` holds an MLX-quantised checkpoint (`config.json` has a `quantization` block).
pub fn is_mlx_dir(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|v| v.get("quantization").is_some())
}

/// Every tensor of the MLX checkpoint in `dir`, f32, by Hugging Face name.
pub fn hf_tensors(dir: &Path) -> Result<BTreeMap<String, Tensor>> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
    let cfg: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::Config(format!("{}: {e}", cfg_path.display())))?;
    let quant = super::mlx::MlxQuant::from_config(&cfg)?
        .ok_or_else(|| ModelError::Config(format!("{}: not an MLX-quantised checkpoint", dir.display())))?;
    let files = super::safetensors::shard_files(dir)?;
    // SAFETY: read-only mapping of files tandem does not modify.
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }
        .map_err(|e| ModelError::Config(format!("cannot read safetensors in {}: {e}", dir.display())))?;
    let names: HashSet<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
    let cpu = Device::Cpu;
    let sanitised =
        st.tensors().iter().any(|(n, v)| n.ends_with("conv1d.weight") && matches!(v.shape(), [_, k, 1] if *k > 1));
    let mut out = BTreeMap::new();
    let mut sorted: Vec<&String> = names.iter().collect();
    sorted.sort();
    for name in sorted {
        let stem = name.strip_suffix(".weight");
        if name.ends_with(".scales") || name.ends_with(".biases") {
            let w = format!("{}.weight", name.rsplit_once('.').map_or(name.as_str(), |(s, _)| s));
            if names.contains(&w) {
                continue; // read with its weight
            }
        }
        let mut t = match stem.filter(|s| names.contains(&format!("{s}.scales"))) {
            Some(stem) => dequantise(&st, &quant, name, stem)?,
            None => st.load(name, &cpu)?.to_dtype(DType::F32)?,
        };
        let mut hf = name.clone();
        if let Some(rest) = hf.strip_prefix("language_model.model.") {
            hf = format!("model.language_model.{rest}");
        } else if hf == "language_model.lm_head.weight" {
            hf = "lm_head.weight".into();
        }
        if sanitised && hf.ends_with("conv1d.weight") && t.rank() == 3 && t.dim(2)? == 1 {
            t = t.transpose(1, 2)?.contiguous()?; // [C, K, 1] -> [C, 1, K]
        }
        if sanitised && t.rank() == 1 && super::mlx::is_baked_norm(&hf) {
            t = t.affine(1.0, -1.0)?;
        }
        if let Some((base, tail)) = hf.split_once(".switch_mlp.") {
            let experts = t.dim(0)?;
            for e in 0..experts {
                out.insert(format!("{base}.experts.{e}.{tail}"), t.get(e)?);
            }
            continue;
        }
        out.insert(hf, t);
    }
    Ok(out)
}

/// The f32 values of the MLX-quantised weight `name` (`stem.weight`, with `stem.scales` and, for
/// affine, `stem.biases`), any leading stacked dimensions kept.
fn dequantise(
    st: &candle_core::safetensors::MmapedSafetensors,
    quant: &super::mlx::MlxQuant,
    name: &str,
    stem: &str,
) -> Result<Tensor> {
    let cpu = Device::Cpu;
    let words = st.load(name, &cpu)?;
    let dims = words.dims().to_vec();
    let wpr = *dims.last().ok_or_else(|| ModelError::Config(format!("{name}: a scalar")))?;
    let rows = words.elem_count() / wpr.max(1);
    let (bits, group) = quant.params(name)?;
    let k = wpr * 32 / bits;
    let words = words.flatten_all()?.to_vec1::<u32>()?;
    let q = super::mlx::unpack(&words, rows, k, bits)?;
    let vals = match quant.fp_mode() {
        Some(fp) => {
            let scales = st.load(&format!("{stem}.scales"), &cpu)?.flatten_all()?.to_vec1::<u8>()?;
            if scales.len() != rows * (k / group) {
                return Err(ModelError::Config(format!("{stem}: scales do not fit [{rows}, {k}]")));
            }
            super::mlx_fp::dequantize(&q, &scales, rows, k, fp)
        }
        None => {
            let f32s = |n: String| -> Result<Vec<f32>> {
                Ok(st.load(&n, &cpu)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
            };
            let (scales, biases) = (f32s(format!("{stem}.scales"))?, f32s(format!("{stem}.biases"))?);
            if scales.len() != rows * (k / group) || biases.len() != scales.len() {
                return Err(ModelError::Config(format!("{stem}: scales / biases do not fit [{rows}, {k}]")));
            }
            super::mlx::dequantize(&q, &scales, &biases, rows, k, group)
        }
    };
    let mut shape = dims;
    *shape.last_mut().unwrap_or_else(|| unreachable!()) = k;
    Ok(Tensor::from_vec(vals, shape, &cpu)?)
}
