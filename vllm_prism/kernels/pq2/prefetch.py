"""The order of the PQ2 linears, so a GEMV can ask L2 for the next one's weights.

A batch-1 decode step streams every ternary weight once, one linear after another, and each
GEMV alone reaches only about half of the read bandwidth (its ramp, its tail, memory latency:
benchmarks/results/pq2_gemv_sweep_h200.md). The weights do not depend on the activations, so
while one GEMV streams its own, the bandwidth it leaves unused can bring the next linear's
planes into L2 (sm_90 ``cp.async.bulk.prefetch.L2``, issued by the CUDA C++ GEMV:
csrc/pq2/pq2_device.cuh ``l2_prefetch_next``), and the next GEMV then reads them from L2.

The prism quantization method registers each layer's planes here as it prepares them, which
is the order vLLM builds the modules in and the order a step runs them (per decoder layer:
the attention or Gated DeltaNet input projection, its output projection, ``gate_up_proj``,
``down_proj``; the LM head last). :func:`next_planes` gives the planes after a layer's: the
first ``PREFETCH_MAX_BYTES`` of its codes (at most half of an H200's L2, so a prefetch does
not evict the lines it brings) and its scales. ``VLLM_PRISM_L2_PREFETCH`` turns it on.
"""

from __future__ import annotations

import weakref

import torch

from vllm_prism import envs

__all__ = ["PREFETCH_MAX_BYTES", "clear_chain", "l2_prefetch_mode", "next_planes",
           "register_planes"]

PREFETCH_MAX_BYTES = 24 << 20
Planes = tuple[torch.Tensor, torch.Tensor]
_Ref = tuple["weakref.ref[torch.Tensor]", "weakref.ref[torch.Tensor]"]
_LAST: dict[torch.device, _Ref] = {}  # the last registered layer per device
_NEXT: dict[int, _Ref] = {}  # codes address -> the next layer's planes


def l2_prefetch_mode() -> int:
    """``VLLM_PRISM_L2_PREFETCH``: 0 off, 1 prefetch, 2 prefetch with the evict-last hint."""
    mode = envs.VLLM_PRISM_L2_PREFETCH
    if mode not in (0, 1, 2):
        raise ValueError(f"VLLM_PRISM_L2_PREFETCH={mode} must be 0, 1 or 2")
    return mode


def _head(codes: torch.Tensor, scales: torch.Tensor) -> Planes:
    """The first rows of ``codes`` up to PREFETCH_MAX_BYTES (a contiguous view), and scales."""
    row_bytes = max(1, codes.stride(0) * codes.element_size())
    rows = max(1, min(codes.shape[0], PREFETCH_MAX_BYTES // row_bytes))
    return codes[:rows], scales[:rows]


def register_planes(codes: torch.Tensor, scales: torch.Tensor) -> None:
    """Append a prepared layer's planes (int32 codes [N, K/16], fp16 scales) to the order;
    the layer registered before it on the same device will prefetch them. Only weak
    references are kept (a model that is freed leaves nothing alive here); planes that are
    not contiguous CUDA tensors are not linked."""
    if codes.device.type != "cuda" or not (codes.is_contiguous() and scales.is_contiguous()):
        return
    _link(codes, scales)


def _link(codes: torch.Tensor, scales: torch.Tensor) -> None:
    ref = (weakref.ref(codes), weakref.ref(scales))
    prev = _LAST.get(codes.device)
    prev_codes = prev[0]() if prev is not None else None
    if prev_codes is not None:
        _NEXT[prev_codes.data_ptr()] = ref
    _LAST[codes.device] = ref


def next_planes(codes: torch.Tensor) -> Planes | None:
    """The planes to prefetch after the layer whose codes are ``codes``, or None."""
    ref = _NEXT.get(codes.data_ptr())
    if ref is None:
        return None
    nxt_codes, nxt_scales = ref[0](), ref[1]()
    if nxt_codes is None or nxt_scales is None:
        return None
    return _head(nxt_codes, nxt_scales)


def clear_chain() -> None:
    """Forget every registered layer (tests, or a process that loads another model)."""
    _LAST.clear()
    _NEXT.clear()
