#!/usr/bin/env bash
# Builds the CUDA binaries on a machine without a GPU and packs them for one that has one
# (docs/GPU.md): target/gpu-pack/{tandem,device_suite}.xz (or $PACK_DIR) + scripts/gpu-run.sh run there.
# Needs nvcc and a CUDA toolkit (or the pip wheels: ../shared/tools/cuda-toolchain.sh and
# CUDA_ROOT / PATH as docs/GPU.md says). CUDA_COMPUTE_CAP defaults to 90 (H100/H200).
# FEATURES adds tandem-cli features (e.g. FEATURES=pprof: the host profiler, packed with its
# symbol table so that TANDEM_PPROF can name functions); SUITE=0 skips the device suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
out=${PACK_DIR:-target/gpu-pack}
mkdir -p "$out"
cargo build --release -p tandem-cli --features "cuda${FEATURES:+,$FEATURES}"
strip_mode=--strip-all
[ -n "${FEATURES:-}" ] && strip_mode=--strip-debug
if [ "${SUITE:-1}" = 0 ]; then
  strip "$strip_mode" -o "$out/tandem" target/release/tandem && xz -T2 -6 -f "$out/tandem"
  ls -la "$out"
  exit 0
fi
suite=$(cargo test --release -p tandem-engine --features cuda --test device_suite --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except Exception: continue
    if m.get("reason")=="compiler-artifact" and m.get("target",{}).get("name")=="device_suite" and m.get("executable"): print(m["executable"])' | tail -1)
for pair in "target/release/tandem:tandem" "$suite:device_suite"; do
  src=${pair%%:*}; name=${pair##*:}
  strip "$strip_mode" -o "$out/$name" "$src"
  xz -T2 -6 -f "$out/$name"
done
ls -la "$out"
