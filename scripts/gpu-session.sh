#!/usr/bin/env bash
# On the GPU machine: the checks and measurements a session owes after kernel changes, in three
# calls of under 10 minutes each on one warm machine (docs/GPU.md, "Measuring speed"). Binaries
# from $PACK (scripts/gpu-pack.sh with SUITE=1); carry $PACK and .peer (.peer/llama-src.tar.xz,
# llama.cpp's source: scripts/gpu-peers.sh).
#   PART=a: llama.cpp (with llama-server, and the 9B preset as llama.cpp's Q8_0) built detached
#           beside the GPU suite (scripts/gpu-run.sh: check-device in both modes, device_suite),
#           then the agent session with the disk tier on, off, and on with its blocks read back on
#           the writer's thread (TANDEM_DISK_READBACK=writer) (scripts/gpu-agent.sh).
#   PART=b: llama-server on the agent session's prompts (needs call a's /tmp on this machine),
#           then issue 16's targets 3 and 1 (scripts/gpu-targets.sh PARTS="batch 9b").
#   PART=c: the batch GEMM's in-kernel partial sum (TANDEM_BF16_BATCH_SUM=kernel) checked and
#           timed against tmmk_sum, target 2 (the Q8_0 file beside llama-bench), a batch-64 step
#           profiled, Nsight Compute on the 4K prefill's wgmma GEMM.
# Each part keeps to LIMIT seconds (default 560) and writes under $OUT (as one archive,
# results-PART.tar.xz, where that would be more than the 8 files the device tool brings back).
set -u
cd "$(dirname "$0")/.."
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( ${LIMIT:-560} - $(el) )); }
export PACK=${PACK:-target/gpu-pack}
OUT=${OUT:-target/gpu-results}; mkdir -p "$OUT"
. scripts/gpu-env.sh
[ -x /tmp/tandem-gpu/tandem ] || gpu_unpack tandem
T=/tmp/tandem-gpu/tandem
nvidia-smi --query-gpu=name,memory.used,utilization.gpu,driver_version --format=csv,noheader | tee -a "$OUT/smi.txt"
case ${PART:-a} in
a)
  mkdir -p /tmp/peer-res
  setsid nohup env OUT=/tmp/peer-res PACK="$PACK" SERVER=1 PHASE=prep QUANTS=Q8_0 BUILD_JOBS=12 nice -n 19 \
    bash scripts/gpu-peers.sh > /tmp/peer-res/prep.log 2>&1 < /dev/null &
  OUT=$OUT timeout 300 bash scripts/gpu-run.sh > "$OUT/suite.log" 2>&1
  echo "suite rc $? at $(el) s: $(grep -E 'passed|failed' "$OUT/check-device.md" | tail -1) /" \
    "$(grep -E 'passed|failed' "$OUT/check-device-bf16.md" | tail -1); $(tail -1 "$OUT/device_suite.log")"
  l=$(left); [ "$l" -gt 120 ] && { OUT=$OUT/agent-on timeout $(( l > 220 ? 220 : l )) bash scripts/gpu-agent.sh > "$OUT/agent-on.log" 2>&1; echo "agent (disk tier on) rc $? at $(el) s"; }
  l=$(left); [ "$l" -gt 90 ] && { SERVE_ARGS="--disk-cache-size 0" OUT=$OUT/agent-off timeout "$(( l > 150 ? 150 : l ))" bash scripts/gpu-agent.sh > "$OUT/agent-off.log" 2>&1; echo "agent (disk tier off) rc $? at $(el) s"; }
  # The disk tier's blocks read back on its writer's thread (the CPU's default; on a GPU
  # `batched` is, which on 2026-12-07 23:27 still cost a 9K-token cold turn ~220 ms).
  l=$(left); [ "$l" -gt 90 ] && { TANDEM_DISK_READBACK=writer OUT=$OUT/agent-writer timeout "$l" bash scripts/gpu-agent.sh > "$OUT/agent-writer.log" 2>&1; echo "agent (disk tier on, writer read-back) rc $? at $(el) s"; }
  tail -3 /tmp/peer-res/prep.log
  ;;
