#!/usr/bin/env bash
# On the GPU machine (issue 16, target 7): the agent workload (`tandem bench agent`: an 8K-token
# shared prefix, 10 turns of 100-600-token tool results) against `tandem serve --device cuda`
# on the random Qwen3.5-9B-shape preset, written as GGUF first (DTYPE, default bf16; its
# byte-level tokenizer counts the workload's tokens). Binaries from $PACK (scripts/gpu-pack.sh);
# the report lands in $OUT/agent (agent.md, agent.json), the server's log in $OUT/serve.log.
# PEER=1 then serves the same file with llama.cpp's llama-server (/tmp/ll/bin, built by
# `SERVER=1 PHASE=prep scripts/gpu-peers.sh`, or LLAMA_SERVER=path) and runs the same workload
# against it: $OUT/agent-llama, its log $OUT/llama-server.log. One server at a time, so neither
# sizes its memory around the other. Both get the same prompts (`--fixed-replies`: the
# conversation carries the workload's replies, not each server's random answers; FIXED=0 turns
# it off).
set -uo pipefail
cd "$(dirname "$0")/.."
res=${OUT:-target/gpu-results}
mkdir -p "$res"
. scripts/gpu-env.sh
[ -x /tmp/tandem-gpu/tandem ] || gpu_unpack tandem
T=/tmp/tandem-gpu/tandem
DTYPE=${DTYPE:-bf16}
M=/tmp/agent-9b-$DTYPE.gguf
[ -f "$M" ] || "$T" bench --random-hybrid 9b --random-dtype "$DTYPE" --save-gguf "$M" || exit 1
# One warm-up request of a few hundred tokens, not counted: a fresh machine compiles the PTX of
# every kernel module on first use (~40 s), which would otherwise land in turn 1's TTFT.
words=$(printf 'warm up the kernels %.0s' $(seq 1 100))
rc=0
# PEER_ONLY=1: llama-server alone (tandem ran in an earlier call on this machine).
if [ "${PEER_ONLY:-0}" != 1 ]; then
  # A disk tier of its own (a second run in the same call would otherwise find every prompt of
  # the first one cached on disk), removed at the end.
  cache=$(mktemp -d /tmp/agent-cache.XXXXXX)
  TANDEM_CACHE_DIR=$cache "$T" --device cuda serve -m "$M" --port 8090 ${SERVE_ARGS:-} > "$res/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 180); do curl -sf http://127.0.0.1:8090/v1/models > /dev/null && break; sleep 1; done
  curl -sf http://127.0.0.1:8090/v1/chat/completions -H 'content-type: application/json' \
    -d "{\"model\": \"$(basename "$M" .gguf)\", \"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"$words\"}]}" > /dev/null \
    || echo "warm-up request failed"
  "$T" bench agent --endpoint http://127.0.0.1:8090 --label "tandem cuda 9b $DTYPE" --tokenizer "$M" \
    --shared-prefix 8192 --context 512 --turns 10 --tool-tokens 100-600 --max-tokens 64 --sessions "${SESSIONS:-1}" \
    $([ "${FIXED:-1}" = 0 ] || echo --fixed-replies) -o "$res/agent"
  rc=$?
  kill "$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
  rm -rf "$cache"
  tail -5 "$res/serve.log"
fi
if [ "${PEER:-0}" = 1 ] || [ "${PEER_ONLY:-0}" = 1 ]; then
  L=${LLAMA_SERVER:-/tmp/ll/bin/llama-server}
  [ -x "$L" ] || { echo "no llama-server at $L (SERVER=1 PHASE=prep scripts/gpu-peers.sh builds it)"; exit 1; }
  n=${SESSIONS:-1}
  # Context for each session (8K prefix + 10 turns of ~1K) in one slot a session, all layers on
  # the GPU, flash attention unless llama.cpp was built without it (FA=0), the batch sizes
  # bench-peers.sh gives it on the CPU.
  LD_LIBRARY_PATH="$(dirname "$L"):${LD_LIBRARY_PATH:-}" "$L" -m "$M" --port 8091 -ngl 99 \
    -fa "$([ "${FA:-1}" = 0 ] && echo off || echo on)" -c $((32768 * n)) -np "$n" \
    -b 2048 -ub 512 --no-webui > "$res/llama-server.log" 2>&1 &
  lpid=$!
  for _ in $(seq 1 180); do
    curl -sf http://127.0.0.1:8091/health > /dev/null && break
    kill -0 "$lpid" 2> /dev/null || { echo "llama-server exited:"; tail -5 "$res/llama-server.log"; exit 1; }
    sleep 1
  done
  curl -sf http://127.0.0.1:8091/v1/chat/completions -H 'content-type: application/json' \
    -d "{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"$words\"}]}" > /dev/null \
    || echo "llama-server warm-up request failed"
  "$T" bench agent --endpoint http://127.0.0.1:8091 --label "llama.cpp cuda 9b $DTYPE" --tokenizer "$M" \
    --shared-prefix 8192 --context 512 --turns 10 --tool-tokens 100-600 --max-tokens 64 --sessions "${SESSIONS:-1}" \
    $([ "${FIXED:-1}" = 0 ] || echo --fixed-replies) -o "$res/agent-llama" || rc=1
  kill "$lpid" 2> /dev/null
  wait "$lpid" 2> /dev/null
  tail -5 "$res/llama-server.log"
fi
exit $rc
