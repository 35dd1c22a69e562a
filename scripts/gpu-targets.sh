#!/usr/bin/env bash
# On the GPU machine: issue 16's benchmark targets in one run (docs/PERFORMANCE.md), with the
# copy bandwidth measured first (torch, 2 GiB device-to-device) and passed as `--bandwidth`, so
# each decode line prints its bytes bound and share. Binaries from $PACK (scripts/gpu-pack.sh);
# SUITE=1 runs scripts/gpu-run.sh (check-device + the GPU suite) first. Results: $OUT/targets.md.
#   target 1: 9B and Llama-3-8B bf16 decode at 512 / 4K / 16K (/ 32K) keys
#   target 4: 4K-token prefill (the pp4096 lines)
#   target 5: verify steps of K = 2..8 positions against a decode step (tvK / tg)
#   target 3: batched decode at 1K context, batch 1..128
# PARTS picks which of them run (default all four: "9b llama verify batch"), so a short call
# can take a part and the next call the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
res=${OUT:-target/gpu-results}
mkdir -p "$res"
. scripts/gpu-env.sh
nvidia-smi --query-gpu=name,memory.used,utilization.gpu,driver_version --format=csv,noheader | tee -a "$res/targets.md"
s0=$(date +%s)
if [ "${SUITE:-0}" = 1 ]; then
  OUT=$res timeout 330 bash scripts/gpu-run.sh > "$res/suite.log" 2>&1
  echo "suite rc $?: $(grep -E 'passed|failed' "$res/check-device.md" | tail -1); $(tail -1 "$res/device_suite.log")" | tee -a "$res/targets.md"
fi
[ -x /tmp/tandem-gpu/tandem ] || gpu_unpack tandem
export TANDEM_DEVICE=cuda
bw=$(python3 -c '
import torch, time
x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); t = time.time()
for _ in range(20): y.copy_(x)
torch.cuda.synchronize(); print(f"{2 * 20 * x.numel() / (time.time() - t) / 1e12:.2f}")' 2>/dev/null)
echo "copy ${bw:=4.2} TB/s" | tee -a "$res/targets.md"
b() {
  local t0; t0=$(date +%s)
  echo "== tandem bench --device cuda $* --bandwidth $bw" | tee -a "$res/targets.md"
  # shellcheck disable=SC2068
  timeout "${BT:-200}" /tmp/tandem-gpu/tandem bench --device cuda $@ --bandwidth "$bw" 2>&1 \
    | grep -E "^\| (pp|tg|tv)|rror" | tee -a "$res/targets.md"
  echo "   ($(( $(date +%s) - t0 )) s)" | tee -a "$res/targets.md"
}
parts=" ${PARTS:-9b llama verify batch} "
[[ $parts == *" 9b "* ]] && b --random-hybrid 9b --random-dtype bf16 -p 4096 -g 32 -r 1 -d 0,512,4096,16384,32768
[[ $parts == *" llama "* ]] && b --random-llama 8b --random-dtype bf16 -p 4096 -g 32 -r 1 -d 0,512,4096,16384
[[ $parts == *" verify "* ]] && b --random-hybrid 9b --random-dtype bf16 -p 0 -g 32 -r 1 -d 512 --verify 2,3,4,5,8
[[ $parts == *" batch "* ]] && b --random-hybrid 9b --random-dtype bf16 -p 0 -g 16 -r 1 -d 1024 --batch 1,8,32,64,128
echo "total $(( $(date +%s) - s0 )) s" | tee -a "$res/targets.md"
