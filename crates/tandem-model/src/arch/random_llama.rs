//! Random-weight Llama-family models of real shapes built in memory (`tandem bench
//! --random-llama 8b`), through the hybrid presets' [`RandomSource`]: the GPU speed issue's
//! Llama-3-8B shape measured without a checkpoint. Norm weights are ones (Llama's RMSNorm
//! multiplies by w, not 1 + w), matrices N(0, 1/in) as for the hybrids.

use candle_core::quantized::GgmlDType;
use candle_core::Device;

use crate::arch::llama::Llama;
use crate::arch::qwen_hybrid::random::{Kind, RandomSource};
use crate::config::{LlamaConfig, RopeScaling, RopeStyle};
use crate::error::{ModelError, Result};

/// Names of the presets [`preset`] knows.
pub const PRESETS: [&str; 2] = ["8b", "tiny"];

/// A named configuration:
/// - `8b`: Llama-3-8B's shape: 32 layers, hidden 4096, 32 heads / 8 KV heads of 128, SwiGLU
///   14336, vocab 128256, untied, RoPE theta 500000 with Llama 3's scaling (8.03 B parameters);
/// - `tiny`: 2 layers, hidden 64 (for quick checks).
pub fn preset(name: &str) -> Result<LlamaConfig> {
    let base = LlamaConfig {
        arch: "llama".into(),
        vocab_size: 128_256,
        hidden_size: 4096,
        intermediate_size: 14_336,
        num_layers: 32,
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
        rms_norm_eps: 1e-5,
        rope_theta: 500_000.0,
        rope_scaling: RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 8192,
        },
        rope_style: RopeStyle::Half,
        max_position_embeddings: 131_072,
        tie_word_embeddings: false,
        attention_bias: false,
        qk_norm: false,
    };
    Ok(match name {
        "8b" => base,
        "tiny" => LlamaConfig {
            vocab_size: 512,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            ..base
        },
        other => {
            return Err(ModelError::Config(format!(
                "unknown random Llama preset `{other}` (known: {})",
                PRESETS.join(", ")
            )))
        }
    })
}

/// Every tensor of a Llama model of config `cfg`, GGUF names.
fn shapes(cfg: &LlamaConfig) -> Vec<(String, Vec<usize>, Kind)> {
    let (h, ff) = (cfg.hidden_size, cfg.intermediate_size);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let mut v = vec![
        ("token_embd.weight".to_string(), vec![cfg.vocab_size, h], Kind::Matrix),
        ("output_norm.weight".to_string(), vec![h], Kind::OneNorm),
    ];
    if !cfg.tie_word_embeddings {
        v.push(("output.weight".into(), vec![cfg.vocab_size, h], Kind::Matrix));
    }
    for i in 0..cfg.num_layers {
        let p = |t: &str| format!("blk.{i}.{t}");
        v.extend([
            (p("attn_norm.weight"), vec![h], Kind::OneNorm),
            (p("attn_q.weight"), vec![qd, h], Kind::Matrix),
            (p("attn_k.weight"), vec![kvd, h], Kind::Matrix),
            (p("attn_v.weight"), vec![kvd, h], Kind::Matrix),
            (p("attn_output.weight"), vec![h, qd], Kind::Matrix),
            (p("ffn_norm.weight"), vec![h], Kind::OneNorm),
            (p("ffn_gate.weight"), vec![ff, h], Kind::Matrix),
            (p("ffn_up.weight"), vec![ff, h], Kind::Matrix),
            (p("ffn_down.weight"), vec![h, ff], Kind::Matrix),
        ]);
    }
    v
}

/// The random model of config `cfg`, matrices in `dtype` (as for the hybrid presets).
pub fn random_model(cfg: &LlamaConfig, dtype: GgmlDType, device: &Device) -> Result<Llama> {
    Llama::load(cfg, &RandomSource::from_shapes(shapes(cfg), dtype, device))
}

/// [`random_model`] cut into `ranks` tensor-parallel ranks ([`super::llama::tp`]).
pub fn random_model_ranks(
    cfg: &LlamaConfig,
    dtype: GgmlDType,
    device: &Device,
    ranks: usize,
) -> Result<super::llama::tp::TpLlama> {
    let src = RandomSource::from_shapes(shapes(cfg), dtype, device);
    let plain = crate::loader::LoadOptions::default();
    super::llama::tp::TpLlama::load_with(cfg, &src, ranks, |s| plain.source(s))
}

/// Parameters of a model of config `cfg`.
pub fn parameter_count(cfg: &LlamaConfig) -> u64 {
    shapes(cfg).iter().map(|(_, s, _)| s.iter().product::<usize>() as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::CausalLm;
    use crate::batch::{LogitsWanted, SeqChunk};
    use crate::kv::SequenceCache;

    #[test]
    fn tiny_random_llama_runs_and_the_8b_preset_has_llama3_8b_parameters() {
        let cfg = preset("tiny").unwrap();
        let m = random_model(&cfg, GgmlDType::Q8_0, &Device::Cpu).unwrap();
        let mut cache = SequenceCache::new(&m.cache_spec(), &Device::Cpu);
        let tokens: Vec<u32> = (0..40).collect();
        let mut chunks = [SeqChunk { tokens: &tokens, cache: &mut cache, logits: LogitsWanted::Last }];
        let logits = m.forward(&mut chunks).unwrap().pop().flatten().unwrap();
        assert_eq!(logits.dims(), [1, 512]);
        let v = logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(v.iter().all(|x| x.is_finite()));
        // Ones as norms keep the random model's logits spread (not all equal).
        assert!(v.iter().any(|&x| x != v[0]));
        // Llama-3-8B: 8,030,261,248 parameters.
        assert_eq!(parameter_count(&preset("8b").unwrap()), 8_030_261_248);
        assert!(preset("70b").is_err());
    }
}
