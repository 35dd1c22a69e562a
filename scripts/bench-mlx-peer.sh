#!/usr/bin/env bash
# Issue 18's peer benchmark on this CPU: the same MLX checkpoint through `mlx_lm.server` and
# `tandem serve`, one `tandem bench agent` report for both. The checkpoint: a random-weight
# SmolLM2-135M-shape Llama with SmolLM2's tokenizer (scripts/gen_random_llama_hf.py, the
# tokenizer written from models/smollm2-135m.gguf by scripts/gguf_tokenizer_to_hf.py: `make
# models` first; `pip install gguf` into the venv) converted by mlx-lm itself
# (`mlx_lm convert -q`: 4 bits, group 64), unless MLX_DIR names another. mlx-lm comes from the
# venv `make test-mlx` makes (target/mlx-venv). mlx-lm's CPU backend runs a matmul at a few
# GFLOPS on x86 (it is built for Apple GPUs), so the default workload is small (AGENT_ARGS
# overrides it); tandem runs with THREADS (default 1: mlx-lm uses one core here).
#   TANDEM=target/release/tandem OUT=bench-results/mlx-peer bash scripts/bench-mlx-peer.sh
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TANDEM:-target/release/tandem}
OUT=${OUT:-bench-results/mlx-peer}
M=${MLX_DIR:-/tmp/tandem-mlx-peer/smollm2-shape-mlx4}
mkdir -p "$OUT"
# shellcheck disable=SC1091
. target/mlx-venv/bin/activate
if [ ! -d "$M" ]; then
  python3 -c "import gguf" 2> /dev/null || python3 -m pip install -q gguf
  python3 scripts/gguf_tokenizer_to_hf.py models/smollm2-135m.gguf "$M-tok"
  python3 scripts/gen_random_llama_hf.py "$M-hf" "$M-tok"
  python3 -m mlx_lm convert --hf-path "$M-hf" --mlx-path "$M" -q
fi
# mlx_lm.server's /v1/models scans the Hugging Face cache, which must exist.
export HF_HUB_CACHE=${HF_HUB_CACHE:-/tmp/tandem-mlx-peer/hf-cache}
mkdir -p "$HF_HUB_CACHE"
python3 -m mlx_lm server --model "$M" --port 8091 > "$OUT/mlx-server.log" 2>&1 &
mpid=$!
"$T" serve -m "$M" --port 8092 -t "${THREADS:-1}" > "$OUT/tandem-serve.log" 2>&1 &
tpid=$!
trap 'kill $mpid $tpid 2> /dev/null || true' EXIT
for port in 8091 8092; do
  for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && break; sleep 1; done
done
# shellcheck disable=SC2086
"$T" bench agent --endpoint http://127.0.0.1:8092 --label "tandem (-t ${THREADS:-1})" \
  --endpoint http://127.0.0.1:8091 --label "mlx_lm.server" --tokenizer "$M" \
  ${AGENT_ARGS:---shared-prefix 256 --context 64 --turns 5 --tool-tokens 32-64 --user-tokens 8 --max-tokens 16} \
  -o "$OUT"
