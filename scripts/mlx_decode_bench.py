#!/usr/bin/env python3
"""mlx-lm's prefill and decode speed on an MLX checkpoint, measured like `tandem bench -p P -g G`:
a P-token prompt of fixed pseudo-random ids in one forward, then G greedy decode steps with
the KV/state cache, each repetition from a fresh cache (after one untimed warm-up).

Usage: python3 scripts/mlx_decode_bench.py MLX_DIR [P] [G] [REPS]
"""
import sys
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

path = sys.argv[1]
P, G, R = (int(x) for x in (sys.argv[2:5] + ["128", "32", "2"][len(sys.argv[2:5]):]))
model, _ = load(path)
vocab = model.args.text_config["vocab_size"] if hasattr(model.args, "text_config") else model.args.vocab_size
ids = [100 + (i * 7919 + 13 + 1) % (vocab - 200) for i in range(P)]


def run():
    cache = make_prompt_cache(model)
    t0 = time.perf_counter()
    logits = model(mx.array([ids]), cache=cache)
    tok = mx.argmax(logits[0, -1])
    mx.eval(tok)
    t1 = time.perf_counter()
    for _ in range(G):
        logits = model(tok.reshape(1, 1), cache=cache)
        tok = mx.argmax(logits[0, -1])
        mx.eval(tok)
    t2 = time.perf_counter()
    return P / (t1 - t0), G / (t2 - t1)


run()
pp, tg = zip(*[run() for _ in range(R)])
print(f"mlx-lm {path}: pp{P} {sum(pp) / R:.2f} tok/s ({', '.join(f'{x:.1f}' for x in pp)}), "
      f"tg{G} {sum(tg) / R:.2f} tok/s ({', '.join(f'{x:.2f}' for x in tg)})")
