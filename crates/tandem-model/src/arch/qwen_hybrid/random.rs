//! Random-weight hybrid models built in memory from a config, so that real shapes can be
//! benchmarked without a checkpoint: [`preset`] configs and a [`RandomSource`] that makes every
//! tensor [`QwenHybrid::load`] asks for (scaled so activations stay O(1)), with the weight
//! matrices optionally quantised by candle (e.g. Q8_0).

use std::collections::HashMap;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Tensor};

use super::config::{HybridConfig, LayerKind, MoeConfig};
use super::QwenHybrid;
use crate::error::{ModelError, Result};
use crate::loader::{Embedding, LinearWeight, WeightSource};

/// Names of the presets [`preset`] knows.
pub const PRESETS: [&str; 7] = ["0.8b", "0.8b-mtp", "9b", "9b-mtp", "27b", "moe", "tiny"];

/// A named configuration:
/// - `0.8b`: Qwen3.5-0.8B-like: 24 layers (3 GDN : 1 attention), hidden 1024, GDN nk = nv = 16,
///   dk = dv = 128, attention 8 heads / 2 KV heads / head_dim 256 (rotary 64), dense SwiGLU
///   3584, vocab 248320, tied embeddings;
/// - `0.8b-mtp`: the same with an MTP head (one attention layer + dense MLP), for speculative
///   decoding benchmarks;
/// - `9b`: Qwen3.5-9B's shape: 32 layers (24 GDN + 8 attention), hidden 4096, GDN 16 key /
///   32 value heads of 128, attention 16 heads / 4 KV heads of 256, dense SwiGLU 12288, vocab
///   248320, untied (8.95 B parameters); `9b-mtp` with its MTP head;
/// - `27b`: Qwen3.5-27B's shape: 64 layers (48 + 16), hidden 5120, GDN 16 / 48 heads,
///   attention 24 / 4 heads of 256, SwiGLU 17408, untied;
/// - `moe`: Qwen3.5-MoE's layout scaled down for a CPU: the 0.8b preset's attention, GDN and
///   vocabulary with a sparse FFN in every layer, 64 experts of 256, top-8 routing
///   (renormalised), and a gated shared expert of 256 (1.72 B parameters, 0.66 B active per
///   token, a quarter of them the tied 248,320-token embedding);
/// - `tiny`: 4 layers, hidden 64, MoE with 4 experts (for quick checks).
pub fn preset(name: &str) -> Result<HybridConfig> {
    let base = HybridConfig {
        model_type: "qwen3_5_text".into(),
        grouped_projections: false,
        vocab_size: 248_320,
        hidden_size: 1024,
        layer_kinds: (0..24).map(|i| if (i + 1) % 4 == 0 { LayerKind::Full } else { LayerKind::Linear }).collect(),
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 256,
        rotary_dim: 64,
        rope_theta: 10_000_000.0,
        rms_norm_eps: 1e-6,
        max_position_embeddings: 262_144,
        tie_word_embeddings: true,
        linear_num_key_heads: 16,
        linear_num_value_heads: 16,
        linear_key_head_dim: 128,
        linear_value_head_dim: 128,
        conv_kernel: 4,
        intermediate_size: 3584,
        moe: None,
        decoder_sparse_step: 1,
        mlp_only_layers: Vec::new(),
        mtp_layers: 0,
        v_heads_tiled: false,
    };
    Ok(match name {
        "0.8b" => base,
        "0.8b-mtp" => HybridConfig { mtp_layers: 1, ..base },
        "9b" | "9b-mtp" => HybridConfig {
            hidden_size: 4096,
            layer_kinds: (0..32).map(|i| if (i + 1) % 4 == 0 { LayerKind::Full } else { LayerKind::Linear }).collect(),
            num_heads: 16,
            num_kv_heads: 4,
            tie_word_embeddings: false,
            linear_num_value_heads: 32,
            intermediate_size: 12288,
            mtp_layers: usize::from(name == "9b-mtp"),
            ..base
        },
        "27b" => HybridConfig {
            hidden_size: 5120,
            layer_kinds: (0..64).map(|i| if (i + 1) % 4 == 0 { LayerKind::Full } else { LayerKind::Linear }).collect(),
            num_heads: 24,
            num_kv_heads: 4,
            tie_word_embeddings: false,
            linear_num_value_heads: 48,
            intermediate_size: 17408,
            ..base
        },
        "moe" => HybridConfig {
            model_type: "qwen3_5_moe_text".into(),
            intermediate_size: 0,
            moe: Some(MoeConfig {
                num_experts: 64,
                top_k: 8,
                intermediate_size: 256,
                shared_intermediate_size: 256,
                norm_topk_prob: true,
            }),
            ..base
        },
        "tiny" => HybridConfig {
            model_type: "qwen3_5_moe_text".into(),
            vocab_size: 512,
            hidden_size: 64,
            layer_kinds: (0..4).map(|i| if i == 3 { LayerKind::Full } else { LayerKind::Linear }).collect(),
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 32,
            rotary_dim: 8,
            tie_word_embeddings: false,
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            linear_key_head_dim: 32,
            linear_value_head_dim: 32,
            intermediate_size: 0,
            moe: Some(MoeConfig {
                num_experts: 4,
                top_k: 2,
                intermediate_size: 32,
                shared_intermediate_size: 32,
                norm_topk_prob: true,
            }),
            ..base
        },
        other => {
            return Err(ModelError::Config(format!(
                "unknown random-model preset `{other}` (known: {})",
                PRESETS.join(", ")
            )))
        }
    })
}

