#!/usr/bin/env python3
"""Writes a GGUF file's byte-level BPE tokenizer (`tokenizer.ggml.model` = gpt2: SmolLM2, Qwen,
Llama 3) as Hugging Face `tokenizer.json` + `tokenizer_config.json` (chat template, bos / eos)
into a directory, so that a random-weight HF checkpoint of the same shape gets the real
vocabulary (scripts/gen_random_llama_hf.py). Needs the `gguf` and `tokenizers` packages (the
venv `make test-mlx` makes has tokenizers; `pip install gguf`). Digits are split one by one, as
SmolLM2's and Qwen's pre-tokenizers do; the text of other pre-tokenizer rules may differ a
little from the original's, which is fine for benchmarks that feed both systems the same file.

Usage: python3 scripts/gguf_tokenizer_to_hf.py MODEL.gguf OUT_DIR
"""
import json
import sys
from pathlib import Path

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

src, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
r = GGUFReader(src)


def field(name):
    f = r.fields.get(name)
    if f is None:
        return None
    if len(f.data) == 1 and f.types and f.types[0].name != "ARRAY":
        v = f.parts[f.data[0]]
        return bytes(v).decode("utf-8") if f.types[0].name == "STRING" else v.tolist()[0]
    if f.types[-1].name == "STRING":
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    return [f.parts[i].tolist()[0] for i in f.data]


model = field("tokenizer.ggml.model")
if model != "gpt2":
    sys.exit(f"{src}: tokenizer.ggml.model is {model!r}; only byte-level BPE (gpt2) is written")
tokens = field("tokenizer.ggml.tokens")
types = field("tokenizer.ggml.token_type") or [1] * len(tokens)
merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
tok.pre_tokenizer = pre_tokenizers.Sequence(
    [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
)
tok.decoder = decoders.ByteLevel()
# Control tokens (type 3) are special: never split, skipped when decoding.
tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
tok.save(str(out / "tokenizer.json"))
bos, eos = field("tokenizer.ggml.bos_token_id"), field("tokenizer.ggml.eos_token_id")
cfg = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": tokens[bos] if bos is not None else None,
    "eos_token": tokens[eos] if eos is not None else None,
    "add_bos_token": bool(field("tokenizer.ggml.add_bos_token") or False),
    "model_max_length": 8192,
}
tmpl = field("tokenizer.chat_template")
if tmpl:
    cfg["chat_template"] = tmpl
    (out / "chat_template.jinja").write_text(tmpl)
(out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
print(f"wrote {out}: {len(tokens)} tokens, {len(merges)} merges, eos {cfg['eos_token']!r}")
