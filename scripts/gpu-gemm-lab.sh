#!/usr/bin/env bash
# Builds and runs a bf16 prefill GEMM lab on the device machine (LAB=bf16, the default:
# crates/tandem-kernels/lab/gemm_bf16_lab.cu, mma.sync variants; LAB=tma: gemm_tma_lab.cu, the engine's wgmma kernels (cuda/tmma_wg.cu) beside cuBLAS): bit-equality of every variant with tmmg_bf16, then timings on the Qwen3.5-9B
# shape's matrices at 4,096 rows; NCU=1 adds Nsight Compute's throughput, warp-state and
# occupancy sections for one launch of each variant. Output in $OUT/gemm-lab*.txt.
set -uo pipefail
out=${OUT:-/tmp}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.used,utilization.gpu,clocks.sm --format=csv,noheader | tee "$out/gemm-lab.txt"
src="crates/tandem-kernels/lab/gemm_${LAB:-bf16}_lab.cu"
# LAB=tma times cuBLAS's bf16 GEMM beside its kernels where the toolkit links it.
if [ "${LAB:-bf16}" = tma ] && nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
  -DLAB_CUBLAS -o /tmp/gemmlab "$src" -lcublas 2> "$out/gemm-lab-ptxas.txt"; then
  echo "built with cuBLAS" | tee -a "$out/gemm-lab.txt"
else
  nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -o /tmp/gemmlab "$src" \
    2> "$out/gemm-lab-ptxas.txt" || { tail -20 "$out/gemm-lab-ptxas.txt"; exit 1; }
fi
# ptxas's C7517 / C7519 notes: a wgmma kernel whose accumulators the compiler had to copy
# between wgmmas, so it waits for each one (serialised): a slow variant for a reason.
grep -h "C751[79]" "$out/gemm-lab-ptxas.txt" | sed 's/^/NOTE /' | head -6 | tee -a "$out/gemm-lab.txt"
timeout "${LAB_TIMEOUT:-240}" /tmp/gemmlab | tee -a "$out/gemm-lab.txt"
if [ "${NCU:-0}" = 1 ]; then
  NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  LAB_PROFILE=1 timeout "${NCU_TIMEOUT:-200}" "$NCU_BIN" --kernel-name "regex:${NCU_KERNELS:-tmm}" --section SpeedOfLight \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section Occupancy --section SchedulerStats /tmp/gemmlab > "$out/gemm-lab-ncu.txt" 2>&1
  echo "ncu rc $?"
fi
