#!/usr/bin/env bash
# On the GPU machine (issue 16, target 7): the agent workload (`tandem bench agent`: an 8K-token
# shared prefix, 10 turns of 100-600-token tool results) against `tandem serve --device cuda`
# on the random Qwen3.5-9B-shape preset, written as GGUF first (DTYPE, default bf16; its
# byte-level tokenizer counts the workload's tokens). Binaries from $PACK (scripts/gpu-pack.sh);
# the report lands in $OUT/agent (agent.md, agent.json), the server's log in $OUT/serve.log.
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
"$T" --device cuda serve -m "$M" --port 8090 ${SERVE_ARGS:-} > "$res/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 180); do curl -sf http://127.0.0.1:8090/v1/models > /dev/null && break; sleep 1; done
"$T" bench agent --endpoint http://127.0.0.1:8090 --label "tandem cuda 9b $DTYPE" --tokenizer "$M" \
  --shared-prefix 8192 --context 512 --turns 10 --tool-tokens 100-600 --max-tokens 64 --sessions "${SESSIONS:-1}" \
  -o "$res/agent"
rc=$?
kill "$pid" 2> /dev/null
wait "$pid" 2> /dev/null
tail -5 "$res/serve.log"
exit $rc