b)
  for _ in $(seq 240); do [ -e /tmp/ll/prep.done ] && break; sleep 1; done
  cp -r /tmp/peer-res "$OUT/" 2> /dev/null
  if [ -x /tmp/ll/bin/llama-server ] && [ -f /tmp/agent-9b-bf16.gguf ]; then
    PEER_ONLY=1 OUT=$OUT/agent-llama timeout 200 bash scripts/gpu-agent.sh > "$OUT/agent-llama.log" 2>&1
    echo "agent (llama-server) rc $? at $(el) s"
  else
    echo "no llama-server or agent GGUF: run PART=a on this machine first"
  fi
  l=$(left); [ "$l" -gt 100 ] && { PARTS="batch 9b" BT=$(( l / 2 )) OUT=$OUT timeout "$l" bash scripts/gpu-targets.sh > "$OUT/targets.log" 2>&1; echo "targets rc $? at $(el) s"; }
  ;;
c)
  # The batch GEMM's partials summed in the kernel (TANDEM_BF16_BATCH_SUM=kernel, opt-in since
  # 2026-12-08, never run on a GPU yet): its bits in both activation modes, then its speed
  # against tmmk_sum's launch, alternated.
  for mode in split bf16; do
    TANDEM_BF16_BATCH_SUM=kernel TANDEM_DEVICE=cuda timeout 60 "$T" --bf16-activations $mode check-device \
      --fixtures fixtures --only ops/dense,gdn_batch,attn_batch --output "$OUT/check-sum-$mode.md" > /dev/null 2>&1
    echo "in-kernel sum, $mode activations: $(grep -E 'passed|failed' "$OUT/check-sum-$mode.md" | tail -1)"
    grep "| fail" "$OUT/check-sum-$mode.md" | head -5
  done
  for sum in launch kernel launch kernel; do
    [ "$(left)" -lt 200 ] && break
    echo "== TANDEM_BF16_BATCH_SUM=$sum" | tee -a "$OUT/batch-sum.md"
    TANDEM_BF16_BATCH_SUM=$sum timeout 80 "$T" bench --device cuda --random-hybrid 9b --random-dtype bf16 -p 0 -g 16 -r 1 \
      -d 1024 --batch 32,64,128 --bandwidth auto 2>&1 | grep -E "^\| tg16 x|rror" | tee -a "$OUT/batch-sum.md"
  done
  if [ -e /tmp/ll/prep.done ] && [ -f /tmp/m-9b-Q8_0.gguf ] && [ "$(left)" -gt 250 ]; then
    OUT=$OUT/peers PHASE=bench QUANTS=Q8_0 GEN=64 REPS=2 PROMPT=512 timeout 200 bash scripts/gpu-peers.sh > "$OUT/peers.log" 2>&1
    echo "peers rc $? at $(el) s"
  fi
  l=$(left); [ "$l" -gt 150 ] && { MODE=batch BATCH=64 DEPTH=1024 CASES=9b:bf16 NCU_TIMEOUT=120 OUT=$OUT bash scripts/gpu-profile.sh > "$OUT/profile-batch.log" 2>&1; echo "batch profile at $(el) s"; }
  l=$(left); [ "$l" -gt 90 ] && { SOURCE=1 TANDEM_BF16_ACTIVATIONS=bf16 MODE=prefill PROMPT=4096 KERNEL=tmmw_bf16_h COUNT=4 \
    SECTIONS="SpeedOfLight ComputeWorkloadAnalysis WarpStateStats MemoryWorkloadAnalysis Occupancy" NCU_TIMEOUT=$(( l - 10 )) \
    CASES=9b:bf16 OUT=$OUT bash scripts/gpu-profile.sh > "$OUT/ncu.log" 2>&1; echo "Nsight Compute at $(el) s"; }
  ;;
esac
echo "part ${PART:-a} done at $(el) s"
# The device tool brings back at most 8 files from $OUT: past that, one archive of all of them.
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
  tar -cJf /tmp/session-results.tar.xz -C "$OUT" . && find "$OUT" -mindepth 1 -delete \
    && mv /tmp/session-results.tar.xz "$OUT/results-${PART:-a}.tar.xz"
fi
