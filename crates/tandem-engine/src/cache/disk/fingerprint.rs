//! The disk tier's namespace: a fingerprint of everything an entry's bytes depend on. The
//! weights are identified by a hash of each model file's length, its first 16 MiB (a GGUF's
//! metadata, tensor table and tokenizer; a safetensors header) and 32 evenly spaced 64 KiB
//! samples of the rest (reading every byte of a 20 GB model at each start would cost more than
//! it saves; a file changed only outside the sampled bytes would go unnoticed, which is the
//! price, stated here). A directory (HF checkpoint) hashes its `*.safetensors`, `*.gguf` and
//! `*.json` files in name order. Models built in memory (the random presets) hash their
//! summary, which names the preset, type and seed. On top come the architecture and layer
//! shapes, the tokenizer's vocabulary size and special ids, the KV format, the block size and
//! the on-disk format version.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use tandem_model::kv::{KvDtype, LayerCacheSpec};
use tandem_model::loader::ModelSummary;
use xxhash_rust::xxh3::Xxh3;

const HEAD: u64 = 16 << 20;
const SAMPLES: u64 = 32;
const SAMPLE: u64 = 64 << 10;

fn hash_file(h: &mut Xxh3, path: &Path) -> std::io::Result<()> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    h.update(&len.to_le_bytes());
    let mut buf = vec![0u8; HEAD.min(len) as usize];
    f.read_exact(&mut buf)?;
    h.update(&buf);
    if len > HEAD {
        let rest = len - HEAD;
        let mut s = vec![0u8; SAMPLE.min(rest) as usize];
        for i in 0..SAMPLES {
            let at = HEAD + (rest - s.len() as u64) * i / (SAMPLES - 1);
            f.seek(SeekFrom::Start(at))?;
            f.read_exact(&mut s)?;
            h.update(&s);
        }
    }
    Ok(())
}

/// The weights' part: model files as described above, or the summary for in-memory models.
pub fn weights(summary: &ModelSummary) -> std::io::Result<u128> {
    let mut h = Xxh3::new();
    let path = Path::new(&summary.path);
    if path.is_file() {
        hash_file(&mut h, path)?;
    } else if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors" || e == "gguf" || e == "json"))
            .collect();
        files.sort();
        for f in files {
            h.update(f.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
            hash_file(&mut h, &f)?;
        }
    } else if !summary.path.is_empty() {
        h.update(format!("{summary:?}").as_bytes());
    } else {
        // An in-memory model that does not say what it is: nothing safe to key entries by.
        return Err(std::io::Error::other("the model has no file and no name to fingerprint"));
    }
    Ok(h.digest128())
}

/// Everything else the bytes depend on, with the weights' hash.
pub fn namespace(
    weights: u128,
    summary: &ModelSummary,
    spec: &[LayerCacheSpec],
    vocab: usize,
    eos: &[u32],
    kv: KvDtype,
    block_size: usize,
) -> u128 {
    let mut h = Xxh3::new();
    h.update(&super::format::FORMAT_VERSION.to_le_bytes());
    h.update(&weights.to_le_bytes());
    h.update(summary.architecture.as_bytes());
    h.update(format!("{spec:?}|{vocab}|{eos:?}|{kv}|{block_size}").as_bytes());
    h.digest128()
}
