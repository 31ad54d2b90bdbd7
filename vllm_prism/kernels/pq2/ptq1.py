"""M = 1 PTQ1_0 GEMV in Triton, reading the packed trits directly (no transcoded copy).

A PTQ1_0 block holds 128 trits in 24 ``qs`` bytes (5 base-3 digits each) and 2 ``qh`` bytes
(4 digits each); digit ``n`` of byte ``b`` is ``((b * 3**n) & 0xFF) * 3 >> 8``. The element
order is not the byte order (spec section 1); the kernel keeps the bytes where they are and
gathers the matching activations instead: digit ``n`` of ``qs[m]`` meets ``x[16n + m]``
(``m < 16``) or ``x[80 + 8n + m - 16]``, digit ``n`` of ``qh[h]`` meets ``x[120 + 2n + h]``.
The activation is the ``FLOAT`` fp32 output of the producer (:mod:`.hadamard`).
Digits become floats with the ``0x4B000000`` trick; ``sum (t - 1) x = sum t x - sum x``.
"""

from __future__ import annotations

import torch

from vllm_prism.kernels.common import HAS_TRITON, cdiv, pdl_launch, use_pdl

if HAS_TRITON:
    from vllm_prism.kernels.common import pdl_enter
from vllm_prism.kernels.pq2.hadamard import ActKind, PQ2Activation
from vllm_prism.kernels.pq2.layout import PTQ1Weight

if HAS_TRITON:
    import triton
    import triton.language as tl

__all__ = ["ptq1_gemv"]


if HAS_TRITON:

    @triton.jit
    def _trit(b, POW: tl.constexpr):
        """Digit of byte value(s) b (int32 0..255) with weight 3**n = POW, as fp32 0..2."""
        t = (((b * POW) & 0xFF) * 3) >> 8
        return (t | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0

    @triton.jit
    def _ptq1_gemv_kernel(qs_ptr, qh_ptr, scales_ptr, x_ptr, bias_ptr, out_ptr,
                          N, G, stride_qs, stride_qh, stride_sn,
                          BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr,
                          PDL: tl.constexpr = False):
        pdl_enter(PDL)  # let the next kernel launch; our inputs are complete past here
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        rows = tl.where(rmask, rows, 0).to(tl.int64)
        gi = tl.arange(0, BLOCK_G)
        wj = tl.arange(0, 8)  # qs words 0..5 are real, 6..7 masked
        hj = tl.arange(0, 2)
        acc = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
        for g0 in range(0, G, BLOCK_G):
            gg = g0 + gi
            gm = gg < G
            wm = gm[:, None] & (wj[None, :] < 6)
            words = tl.load(qs_ptr + rows[:, None, None] * stride_qs
                            + (gg[:, None] * 6 + wj[None, :])[None, :, :],
                            mask=wm[None, :, :], other=0)
            hbytes = tl.load(qh_ptr + rows[:, None, None] * stride_qh
                             + (gg[:, None] * 2 + hj[None, :])[None, :, :],
                             mask=gm[None, :, None], other=0).to(tl.int32)
            xrow = x_ptr + gg[:, None] * 128  # [BG, 1]
            xs = tl.sum(tl.load(xrow + tl.arange(0, 128)[None, :], mask=gm[:, None], other=0.0),
                        axis=1)
            part = tl.zeros([BLOCK_N, BLOCK_G, 8], dtype=tl.float32)
            for k in tl.static_range(4):
                b = (words >> (8 * k)) & 0xFF
                m = 4 * wj + k  # qs byte index per word lane, [8]
                for n in tl.static_range(5):
                    e = tl.where(m < 16, 16 * n + m, 80 + 8 * n + (m - 16))
                    xe = tl.load(xrow + e[None, :], mask=wm, other=0.0)  # [BG, 8]
                    part += _trit(b, 3 ** n) * xe[None, :, :]
            hpart = tl.zeros([BLOCK_N, BLOCK_G, 2], dtype=tl.float32)
            for n in tl.static_range(4):
                xe = tl.load(xrow + (120 + 2 * n + hj)[None, :], mask=gm[:, None], other=0.0)
                hpart += _trit(hbytes, 3 ** n) * xe[None, :, :]
            d = tl.load(scales_ptr + rows[:, None] * stride_sn + gg[None, :], mask=gm[None, :],
                        other=0.0).to(tl.float32)
            acc += (tl.sum(part, axis=2) + tl.sum(hpart, axis=2) - xs[None, :]) * d
        y = tl.sum(acc, axis=1)
        if HAS_BIAS:
            y += tl.load(bias_ptr + rows).to(tl.float32)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rmask)


def ptq1_gemv(act: PQ2Activation, w: PTQ1Weight, bias: torch.Tensor | None = None,
              out_dtype: torch.dtype | None = None, block_n: int = 16, block_g: int = 4,
              num_warps: int = 4) -> torch.Tensor:
    """y [1, N] = W_st @ x for an fp32 ``FLOAT`` activation and a PTQ1_0 weight."""
    if act.kind != ActKind.FLOAT or act.data.dtype != torch.float32:
        raise ValueError("the PTQ1 GEMV reads an fp32 FLOAT activation")
    if act.k != w.k or act.m != 1:
        raise ValueError(f"expected a [1, {w.k}] activation, got [{act.m}, {act.k}]")
    out = torch.empty(1, w.n, dtype=out_dtype or act.dtype, device=w.device)
    pdl = use_pdl(w.device)
    _ptq1_gemv_kernel[(cdiv(w.n, block_n),)](
        w.qs, w.qh, w.scales, act.data, bias if bias is not None else out, out,
        w.n, w.groups, w.qs.stride(0), w.qh.stride(0), w.scales.stride(0),
        BLOCK_N=block_n, BLOCK_G=block_g, HAS_BIAS=bias is not None, PDL=pdl,
        num_warps=num_warps, **pdl_launch(pdl))
    return out
