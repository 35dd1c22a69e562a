//! The decode-graph check (CUDA): random hybrid models decode greedily for several steps twice
//! from the same prompts, once through [`CausalLm::forward`] (decode steps as CUDA graphs,
//! `arch/qwen_hybrid/graph.rs`) and once through the eager forward, each in its own paged KV
//! store. Every step's logits and, at the end, every recurrent state must be bit for bit the
//! same, and the graphs must have run (a shape that fell back to eager fails the row). The
//! cases cross a 256-key segment boundary (a new graph mid-run), batch sequences of different
//! lengths, and cover MoE (experts routed on the device, as a GGUF's stacked experts are) and
//! dense layers, Q8_0 and bf16 weights, f16, f32 and q8_0 KV.
//!
//! The `verify graph` rows do the same for speculative verify steps (caches in verify mode,
//! several tokens per sequence, every position's logits, then a commit keeping some of them):
//! logits, the final-normed hidden states of a model with an MTP head (through its LM head),
//! positions and the recurrent states after each commit must match the eager steps bit for
//! bit.
//!
//! [`CausalLm::forward`]: crate::arch::CausalLm::forward

use candle_core::Device;

use super::Check;

/// The random hybrid cases, and the Llama-family fixtures under `fixtures` when given.
pub fn run(dev: &Device, fixtures: Option<&std::path::Path>) -> Vec<Check> {
    #[cfg(feature = "cuda")]
    if dev.is_cuda() {
        return cuda::run(dev, fixtures);
    }
    let _ = (dev, fixtures);
    Vec::new()
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Arc;

    use candle_core::quantized::GgmlDType;
    use candle_core::{Device, Tensor};

    use super::super::{bits_err, host_f32, Check, Judge};
    use crate::arch::qwen_hybrid::gguf::HybridGgufSource;
    use crate::arch::qwen_hybrid::random::{preset, random_model};
    use crate::arch::qwen_hybrid::random_gguf::export_random;
    use crate::arch::qwen_hybrid::{HybridConfig, LayerKind, QwenHybrid};
    use crate::arch::CausalLm;
    use crate::batch::{LogitsWanted, SeqChunk};
    use crate::error::Result;
    use crate::kv::{KvDtype, PagedKvStore, SequenceCache};

    const BLOCK: usize = 16;

    pub fn run(dev: &Device, fixtures: Option<&std::path::Path>) -> Vec<Check> {
        let mut out = Vec::new();
        let config = |name: &str| {
            if name.starts_with("tiny") {
                return preset("tiny");
            }
            let base = if name.starts_with("0.8b-mtp") { "0.8b-mtp" } else { "0.8b" };
            preset(base).map(|mut c| {
                c.layer_kinds = vec![LayerKind::Linear, LayerKind::Linear, LayerKind::Linear, LayerKind::Full];
                c
            })
        };
        let cases: [(&str, GgmlDType, KvDtype, &[usize], usize); 4] = [
            ("tiny moe", GgmlDType::Q8_0, KvDtype::F16, &[250], 10),
            ("tiny moe", GgmlDType::Q8_0, KvDtype::F16, &[5, 300, 40], 6),
            ("0.8b x4 layers", GgmlDType::BF16, KvDtype::Q8_0, &[20, 254], 6),
            ("0.8b x4 layers", GgmlDType::Q8_0, KvDtype::F32, &[7], 4),
        ];
        if !crate::ops::cuda_graph::enabled() {
            let c = Check::new("decode graph", "-".into(), "-", 0.0, Judge::Info, 0.0);
            return vec![c.with_note("TANDEM_CUDA_GRAPHS=0: decode steps run eagerly, nothing to compare")];
        }
        for (name, wt, kv, prompts, steps) in cases {
            let shape = format!("{name} prompts {prompts:?} +{steps}");
            let format = format!("{wt:?} kv {kv}");
            let m = config(name).and_then(|cfg| model(&cfg, wt, dev));
            out.push(row(m.map(|m| Box::new(m) as Box<dyn CausalLm>), kv, prompts, steps, dev, shape, format));
        }
        // The Llama family: the fixtures (f32 HF checkpoints), prompts crossing a segment.
        for name in ["tiny/llama", "tiny/qwen3"] {
            let Some(dir) = fixtures.map(|f| f.join(name)).filter(|d| d.join("config.json").exists()) else {
                continue;
            };
            let m = crate::loader::load_with(&dir, dev, &Default::default()).map(|l| l.model);
            out.push(row(
                m,
                KvDtype::F16,
                &[3, 260],
                6,
                dev,
                format!("{name} prompts [3, 260] +6"),
                "f32 kv f16".into(),
            ));
        }
        // Verify steps: (model, weights, KV, prompts, steps, tokens per step).
        let verify: [(&str, GgmlDType, KvDtype, &[usize], usize, usize); 3] = [
            ("0.8b-mtp x4 layers", GgmlDType::Q8_0, KvDtype::F16, &[20, 250], 5, 4),
            ("0.8b-mtp x4 layers", GgmlDType::Q4K, KvDtype::F32, &[7], 6, 3),
            ("tiny moe", GgmlDType::Q8_0, KvDtype::F16, &[5, 300, 40], 4, 2),
        ];
        for (name, wt, kv, prompts, steps, t) in verify {
            let shape = format!("{name} prompts {prompts:?} {steps} x {t} tokens");
            let format = format!("{wt:?} kv {kv}");
            let m = config(name).and_then(|cfg| model(&cfg, wt, dev));
            let r = m.and_then(|m| verify_case(&m, kv, prompts, steps, t, dev));
            out.push(graph_row("verify graph", "verify steps", r, steps, shape, format));
        }
        for name in ["tiny/llama", "tiny/qwen3"] {
            let Some(dir) = fixtures.map(|f| f.join(name)).filter(|d| d.join("config.json").exists()) else {
                continue;
            };
            let m = crate::loader::load_with(&dir, dev, &Default::default()).map(|l| l.model);
            let r = m.and_then(|m| verify_case(&*m, KvDtype::F16, &[3, 250], 4, 4, dev));
            let shape = format!("{name} prompts [3, 250] 4 x 4 tokens");
            out.push(graph_row("verify graph", "verify steps", r, 4, shape, "f32 kv f16".into()));
        }
        out
    }

    /// A check row `name` from a case's (largest bit difference, steps that ran as graphs, ms):
    /// exact, and failed unless all `steps` (called `unit` in the note) ran as graphs.
    fn graph_row(
        name: &str,
        unit: &str,
        r: Result<(f32, usize, f64)>,
        steps: usize,
        shape: String,
        format: String,
    ) -> Check {
        match r {
            Ok((err, ran, ms)) => {
                let c = Check::new(name, shape, &format, err, Judge::Exact, ms);
                if ran == steps {
                    c.with_note(format!("{ran} {unit} as graphs"))
                } else {
                    Check { pass: false, ..c.with_note(format!("only {ran} of {steps} {unit} ran as graphs")) }
                }
            }
            Err(e) => Check::error(name, shape, &format, e),
        }
    }

    /// Verify steps of `t` tokens per sequence, through [`CausalLm::forward`] (graphs; with the
    /// hidden states where the model has an MTP head) and the eager forward, each step keeping
    /// a different number of its tokens: (largest bit difference, steps that ran as graphs, ms
    /// of the graph run).
    fn verify_case(
        m: &dyn CausalLm,
        kv: KvDtype,
        prompts: &[usize],
        steps: usize,
        t: usize,
        dev: &Device,
    ) -> Result<(f32, usize, f64)> {
        let mut graph = prefilled(m, kv, prompts, steps * t + 1, dev)?;
        let mut eager = prefilled(m, kv, prompts, steps * t + 1, dev)?;
        let vocab = m.vocab_size() as u32;
        let mut err = 0f32;
        let before = m.graph_launches();
        dev.synchronize()?;
        let t0 = std::time::Instant::now();
        for step in 0..steps {
            let toks: Vec<Vec<u32>> = (0..prompts.len())
                .map(|i| (0..t).map(|j| ((step * 31 + i * 7 + j * 13 + 5) as u32) % (vocab - 12)).collect())
                .collect();
            for c in graph.iter_mut().chain(eager.iter_mut()) {
                c.begin_verify();
            }
            let chunks = |caches| all_logits(caches, &toks);
            let (got, hidden) = if m.mtp().is_some() {
                m.forward_with_hidden(&mut chunks(&mut graph))?
            } else {
                (m.forward(&mut chunks(&mut graph))?, None)
            };
            let want = m.forward_eager(&mut chunks(&mut eager))?;
            for (g, w) in got.iter().zip(&want) {
                let (Some(g), Some(w)) = (g, w) else { return Ok((f32::INFINITY, 0, 0.0)) };
                err = err.max(bits_err(g, w)?);
            }
            // A model with an MTP head also returns the hidden states: its LM head must give
            // the same logits from them.
            if let (Some(h), Some(head)) = (hidden, m.mtp()) {
                let all = Tensor::cat(&got.iter().flatten().cloned().collect::<Vec<_>>(), 0)?;
                err = err.max(bits_err(&head.mtp_logits(&h)?, &all)?);
            }
            let keep = 1 + step % t;
            for c in graph.iter_mut().chain(eager.iter_mut()) {
                c.commit_speculative(t, keep)?;
            }
        }
        dev.synchronize()?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let ran = m.graph_launches() - before;
        Ok((err.max(states_err(&graph, &eager)?), ran, ms))
    }

    /// A chunk of `toks[i]` for cache `i`, every position's logits.
    fn all_logits<'a>(caches: &'a mut [SequenceCache], toks: &'a [Vec<u32>]) -> Vec<SeqChunk<'a>> {
        caches.iter_mut().zip(toks).map(|(cache, t)| SeqChunk { tokens: t, cache, logits: LogitsWanted::All }).collect()
    }

    /// The largest difference between two sets of caches: positions, then every recurrent
    /// state bit for bit.
    fn states_err(graph: &[SequenceCache], eager: &[SequenceCache]) -> Result<f32> {
        let mut err = 0f32;
        for (g, e) in graph.iter().zip(eager) {
            if g.position() != e.position() {
                err = f32::INFINITY;
            }
            for (a, b) in g.recurrent.iter().zip(&e.recurrent) {
                if let (Some(a), Some(b)) = (a, b) {
                    let (ac, bc) = (a.conv_values()?, b.conv_values()?);
                    let (asm, bsm) = (a.ssm_values()?, b.ssm_values()?);
                    let same = |x: &[f32], y: &[f32]| {
                        x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
                    };
                    if !same(&ac, &bc) || !same(&asm, &bsm) {
                        err = err.max(super::super::rel_err_slices(&asm, &bsm).max(f32::MIN_POSITIVE));
                    }
                }
            }
        }
        Ok(err)
    }

    fn row(
        m: Result<Box<dyn CausalLm>>,
        kv: KvDtype,
        prompts: &[usize],
        steps: usize,
        dev: &Device,
        shape: String,
        format: String,
    ) -> Check {
        let r = m.and_then(|m| case(&*m, kv, prompts, steps, dev));
        graph_row("decode graph", "steps", r, steps, shape, format)
    }

    /// The random model of `cfg`; MoE presets through a GGUF written to a temporary file, whose
    /// stacked experts route on the device (the in-memory preset keeps one matmul per expert and
    /// routes on the host, which a graph cannot hold: such steps stay eager).
    fn model(cfg: &HybridConfig, wt: GgmlDType, dev: &Device) -> Result<QwenHybrid> {
        if cfg.moe.is_none() {
            return random_model(cfg, wt, dev);
        }
        let path = std::env::temp_dir().join(format!("tandem-graph-check-{}.gguf", std::process::id()));
        export_random(cfg, wt, &path, |_, _| {})?;
        let m = HybridGgufSource::open(&path, dev).and_then(|src| QwenHybrid::load(&src.config, &src));
        let _ = std::fs::remove_file(&path);
        m
    }

    /// Caches for `prompts` in a store of their own, each prompt prefilled eagerly.
    fn prefilled(
        m: &dyn CausalLm,
        kv: KvDtype,
        prompts: &[usize],
        room: usize,
        dev: &Device,
    ) -> Result<Vec<SequenceCache>> {
        let spec = m.cache_spec();
        let per: Vec<usize> = prompts.iter().map(|p| (p + room).div_ceil(BLOCK)).collect();
        let store = Arc::new(PagedKvStore::new(&spec, per.iter().sum::<usize>().max(1), BLOCK, kv, dev)?);
        let mut first = 0u32;
        let mut caches = Vec::new();
        for (i, (&p, &n)) in prompts.iter().zip(&per).enumerate() {
            let mut c = SequenceCache::new_paged(&spec, store.clone());
            // Blocks in reverse order: tables that are not the identity.
            c.set_block_table(&(first..first + n as u32).rev().collect::<Vec<_>>());
            first += n as u32;
            let ids: Vec<u32> =
                (0..p as u32).map(|t| (t * 131 + 7 * i as u32 + 3) % (m.vocab_size() as u32 - 12)).collect();
            m.forward_eager(&mut [SeqChunk { tokens: &ids, cache: &mut c, logits: LogitsWanted::Last }])?;
            caches.push(c);
        }
        Ok(caches)
    }

    fn argmax(t: &Tensor) -> Result<u32> {
        let v = host_f32(t)?;
        let mut best = 0;
        for (i, x) in v.iter().enumerate() {
            if *x > v[best] {
                best = i;
            }
        }
        Ok(best as u32)
    }

    /// (largest bit difference, steps that ran as graphs, ms of the graph run).
    fn case(m: &dyn CausalLm, kv: KvDtype, prompts: &[usize], steps: usize, dev: &Device) -> Result<(f32, usize, f64)> {
        let mut graph = prefilled(m, kv, prompts, steps, dev)?;
        let mut eager = prefilled(m, kv, prompts, steps, dev)?;
        let mut toks: Vec<u32> = (0..prompts.len() as u32).map(|i| 1 + i).collect();
        let mut err = 0f32;
        let before = m.graph_launches();
        dev.synchronize()?;
        let t0 = std::time::Instant::now();
        for _ in 0..steps {
            let one: Vec<[u32; 1]> = toks.iter().map(|&t| [t]).collect();
            let mut a: Vec<SeqChunk<'_>> = graph
                .iter_mut()
                .zip(&one)
                .map(|(cache, t)| SeqChunk { tokens: t, cache, logits: LogitsWanted::Last })
                .collect();
            let got = m.forward(&mut a)?;
            drop(a);
            let mut b: Vec<SeqChunk<'_>> = eager
                .iter_mut()
                .zip(&one)
                .map(|(cache, t)| SeqChunk { tokens: t, cache, logits: LogitsWanted::Last })
                .collect();
            let want = m.forward_eager(&mut b)?;
            drop(b);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let (Some(g), Some(w)) = (g, w) else { return Ok((f32::INFINITY, 0, 0.0)) };
                err = err.max(bits_err(g, w)?);
                toks[i] = argmax(g)?;
            }
        }
        dev.synchronize()?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let ran = m.graph_launches() - before;
        Ok((err.max(states_err(&graph, &eager)?), ran, ms))
    }
}
