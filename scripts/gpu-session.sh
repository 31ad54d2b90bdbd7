#!/usr/bin/env bash
# On the GPU machine of the `device` tool, after ../shared/tools/vllm-on-gpu staged vLLM there
# (here: its prepare.sh, then scripts/gpu-restage.sh, whose parts fit in a call beside the tree):
# install this tree and run one stage of the GPU checks, writing logs and results under $OUT.
#   PRISM_BUILD=cuda bash scripts/gpu-session.sh build   install with vllm_prism._C (first call)
#        (PRISM_REBUILD=1 PRISM_BUILD=cuda ... build: again, over an install in place)
#   bash scripts/gpu-session.sh tests ARGS   GPU tests (pytest ARGS; log: $OUT/${TESTLOG:-tests}.log)
#   bash scripts/gpu-session.sh bench KV     e2e benchmark of the 27B-shaped file, one KV dtype
#   bash scripts/gpu-session.sh kbench ARGS  PQ2 kernel benchmark (bench_pq2_linear.py ARGS)
#   bash scripts/gpu-session.sh gdnbench ARGS  verification-step Gated DeltaNet kernels, ours in
#        a launch sweep against vLLM's (bench_gdn_verify.py ARGS)
#   bash scripts/gpu-session.sh quality      BF16 vs INT8 KV quality on the 27B-shaped file
#        (ARGS to compare_kv_dtypes.py; --pq2-kernel auto gemm_fp8,auto [...]: PQ2 kernel choices,
#        the first against each other one)
#   bash scripts/gpu-session.sh startup ARGS  two engine starts of the 27B-shaped file in a row,
#        Triton's compiles and autotuning by kernel (bench_startup.py ARGS)
#   bash scripts/gpu-session.sh chain ARGS  a layer's PQ2 linears in sequence through the torch op
#        (bench_pq2_chain.py ARGS, e.g. --m 6 --engine-like) once per kernel choice of
#        CHAIN_KERNELS (default "auto mma_small_cuda,auto mma_stream_cuda,auto": the automatic
#        choice, mma_lean_cuda at M = 2..8, against the kernels it replaced), results under
#        $OUT/chain-*/
#   bash scripts/gpu-session.sh small-sweep [SHAPES [MS [default]]]  mma_lean geometries against the
#        small-batch kernels and the GEMV (benchmarks/kernels/pq2_small_sweep.cu, no torch)
#   bash scripts/gpu-session.sh kv-probe [CONTEXTS [CONSUME_NS]]  how fast the INT8 cache's rows
#        reach shared memory in the attention kernels' copy patterns, nothing computed
#        (benchmarks/kernels/kv_copy_probe.cu, no torch; needs no vLLM: touch
#        /tmp/vllm-gpu/env.sh first on a machine without it)
#   bash scripts/gpu-session.sh attn-trace [CONTEXTS [QS [DECODE_CONTEXTS [DECODE_SEGMENTS
#        [VERIFY_SEGMENTS [DECODE_PARTIALS]]]]]]  the INT8 attention kernels' timelines from
#        inside them (DECODE_PARTIALS: the decode partials' dtypes, e.g. fp32,fp16,bf16): the
#        verification kernel's copy waits, S^T, softmax and O^T steps; the decode kernel's
#        prologue, stages, end; both kernels' CTA spread over two launches (DECODE_SEGMENTS,
#        VERIFY_SEGMENTS: segment counts to try instead of the op's, e.g. 256,512,1024 and,
#        a KV head, 66,132,256; "" keeps the op's)
#        (benchmarks/kernels/verify_trace.cu, decode_trace.cu: no torch; needs no vLLM)
#   bash scripts/gpu-session.sh gemv-sweep [SHAPES [MS]]  configurations of the CUDA C++ GEMV against a
#        same-size streaming-read probe (benchmarks/kernels/pq2_gemv_sweep.cu, no torch)
#   bash scripts/gpu-session.sh ptq1mem      weight memory of the 27B-shaped PQ2_0 and PTQ1_0 files
#   bash scripts/gpu-session.sh ncu ARGS     Nsight Compute: what bounds each PQ2 kernel
#        (add --attention 4096,32768,131072 for the decode and verify attention)
#   bash scripts/gpu-session.sh sass [CTX [Q]]  Nsight Compute's per-instruction counts and
#        stall samples of the CUDA INT8 decode and verification attention ($OUT/attn_sass.csv)
#   bash scripts/gpu-session.sh cache        vLLM's compile cache and Triton's kernel cache as
#        $OUT/compile-cache.tgz.part-* (15 MiB pieces: at most 16 MiB comes back per file;
#        23.5 MB on 2026-12-01): copied here to .gpu-cache/ (git-ignored) and carried
#        (carry=[".gpu-cache"]) into the first call on a fresh machine, the 27B-shaped engines
#        start without recompiling (190-280 s cold against 42 s warm, 2026-12-01); vLLM and
#        Triton check every entry's hash, so a stale cache only recompiles
# Examples (the bench stage passes its extra arguments to bench_decode.py):
#   bash scripts/gpu-session.sh bench auto --batches 1 --long-context 0 --prefill \
#        --no-profile --spec-k 3 5 7 --side-by-side    verify / plain step ratio (DFlash)
#   bash scripts/gpu-session.sh bench auto --tp 1 2 --batches 1 8 64 --long-context 0 \
#        --prefill --no-profile                        TP=2 against TP=1 (nvidia-h200-x2)
#   bash scripts/gpu-session.sh bench auto --pdl 1 0 --batches 1 8 --long-context 0 \
#        --prefill --no-profile                        with and without programmatic launch
#   VLLM_PRISM_PDL=0 bash scripts/gpu-session.sh tests -m gpu tests/kernels   kernels without PDL
#   bash scripts/gpu-session.sh quality --enforce-eager --max-len 4096
# Two GPUs (nvidia-h200-x2), two streams side by side in one call: pin each with
# CUDA_VISIBLE_DEVICES, set PRISM_KEEP_SERVERS=1 (one stream must not stop the other's
# `vllm serve`) and PRISM_DEADLINE=$(( $(date +%s) + 580 )) (every stage's timeout ends
# before the call's limit; PRISM_TIMEOUT still caps a stage); give benchmarks separate
# --out-dir folders.
# The device tool brings back at most 8 files from $OUT, and $OUT starts empty in every call:
# end a call that writes more with `bash scripts/gpu-session.sh pack` (one $OUT/all.tgz).
# The 27B-shaped file is written once per machine to /tmp/b27.gguf (in the background).
# GPU tests: pass `-m gpu` (the CPU interpreter tests do not run under the GPU image's Triton
# interpreter); PRISM_BUILD=cuda builds vllm_prism._C on the first install (tests/kernels/
# test_c_ops.py needs it; the serving path does not). Do not `pkill -f` a pattern in the same
# `run` command line: it matches that command itself.
set -uo pipefail
stage=${1:?stage}
source /tmp/vllm-gpu/env.sh
export PATH=/tmp/vllm-gpu/site/bin:$PATH PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
# Several GPUs: NVLink multicast stays off (the device notes, KINDS.md), and vLLM's
# symmetric-memory all-reduce (multimem operations) with it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
  VLLM_ALLREDUCE_USE_SYMM_MEM=0
