"""Every VLLM_PRISM_* environment switch, documented in one place and read lazily.

Use it as ``from vllm_prism import envs; envs.VLLM_PRISM_TARGET_DEVICE``. A switch lives here
only while two paths are both worth keeping; see docs/switches.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

environment_variables: dict[str, Callable[[], Any]] = {
    # Build time (setup.py): "cpu" skips the CUDA extension, "cuda" requires it; unset:
    # build it when a CUDA toolkit and a CUDA torch are present.
    "VLLM_PRISM_TARGET_DEVICE": lambda: os.getenv("VLLM_PRISM_TARGET_DEVICE", "").lower(),
    # Where vllm-prism caches what it derives from a GGUF file (the tokenizer folder).
    "VLLM_PRISM_CACHE_DIR": lambda: os.path.expanduser(
        os.getenv("VLLM_PRISM_CACHE_DIR", "~/.cache/vllm-prism")),
    # PQ2 linear kernel (vllm_prism.kernels.pq2.dispatch): "auto" (default) picks by M, shape
    # and GPU; kernel names, comma-separated (gemv_a8, gemv_a16, ptq1_gemv, mma_a16, mma_a8,
    # gemm_a16, gemm_a8, gemm_dq, gemm_fp8, wgmma_cuda, wgmma_fold, gemv_cuda, gemv_fused_cuda,
    # mma_cuda, mma_small_cuda, mma_small_pipe_cuda, mma_stream_cuda, mma_bulk_cuda, torch), are
    # tried first in that order and, where none can run a call, it falls back to auto with a
    # warning.
    "VLLM_PRISM_PQ2_KERNEL": lambda: os.getenv("VLLM_PRISM_PQ2_KERNEL", "auto").strip().lower(),
    # The automatic prefill kernel from M = 512 on compute capability 9.0 where the codes are
    # ternary (not the LM head): "0" (default) the exact gemm_dq; "1" wgmma_fold (int8
    # activations per token and 1024-block, the group scales folded into the weights: 1.19-1.21x
    # gemm_dq for a 4K prefill through vLLM on the H200, but the tiny model's 640-token prompt
    # log-probs 0.35-0.40 nats from transformers' against gemm_dq's 0.17-0.19, over the e2e
    # tests' 0.35: benchmarks/results/e2e_h200_notes.md, thirty-fourth session).
    "VLLM_PRISM_PQ2_FOLD_PREFILL": lambda: os.getenv("VLLM_PRISM_PQ2_FOLD_PREFILL",
                                                     "0").strip().lower() in ("1", "true", "on"),
    # Programmatic dependent launch of the PQ2 linear kernels on Hopper and newer GPUs
    # (kernels/common.py use_pdl): each kernel lets the next one launch early and waits for its
    # inputs in the kernel; the GEMV loads its first weight tile before that wait. On by
    # default (through vLLM on the H200: batch 1 +5.7 %, 8 streams +7.2 %,
    # benchmarks/results/e2e_h200_notes.md); "0" turns it off. Read per launch; it changes no
    # traced graph.
    "VLLM_PRISM_PDL": lambda: os.getenv("VLLM_PRISM_PDL", "1").strip().lower() in ("1", "true",
                                                                                     "on"),
    # Decode and verification attention kernel over an INT8 KV cache
    # (attention/ops/triton_split_kv.py): "auto" (default) runs the CUDA C++ kernels of
    # vllm_prism._C (attention/ops/cuda_decode.py) wherever they can serve the call, the Triton
    # split-KV kernel elsewhere; "triton" always the Triton kernel; "cuda" the same as "auto".
    # Read per call (inside vLLM's attention op, outside any traced graph).
    "VLLM_PRISM_ATTN_KERNEL": lambda: os.getenv("VLLM_PRISM_ATTN_KERNEL", "auto").strip().lower(),
    # Warps a (16-slot tile, KV head) in the CUDA C++ INT8 decode kernel
    # (csrc/attention/int8_decode.cu): "2" two, each over half of the head dimension (eight
    # warps a CTA); "1" one (four warps a CTA); "auto" (default) one where the kernel
    # launches with programmatic dependent launch (VLLM_PRISM_ATTN_PDL on Hopper and newer:
    # 0.97-0.98x the two-warp form's time at 32K, 1.00x at 128K, 1.04-1.09x at 4K on the H100),
    # two elsewhere (1.14x faster at 4K without it on the H200). Read per call, outside any
    # traced graph; any other value is refused before the engine starts.
    "VLLM_PRISM_ATTN_DECODE_SPLIT": lambda: os.getenv("VLLM_PRISM_ATTN_DECODE_SPLIT",
                                                      "auto").strip().lower(),
    # How the CUDA C++ INT8 decode kernel copies a stage's 16-slot tiles into shared memory:
    # "cp_async" (every thread's 16-byte cp.async), "bulk" (thread 0's one bulk-copy request a
    # tile, cp.async.bulk, compute capability 9.0 and newer; "cp_async" below, with a warning)
    # or "auto" (default: "cp_async"). Read per call, outside any traced graph; any other value
    # is refused before the engine starts.
    "VLLM_PRISM_ATTN_DECODE_COPY": lambda: os.getenv("VLLM_PRISM_ATTN_DECODE_COPY",
                                                     "auto").strip().lower(),
    # The CUDA C++ INT8 verification kernel (csrc/attention/int8_verify.cu, exact Q.K): "1"
    # (default) keeps each column's running maximum across stages while a stage's scores stay
    # within 2^8 of it (one CTA barrier a stage fewer; the exact softmax where they do not);
    # "0" the exact per-stage softmax every stage. Read per call, outside any traced graph.
    "VLLM_PRISM_ATTN_VERIFY_LAZY": lambda: os.getenv("VLLM_PRISM_ATTN_VERIFY_LAZY",
                                                     "1").strip() != "0",
    # The CUDA C++ INT8 verification kernel's form: "auto" (default: "wgmma_tma" wherever it
    # can serve the call, else "mma", without warnings), "mma" (csrc/attention/int8_verify.cu,
    # mma.sync), "wgmma" (int8_verify_wgmma.cu: Hopper's warpgroup MMA, warp-specialised, its
    # producer copying rows by cp.async; compute capability 9.0 with the extension built for
    # sm_90, head sizes 128 / 256, exact Q.K; the "mma" form serves every other call) or
    # "wgmma_tma" (the same kernel, its producer copying each 16-slot tile as one TMA box of a
    # tensor map over the cache: vLLM's NHD layout, else "wgmma"; on the H100 (2026-12-06)
    # 0.73-0.84x the mma form's time at 4-8 tokens; at 6 tokens 1.24x / 1.23x the decode
    # kernel at 32K / 128K, 2026-12-08). "wgmma" takes 0.94-1.17x the mma form's time
    # (docs/attention.md). Read per call, outside any traced graph; any other value is refused
    # before the engine starts.
    "VLLM_PRISM_ATTN_VERIFY_FORM": lambda: os.getenv("VLLM_PRISM_ATTN_VERIFY_FORM",
                                                     "auto").strip().lower(),
    # The CUDA C++ INT8 decode and verification kernels and their merge with programmatic
    # dependent launch (attention/ops/cuda_decode.py): "1" (default) wherever VLLM_PRISM_PDL
    # gives it to the PQ2 kernels (Hopper and newer); "0" never. Read per call, outside any
    # traced graph.
    "VLLM_PRISM_ATTN_PDL": lambda: os.getenv("VLLM_PRISM_ATTN_PDL", "1").strip() != "0",
    # Prefill chunks at context 0 (a prompt's first chunk) in the PRISM attention backend:
    # "1" (default) attends to the step's own K and V (one causal SDPA call, before any INT8
    # rounding); "0" reads them back from the KV cache like every later chunk
    # (attention/ops/prefill.py). Read per call, outside any traced graph.
    "VLLM_PRISM_PREFILL_FRESH_KV": lambda: os.getenv("VLLM_PRISM_PREFILL_FRESH_KV",
                                                     "1").strip().lower() in ("1", "true", "on"),
    # Tile overrides for the int8 GEMV (kernels/pq2/triton_gemv.py), to measure a variant
    # through vLLM: comma-separated key=value among n (rows per program), g (groups per step),
    # w (warps), depth (tiles in flight, 1..3), scales (1: scales travel with their tile),
    # split (programs per row's K). Empty (default): the tuned defaults.
    "VLLM_PRISM_GEMV_TUNING": lambda: os.getenv("VLLM_PRISM_GEMV_TUNING", "").strip().lower(),
    # The float projections Bonsai keeps (the Gated DeltaNet's in_proj_ba) on CUDA: "auto"
    # (default) the one-launch small-M GEMV of kernels/dense_gemv.py for M <= AUTO_M (8) rows,
    # F.linear above (1.9-2.3x F.linear at M = 1..2 on the H200, 1.1x at 6..8, slower at 16;
    # 0.17 ms off a 32K batch-1 step and 0.15 ms of kernels off a 6-token verification step
    # through vLLM); "torch" F.linear always, as vLLM runs them (cuBLAS: a split-K GEMM and a
    # reduction at decode sizes); "triton" the GEMV for every M <= 16 (without PDL above
    # M = 2). Read per call inside the op vllm_prism::dense_linear; it changes no traced graph.
    "VLLM_PRISM_DENSE_GEMV": lambda: os.getenv("VLLM_PRISM_DENSE_GEMV", "auto").strip().lower(),
    # A drafter's attention backend (DFlash, EAGLE) on CUDA with an INT8 KV cache: "prism"
    # (default) the PRISM backend (the draft blocks on its split-KV path: a 32K-context
    # verification step 8.40 against 11.24 ms on the H200, thirteenth run); "vllm" leaves the
    # choice to vLLM (its Triton attention: a DFlash draft block walks the whole context in
    # one program per KV head, 2.1 ms a step). Read when the engine arguments are prepared; a
    # speculative config that names an attention_backend wins.
    "VLLM_PRISM_DRAFT_ATTENTION": lambda: os.getenv("VLLM_PRISM_DRAFT_ATTENTION",
                                                    "prism").strip().lower(),
    # The Gated DeltaNet of Bonsai's speculative verification steps on CUDA: "prism" (default)
    # the kernel of kernels/gdn_verify.py, which reads q, k, v, a and b in place and writes
    # the layer's output buffer (364 us a 6-token step of the 27B model on the H200 against
    # 744 us for vLLM's fused CUDA kernel; vLLM's Triton path also copies its inputs, ~580
    # us); "vllm" leaves it to vLLM (VLLM_GDN_DECODE_KERNEL). Read when the model is built.
    "VLLM_PRISM_GDN_VERIFY": lambda: os.getenv("VLLM_PRISM_GDN_VERIFY", "prism").strip().lower(),
    # Patches to vLLM (vllm_prism/patches) not to apply, by name, comma-separated: to measure
    # what one changes, or to rule it out. Empty (default): every patch for this vLLM.
    "VLLM_PRISM_DISABLED_PATCHES": lambda: [x.strip() for x in os.getenv(
        "VLLM_PRISM_DISABLED_PATCHES", "").split(",") if x.strip()],
}


# The values a switch with a fixed set takes (checked before the engine starts:
# vllm_prism/engine/arg_utils.py); the first is the default.
CHOICES: dict[str, tuple[str, ...]] = {
    "VLLM_PRISM_ATTN_DECODE_COPY": ("auto", "cp_async", "bulk"),
    "VLLM_PRISM_ATTN_DECODE_SPLIT": ("auto", "1", "2"),
    "VLLM_PRISM_ATTN_VERIFY_FORM": ("auto", "mma", "wgmma", "wgmma_tma"),
    "VLLM_PRISM_DENSE_GEMV": ("auto", "torch", "triton"),
    "VLLM_PRISM_DRAFT_ATTENTION": ("prism", "vllm"),
    "VLLM_PRISM_GDN_VERIFY": ("prism", "vllm"),
}


def choice(name: str, override: str | None = None) -> str:
    """The value of switch ``name`` of CHOICES: ``override`` where given (a module setting a
    benchmark or a test makes), else the environment's; any other value is refused by name."""
    value = override or environment_variables[name]()
    allowed = CHOICES[name]
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: use one of {', '.join(allowed)}")
    return value


def __getattr__(name: str) -> Any:
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(environment_variables.keys())
