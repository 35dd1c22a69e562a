//! `tandem convert`: a Hugging Face checkpoint of the hybrid family (Qwen3.5 dense and MoE,
//! Qwen3-Next) written as a llama.cpp-style GGUF (`arch::qwen_hybrid::to_gguf`: llama.cpp's
//! converter transforms), keeping the MTP head (llama.cpp drops Qwen3-Next's), or of the Llama
//! family (`arch::llama_to_gguf`), its weight matrices optionally quantised; or (`--mlx`) any Hugging Face checkpoint tandem loads written
//! as an MLX-format directory (`loader::mlx_write`: affine-quantised, the layout mlx-lm loads,
//! the MTP head kept where mlx-lm's converter drops it).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tandem_model::arch::qwen_hybrid::to_gguf::{export_hf_dir, ExportOptions};

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// A Hugging Face directory (config.json + safetensors + tokenizer.json): a hybrid or
    /// Llama-family model for GGUF (an MLX checkpoint of a hybrid too: dequantised), any model
    /// tandem loads for `--mlx`.
    pub input: PathBuf,
    /// The GGUF file to write (with `--mlx`: the directory).
    pub output: PathBuf,
    /// Write an MLX-format directory (mlx-lm's affine quantisation) instead of a GGUF.
    #[arg(long)]
    pub mlx: bool,
    /// With `--mlx`: bits per weight (2, 3, 4, 5, 6 or 8).
    #[arg(long, default_value_t = 4, requires = "mlx")]
    pub bits: usize,
    /// With `--mlx`: values per quantisation group (32, 64 or 128).
    #[arg(long, default_value_t = 64, requires = "mlx")]
    pub group_size: usize,
    /// Quantise the weight matrices: q8_0, q6_k, q5_k, q5_0, q4_k, q4_0, q3_k, q2_k (rows that
    /// fit no block of the type stay f32); norms, the conv and routers stay f32.
    #[arg(long, value_parser = parse_quant)]
    pub quantize: Option<tandem_model::loader::quantize::WeightQuant>,
}

fn parse_quant(s: &str) -> Result<tandem_model::loader::quantize::WeightQuant, String> {
    s.parse().map_err(|e: tandem_model::ModelError| e.to_string())
}

pub fn run(a: ConvertArgs) -> anyhow::Result<()> {
    if a.mlx {
        return run_mlx(&a);
    }
    let t = std::time::Instant::now();
    if tandem_model::arch::qwen_hybrid::is_hybrid_dir(&a.input) {
        let opts = ExportOptions { quantize: a.quantize.map(|q| q.0), qwen3next_mtp: true, ..Default::default() };
        export_hf_dir(&a.input, &a.output, &opts)
            .with_context(|| format!("cannot convert {} to {}", a.input.display(), a.output.display()))?;
    } else {
        // Llama family (Llama, Mistral, SmolLM2, Qwen2/2.5, Qwen3); anything else is refused there.
        tandem_model::arch::llama_to_gguf::export_llama_dir(&a.input, &a.output, a.quantize.map(|q| q.0))
            .with_context(|| format!("cannot convert {} to {}", a.input.display(), a.output.display()))?;
    }
    let bytes = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
    let summary = tandem_model::loader::summarize(&a.output)?;
    println!(
        "wrote {} ({:.1} MB, {}) in {:.1} s",
        a.output.display(),
        bytes as f64 / 1e6,
        summary.architecture,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn run_mlx(a: &ConvertArgs) -> anyhow::Result<()> {
    if a.quantize.is_some() {
        anyhow::bail!("--quantize picks a GGUF type; with --mlx give --bits and --group-size");
    }
    let opts = tandem_model::loader::mlx_write::MlxWriteOptions { bits: a.bits, group: a.group_size };
    let t = std::time::Instant::now();
    let s = tandem_model::loader::mlx_write::write_mlx(&a.input, &a.output, &opts)
        .with_context(|| format!("cannot write {} as MLX into {}", a.input.display(), a.output.display()))?;
    let summary = tandem_model::loader::summarize(&a.output)?;
    println!(
        "wrote {} ({:.1} MB: {} matrices at {} bits in groups of {}, {} tensors as they were, {} of them the MTP head; {}) in {:.1} s",
        a.output.display(),
        s.bytes as f64 / 1e6,
        s.quantised,
        a.bits,
        a.group_size,
        s.kept,
        s.mtp_tensors,
        summary.architecture,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
