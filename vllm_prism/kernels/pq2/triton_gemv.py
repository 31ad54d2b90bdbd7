"""M = 1 (decode) PQ2_0 GEMVs in Triton: stream every weight byte once per step.

Both kernels read the :class:`~vllm_prism.kernels.pq2.layout.PQ2Weight` planes in tiles of
``BLOCK_N`` rows x ``BLOCK_G`` groups x 8 words (16-byte loads along K), reduce each
128-group in registers and apply its fp16 scale once per group, using
``sum_j (c_j - 1) x_j = sum_j c_j x_j - sum_j x_j`` so the ``-1`` offset costs one
subtraction per group.

* :func:`gemv_a8` (``Q8_PERM`` activation, int8 per 128-group): 16 weights of a code word
  meet 16 int8 activations in four ``dp4a`` instructions on the unshifted masks
  ``w & 0x03030303 << 2p`` (one inline-asm block: 4 AND, 4 DP4A, 3 SHR per 16 weights), so
  the decode fits in the issue budget of a bandwidth-bound pass. Exact integer sums; the only
  rounding is the activation quantization and the fp32 epilogue.
* :func:`gemv_a16` (``F32_PERM`` activation): the bf16/fp16 semantics of the reference, fp32
  math. Code ``i`` of a word is read in place as ``float(0x4B000000 | (w & 3 << 2i)) - 2**23
  = c * 4**i`` and multiplied by an activation pre-scaled by ``4**-i`` (exact): 3 instructions
  a weight, no shifts or int-to-float conversions.

Under the Triton interpreter the dp4a block is emulated with shifts and multiplies.
"""

from __future__ import annotations

import torch

from vllm_prism.kernels.pq2.common import HAS_TRITON, cdiv, interpreting
from vllm_prism.kernels.pq2.hadamard import ActKind, PQ2Activation
from vllm_prism.kernels.pq2.layout import PQ2Weight

if HAS_TRITON:
    import triton
    import triton.language as tl

__all__ = ["gemv_a8", "gemv_a16", "GemvConfig", "default_gemv_config"]


class GemvConfig:
    """Tile of a GEMV program: rows, groups of 128 per step, warps."""

    def __init__(self, block_n: int, block_g: int, num_warps: int) -> None:
        self.block_n = block_n
        self.block_g = block_g
        self.num_warps = num_warps

    def __repr__(self) -> str:
        return f"GemvConfig(n={self.block_n}, g={self.block_g}, w={self.num_warps})"


def default_gemv_config(n: int, k: int, a8: bool = True) -> GemvConfig:
    """Tile choice: 8 groups (1024 weights) of K per step, rows so that the grid fills the GPU."""
    if n >= 8192:
        return GemvConfig(32, 8, 4)
    if n >= 2048:
        return GemvConfig(16, 8, 4)
    return GemvConfig(8, 8, 2)


