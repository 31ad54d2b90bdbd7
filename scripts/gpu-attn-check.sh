#!/usr/bin/env bash
# On the device tool's GPU machine, without vLLM: build vllm_prism._C alone, run the INT8
# attention kernels' GPU tests and time them against each other, writing under $OUT.
#   bash scripts/gpu-attn-check.sh [PYTEST_K [CONTEXTS]]     (defaults: wgmma, 32768,131072)
# PYTEST_K selects tests of tests/attention/test_attention_gpu.py (pytest -k; "" for all); the
# tests stop at the first failure, and a hung kernel fails its test by name after 60 s and ends
# the run (attn_helpers.synchronize_or_fail). Timeouts: PRISM_TEST_TIMEOUT (300 s),
# PRISM_BENCH_TIMEOUT (170 s). CUDA_ARCHS (90) as setup.py reads it. The image's bare `pip`
# belongs to another Python ("torch is not installed in the build environment"): python3 -m pip.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if ! CUDA_ARCHS=${CUDA_ARCHS:-90} VLLM_PRISM_TARGET_DEVICE=cuda timeout 400 \
    python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/build.log" 2>&1; then
  echo "build failed ($OUT/build.log):"
  tail -30 "$OUT/build.log"
  exit 1
fi
echo "built vllm_prism._C"
timeout "${PRISM_TEST_TIMEOUT:-300}" python3 -m pytest -q -m gpu \
  tests/attention/test_attention_gpu.py -k "${1-wgmma}" -x -p no:cacheprovider -rfE 2>&1 \
  | tail -40 > "$OUT/tests.log"
echo "tests rc ${PIPESTATUS[0]}"
tail -8 "$OUT/tests.log"
timeout "${PRISM_BENCH_TIMEOUT:-170}" python3 benchmarks/kernels/bench_attention.py \
  --contexts "${2:-32768,131072}" --deadline 30 --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench rc $?"
# the INT8 CUDA rows: decode and every verification form
grep -hE '^\| (decode|verify) \| cuda( wgmma)?( tma)?( bf16)?( bulk copy)? \| int8' "$OUT"/attention_*.md
