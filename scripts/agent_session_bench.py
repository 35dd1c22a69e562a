#!/usr/bin/env python3
"""Multi-turn agent session against an OpenAI-compatible server (issue 4's benchmark).

A long shared system prompt (tool descriptions), then N turns; each turn appends a tool
result and a short user message, replays the whole history (as agent clients do) and
generates a fixed number of tokens. Per turn it reports prompt tokens, cached tokens (from
usage.prompt_tokens_details), TTFT and decode tok/s. Workloads are seeded and reproducible.

Usage: python3 scripts/agent_session_bench.py --base-url http://127.0.0.1:8080/v1 [--label X]
Needs the `openai` package (the SDK test venv has it: target/sdk-venv/bin/python).
"""
import argparse
import json
import random
import time

from openai import OpenAI

WORDS = ("tool function argument returns string integer list file path search read write edit "
         "patch diff repository branch commit test build error warning result status value key "
         "object array schema required optional description parameter context line column").split()


def text(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--model", default=None)
    ap.add_argument("--system-words", type=int, default=3000, help="~4K tokens with SmolLM2's tokenizer")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--tool-words", type=int, default=200, help="~300 tokens")
    ap.add_argument("--gen", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", default=None, help="write raw per-turn results here")
    a = ap.parse_args()
    client = OpenAI(base_url=a.base_url, api_key="none")
    model = a.model or client.models.list().data[0].id
    rng = random.Random(a.seed)
    messages = [{"role": "system", "content": "You are a coding agent. Tools:\n" + text(rng, a.system_words)}]
    rows = []
    for turn in range(1, a.turns + 1):
        messages.append({"role": "user", "content": f"Tool result {turn}:\n{text(rng, a.tool_words)}\nWhat next?"})
        t0 = time.perf_counter()
        first = last = None
        usage = None
        out = []
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=a.gen, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "return_token_ids": True})
        for chunk in stream:
            if chunk.choices:
                now = time.perf_counter()
                ids = getattr(chunk, "token_ids", None) or (chunk.model_extra or {}).get("token_ids") or []
                d = chunk.choices[0].delta
                if ids or (d and d.content):
                    first = first or now
                    last = now
                if d and d.content:
                    out.append(d.content)
            if chunk.usage:
                usage = chunk.usage
        messages.append({"role": "assistant", "content": "".join(out)})
        cached = 0
        if usage and usage.prompt_tokens_details:
            cached = usage.prompt_tokens_details.cached_tokens or 0
        n = usage.completion_tokens if usage else 0
        decode = (n - 1) / (last - first) if first and last and last > first and n > 1 else 0.0
        rows.append({"turn": turn, "prompt_tokens": usage.prompt_tokens if usage else 0, "cached_tokens": cached,
                     "ttft_ms": (first - t0) * 1e3 if first else None, "decode_tok_s": decode,
                     "completion_tokens": n, "e2e_s": time.perf_counter() - t0})
    print(f"\n{a.label} ({model})\n")
    print("| turn | prompt tokens | cached tokens | TTFT (ms) | decode tok/s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['turn']} | {r['prompt_tokens']} | {r['cached_tokens']} | {r['ttft_ms']:.0f} | {r['decode_tok_s']:.1f} |")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