/// A weight type by name: `f32`, `f16`, `bf16`, `q8_0`, `q4_0`, `q4_k`, `q6_k`. On a GPU f16 and
/// bf16 matrices stay 16-bit (dense kernels); on the CPU they run as f32.
pub fn parse_weight_type(s: &str) -> Result<GgmlDType> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "f32" => GgmlDType::F32,
        "f16" => GgmlDType::F16,
        "bf16" => GgmlDType::BF16,
        "q8_0" => GgmlDType::Q8_0,
        "q4_0" => GgmlDType::Q4_0,
        "q4_k" => GgmlDType::Q4K,
        "q6_k" => GgmlDType::Q6K,
        other => {
            return Err(ModelError::Config(format!(
                "unknown weight type `{other}` (f32, f16, bf16, q8_0, q4_0, q4_k, q6_k)"
            )))
        }
    })
}

/// What a tensor is, which decides its random values.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// A weight matrix `[out, in]` (or an embedding): N(0, 1/in).
    Matrix,
    /// A zero-centred norm (stored as w, used as 1 + w): zeros.
    ZeroNorm,
    /// The GDN output norm (plain weight): ones.
    OneNorm,
    /// Depthwise conv taps: N(0, 1/K).
    Conv,
    /// `A_log`: ln of 1..16.
    ALog,
    /// `dt_bias`: zeros.
    Zero,
}

/// Tensors of a gated full-attention block (after `blk.N.` or `mtp.layers.0.`).
fn attention_shapes(cfg: &HybridConfig) -> Vec<(&'static str, Vec<usize>, Kind)> {
    let (h, nh, nkv, hd) = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    vec![
        ("self_attn.q_proj.weight", vec![2 * nh * hd, h], Kind::Matrix),
        ("self_attn.k_proj.weight", vec![nkv * hd, h], Kind::Matrix),
        ("self_attn.v_proj.weight", vec![nkv * hd, h], Kind::Matrix),
        ("self_attn.o_proj.weight", vec![h, nh * hd], Kind::Matrix),
        ("self_attn.q_norm.weight", vec![hd], Kind::ZeroNorm),
        ("self_attn.k_norm.weight", vec![hd], Kind::ZeroNorm),
    ]
}

/// Tensors of a feed-forward block: dense SwiGLU, or routed experts plus a shared expert.
fn ffn_shapes(cfg: &HybridConfig, moe: bool) -> Vec<(String, Vec<usize>, Kind)> {
    let h = cfg.hidden_size;
    let mut v = Vec::new();
    let mut swiglu = |p: &str, n: usize| {
        v.push((format!("{p}gate_proj.weight"), vec![n, h], Kind::Matrix));
        v.push((format!("{p}up_proj.weight"), vec![n, h], Kind::Matrix));
        v.push((format!("{p}down_proj.weight"), vec![h, n], Kind::Matrix));
    };
    match (&cfg.moe, moe) {
        (Some(m), true) => {
            for e in 0..m.num_experts {
                swiglu(&format!("mlp.experts.{e}."), m.intermediate_size);
            }
            if m.shared_intermediate_size > 0 {
                swiglu("mlp.shared_expert.", m.shared_intermediate_size);
                v.push(("mlp.shared_expert_gate.weight".into(), vec![1, h], Kind::Matrix));
            }
            v.push(("mlp.gate.weight".into(), vec![m.num_experts, h], Kind::Matrix));
        }
        _ => swiglu("mlp.", cfg.intermediate_size),
    }
    v
}

