"""Tensor-core PQ2_0 linear in Triton: small batches (M = 2..64) and, with big tiles, prefill.

The weight tile is decoded in registers and never written to memory. Each program computes
``acc[BLOCK_N, BLOCK_M] = W[BLOCK_N, K] @ x[BLOCK_M, K]^T`` (weights as the left operand, so
token tiles of 16..256 rows are the MMA's N dimension), one 128-group of K per step:

* ``A8`` (``Q8`` activation): int8 codes ``c`` in 0..3 times int8 activations on the int8
  tensor cores; per group ``(dot - sum(xq)) * d[n] * sx[m, g]`` (exact integer dot, turned
  into fp32 with the ``0x4B400000`` trick instead of a slow int-to-float conversion);
* otherwise (``FLOAT`` activation in bf16/fp16): ``c - 1`` exactly in the activation dtype;
  the fp32 group product is scaled by ``d`` (``FOLD_SCALE=False``, exact), or ``d`` is folded
  into the decoded tile (``FOLD_SCALE=True``: exact for fp16, one rounding of ``d`` to bf16
  otherwise) so the MMAs accumulate without interruption.

Decoding: every thread expands whole prepared words (shift and mask per weight, plus the
``0x4B000000`` float trick for bf16/fp16) and joins the 16 values of a word in registers
(``tl.join``), so the tile reaches the MMA operand staging with 16 consecutive K values per
thread (wide shared-memory stores) instead of one code per thread and word.

``SPLIT_K`` > 1 splits the groups over programs that add into an fp32 output with atomics
(for small N, where N-tiles alone would leave SMs idle).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_prism.kernels.common import HAS_TRITON, cdiv, interpreting, pdl_launch, use_pdl
from vllm_prism.kernels.pq2.hadamard import ActKind, PQ2Activation
from vllm_prism.kernels.pq2.layout import PQ2Weight

if HAS_TRITON:
    import triton
    import triton.language as tl

__all__ = ["TCConfig", "pq2_tc_linear", "default_mma_config", "default_gemm_config"]


@dataclass(frozen=True)
class TCConfig:
    """Tile and launch parameters of the tensor-core kernel."""

    block_n: int
    block_m: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    fold_scale: bool = False


def default_mma_config(m: int, n: int, k: int, num_sms: int = 132, a8: bool = False,
                       dtype: torch.dtype | None = None) -> TCConfig:
    """Small batches: the smallest token tile that holds M, split K until the GPU is full."""
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_n = 64
    tiles = cdiv(n, block_n)
    split = 1
    groups = k // 128
    while tiles * split < num_sms and split * 2 <= 8 and groups // (split * 2) >= 4:
        split *= 2
    return TCConfig(block_n=block_n, block_m=block_m, split_k=split, num_warps=4, num_stages=4)


def default_gemm_config(m: int, n: int, k: int, num_sms: int = 132, a8: bool = False,
                        dtype: torch.dtype | None = None) -> TCConfig:
    """Prefill (H200 sweep): 128 x 128 tiles on two warp groups for long prompts, 64 x 128 on
    one below; the int8 kernel uses 64 x 128 (larger int8 tiles spill registers)."""
    if a8 or m < 1024:
        return TCConfig(block_n=64, block_m=128, split_k=1, num_warps=4, num_stages=3)
    return TCConfig(block_n=128, block_m=128, split_k=1, num_warps=8, num_stages=3)


if HAS_TRITON:

    @triton.jit
    def _join16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
        """[..., 16] with element e = a_e, the new dimension held by one thread (tl.join)."""
        e0 = tl.join(tl.join(a0, a8), tl.join(a4, a12))
        e1 = tl.join(tl.join(a2, a10), tl.join(a6, a14))
        o0 = tl.join(tl.join(a1, a9), tl.join(a5, a13))
        o1 = tl.join(tl.join(a3, a11), tl.join(a7, a15))
        t = tl.join(tl.join(e0, e1), tl.join(o0, o1))  # [..., 2, 2, 2, 2]: e = 8i + 4j + 2k + l
        return tl.reshape(t, t.shape[:-4] + (16,))

    @triton.jit
    def _code(words, e: tl.constexpr, OFFSET: tl.constexpr):
        """Element e = 4q + b of each word (bits 8b + 2q), plus OFFSET in the bits above."""
        u = words.to(tl.uint32, bitcast=True)  # logical shifts: shift + one LOP3 per value
        return (((u >> (8 * (e % 4) + 2 * (e // 4))) & 3) | OFFSET).to(tl.int32, bitcast=True)

    @triton.jit
    def _decode_tile(words, BLOCK_N: tl.constexpr, A8: tl.constexpr, DT: tl.constexpr):
        """[BLOCK_N, 8] prepared words -> [BLOCK_N, 128] weights in natural K order: int8
        codes c (A8) or c - 1 in DT. Each thread expands whole words (no cross-thread
        shuffles); the 16 values of a word are joined in registers."""
        if A8:
            t = _join16(_code(words, 0, 0).to(tl.int8), _code(words, 1, 0).to(tl.int8),
                        _code(words, 2, 0).to(tl.int8), _code(words, 3, 0).to(tl.int8),
                        _code(words, 4, 0).to(tl.int8), _code(words, 5, 0).to(tl.int8),
                        _code(words, 6, 0).to(tl.int8), _code(words, 7, 0).to(tl.int8),
                        _code(words, 8, 0).to(tl.int8), _code(words, 9, 0).to(tl.int8),
                        _code(words, 10, 0).to(tl.int8), _code(words, 11, 0).to(tl.int8),
                        _code(words, 12, 0).to(tl.int8), _code(words, 13, 0).to(tl.int8),
                        _code(words, 14, 0).to(tl.int8), _code(words, 15, 0).to(tl.int8))
        else:  # float(0x4B000000 | c) = 2**23 + c exactly; minus 2**23 + 1 gives c - 1
            t = _join16(_fcode(words, 0, DT), _fcode(words, 1, DT), _fcode(words, 2, DT),
                        _fcode(words, 3, DT), _fcode(words, 4, DT), _fcode(words, 5, DT),
                        _fcode(words, 6, DT), _fcode(words, 7, DT), _fcode(words, 8, DT),
                        _fcode(words, 9, DT), _fcode(words, 10, DT), _fcode(words, 11, DT),
                        _fcode(words, 12, DT), _fcode(words, 13, DT), _fcode(words, 14, DT),
                        _fcode(words, 15, DT))
        return tl.reshape(t, (BLOCK_N, 128))

    @triton.jit
    def _fcode(words, e: tl.constexpr, DT: tl.constexpr):
        f = _code(words, e, 0x4B000000).to(tl.float32, bitcast=True) - 8388609.0
        return f.to(DT)

    @triton.jit
    def _pq2_tc_kernel(codes_ptr, scales_ptr, x_ptr, sx_ptr, qsum_ptr, bias_ptr, out_ptr,
                       M, N, G, stride_cn, stride_sn, stride_xm, stride_gm, stride_om, SPLIT_K,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ATOMIC: tl.constexpr,
                       A8: tl.constexpr, FOLD_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                       DOT_F32: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # our inputs are complete past here
            tl.extra.cuda.gdc_wait()
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_k = tl.program_id(2)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        nmask = offs_n < N
        mmask = offs_m < M
        rn = tl.where(nmask, offs_n, 0).to(tl.int64)
        rm = tl.where(mmask, offs_m, 0).to(tl.int64)
        xdt = x_ptr.dtype.element_ty
        c_base = codes_ptr + rn[:, None] * stride_cn + tl.arange(0, 8)[None, :]
        x_base = x_ptr + rm[None, :] * stride_xm + tl.arange(0, 128)[:, None]
        s_base = scales_ptr + rn * stride_sn
        g_per = tl.cdiv(G, SPLIT_K)
        g_lo = pid_k * g_per
        g_hi = tl.minimum(G, g_lo + g_per)
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for g in range(g_lo, g_hi):
            words = tl.load(c_base + g * 8)
            xt = tl.load(x_base + g * 128)
            d = tl.load(s_base + g).to(tl.float32)
            if A8:
                part = tl.dot(_decode_tile(words, BLOCK_N, True, tl.int8), xt)
                qs = tl.load(qsum_ptr + rm * stride_gm + g)
                sx = tl.load(sx_ptr + rm * stride_gm + g)
                pf = (part - qs[None, :] + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0
                acc += pf * (d[:, None] * sx[None, :])
            else:
                if FOLD_SCALE:
                    wv = (_decode_tile(words, BLOCK_N, False, tl.float32) * d[:, None]).to(xdt)
                else:
                    wv = _decode_tile(words, BLOCK_N, False, xdt)
                if DOT_F32:  # the interpreter's bf16 dot is wrong (Triton 3.9): same values in fp32
                    wv = wv.to(tl.float32)
                    xt = xt.to(tl.float32)
                if FOLD_SCALE:
                    acc = tl.dot(wv, xt, acc)
                else:
                    acc += tl.dot(wv, xt) * d[:, None]
        if PDL:  # the next kernel may launch now: not earlier, so that its waiting programs do
            # not hold multiprocessors this kernel's later programs need (it can span waves)
            tl.extra.cuda.gdc_launch_dependents()
        if HAS_BIAS:
            b = tl.load(bias_ptr + rn).to(tl.float32)
            if ATOMIC:
                b = tl.where(pid_k == 0, b, 0.0)
            acc += b[:, None]
        out_ptrs = out_ptr + rm[None, :] * stride_om + rn[:, None]
        omask = nmask[:, None] & mmask[None, :]
        if ATOMIC:
            tl.atomic_add(out_ptrs, acc, mask=omask, sem="relaxed")
        else:
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=omask)


def pq2_tc_linear(act: PQ2Activation, w: PQ2Weight, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None,
                  config: TCConfig | None = None) -> torch.Tensor:
    """y [M, N] = x @ W_st^T for a ``FLOAT`` (bf16/fp16) or ``Q8`` activation."""
    if act.kind not in (ActKind.FLOAT, ActKind.Q8):
        raise ValueError("the tensor-core kernel reads FLOAT or Q8 activations, "
                         f"got {act.kind.name}")
    if act.k != w.k:
        raise ValueError(f"activation has K = {act.k}, weight has K = {w.k}")
    a8 = act.kind == ActKind.Q8
    if not a8 and act.data.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"FLOAT activations must be bf16 or fp16, got {act.data.dtype}")
    m, n = act.m, w.n
    cfg = config or (default_mma_config(m, n, w.k) if m <= 64 else default_gemm_config(m, n, w.k))
    dtype = out_dtype or act.dtype
    split = max(1, min(cfg.split_k, w.groups))
    if split > 1:
        out = torch.zeros(m, n, dtype=torch.float32, device=w.device)
    else:
        out = torch.empty(m, n, dtype=dtype, device=w.device)
    if m == 0:
        return out.to(dtype)
    x = act.data
    sx = act.group_scale if a8 else x
    qsum = act.group_sum if a8 else x
    grid = (cdiv(n, cfg.block_n), cdiv(m, cfg.block_m), split)
    pdl = use_pdl(w.device)
    _pq2_tc_kernel[grid](
        w.codes, w.scales, x, sx, qsum, bias if bias is not None else out, out,
        m, n, w.groups, w.codes.stride(0), w.scales.stride(0), x.stride(0),
        sx.stride(0) if a8 else 0, out.stride(0), split,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ATOMIC=split > 1, A8=a8,
        FOLD_SCALE=cfg.fold_scale, HAS_BIAS=bias is not None, DOT_F32=interpreting(),
        PDL=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_launch(pdl))
    return out.to(dtype) if split > 1 else out
