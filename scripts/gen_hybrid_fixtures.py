#!/usr/bin/env python3
"""Regenerate the tiny hybrid (Gated DeltaNet + gated attention) golden fixtures.

Run on a machine with torch + transformers >= 5.17 (we used the device machine, CPU only, f32):
    python3 scripts/gen_hybrid_fixtures.py OUT_DIR        # e.g. fixtures/hybrid

For `qwen3_next`, `qwen3_5` (dense, text) and `qwen3_5_moe` (text weights in the
`Qwen3_5MoeForConditionalGeneration` layout: `model.language_model.*`, nested `text_config`,
fused `experts.gate_up_proj` / `experts.down_proj`) it writes
`OUT_DIR/<name>/` with config.json, model.safetensors (f32, plus random `mtp.*` weights),
tokenizer.json, tokenizer_config.json, keys.txt and reference.safetensors holding
  prompt_ids [T] i64, prompt_logits [T,V], greedy_ids [N] i64, decode_logits [N,V] (the logits that
  chose greedy_ids[i]), margins [N] (top1 - top2), final_hidden [T,H] (post `model.norm`),
  mtp_logits_tail [M,V] (MTP logits of positions T-M..T-1, MTP input at p = final_hidden[p] and
  token p+1 of prompt ++ [greedy_ids[0]]), mtp_tail_start [1] i64, mtp_draft_ids [2] i64 and
  mtp_draft_logits [2,V] (k = 2 drafting from the last prompt position, feeding the MTP's own
  post-`mtp.norm` output back at position T).
transformers ignores `mtp.*`, so the MTP reference below is written from the spec
(docs: qwen-hybrid-architecture.md §8) in float64; its decoder layer is checked against
transformers' own full-attention layer on the main model.
"""
import dataclasses, json, os, re, sys, traceback
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_llama_fixtures import make_tokenizer, VOCAB  # noqa: E402

T_PROMPT, N_GREEDY, MTP_TAIL = 150, 16, 24
LAYER_TYPES = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
FULL_IDX = 2
ROPE = {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25}


def base(**kw):
    d = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, layer_types=LAYER_TYPES,
             num_attention_heads=2, num_key_value_heads=1, head_dim=32,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
             linear_value_head_dim=24, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
             initializer_range=0.15, max_position_embeddings=512, hidden_act="silu",
             attention_bias=False, bos_token_id=0, eos_token_id=2)
    d.update(kw)
    return d


MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16)
VARIANTS = {
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   base(tie_word_embeddings=False, intermediate_size=48, norm_topk_prob=True,
                        decoder_sparse_step=1, mlp_only_layers=[1], partial_rotary_factor=0.25,
                        rope_parameters=dict(ROPE), **MOE)),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                base(tie_word_embeddings=True, intermediate_size=48,
                     rope_parameters=dict(ROPE, mrope_section=[2, 1, 1], mrope_interleaved=True))),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
                    base(tie_word_embeddings=False,
                         rope_parameters=dict(ROPE, mrope_section=[2, 1, 1], mrope_interleaved=True), **MOE)),
}


def build(cfg_name, model_name, kw):
    cfg_cls, model_cls = getattr(transformers, cfg_name), getattr(transformers, model_name)
    try:
        cfg = cfg_cls(**kw)
    except Exception as e:  # strict configs may refuse keys they do not know
        print("  config kwargs refused:", e)
        names = {f.name for f in dataclasses.fields(cfg_cls)}
        cfg = cfg_cls(**{k: v for k, v in kw.items() if k in names})
    cfg._attn_implementation = "eager"
    torch.manual_seed(1234)
    model = model_cls(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if not torch.isfinite(p).all() or p.abs().max() > 20 or (p.dim() >= 2 and p.std() < 1e-4):
                print("  re-initialising", n)
                p.normal_(0, 0.15)
            if n.endswith("A_log"):
                p.copy_(torch.randn_like(p) * 0.5 - 1.5)
            elif n.endswith("dt_bias"):
                p.copy_(torch.randn_like(p) * 0.5)
            elif "norm" in n:
                p.add_(torch.randn_like(p) * 0.2)
    print("  layer_types", cfg.layer_types, "rope", getattr(cfg, "rope_parameters", None),
          "inv_freq", tuple(model.model.rotary_emb.inv_freq.shape))
    return cfg, model_cls, model


# ---------------- independent float64 reference of the MTP head (spec §8, §5, §6) ----------------

def rms1p(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def rope(x, pos, rot, theta):  # x [N, heads, hd]; NeoX pairing (i, i + rot/2) on the first rot dims
    half = rot // 2
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = pos.double()[:, None] * inv[None]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:rot]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rot:]], -1)


def swiglu(x, g, u, d):
    return (F.silu(x @ g.T) * (x @ u.T)) @ d.T


