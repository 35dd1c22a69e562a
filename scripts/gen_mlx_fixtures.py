#!/usr/bin/env python3
"""MLX-format fixtures: fixtures/tiny/llama (and the hybrids, below) converted by mlx-lm's own converter (affine
quantisation, f16 scales and biases) at 4 bits in groups of 32 and 64, 8 bits in groups of 64,
2 bits in groups of 64, 3 in groups of 32, 5 in groups of 64 and 6 in groups of 32, and in the
floating-point modes mxfp4, nvfp4 and mxfp8, each with mlx-lm's logits for the tiny fixture's reference prompt
(`mlx_reference.safetensors`: prompt_ids, prompt_logits f32). tandem's loader is tested
against these (crates/tandem-model/tests/mlx.rs).

Needs `pip install mlx==0.32.4 mlx-cpu==0.32.4 mlx-lm==0.32.2` (runs on Linux x86 CPUs).
Usage: python3 scripts/gen_mlx_fixtures.py [fixtures]
"""
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm import load
from safetensors.numpy import load_file, save_file

root = Path(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
ref = load_file(str(root / "tiny" / "llama" / "reference.safetensors"))
# mlx-lm reads RoPE settings from the pre-transformers-5 keys (`rope_theta`, `rope_scaling`),
# not `rope_parameters`: convert a copy whose config says the same in those keys (tandem reads
# both), so that mlx-lm runs the same model.
src = Path(tempfile.mkdtemp()) / "llama"
shutil.copytree(root / "tiny" / "llama", src)
cfg = json.loads((src / "config.json").read_text())
rp = cfg.pop("rope_parameters")
cfg["rope_theta"] = rp.pop("rope_theta")
cfg["rope_scaling"] = rp
(src / "config.json").write_text(json.dumps(cfg, indent=2))
check, _ = load(str(src))
err = np.abs(np.array(check(mx.array([[int(x) for x in ref["prompt_ids"]]]))[0]) - ref["prompt_logits"]).max()
print("mlx-lm on the f32 copy vs transformers, max abs logit error:", err)
assert err < 1e-3 * np.abs(ref["prompt_logits"]).max()
ids = [int(x) for x in ref["prompt_ids"]]
# WIDTHS=2:64,3:32 (bits:group, comma-separated) regenerates only those.
import os
# The floating-point modes (mxfp4, nvfp4, mxfp8) fix bits and group: WIDTHS=mxfp4,nvfp4.
FP = {"mxfp4": (4, 32), "nvfp4": (4, 16), "mxfp8": (8, 32)}
widths = [(4, 32, "affine"), (4, 64, "affine"), (8, 64, "affine"), (2, 64, "affine"), (3, 32, "affine"),
          (5, 64, "affine"), (6, 32, "affine")] + [(*FP[m], m) for m in FP]
if os.environ.get("WIDTHS"):
    widths = [(*FP[w], w) if w in FP else (*(int(x) for x in w.split(":")), "affine")
              for w in os.environ["WIDTHS"].split(",")]
for bits, group, mode in widths:
    out = root / "mlx" / (f"llama-q{bits}-g{group}" if mode == "affine" else f"llama-{mode}")
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(src), "--mlx-path", str(out), "-q",
         "--q-bits", str(bits), "--q-group-size", str(group), "--q-mode", mode, "--dtype", "float16"],
        check=True,
    )
    (out / "README.md").unlink(missing_ok=True)
    model, _ = load(str(out))
    logits = model(mx.array([ids]))[0].astype(mx.float32)
    tensors = {"prompt_ids": np.array(ids, dtype=np.int64), "prompt_logits": np.array(logits)}
    # mlx's own dequantisation (in f32) of two weights, to check tandem's unpacking exactly.
    w = mx.load(str(out / "model.safetensors"))
    for name in ["model.layers.0.mlp.down_proj", "model.embed_tokens"]:
        if mode == "affine":
            s, b = w[name + ".scales"].astype(mx.float32), w[name + ".biases"].astype(mx.float32)
            deq = mx.dequantize(w[name + ".weight"], s, b, group_size=group, bits=bits)
        else:
            deq = mx.dequantize(w[name + ".weight"], w[name + ".scales"], group_size=group, bits=bits, mode=mode)
        tensors["dequant." + name] = np.array(deq.astype(mx.float32))
    save_file(tensors, str(out / "mlx_reference.safetensors"))
    print(out, logits.shape)