/// Makes every tensor of a hybrid model with config `cfg` on request.
pub struct RandomSource {
    shapes: HashMap<String, (Vec<usize>, Kind)>,
    dtype: GgmlDType,
    device: Device,
}

impl RandomSource {
    /// Weight matrices whose rows split into blocks of `dtype` are quantised to it (F32 keeps
    /// everything dense).
    pub fn new(cfg: &HybridConfig, dtype: GgmlDType, device: &Device) -> Self {
        let h = cfg.hidden_size;
        let (kd, vd) = (
            cfg.linear_num_key_heads * cfg.linear_key_head_dim,
            cfg.linear_num_value_heads * cfg.linear_value_head_dim,
        );
        let nv = cfg.linear_num_value_heads;
        let mut s: HashMap<String, (Vec<usize>, Kind)> = HashMap::new();
        let mut put = |name: String, shape: Vec<usize>, kind: Kind| {
            s.insert(name, (shape, kind));
        };
        put("token_embd.weight".into(), vec![cfg.vocab_size, h], Kind::Matrix);
        put("output_norm.weight".into(), vec![h], Kind::ZeroNorm);
        if !cfg.tie_word_embeddings {
            put("output.weight".into(), vec![cfg.vocab_size, h], Kind::Matrix);
        }
        for (i, kind) in cfg.layer_kinds.iter().enumerate() {
            let p = |t: &str| format!("blk.{i}.{t}");
            put(p("input_layernorm.weight"), vec![h], Kind::ZeroNorm);
            put(p("post_attention_layernorm.weight"), vec![h], Kind::ZeroNorm);
            match kind {
                LayerKind::Linear => {
                    put(p("linear_attn.in_proj_qkv.weight"), vec![2 * kd + vd, h], Kind::Matrix);
                    put(p("linear_attn.in_proj_z.weight"), vec![vd, h], Kind::Matrix);
                    put(p("linear_attn.in_proj_b.weight"), vec![nv, h], Kind::Matrix);
                    put(p("linear_attn.in_proj_a.weight"), vec![nv, h], Kind::Matrix);
                    put(p("linear_attn.conv1d.weight"), vec![2 * kd + vd, 1, cfg.conv_kernel], Kind::Conv);
                    put(p("linear_attn.A_log"), vec![nv], Kind::ALog);
                    put(p("linear_attn.dt_bias"), vec![nv], Kind::Zero);
                    put(p("linear_attn.norm.weight"), vec![cfg.linear_value_head_dim], Kind::OneNorm);
                    put(p("linear_attn.out_proj.weight"), vec![h, vd], Kind::Matrix);
                }
                LayerKind::Full => {
                    for (name, shape, kind) in attention_shapes(cfg) {
                        put(p(name), shape, kind);
                    }
                }
            }
            for (name, shape, kind) in ffn_shapes(cfg, cfg.is_moe_layer(i)) {
                put(p(&name), shape, kind);
            }
        }
        if cfg.mtp_layers > 0 {
            // The MTP head (spec §8): one full-attention decoder layer (MoE in MoE models).
            put("mtp.fc.weight".into(), vec![h, 2 * h], Kind::Matrix);
            put("mtp.pre_fc_norm_embedding.weight".into(), vec![h], Kind::ZeroNorm);
            put("mtp.pre_fc_norm_hidden.weight".into(), vec![h], Kind::ZeroNorm);
            put("mtp.norm.weight".into(), vec![h], Kind::ZeroNorm);
            let p = |t: &str| format!("mtp.layers.0.{t}");
            put(p("input_layernorm.weight"), vec![h], Kind::ZeroNorm);
            put(p("post_attention_layernorm.weight"), vec![h], Kind::ZeroNorm);
            for (name, shape, kind) in attention_shapes(cfg) {
                put(p(name), shape, kind);
            }
            for (name, shape, kind) in ffn_shapes(cfg, cfg.moe.is_some()) {
                put(p(&name), shape, kind);
            }
        }
        Self { shapes: s, dtype, device: device.clone() }
    }