def mlp(x, W, p, c):
    if p + "gate.weight" not in W:
        return swiglu(x, W[p + "gate_proj.weight"], W[p + "up_proj.weight"], W[p + "down_proj.weight"])
    probs = torch.softmax(x @ W[p + "gate.weight"].T, -1)
    topv, topi = probs.topk(c["num_experts_per_tok"], -1)
    topv = topv / topv.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    I = c["moe_intermediate_size"]
    for e in range(c["num_experts"]):
        if p + "experts.gate_up_proj" in W:
            gu, dn = W[p + "experts.gate_up_proj"][e], W[p + "experts.down_proj"][e]
            y = swiglu(x, gu[:I], gu[I:], dn)
        else:
            q = f"{p}experts.{e}."
            y = swiglu(x, W[q + "gate_proj.weight"], W[q + "up_proj.weight"], W[q + "down_proj.weight"])
        out = out + (topv * (topi == e)).sum(-1, keepdim=True) * y
    sh = swiglu(x, W[p + "shared_expert.gate_proj.weight"], W[p + "shared_expert.up_proj.weight"],
                W[p + "shared_expert.down_proj.weight"])
    return out + torch.sigmoid(x @ W[p + "shared_expert_gate.weight"].T) * sh


def attention_layer(x, W, p, pos, c):
    N, eps = x.shape[0], c["rms_norm_eps"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    rot = int(hd * c["partial_rotary_factor"])
    h = rms1p(x, W[p + "input_layernorm.weight"], eps)
    qg = (h @ W[p + "self_attn.q_proj.weight"].T).view(N, nh, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:]
    k = (h @ W[p + "self_attn.k_proj.weight"].T).view(N, nkv, hd)
    v = (h @ W[p + "self_attn.v_proj.weight"].T).view(N, nkv, hd)
    q = rope(rms1p(q, W[p + "self_attn.q_norm.weight"], eps), pos, rot, c["rope_theta"])
    k = rope(rms1p(k, W[p + "self_attn.k_norm.weight"], eps), pos, rot, c["rope_theta"])
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    s = torch.einsum("ihd,jhd->hij", q, k) / hd ** 0.5
    s = s.masked_fill(torch.triu(torch.ones(N, N, dtype=torch.bool), 1), float("-inf"))
    o = torch.einsum("hij,jhd->ihd", torch.softmax(s, -1), v) * torch.sigmoid(gate)
    x = x + o.reshape(N, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
    return x + mlp(rms1p(x, W[p + "post_attention_layernorm.weight"], eps), W, p + "mlp.", c)


def mtp_forward(hidden, toks, pos, W, emb, lm, c):
    eps = c["rms_norm_eps"]
    e = rms1p(emb[toks], W["mtp.pre_fc_norm_embedding.weight"], eps)
    h = rms1p(hidden, W["mtp.pre_fc_norm_hidden.weight"], eps)
    x = torch.cat([e, h], -1) @ W["mtp.fc.weight"].T
    x = attention_layer(x, W, "mtp.layers.0.", pos, c)
    y = rms1p(x, W["mtp.norm.weight"], eps)
    return y @ lm.T, y


def add_mtp(sd, prefix, H):
    g = torch.Generator().manual_seed(99)
    rnd = lambda shape, s: torch.randn(shape, generator=g, dtype=torch.float32) * s
    lp = f"{prefix}layers.{FULL_IDX}."
    new = {"mtp.layers.0." + k[len(lp):]: rnd(v.shape, 0.2 if "norm" in k else 0.15)
           for k, v in sd.items() if k.startswith(lp)}
    for n in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"]:
        new[f"mtp.{n}.weight"] = rnd((H,), 0.2)
    new["mtp.fc.weight"] = rnd((H, 2 * H), 0.15)
    return new


def fuse_experts(sd):
    """Per-expert `experts.{e}.{gate,up,down}_proj.weight` -> the released Qwen3.5-MoE layout:
    `experts.gate_up_proj` [E, 2I, H] (gate rows first) and `experts.down_proj` [E, H, I]."""
    out, groups = {}, {}
    for k, v in sd.items():
        m = re.match(r"(.*\.mlp\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", k)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = v
        else:
            out[k] = v
    for p, g in groups.items():
        n = 1 + max(e for e, _ in g)
        out[p + "gate_up_proj"] = torch.stack([torch.cat([g[(e, "gate_proj")], g[(e, "up_proj")]]) for e in range(n)])
        out[p + "down_proj"] = torch.stack([g[(e, "down_proj")] for e in range(n)])
    return out


def flat_cfg(cfg):
    d = cfg.to_dict()
    rp = d.get("rope_parameters") or {}
    d.setdefault("rope_theta", rp.get("rope_theta", 1e6))
    d["rope_theta"] = rp.get("rope_theta", d["rope_theta"])
    d["partial_rotary_factor"] = rp.get("partial_rotary_factor", d.get("partial_rotary_factor", 0.25))
    return d


def generate(name, cfg_name, model_name, kw, out_root):
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    make_tokenizer(out)
    cfg, model_cls, model = build(cfg_name, model_name, kw)
    c = flat_cfg(cfg)
    model.save_pretrained(out)
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(3, VOCAB, (1, T_PROMPT), generator=g)
    seen = {}

    def hook(_m, args, kwargs, output):
        seen["in"] = args[0] if args else kwargs["hidden_states"]
        seen["out"] = output[0] if isinstance(output, (tuple, list)) else output
    handle = model.model.layers[FULL_IDX].register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        prompt_logits = model(prompt).logits[0].float()
        handle.remove()
        final_hidden = model.model(prompt).last_hidden_state[0].float()
        print("  lm_head(final_hidden) vs logits", float((model.lm_head(final_hidden) - prompt_logits).abs().max()))
        reloaded = model_cls.from_pretrained(out).float().eval()
        reloaded.config._attn_implementation = "eager"
        print("  reload logits diff", float((reloaded(prompt).logits[0] - prompt_logits).abs().max()))
        ids, greedy, dec_logits, margins, last = prompt, [], [], [], prompt_logits[-1]
        for _ in range(N_GREEDY):
            top = torch.topk(last, 2)
            nxt = int(top.indices[0])
            greedy.append(nxt); dec_logits.append(last.clone()); margins.append(float(top.values[0] - top.values[1]))
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            last = model(ids).logits[0, -1].float()
    sd = load_file(os.path.join(out, "model.safetensors"))
    prefix = "model."
    mtp = add_mtp(sd, prefix, c["hidden_size"])
    W = {k: v.double() for k, v in {**sd, **mtp}.items()}
    emb = W[prefix + "embed_tokens.weight"]
    lm = W.get("lm_head.weight", emb)
    pos = torch.arange(T_PROMPT)
    # The spec's decoder layer against transformers' own full-attention layer of the main model.
    mine = attention_layer(seen["in"][0].double(), W, f"{prefix}layers.{FULL_IDX}.", pos, c)
    print("  reference layer vs transformers layer", float((mine - seen["out"][0].double()).abs().max()))
    toks = torch.cat([prompt[0], torch.tensor([greedy[0]])])[1:]
    logits, y = mtp_forward(final_hidden.double(), toks, pos, W, emb, lm, c)
    d1 = int(logits[-1].argmax())
    logits2, _ = mtp_forward(torch.cat([final_hidden.double(), y[-1:]]), torch.cat([toks, torch.tensor([d1])]),
                             torch.arange(T_PROMPT + 1), W, emb, lm, c)
    d2 = int(logits2[-1].argmax())
    print("  mtp drafts", d1, d2, "greedy", greedy[:3], "margins min", min(margins))
    if name == "qwen3_5_moe":  # the released checkpoint layout (Qwen3_5MoeForConditionalGeneration)
        sd = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in sd.items()}
        sd, mtp = fuse_experts(sd), fuse_experts(mtp)
        W2 = {k: v.double() for k, v in mtp.items()}
        W2.update({k: v for k, v in W.items() if not k.startswith("mtp.")})
        print("  mtp with fused experts vs per-expert", float((mtp_forward(final_hidden.double(), toks, pos, W2, emb, lm, c)[0] - logits).abs().max()))
    save_file({**sd, **mtp}, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cj = json.load(open(os.path.join(out, "config.json")))
    if name == "qwen3_next":
        cj["num_nextn_predict_layers"] = 1
    else:
        cj["mtp_num_hidden_layers"] = 1
    if name == "qwen3_5_moe":
        cj = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
              "tie_word_embeddings": cj.get("tie_word_embeddings", False), "text_config": cj}
    json.dump(cj, open(os.path.join(out, "config.json"), "w"), indent=1)
    keys = sorted({**sd, **mtp}.items())
    with open(os.path.join(out, "keys.txt"), "w") as f:
        for k, v in keys:
            f.write(f"{k} {list(v.shape)}\n")
    pat = sorted({re.sub(r"\.(\d+)\.", ".N.", k) + " " + str(list(v.shape)) for k, v in keys if ".layers.1." not in k})
    print("  keys:", *pat, sep="\n    ")
    save_file({"prompt_ids": prompt[0].to(torch.int64).contiguous(),
               "prompt_logits": prompt_logits.contiguous(),
               "greedy_ids": torch.tensor(greedy, dtype=torch.int64),
               "decode_logits": torch.stack(dec_logits).contiguous(),
               "margins": torch.tensor(margins, dtype=torch.float32),
               "final_hidden": final_hidden.contiguous(),
               "mtp_logits_tail": logits[-MTP_TAIL:].float().contiguous(),
               "mtp_tail_start": torch.tensor([T_PROMPT - MTP_TAIL], dtype=torch.int64),
               "mtp_draft_ids": torch.tensor([d1, d2], dtype=torch.int64),
               "mtp_draft_logits": torch.stack([logits[-1], logits2[-1]]).float().contiguous()},
              os.path.join(out, "reference.safetensors"))


def main(out_root):
    torch.set_num_threads(8)
    print("transformers", transformers.__version__, "torch", torch.__version__)
    print([n for n in dir(transformers) if n.startswith(("Qwen3_5", "Qwen3Next"))])
    for name, (cfg_name, model_name, kw) in VARIANTS.items():
        print("==", name)
        try:
            generate(name, cfg_name, model_name, kw, out_root)
        except Exception:
            traceback.print_exc()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures/hybrid")
