"""Prefill on FP8 tensor cores: ternary codes as e4m3, 1x128 block scales on both operands.

A PQ2_0 weight is ``W[n, k] = (code - 1) * d[n, k // 128]``: its codes -1 / 0 / +1 are exact
in float8_e4m3fn, and its scales are a 1x128 block scaling of the kind cuBLAS applies on
Hopper (``torch._scaled_mm`` with BlockWise1x128 on both operands, CUDA >= 12.9, sm_90).
The activation gets the same recipe: each 128-value group of a token scaled by its absmax /
448 into e4m3. So the GEMM runs on the FP8 tensor cores (whose peak is twice bf16's;
cuBLAS's block-scaled kernel reached 0.68-1.35x bf16 ``F.linear`` on the H200) and the weight
pass writes 1 byte a weight (``gemm_dq`` writes 2 in bf16, then reads them back).

The price is the activation's e4m3 rounding (3 mantissa bits, per 128-group scale): a
larger error than the int8 kernels' per-group int8, measured against the fp32 reference by
``benchmarks/kernels/bench_pq2_fp8_gemm.py``.

Two Triton launches and the cuBLAS GEMM:

* :func:`pq2_codes_fp8`: the prepared code plane as e4m3 ``[N, K]`` and the scales as
  float32 ``[K/128, N]`` (the layout ``_scaled_mm`` takes for the second operand's 1x128
  blocks), by the dequantization pass of triton_dequant with the scales kept apart;
* :func:`quantize_fp8_1x128`: the activation as e4m3 ``[M', K]`` and its scales as float32,
  ``[M', K/128]`` with stride ``(1, M')`` (outer-dimension-major, as cuBLAS requires), M'
  being M padded to a multiple of 16 rows (zeros; cuBLAS refused M = 513).
"""

from __future__ import annotations

import torch

from vllm_prism.kernels.common import HAS_TRITON, cdiv
from vllm_prism.kernels.pq2.layout import PQ2Weight
from vllm_prism.kernels.pq2.triton_dequant import pq2_codes_and_scales

if HAS_TRITON:
    import triton
    import triton.language as tl

__all__ = ["FP8_MAX", "gemm_fp8", "pq2_codes_fp8", "quantize_fp8_1x128"]

FP8_MAX = 448.0
GROUP = 128
_ACT_ROWS = 16
# cuBLAS refuses the block-scaled GEMM (CUBLAS_STATUS_NOT_SUPPORTED on the H200, torch 2.11,
# CUDA 13.0) for M = 513 (and for some M of vLLM's graph capture sizes) and takes M = 128 and
# 4096: the activation is padded to a multiple of 16 rows.
ROW_MULTIPLE = 16

if HAS_TRITON:

    @triton.jit
    def _quantize_fp8_kernel(x_ptr, out_ptr, scale_ptr, M, M_PAD, K, stride_xm, stride_om,
                             FP8_MAX: tl.constexpr, ROWS: tl.constexpr, GROUP: tl.constexpr):
        # rows M .. M_PAD - 1 (padding) get zeros and scale 1
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        g = tl.program_id(1)
        cols = g * GROUP + tl.arange(0, GROUP)
        rows64 = rows.to(tl.int64)
        x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :],
                    mask=(rows < M)[:, None] & (cols < K)[None, :], other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=1)
        s = tl.where(amax > 0, amax / FP8_MAX, 1.0)
        q = tl.clamp(x / s[:, None], -FP8_MAX, FP8_MAX)
        tl.store(out_ptr + rows64[:, None] * stride_om + cols[None, :],
                 q.to(out_ptr.dtype.element_ty),
                 mask=(rows < M_PAD)[:, None] & (cols < K)[None, :])
        tl.store(scale_ptr + g.to(tl.int64) * M_PAD + rows64, s, mask=rows < M_PAD)


def pq2_codes_fp8(w: PQ2Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scales)``: the codes minus one as float8_e4m3fn ``[N, K]`` (exact: -1, 0, 1)
    and the block scales as float32 ``[K/128, N]`` (triton_dequant's pass, scales apart)."""
    return pq2_codes_and_scales(w, torch.float8_e4m3fn)


def quantize_fp8_1x128(x: torch.Tensor, row_multiple: int = 1
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scales)``: ``x`` ``[M, K]`` as float8_e4m3fn with one float32 scale per token
    and 128-group (absmax / 448), the scales ``[M', K/128]`` with stride ``(1, M')``; ``M'``
    is M rounded up to ``row_multiple``, the rows past M zeros with scale 1."""
    m, k = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    if k % GROUP:
        raise ValueError(f"K = {k} is not a multiple of {GROUP}")
    m_pad = cdiv(m, row_multiple) * row_multiple
    q = torch.empty(m_pad, k, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(k // GROUP, m_pad, dtype=torch.float32, device=x.device)
    grid = (cdiv(m_pad, _ACT_ROWS), k // GROUP)
    _quantize_fp8_kernel[grid](x, q, scales, m, m_pad, k, x.stride(0), q.stride(0),
                               FP8_MAX=FP8_MAX, ROWS=_ACT_ROWS, GROUP=GROUP, num_warps=4)
    return q, scales.t()


def gemm_fp8(x: torch.Tensor, w: PQ2Weight, bias: torch.Tensor | None = None,
             out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``x @ W^T (+ bias)`` for a 2-D float ``x`` (already rotated where the weight folds a
    Hadamard transform) on the FP8 tensor cores."""
    xq, xs = quantize_fp8_1x128(x, ROW_MULTIPLE)
    wq, ws = pq2_codes_fp8(w)
    y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=out_dtype)
    y = y[:x.shape[0]]
    return y if bias is None else y + bias.to(y.dtype)