mkdir -p "$OUT"
if [ "$stage" = pack ]; then  # everything under $OUT as $OUT/all.tgz (the compile cache apart)
  (cd "$OUT" && tar czf /tmp/all.tgz --exclude='./compile-cache.tgz*' . \
     && find . -mindepth 1 ! -name 'compile-cache.tgz*' -delete && mv /tmp/all.tgz all.tgz)
  exit 0
fi
# A server left by an earlier call that was cut off holds GPU memory: stop it first.
[ "${PRISM_KEEP_SERVERS:-0}" = 1 ] || { pkill -f "vllm serve" 2>/dev/null && sleep 3; }
# seconds a stage may run: PRISM_TIMEOUT (or the stage's default), cut to end 5 s before
# PRISM_DEADLINE (epoch seconds) where that is set
limit() {
  local t=${PRISM_TIMEOUT:-$1}
  if [ -n "${PRISM_DEADLINE:-}" ]; then
    local left=$((PRISM_DEADLINE - $(date +%s) - 5))
    [ "$left" -lt "$t" ] && t=$left
  fi
  [ "$t" -lt 1 ] && t=1
  echo "$t"
}
has_ep='from importlib.metadata import entry_points as e; import sys
sys.exit(not [x for x in e(group="vllm.general_plugins") if x.name == "prism"])'
has_c='from vllm_prism import _custom_ops as o; import sys; sys.exit(not o.has_compiled_ops())'
# (re)install: the first call, PRISM_BUILD=cuda on a machine whose install has no _C, or
# PRISM_REBUILD=1 (the sources changed under an install in place: an A/B's base swapped in;
# without it the editable install keeps the _C built before, as it did on 2026-12-07)
if ! python3 -c "$has_ep" || { [ "${PRISM_BUILD:-}" = cuda ] && ! python3 -c "$has_c" 2>/dev/null; } \
    || [ "${PRISM_REBUILD:-}" = 1 ]; then
  CUDA_ARCHS=${CUDA_ARCHS:-90} VLLM_PRISM_TARGET_DEVICE=${PRISM_BUILD:-cpu} \
    python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1
  python3 -c "$has_ep" || echo "vllm-prism's entry point is not installed" >&2
  python3 -c "from vllm_prism import _custom_ops as o; print('vllm_prism._C:',
    o.has_compiled_ops(), [n for n in ('pq2_mma_int8', 'pq2_gemv_int8')
                           if o.has_compiled_op(n)])" 2>&1 | tail -1
