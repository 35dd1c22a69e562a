#!/usr/bin/env bash
# On the GPU machine: two packed builds side by side in one run (issue 16), e.g. main and a
# branch. PACK_A and PACK_B are directories made by scripts/gpu-pack.sh (PACK_DIR=... make
# gpu-pack on each checkout; carry both). Runs `check-device` with B, then for each case of
# CASES ("preset:dtype", default "9b:q8_0 9b:bf16") `tandem bench` with A and with B, one
# after the other, so that both see the same machine state (llama8b:bf16 and the like: a
# random Llama-family preset). BENCH_ARGS adds flags (default
# "-p 512 -g 64 -r 1"; e.g. "--verify 4"). ENV_A / ENV_B: variables for one side's runs (e.g.
# ENV_A=TANDEM_ATTN_MMA=0 with PACK_A = PACK_B: one build, two settings). SUITE=1 runs the GPU
# suite with B after the benches. Results go to ${OUT:-target/gpu-results}/ab.md.
set -uo pipefail
cd "$(dirname "$0")/.."
res=${OUT:-target/gpu-results}
mkdir -p "$res"
. scripts/gpu-env.sh
for side in A B; do
  var=PACK_$side
  PACK=${!var:?set PACK_A and PACK_B} gpu_unpack tandem && mv /tmp/tandem-gpu/tandem "/tmp/tandem-gpu/tandem-$side"
done
export TANDEM_DEVICE=cuda
timeout "${CHECK_TIMEOUT:-200}" /tmp/tandem-gpu/tandem-B check-device --fixtures fixtures --output "$res/check-device-B.md" \
  > "$res/check-B.log" 2>&1
echo "check-device B: $(grep -E 'passed|failed' "$res/check-device-B.md" | tail -1)" | tee "$res/ab.md"
grep -E "\| fail" "$res/check-device-B.md" | head -20 | tee -a "$res/ab.md"
for c in ${CASES:-9b:q8_0 9b:bf16}; do
  p=${c%%:*}; t=${c##*:}
  for side in A B; do
    echo "== $side $p $t" | tee -a "$res/ab.md"
    # llama8b:bf16 and the like: a random Llama-family preset.
    model=(--random-hybrid "$p"); [ "${p#llama}" != "$p" ] && model=(--random-llama "${p#llama}")
    envs=ENV_$side
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-150}" env ${!envs:-} "/tmp/tandem-gpu/tandem-$side" bench --device cuda "${model[@]}" --random-dtype "$t" \
      ${BENCH_ARGS:--p 512 -g 64 -r 1} 2>&1 | grep -E "^\| (pp|tg|tv)|rror" | tee -a "$res/ab.md"
  done
done
if [ "${SUITE:-0}" = 1 ]; then
  NO_CHECK=1 PACK=$PACK_B OUT=$res timeout "${SUITE_TIMEOUT:-330}" bash scripts/gpu-run.sh > "$res/suite.log" 2>&1
  echo "suite: $(tail -1 "$res/device_suite.log")" | tee -a "$res/ab.md"
fi
