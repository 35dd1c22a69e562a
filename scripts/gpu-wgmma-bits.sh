#!/usr/bin/env bash
# Builds and runs the wgmma bit-equality lab (crates/tandem-kernels/lab/wgmma_bits_lab.cu) on
# the device machine: whether one wgmma.m64n8k16 gives the f32 bits of one mma.sync.m16n8k16
# on the same operands (and whether the mma's k-slot order matters), the question a wgmma bf16
# GEMM in tandem's row-invariant chain depends on (issue 16, target 4). Output in
# $OUT/wgmma-bits.txt.
set -uo pipefail
out=${OUT:-/tmp}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/wgmma-bits.txt"
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmmabits \
  crates/tandem-kernels/lab/wgmma_bits_lab.cu 2> "$out/wgmma-bits-nvcc.txt" || { tail -20 "$out/wgmma-bits-nvcc.txt"; exit 1; }
timeout "${LAB_TIMEOUT:-120}" /tmp/wgmmabits | tee -a "$out/wgmma-bits.txt"