    /// A source of exactly these tensors (another architecture's names: `arch::random_llama`).
    pub(crate) fn from_shapes(shapes: Vec<(String, Vec<usize>, Kind)>, dtype: GgmlDType, device: &Device) -> Self {
        let shapes = shapes.into_iter().map(|(n, s, k)| (n, (s, k))).collect();
        Self { shapes, dtype, device: device.clone() }
    }

    /// Tensor `name` on `dev`: the same values on every device and in every run (so a model
    /// built in memory and the GGUF [`super::random_gguf`] writes of it hold the same weights).
    pub(crate) fn make_on(&self, name: &str, dev: &Device) -> Result<Tensor> {
        let (shape, kind) = self.shapes.get(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let n: usize = shape.iter().product();
        let fan_in = *shape.last().unwrap_or(&1) as f32;
        let seed = name_seed(name);
        let values = match kind {
            Kind::Matrix | Kind::Conv => normals(n, seed, 1.0 / fan_in.sqrt()),
            Kind::ZeroNorm | Kind::Zero => vec![0f32; n],
            Kind::OneNorm => vec![1f32; n],
            Kind::ALog => normals(n, seed, 1.0).iter().map(|z| (1.0 + 15.0 * unit(*z)).ln()).collect(),
        };
        Ok(Tensor::from_vec(values, shape.as_slice(), dev)?)
    }

    /// Every tensor name, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.shapes.keys().cloned().collect();
        v.sort();
        v
    }

    /// The host tensor `t` quantised to the source's type (on all cores, placed on the
    /// source's device) when its rows split into blocks.
    fn quantised(&self, t: &Tensor) -> Result<Option<QTensor>> {
        let k = t.dims().last().copied().unwrap_or(0);
        if self.dtype == GgmlDType::F32 || k % self.dtype.block_size() != 0 {
            return Ok(None);
        }
        Ok(Some(super::to_gguf::quantise_onto(t, self.dtype, 1 << 22, &self.device)?))
    }
}

impl WeightSource for RandomSource {
    fn has(&self, name: &str) -> bool {
        self.shapes.contains_key(name)
    }
    fn qmatmul(&self, name: &str) -> Result<LinearWeight> {
        let t = self.make_on(name, &Device::Cpu)?;
        let dense16 = match self.dtype {
            GgmlDType::F16 => Some(candle_core::DType::F16),
            GgmlDType::BF16 => Some(candle_core::DType::BF16),
            _ => None,
        };
        if let (Some(dt), false) = (dense16, self.device.is_cpu()) {
            // 16-bit dense weights as a GPU checkpoint keeps them (candle would widen a 16-bit
            // QTensor to f32).
            return Ok(LinearWeight::Candle(QMatMul::Tensor(t.to_device(&self.device)?.to_dtype(dt)?)));
        }
        Ok(LinearWeight::Candle(match self.quantised(&t)? {
            Some(q) => QMatMul::from_qtensor(q)?,
            None => QMatMul::Tensor(t.to_device(&self.device)?),
        }))
    }
    fn tensor_f32(&self, name: &str) -> Result<Tensor> {
        self.make_on(name, &self.device)
    }
    fn embedding(&self, name: &str) -> Result<Embedding> {
        let t = self.make_on(name, &Device::Cpu)?;
        Ok(match self.quantised(&t)? {
            Some(q) => Embedding::Quantized(std::sync::Arc::new(q)),
            None => Embedding::Dense(t.to_device(&self.device)?),
        })
    }
    fn device(&self) -> &Device {
        &self.device
    }
}