# The hybrid fixtures, tamed (every linear weight but the conv and the embedding scaled by
# 0.2, as tests/hybrid_gguf.rs and tests/load_quantize.rs do: the random fixtures are chaotic,
# so f16 activations alone would move their logits by tens of percent), in configs mlx-lm
# reads: RoPE keys at the top level (of `text_config` for Qwen3.5-MoE), and
# `full_attention_interval: 3`, which is mlx-lm's way of saying the fixtures' `layer_types`
# (G G A G). Qwen3.5 converted without quantisation (the MTP graft test) and at 8 and 4 bits in
# groups of 32; the MoE hybrids (Qwen3.5-MoE with HF's fused experts, Qwen3-Next with
# per-expert tensors: mlx-lm stacks both as `switch_mlp`) at 4 bits in groups of 32. mlx-lm
# drops the MTP heads. mlx runs the MoE ones in f32 (below).
def tame(name):
    """A tamed copy of fixtures/hybrid/NAME in a config mlx-lm reads (see above)."""
    hsrc = root / "hybrid" / name
    tamed = Path(tempfile.mkdtemp()) / name
    shutil.copytree(hsrc, tamed)
    w = load_file(str(hsrc / "model.safetensors"))
    w = {
        k: (v * np.float32(0.2) if v.ndim >= 2 and "conv1d" not in k and "embed_tokens" not in k and "lm_head" not in k else v)
        for k, v in w.items()
    }
    save_file(w, str(tamed / "model.safetensors"))
    cfg = json.loads((tamed / "config.json").read_text())
    tc = cfg.get("text_config", cfg)
    rp = tc["rope_parameters"]
    tc.update(rope_theta=rp["rope_theta"], partial_rotary_factor=rp["partial_rotary_factor"], full_attention_interval=3)
    if name == "qwen3_5":
        cfg.update(model_type="qwen3_5")
    (tamed / "config.json").write_text(json.dumps(cfg, indent=2))
    return tamed


def hybrid(name, widths):
    href = load_file(str(root / "hybrid" / name / "reference.safetensors"))
    hids = [int(x) for x in href["prompt_ids"]]
    tamed = tame(name)
    for bits, group in widths:
        out = root / "mlx" / (f"{name}-q{bits}-g{group}" if bits else f"{name}-f16")
        shutil.rmtree(out, ignore_errors=True)
        q = ["-q", "--q-bits", str(bits), "--q-group-size", str(group)] if bits else []
        subprocess.run([sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(tamed), "--mlx-path", str(out),
                        "--dtype", "float16", *q], check=True)
        (out / "README.md").unlink(missing_ok=True)
        model, _ = load(str(out))
        if "moe" in name or "next" in name:
            # mlx's CPU backend multiplies gathered (stacked, unquantised) experts in f32 only:
            # the reference runs the checkpoint's f16 values in f32 (exact widening).
            model.set_dtype(mx.float32)
        logits = model(mx.array([hids]))[0].astype(mx.float32)
        save_file({"prompt_ids": np.array(hids, dtype=np.int64), "prompt_logits": np.array(logits)},
                  str(out / "mlx_reference.safetensors"))
        print(out, logits.shape)


hybrid("qwen3_5", [(None, None), (8, 32), (4, 32), (4, 64)])
hybrid("qwen3_5_moe", [(4, 32), (8, 32), (4, 64)])
hybrid("qwen3_next", [(4, 32), (8, 32), (4, 64)])


# Checkpoints tandem writes (`tandem convert --mlx`, TANDEM_BIN: the binary to run; skipped
# without it) from the same sources (the Llama fixture as converted above, the tamed hybrids),
# each with mlx-lm's logits on it: mlx-lm must load what tandem writes (the MTP head in
# mtp.safetensors, which mlx-lm leaves out) and agree with tandem on it (tests/mlx.rs).
tandem = os.environ.get("TANDEM_BIN")
if tandem:
    for name, src, refp, group in [("llama", src, root / "tiny" / "llama" / "reference.safetensors", 64)] + [
        (h, tame(h), root / "hybrid" / h / "reference.safetensors", 32) for h in ["qwen3_5", "qwen3_5_moe", "qwen3_next"]
    ]:
        out = root / "mlx" / f"tandem-{name}-q4-g{group}"
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([tandem, "convert", "--mlx", "--bits", "4", "--group-size", str(group), str(src), str(out)],
                       check=True)
        (out / "keys.txt").unlink(missing_ok=True)
        subprocess.run([sys.executable, str(Path(__file__).parent / "mlx_reference.py"), str(out), str(refp)], check=True)