if HAS_TRITON:

    @triton.jit
    def _dp16_asm(w, x0, x1, x2, x3):
        """sum over 16 weights of code * x: dp4a on the four unshifted 2-bit fields."""
        return tl.inline_asm_elementwise(
            """
            {
            .reg .b32 t, a;
            and.b32 t, $1, 0xC0C0C0C0;
            mov.b32 a, 0;
            dp4a.u32.s32 a, t, $5, a;
            shr.s32 a, a, 2;
            and.b32 t, $1, 0x30303030;
            dp4a.u32.s32 a, t, $4, a;
            shr.s32 a, a, 2;
            and.b32 t, $1, 0x0C0C0C0C;
            dp4a.u32.s32 a, t, $3, a;
            shr.s32 a, a, 2;
            and.b32 t, $1, 0x03030303;
            dp4a.u32.s32 $0, t, $2, a;
            }
            """,
            "=r,r,r,r,r,r", [w, x0, x1, x2, x3], dtype=tl.int32, is_pure=True, pack=1)

    @triton.jit
    def _dp16_emulated(w, x0, x1, x2, x3):
        """Interpreter twin of _dp16_asm: the same integer sum with shifts and multiplies."""
        acc = tl.zeros(w.shape, dtype=tl.int32)
        for b in tl.static_range(4):
            c0 = (w >> (8 * b)) & 3
            c1 = (w >> (8 * b + 2)) & 3
            c2 = (w >> (8 * b + 4)) & 3
            c3 = (w >> (8 * b + 6)) & 3
            acc += c0 * ((x0 << (24 - 8 * b)) >> 24)
            acc += c1 * ((x1 << (24 - 8 * b)) >> 24)
            acc += c2 * ((x2 << (24 - 8 * b)) >> 24)
            acc += c3 * ((x3 << (24 - 8 * b)) >> 24)
        return acc

    @triton.jit
    def _gemv_a8_kernel(codes_ptr, scales_ptr, xq_ptr, sx_ptr, qsum_ptr, bias_ptr, out_ptr,
                        N, G, stride_cn, stride_sn,
                        BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, USE_ASM: tl.constexpr,
                        HAS_BIAS: tl.constexpr, EVEN_G: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        rows = tl.where(rmask, rows, 0).to(tl.int64)  # clamped: loads stay in bounds
        KW = G * 8
        gi = tl.arange(0, BLOCK_G)
        wj = tl.arange(0, 8)
        c_rows = codes_ptr + rows[:, None, None] * stride_cn
        s_rows = scales_ptr + rows[:, None] * stride_sn
        acc = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
        for g0 in range(0, G, BLOCK_G):
            gg = g0 + gi
            wo = gg[:, None] * 8 + wj[None, :]  # [BG, 8] word offsets
            if EVEN_G:
                words = tl.load(c_rows + wo[None, :, :])
                x0 = tl.load(xq_ptr + wo)
                x1 = tl.load(xq_ptr + KW + wo)
                x2 = tl.load(xq_ptr + 2 * KW + wo)
                x3 = tl.load(xq_ptr + 3 * KW + wo)
                qs = tl.load(qsum_ptr + gg)
                sx = tl.load(sx_ptr + gg)
                d = tl.load(s_rows + gg[None, :]).to(tl.float32)
            else:
                gm = gg < G
                wm = gm[:, None] & (wj[None, :] < 8)
                words = tl.load(c_rows + wo[None, :, :], mask=wm[None, :, :], other=0)
                x0 = tl.load(xq_ptr + wo, mask=wm, other=0)
                x1 = tl.load(xq_ptr + KW + wo, mask=wm, other=0)
                x2 = tl.load(xq_ptr + 2 * KW + wo, mask=wm, other=0)
                x3 = tl.load(xq_ptr + 3 * KW + wo, mask=wm, other=0)
                qs = tl.load(qsum_ptr + gg, mask=gm, other=0)
                sx = tl.load(sx_ptr + gg, mask=gm, other=0.0)
                d = tl.load(s_rows + gg[None, :], mask=gm[None, :], other=0.0).to(tl.float32)
            if USE_ASM:
                dots = _dp16_asm(words, x0[None, :, :], x1[None, :, :], x2[None, :, :],
                                 x3[None, :, :])
            else:
                dots = _dp16_emulated(words, x0[None, :, :], x1[None, :, :], x2[None, :, :],
                                      x3[None, :, :])
            gsum = tl.sum(dots, axis=2) - qs[None, :]  # [BN, BG] exact
            acc += gsum.to(tl.float32) * (d * sx[None, :])
        y = tl.sum(acc, axis=1)
        if HAS_BIAS:
            y += tl.load(bias_ptr + rows).to(tl.float32)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rmask)

    @triton.jit
    def _gemv_a16_kernel(codes_ptr, scales_ptr, xp_ptr, xsum_ptr, bias_ptr, out_ptr,
                         N, G, stride_cn, stride_sn,
                         BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr,
                         EVEN_G: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        rows = tl.where(rmask, rows, 0).to(tl.int64)
        KW = G * 8
        gi = tl.arange(0, BLOCK_G)
        wj = tl.arange(0, 8)
        c_rows = codes_ptr + rows[:, None, None] * stride_cn
        s_rows = scales_ptr + rows[:, None] * stride_sn
        acc = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
        for g0 in range(0, G, BLOCK_G):
            gg = g0 + gi
            wo = gg[:, None] * 8 + wj[None, :]
            if EVEN_G:
                words = tl.load(c_rows + wo[None, :, :])
                xs = tl.load(xsum_ptr + gg)
                d = tl.load(s_rows + gg[None, :]).to(tl.float32)
            else:
                gm = gg < G
                wm = gm[:, None] & (wj[None, :] < 8)
                words = tl.load(c_rows + wo[None, :, :], mask=wm[None, :, :], other=0)
                xs = tl.load(xsum_ptr + gg, mask=gm, other=0.0)
                d = tl.load(s_rows + gg[None, :], mask=gm[None, :], other=0.0).to(tl.float32)
            hi = (words >> 22) & 0x3FF
            part = tl.zeros([BLOCK_N, BLOCK_G, 8], dtype=tl.float32)
            for i in tl.static_range(16):
                if EVEN_G:
                    xi = tl.load(xp_ptr + i * KW + wo)
                else:
                    xi = tl.load(xp_ptr + i * KW + wo, mask=wm, other=0.0)
                if i <= 10:
                    f = ((words & (3 << (2 * i))) | 0x4B000000).to(tl.float32, bitcast=True)
                else:
                    f = ((hi & (3 << (2 * (i - 11)))) | 0x4B000000).to(tl.float32, bitcast=True)
                part += (f - 8388608.0) * xi[None, :, :]
            acc += (tl.sum(part, axis=2) - xs[None, :]) * d
        y = tl.sum(acc, axis=1)
        if HAS_BIAS:
            y += tl.load(bias_ptr + rows).to(tl.float32)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rmask)


