#!/usr/bin/env python3
"""A random-weight Hugging Face checkpoint of the Qwen3.5-0.8B shape (tandem's `0.8b` preset:
24 layers, every 4th attention, hidden 1024, GDN 16/16 heads of 128, attention 8/2 heads of
256 with a quarter rotary, SwiGLU 3584, vocabulary 248,320, tied), in bf16, with a config both
tandem and mlx-lm read (`model_type: qwen3_5`, RoPE keys at the top level). For measuring the
same weights through mlx-lm and tandem (`mlx_lm convert` it first). The tokenizer is the tiny
fixture's (384 tokens): the benchmarks feed token ids.

Usage: python3 scripts/gen_random_hybrid_hf.py OUT_DIR [fixtures]
"""
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

out = Path(sys.argv[1])
fixtures = Path(sys.argv[2] if len(sys.argv) > 2 else "fixtures")
out.mkdir(parents=True, exist_ok=True)
L, H, V, I = 24, 1024, 248320, 3584
NK, NV, DK, DV, KC = 16, 16, 128, 128, 4
NH, NKV, HD = 8, 2, 256
rng = np.random.default_rng(0)


def bf16(x):
    return mx.array(np.asarray(x, dtype=np.float32)).astype(mx.bfloat16)


def mat(rows, cols):
    return bf16(rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols))


tensors = {}


def put(name, arr):
    tensors[name] = arr if isinstance(arr, mx.array) else mx.array(arr)


put("model.embed_tokens.weight", mat(V, H))
put("model.norm.weight", bf16(np.zeros(H)))
for l in range(L):
    p = f"model.layers.{l}."
    put(p + "input_layernorm.weight", bf16(np.zeros(H)))
    put(p + "post_attention_layernorm.weight", bf16(np.zeros(H)))
    put(p + "mlp.gate_proj.weight", mat(I, H))
    put(p + "mlp.up_proj.weight", mat(I, H))
    put(p + "mlp.down_proj.weight", mat(H, I))
    if (l + 1) % 4 == 0:
        a = p + "self_attn."
        put(a + "q_proj.weight", mat(2 * NH * HD, H))
        put(a + "k_proj.weight", mat(NKV * HD, H))
        put(a + "v_proj.weight", mat(NKV * HD, H))
        put(a + "o_proj.weight", mat(H, NH * HD))
        put(a + "q_norm.weight", bf16(np.zeros(HD)))
        put(a + "k_norm.weight", bf16(np.zeros(HD)))
    else:
        g = p + "linear_attn."
        ch = 2 * NK * DK + NV * DV
        put(g + "in_proj_qkv.weight", mat(ch, H))
        put(g + "in_proj_z.weight", mat(NV * DV, H))
        put(g + "in_proj_b.weight", mat(NV, H))
        put(g + "in_proj_a.weight", mat(NV, H))
        put(g + "conv1d.weight", bf16(rng.standard_normal((ch, 1, KC), dtype=np.float32) / 2))
        put(g + "A_log", np.log(1 + 15 * rng.random(NV, dtype=np.float32)).astype(np.float32))
        put(g + "dt_bias", bf16(np.ones(NV)))
        put(g + "norm.weight", bf16(np.ones(DV)))
        put(g + "out_proj.weight", mat(H, NV * DV))
mx.save_safetensors(str(out / "model.safetensors"), tensors)
cfg = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5",
    "vocab_size": V,
    "hidden_size": H,
    "intermediate_size": I,
    "num_hidden_layers": L,
    "layer_types": ["full_attention" if (l + 1) % 4 == 0 else "linear_attention" for l in range(L)],
    "full_attention_interval": 4,
    "num_attention_heads": NH,
    "num_key_value_heads": NKV,
    "head_dim": HD,
    "linear_num_key_heads": NK,
    "linear_num_value_heads": NV,
    "linear_key_head_dim": DK,
    "linear_value_head_dim": DV,
    "linear_conv_kernel_dim": KC,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": None,
    "eos_token_id": 2,
}
(out / "config.json").write_text(json.dumps(cfg, indent=2))
for f in ["tokenizer.json", "tokenizer_config.json"]:
    shutil.copy(fixtures / "hybrid" / "qwen3_5" / f, out / f)
print("wrote", out)
