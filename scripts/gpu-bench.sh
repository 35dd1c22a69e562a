#!/usr/bin/env bash
# tandem benchmarks on the GPU machine (docs/GPU.md), one per line of $RUNS: "ENV=.. ENV=..|ARGS"
# runs `ENV... tandem bench --device cuda ARGS`; each line's output goes to $OUT/bench.md with
# the time and the GPU's state before the first. Binaries from $PACK (scripts/gpu-pack.sh).
#   RUNS=$'TANDEM_Q8_GEMV=0|--random-hybrid 9b --random-dtype q8_0 -p 512 -g 64\n|--random-hybrid 9b ...' bash scripts/gpu-bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."
res=${OUT:-target/gpu-results}
mkdir -p "$res"
. scripts/gpu-env.sh
[ -x /tmp/tandem-gpu/tandem ] || gpu_unpack tandem
nvidia-smi --query-gpu=name,memory.used,utilization.gpu,clocks.sm --format=csv | tee -a "$res/bench.md"
while IFS= read -r line; do
  [ -z "$line" ] && continue
  echo "== $(date +%T) ${line%%|*} tandem bench --device cuda ${line#*|}" | tee -a "$res/bench.md"
  env ${line%%|*} /tmp/tandem-gpu/tandem bench --device cuda ${line#*|} 2>&1 | grep -v "^\s*$" | tee -a "$res/bench.md"
done <<< "${RUNS:-}"
