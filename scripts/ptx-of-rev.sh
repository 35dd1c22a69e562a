#!/usr/bin/env bash
# Compiles tandem's CUDA kernels as they were at git revision REV to PTX in DIR (nvcc with
# build.rs's flags), for an A/B on the GPU machine inside one build: `TANDEM_PTX_DIR=DIR
# tandem ...` loads each module found there instead of the built one (tandem-kernels' `ptx`),
# so two kernel versions run on the same machine minutes apart. Carry DIR with the pack.
#   bash scripts/ptx-of-rev.sh HEAD~1 target/gpu-pack/ptx-old [qmma kqgemm ...]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?revision}; dir=${2:?output folder}; shift 2
src=$(mktemp -d)
git archive "$rev" crates/tandem-kernels/cuda | tar x -C "$src"
mkdir -p "$dir"
dir=$(realpath "$dir")
cd "$src/crates/tandem-kernels/cuda"
stems=${*:-$(ls *.cu | sed 's/\.cu$//')}
# build.rs's ARCH_SPECIFIC modules (tmma_wg: Hopper's wgmma) take compute_90a at capability 90.
# A revision without tmma_wg.cu leaves the built one in place: run such an A/B with
# TANDEM_BF16_WGMMA=0 on both sides (the old chain's tmmg against the new one's).
cap=${CUDA_COMPUTE_CAP:-90}
for s in $stems; do
  arch=$cap; [ "$s" = tmma_wg ] && [ "$cap" = 90 ] && arch=90a
  nvcc --ptx -O3 -std=c++17 -I. "-arch=compute_$arch" -o "$dir/$s.ptx" "$s.cu"
done
rm -rf "$src"
ls -la "$dir"
