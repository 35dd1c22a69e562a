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
for s in $stems; do
  nvcc --ptx -O3 -std=c++17 -I. "-arch=compute_${CUDA_COMPUTE_CAP:-90}" -o "$dir/$s.ptx" "$s.cu"
done
rm -rf "$src"
ls -la "$dir"
