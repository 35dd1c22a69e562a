#!/usr/bin/env python3
"""A random-weight Hugging Face Llama checkpoint of SmolLM2-135M's shape (30 layers, hidden 576,
9 query / 3 KV heads of 64, SwiGLU 1536, vocabulary 49,152, tied embeddings), in bf16, for
measuring the same weights through mlx-lm and tandem (`mlx_lm convert` it first; issue 18's peer
benchmark). The tokenizer and chat template come from TOKENIZER_DIR (e.g. SmolLM2's own, written
from its GGUF by scripts/gguf_tokenizer_to_hf.py), else the tiny MLX Llama fixture's (whose few
hundred ids leave most of the vocabulary without text).

Usage: python3 scripts/gen_random_llama_hf.py OUT_DIR [TOKENIZER_DIR]
"""
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx

out = Path(sys.argv[1])
tok_dir = Path(sys.argv[2] if len(sys.argv) > 2 else "fixtures/mlx/llama-q4-g64")
out.mkdir(parents=True, exist_ok=True)
H, L, NH, NKV, HD, FF, V = 576, 30, 9, 3, 64, 1536, 49152
mx.random.seed(7)


def w(*shape, scale=0.02):
    return (mx.random.normal(shape) * scale).astype(mx.bfloat16)


t = {"model.embed_tokens.weight": w(V, H), "model.norm.weight": mx.ones((H,), dtype=mx.bfloat16)}
for i in range(L):
    p = f"model.layers.{i}."
    t[p + "self_attn.q_proj.weight"] = w(NH * HD, H)
    t[p + "self_attn.k_proj.weight"] = w(NKV * HD, H)
    t[p + "self_attn.v_proj.weight"] = w(NKV * HD, H)
    t[p + "self_attn.o_proj.weight"] = w(H, NH * HD)
    t[p + "mlp.gate_proj.weight"] = w(FF, H)
    t[p + "mlp.up_proj.weight"] = w(FF, H)
    t[p + "mlp.down_proj.weight"] = w(H, FF)
    t[p + "input_layernorm.weight"] = mx.ones((H,), dtype=mx.bfloat16)
    t[p + "post_attention_layernorm.weight"] = mx.ones((H,), dtype=mx.bfloat16)
mx.save_safetensors(str(out / "model.safetensors"), t, metadata={"format": "pt"})
cfg = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": H,
    "num_hidden_layers": L,
    "num_attention_heads": NH,
    "num_key_value_heads": NKV,
    "head_dim": HD,
    "intermediate_size": FF,
    "hidden_act": "silu",
    "vocab_size": V,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 2,
}
(out / "config.json").write_text(json.dumps(cfg, indent=2))
for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
    if (tok_dir / f).exists():
        shutil.copy(tok_dir / f, out / f)
print("wrote", out)
