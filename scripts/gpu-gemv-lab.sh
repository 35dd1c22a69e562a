#!/usr/bin/env bash
# Builds and runs the bf16 GEMV lab (crates/tandem-kernels/lab/gemv_bf16_lab.cu) on the device
# machine: bit-equality of every variant with tmv_bf16_8_1, then per-matrix and whole-step
# timings on the Qwen3.5-9B shape. Output in $OUT/gemv-lab.txt.
set -euo pipefail
out=${OUT:-/tmp}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.used,utilization.gpu,clocks.sm --format=csv,noheader | tee "$out/gemv-lab.txt"
nvcc -O3 -std=c++17 -arch=sm_90a -Xptxas -v -o /tmp/gemvlab crates/tandem-kernels/lab/gemv_bf16_lab.cu \
  2> "$out/gemv-lab-ptxas.txt"
/tmp/gemvlab | tee -a "$out/gemv-lab.txt"
