#!/usr/bin/env bash
# On the GPU machine of the `device` tool, no vLLM staging needed: build and run
# benchmarks/kernels/pq2_wgmma_sweep.cu (the library's fused PQ2 prefill GEMMs on warpgroup MMA) with
# cuBLAS's bf16 GEMM as the same-run baseline where cuBLAS's header and library are found.
#   bash scripts/wgmma-sweep.sh [SHAPES [MS]]      results: $OUT/wgmma_sweep.jsonl
# WGMMA_NCU=1: instead, Nsight Compute on one launch of each GEMM (the checks only, no timing
# loops; PQ2_SWEEP_CHECK_ONLY), raw page in $OUT/wgmma_ncu.txt.
# PQ2_DEFINES adds nvcc flags.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
src=benchmarks/kernels/pq2_wgmma_sweep.cu
flags=(-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Icsrc ${PQ2_DEFINES:-})
hdr=$(find /usr/local /opt /usr/include -name cublas_v2.h 2>/dev/null | head -1)
lib=$(find /usr/local /opt /usr/lib -name 'libcublas.so*' 2>/dev/null | grep -v Lt | head -1)
libdir=$(dirname "${lib:-/x/y}")
if [ -n "$hdr" ] && [ -n "$lib" ] && nvcc "${flags[@]}" -DPQ2_WITH_CUBLAS -I"$(dirname "$hdr")" \
     "$src" -o /tmp/wgmma-sweep -Xlinker "$lib" -Xlinker -rpath="$libdir" >"$OUT/wgmma_build.log" 2>&1; then
  echo "built with cuBLAS ($lib)"
else
  tail -5 "$OUT/wgmma_build.log" 2>/dev/null
  nvcc "${flags[@]}" "$src" -o /tmp/wgmma-sweep >>"$OUT/wgmma_build.log" 2>&1 \
    || { tail -20 "$OUT/wgmma_build.log"; exit 1; }
  echo "built without cuBLAS (no bf16 baseline in this run)"
fi
export LD_LIBRARY_PATH=$libdir:${LD_LIBRARY_PATH:-}
if [ "${WGMMA_NCU:-0}" = 1 ]; then
  PQ2_SWEEP_CHECK_ONLY=1 timeout "${PRISM_TIMEOUT:-500}" ncu --clock-control none \
    --kernel-name regex:'gemm_kernel' --launch-count 2 --set full --page raw --csv \
    /tmp/wgmma-sweep "${1:-12288x5120}" "${2:-4096}" >"$OUT/wgmma_ncu.txt" 2>&1
  echo "ncu rc=$?"; grep -c '' "$OUT/wgmma_ncu.txt"
  exit 0
fi
timeout "${PRISM_TIMEOUT:-500}" /tmp/wgmma-sweep \
  "${1:-12288x5120,34816x5120,5120x6144,5120x17408}" "${2:-512,2048,4096}" \
  | tee "$OUT/wgmma_sweep.jsonl"