fi
# a compile cache carried from an earlier machine (the cache stage), unpacked once
# (its pieces, compile-cache.tgz.part-aa, -ab, ... joined in order)
if ls .gpu-cache/compile-cache.tgz.part-* >/dev/null 2>&1 && [ ! -f /tmp/compile-cache.done ]; then
  cat .gpu-cache/compile-cache.tgz.part-* | tar xz -C "$HOME" && touch /tmp/compile-cache.done \
    && echo "compile cache unpacked ($(cat .gpu-cache/compile-cache.tgz.part-* | wc -c) bytes)"
fi
B27=/tmp/b27.gguf
# the 27B-shaped file, written in the background from the first call that can import vLLM; the
# lock holds the writer's pid, so a writer that died (a call's end can take its background
# jobs with it, as the kv-probe call before staging did on 2026-12-07) is started again
b27_writer_alive() { [ -f /tmp/b27.lock ] && kill -0 "$(cat /tmp/b27.lock)" 2>/dev/null; }
if [ ! -f $B27 ] && ! b27_writer_alive && python3 -c "import vllm" 2>/dev/null; then
  setsid bash -c "python3 -m vllm_prism.entrypoints.cli make-tiny --shape bonsai-2-27b $B27.tmp \
     >/tmp/b27.log 2>&1 && mv $B27.tmp $B27" </dev/null >/dev/null 2>&1 &
  echo $! >/tmp/b27.lock
