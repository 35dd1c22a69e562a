#!/usr/bin/env python3
"""mlx-lm's logits on an MLX checkpoint (e.g. one `tandem convert --mlx` wrote): loads DIR with
mlx-lm, runs the prompt ids of REFERENCE (a fixture's reference.safetensors: prompt_ids) in f32
(mlx's CPU backend multiplies stacked unquantised experts in f32 only; the checkpoint's values
are widened exactly) and writes DIR/mlx_reference.safetensors (prompt_ids, prompt_logits).

Usage: python3 scripts/mlx_reference.py DIR REFERENCE
"""
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm import load
from safetensors.numpy import load_file, save_file

out, ref = Path(sys.argv[1]), load_file(sys.argv[2])
ids = [int(x) for x in ref["prompt_ids"]]
model, _ = load(str(out))
model.set_dtype(mx.float32)
logits = model(mx.array([ids]))[0].astype(mx.float32)
save_file({"prompt_ids": np.array(ids, dtype=np.int64), "prompt_logits": np.array(logits)},
          str(out / "mlx_reference.safetensors"))
print(out, logits.shape)
