#!/usr/bin/env python3
"""Regenerate the tiny Llama-family golden fixtures (run on a machine with torch + transformers).

For every variant it writes `fixtures/tiny/<name>/` with
  config.json, model.safetensors, tokenizer.json, tokenizer_config.json (HF layout, f32 weights)
  reference.safetensors: prompt_ids [T] i64, prompt_logits [T,V] f32,
                         greedy_ids [N] i64, decode_logits [N,V] f32 (logits that chose greedy_ids[i]),
                         margins [N] f32 (top1 - top2 logit of each greedy step)
Usage: python3 scripts/gen_llama_fixtures.py OUT_DIR
"""
import json, os, sys
import torch
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM, MistralConfig, MistralForCausalLM)
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders

VOCAB = 384
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def make_tokenizer(out):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = open(__file__).read().splitlines() * 4
    text += ["The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?",
             "def add(a, b):\n    return a + b\n", "The capital of France is Paris."] * 50
    tok.train_from_iterator(text, trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    json.dump({"bos_token": None, "eos_token": "<|im_end|>", "chat_template": CHATML,
               "model_max_length": 256}, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=1)
    return tok


def common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-6, initializer_range=0.1, bos_token_id=0, eos_token_id=2,
                torch_dtype="float32")
    base.update(kw)
    return base


VARIANTS = {
    # llama with tied embeddings and Llama-3 style RoPE scaling
    "llama": (LlamaConfig, LlamaForCausalLM, common(tie_word_embeddings=True, rope_theta=10000.0,
              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    # qwen2: qkv bias, untied
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, common(tie_word_embeddings=False, rope_theta=1000000.0)),
    # qwen3 dense: q/k norm, explicit head_dim different from hidden/heads
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, common(tie_word_embeddings=True, head_dim=32, rope_theta=1000000.0)),
    # mistral: untied, plain llama layout (no sliding window within the prompt)
    "mistral": (MistralConfig, MistralForCausalLM, common(tie_word_embeddings=False, sliding_window=None)),
}


def main(out_root):
    torch.manual_seed(0)
    for name, (cfg_cls, model_cls, kw) in VARIANTS.items():
        out = os.path.join(out_root, name)
        os.makedirs(out, exist_ok=True)
        tok = make_tokenizer(out)
        cfg = cfg_cls(**kw)
        cfg._attn_implementation = "eager"
        torch.manual_seed(1234)
        model = model_cls(cfg).float().eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.add_(torch.randn_like(p) * 0.2)
                if n.endswith("bias"):
                    p.copy_(torch.randn_like(p) * 0.1)
        model.save_pretrained(out, safe_serialization=True)
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
                greedy.append(nxt); dec_logits.append(last.clone())
                margins.append(float(top.values[0] - top.values[1]))
                ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
                last = model(ids).logits[0, -1].float()
        save_file({"prompt_ids": prompt[0].to(torch.int64).contiguous(),
                   "prompt_logits": prompt_logits.contiguous(),
                   "greedy_ids": torch.tensor(greedy, dtype=torch.int64),
                   "decode_logits": torch.stack(dec_logits).contiguous(),
                   "margins": torch.tensor(margins, dtype=torch.float32)},
                  os.path.join(out, "reference.safetensors"))
        # a tokenizer reference so the Rust side can check the HF tokenizer.json path too
        text = "Hello, world! def add(a, b): return a + b"
        json.dump({"text": text, "ids": tok.encode(text).ids}, open(os.path.join(out, "tokenizer_case.json"), "w"))
        print(name, "margins min", min(margins), "greedy", greedy[:8])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures/tiny")
