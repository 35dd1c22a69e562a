//! The hybrid GGUF path on a device (CUDA): llama.cpp's layout (tiled V heads, grouped
//! projections, folded into fused weights on CUDA) through the device's kernels, against the
//! f32 file on the CPU (whose GGUF path `tests/hybrid_gguf.rs` checks against transformers).
//! Random presets (MoE; dense in f32 and Q8_0) written as GGUF, prefilled as one chunk and in
//! uneven chunks, every position's logits compared with the f32 file's on the CPU: f32 tightly,
//! Q8_0 within the error 8-bit weights and activations make in a random model.

use candle_core::Device;

use super::Check;

pub fn run(dev: &Device) -> Vec<Check> {
    #[cfg(feature = "cuda")]
    if dev.is_cuda() {
        return cuda::run(dev);
    }
    let _ = dev;
    Vec::new()
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Arc;

    use candle_core::quantized::GgmlDType;
    use candle_core::{Device, Tensor};

    use super::super::{rel_err, timed, Check, Judge};
    use crate::arch::qwen_hybrid::gguf::HybridGgufSource;
    use crate::arch::qwen_hybrid::random::preset;
    use crate::arch::qwen_hybrid::random_gguf::export_random;
    use crate::arch::qwen_hybrid::{HybridConfig, LayerKind, QwenHybrid};
    use crate::arch::CausalLm;
    use crate::batch::{LogitsWanted, SeqChunk};
    use crate::error::{ModelError, Result};
    use crate::kv::{KvDtype, PagedKvStore, SequenceCache};

    pub fn run(dev: &Device) -> Vec<Check> {
        // MoE routing is discontinuous: 8-bit activations (rounded differently on the two
        // devices) can flip an expert choice in a random model, so the quantised row uses a
        // dense model (the 0.8B shape cut to 4 layers, with twice as many V heads as K heads
        // so that llama.cpp tiles them).
        // Every row is judged against the f32 file on the CPU. The quantised file's error there is
        // the error of 8-bit weights and activations in a random model (the CPU's own Q8_0 run
        // of this file is 0.087 from it): the bound catches a wrong layout, not rounding.
        let cases = [
            ("tiny moe", GgmlDType::F32, 1e-4f32),
            ("0.8b x4 dense", GgmlDType::F32, 1e-4),
            ("0.8b x4 dense", GgmlDType::Q8_0, 0.2),
        ];
        cases
            .into_iter()
            .map(|(name, wt, tol)| {
                let shape = format!("{name}, tiled V heads, 48 tokens");
                match case(dev, name, wt) {
                    Ok((err, ms)) => {
                        Check::new("gguf hybrid vs cpu", shape, &format!("{wt:?}"), err, Judge::Tolerance(tol), ms)
                    }
                    Err(e) => Check::error("gguf hybrid vs cpu", shape, &format!("{wt:?}"), e),
                }
            })
            .collect()
    }

    fn config(name: &str) -> Result<HybridConfig> {
        if name.starts_with("tiny") {
            return preset("tiny");
        }
        let mut c = preset("0.8b")?;
        c.layer_kinds = vec![LayerKind::Linear, LayerKind::Linear, LayerKind::Linear, LayerKind::Full];
        c.linear_num_value_heads = 2 * c.linear_num_key_heads;
        Ok(c)
    }

    fn load(path: &std::path::Path, dev: &Device) -> Result<QwenHybrid> {
        let src = HybridGgufSource::open(path, dev)?;
        if !src.config.v_heads_tiled {
            return Err(ModelError::Input("the random GGUF does not tile its V heads".into()));
        }
        QwenHybrid::load(&src.config, &src)
    }

    /// Every position's logits of `ids` fed in `pieces`.
    fn logits(m: &QwenHybrid, ids: &[u32], pieces: &[usize], dev: &Device) -> Result<Tensor> {
        let spec = m.cache_spec();
        let store = Arc::new(PagedKvStore::new(&spec, 8, 16, KvDtype::F32, dev)?);
        let mut c = SequenceCache::new_paged(&spec, store);
        c.set_block_table(&(0..8u32).rev().collect::<Vec<_>>());
        let mut rows = Vec::new();
        let mut at = 0;
        for &n in pieces {
            let mut chunk = [SeqChunk { tokens: &ids[at..at + n], cache: &mut c, logits: LogitsWanted::All }];
            let out = m.forward(&mut chunk)?.pop().flatten();
            rows.push(out.ok_or_else(|| ModelError::Input("no logits".into()))?.to_device(&Device::Cpu)?);
            at += n;
        }
        Ok(Tensor::cat(&rows, 0)?)
    }

    fn case(dev: &Device, name: &str, wt: GgmlDType) -> Result<(f32, f64)> {
        let cfg = config(name)?;
        let file =
            |t: GgmlDType| std::env::temp_dir().join(format!("tandem-gguf-check-{}-{t:?}.gguf", std::process::id()));
        let (reference, path) = (file(GgmlDType::F32), file(wt));
        export_random(&cfg, GgmlDType::F32, &reference, |_, _| {})?;
        if wt != GgmlDType::F32 {
            export_random(&cfg, wt, &path, |_, _| {})?;
        }
        let models = load(&reference, &Device::Cpu).and_then(|cpu| Ok((cpu, load(&path, dev)?)));
        let _ = std::fs::remove_file(&reference);
        let _ = std::fs::remove_file(&path);
        let (cpu, gpu) = models?;
        let ids: Vec<u32> = (0..48u32).map(|t| (t * 37 + 5) % 500).collect();
        let want = logits(&cpu, &ids, &[48], &Device::Cpu)?;
        let (whole, ms) = timed(dev, || logits(&gpu, &ids, &[48], dev))?;
        let chunked = logits(&gpu, &ids, &[5, 1, 30, 12], dev)?;
        Ok((rel_err(&whole, &want)?.max(rel_err(&chunked, &want)?), ms))
    }
}