fi
wait_b27() {  # until the file is written; fails at once when no writer is running, or near
  # PRISM_DEADLINE
  while [ ! -f $B27 ]; do
    b27_writer_alive || [ -f $B27 ] || { echo "no writer of $B27 (vLLM not staged?):" >&2;
                          tail -3 /tmp/b27.log 2>/dev/null >&2; return 1; }
    sleep 2; [ "$(limit 560)" -gt 1 ] || { tail -3 /tmp/b27.log; return 1; }
  done
}
# benchmarks/kernels/pq2_small_sweep.cu and the kernels it links, compiled side by side
small_sweep_build() {
  local d=/tmp/small-sweep.o f pids=()
  mkdir -p $d
  for f in benchmarks/kernels/pq2_small_sweep.cu csrc/pq2/mma_small.cu csrc/pq2/mma_bulk.cu \
           csrc/pq2/mma_lean.cu csrc/pq2/gemv_int8.cu; do
    nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -c "$f" -o "$d/$(basename "$f").o" & pids+=($!)
  done
  for f in "${pids[@]}"; do wait "$f" || return 1; done
  nvcc -arch=sm_90a $d/*.o -o "$1"
}
case $stage in
  build)  # the install above is all: PRISM_BUILD=cuda bash scripts/gpu-session.sh build
    # (an install found in place, e.g. scripts/gpu-attn-check.sh's earlier on this machine,
    # is kept: no install.log then)
    if [ -f "$OUT/install.log" ]; then tail -20 "$OUT/install.log"; else
      python3 -c "$has_c" 2>/dev/null && echo "vllm_prism installed already, with vllm_prism._C" \
        || echo "vllm_prism installed already, without vllm_prism._C"
    fi
    ;;
  tests)
    shift
    # Each engine run's log lands under $OUT/runs as it is written (tests/e2e/test_llm.py),
    # so a run cut off by the call's time limit still shows where it was.
    export PRISM_TEST_LOG_DIR=${PRISM_TEST_LOG_DIR:-$OUT/runs-${TESTLOG:-tests}}
    timeout $(limit 560) python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 \
      | tee "$OUT/${TESTLOG:-tests}.log"
    # the engine logs as one file (the device tool brings back at most 8)
    [ -d "$PRISM_TEST_LOG_DIR" ] && tar czf "$PRISM_TEST_LOG_DIR.tgz" -C "$(dirname "$PRISM_TEST_LOG_DIR")" \
      "$(basename "$PRISM_TEST_LOG_DIR")" && rm -rf "$PRISM_TEST_LOG_DIR"
    ;;
  bench)
    kv=${2:?kv}; shift 2
    wait_b27 || exit 1
    timeout $(limit 560) python3 benchmarks/e2e/bench_decode.py $B27 --kv "$kv" "$@" 2>&1 \
      | tee "$OUT/bench-$kv.log" | grep -v "^INFO\|^DEBUG\|^WARNING"
    cp benchmarks/results/e2e_*.json benchmarks/results/e2e_*.md "$OUT"/ 2>/dev/null
    ;;
  startup)  # where an engine's start goes (bench_startup.py ARGS): two starts in a row, the
    # second with the first's Triton, autotuning and compile caches ($OUT/startup_h200-N.*)
    shift
    wait_b27 || exit 1
    for n in 1 2; do
      timeout $(limit 560) python3 benchmarks/e2e/bench_startup.py $B27 --gpu "h200-$n" \
        --out "$OUT" "$@" > "$OUT/startup-$n.log" 2>&1
      grep -E "took|ready in|^\| " "$OUT/startup-$n.log" | grep -v "^(EngineCore" | head -60
    done
    ;;
  kbench)
    shift
    timeout $(limit 560) python3 benchmarks/kernels/bench_pq2_linear.py "$@" 2>&1 | tee "$OUT/kbench.log"
    cp benchmarks/results/pq2_linear_*.json benchmarks/results/pq2_linear_*.md "$OUT"/ 2>/dev/null
    ;;
  gdnbench)  # the verification step's Gated DeltaNet kernels (bench_gdn_verify.py ARGS)
    shift
    timeout $(limit 560) python3 benchmarks/kernels/bench_gdn_verify.py "$@" 2>&1 | tee "$OUT/gdnbench.log"
    cp benchmarks/results/gdn_verify_*.json benchmarks/results/gdn_verify_*.md "$OUT"/ 2>/dev/null
    ;;
  gemv-sweep)
    nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc benchmarks/kernels/pq2_gemv_sweep.cu -o /tmp/gemv-sweep \
      && timeout $(limit 560) /tmp/gemv-sweep "${2:-12288x5120,34816x5120,5120x6144,5120x17408}" "${3:-1,2,3,4}" \
      | tee "$OUT/gemv_sweep.jsonl" | grep summary
    ;;
  kv-probe)  # the INT8 KV cache's copy patterns without attention (no torch, no vLLM)
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Icsrc \
      benchmarks/kernels/kv_copy_probe.cu -o /tmp/kv-probe \
      && timeout $(limit 120) /tmp/kv-probe "${2:-32768,131072}" "${3:-0,1000,2000,3000}" \
      | tee "$OUT/kv_probe.jsonl" | grep summary
    ;;
  attn-trace)  # the INT8 attention kernels' own timelines (no torch, no vLLM): the
    # verification kernel's stage steps and copy waits per (context, query tokens, producer),
    # the decode kernel's prologue, stages, end and CTA spread per (context, segments, copy)
    f=(-O3 -std=c++17 --use_fast_math -gencode arch=compute_90a,code=sm_90a -Icsrc)
    nvcc "${f[@]}" benchmarks/kernels/verify_trace.cu -o /tmp/verify-trace & v=$!
    nvcc "${f[@]}" benchmarks/kernels/decode_trace.cu -o /tmp/decode-trace || exit 1
    wait $v || exit 1
    timeout $(limit 200) /tmp/verify-trace "${2:-32768,131072}" "${3:-4,6,8}" ${6:-} \
      | tee "$OUT/verify_trace.jsonl"
    timeout $(limit 150) /tmp/decode-trace "${4:-4096,32768,131072}" "${5:-}" "${7:-fp32}" \
      | tee "$OUT/decode_trace.jsonl"
    python3 benchmarks/kernels/trace_summary.py "$OUT/verify_trace.jsonl" \
      "$OUT/decode_trace.jsonl" --title "$(date +%F)" --out "$OUT/attention_trace.md"
    ;;
  chain)  # bench_pq2_chain.py ARGS once per VLLM_PRISM_PQ2_KERNEL of $CHAIN_KERNELS
    shift
    for k in ${CHAIN_KERNELS:-auto mma_small_cuda,auto mma_stream_cuda,auto}; do
      echo "== VLLM_PRISM_PQ2_KERNEL=$k"
      VLLM_PRISM_PQ2_KERNEL=$k timeout $(limit 150) python3 benchmarks/kernels/bench_pq2_chain.py \
        "$@" --out "$OUT/chain-${k%%,*}" 2>&1 | grep "gap_us\|check_rel_err\|linears of"
    done
    ;;
  small-sweep)  # mma_lean's geometries against the small-batch kernels and the GEMV (no torch)
    small_sweep_build /tmp/small-sweep \
      && timeout $(limit 560) /tmp/small-sweep "${2:-34816x5120,16384x5120,12288x5120,5120x17408,5120x6144,248320x5120}" \
        "${3:-1,2,4,6,8}" ${4:-} | tee "$OUT/small_sweep.jsonl" | grep summary
    ;;
  ncu)  # what bounds each PQ2 kernel (Nsight Compute); ARGS go to profile_pq2_ncu.py
    shift
    timeout $(limit 560) python3 benchmarks/kernels/profile_pq2_ncu.py "$@" 2>&1 \
      | tee "$OUT/ncu.log" | tail -80
    cp benchmarks/results/pq2_ncu_*.json benchmarks/results/pq2_ncu_*.md "$OUT"/ 2>/dev/null
    ;;
  sass)  # per-instruction counts and stall samples of the CUDA INT8 attention kernels at
    # context ${2:-32768} (Nsight Compute's source page, SASS): $OUT/attn_sass.csv, details,
    # and its summary (benchmarks/kernels/sass_summary.py) $OUT/attn_sass_summary.md
    shift
    ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
    timeout $(limit 300) "$ncu_bin" --clock-control none --profile-from-start off \
      -k regex:int8_ --section SourceCounters --section WarpStateStats \
      --section LaunchStats --section Occupancy --import-source no -f -o "$OUT/attn" \
      python3 benchmarks/kernels/profile_pq2_ncu.py --child --shapes none --m 1 \
      --attention "${1:-32768}" --verify-q "${2:-6}" >"$OUT/sass-run.log" 2>&1
    "$ncu_bin" -i "$OUT/attn.ncu-rep" --page source --csv --print-source sass \
      >"$OUT/attn_sass.csv" 2>"$OUT/sass-err.log"
    "$ncu_bin" -i "$OUT/attn.ncu-rep" --page details --csv >"$OUT/attn_details.csv" \
      2>>"$OUT/sass-err.log"
    python3 benchmarks/kernels/sass_summary.py "$OUT/attn_sass.csv" --kernel int8_ \
      >"$OUT/attn_sass_summary.md" 2>>"$OUT/sass-err.log"
    ls -la "$OUT"; tail -n 5 "$OUT/sass-run.log" "$OUT/sass-err.log"
    ;;
  quality)
    shift
    wait_b27 || exit 1
    timeout $(limit 560) python3 benchmarks/quality/compare_kv_dtypes.py $B27 "$@" 2>&1 \
      | tee "$OUT/quality.log"
    ;;
  cache)  # at most 16 MiB comes back from $OUT per file, 8 files and about 64 MiB a call, and
    # carry takes 64 MiB: the newest entries of vLLM's compile cache and Triton's cache that
    # pack into ${CACHE_MIB:-60} MiB (the cache after the DFlash tests was 134 MB on 2026-12-07;
    # an entry left out only recompiles), in 15 MiB pieces
    entries=$(cd "$HOME" && ls -dt .cache/vllm/torch_compile_cache/* .triton/cache/* 2>/dev/null)
    raw=$((4 * ${CACHE_MIB:-60} * 1048576))  # uncompressed budget, halved until the pack fits
    while [ -n "$entries" ]; do
      rm -f "$OUT"/compile-cache.tgz.part-*
      pick=$(cd "$HOME" && du -sb $entries | awk -v b=$raw '(t += $1) <= b {print $2}')
      [ -n "$pick" ] && tar czf - -C "$HOME" $pick | split -b 15M - "$OUT/compile-cache.tgz.part-"
      [ "$(cat "$OUT"/compile-cache.tgz.part-* 2>/dev/null | wc -c)" -le \
        $((${CACHE_MIB:-60} * 1048576)) ] && break
      raw=$((raw / 2))
    done
    echo "compile cache: $(echo $pick | wc -w) of $(echo $entries | wc -w) entries," \
      "$(cat "$OUT"/compile-cache.tgz.part-* 2>/dev/null | wc -c) bytes in" \
      "$(ls "$OUT"/compile-cache.tgz.part-* 2>/dev/null | wc -l) pieces"
    ;;
  ptq1mem)
    P27=/tmp/b27-ptq1.gguf
    [ -f $P27 ] || python3 -m vllm_prism.entrypoints.cli make-tiny --shape bonsai-2-27b \
      --format ptq1_0 $P27 >"$OUT/ptq1-make.log" 2>&1
    wait_b27 || exit 1
    timeout $(limit 500) python3 benchmarks/memory/weight_memory.py $B27 $P27 \
      --out benchmarks/results/weight_memory_held_h200.md 2>&1 | tee "$OUT/ptq1mem.log" \
      | grep -v "^INFO\|^DEBUG\|^WARNING\|^(EngineCore"
    cp benchmarks/results/weight_memory_held_h200.md "$OUT"/ 2>/dev/null
    ;;
esac
