//! `tandem inspect`: what a checkpoint is, without running it.

use clap::Args;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Model: GGUF file, HF directory, HF cache repo id or catalogue alias.
    pub model: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print the whole chat template.
    #[arg(long)]
    pub template: bool,
}

pub fn run(a: InspectArgs) -> anyhow::Result<()> {
    let reporter = crate::progress::pull_reporter();
    let src = tandem_model::resolve::resolve(&a.model, false, &reporter)?;
    let s = tandem_model::loader::summarize(src.path())?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!("path:            {}", s.path);
    println!("format:          {}", s.format);
    println!("architecture:    {}", s.architecture);
    println!("parameters:      {} ({:.1} M)", s.parameters, s.parameters as f64 / 1e6);
    println!("file size:       {:.1} MB", s.file_bytes as f64 / 1e6);
    println!("context length:  {}", s.context_length);
    println!("vocab size:      {}", s.vocab_size);
    println!(
        "layers:          {} (hidden {}, heads {}/{} kv, head_dim {})",
        s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim
    );
    println!("tied embeddings: {}", s.tie_word_embeddings);
    println!("rope:            {}", s.rope);
    let types: Vec<String> = s.tensor_types.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!("tensor types:    {}", types.join(", "));
    match &s.chat_template {
        Some(t) if a.template => println!("chat template:\n{t}"),
        Some(t) => {
            let first: String = t.chars().take(160).collect();
            println!(
                "chat template:   {} chars: {}{}",
                t.len(),
                first.replace('\n', "\\n"),
                if t.len() > 160 { "…" } else { "" }
            );
        }
        None => println!("chat template:   none (ChatML is used)"),
    }
    Ok(())
}
