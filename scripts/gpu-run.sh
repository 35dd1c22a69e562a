#!/usr/bin/env bash
# On the GPU machine, in the repository root (fixtures/ beside it): unpacks what
# scripts/gpu-pack.sh built and runs the GPU suite: `tandem check-device` (every op and the
# fixture models against the CPU references), then the engine invariant suites on CUDA.
# Writes check-device.md (check-device-bf16.md: bf16 activations, the gated down projection in two steps) and device_suite.log
# into ${OUT:-target/gpu-results}.
set -uo pipefail
cd "$(dirname "$0")/.."
pack=${PACK:-target/gpu-pack}
res=${OUT:-target/gpu-results}
mkdir -p "$res"
. scripts/gpu-env.sh
PACK=$pack gpu_unpack tandem && PACK=$pack gpu_unpack device_suite
export TANDEM_DEVICE=cuda
status=0
# NO_CHECK=1: the suite only (check-device already ran in this call, e.g. from gpu-ab.sh).
if [ "${NO_CHECK:-0}" != 1 ]; then
  /tmp/tandem-gpu/tandem check-device --fixtures fixtures --output "$res/check-device.md" || status=1
  # The same with the other paths: the opt-in bf16-activation mode (the `_h` kernels: bits
  # across call sizes, the dense rows against bf16-rounded activations) and the gated down
  # projection's two steps (TANDEM_GATED_GEMV=0: silu_mul_rows, then the matmul).
  TANDEM_GATED_GEMV=0 /tmp/tandem-gpu/tandem --bf16-activations bf16 check-device --fixtures fixtures \
    --output "$res/check-device-bf16.md" > /dev/null || status=1
fi
# The suite finds fixtures relative to its build directory; point it at this checkout. Each
# test runs in its own process under a time limit, so one that hangs cannot hide the rest.
export TANDEM_FIXTURES="$PWD/fixtures"
: > "$res/device_suite.log"
passed=0; failed=0
# SKIP: a regular expression of test names not to run (e.g. SKIP=disk_cache).
for t in $(/tmp/tandem-gpu/device_suite --list 2>/dev/null | sed -n 's/: test$//p' | grep -Ev "${SKIP:-^$}"); do
  s=$(date +%s%N)
  timeout "${PER_TEST_TIMEOUT:-60}" /tmp/tandem-gpu/device_suite --exact "$t" --test-threads=1 > /tmp/tandem-gpu/t.log 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - s) / 1000000 ))
  if [ $rc -eq 0 ]; then passed=$((passed + 1)); r=ok; else failed=$((failed + 1)); r="FAILED (rc $rc)"; status=1; fi
  echo "$t ... $r ${ms} ms" | tee -a "$res/device_suite.log"
  [ $rc -ne 0 ] && grep -E "panicked|Error" /tmp/tandem-gpu/t.log | head -3 | tee -a "$res/device_suite.log"
done
echo "device suite: $passed passed, $failed failed" | tee -a "$res/device_suite.log"
exit $status
