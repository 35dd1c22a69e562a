"""Writes the seeds of the `model_files` fuzz target (fuzz/corpus/model_files/): a tiny Llama
GGUF, a tiny Hugging Face directory (config.json + model.safetensors), a tokenizer.json and two
chat templates, each behind the kind byte `tandem_model::fuzzing::model_files` reads. Run from
the repository root: python3 fuzz/make_seeds.py"""
import json, struct, os

OUT = "fuzz/corpus/model_files"
H, HEADS, KV, HD, FF, V = 8, 2, 1, 4, 16, 16

def u32(x): return struct.pack("<I", x)
def u64(x): return struct.pack("<Q", x)
def gstr(s): b = s.encode(); return u64(len(b)) + b
def f32s(n, seed): return b"".join(struct.pack("<f", ((i * 7 + seed) % 13 - 6) / 10) for i in range(n))

def gguf():
    kvs = [("general.architecture", 8, "llama"), ("general.alignment", 4, 32),
           ("llama.block_count", 4, 1), ("llama.embedding_length", 4, H), ("llama.feed_forward_length", 4, FF),
           ("llama.attention.head_count", 4, HEADS), ("llama.attention.head_count_kv", 4, KV),
           ("llama.context_length", 4, 64), ("llama.rope.freq_base", 6, 10000.0),
           ("llama.attention.layer_norm_rms_epsilon", 6, 1e-6), ("tokenizer.ggml.model", 8, "gpt2"),
           ("tokenizer.ggml.tokens", 9, [f"t{i}" for i in range(V)]), ("tokenizer.ggml.merges", 9, []),
           ("tokenizer.ggml.bos_token_id", 4, 1), ("tokenizer.ggml.eos_token_id", 4, 2)]
    def val(t, v):
        if t == 4: return u32(v)
        if t == 6: return struct.pack("<f", v)
        if t == 8: return gstr(v)
        if t == 9: return u32(8) + u64(len(v)) + b"".join(gstr(x) for x in v)
    ts = [("token_embd.weight", [H, V]), ("output_norm.weight", [H]), ("output.weight", [H, V]),
          ("blk.0.attn_norm.weight", [H]), ("blk.0.attn_q.weight", [H, HEADS * HD]),
          ("blk.0.attn_k.weight", [H, KV * HD]), ("blk.0.attn_v.weight", [H, KV * HD]),
          ("blk.0.attn_output.weight", [HEADS * HD, H]), ("blk.0.ffn_norm.weight", [H]),
          ("blk.0.ffn_gate.weight", [H, FF]), ("blk.0.ffn_up.weight", [H, FF]), ("blk.0.ffn_down.weight", [FF, H])]
    out = b"GGUF" + u32(3) + u64(len(ts)) + u64(len(kvs))
    for k, t, v in kvs: out += gstr(k) + u32(t) + val(t, v)
    infos, data = b"", b""
    for i, (name, dims) in enumerate(ts):
        n = 1
        for d in dims: n *= d
        infos += gstr(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(0) + u64(len(data))
        data += f32s(n, i)
        data += b"\0" * (-len(data) % 32)
    out += infos
    out += b"\0" * (-len(out) % 32)
    return out + data

def hf_dir():
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": FF,
           "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": KV, "vocab_size": V,
           "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False}
    p = "model.layers.0."
    ts = [("model.embed_tokens.weight", [V, H]), ("model.norm.weight", [H]), ("lm_head.weight", [V, H]),
          (p + "input_layernorm.weight", [H]), (p + "self_attn.q_proj.weight", [HEADS * HD, H]),
          (p + "self_attn.k_proj.weight", [KV * HD, H]), (p + "self_attn.v_proj.weight", [KV * HD, H]),
          (p + "self_attn.o_proj.weight", [H, HEADS * HD]), (p + "post_attention_layernorm.weight", [H]),
          (p + "mlp.gate_proj.weight", [FF, H]), (p + "mlp.up_proj.weight", [FF, H]), (p + "mlp.down_proj.weight", [H, FF])]
    header, data = {}, b""
    for i, (name, shape) in enumerate(ts):
        n = 1
        for d in shape: n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + 4 * n]}
        data += f32s(n, i)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return json.dumps(cfg).encode() + b"\xff" + u64(len(h)) + h + data

os.makedirs(OUT, exist_ok=True)
seeds = {
    "gguf-llama": b"\x00" + gguf(),
    "hf-llama": b"\x01" + hf_dir(),
    "tokenizer-qwen2": b"\x02" + open("fixtures/tiny/qwen2/tokenizer.json", "rb").read(),
    "template-chatml": b"\x03{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "template-tools": b"\x03{%- if tools %}{{ tools | tojson }}{% endif %}{%- for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments | tojson }}){% endfor %}{% endif %}[{{ m.role }}]{{ m.content | trim }}{% endfor %}{{ bos_token ~ eos_token }}{{ raise_exception('x') if messages | length > 9 }}",
}
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(", ".join(f"{k} ({len(v)} B)" for k, v in seeds.items()))
