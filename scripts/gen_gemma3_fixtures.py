#!/usr/bin/env python3
"""Regenerate the tiny Gemma 3 golden fixtures (run on a machine with torch + transformers,
e.g. the GPU machine: `python3 scripts/gen_gemma3_fixtures.py fixtures/tiny`).

Writes `fixtures/tiny/gemma3/` in the layout of scripts/gen_llama_fixtures.py (HF config,
f32 model.safetensors, tokenizer, reference.safetensors with prompt_ids, prompt_logits,
greedy_ids, decode_logits, margins). The shape makes every Gemma 3 feature bind: a sliding
window of 8 positions under a 40-token prompt (so it slides in prefill and in every decode
step), local and global layers with different RoPE bases, linear RoPE scaling on the global
layers, query_pre_attn_scalar different from head_dim, GQA, random (1 + w) norm weights.
"""
import json, os, sys
import torch
from safetensors.torch import save_file
from transformers import Gemma3TextConfig, Gemma3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_llama_fixtures import make_tokenizer, VOCAB  # noqa: E402

LAYERS = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]


def config():
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=len(LAYERS),
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
              rms_norm_eps=1e-6, initializer_range=0.1, sliding_window=8, query_pre_attn_scalar=24,
              layer_types=LAYERS, final_logit_softcapping=None, attn_logit_softcapping=None,
              tie_word_embeddings=True, bos_token_id=0, eos_token_id=2, pad_token_id=1,
              hidden_activation="gelu_pytorch_tanh", torch_dtype="float32")
    try:  # transformers >= 5
        cfg = Gemma3TextConfig(**kw, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    except TypeError:
        cfg = Gemma3TextConfig(**kw, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                               rope_scaling={"rope_type": "linear", "factor": 8.0})
    cfg._attn_implementation = "eager"
    return cfg


def main(out_root):
    out = os.path.join(out_root, "gemma3")
    os.makedirs(out, exist_ok=True)
    make_tokenizer(out)
    cfg = config()
    torch.manual_seed(1234)
    model = Gemma3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out, safe_serialization=True)
    print(open(os.path.join(out, "config.json")).read())
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(3, VOCAB, (1, 40), generator=g)
    with torch.no_grad():
        prompt_logits = model(prompt).logits[0].float()
        ids = prompt
        greedy, dec_logits, margins = [], [], []
        last = prompt_logits[-1]
        for _ in range(24):
            top = torch.topk(last, 2)
            nxt = int(top.indices[0])
            greedy.append(nxt)
            dec_logits.append(last.clone())
            margins.append(float(top.values[0] - top.values[1]))
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            last = model(ids).logits[0, -1].float()
        # The window must bind: the same prompt with full attention everywhere differs.
        full = config()
        full.sliding_window = 1 << 20
        ref = Gemma3ForCausalLM(full).float().eval()
        ref.load_state_dict(model.state_dict())
        unbound = (ref(prompt).logits[0].float() - prompt_logits).abs().max().item()
    save_file({"prompt_ids": prompt[0].to(torch.int64).contiguous(),
               "prompt_logits": prompt_logits.contiguous(),
               "greedy_ids": torch.tensor(greedy, dtype=torch.int64),
               "decode_logits": torch.stack(dec_logits).contiguous(),
               "margins": torch.tensor(margins, dtype=torch.float32)},
              os.path.join(out, "reference.safetensors"))
    print("gemma3 margins min", min(margins), "greedy", greedy[:8], "window effect", unbound)
    assert unbound > 1e-3, "the sliding window does not change the logits: it does not bind"


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures/tiny")
