#!/usr/bin/env python3
"""Speculative decoding benchmark (issue 5) against one `tandem serve` instance.

Runs each workload with speculation off and with each method the server offers, using the
per-request override `"speculative": {"method": ...}` so that every variant runs on the same
loaded models in the same process. Workloads:
  (a) code edit: a generated 150-line Python file in the prompt, "rename X and re-emit the
      file" (the output copies the context: prompt lookup and draft models shine);
  (b) chat: free-form writing (little to copy).
Greedy decoding; reports decode tok/s (client-side, from first to last streamed token),
acceptance and mean accepted length (from usage.speculative), and the speedup over off.
Output is also checked: greedy speculation must give the same text as off.

With --repeat N the methods run interleaved N times (off, ngram, draft, off, ngram, ...), so a
machine whose speed drifts affects every method alike; the summary gives each method's median
tok/s, the speedup of medians, and the range of the per-repetition speedups (each method
against the `off` run of the same repetition).

Usage: python3 scripts/spec_bench.py --base-url http://127.0.0.1:8080/v1 --methods off,ngram,draft [--repeat 5]
Needs `requests`-free stdlib only.
"""
import argparse
import json
import statistics
import time
import urllib.request


def python_file(lines=150):
    out, i = [], 0
    while len(out) < lines:
        out += [
            f"def compute_total_{i}(items, rate):",
            f'    """Return the total of items {i} with tax applied."""',
            "    total = 0",
            "    for item in items:",
            f"        total += item.price * item.quantity + {i}",
            "    return total * (1 + rate)",
            "",
        ]
        i += 1
    return "\n".join(out[:lines])


WORKLOADS = {
    "code-edit": "Here is a Python file:\n\n```python\n" + python_file() + "\n```\n\n"
    "Rename every function `compute_total_N` to `total_with_tax_N` and output the complete "
    "updated file, unchanged otherwise, in one code block.",
    "chat": "Write a short story about a lighthouse keeper who finds a message in a bottle. "
    "Make it vivid and original.",
}


def stream(base, body):
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    first = last = None
    text, usage, n = [], None, 0
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                c = ch.get("delta", {}).get("content")
                if c:
                    now = time.time()
                    first = first or now
                    last = now
                    text.append(c)
    toks = usage["completion_tokens"]
    decode = (toks - 1) / (last - first) if last and last > first else 0.0
    return {"ttft_s": (first or t0) - t0, "decode_tok_s": decode, "tokens": toks, "text": "".join(text),
            "speculative": usage.get("speculative")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--methods", default="off,ngram,draft")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--workloads", default="code-edit,chat")
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    methods = a.methods.split(",")
    if methods[0] != "off":
        methods = ["off"] + [m for m in methods if m != "off"]
    rows = []
    for w in a.workloads.split(","):
        for rep in range(a.repeat):
            base = None
            for m in methods:
                body = {"messages": [{"role": "user", "content": WORKLOADS[w]}], "max_tokens": a.max_tokens,
                        "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                        "speculative": {"method": m}}
                # Warm the prefix cache (and a draft model's KV of the prompt, which it mirrors as
                # the prompt is prefilled) so every variant measures decoding on the same footing.
                stream(a.base_url, dict(body, max_tokens=1))
                r = stream(a.base_url, body)
                base = base or r
                sp = r["speculative"] or {}
                row = {"workload": w, "rep": rep, "method": m, "tokens": r["tokens"], "ttft_s": round(r["ttft_s"], 3),
                       "decode_tok_s": round(r["decode_tok_s"], 2),
                       "speedup": round(r["decode_tok_s"] / base["decode_tok_s"], 3) if base["decode_tok_s"] else None,
                       "acceptance": sp.get("acceptance_rate"), "mean_accepted_length": sp.get("mean_accepted_length"),
                       "drafted": sp.get("drafted_tokens"), "same_text_as_off": r["text"] == base["text"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| workload | method | tokens | median decode tok/s | speedup (medians) | per-repetition speedups "
          "| acceptance | tokens/step | same output |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in a.workloads.split(","):
        off = statistics.median(r["decode_tok_s"] for r in rows if r["workload"] == w and r["method"] == "off")
        for m in methods:
            rs = [r for r in rows if r["workload"] == w and r["method"] == m]
            med = statistics.median(r["decode_tok_s"] for r in rs)
            sp = [r["speedup"] for r in rs if r["speedup"] is not None]
            acc = [r["acceptance"] for r in rs if r["acceptance"] is not None]
            mal = [r["mean_accepted_length"] for r in rs if r["mean_accepted_length"] is not None]
            span = lambda v, f: (f"{min(v):{f}}-{max(v):{f}}" if min(v) != max(v) else f"{v[0]:{f}}") if v else "-"
            same = all(r["same_text_as_off"] for r in rs)
            print(f"| {w} | {m} | {rs[0]['tokens']} | {med:.2f} | {med / off:.2f}x | {span(sp, '.2f')} | {span(acc, '.2f')} "
                  f"| {span(mal, '.2f')} | {'yes' if same else 'NO'} |")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