/// FNV-1a of a tensor name: its stream of random values.
fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` values from N(0, std²) (Box-Muller over splitmix64), filled in parallel pieces whose
/// streams depend only on `seed` and the piece's index: the same values on any thread count.
fn normals(n: usize, seed: u64, std: f32) -> Vec<f32> {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 16;
    let mut v = vec![0f32; n];
    v.par_chunks_mut(PIECE).enumerate().for_each(|(i, piece)| {
        let mut st = seed ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
        for pair in piece.chunks_mut(2) {
            let u1 = ((splitmix(&mut st) >> 40) as f32 + 1.0) / (1u64 << 24) as f32;
            let u2 = (splitmix(&mut st) >> 40) as f32 / (1u64 << 24) as f32;
            let r = (-2.0 * u1.ln()).sqrt() * std;
            let (s, c) = (std::f32::consts::TAU * u2).sin_cos();
            pair[0] = r * c;
            if let Some(x) = pair.get_mut(1) {
                *x = r * s;
            }
        }
    });
    v
}

/// A normal value mapped smoothly into (0, 1) (for `A_log`'s range).
fn unit(z: f32) -> f32 {
    (0.5 * (1.0 + (z / std::f32::consts::SQRT_2).tanh())).clamp(1e-6, 1.0 - 1e-6)
}

/// A random-weight model of config `cfg` (weight matrices in `dtype`).
pub fn random_model(cfg: &HybridConfig, dtype: GgmlDType, device: &Device) -> Result<QwenHybrid> {
    QwenHybrid::load(cfg, &RandomSource::new(cfg, dtype, device))
}

/// Parameters of a model of config `cfg` (main layers, embeddings, output head if untied).
pub fn parameter_count(cfg: &HybridConfig) -> u64 {
    RandomSource::new(cfg, GgmlDType::F32, &Device::Cpu)
        .shapes
        .values()
        .map(|(s, _)| s.iter().product::<usize>() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::CausalLm;
    use crate::batch::{LogitsWanted, SeqChunk};
    use crate::kv::SequenceCache;

    #[test]
    fn tiny_random_model_runs_and_counts_parameters() {
        let cfg = preset("tiny").unwrap();
        let m = random_model(&cfg, GgmlDType::Q8_0, &Device::Cpu).unwrap();
        let mut cache = SequenceCache::new(&m.cache_spec(), &Device::Cpu);
        let tokens: Vec<u32> = (0..70).collect();
        let mut chunks = [SeqChunk { tokens: &tokens, cache: &mut cache, logits: LogitsWanted::Last }];
        let logits = m.forward(&mut chunks).unwrap().pop().flatten().unwrap();
        assert_eq!(logits.dims(), [1, 512]);
        assert!(logits.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|x| x.is_finite()));
        let p = parameter_count(&preset("0.8b").unwrap());
        assert!((700_000_000..900_000_000).contains(&p), "0.8b preset has {p} parameters");
        // Qwen3.5-9B: 8.95 B; Qwen3.5-27B: about 27 B.
        let p = parameter_count(&preset("9b").unwrap());
        assert!((8_900_000_000..9_000_000_000).contains(&p), "9b preset has {p} parameters");
        let p = parameter_count(&preset("27b").unwrap());
        assert!((26_000_000_000..28_500_000_000).contains(&p), "27b preset has {p} parameters");
        // The MoE preset: the 0.8b preset less its dense FFN (264 M) plus 24 sparse ones.
        let moe = preset("moe").unwrap();
        let per_layer = 64 * 3 * 256 * 1024 + 3 * 256 * 1024 + 64 * 1024 + 1024;
        let dense = parameter_count(&preset("0.8b").unwrap()) - 24 * 3 * 3584 * 1024;
        assert_eq!(parameter_count(&moe), dense + 24 * per_layer as u64, "moe preset");
        assert_eq!((moe.moe.as_ref().unwrap().num_experts, moe.moe.as_ref().unwrap().top_k), (64, 8));
    }

    #[test]
    fn mtp_presets_have_a_working_head() {
        assert_eq!(preset("0.8b-mtp").unwrap().mtp_layers, 1);
        let cfg = HybridConfig { mtp_layers: 1, ..preset("tiny").unwrap() };
        let m = random_model(&cfg, GgmlDType::F32, &Device::Cpu).unwrap();
        let spec = m.cache_spec();
        assert_eq!(spec.len(), cfg.num_layers() + 1, "the head's KV layer comes last");
        let mut cache = SequenceCache::new(&spec, &Device::Cpu);
        let tokens: Vec<u32> = (0..9).collect();
        let hidden =
            m.forward_hidden(&mut [SeqChunk { tokens: &tokens, cache: &mut cache, logits: LogitsWanted::All }]);
        let hidden = hidden.unwrap();
        let head = CausalLm::mtp(&m).expect("MTP head");
        let y = head.mtp_forward(&hidden, &(1..10).collect::<Vec<u32>>(), &mut cache, 0).unwrap();
        assert_eq!(y.dims(), [9, 64]);
        assert_eq!(head.mtp_logits(&y.narrow(0, 8, 1).unwrap()).unwrap().dims(), [1, 512]);
    }
}