def _check(act: PQ2Activation, w: PQ2Weight, kind: ActKind) -> None:
    if act.kind != kind:
        raise ValueError(f"activation layout {act.kind.name} given, this kernel reads {kind.name}")
    if act.k != w.k:
        raise ValueError(f"activation has K = {act.k}, weight has K = {w.k}")
    if act.m != 1:
        raise ValueError(f"the GEMV takes one row, got M = {act.m}")


def gemv_a8(act: PQ2Activation, w: PQ2Weight, bias: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None,
            config: GemvConfig | None = None) -> torch.Tensor:
    """y [1, N] = W_st @ x for a ``Q8_PERM`` activation (int8 dp4a GEMV)."""
    _check(act, w, ActKind.Q8_PERM)
    cfg = config or default_gemv_config(w.n, w.k, a8=True)
    out = torch.empty(1, w.n, dtype=out_dtype or act.dtype, device=w.device)
    g = w.groups
    _gemv_a8_kernel[(cdiv(w.n, cfg.block_n),)](
        w.codes, w.scales, act.data, act.group_scale, act.group_sum,
        bias if bias is not None else out, out, w.n, g, w.codes.stride(0), w.scales.stride(0),
        BLOCK_N=cfg.block_n, BLOCK_G=cfg.block_g, USE_ASM=not interpreting(),
        HAS_BIAS=bias is not None, EVEN_G=g % cfg.block_g == 0, num_warps=cfg.num_warps)
    return out


def gemv_a16(act: PQ2Activation, w: PQ2Weight, bias: torch.Tensor | None = None,
             out_dtype: torch.dtype | None = None,
             config: GemvConfig | None = None) -> torch.Tensor:
    """y [1, N] = W_st @ x for an ``F32_PERM`` activation (fp32 GEMV)."""
    _check(act, w, ActKind.F32_PERM)
    cfg = config or default_gemv_config(w.n, w.k, a8=False)
    out = torch.empty(1, w.n, dtype=out_dtype or act.dtype, device=w.device)
    g = w.groups
    _gemv_a16_kernel[(cdiv(w.n, cfg.block_n),)](
        w.codes, w.scales, act.data, act.group_sum, bias if bias is not None else out, out,
        w.n, g, w.codes.stride(0), w.scales.stride(0),
        BLOCK_N=cfg.block_n, BLOCK_G=cfg.block_g, HAS_BIAS=bias is not None,
        EVEN_G=g % cfg.block_g == 0, num_warps=cfg.num_warps)
    return out
