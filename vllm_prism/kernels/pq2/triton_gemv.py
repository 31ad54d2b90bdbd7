"""Decode-size PQ2_0 GEMVs in Triton: stream every weight byte once per step.

Both kernels read the :class:`~vllm_prism.kernels.pq2.layout.PQ2Weight` planes in tiles of
``BLOCK_N`` rows x ``BLOCK_G`` groups x 8 words (16-byte loads along K, the next tile's words
loaded before the current one is reduced), reduce each 128-group in registers and apply its
fp16 scale once per group, using ``sum_j (c_j - 1) x_j = sum_j c_j x_j - sum_j x_j`` so the
``-1`` offset costs one subtraction per group.

* :func:`gemv_a8` (``Q8`` activation, int8 per 128-group; M = 1..``BLOCK_M`` rows per
  program): ``(word >> 2q) & 0x03030303`` holds the codes of elements ``16w + 4q .. +3``, the
  partners of one int8 activation word, so 16 weights cost 3 shifts and 4 ANDs (shared by
  all rows of the program) plus 4 ``dp4a`` per row. Exact integer sums; the only rounding is
  the activation quantization and the fp32 epilogue.
* :func:`gemv_a16` (``F32_PERM`` activation, M = 1): the precision of the reference (fp32
  math). The code of element ``16w + 4q + b`` is read in place as
  ``float(0x4B000000 | (v & 3 << s)) - 2**23 = c * 2**s`` (``v`` the word, or the word
  shifted right by 16 for ``b >= 2``; ``s = 8(b % 2) + 2q``) and multiplied by the activation
  pre-scaled by ``2**-s`` (exact): 3 instructions a weight, no int-to-float conversion.

Under the Triton interpreter the dp4a block is emulated with shifts and multiplies.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from vllm_prism import envs
from vllm_prism.kernels.common import HAS_TRITON, cdiv, interpreting, pdl_launch, use_pdl

if HAS_TRITON:
    from vllm_prism.kernels.common import pdl_enter
from vllm_prism.kernels.pq2.hadamard import ActKind, PQ2Activation
from vllm_prism.kernels.pq2.layout import PQ2Weight

if HAS_TRITON:
    import triton
    import triton.language as tl

__all__ = ["gemv_a8", "gemv_a16", "GemvConfig", "default_gemv_config", "GEMV_MAX_M",
           "gemv_max_m"]

# The dp4a work grows with M: the GEMV beats the tensor-core kernel up to M = 2 everywhere and
# up to M = 4 on matrices of >= 4096 rows (H200, benchmarks/results/pq2_linear_h200.md).
GEMV_MAX_M = 4
GEMV_SMALL_N_MAX_M = 2


@dataclasses.dataclass(frozen=True, repr=False)
class GemvConfig:
    """Tile of a GEMV program: rows, groups of 128 per step, warps, activation rows, and (int8
    GEMV) how many weight tiles are in flight ahead of the one being reduced (``depth``, 1..3),
    whether each tile's fp16 scales travel with its codes (``prefetch_scales``) instead of
    being loaded in the step that uses them, and over how many programs each row's K is split
    (``split_k``: more programs for narrow outputs; the last program of a tile adds the
    partials)."""

    block_n: int
    block_g: int
    num_warps: int
    block_m: int = 1
    depth: int = 1
    prefetch_scales: bool = False
    split_k: int = 1

    def __post_init__(self) -> None:
        if self.depth not in (1, 2, 3):
            raise ValueError(f"GemvConfig depth = {self.depth}: takes 1, 2 or 3 tiles ahead")
        if not 1 <= self.split_k <= 16:
            raise ValueError(f"GemvConfig split_k = {self.split_k}: takes 1..16")

    def __repr__(self) -> str:
        extra = f", depth={self.depth}" if self.depth != 1 else ""
        extra += ", scales ahead" if self.prefetch_scales else ""
        extra += f", split={self.split_k}" if self.split_k != 1 else ""
        return (f"GemvConfig(n={self.block_n}, g={self.block_g}, w={self.num_warps}, "
                f"m={self.block_m}{extra})")


_TUNING_KEYS = {"n": "block_n", "g": "block_g", "w": "num_warps", "depth": "depth",
                "scales": "prefetch_scales", "split": "split_k"}


@functools.lru_cache(maxsize=8)
def parse_gemv_tuning(spec: str) -> dict[str, int | bool]:
    """``VLLM_PRISM_GEMV_TUNING`` parsed and checked: GemvConfig field -> value (a ValueError
    naming the variable otherwise)."""
    out: dict[str, int | bool] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        key, _, value = (x.strip() for x in item.partition("="))
        if key not in _TUNING_KEYS or not value.isdigit():
            raise ValueError(f"VLLM_PRISM_GEMV_TUNING={spec!r}: {item!r} is not key=integer "
                             f"with a key among {', '.join(_TUNING_KEYS)}")
        field = _TUNING_KEYS[key]
        out[field] = bool(int(value)) if field == "prefetch_scales" else int(value)
    try:  # the values too: GemvConfig checks its ranges
        dataclasses.replace(GemvConfig(16, 8, 4), **out)
    except ValueError as e:
        raise ValueError(f"VLLM_PRISM_GEMV_TUNING={spec!r}: {e}") from None
    return out


def tuned(cfg: GemvConfig) -> GemvConfig:
    """``cfg`` with the ``VLLM_PRISM_GEMV_TUNING`` overrides (itself when there are none)."""
    over = parse_gemv_tuning(envs.VLLM_PRISM_GEMV_TUNING)
    return dataclasses.replace(cfg, **over) if over else cfg


def gemv_max_m(n: int) -> int:
    """Largest M the dispatch sends to the GEMV for a matrix of n rows."""
    return GEMV_MAX_M if n >= 4096 else GEMV_SMALL_N_MAX_M


def default_gemv_config(m: int, n: int, k: int, a8: bool = True) -> GemvConfig:
    """Tile choice from the H200 sweep: 8 or 16 groups of K per step, 16-32 rows, 4 warps."""
    block_m = 1 if m <= 1 else min(16, 1 << (m - 1).bit_length())
    if not a8:
        return GemvConfig(16, 8, 4)
    if n >= 12288:
        return GemvConfig(32, 8, 4, block_m)
    if k >= 8192 or n <= 6144:
        return GemvConfig(16, 16 if block_m == 1 else 8, 4, block_m)
    return GemvConfig(16, 8, 4, block_m)


if HAS_TRITON:

    @triton.jit
    def _dp4x4_asm(t0, t1, t2, t3, x0, x1, x2, x3):
        """sum over the 16 bytes of four (codes, int8 activations) word pairs: 4 dp4a."""
        return tl.inline_asm_elementwise(
            """
            {
            .reg .b32 a;
            mov.b32 a, 0;
            dp4a.u32.s32 a, $1, $5, a;
            dp4a.u32.s32 a, $2, $6, a;
            dp4a.u32.s32 a, $3, $7, a;
            dp4a.u32.s32 $0, $4, $8, a;
            }
            """,
            "=r,r,r,r,r,r,r,r,r", [t0, t1, t2, t3, x0, x1, x2, x3], dtype=tl.int32,
            is_pure=True, pack=1)

    @triton.jit
    def _dp4_emulated(t, x):
        acc = tl.zeros(t.shape, dtype=tl.int32)
        for b in tl.static_range(4):
            acc += ((t >> (8 * b)) & 0xFF) * ((x << (24 - 8 * b)) >> 24)
        return acc

    @triton.jit
    def _dp4x4_emulated(t0, t1, t2, t3, x0, x1, x2, x3):
        """Interpreter twin of _dp4x4_asm."""
        return (_dp4_emulated(t0, x0) + _dp4_emulated(t1, x1) + _dp4_emulated(t2, x2)
                + _dp4_emulated(t3, x3))

    @triton.jit
    def _load_words(c_rows, gg, wj, G, EVEN_G: tl.constexpr):
        """The code words [BN, BG, 8] of groups ``gg`` (zero past G; unmasked with EVEN_G)."""
        wo = gg[:, None] * 8 + wj[None, :]
        if EVEN_G:
            return tl.load(c_rows + wo[None, :, :])
        return tl.load(c_rows + wo[None, :, :], mask=(gg < G)[None, :, None], other=0)

    @triton.jit
    def _load_scales(s_rows, gg, G, EVEN_G: tl.constexpr):
        """The fp16 scales [BN, BG] of groups ``gg`` (zero past G; unmasked with EVEN_G)."""
        if EVEN_G:
            return tl.load(s_rows + gg[None, :])
        return tl.load(s_rows + gg[None, :], mask=(gg < G)[None, :], other=0.0)

    @triton.jit
    def _gemv_a8_kernel(codes_ptr, scales_ptr, xq_ptr, sx_ptr, qsum_ptr, bias_ptr, out_ptr,
                        ws_ptr, cnt_ptr,
                        M, N, G, G_PER, stride_cn, stride_sn, stride_xm, stride_gm, stride_om,
                        BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr,
                        USE_ASM: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_G: tl.constexpr,
                        PDL: tl.constexpr = False, DEPTH: tl.constexpr = 1,
                        SCALES_AHEAD: tl.constexpr = False, SPLIT: tl.constexpr = 1):
        if PDL:  # the next kernel may launch now (it waits for our output itself)
            tl.extra.cuda.gdc_launch_dependents()
        pid = tl.program_id(0)
        m0 = tl.program_id(1) * BLOCK_M
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        rows = tl.where(rmask, rows, 0).to(tl.int64)  # clamped: loads stay in bounds
        gi = tl.arange(0, BLOCK_G)
        wj = tl.arange(0, 8)
        pj = tl.arange(0, 4)
        c_rows = codes_ptr + rows[:, None, None] * stride_cn
        s_rows = scales_ptr + rows[:, None] * stride_sn
        mi = tl.arange(0, BLOCK_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_G], dtype=tl.float32)
        if SPLIT == 1:
            g_lo = 0
            g_hi = G
        else:  # this program's share of the groups (a K split)
            g_lo = tl.program_id(2) * G_PER
            g_hi = tl.minimum(G, g_lo + G_PER)
        # DEPTH weight tiles in flight: the current one and DEPTH - 1 ahead, plus the one each
        # step issues for DEPTH steps later (with SCALES_AHEAD their scales travel with them)
        # (tiles past the first may run past the end: masked)
        words = _load_words(c_rows, g_lo + gi, wj, g_hi, EVEN_G)
        if SCALES_AHEAD:
            d_cur = _load_scales(s_rows, g_lo + gi, g_hi, False)
        if DEPTH >= 2:
            words1 = _load_words(c_rows, g_lo + gi + BLOCK_G, wj, g_hi, False)
            if SCALES_AHEAD:
                d1 = _load_scales(s_rows, g_lo + gi + BLOCK_G, g_hi, False)
        if DEPTH >= 3:
            words2 = _load_words(c_rows, g_lo + gi + 2 * BLOCK_G, wj, g_hi, False)
            if SCALES_AHEAD:
                d2 = _load_scales(s_rows, g_lo + gi + 2 * BLOCK_G, g_hi, False)
        if PDL:  # the first weight tiles are on their way; the activation is complete past here
            tl.extra.cuda.gdc_wait()
        for g0 in range(g_lo, g_hi, BLOCK_G):
            gg = g0 + gi
            gm = gg < g_hi
            wo = gg[:, None] * 8 + wj[None, :]  # [BG, 8] word offsets
            nxt = gg + DEPTH * BLOCK_G  # the tile DEPTH steps ahead (masked past the end)
            words_next = _load_words(c_rows, nxt, wj, g_hi, False)
            if SCALES_AHEAD:
                d_next = _load_scales(s_rows, nxt, g_hi, False)
            t0 = words & 0x03030303
            t1 = (words >> 2) & 0x03030303
            t2 = (words >> 4) & 0x03030303
            t3 = (words >> 6) & 0x03030303
            if SCALES_AHEAD:
                d = d_cur.to(tl.float32)
            else:
                d = _load_scales(s_rows, gg, g_hi, EVEN_G).to(tl.float32)
            for r in tl.static_range(BLOCK_M):
                row_c = tl.minimum(m0 + r, M - 1).to(tl.int64)  # rows past M: stored masked
                xw = tl.load(xq_ptr + row_c * stride_xm + (4 * wo)[:, :, None] + pj[None, None, :],
                             mask=gm[:, None, None], other=0)  # [BG, 8, 4] int32
                xa, xb = tl.split(tl.reshape(xw, (BLOCK_G, 8, 2, 2)))
                x0, x2 = tl.split(xa)
                x1, x3 = tl.split(xb)
                if USE_ASM:
                    dots = _dp4x4_asm(t0, t1, t2, t3, x0[None, :, :], x1[None, :, :],
                                      x2[None, :, :], x3[None, :, :])
                else:
                    dots = _dp4x4_emulated(t0, t1, t2, t3, x0[None, :, :], x1[None, :, :],
                                           x2[None, :, :], x3[None, :, :])
                qs = tl.load(qsum_ptr + row_c * stride_gm + gg, mask=gm, other=0)
                sx = tl.load(sx_ptr + row_c * stride_gm + gg, mask=gm, other=0.0)
                gsum = tl.sum(dots, axis=2) - qs[None, :] + 0x4B400000  # exact int -> fp32
                gsf = gsum.to(tl.float32, bitcast=True) - 12582912.0
                contrib = gsf * (d * sx[None, :])  # [BN, BG]: reduced once, after the loop
                if BLOCK_M == 1:
                    acc += contrib[None, :, :]
                else:
                    acc += tl.where(mi[:, None, None] == r, contrib[None, :, :], 0.0)
            if DEPTH == 1:
                words = words_next
            elif DEPTH == 2:
                words = words1
                words1 = words_next
            else:
                words = words1
                words1 = words2
                words2 = words_next
            if SCALES_AHEAD:
                if DEPTH == 1:
                    d_cur = d_next
                elif DEPTH == 2:
                    d_cur = d1
                    d1 = d_next
                else:
                    d_cur = d1
                    d1 = d2
                    d2 = d_next
        y = tl.sum(acc, axis=2)  # [BM, BN]
        omask = ((m0 + mi) < M)[:, None] & rmask[None, :]
        optrs = out_ptr + (m0 + mi).to(tl.int64)[:, None] * stride_om + rows[None, :]
        if SPLIT == 1:
            if HAS_BIAS:
                y += tl.load(bias_ptr + rows).to(tl.float32)[None, :]
            tl.store(optrs, y.to(out_ptr.dtype.element_ty), mask=omask)
        else:
            # partial sums meet in the workspace [SPLIT, M, N]; the tile's last program (its
            # counter, reset by it) adds them in split order and stores: deterministic, and no
            # launch of its own
            ws_rows = (m0 + mi).to(tl.int64)[:, None] * N + rows[None, :]
            tl.store(ws_ptr + tl.program_id(2).to(tl.int64) * M * N + ws_rows, y, mask=omask)
            tl.debug_barrier()  # every thread's partial is written before the count
            tile = tl.program_id(1) * tl.num_programs(0) + pid
            done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if done == SPLIT - 1:
                tot = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for sp in tl.static_range(SPLIT):
                    tot += tl.load(ws_ptr + sp * M * N + ws_rows, mask=omask, other=0.0,
                                   cache_modifier=".cg")
                if HAS_BIAS:
                    tot += tl.load(bias_ptr + rows).to(tl.float32)[None, :]
                tl.store(optrs, tot.to(out_ptr.dtype.element_ty), mask=omask)
                tl.atomic_xchg(cnt_ptr + tile, 0)

    @triton.jit
    def _gemv_a16_kernel(codes_ptr, scales_ptr, xp_ptr, xsum_ptr, bias_ptr, out_ptr,
                         N, G, stride_cn, stride_sn,
                         BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr,
                         EVEN_G: tl.constexpr, PDL: tl.constexpr = False):
        pdl_enter(PDL)  # let the next kernel launch; our inputs are complete past here
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
            hi = (words >> 16) & 0xFFFF
            part = tl.zeros([BLOCK_N, BLOCK_G, 8], dtype=tl.float32)
            for i in tl.static_range(16):  # slot i = 4b + q: element 16w + 4q + b
                if EVEN_G:
                    xi = tl.load(xp_ptr + i * KW + wo)
                else:
                    xi = tl.load(xp_ptr + i * KW + wo, mask=wm, other=0.0)
                fmask = 3 << (8 * ((i // 4) % 2) + 2 * (i % 4))
                if i < 8:
                    f = ((words & fmask) | 0x4B000000).to(tl.float32, bitcast=True)
                else:
                    f = ((hi & fmask) | 0x4B000000).to(tl.float32, bitcast=True)
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


# Tiles a split GEMV can count (one int32 each, zero between launches: the last program of a
# tile resets its counter); a grid with more tiles runs unsplit.
SPLIT_COUNTERS = 8192
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _split_counters(device: torch.device) -> torch.Tensor:
    """The per-device tile counters of the split GEMV. One set per device: the model's
    linears run one at a time on its stream (a concurrent split GEMV on another stream of the
    same device would share them)."""
    t = _COUNTERS.get(device)
    if t is None:
        t = _COUNTERS[device] = torch.zeros(SPLIT_COUNTERS, dtype=torch.int32, device=device)
    return t


def gemv_a8(act: PQ2Activation, w: PQ2Weight, bias: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None,
            config: GemvConfig | None = None) -> torch.Tensor:
    """y [M, N] = x @ W_st^T for a ``Q8`` activation (int8 dp4a GEMV, weights read once per
    ``block_m`` rows)."""
    _check(act, w, ActKind.Q8)
    m = act.m
    cfg = config or tuned(default_gemv_config(m, w.n, w.k, a8=True))
    out = torch.empty(m, w.n, dtype=out_dtype or act.dtype, device=w.device)
    if m == 0:
        return out
    g = w.groups
    xq = act.data.view(torch.int32)  # [M, K/4]
    pdl = use_pdl(w.device)
    grid_n, grid_m = cdiv(w.n, cfg.block_n), cdiv(m, cfg.block_m)
    g_per = cdiv(cdiv(g, cfg.split_k), cfg.block_g) * cfg.block_g  # whole tiles per split
    split = cdiv(g, g_per)
    if split > 1 and grid_n * grid_m > SPLIT_COUNTERS:
        split, g_per = 1, g
    if split > 1:
        ws = torch.empty(split, m, w.n, dtype=torch.float32, device=w.device)
        counters = _split_counters(w.device)
        even = g % g_per == 0
    else:
        g_per, ws, counters, even = g, out, xq, g % cfg.block_g == 0
    _gemv_a8_kernel[(grid_n, grid_m, split)](
        w.codes, w.scales, xq, act.group_scale, act.group_sum,
        bias if bias is not None else out, out, ws, counters, m, w.n, g, g_per,
        w.codes.stride(0), w.scales.stride(0), xq.stride(0), act.group_sum.stride(0),
        out.stride(0), BLOCK_N=cfg.block_n, BLOCK_G=cfg.block_g, BLOCK_M=cfg.block_m,
        USE_ASM=not interpreting(), HAS_BIAS=bias is not None, EVEN_G=even, PDL=pdl,
        DEPTH=cfg.depth, SCALES_AHEAD=cfg.prefetch_scales, SPLIT=split,
        num_warps=cfg.num_warps, **pdl_launch(pdl))
    return out


def gemv_a16(act: PQ2Activation, w: PQ2Weight, bias: torch.Tensor | None = None,
             out_dtype: torch.dtype | None = None,
             config: GemvConfig | None = None) -> torch.Tensor:
    """y [1, N] = W_st @ x for an ``F32_PERM`` activation (fp32 GEMV)."""
    _check(act, w, ActKind.F32_PERM)
    if act.m != 1:
        raise ValueError(f"gemv_a16 takes one row, got M = {act.m}")
    cfg = config or default_gemv_config(1, w.n, w.k, a8=False)
    out = torch.empty(1, w.n, dtype=out_dtype or act.dtype, device=w.device)
    g = w.groups
    pdl = use_pdl(w.device)
    _gemv_a16_kernel[(cdiv(w.n, cfg.block_n),)](
        w.codes, w.scales, act.data, act.group_sum, bias if bias is not None else out, out,
        w.n, g, w.codes.stride(0), w.scales.stride(0),
        BLOCK_N=cfg.block_n, BLOCK_G=cfg.block_g, HAS_BIAS=bias is not None,
        EVEN_G=g % cfg.block_g == 0, PDL=pdl, num_warps=cfg.num_warps, **pdl_launch(pdl))
    return out
