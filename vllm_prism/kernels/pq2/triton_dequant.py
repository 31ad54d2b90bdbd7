"""Prefill by dense GEMM: the prepared PQ2 planes dequantized to bf16/fp16 in one pass, then
the vendor GEMM (cuBLAS through ``F.linear``).

At prefill sizes (M in the thousands) the int8 tensor-core kernels reach 0.36-0.56x of a bf16
``F.linear`` on the H200 (benchmarks/results/pq2_linear_h200.md), while writing the whole
matrix in bf16 costs about 2.3 bytes a weight of memory traffic (read 0.28, write 2): 0.1 ms
for the 34816x5120 MLP matrix, against a GEMM of 1-2 ms at M = 2048-4096. So for large M the
dense path should win; the kernel `gemm_dq` (dispatch.py) runs it where
``VLLM_PRISM_PQ2_KERNEL`` names it until a GPU run has timed it.

The dequantization reads each code word once: element ``16w + i`` of a row is code
``(word >> (8 (i % 4) + 2 (i // 4))) & 3`` (layout.py), its value ``(code - 1) * d`` with
``d`` the fp16 scale of its 128-group (word ``w // 8``), rounded once to the output dtype.
"""

from __future__ import annotations

import torch

from vllm_prism.kernels.common import HAS_TRITON, cdiv
from vllm_prism.kernels.pq2.layout import PQ2Weight

if HAS_TRITON:
    import triton
    import triton.language as tl

__all__ = ["dequantize_pq2", "pq2_codes_and_scales"]

_BLOCK_N = 8
_BLOCK_W = 64  # words: 1024 weights of each of 8 rows per program

if HAS_TRITON:

    @triton.jit
    def _pq2_dequant_kernel(codes_ptr, scales_ptr, out_ptr, scales_t_ptr, N, W, G, stride_cn,
                            stride_sn, stride_on, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                            APPLY_SCALES: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        words = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
        mask = (rows < N)[:, None] & (words < W)[None, :]
        rows64 = rows.to(tl.int64)
        code_words = tl.load(codes_ptr + rows64[:, None] * stride_cn + words[None, :],
                             mask=mask, other=0)
        i = tl.arange(0, 16)
        shift = 8 * (i % 4) + 2 * (i // 4)
        codes = (code_words[:, :, None] >> shift[None, None, :]) & 3
        vals = codes.to(tl.float32) - 1.0
        if APPLY_SCALES:
            d = tl.load(scales_ptr + rows64[:, None] * stride_sn + (words // 8)[None, :],
                        mask=mask, other=0.0).to(tl.float32)
            vals = vals * d[:, :, None]
        else:  # the program's 8 groups of scales apart, transposed to float32 [G, N]
            groups = tl.program_id(1) * (BLOCK_W // 8) + tl.arange(0, BLOCK_W // 8)
            gmask = (rows < N)[:, None] & (groups < G)[None, :]
            d = tl.load(scales_ptr + rows64[:, None] * stride_sn + groups[None, :], mask=gmask,
                        other=0.0).to(tl.float32)
            tl.store(scales_t_ptr + groups[None, :].to(tl.int64) * N + rows64[:, None], d,
                     mask=gmask)
        # [BN, BW * 16]: each row's 16 * BW weights contiguous, so the stores are wide
        vals = tl.reshape(vals, (BLOCK_N, BLOCK_W * 16)).to(out_ptr.dtype.element_ty)
        cols = tl.program_id(1) * (BLOCK_W * 16) + tl.arange(0, BLOCK_W * 16)
        omask = (rows < N)[:, None] & (cols < 16 * W)[None, :]
        tl.store(out_ptr + rows64[:, None] * stride_on + cols[None, :], vals, mask=omask)


def _launch(w: PQ2Weight, out: torch.Tensor, scales_t: torch.Tensor | None) -> None:
    n_words = w.k // 16
    grid = (cdiv(w.n, _BLOCK_N), cdiv(n_words, _BLOCK_W))
    _pq2_dequant_kernel[grid](w.codes, w.scales, out, out if scales_t is None else scales_t,
                              w.n, n_words, w.k // 128, w.codes.stride(0), w.scales.stride(0),
                              out.stride(0), BLOCK_N=_BLOCK_N, BLOCK_W=_BLOCK_W,
                              APPLY_SCALES=scales_t is None, num_warps=4)


def dequantize_pq2(w: PQ2Weight, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Dense ``W_st`` [N, K] in ``dtype`` from the prepared planes (one Triton launch)."""
    out = torch.empty(w.n, w.k, dtype=dtype, device=w.device)
    _launch(w, out, None)
    return out


def pq2_codes_and_scales(w: PQ2Weight, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The same pass without the scales applied: ``(codes - 1)`` as ``dtype`` ``[N, K]`` (-1,
    0, 1, 2: exact in every float dtype) and the scales apart as float32 ``[K/128, N]``, a
    1x128 block scaling of the codes (gemm_fp8)."""
    out = torch.empty(w.n, w.k, dtype=dtype, device=w.device)
    scales_t = torch.empty(w.k // 128, w.n, dtype=torch.float32, device=w.device)
    _launch(w, out, scales_t)
    return out, scales_t
